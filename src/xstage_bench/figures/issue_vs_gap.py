"""fig-issue-vs-gap: sender-visible issue time T_iss over the gap G, per burst size V.

A grid of panels: one row per sync mode (free-running producers from study gap_sweep,
aligned ones, a grid barrier before each burst, from gap_sweep_barrier when the dataset
has it), one column per T_iss definition, because on a real GPU the two differ by up to
an order of magnitude once free producers drift apart (shared/DEVICE.md). The
local-memory control (dest=local) is drawn dotted where the study has it. The model's
steady-train issue time, max(T0, V/R - G) raised to the isolated burst's
max(T0, (V - Q)/R), is drawn dashed on the row the model was fitted to (aligned when
the dataset has barrier records), with the fitted T0, R and each K's Q.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xstage_bench.analysis import fitted, frames, labels, load
from xstage_bench.figures import common
from xstage_bench.model.laws import issue_time, train_issue_time

STUDIES = (("free", "gap_sweep"), ("barrier", "gap_sweep_barrier"))
DEFINITIONS = (
    ("t_iss_slowest_us", "T_iss = slowest producer's own store loop"),
    ("t_iss_window_us", "T_iss = whole-burst window (first start to last end)"),
)
DEST_STYLE = {"peer": ("-", "o"), "local": (":", "x")}


def _model_line(model: dict, K: int, V: float, gaps: np.ndarray) -> np.ndarray | None:
    R, T0 = fitted.drain_rate(model), fitted.t0_us(model, K, V)
    if R is None or T0 is None:
        return None
    Q = fitted.capacity_for_K(model, K)
    if Q is None:
        return issue_time(T0=T0, G=gaps, V=V, R=R)
    return train_issue_time(T0=T0, G=gaps, V=V, R=R, Q=Q)


def plot(dataset_dir: Path) -> Figure:
    metrics = tuple(m for m, _ in DEFINITIONS)
    rows, docs, notes = [], [], []
    for sync, study in STUDIES:
        source = f"microbench/{study}.json"
        doc = (load.raw_doc if sync == "free" else load.optional_raw_doc)(
            dataset_dir, f"microbench:{study}"
        )
        if doc is None:
            notes.append(f"no study {study} in this dataset: the aligned (barrier) row is omitted")
            continue
        docs.append(doc)
        df = frames.records_frame(doc)
        rows.append((sync, study, frames.ok_rows(df, dataset_dir, source, metrics)))
        failed = frames.failure_note(df)
        if failed:
            notes.append(f"{study}: {failed}")
    model = load.model_doc(dataset_dir)
    # Model lines go on the row the laws were fitted to; if the dataset has no aligned gap
    # sweep (its aligned records came from other studies), on the free-running row.
    syncs = [sync for sync, *_ in rows]
    fitted_sync = "barrier" if fitted.fitted_to_aligned(model) else "free"
    line_sync = fitted_sync if fitted_sync in syncs else syncs[0]

    bursts = sorted(
        {(int(k), int(v)) for *_, ok in rows for k, v in zip(ok["K"], ok["V"], strict=True)}
    )
    colors = dict(zip(bursts, sns.color_palette("viridis", len(bursts)), strict=True))
    gaps = np.linspace(0.0, max(float(ok["gap_us"].max()) for *_, ok in rows), 300)
    fig, axes = common.new_figure(len(rows), 2, sharey=True, sharex=True, width=5.8, height=3.4)
    unmodelled = False
    for row_axes, (sync, study, ok) in zip(axes, rows, strict=True):
        row_bursts = {(int(k), int(v)) for k, v in zip(ok["K"], ok["V"], strict=True)}
        for ax, (metric, definition) in zip(row_axes, DEFINITIONS, strict=True):
            for (K, V), color in colors.items():
                if (K, V) not in row_bursts:
                    continue
                for dest, (linestyle, marker) in DEST_STYLE.items():
                    sel = ok[(ok["K"] == K) & (ok["V"] == V) & (ok["dest"] == dest)]
                    if sel.empty:
                        continue
                    sel = sel.sort_values("gap_us")
                    ax.errorbar(
                        sel["gap_us"],
                        sel[f"{metric}_median"],
                        yerr=common.error_bars(sel, metric),
                        color=color,
                        linestyle=linestyle,
                        marker=marker,
                        markersize=3,
                        capsize=2,
                    )
                if sync != line_sync:
                    continue
                line = _model_line(model, K, V, gaps)
                if line is None:
                    unmodelled = True
                else:
                    ax.plot(gaps, line, color=color, linestyle="--", linewidth=1)
            ax.set_yscale("log")
            common.plain_log_ticks(ax.yaxis)
            ax.set_title(
                f"{labels.SYNC_LABEL[sync]}\n{study}: {definition}",
                fontsize=common.PANEL_TITLE_FONT,
            )
        row_axes[0].set_ylabel("issue time T_iss (us)\nmedian and 95% CI")
    for ax in axes[-1]:
        ax.set_xlabel("gap G (us)")

    handles = [
        Line2D([], [], color=c, marker="o", label=f"K={K}, V={labels.fmt_bytes(V)}")
        for (K, V), c in colors.items()
    ]
    handles += [
        Line2D([], [], color="0.3", linestyle="-", marker="o", label="peer (remote stores)"),
        Line2D([], [], color="0.3", linestyle=":", marker="x", label="local control"),
        Line2D([], [], color="0.3", linestyle="--", label="model max(T0, V/R - G, (V - Q)/R)"),
    ]
    fitted_to = "aligned bursts" if fitted_sync == "barrier" else "free-running records"
    notes.append(
        f"model lines (T0, R, each K's Q from model/burst_gap.json, fitted to {fitted_to}) "
        f"on the {labels.SYNC_LABEL[line_sync].split(' (')[0]} row only"
    )
    if unmodelled:
        notes.append("some model lines omitted: R or T0 was not fitted")
    return common.finish_figure(
        fig,
        "Issue time vs gap",
        labels.doc_label(dataset_dir, docs[0]),
        notes,
        legend=handles,
    )
