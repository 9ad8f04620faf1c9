"""fig-isolated: issue time of one burst after a long idle, over V, one panel per K.

Below the capacity a burst issues in T0; above it the excess must drain first, so the
model is max(T0, (V - Q)/R). Both capacity fits are drawn in every panel: one Q shared
by the path (the paper's model, dashed) and a per-producer window, Q = K * q (dash-dot),
each with its own fitted T0 and R, and a vertical tick at the capacity it puts for this
K. The panel title gives the Q fitted to this K alone. The local-memory control
(dest=local) is drawn dotted.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xstage_bench.analysis import fitted, frames, labels, load
from xstage_bench.figures import common
from xstage_bench.model.laws import isolated_issue_time

STUDY = "isolated"
METRIC = "t_iss_slowest_us"
FITS = (("shared Q", "--"), ("per-producer q", "-."))
NOTE_CHARS = 190


def _fits(model: dict, K: int) -> list[tuple[str, str, float, dict]]:
    """(name, linestyle, capacity for this K, model) of each Q fit the model file has."""
    out = []
    shared = fitted.param(model, "Q_bytes")
    if shared is not None:
        out.append((*FITS[0], shared, model))
    window = fitted.window_model(model)
    if window is not None:
        out.append((*FITS[1], K * fitted.param(window, "q_bytes"), window))
    return out


def _per_K_title(model: dict, K: int) -> str:
    entry = next((e for e in model.get("per_K", []) if e.get("K") == K), None)
    Q = ((entry or {}).get("Q_bytes") or {}).get("value")
    if Q is None:
        return f"K={K}"
    return (
        f"K={K}: Q fitted to this K\n{labels.fmt_bytes(Q)} ({Q / K / labels.KIB:.1f} KiB/producer)"
    )


def plot(dataset_dir: Path) -> Figure:
    doc = load.raw_doc(dataset_dir, f"microbench:{STUDY}")
    model = load.model_doc(dataset_dir)
    df = frames.records_frame(doc)
    ok = frames.ok_rows(df, dataset_dir, f"microbench/{STUDY}.json", (METRIC,))
    Ks = sorted(int(k) for k in ok["K"].unique())
    palette = dict(zip(("peer", "local"), sns.color_palette("deep", 2), strict=True))
    fit_colors = dict(zip((f[0] for f in FITS), ("k", "tab:red"), strict=True))
    V = np.geomspace(float(ok["V"].min()), float(ok["V"].max()), 400)

    fig, axes = common.new_figure(1, len(Ks), width=4.2, height=4.0, sharey=True)
    drawn, unmodelled = set(), []
    for ax, K in zip(axes[0], Ks, strict=True):
        for dest, linestyle, marker in (("peer", "-", "o"), ("local", ":", "x")):
            rows = ok[(ok["K"] == K) & (ok["dest"] == dest)].sort_values("V")
            if rows.empty:
                continue
            ax.errorbar(
                rows["V"],
                rows[f"{METRIC}_median"],
                yerr=common.error_bars(rows, METRIC),
                color=palette[dest],
                linestyle=linestyle,
                marker=marker,
                markersize=3,
                capsize=2,
            )
        modelled = []
        for name, linestyle, Q, fit in _fits(model, K):
            R, T0 = fitted.drain_rate(fit), fitted.t0_us(fit, K, V)
            if R is None or T0 is None:
                continue
            color = fit_colors[name]
            ax.plot(V, isolated_issue_time(T0=T0, V=V, Q=Q, R=R), color=color, ls=linestyle, lw=1)
            ax.axvline(Q, color=color, linestyle=linestyle, linewidth=0.6, alpha=0.6)
            drawn.add(name)
            modelled.append(name)
        if not modelled:
            unmodelled.append(K)
        ax.set_xscale("log")
        ax.set_yscale("log")
        common.byte_ticks(ax.xaxis, ok["V"])
        common.plain_log_ticks(ax.yaxis)
        ax.tick_params(axis="x", labelsize=9)
        for label in ax.get_xticklabels():
            label.set(rotation=55, ha="right", rotation_mode="anchor")
        ax.set_xlabel("burst size V")
        ax.set_title(_per_K_title(model, K), fontsize=common.PANEL_TITLE_FONT)
    axes[0, 0].set_ylabel("T_iss (us): slowest producer's\nown store loop")

    handles = [
        Line2D([], [], color=palette["peer"], linestyle="-", marker="o", label="peer (remote)"),
        Line2D([], [], color=palette["local"], linestyle=":", marker="x", label="local control"),
    ]
    for name, linestyle in FITS:
        if name in drawn:
            what = "Q" if name == "shared Q" else "K*q"
            label = f"model, {name}: max(T0, (V-{what})/R)\n(vertical: {what} for this K)"
            handles.append(Line2D([], [], color=fit_colors[name], linestyle=linestyle, label=label))
    notes = [frames.failure_note(df), *_fit_notes(model)]
    if unmodelled:
        notes.append(f"model lines omitted for K={unmodelled}: R, Q or T0 was not fitted")
    return common.finish_figure(
        fig,
        "Isolated-burst issue time vs burst size: the capacity Q",
        labels.doc_label(dataset_dir, doc),
        notes,
        legend=handles,
    )


def _fit_notes(model: dict) -> list[str]:
    parts = []
    Q = fitted.param(model, "Q_bytes")
    if Q is not None:
        parts.append(f"shared Q = {labels.fmt_bytes(Q)}")
    window = fitted.window_model(model)
    if window is not None:
        parts.append(f"per-producer q = {fitted.param(window, 'q_bytes') / labels.KIB:.1f} KiB")
    check = model["checks"].get("per_producer_Q_fits_better")
    if check and check["passed"] is not None:
        parts.append(check["detail"])
    return textwrap.wrap("; ".join(parts), NOTE_CHARS)
