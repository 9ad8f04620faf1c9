"""fig-megamoe-speedup: interleaved over expert-wave speedup per configuration, per store
path.

Per path and headline set (natural routing on the peer path; each host share f on the
host path): every configuration as a bar of its layer-time speedup (kernel + barrier +
reduction) with its 95% CI, sorted, colored by model shape, its kernel-time speedup as a
dot on it, noisy ratios (CI beyond +-3%) hatched, with 1.0 and the geometric mean (with
its CI over configurations and samples) marked. Below: the same speedups split by shape,
precision and routing, to show which group the gains (and the regressions) come from.
Last, where the path holds the baselines (the simulator writes none): per configuration
our best schedule's time over the unfused torch pipeline's, over DeepGEMM's best
schedule's and, where the sweep measured it, over FlashInfer's, and our interleaved
speedup against DeepGEMM's L2-lag speedup.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, ScalarFormatter

from xstage_bench.data import stats
from xstage_bench.data.stats import NOISY_HALF_WIDTH
from xstage_bench.report.analysis import frames, labels, megamoe, megamoe_baselines
from xstage_bench.report.analysis.speedup_ci import headline_ci
from xstage_bench.report.figures import common

LAYER, KERNEL = megamoe.LAYER, megamoe.KERNEL


def plot(dataset_dir: Path) -> Figure:
    doc, every_fraction, incomplete = megamoe.megamoe_sweep(dataset_dir)
    sets = megamoe.headline_sets(every_fraction)
    paths = megamoe.ordered_paths(every_fraction["path"])
    shapes = sorted(every_fraction["shape"].unique())
    palette = dict(zip(shapes, sns.color_palette("tab10", len(shapes)), strict=True))
    baselines = megamoe.at_baseline_setting(megamoe_baselines.megamoe_baselines(doc))

    # One bars row per headline set, one groups row per path, one baselines row per path
    # that has baselines.
    layout = []
    for path in paths:
        layout += [("bars", path, what, part) for p, what, part in sets if p == path]
        layout.append(("groups", path, None, None))
        if not baselines[baselines["path"] == path].empty:
            layout.append(("baselines", path, None, None))
    heights = {"bars": 1.3, "groups": 1.0, "baselines": 1.2}
    ratios = [heights[kind] for kind, *_ in layout]
    fig = plt.figure(figsize=(12, 10.5 * sum(ratios) / 3.5))
    grid = fig.add_gridspec(len(layout), 3, height_ratios=ratios)
    notes = [frames.failure_note(frames.records_frame(doc))]
    handles = [Patch(color=palette[s], label=s) for s in shapes]
    handles += [
        Line2D([], [], color="k", marker="o", linestyle="", markersize=3, label=KERNEL.label),
        Patch(facecolor="white", edgecolor="0.3", hatch="///", label=_noisy_label()),
    ]
    for row, (kind, path, what, part) in enumerate(layout):
        if kind == "bars":
            handles.append(_plot_bars(fig.add_subplot(grid[row, :]), path, what, part, palette))
        elif kind == "groups":
            shown = [p for q, _, p in sets if q == path]
            _plot_groups(fig, grid, row, path, shown, palette)
        else:
            part = baselines[baselines["path"] == path]
            notes += _plot_baselines(fig, grid, row, part, palette, *_series(doc, part))
    for path in paths:
        part = every_fraction[every_fraction["path"] == path]
        plotted = {f for q, _, rows in sets if q == path for f in rows["remote_fraction"]}
        for fraction, rows in part.groupby("remote_fraction"):
            if fraction not in plotted:
                mean = stats.geomean(rows["speedup"])
                notes.append(
                    f"{path} path, {megamoe.fraction_text(path, fraction)} (rows re-homed): "
                    f"{len(rows)} configurations, geomean {mean:.3f}x, not plotted (tab-megamoe)"
                )
    notes.append("faster / slower / tie: a configuration's 95% CI lies above 1 / below 1 / spans 1")
    throttled = int(every_fraction["throttled"].sum())
    if throttled:
        notes.append(
            f"{throttled} configuration(s) with a record flagged throttled (tab-megamoe gives "
            "the headlines without them)"
        )
    if len(incomplete):
        notes.append(
            f"{len(incomplete)} configuration(s) without an ok time for both schedules, not plotted"
        )
    return common.finish_figure(
        fig,
        "MegaMoE: interleaved vs expert-wave schedule, " + megamoe.paths_text(paths),
        labels.doc_label(dataset_dir, doc),
        notes,
        handles,
    )


def _noisy_label() -> str:
    return f"noisy: CI beyond +-{NOISY_HALF_WIDTH:.0%}"


def _plot_bars(ax, path: str, what: str, part, palette: dict) -> Line2D:
    """One headline set's configurations as sorted bars of their layer-time speedup with
    CIs, kernel-time dots, noisy ones hatched; returns the geomean's legend entry."""
    part = part.sort_values("speedup", ignore_index=True)
    x = np.arange(len(part))
    speedup = part["speedup"].to_numpy(float)
    low = part["speedup_ci_low"].to_numpy(float)
    high = part["speedup_ci_high"].to_numpy(float)
    bars = ax.bar(
        x,
        speedup,
        color=[palette[s] for s in part["shape"]],
        width=0.85,
        yerr=np.vstack([np.clip(speedup - low, 0, None), np.clip(high - speedup, 0, None)]),
        error_kw={"elinewidth": 0.6, "ecolor": "0.3", "capsize": 0},
    )
    for bar, noisy in zip(bars, part["noisy"], strict=True):
        if noisy:
            bar.set_hatch("///")
            bar.set_edgecolor("0.3")
    if KERNEL.column("speedup") in part.columns and part[KERNEL.column("speedup")].notna().any():
        ax.plot(x, part[KERNEL.column("speedup")], "o", color="k", markersize=2.5)
    ax.axhline(1.0, color="k", linewidth=1)
    gm, gm_low, gm_high = headline_ci(list(part["samples"]), "geomean")
    ax.axhline(gm, color="tab:red", linestyle="--", linewidth=1)
    ax.axhspan(gm_low, gm_high, color="tab:red", alpha=0.12, linewidth=0)
    best = int(np.argmax(speedup))
    ax.annotate(
        f"max {speedup[best]:.2f}x [{low[best]:.2f}, {high[best]:.2f}]",
        (best, high[best]),
        textcoords="offset points",
        xytext=(-60, 4),
        fontsize=common.LEGEND_FONT,
    )
    ax.set_xlim(-0.6, len(part) - 0.4)
    ax.set_ylim(min(0.9, np.nanmin(low) * 0.98), np.nanmax(high) * 1.06)
    # ranks, not names: a configuration's name is in tab-megamoe's per-configuration rows
    ranks = MaxNLocator(nbins=8, integer=True).tick_values(1, len(part))
    ax.xaxis.set_major_locator(FixedLocator([0] + [r - 1 for r in ranks if 1 < r <= len(part)]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v + 1:.0f}"))
    ax.set_xlabel(f"configuration rank, by speedup ({len(part)} configurations)")
    ax.set_ylabel(f"expert-wave / interleaved\n{LAYER.name}")
    verdicts = part["verdict"]
    ax.set_title(
        f"{megamoe.path_title(path)}, {what}\ninterleaved faster in "
        f"{int((verdicts == stats.FASTER).sum())}, slower in "
        f"{int((verdicts == stats.SLOWER).sum())}, tie in {int((verdicts == stats.TIE).sum())}; "
        f"{int(part['noisy'].sum())} noisy",
        fontsize=common.PANEL_TITLE_FONT,
    )
    return Line2D(
        [],
        [],
        color="tab:red",
        linestyle="--",
        label=f"{path}, {what}: geomean\n{gm:.3f}x [{gm_low:.3f}, {gm_high:.3f}] ({LAYER.name})",
    )


def _plot_groups(fig: Figure, grid, row: int, path: str, shown: list, palette: dict) -> None:
    """The path's plotted configurations split by shape, precision and routing (hue: the
    shape, or the share f where the path has several headline sets)."""
    data = pd.concat(shown, ignore_index=True)
    by_fraction = len(shown) > 1
    hue = "remote_fraction" if by_fraction else "shape"
    fractions = sorted(data["remote_fraction"].unique())
    colors = (
        dict(zip(fractions, sns.color_palette("viridis", len(fractions)), strict=True))
        if by_fraction
        else palette
    )
    for i, group in enumerate(("shape", "precision", "routing")):
        ax = fig.add_subplot(grid[row, i])
        sns.stripplot(
            data=data,
            x=group,
            y="speedup",
            hue=hue,
            palette=colors,
            ax=ax,
            size=3,
            legend=by_fraction and i == 2,
        )
        ax.axhline(1.0, color="k", linewidth=1)
        ax.set_xlabel(group)
        ax.set_ylabel(f"{path} path\n{LAYER.name} speedup" if i == 0 else "")
        ax.tick_params(axis="x", labelsize=9)
        if group == "shape":  # long names: slanted, each ending under its own column
            for label in ax.get_xticklabels():
                label.set(rotation=30, ha="right", rotation_mode="anchor")
        if by_fraction and ax.get_legend():
            ax.get_legend().set_title(megamoe.share_word(path))


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
    if baselines[list(megamoe_baselines.UNFUSED_PATH_RATIOS)].isna().all(axis=None):
        unfused = (UNFUSED_BEST,)
    fused = [
        (label, column, marker)
        for variant, _, label, column, marker in FUSED_SERIES
        if variant == "deepgemm" or megamoe_baselines.has_records(doc, variant)
    ]
    outcomes = {
        column: megamoe_baselines.variant_outcome(doc, variant, name)
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
    fig: Figure, grid, row: int, baselines, palette: dict, series: list, outcomes: dict
) -> list[str]:
    """The bottom row: time ratios against each baseline, sorted per baseline, and the two
    kernels' schedule speedups side by side. Returns notes on what could not be drawn."""
    notes = []
    ratios = fig.add_subplot(grid[row, :2])
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
    ratios.set_ylabel(f"our best {LAYER.name} / baseline time\n(below 1: ours faster)")
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

    pair = fig.add_subplot(grid[row, 2])
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
    pair.set_xlabel(f"ours: wave / interleaved ({LAYER.name})")
    pair.set_ylabel("DeepGEMM: wave / L2-lag")
    return notes
