"""fig-megamoe-timeline: what every program (CTA) of the fused MoE kernel did over time.

One row per program: Linear-1 tiles, Linear-2 tiles, and under each Linear-2 tile the span
of its remote stores. Under expert waves the stores of a wave pile up together; interleaved,
Linear-1 work sits between them. The first configuration of the trace file is drawn, with
both panels on one time axis so their lengths compare directly.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from xstage_bench import layout
from xstage_bench.analysis import frames, labels, load, megamoe
from xstage_bench.figures import common
from xstage_bench.megamoe.schedule import COMPARED

COLORS = {"L1": "tab:blue", "L2": "tab:orange", "store": "tab:red"}


def plot(dataset_dir: Path) -> Figure:
    doc = load.raw_doc(dataset_dir, layout.MEGAMOE_TRACE_RAW)
    if not doc["records"]:
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_TRACE_RAW} has no records"
        )
    first = doc["records"][0]["point"]
    same = [
        r
        for r in doc["records"]
        if megamoe.megamoe_config_key(r["point"]) == megamoe.megamoe_config_key(first)
    ]
    traces = {}
    for schedule in COMPARED:
        found = [
            r
            for r in same
            if megamoe.trace_series(r["point"]) == schedule
            and r["status"] == "ok"
            and (r.get("extra") or {}).get("timeline")
        ]
        if not found:
            raise load.NoDataError(
                f"dataset '{dataset_dir.name}': {layout.MEGAMOE_TRACE_RAW} has no ok '{schedule}' "
                f"record with a timeline for the configuration {megamoe.megamoe_config_name(first)}"
            )
        traces[schedule] = found[0]["extra"]["timeline"]

    programs = max(int(row[0]) for t in traces.values() for row in t) + 1
    fig, axes = common.new_figure(
        2, 1, width=10, height=max(2.5, min(4.5, programs * 0.035)), sharex=True
    )
    for ax, (schedule, timeline) in zip(axes[:, 0], traces.items(), strict=True):
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
        ax.set_title(f"{schedule}: kernel time {end:.1f} us", fontsize=common.PANEL_TITLE_FONT)
    axes[-1, 0].set_xlabel("time since the first tile started (us)")
    return common.finish_figure(
        fig,
        f"MegaMoE per-program timeline: {megamoe.megamoe_config_name(first)}",
        labels.doc_label(dataset_dir, doc),
        [frames.failure_note(frames.records_frame(doc))],
        legend=[
            Patch(color=COLORS["L1"], label="Linear-1 tile"),
            Patch(color=COLORS["L2"], label="Linear-2 tile"),
            Patch(color=COLORS["store"], label="remote-store span\nof a Linear-2 tile"),
        ],
    )
