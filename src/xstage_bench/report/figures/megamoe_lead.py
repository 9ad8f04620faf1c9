"""fig-megamoe-lead: the real kernel's lead map (issue 25, items 3 and 7).

One panel per configuration of the lead sweep (per store path): interleaved over
expert-wave speedup, with its 95% CI, against the share f of combine rows stored into the
far end (on the host path the host share; 0 is the local control), one line per swept
Linear-1 lead, and the model's `auto` lead as a dashed black line with stars, each star
labelled with the rows it resolved to. How far Linear-1 runs ahead decides how much
compute sits between the Linear-2 bursts: where the far end's drain is the bottleneck, a
longer lead should pay, until it delays Linear-2 itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xstage_bench.data.grid import NATURAL
from xstage_bench.report.analysis import frames, labels, megamoe, megamoe_lead
from xstage_bench.report.figures import common

PANEL_COLUMNS = 3


def share_value(fraction: str, world_size: int) -> float:
    """f on the x axis: the number, or (P-1)/P for natural routing."""
    return (world_size - 1) / world_size if fraction == NATURAL else float(fraction)


def plot(dataset_dir: Path) -> Figure:
    doc, leads = megamoe_lead.lead_sweep(dataset_dir)
    metric = megamoe_lead.lead_metric(leads)
    speedup = metric.column("speedup")
    leads = leads.assign(
        x=[
            share_value(f, int(p))
            for f, p in zip(leads["remote_fraction"], leads["world_size"], strict=True)
        ]
    )
    panel_keys = [k for k in megamoe_lead.config_keys(leads) if k != "remote_fraction"]
    panels = list(leads.groupby(panel_keys, sort=False))
    numeric = sorted({int(x) for x in leads.loc[~leads["auto"], "lead"] if x.isdigit()})
    palette = dict(zip(numeric, sns.color_palette("viridis", len(numeric)), strict=True))
    columns = min(PANEL_COLUMNS, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = common.new_figure(rows, columns, width=4.4, height=3.6, sharey=True)
    for ax, (_, part) in zip(axes.flat, panels, strict=False):
        path = part["path"].iloc[0]
        for lead, line in part.groupby("lead", sort=False):
            line = line.sort_values("x")
            y = line[speedup].to_numpy(float)
            yerr = np.vstack(
                [
                    np.clip(y - line[metric.column("speedup_ci_low")], 0, None),
                    np.clip(line[metric.column("speedup_ci_high")] - y, 0, None),
                ]
            )
            if lead == megamoe_lead.AUTO:
                ax.errorbar(
                    line["x"],
                    y,
                    yerr=yerr,
                    color="k",
                    linestyle="--",
                    marker="*",
                    markersize=9,
                    linewidth=1.2,
                    capsize=2,
                    zorder=4,
                )
                for x, v, rows_ in zip(line["x"], y, line["lead_rows"], strict=True):
                    if not np.isnan(rows_):
                        ax.annotate(
                            f"{int(rows_)}",
                            (x, v),
                            textcoords="offset points",
                            xytext=(4, 6),
                            fontsize=common.NOTE_FONT,  # 8 pt read 7.9 pt as the report shows it
                        )
            elif lead.isdigit():
                ax.errorbar(
                    line["x"],
                    y,
                    yerr=yerr,
                    color=palette[int(lead)],
                    marker="o",
                    markersize=3,
                    linewidth=1.2,
                    capsize=2,
                )
        ax.axhline(1.0, color="k", linewidth=0.8)
        first = part.iloc[0]
        ax.set_title(
            f"{path} path: {first['shape']}, {first['precision']}, {first['routing']}, "
            f"T={first['tokens_per_rank']}",
            fontsize=9,
        )
        ax.set_xlabel(f"{megamoe.share_word(path)} f (0: local control)")
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel(f"expert-wave / interleaved\n{metric.name}")
    legend = [
        Line2D([], [], color=palette[lead], marker="o", label=f"lead {lead} rows")
        for lead in numeric
    ]
    legend.append(
        Line2D(
            [],
            [],
            color="k",
            linestyle="--",
            marker="*",
            markersize=9,
            label="auto (the model's lead;\nlabels: rows it chose)",
        )
    )
    noisy = int(leads[metric.column("noisy")].sum())
    notes = [
        f"speedup in the {metric.label} ({metric.sample}), medians; bars: 95% bootstrap CI "
        "of the ratio (paired rounds where the run paired the arms).",
        f"{noisy} of {len(leads)} ratios noisy (CI beyond +-3%); "
        f"{int(leads['throttled'].sum())} with a record flagged throttled (tab-megamoe-lead).",
        frames.failure_note(frames.records_frame(doc)),
    ]
    return common.finish_figure(
        fig,
        "MegaMoE lead map: interleaved vs expert-wave speedup\nby share f and Linear-1 lead, "
        + megamoe.paths_text(leads["path"]),
        labels.doc_label(dataset_dir, doc),
        notes,
        legend,
    )
