"""fig-issue-vs-gap: sender-visible issue time T_iss over the gap G, per burst size V.

Two panels, one per T_iss definition, because on a real GPU they differ by up to an order
of magnitude once producers drift apart (shared/DEVICE.md). The local-memory control
(dest=local) is drawn dotted; the model's issue_time law with the fitted T0 and R is drawn
dashed for the peer path only (the local path's R is not fitted).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xstage_bench.figures import common
from xstage_bench.model.laws import issue_time

STUDY = "gap_sweep"
DEFINITIONS = (
    ("t_iss_slowest_us", "T_iss = slowest producer's own store loop"),
    ("t_iss_window_us", "T_iss = whole-burst window (first start to last end)"),
)
DEST_STYLE = {"peer": ("-", "o"), "local": (":", "x")}


def plot(dataset_dir: Path) -> Figure:
    doc = common.raw_doc(dataset_dir, f"microbench:{STUDY}")
    model = common.model_doc(dataset_dir)
    df = common.records_frame(doc)
    ok = common.ok_rows(
        df, dataset_dir, f"microbench/{STUDY}.json", tuple(m for m, _ in DEFINITIONS)
    )
    R = common.drain_rate(model)
    bursts = sorted({(int(k), int(v)) for k, v in zip(ok["K"], ok["V"], strict=True)})
    colors = dict(zip(bursts, sns.color_palette("viridis", len(bursts)), strict=True))
    gaps = np.linspace(0.0, float(ok["gap_us"].max()), 300)

    fig, axes = common.new_figure(1, 2, sharey=True)
    for ax, (metric, definition) in zip(axes[0], DEFINITIONS, strict=True):
        for (K, V), color in colors.items():
            for dest, (linestyle, marker) in DEST_STYLE.items():
                rows = ok[(ok["K"] == K) & (ok["V"] == V) & (ok["dest"] == dest)]
                rows = rows.sort_values("gap_us")
                if rows.empty:
                    continue
                ax.errorbar(
                    rows["gap_us"],
                    rows[f"{metric}_median"],
                    yerr=common.error_bars(rows, metric),
                    color=color,
                    linestyle=linestyle,
                    marker=marker,
                    markersize=3,
                    capsize=2,
                )
            T0 = common.t0_us(model, K, V)
            if R is not None and T0 is not None:
                ax.plot(
                    gaps,
                    issue_time(T0=T0, G=gaps, V=V, R=R),
                    color=color,
                    linestyle="--",
                    linewidth=1,
                )
        ax.set_yscale("log")
        common.plain_log_ticks(ax.yaxis)
        ax.set_xlabel("gap G (us)")
        ax.set_title(definition, fontsize=8)
    axes[0, 0].set_ylabel("issue time T_iss (us), median and 95% CI")

    handles = [
        Line2D([], [], color=c, marker="o", label=f"K={K}, V={common.fmt_bytes(V)}")
        for (K, V), c in colors.items()
    ]
    handles += [
        Line2D([], [], color="0.3", linestyle="-", marker="o", label="peer (remote stores)"),
        Line2D([], [], color="0.3", linestyle=":", marker="x", label="local control"),
        Line2D([], [], color="0.3", linestyle="--", label="model max(T0, V/R - G)"),
    ]
    model_note = None if R is not None else "model lines omitted: R was not fitted"
    return common.finish_figure(
        fig,
        "Issue time vs gap",
        common.doc_label(dataset_dir, doc),
        [common.failure_note(df), model_note],
        legend=handles,
    )
