"""fig-ulysses: serial and fused time over attention alone vs sequence length, one panel per
setting (store path, P, emulated or not: a row) and backend (a column).

Each panel divides every mode's time by the attention alone (sender-visible) of the same
shape, so the cost of the All-to-All, serial (red) or fused into the epilogue (blue),
reads directly as the height above 1 (green: alone; solid: sender-visible, dashed:
completion); markers tell the head counts apart. The dotted black line is the
completion-coupled counterfactual where the dataset has a fitted R for the row's path:
attention alone plus the row's outgoing share of the output drained at R, what an issuer
that waited for its stores would take. The absolute times, the speedups and their CIs are
in tab-ulysses. Laid out for reading at page width (the report shows a figure at most
1280 px wide): at most three backends a row, text of 9 pt and up.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter

from xstage_bench.data import layout, storepath
from xstage_bench.report.analysis import attention, fitted, frames, labels, load
from xstage_bench.report.figures import common

MODES = {"alone": "tab:green", "serial": "tab:red", "fused": "tab:blue"}
CLOCKS = (("sender_us", "-"), ("completion_us", "--"))
MARKERS = "os^Dv"
PANEL_WIDTH_IN, PANEL_HEIGHT_IN = 3.5, 2.8
SETTING_KEYS = ["path", "ranks", "emulated"]


def remote_bytes(rows: pd.DataFrame) -> pd.Series:
    """Bytes one rank sends in the post-attention All-to-All: its (B, S, H/P, D) output,
    of which the (P-1)/P share owned by other ranks leaves the GPU (P emulated or real)."""
    P = rows["ranks"] if "ranks" in rows.columns else rows["world_size"]
    local_output = rows["batch"] * rows["seq_len"] * rows["heads"] / P * rows["head_dim"]
    return local_output * labels.ELEMENT_BYTES * (P - 1) / P


def fitted_rate(model: dict | None, path: str) -> float | None:
    """R (bytes/us) for `path`, where the dataset's model has one: the model document
    fits the peer path's microbenchmarks (records without a path), unless it says which
    path it fits."""
    if model is None or model.get("path", storepath.PEER) != path:
        return None
    return fitted.drain_rate(model)


def _why_empty(ax: Axes, title: str, rows: pd.DataFrame) -> None:
    """A panel for a backend without an ok point in this setting: statuses, first error."""
    parts = []
    for status, group in rows.groupby("status"):
        errors = group["error"].dropna()
        error = str(errors.iloc[0]).splitlines()[0][:120] if len(errors) else ""
        parts.append(f"{len(group)} {status}" + (f": {error}" if error else ""))
    text = "no ok point. " + "; ".join(parts) if parts else "not in this sweep"
    ax.text(
        0.5,
        0.5,
        textwrap.fill(text, 34),
        ha="center",
        va="center",
        fontsize=common.NOTE_FONT,
        transform=ax.transAxes,
    )
    ax.set_title(title, fontsize=common.PANEL_TITLE_FONT)
    ax.set_xticks([])
    ax.set_yticks([])


def _panel(ax: Axes, panel: pd.DataFrame, heads: list[int], markers: dict, R) -> None:
    for H in heads:
        facet = panel[panel["heads"] == H]
        alone = facet[facet["mode"] == "alone"].set_index("seq_len").sort_index()
        if alone.empty:
            continue
        base = alone["sender_us_median"]
        for mode, color in MODES.items():
            rows = facet[facet["mode"] == mode].sort_values("seq_len")
            for metric, linestyle in CLOCKS:
                column = f"{metric}_median"
                if rows.empty or column not in rows or rows[column].isna().all():
                    continue
                ratio = rows[column].to_numpy() / base.reindex(rows["seq_len"]).to_numpy()
                ax.plot(
                    rows["seq_len"],
                    ratio,
                    color=color,
                    linestyle=linestyle,
                    marker=markers.get(H, "o"),
                    markersize=4,
                    linewidth=1.4,
                )
        if R is not None:
            coupled = 1.0 + remote_bytes(alone.reset_index()).to_numpy() / R / base.to_numpy()
            ax.plot(alone.index, coupled, color="k", linestyle=":", linewidth=1.2)
    ax.axhline(1.0, color="0.6", linewidth=0.8, zorder=0)


def plot(dataset_dir: Path) -> Figure:
    doc = load.raw_doc(dataset_dir, layout.ATTENTION_RAW)
    df = attention.with_ranks(frames.records_frame(doc))
    ok = frames.ok_rows(df, dataset_dir, layout.ATTENTION_RAW, ("sender_us",))
    model = load.optional_model_doc(dataset_dir)

    settings = sorted(
        df[[*SETTING_KEYS, "world_size"]].drop_duplicates().itertuples(index=False),
        key=lambda s: (list(storepath.PATHS).index(s.path), s.emulated, s.ranks),
    )
    backends = sorted(df["backend"].dropna().unique())
    heads = sorted(int(h) for h in ok["heads"].unique())
    markers = dict(zip(heads, MARKERS, strict=False))
    fig, axes = common.new_figure(
        len(settings),
        len(backends),
        width=PANEL_WIDTH_IN,
        height=PANEL_HEIGHT_IN,
    )
    seq_lens = sorted(ok["seq_len"].unique())
    no_rate = set()
    for row, setting in enumerate(settings):
        name = attention.setting_label(*setting)
        R = fitted_rate(model, setting.path)
        if R is None:
            no_rate.add(setting.path)
        here = df[
            (df["path"] == setting.path)
            & (df["ranks"] == setting.ranks)
            & (df["emulated"] == setting.emulated)
        ]
        for col, backend in enumerate(backends):
            ax = axes[row, col]
            mine = here[here["backend"] == backend]
            panel = mine[mine["status"] == "ok"]
            if panel.empty or (panel["mode"] == "alone").sum() == 0:
                _why_empty(ax, f"{backend}: not measured\n{name}", mine)
                continue
            _panel(ax, panel, heads, markers, R)
            ax.set_title(f"{backend}\n{name}", fontsize=common.PANEL_TITLE_FONT)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(seq_lens))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda s, _: f"{s / 1024:g}K"))
            ax.xaxis.set_minor_locator(FixedLocator([]))
            for label in ax.get_xticklabels():  # 48K and 64K sit close on a log axis
                label.set(rotation=45, ha="right", rotation_mode="anchor")
            if col == 0:
                ax.set_ylabel("time / alone (sender)")
    for ax in axes[-1]:
        if len(ax.get_xticks()):
            ax.set_xlabel("sequence length S")

    handles = [Line2D([], [], color=c, label=m) for m, c in MODES.items()]
    handles += [
        Line2D([], [], color="0.3", linestyle="none", marker=markers[H], label=f"{H} heads")
        for H in heads
    ]
    handles += [
        Line2D([], [], color="0.3", linestyle="-", label="sender-visible"),
        Line2D([], [], color="0.3", linestyle="--", label="completion"),
    ]
    if len(no_rate) < len({s.path for s in settings}):
        handles.append(
            Line2D(
                [],
                [],
                color="k",
                linestyle=":",
                label="completion-coupled:\nalone + sent bytes / R",
            )
        )
    notes = [frames.failure_note(df)]
    for path in sorted(no_rate):
        why = (
            f"the dataset has no fitted R ({layout.MODEL_JSON})"
            if model is None
            else f"the fitted R is not the {path} path's"
        )
        notes.append(f"completion-coupled model omitted on the {path} path: {why}")
    return common.finish_figure(
        fig,
        "Ulysses attention with the All-to-All: serial and fused over attention alone",
        labels.doc_label(dataset_dir, doc),
        notes,
        legend=handles,
    )
