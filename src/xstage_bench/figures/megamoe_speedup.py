"""fig-megamoe-speedup: interleaved over expert-wave kernel speedup per configuration.

Top: every configuration as a bar, sorted, colored by model shape, with 1.0, the geometric
mean and the maximum marked. Bottom: the same speedups split by shape, precision and
routing, to show which group the gains (and the regressions) come from.
"""

from __future__ import annotations

from pathlib import Path

import seaborn as sns
from matplotlib import pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from xstage_bench import layout
from xstage_bench.figures import common


def plot(dataset_dir: Path) -> Figure:
    doc = common.raw_doc(dataset_dir, layout.MEGAMOE_RAW)
    speedups, incomplete = common.megamoe_speedups(doc)
    if speedups.empty:
        raise common.NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_RAW} has no configuration with ok "
            "expert_wave and interleaved records (variant absent or 'ours')"
        )
    speedups = speedups.sort_values("speedup", ignore_index=True)
    shapes = sorted(speedups["shape"].unique())
    palette = dict(zip(shapes, sns.color_palette("tab10", len(shapes)), strict=True))

    fig = plt.figure(figsize=(12, 7))
    grid = fig.add_gridspec(2, 3, height_ratios=(1.3, 1))
    bars = fig.add_subplot(grid[0, :])
    bars.bar(
        range(len(speedups)),
        speedups["speedup"],
        color=[palette[s] for s in speedups["shape"]],
        width=0.85,
    )
    bars.axhline(1.0, color="k", linewidth=1)
    gm = common.geomean(speedups["speedup"])
    bars.axhline(gm, color="tab:red", linestyle="--", linewidth=1)
    best = speedups["speedup"].idxmax()
    bars.annotate(
        f"max {speedups['speedup'].max():.2f}x",
        (best, speedups["speedup"].max()),
        textcoords="offset points",
        xytext=(-30, 4),
        fontsize=7,
    )
    bars.set_xlim(-0.6, len(speedups) - 0.4)
    bars.set_ylim(min(0.9, speedups["speedup"].min() * 0.95), speedups["speedup"].max() * 1.08)
    bars.set_xticks([])
    bars.set_xlabel(f"configuration, sorted by speedup ({len(speedups)} configurations)")
    bars.set_ylabel("expert-wave time / interleaved time")
    handles = [Patch(color=palette[s], label=s) for s in shapes]
    handles.append(Line2D([], [], color="tab:red", linestyle="--", label=f"geomean {gm:.3f}x"))
    bars.legend(handles=handles, fontsize=6, ncol=4, loc="upper left")

    for i, group in enumerate(common.MEGAMOE_GROUPS):
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
        ax.tick_params(axis="x", labelrotation=30 if group == "shape" else 0, labelsize=6)

    notes = [common.failure_note(common.records_frame(doc))]
    if len(incomplete):
        notes.append(
            f"{len(incomplete)} configuration(s) without an ok time for both schedules, not plotted"
        )
    return common.finish_figure(
        fig,
        "MegaMoE: interleaved vs expert-wave schedule",
        common.doc_label(dataset_dir, doc),
        notes,
    )
