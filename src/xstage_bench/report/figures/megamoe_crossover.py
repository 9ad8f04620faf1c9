"""fig-megamoe-crossover: where interleaving starts to pay, with the compute emulated, per
store path.

One row of panels per path, one panel per shape: expert-wave time over interleaved time
(medians, with the ratio's 95% bootstrap CI) against the compute rate the expert-wave run
achieved (useful FLOPs over its time), one line per share f, its points sorted by that
rate (0: the local-store control, no X-Stage; on the peer path natural: (P-1)/P and 7/8:
an 8-GPU node's per-GPU traffic; on the host path f is the host share). The achieved
rate, not the nominal X of the tile waits, is what loads the far end: padding rows,
epilogues, the combine and the tail add to the waits. The dotted line marks the rate
whose ratio to the path's own drain rate R equals the paper's node's (its FP8 rate over
its R): to the right of it, the path is as loaded as the paper's. Emulated: measured on
GPUs, every tile's MMA replaced by a wait (megamoe/emulated.py).
"""

from __future__ import annotations

from pathlib import Path

import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xstage_bench.report.analysis import frames, labels, megamoe, megamoe_emulated
from xstage_bench.report.figures import common


def x_column(speedups) -> str:
    """The achieved rate where the records carry it (the measured sweep), else nominal X."""
    return (
        "wave_equivalent_tflops"
        if "wave_equivalent_tflops" in speedups.columns
        else "emulated_tflops"
    )


def lines(speedups, path: str, shape: str) -> list[tuple[str, object]]:
    """(f, its points sorted by x) of one panel: one line per share, x never going back."""
    part = speedups[(speedups["path"] == path) & (speedups["shape"] == shape)]
    return [
        (fraction, rows.sort_values(x_column(speedups), kind="stable"))
        for fraction, rows in part.groupby("remote_fraction", sort=False)
    ]


def fraction_legend(path: str, fraction: str) -> str:
    if fraction == "natural":
        return "f natural ((P-1)/P)"
    return megamoe.fraction_text(path, fraction).replace(megamoe.share_word(path) + " ", "")


def plot(dataset_dir: Path) -> Figure:
    doc, speedups = megamoe_emulated.emulated_sweep(dataset_dir)
    x = x_column(speedups)
    paths = megamoe.ordered_paths(speedups["path"])
    shapes = list(dict.fromkeys(speedups["shape"]))
    fractions = list(dict.fromkeys(speedups["remote_fraction"]))
    palette = dict(zip(fractions, sns.color_palette("viridis", len(fractions)), strict=True))
    fig, axes = common.new_figure(len(paths), len(shapes), width=4.4, height=3.8, sharey=True)
    legend: list = []
    notes = [
        "emulated: measured on GPUs, every tile's MMA replaced by a wait for its FLOPs at X;",
        "tile lists, counters, far-end stores and combine are the real kernel's.",
        f"T = {int(speedups['tokens_per_rank'].iloc[0])} tokens per rank, "
        f"P = {int(speedups['world_size'].iloc[0])}; nominal X of the waits: "
        + ", ".join(f"{v:g}" for v in sorted(speedups["emulated_tflops"].unique()))
        + " TFLOP/s (one point each per line, sorted by the rate achieved).",
        frames.failure_note(frames.records_frame(doc)),
    ]
    for row, path in enumerate(paths):
        marker = megamoe_emulated.crossover_rate_tflops(dataset_dir, path)
        seen: list[str] = []
        for ax, shape in zip(axes[row], shapes, strict=True):
            for fraction, rows in lines(speedups, path, shape):
                seen.append(fraction)
                ax.errorbar(
                    rows[x],
                    rows["speedup"],
                    yerr=[
                        (rows["speedup"] - rows["speedup_ci_low"]).clip(lower=0),
                        (rows["speedup_ci_high"] - rows["speedup"]).clip(lower=0),
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
            ax.set_title(f"{shape}, {megamoe.path_title(path)}", fontsize=9)
            ax.set_xlabel(
                "achieved TFLOP/s per GPU, expert waves"
                if x == "wave_equivalent_tflops"
                else "emulated X, TFLOP/s per GPU"
            )
        axes[row][0].set_ylabel(f"{path} path: expert-wave /\ninterleaved time")
        share = megamoe.share_word(path)
        legend += [
            Line2D(
                [],
                [],
                color=palette[f],
                marker="o",
                label=f"{path}, {share}: {fraction_legend(path, f)}",
            )
            for f in dict.fromkeys(seen)
        ]
        if marker:
            legend.append(
                Line2D(
                    [],
                    [],
                    color="0.4",
                    linestyle=":",
                    label=f"{path}: X/R of the paper's node\n"
                    f"({marker[0]:.0f} TFLOP/s at {marker[1]})",
                )
            )
        else:
            notes.append(
                f"no fitted R for the {path} path in this dataset: the paper's "
                "compute-to-drain ratio not marked there"
            )
    return common.finish_figure(
        fig,
        "MegaMoE with compute emulated: interleaved over expert-wave speedup,\n"
        + megamoe.paths_text(paths),
        labels.doc_label(dataset_dir, doc) + " (emulated compute)",
        notes,
        legend,
    )
