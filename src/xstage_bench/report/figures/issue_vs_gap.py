"""fig-issue-vs-gap: sender-visible issue time T_iss over the gap G, per burst size V.

A grid of panels: one row per store path (peer GPU, host memory) and sync mode
(free-running producers from study gap_sweep, aligned ones, a grid barrier before each
burst, from gap_sweep_barrier when the dataset has it), one column per T_iss definition,
because on a real GPU the two differ by up to an order of magnitude once free producers
drift apart (shared/DEVICE.md). The local-memory control (dest=local) is drawn dotted
in every path's rows where the study has it. The model's steady-train issue time,
max(T0, V/R - G) raised to the isolated burst's max(T0, (V - Q)/R), is drawn dashed on
the row each path's model was fitted to (aligned when the dataset has barrier records),
with that path's fitted T0, R and each K's Q. Each row has its own gap axis (symlog where
its gaps reach past 100 us, as the host path's do).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from xstage_bench.data import storepath
from xstage_bench.model.laws import issue_time, train_issue_time
from xstage_bench.report.analysis import fitted, frames, labels, load
from xstage_bench.report.figures import common

STUDIES = (("free", "gap_sweep"), ("barrier", "gap_sweep_barrier"))
# (metric, panel title, what the note says it is)
DEFINITIONS = (
    ("t_iss_slowest_us", "T_iss: slowest producer", "the slowest producer's own store loop"),
    ("t_iss_window_us", "T_iss: whole-burst window", "the first start to the last end"),
)
# Gaps past V/R of the host path reach hundreds of us: such a row's gap axis is linear up
# to 10 us and logarithmic beyond, so the knees of short bursts stay visible.
LINEAR_GAPS_US = 100.0
SYMLOG_LINTHRESH_US = 10.0
SYMLOG_TICKS_US = (0, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
DEST_STYLE = {"remote": ("-", "o"), "local": (":", "x")}  # a path's stores, the local control


def _sync_word(sync: str) -> str:
    """A sync mode in one word, for panel titles ('aligned', 'free-running'); the notes
    say what each means (labels.SYNC_LABEL)."""
    return labels.SYNC_LABEL[sync].split(" (")[0]


def _model_gaps(longest: float) -> np.ndarray:
    """Where the model lines are evaluated: even steps, and log steps for a symlog axis."""
    return np.unique(
        np.concatenate([np.linspace(0.0, longest, 300), np.geomspace(0.1, longest, 300)])
    )


def _model_line(model: dict, K: int, V: float, gaps: np.ndarray) -> np.ndarray | None:
    R, T0 = fitted.drain_rate(model), fitted.t0_us(model, K, V)
    if R is None or T0 is None:
        return None
    Q = fitted.capacity_for_K(model, K)
    if Q is None:
        return issue_time(T0=T0, G=gaps, V=V, R=R)
    return train_issue_time(T0=T0, G=gaps, V=V, R=R, Q=Q)


def plot(dataset_dir: Path) -> Figure:
    metrics = tuple(m for m, *_ in DEFINITIONS)
    studies, docs, notes = [], [], []
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
        studies.append((sync, study, frames.ok_rows(df, dataset_dir, source, metrics)))
        failed = frames.failure_note(df)
        if failed:
            notes.append(f"{study}: {failed}")
    model = load.model_doc(dataset_dir)
    paths = frames.remote_paths(pd.concat([ok for *_, ok in studies])) or [storepath.PEER]
    # One row per (path, sync): the path's records with the local control beside them.
    rows = [
        (path, sync, study, ok[ok["path"].isin((path, storepath.LOCAL))])
        for path in paths
        for sync, study, ok in studies
        if (ok["path"] == path).any()
    ]
    fits = {}
    for path in paths:
        try:
            fits[path] = fitted.for_path(model, path)
        except load.ModelFileError:
            notes.append(f"{storepath.far_end(path)}: no fit in the model file, no model lines")
    # Model lines go on the row the laws were fitted to; if the dataset has no aligned gap
    # sweep (its aligned records came from other studies), on the free-running row.
    line_syncs = {}
    for path, fit in fits.items():
        syncs = [sync for p, sync, *_ in rows if p == path]
        fitted_sync = "barrier" if fitted.fitted_to_aligned(fit) else "free"
        line_syncs[path] = (fitted_sync, fitted_sync if fitted_sync in syncs else syncs[0])

    bursts = sorted(
        {(int(k), int(v)) for *_, ok in rows for k, v in zip(ok["K"], ok["V"], strict=True)}
    )
    colors = dict(zip(bursts, sns.color_palette("viridis", len(bursts)), strict=True))
    # Rows over the same gaps share one gap axis; rows of other gaps (a host path's reach
    # hundreds of us) each get their own.
    same_gaps = len({float(ok["gap_us"].max()) for *_, ok in rows}) == 1
    share = True if same_gaps else "row"
    fig, axes = common.new_figure(len(rows), 2, sharey=True, sharex=share, width=5.8, height=3.4)
    unmodelled = False
    for row_axes, (path, sync, study, ok) in zip(axes, rows, strict=True):
        row_bursts = {(int(k), int(v)) for k, v in zip(ok["K"], ok["V"], strict=True)}
        on_line_row = path in line_syncs and sync == line_syncs[path][1]
        gaps = _model_gaps(float(ok["gap_us"].max()))
        for ax, (metric, definition, _) in zip(row_axes, DEFINITIONS, strict=True):
            for (K, V), color in colors.items():
                if (K, V) not in row_bursts:
                    continue
                for dest, (linestyle, marker) in (
                    (path, DEST_STYLE["remote"]),
                    (storepath.LOCAL, DEST_STYLE["local"]),
                ):
                    sel = ok[(ok["K"] == K) & (ok["V"] == V) & (ok["path"] == dest)]
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
                if not on_line_row:
                    continue
                line = _model_line(fits[path], K, V, gaps)
                if line is None:
                    unmodelled = True
                else:
                    ax.plot(gaps, line, color=color, linestyle="--", linewidth=1)
            ax.set_yscale("log")
            common.plain_log_ticks(ax.yaxis)
            if gaps[-1] > LINEAR_GAPS_US:
                ax.set_xscale("symlog", linthresh=SYMLOG_LINTHRESH_US, linscale=0.5)
                ticks = [t for t in SYMLOG_TICKS_US if t <= gaps[-1]]
                ax.xaxis.set_major_locator(FixedLocator(ticks))
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.xaxis.set_minor_locator(NullLocator())
            ax.set_title(
                f"{storepath.far_end(path)}, {_sync_word(sync)} ({study})\n{definition}",
                fontsize=common.PANEL_TITLE_FONT,
            )
        row_axes[0].set_ylabel("issue time T_iss (us)\nmedian and 95% CI")
    for ax in axes[-1] if same_gaps else axes.flat:
        ax.set_xlabel("gap G (us)")

    far = " / ".join(storepath.far_end(p) for p in paths)
    handles = [
        Line2D([], [], color=c, marker="o", label=f"K={K}, V={labels.fmt_bytes(V)}")
        for (K, V), c in colors.items()
    ]
    handles += [
        Line2D([], [], color="0.3", linestyle="-", marker="o", label=f"{far} (remote stores)"),
        Line2D([], [], color="0.3", linestyle=":", marker="x", label="local control"),
        Line2D([], [], color="0.3", linestyle="--", label="model max(T0, V/R - G, (V - Q)/R)"),
    ]
    notes.append(
        f"aligned: {labels.SYNC_LABEL['barrier'].split(' (')[1].rstrip(')')}; T_iss: "
        + ", or ".join(f"{title.split(': ')[1]}, {what}" for _, title, what in DEFINITIONS)
    )
    for path, (fitted_sync, line_sync) in line_syncs.items():
        fitted_to = "aligned bursts" if fitted_sync == "barrier" else "free-running records"
        whose = f"{storepath.far_end(path)}: " if len(paths) > 1 else ""
        notes.append(
            f"{whose}model lines (T0, R, each K's Q from model/burst_gap.json, fitted to "
            f"{fitted_to}) on the {_sync_word(line_sync)} row only"
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
