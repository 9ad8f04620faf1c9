"""fig-ulysses: attention time vs sequence length, alone / serial / fused, per backend.

Solid lines are the sender-visible time (the attention kernel returns), dashed lines the
completion time (every rank can read its result); markers tell the head counts apart. The
dotted black line is the completion-coupled counterfactual: attention alone plus the remote
share of the output drained at the fitted R, what an issuer that waited for its stores
would take. The top row is the time itself; the bottom row divides by attention alone, so
an overhead that stays flat or grows with S is visible at a glance.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter

from xstage_bench import layout
from xstage_bench.analysis import attention, fitted, frames, labels, load
from xstage_bench.figures import common

MODES = {"alone": "tab:green", "serial": "tab:red", "fused": "tab:blue"}
CLOCKS = (("sender_us", "-"), ("completion_us", "--"))
MARKERS = "os^Dv"


def remote_bytes(rows: pd.DataFrame) -> pd.Series:
    """Bytes one rank sends in the post-attention All-to-All: its (B, S, H/P, D) output,
    of which the (P-1)/P share owned by other ranks leaves the GPU (P emulated or real)."""
    P = rows["ranks"] if "ranks" in rows.columns else rows["world_size"]
    local_output = rows["batch"] * rows["seq_len"] * rows["heads"] / P * rows["head_dim"]
    return local_output * labels.ELEMENT_BYTES * (P - 1) / P


def _draw(ax: Axes, x: pd.Series, y: pd.Series, yerr, **style) -> None:
    ax.errorbar(x, y, yerr=yerr, markersize=3, capsize=2, **style)


def _why_empty(time_ax: Axes, ratio_ax: Axes, backend: str, rows: pd.DataFrame) -> None:
    """An empty column for a backend without an ok point: its statuses and first error."""
    parts = []
    for status, group in rows.groupby("status"):
        errors = group["error"].dropna()
        error = str(errors.iloc[0]).splitlines()[0][:120] if len(errors) else ""
        parts.append(f"{len(group)} {status}" + (f": {error}" if error else ""))
    text = textwrap.fill(f"{backend}: no ok point. " + "; ".join(parts), 34)
    time_ax.text(
        0.5,
        0.5,
        text,
        ha="center",
        va="center",
        fontsize=common.LEGEND_FONT,
        transform=time_ax.transAxes,
        wrap=True,
    )
    time_ax.set_title(f"{backend}: not measured", fontsize=common.PANEL_TITLE_FONT)
    for ax in (time_ax, ratio_ax):
        ax.set_xticks([])
        ax.set_yticks([])
    ratio_ax.set_axis_off()


def plot(dataset_dir: Path) -> Figure:
    doc = load.raw_doc(dataset_dir, layout.ATTENTION_RAW)
    df = attention.with_ranks(frames.records_frame(doc))
    ok = frames.ok_rows(df, dataset_dir, layout.ATTENTION_RAW, ("sender_us",))
    model = load.optional_model_doc(dataset_dir)
    R = fitted.drain_rate(model) if model else None

    # One column per backend, and per emulated world size where the sweep has one.
    panels = [(b, None) for b in sorted(ok["backend"].unique())]
    if "ranks" in ok.columns:
        panels = sorted(ok[["backend", "ranks"]].drop_duplicates().itertuples(index=False))
    backends = [b for b, _ in panels]
    # Backends that were tried but have no ok point get a column that says why.
    absent = sorted(set(df["backend"].dropna()) - set(backends))
    heads = sorted(int(h) for h in ok["heads"].unique())
    markers = dict(zip(heads, MARKERS, strict=False))
    fig, axes = common.new_figure(2, len(panels) + len(absent), width=4.2, height=3.2, sharex="col")
    for col, backend in enumerate(absent, start=len(panels)):
        _why_empty(axes[0, col], axes[1, col], backend, df[df["backend"] == backend])
    for col, (backend, ranks) in enumerate(panels):
        panel = ok[ok["backend"] == backend]
        if ranks is not None:
            panel = panel[panel["ranks"] == ranks]
        time_ax, ratio_ax = axes[0, col], axes[1, col]
        for H in heads:
            facet = panel[panel["heads"] == H]
            alone = facet[facet["mode"] == "alone"].set_index("seq_len").sort_index()
            for mode, color in MODES.items():
                rows = facet[facet["mode"] == mode].sort_values("seq_len")
                for metric, linestyle in CLOCKS:
                    column = f"{metric}_median"
                    if rows.empty or column not in rows or rows[column].isna().all():
                        continue
                    style = dict(color=color, linestyle=linestyle, marker=markers.get(H, "o"))
                    _draw(
                        time_ax,
                        rows["seq_len"],
                        rows[column],
                        common.error_bars(rows, metric),
                        **style,
                    )
                    base = alone["sender_us_median"].reindex(rows["seq_len"]).to_numpy()
                    _draw(ratio_ax, rows["seq_len"], rows[column] / base, None, **style)
            if R is not None and not alone.empty:
                coupled = (
                    alone["sender_us_median"] + remote_bytes(alone.reset_index()).to_numpy() / R
                )
                time_ax.plot(alone.index, coupled, color="k", linestyle=":", linewidth=1.2)
                ratio_ax.plot(
                    alone.index,
                    coupled / alone["sender_us_median"],
                    color="k",
                    linestyle=":",
                    linewidth=1.2,
                )
        world = ", ".join(f"P={int(p)}" for p in sorted(panel["world_size"].unique()))
        if ranks is not None and panel["emulated"].any():
            world = f"P={int(ranks)} emulated on 2 GPUs"
        time_ax.set_title(f"{backend} ({world})", fontsize=common.PANEL_TITLE_FONT)
        time_ax.set_yscale("log")
        common.plain_log_ticks(time_ax.yaxis)
        ratio_ax.axhline(1.0, color="0.5", linewidth=0.8)
        for ax in (time_ax, ratio_ax):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(sorted(ok["seq_len"].unique())))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda s, _: f"{s / 1024:g}K"))
        ratio_ax.set_xlabel("sequence length S (tokens)")
        for label in ratio_ax.get_xticklabels():  # 48K and 64K sit close on a log axis
            label.set(rotation=45, ha="right", rotation_mode="anchor")
    axes[0, 0].set_ylabel("time (us)")
    axes[1, 0].set_ylabel("time / attention alone (sender)")

    handles = [Line2D([], [], color=c, label=m) for m, c in MODES.items()]
    handles += [
        Line2D([], [], color="0.3", linestyle="none", marker=markers[H], label=f"{H} heads")
        for H in heads
    ]
    handles += [
        Line2D([], [], color="0.3", linestyle="-", label="sender-visible"),
        Line2D([], [], color="0.3", linestyle="--", label="completion"),
    ]
    if R is not None:
        handles.append(
            Line2D(
                [],
                [],
                color="k",
                linestyle=":",
                label="completion-coupled model:\nalone + remote bytes / R",
            )
        )
    notes = [frames.failure_note(df)]
    if R is None:
        notes.append(
            f"completion-coupled model omitted: the dataset has no fitted R ({layout.MODEL_JSON})"
        )
    return common.finish_figure(
        fig,
        "Ulysses attention with the All-to-All: alone, serial, fused",
        labels.doc_label(dataset_dir, doc),
        notes,
        legend=handles,
    )
