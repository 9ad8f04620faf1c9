"""fig-megamoe-crossover: where interleaving starts to pay, with the compute emulated.

One panel per shape: expert-wave time over interleaved time (medians, with their CIs
propagated as the extremes of the ratio) against the compute rate the expert-wave run
achieved (useful FLOPs over its time), one line per remote fraction f (0: the local-store
control, no X-Stage; natural: (P-1)/P; 7/8: an 8-GPU node's per-GPU traffic). The achieved
rate, not the nominal X of the tile waits, is what loads the interconnect: padding rows,
epilogues, the combine and the tail add to the waits. The dotted line marks the rate whose
ratio to this dataset's drain rate R equals the paper's node's (its FP8 rate over its R):
to the right of it, our interconnect is as loaded as the paper's. Emulated: measured on
GPUs, every tile's MMA replaced by a wait (megamoe/emulated.py).
"""

from __future__ import annotations

from pathlib import Path

import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xstage_bench.analysis import frames, labels, megamoe
from xstage_bench.figures import common


def plot(dataset_dir: Path) -> Figure:
    doc, speedups = megamoe.emulated_sweep(dataset_dir)
    # the achieved rate where the records carry it (the measured sweep), else nominal X
    achieved = "wave_equivalent_tflops" in speedups.columns
    x_column = "wave_equivalent_tflops" if achieved else "emulated_tflops"
    shapes = list(dict.fromkeys(speedups["shape"]))
    fractions = list(dict.fromkeys(speedups["remote_fraction"]))
    palette = dict(zip(fractions, sns.color_palette("viridis", len(fractions)), strict=True))
    fig, axes = common.new_figure(1, len(shapes), width=4.4, height=3.8, sharey=True)
    marker = megamoe.crossover_rate_tflops(dataset_dir)
    for ax, shape in zip(axes[0], shapes, strict=True):
        part = speedups[speedups["shape"] == shape]
        for fraction, rows in part.groupby("remote_fraction", sort=False):
            rows = rows.sort_values(x_column)
            ax.errorbar(
                rows[x_column],
                rows["speedup"],
                yerr=[
                    rows["speedup"] - rows["speedup_low"],
                    rows["speedup_high"] - rows["speedup"],
                ],
                color=palette[fraction],
                marker="o",
                markersize=3,
                linewidth=1.2,
                capsize=2,
            )
        ax.axhline(1.0, color="k", linewidth=0.8)
        if marker:
            ax.axvline(marker[0], color="0.4", linestyle=":", linewidth=1)
        ax.set_title(shape, fontsize=9)
    axes[0][0].set_ylabel("expert-wave / interleaved time")
    for ax in axes[0]:
        ax.set_xlabel(
            "achieved TFLOP/s per GPU, expert waves" if achieved else "emulated X, TFLOP/s per GPU"
        )
    legend = [
        Line2D([], [], color=palette[f], marker="o", label=labels.fraction_name(f))
        for f in fractions
    ]
    notes = [
        "emulated: measured on GPUs, every tile's MMA replaced by a wait for its FLOPs at X;",
        "tile lists, counters, peer stores and combine are the real kernel's.",
        f"T = {int(speedups['tokens_per_rank'].iloc[0])} tokens per rank, "
        f"P = {int(speedups['world_size'].iloc[0])}; nominal X of the waits: "
        + ", ".join(f"{x:g}" for x in sorted(speedups["emulated_tflops"].unique()))
        + " TFLOP/s (one point each per line).",
        frames.failure_note(frames.records_frame(doc)),
    ]
    if marker:
        legend.append(
            Line2D(
                [],
                [],
                color="0.4",
                linestyle=":",
                label=f"X/R of the paper's node ({marker[0]:.0f} TFLOP/s at {marker[1]})",
            )
        )
    else:
        notes.append("no fitted R in this dataset: the paper's compute-to-drain ratio not marked")
    return common.finish_figure(
        fig,
        "MegaMoE with compute emulated: interleaved over expert-wave speedup",
        labels.doc_label(dataset_dir, doc) + " (emulated compute)",
        notes,
        legend,
    )
