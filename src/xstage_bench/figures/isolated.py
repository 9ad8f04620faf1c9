"""fig-isolated: issue time of one burst after a long idle, over V, per K.

Below the capacity Q a burst issues in T0; above it the excess must drain first, so the
model is max(T0, (V - Q)/R). The fitted Q of each K (or the pooled Q) is marked, with the
knee where the model leaves T0; the local-memory control is drawn dotted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xstage_bench.figures import common
from xstage_bench.model.laws import isolated_issue_time

STUDY = "isolated"
METRIC = "t_iss_slowest_us"


def plot(dataset_dir: Path) -> Figure:
    doc = common.raw_doc(dataset_dir, f"microbench:{STUDY}")
    model = common.model_doc(dataset_dir)
    df = common.records_frame(doc)
    ok = common.ok_rows(df, dataset_dir, f"microbench/{STUDY}.json", (METRIC,))
    R = common.drain_rate(model)

    fig, axes = common.new_figure(1, 1, width=6.5, height=4.2)
    ax = axes[0, 0]
    Ks = sorted(int(k) for k in ok["K"].unique())
    palette = dict(zip(Ks, sns.color_palette("deep", len(Ks)), strict=True))
    V = np.geomspace(float(ok["V"].min()), float(ok["V"].max()), 400)
    unmodelled = []
    for K in Ks:
        for dest, linestyle, marker in (("peer", "-", "o"), ("local", ":", "x")):
            rows = ok[(ok["K"] == K) & (ok["dest"] == dest)].sort_values("V")
            if rows.empty:
                continue
            ax.errorbar(
                rows["V"],
                rows[f"{METRIC}_median"],
                yerr=common.error_bars(rows, METRIC),
                color=palette[K],
                linestyle=linestyle,
                marker=marker,
                markersize=3,
                capsize=2,
            )
        Q = common.capacity_for_K(model, K)
        T0 = common.t0_us(model, K, V)
        if R is None or Q is None or T0 is None:
            unmodelled.append(K)
            continue
        predicted = isolated_issue_time(T0=T0, V=V, Q=Q, R=R)
        ax.plot(V, predicted, color=palette[K], linestyle="--", linewidth=1)
        ax.axvline(Q, color=palette[K], linestyle="-.", linewidth=0.8)
        stalled = np.flatnonzero(predicted > T0 * (1 + 1e-9))
        if stalled.size:
            knee = stalled[0]
            ax.plot(V[knee], predicted[knee], marker="v", color=palette[K], markersize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    common.byte_ticks(ax.xaxis, ok["V"])
    common.plain_log_ticks(ax.yaxis)
    ax.tick_params(axis="x", labelrotation=45, labelsize=6)
    ax.set_xlabel("burst size V")
    ax.set_ylabel("T_iss = slowest producer's own store loop (us)")
    handles = [Line2D([], [], color=palette[K], marker="o", label=f"K={K}") for K in Ks]
    handles += [
        Line2D([], [], color="0.3", linestyle="-", marker="o", label="peer (remote stores)"),
        Line2D([], [], color="0.3", linestyle=":", marker="x", label="local control"),
        Line2D([], [], color="0.3", linestyle="--", label="model max(T0, (V-Q)/R)"),
        Line2D([], [], color="0.3", linestyle="-.", label="fitted Q"),
        Line2D([], [], color="0.3", linestyle="none", marker="v", label="knee"),
    ]
    ax.legend(handles=handles, fontsize=6, loc="upper left")
    notes = [common.failure_note(df)]
    if unmodelled:
        notes.append(f"model lines omitted for K={unmodelled}: R, Q or T0 was not fitted")
    return common.finish_figure(
        fig,
        "Isolated-burst issue time vs burst size: the capacity Q",
        common.doc_label(dataset_dir, doc),
        notes,
    )
