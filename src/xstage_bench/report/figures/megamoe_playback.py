"""fig-megamoe-playback: does the Burst-Gap model predict the fused kernel? (issue 52, item 4)

Predicted against measured kernel time of every arm of our kernel (configuration, share f,
schedule and lead), on log axes, and below it the error (predicted / measured - 1): left,
a program that stored is held at its next tile claim until its own stores drained; right,
it moves on once they are issued. One colour
per schedule, circles for the main grid and triangles for the lead map; hollow grey
markers are the calibration arms (their tile costs were set on them, so they sit on the
diagonal by construction). The band is +-10% around predicted = measured.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import PercentFormatter

from xstage_bench.megamoe import schedule
from xstage_bench.report.analysis import labels, megamoe
from xstage_bench.report.analysis import megamoe_playback as mp
from xstage_bench.report.figures import common

BAND = 0.10
MARKERS = {mp.MAIN: "o", mp.LEAD_MAP: "^"}
PANELS = (("hold", "held until its stores drain"), ("no_hold", "moving on once issued"))


def plot(dataset_dir: Path) -> Figure:
    doc, metric, predicted = mp.predictions(dataset_dir)
    summary = mp.error_summary(predicted).set_index(["arms", "schedule"])
    names = [s for s in schedule.SCHEDULES if s in set(predicted["schedule"])]
    palette = dict(zip(names, sns.color_palette("deep", len(names)), strict=True))
    calibration = predicted["calibration"] == mp.CALIBRATION
    low = predicted[["measured_us", "predicted_us_hold", "predicted_us_no_hold"]].min().min()
    high = predicted[["measured_us", "predicted_us_hold", "predicted_us_no_hold"]].max().max()
    span = np.array([low / 1.3, high * 1.3])
    fig, axes = common.new_figure(2, len(PANELS), width=5.2, height=4.2, sharex=True)
    for column, (suffix, words) in enumerate(PANELS):
        every = summary.loc[("every arm", "")]
        top, bottom = axes[0, column], axes[1, column]
        top.set_title(
            f"{words}: median |error| {every[f'median |error| {suffix}']:.1%}, "
            f"p90 {every[f'p90 |error| {suffix}']:.1%}",
            fontsize=common.PANEL_TITLE_FONT,
        )
        top.fill_between(span, span * (1 - BAND), span * (1 + BAND), color="0.9", zorder=0)
        top.plot(span, span, color="k", linewidth=0.8, zorder=1)
        bottom.axhspan(-BAND, BAND, color="0.9", zorder=0)
        bottom.axhline(0.0, color="k", linewidth=0.8, zorder=1)
        predicted_us = f"predicted_us_{suffix}"
        for ax, y in ((top, predicted_us), (bottom, f"error_{suffix}")):
            apart = predicted[calibration]
            ax.scatter(
                apart["measured_us"],
                apart[y],
                facecolors="none",
                edgecolors="0.6",
                s=18,
                zorder=2,
            )
            for (sched, grid), part in predicted[~calibration].groupby(["schedule", "grid"]):
                ax.scatter(
                    part["measured_us"],
                    part[y],
                    color=palette[sched],
                    marker=MARKERS[grid],
                    s=18,
                    alpha=0.85,
                    zorder=3,
                )
            ax.set_xscale("log")
            ax.set_xlim(*span)
        top.set_yscale("log")
        top.set_ylim(*span)
        top.set_ylabel(f"predicted {metric.name} (us)")
        bottom.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        bottom.set_ylabel("predicted / measured - 1")
        bottom.set_xlabel(f"measured {metric.name} (us)")
    legend = [
        Line2D(
            [], [], color=palette[s], marker="o", linestyle="", label=schedule.SCHEDULES[s].label
        )
        for s in names
    ]
    legend += [
        Line2D([], [], color="0.3", marker=m, linestyle="", label=g)
        for g, m in MARKERS.items()
        if g in set(predicted["grid"])
    ]
    legend.append(
        Line2D(
            [],
            [],
            marker="o",
            markerfacecolor="none",
            markeredgecolor="0.6",
            linestyle="",
            label="calibration arm",
        )
    )
    legend.append(Line2D([], [], color="0.85", linewidth=6, label=f"+-{BAND:.0%}"))
    paths = megamoe.ordered_paths(predicted["path"])
    notes = [
        "every ok arm of our kernel played through the path's fitted drain (T0, "
        "Q(K) = min(S + K q, C), R) in its own tile list; tile costs scaled per configuration "
        "and schedule on its calibration arm (tab-megamoe-playback says which, and every "
        "number).",
        f"{int((~calibration).sum())} arms predicted, {int(calibration.sum())} calibration arms.",
    ]
    return common.finish_figure(
        fig,
        f"MegaMoE: predicted vs measured {metric.name}, {megamoe.paths_text(paths)}",
        labels.doc_label(dataset_dir, doc),
        notes,
        legend,
    )
