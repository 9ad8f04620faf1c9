"""fig-megamoe-timeline: what every program (CTA) of the fused MoE kernel did over time,
per store path.

One row per program: Linear-1 tiles, Linear-2 tiles, and under each Linear-2 tile the span
of its far-end stores (into the peer GPU, or into host memory). Under expert waves the
stores of a wave pile up together; interleaved, Linear-1 work sits between them. Per path,
the first configuration of the trace file on it is drawn (both schedules), with every
panel on one time axis so their lengths compare directly.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from xstage_bench.data import layout, storepath
from xstage_bench.data.grid import fraction_label
from xstage_bench.megamoe.schedule import COMPARED
from xstage_bench.report.analysis import frames, labels, load, megamoe
from xstage_bench.report.figures import common

COLORS = {"L1": "tab:blue", "L2": "tab:orange", "store": "tab:red"}


def traced(doc: dict, dataset: str) -> dict[str, tuple[dict, dict[str, list]]]:
    """path -> (the first configuration traced on it, schedule -> its timeline)."""
    out: dict[str, tuple[dict, dict[str, list]]] = {}
    for first in doc["records"]:
        path = storepath.point_path(first["point"])
        if path in out or megamoe.trace_series(first["point"]) not in COMPARED:
            continue
        key = megamoe.megamoe_config_key(first["point"])
        timelines = {}
        for schedule in COMPARED:
            found = [
                r
                for r in doc["records"]
                if megamoe.megamoe_config_key(r["point"]) == key
                and megamoe.trace_series(r["point"]) == schedule
                and r["status"] == "ok"
                and (r.get("extra") or {}).get("timeline")
            ]
            if not found:
                raise load.NoDataError(
                    f"dataset '{dataset}': {layout.MEGAMOE_TRACE_RAW} has no ok '{schedule}' "
                    f"record with a timeline for the configuration "
                    f"{megamoe.megamoe_config_name(first['point'])} ({path} path)"
                )
            timelines[schedule] = found[0]["extra"]["timeline"]
        out[path] = (first["point"], timelines)
    return {p: out[p] for p in megamoe.ordered_paths(out)}


def plot(dataset_dir: Path) -> Figure:
    doc = load.raw_doc(dataset_dir, layout.MEGAMOE_TRACE_RAW)
    if not doc["records"]:
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_TRACE_RAW} has no records"
        )
    per_path = traced(doc, dataset_dir.name)
    if not per_path:
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_TRACE_RAW} has no record of "
            f"{' or '.join(COMPARED)}"
        )
    panels = [
        (path, point, schedule, timeline)
        for path, (point, timelines) in per_path.items()
        for schedule, timeline in timelines.items()
    ]
    programs = max(int(row[0]) for *_, t in panels for row in t) + 1
    fig, axes = common.new_figure(
        len(panels), 1, width=10, height=max(2.5, min(4.5, programs * 0.035)), sharex=True
    )
    for ax, (path, point, schedule, timeline) in zip(axes[:, 0], panels, strict=True):
        origin = min(row[2] for row in timeline)
        end = max(row[3] for row in timeline) - origin
        bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for program, phase, start, stop, store_start, store_stop in timeline:
            bars.setdefault((int(program), phase), []).append((start - origin, stop - start))
            if store_start is not None and store_stop is not None:
                bars.setdefault((int(program), "store"), []).append(
                    (store_start - origin, store_stop - store_start)
                )
        for (program, kind), spans in bars.items():
            # Tiles fill the row; store spans are a thin strip under the tile.
            y, height = (program + 0.05, 0.6) if kind != "store" else (program + 0.7, 0.25)
            ax.broken_barh(spans, (y, height), facecolors=COLORS[kind], linewidth=0)
        ax.set_ylim(programs + 0.2, -0.2)
        ax.set_ylabel("program (CTA)")
        config = f"{point['shape']}, {point['precision']}, {point['routing']}, "
        config += f"T={point['tokens_per_rank']}, P={point['world_size']}"
        ax.set_title(
            f"{path} path: {config}{_share(path, point)}; {schedule}, kernel time {end:.1f} us",
            fontsize=common.PANEL_TITLE_FONT,
        )
    axes[-1, 0].set_xlabel("time since the first tile started (us)")
    far = " / ".join(
        storepath.far_end(p) if megamoe.stores_far(point) else "the GPU (f = 0)"
        for p, (point, _) in per_path.items()
    )
    return common.finish_figure(
        fig,
        "MegaMoE per-program timeline, " + megamoe.paths_text(per_path),
        labels.doc_label(dataset_dir, doc),
        [frames.failure_note(frames.records_frame(doc))],
        legend=[
            Patch(color=COLORS["L1"], label="Linear-1 tile"),
            Patch(color=COLORS["L2"], label="Linear-2 tile"),
            Patch(color=COLORS["store"], label=f"store span of a Linear-2\ntile into {far}"),
        ],
    )


def _share(path: str, point: dict) -> str:
    """', host share f = 0.25' where the traced point sets its share."""
    if "remote_fraction" not in point:
        return ""
    return ", " + megamoe.fraction_text(path, fraction_label(point["remote_fraction"]))
