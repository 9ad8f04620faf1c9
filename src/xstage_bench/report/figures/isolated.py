"""fig-isolated: issue time of one burst after a long idle, over V, one panel per K and
one row of panels per store path (peer GPU, host memory).

Below the capacity a burst issues in T0; above it the excess must drain first, so the
model is max(T0, (V - Q(K))/R) with the capacity law Q(K) = min(S + K q, C). Every
variant of the law the row's path fitted is drawn in every panel: one capacity shared by
the path (the paper's model, q = 0, dashed), a window per producer (S = 0, dash-dot), both
(solid) and both up to a ceiling C (dash-dot-dot), each with its own fitted T0 and R and a
vertical tick at the capacity it puts for this K;
the legend marks the variant the fit chose by held-out error. The panel title gives the
path and the Q fitted to this K alone. The local-memory control (dest=local) is drawn
dotted in every row.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xstage_bench.data import storepath
from xstage_bench.model.capacity import LAWS
from xstage_bench.model.laws import isolated_issue_time
from xstage_bench.report.analysis import fitted, frames, labels, load
from xstage_bench.report.figures import common

STUDY = "isolated"
METRIC = "t_iss_slowest_us"
DASH_DOT_DOT = (0, (6, 2, 1, 2, 1, 2))  # apart from the local control's dotted line
FITS = tuple(zip(LAWS, ("--", "-.", "-", DASH_DOT_DOT), strict=True))  # (variant, line style)
LAW_TEXT = {
    "shared": "S",
    "window": "K q",
    "shared_plus_window": "S + K q",
    "capped": "min(S + K q, C)",
}
NOTE_CHARS = 190


def _fits(model: dict, K: int) -> list[tuple[str, str, float, dict]]:
    """(variant, linestyle, capacity for this K, model) of each capacity variant the
    model file has."""
    out = []
    for law, linestyle in FITS:
        variant = fitted.variant_model(model, law)
        if variant is not None:
            out.append((law, linestyle, fitted.law_capacity(variant, K), variant))
    return out


def _per_K_title(model: dict, K: int, path: str) -> str:
    entry = next((e for e in model.get("per_K", []) if e.get("K") == K), None)
    Q = ((entry or {}).get("Q_bytes") or {}).get("value")
    head = f"{storepath.far_end(path)}, K={K}"
    if Q is None:
        return head
    return f"{head}\nQ {labels.fmt_bytes(Q)}, {Q / K / labels.KIB:.1f} KiB/producer"


def plot(dataset_dir: Path) -> Figure:
    doc = load.raw_doc(dataset_dir, f"microbench:{STUDY}")
    model = load.model_doc(dataset_dir)
    df = frames.records_frame(doc)
    ok = frames.ok_rows(df, dataset_dir, f"microbench/{STUDY}.json", (METRIC,))
    paths = frames.remote_paths(ok) or [storepath.PEER]
    Ks = sorted(int(k) for k in ok["K"].unique())
    palette = dict(zip(("remote", "local"), sns.color_palette("deep", 2), strict=True))
    colors = ("k", "tab:red", "tab:green", "tab:purple")
    fit_colors = dict(zip((f[0] for f in FITS), colors, strict=True))
    chosen = None
    V = np.geomspace(float(ok["V"].min()), float(ok["V"].max()), 400)

    fig, axes = common.new_figure(len(paths), len(Ks), width=4.2, height=4.0, sharey=True)
    drawn, unmodelled, notes = set(), [], [frames.failure_note(df)]
    for row_axes, path in zip(axes, paths, strict=True):
        fit = _path_fit(model, path, notes)
        chosen = chosen or (fitted.capacity_law(fit or {}) or {}).get("chosen")
        for ax, K in zip(row_axes, Ks, strict=True):
            for dest, linestyle, marker in ((path, "-", "o"), ("local", ":", "x")):
                rows = ok[(ok["K"] == K) & (ok["path"] == dest)].sort_values("V")
                if rows.empty:
                    continue
                ax.errorbar(
                    rows["V"],
                    rows[f"{METRIC}_median"],
                    yerr=common.error_bars(rows, METRIC),
                    color=palette["local" if dest == "local" else "remote"],
                    linestyle=linestyle,
                    marker=marker,
                    markersize=3,
                    capsize=2,
                )
            modelled = []
            for name, linestyle, Q, fit_of in _fits(fit, K) if fit else []:
                R, T0 = fitted.drain_rate(fit_of), fitted.t0_us(fit_of, K, V)
                if R is None or T0 is None:
                    continue
                color = fit_colors[name]
                line = isolated_issue_time(T0=T0, V=V, Q=Q, R=R)
                ax.plot(V, line, color=color, ls=linestyle, lw=1)
                ax.axvline(Q, color=color, linestyle=linestyle, linewidth=0.6, alpha=0.6)
                drawn.add(name)
                modelled.append(name)
            if fit and not modelled:
                unmodelled.append(f"{path} K={K}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            common.byte_ticks(ax.xaxis, ok["V"])
            common.plain_log_ticks(ax.yaxis)
            ax.tick_params(axis="x", labelsize=9)
            for label in ax.get_xticklabels():
                label.set(rotation=55, ha="right", rotation_mode="anchor")
            ax.set_title(_per_K_title(fit or {}, K, path), fontsize=common.PANEL_TITLE_FONT)
        row_axes[0].set_ylabel("T_iss (us): slowest producer's\nown store loop")
        if fit:
            notes += _fit_notes(fit, path if len(paths) > 1 else None)
    for ax in axes[-1]:
        ax.set_xlabel("burst size V")

    far = " / ".join(storepath.far_end(p) for p in paths)
    handles = [
        Line2D([], [], color=palette["remote"], linestyle="-", marker="o", label=f"{far} (remote)"),
        Line2D([], [], color=palette["local"], linestyle=":", marker="x", label="local control"),
    ]
    for name, linestyle in FITS:
        if name in drawn:
            what = LAW_TEXT[name]
            mark = " (chosen)" if name == chosen else ""
            label = f"model, {name}{mark}: Q = {what}\n(vertical: Q for this K)"
            handles.append(Line2D([], [], color=fit_colors[name], linestyle=linestyle, label=label))
    notes.append("panel titles: the Q fitted to that K alone, and per producer (Q / K)")
    if unmodelled:
        notes.append(f"model lines omitted for {', '.join(unmodelled)}: R, Q or T0 was not fitted")
    return common.finish_figure(
        fig,
        "Isolated-burst issue time vs burst size: the capacity Q",
        labels.doc_label(dataset_dir, doc),
        notes,
        legend=handles,
    )


def _path_fit(model: dict, path: str, notes: list) -> dict | None:
    try:
        return fitted.for_path(model, path)
    except load.ModelFileError:
        notes.append(f"{storepath.far_end(path)}: no fit in the model file, model lines omitted")
        return None


def _fit_notes(model: dict, path: str | None) -> list[str]:
    parts = []
    law = fitted.capacity_law(model)
    S, q = fitted.param(model, "S_bytes"), fitted.param(model, "q_bytes")
    if law and S is not None and q is not None:
        errors = ", ".join(
            f"{name} {v['median_abs_rel_error']:.1%} / {v['p90_abs_rel_error']:.0%}"
            for name, v in law["heldout"].items()
            if v["n"]
        )
        C = fitted.param(model, "C_bytes")
        ceiling = "" if C is None else f", C = {labels.fmt_bytes(C)}"
        parts.append(
            f"capacity law Q(K) = min(S + K q, C), chosen {law['chosen']}: S = "
            f"{labels.fmt_bytes(S)}, q = {q / labels.KIB:.1f} KiB{ceiling} (isolated bursts' "
            f"held-out median / p90 |error|: {errors})"
        )
    check = model["checks"].get("capacity_law_explains_isolated")
    if check and check["passed"] is not None:
        parts.append(check["detail"])
    if not parts:
        return []
    head = f"{storepath.far_end(path)}: " if path else ""
    return textwrap.wrap(head + "; ".join(parts), NOTE_CHARS)
