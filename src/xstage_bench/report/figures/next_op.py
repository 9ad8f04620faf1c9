"""fig-next-op: which operation after a burst waits for the burst to drain.

Right after each burst, thread 0 of every producer performs one operation on local memory
(study `next_op`: none, a plain load, a volatile load, an atomic, a fence, a TMA bulk
load), then the producer computes for its gap G. Producers run free (no grid barrier,
whose own atomic would wait). When the gap is long enough to drain the burst (V/R <= G),
an operation that does not wait leaves the period at about the store loop plus G; one that
waits for the producer's stores to drain adds their drain time before the gap even starts.
So the panels show period - G per operation: one row per store path (the local control
drawn hollow beside it), one column per gap, one color per burst size.
"""

from __future__ import annotations

from pathlib import Path

import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xstage_bench.data import storepath
from xstage_bench.microbench.launch import NEXT_OPS
from xstage_bench.report.analysis import frames, labels, load
from xstage_bench.report.figures import common

STUDY = "next_op"
METRIC = "period_us"
OPS = tuple(NEXT_OPS)  # the x axis, in burst.cu's order
OP_LABELS = {
    "none": "none\n(register work)",
    "load": "plain\nload",
    "volatile_load": "volatile\nload",
    "atomic": "atomic\nadd",
    "fence": "fence",
    "tma_load": "TMA bulk\nload",
}


def plot(dataset_dir: Path) -> Figure:
    doc = load.raw_doc(dataset_dir, f"microbench:{STUDY}")
    df = frames.records_frame(doc)
    notes = [frames.failure_note(df)]
    title = "Where backpressure lands: the period after each next operation"
    try:
        ok = frames.ok_rows(df, dataset_dir, f"microbench/{STUDY}.json", (METRIC,))
    except load.NoDataError as e:
        fig, axes = common.new_figure(1, 1, width=6.0, height=3.0)
        common.no_data_panel(axes[0][0], "every store path", str(e), 70)
        return common.finish_figure(fig, title, labels.doc_label(dataset_dir, doc), notes)
    paths = frames.remote_paths(ok) or [storepath.LOCAL]
    gaps = sorted(float(g) for g in ok["gap_us"].unique())
    sizes = sorted(int(v) for v in ok["V"].unique())
    colors = dict(zip(sizes, sns.color_palette("deep", len(sizes)), strict=True))
    x = {op: i for i, op in enumerate(OPS)}

    fig, axes = common.new_figure(len(paths), len(gaps), width=4.6, height=3.6, sharey="row")
    for row_axes, path in zip(axes, paths, strict=True):
        for ax, gap in zip(row_axes, gaps, strict=True):
            for dest, hollow, offset in ((path, False, -0.12), (storepath.LOCAL, True, 0.12)):
                if dest == path and path == storepath.LOCAL and hollow is False:
                    continue  # a dataset with only the control draws it once, hollow
                for V in sizes:
                    rows = ok[(ok["path"] == dest) & (ok["gap_us"] == gap) & (ok["V"] == V)]
                    rows = rows[rows["next_op"].isin(OPS)]
                    if rows.empty:
                        continue
                    rows = rows.assign(x=rows["next_op"].map(x) + offset).sort_values("x")
                    shifted = rows.assign(
                        **{
                            f"{METRIC}_{s}": rows[f"{METRIC}_{s}"] - gap
                            for s in ("median", "ci_low", "ci_high")
                        }
                    )
                    color = colors[V]
                    ax.errorbar(
                        shifted["x"],
                        shifted[f"{METRIC}_median"],
                        yerr=common.error_bars(shifted, METRIC),
                        color=color,
                        linestyle="none",
                        marker="o",
                        markersize=5,
                        markerfacecolor="none" if hollow else color,
                        markeredgecolor=color,
                        capsize=2,
                    )
            ax.set_xticks(range(len(OPS)))
            ax.set_xticklabels([OP_LABELS[op] for op in OPS], fontsize=9)
            ax.set_title(
                f"{storepath.far_end(path)}, G = {gap:g} us", fontsize=common.PANEL_TITLE_FONT
            )
            ax.set_ylim(bottom=0)
        row_axes[0].set_ylabel("period - G (us)")
    for ax in axes[-1]:
        ax.set_xlabel("what thread 0 does right after its burst")

    handles = [
        Line2D(
            [],
            [],
            color=colors[V],
            marker="o",
            linestyle="none",
            label=f"V = {labels.fmt_bytes(V)}",
        )
        for V in sizes
    ]
    handles.append(
        Line2D(
            [],
            [],
            color="0.4",
            marker="o",
            markerfacecolor="none",
            linestyle="none",
            label="local control (hollow)",
        )
    )
    K = sorted(int(k) for k in ok["K"].unique())
    notes.append(
        f"K = {', '.join(map(str, K))} free-running producers, compute gap; period = median "
        "over producers of start-to-start time, bars its 95% CI. An operation that waits for "
        "the burst to drain lifts period - G above the others at the same V."
    )
    return common.finish_figure(
        fig, title, labels.doc_label(dataset_dir, doc), notes, legend=handles
    )
