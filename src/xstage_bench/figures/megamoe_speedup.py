"""fig-megamoe-speedup: interleaved over expert-wave kernel speedup per configuration.

Top: every configuration as a bar, sorted, colored by model shape, with 1.0, the geometric
mean and the maximum marked. Middle: the same speedups split by shape, precision and
routing, to show which group the gains (and the regressions) come from. Bottom, where the
dataset holds the baselines (the simulator writes none): per configuration our best
schedule's time over the unfused torch pipeline's, over DeepGEMM's best schedule's and,
where the sweep measured it, over FlashInfer's, and our interleaved speedup against
DeepGEMM's L2-lag speedup.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib import pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, ScalarFormatter

from xstage_bench import stats
from xstage_bench.analysis import frames, labels, megamoe
from xstage_bench.figures import common


def plot(dataset_dir: Path) -> Figure:
    doc, every_fraction, incomplete = megamoe.megamoe_sweep(dataset_dir)
    speedups = megamoe.natural_routing(every_fraction).sort_values("speedup", ignore_index=True)
    shapes = sorted(speedups["shape"].unique())
    palette = dict(zip(shapes, sns.color_palette("tab10", len(shapes)), strict=True))

    baselines = megamoe.natural_routing(megamoe.megamoe_baselines(doc))
    rows = 2 if baselines.empty else 3
    fig = plt.figure(figsize=(12, 7 if rows == 2 else 10.5))
    grid = fig.add_gridspec(rows, 3, height_ratios=(1.3, 1, 1.2)[:rows])
    bars = fig.add_subplot(grid[0, :])
    bars.bar(
        range(len(speedups)),
        speedups["speedup"],
        color=[palette[s] for s in speedups["shape"]],
        width=0.85,
    )
    bars.axhline(1.0, color="k", linewidth=1)
    gm = stats.geomean(speedups["speedup"])
    bars.axhline(gm, color="tab:red", linestyle="--", linewidth=1)
    best = speedups["speedup"].idxmax()
    bars.annotate(
        f"max {speedups['speedup'].max():.2f}x",
        (best, speedups["speedup"].max()),
        textcoords="offset points",
        xytext=(-30, 4),
        fontsize=common.LEGEND_FONT,
    )
    bars.set_xlim(-0.6, len(speedups) - 0.4)
    bars.set_ylim(min(0.9, speedups["speedup"].min() * 0.95), speedups["speedup"].max() * 1.08)
    bars.set_xticks([])
    bars.set_xlabel(f"configuration, sorted by speedup ({len(speedups)} configurations)")
    bars.set_ylabel("expert-wave time / interleaved time")
    handles = [Patch(color=palette[s], label=s) for s in shapes]
    handles.append(Line2D([], [], color="tab:red", linestyle="--", label=f"geomean {gm:.3f}x"))
    bars.legend(handles=handles, fontsize=common.LEGEND_FONT, ncol=4, loc="upper left")

    for i, group in enumerate(("shape", "precision", "routing")):
        ax = fig.add_subplot(grid[1, i])
        sns.stripplot(
            data=speedups,
            x=group,
            y="speedup",
            hue="shape",
            palette=palette,
            ax=ax,
            size=3,
            legend=False,
        )
        ax.axhline(1.0, color="k", linewidth=1)
        ax.set_xlabel(group)
        ax.set_ylabel("speedup" if i == 0 else "")
        ax.tick_params(axis="x", labelsize=9)
        if group == "shape":  # long names: slanted, each ending under its own column
            for label in ax.get_xticklabels():
                label.set(rotation=30, ha="right", rotation_mode="anchor")

    notes = [frames.failure_note(frames.records_frame(doc))]
    if len(speedups) < len(every_fraction):
        for fraction, part in every_fraction.groupby("remote_fraction"):
            if fraction != "natural":
                notes.append(
                    f"remote fraction {fraction} (rows re-homed): {len(part)} configurations, "
                    f"geomean {stats.geomean(part['speedup']):.3f}x, not plotted (tab-megamoe)"
                )
    if not baselines.empty:
        notes += _plot_baselines(fig, grid, baselines, palette, *_series(doc, baselines))
    if len(incomplete):
        notes.append(
            f"{len(incomplete)} configuration(s) without an ok time for both schedules, not plotted"
        )
    return common.finish_figure(
        fig,
        "MegaMoE: interleaved vs expert-wave schedule",
        labels.doc_label(dataset_dir, doc),
        notes,
    )


UNFUSED_SERIES = (
    ("unfused torch, FP8 grouped (per-token x per-channel)", "ours_over_unfused_fp8", "s"),
    ("unfused torch, bf16 grouped", "ours_over_unfused_bf16", "o"),
)
# Sweeps from before the unfused pipeline timed each GEMM path: its fastest path only.
UNFUSED_BEST = ("unfused torch pipeline", "ours_over_unfused", "o")
# The fused baselines: (variant, name, label, column, marker); FlashInfer drawn only
# where the sweep measured it, so the figures of sweeps before it stay as they were.
FUSED_SERIES = (
    ("deepgemm", "DeepGEMM", "DeepGEMM SM90 MegaMoE", "ours_over_deepgemm", "^"),
    ("flashinfer", "FlashInfer", "FlashInfer SM90 FP8 MegaMoE", "ours_over_flashinfer", "D"),
)


def _series(doc: dict, baselines) -> tuple[list, dict]:
    """The ratio series to draw, and for the fused baselines' columns what happened to
    their records (said where one has no ok time)."""
    unfused = UNFUSED_SERIES
    if baselines[list(megamoe.UNFUSED_PATH_RATIOS)].isna().all(axis=None):
        unfused = (UNFUSED_BEST,)
    fused = [
        (label, column, marker)
        for variant, _, label, column, marker in FUSED_SERIES
        if variant == "deepgemm" or megamoe.has_records(doc, variant)
    ]
    outcomes = {
        column: megamoe.variant_outcome(doc, variant, name)
        for variant, name, _, column, _ in FUSED_SERIES
    }
    return [*unfused, *fused], outcomes


def _by_precision(part, column: str) -> str:
    """'w4a8 0.78, w8a8 0.39, n=168': the geomean of a ratio per precision."""
    means = ", ".join(
        f"{p} {stats.geomean(g[column]):.2f}" for p, g in part.groupby("precision", sort=True)
    )
    return f"{means}, n={len(part)}"


def _sparse_log_label(value: float, _pos) -> str:
    """A minor tick's label on the log ratio axis: 0.2, 0.3, 0.5, 2, 3, 5 (scaled), else none."""
    if value <= 0:
        return ""
    mantissa = value / 10 ** np.floor(np.log10(value) + 1e-9)
    return f"{value:g}" if any(abs(mantissa - m) < 1e-6 for m in (2, 3, 5)) else ""


def _plot_baselines(
    fig: Figure, grid, baselines, palette: dict, series: list, outcomes: dict
) -> list[str]:
    """The bottom row: time ratios against each baseline, sorted per baseline, and the two
    kernels' schedule speedups side by side. Returns notes on what could not be drawn."""
    notes = []
    ratios = fig.add_subplot(grid[2, :2])
    deepgemm = outcomes["ours_over_deepgemm"]
    for label, column, marker in series:
        part = baselines[baselines[column].notna()].sort_values(column, ignore_index=True)
        if part.empty:
            why = f": {outcomes[column]}" if column in outcomes else ""
            notes.append(f"{label}: no configuration with an ok time, not plotted{why}")
            continue
        ratios.scatter(
            np.arange(len(part)),
            part[column],
            c=[palette.get(s, "gray") for s in part["shape"]],
            marker=marker,
            s=14,
            label=f"{label} (geomean {_by_precision(part, column)})",
        )
    ratios.axhline(1.0, color="k", linewidth=1)
    ratios.set_yscale("log")
    ratios.set_xlabel("configuration, sorted per baseline")
    ratios.set_ylabel("our best time / baseline time\n(below 1: ours faster)")
    ratios.yaxis.set_major_formatter(ScalarFormatter())
    # Label only a few minor ticks: all of 0.2-0.9 crowd into one another below 1.0.
    ratios.yaxis.set_minor_formatter(FuncFormatter(_sparse_log_label))
    ratios.tick_params(axis="y", which="both", labelsize=9)
    if ratios.collections:
        # Below the panel: inside it the legend would hide the points of some baseline.
        legend = ratios.legend(
            fontsize=common.LEGEND_FONT,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.3),
            frameon=False,
        )
        for handle in legend.legend_handles:  # the markers say which baseline, not which shape
            handle.set_color("gray")

    pair = fig.add_subplot(grid[2, 2])
    both = baselines[baselines["deepgemm_lag_speedup"].notna()]
    if both.empty:
        why = textwrap.fill(
            f"DeepGEMM SM90 MegaMoE ran no configuration with both schedules: {deepgemm}", 38
        )
        pair.text(
            0.5,
            0.5,
            why,
            ha="center",
            va="center",
            fontsize=common.LEGEND_FONT,
            transform=pair.transAxes,
        )
        pair.set_xticks([])
        pair.set_yticks([])
    else:
        pair.scatter(
            both["ours_speedup"],
            both["deepgemm_lag_speedup"],
            c=[palette.get(s, "gray") for s in both["shape"]],
            s=14,
        )
        low = min(both["ours_speedup"].min(), both["deepgemm_lag_speedup"].min(), 1.0) * 0.95
        high = max(both["ours_speedup"].max(), both["deepgemm_lag_speedup"].max(), 1.0) * 1.05
        pair.plot([low, high], [low, high], color="k", linewidth=0.8)
        pair.set_xlim(low, high)
        pair.set_ylim(low, high)
    pair.set_xlabel("ours: wave / interleaved")
    pair.set_ylabel("DeepGEMM: wave / L2-lag")
    return notes
