"""fig-store-span-cdf: distribution of the per-tile remote-store span.

One ECDF per (configuration, schedule), colored by schedule: expert waves (drain-bound,
wide), interleaved (near the floor) and the local-store control (the floor itself). The
legend gives the range of per-configuration medians, the number the paper quotes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xstage_bench import layout
from xstage_bench.figures import common

METRIC = "store_span_us"
SCHEDULES = {"expert_wave": "tab:orange", "interleaved": "tab:blue", "local_control": "0.4"}


def plot(dataset_dir: Path) -> Figure:
    doc = common.raw_doc(dataset_dir, layout.MEGAMOE_TRACE_RAW)
    spans: dict[str, list[np.ndarray]] = {s: [] for s in SCHEDULES}
    for record in doc["records"]:
        schedule = common.trace_series(record["point"])
        samples = (record.get("samples") or {}).get(METRIC)
        if record["status"] == "ok" and schedule in spans and samples:
            spans[schedule].append(np.sort(np.asarray(samples, dtype=float)))
    if not any(spans.values()):
        raise common.NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_TRACE_RAW} has no ok record with "
            f"'{METRIC}' samples for {', '.join(SCHEDULES)}"
        )

    fig, axes = common.new_figure(1, 1, width=6.5, height=4.2)
    ax = axes[0, 0]
    handles = []
    for schedule, color in SCHEDULES.items():
        if not spans[schedule]:
            continue
        for values in spans[schedule]:
            ax.step(
                values,
                np.arange(1, values.size + 1) / values.size,
                where="post",
                color=color,
                linewidth=1,
                alpha=0.8,
            )
        medians = [float(np.median(v)) for v in spans[schedule]]
        median_text = (
            f"{medians[0]:.2f}" if len(medians) == 1 else f"{min(medians):.2f}-{max(medians):.2f}"
        )
        handles.append(
            Line2D(
                [],
                [],
                color=color,
                label=(f"{schedule}: median {median_text} us ({len(medians)} config(s))"),
            )
        )
    ax.set_xlabel("remote-store span of one Linear-2 tile (us)")
    ax.set_ylabel("fraction of tiles")
    ax.legend(handles=handles, fontsize=7, loc="lower right")
    missing = [s for s in SCHEDULES if not spans[s]]
    notes = [common.failure_note(common.records_frame(doc))]
    if missing:
        notes.append("no data for: " + ", ".join(missing))
    return common.finish_figure(
        fig,
        "MegaMoE per-tile remote-store span",
        common.doc_label(dataset_dir, doc),
        notes,
    )
