"""fig-drain: zero-gap bursts over V, one marker per K/B split, the drain rate R, one row
of panels per store path (peer GPU, host memory).

At G=0 the period is V/R once the drain dominates, whatever the split of V over K
producers. The left panel shows each producer's own period (median over producers) with
the path's fitted V/R line; the right one the rate the fit uses: the aggregate issue rate
where the record has it (bytes issued while every producer is steady, which does not depend
on how the producers are aligned), V/period otherwise. Aligned records (a grid barrier
before each burst) are filled, free-running ones hollow. Horizontal references, each
path's own: its fitted R with its CI, its ceilings measured in the same run and its line
rate (NVLink for the peer path, the host link for the host path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xstage_bench.data import storepath
from xstage_bench.report.analysis import fitted, frames, labels, load
from xstage_bench.report.figures import common

STUDY = "drain"
METRIC = "period_us"
RATE = "issue_rate_GBps"
PERIOD_MARK = {"marker": "+", "markersize": 9, "linestyle": "none"}
REF_STYLE = {
    "sm-store": "-.",
    "copy-engine": ":",
    "NVLink": (0, (5, 1, 1, 1, 1, 1)),
    "host link": (0, (5, 1, 1, 1, 1, 1)),
}


def _rate(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(GB/s, whether it is the aggregate issue rate) per row: issue rate, else V/period."""
    by_period = rows["V"] / rows[f"{METRIC}_median"] / fitted.GBPS_TO_BYTES_PER_US
    if f"{RATE}_median" not in rows.columns:
        return by_period.to_numpy(float), np.zeros(len(rows), dtype=bool)
    aggregate = rows[f"{RATE}_median"].notna().to_numpy()
    return np.where(aggregate, rows[f"{RATE}_median"], by_period).astype(float), aggregate


def _ref_style(name: str):
    return next((style for key, style in REF_STYLE.items() if name.startswith(key)), "--")


def plot(dataset_dir: Path) -> Figure:
    doc = load.raw_doc(dataset_dir, f"microbench:{STUDY}")
    model = load.model_doc(dataset_dir)
    df = frames.records_frame(doc)
    ok = frames.ok_rows(df, dataset_dir, f"microbench/{STUDY}.json", (METRIC,))
    ok = ok[ok["gap_us"] == 0]
    paths = frames.remote_paths(ok)
    if not paths:
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': microbench/{STUDY}.json has no ok peer or host "
            "record at G=0"
        )
    if "sync" not in ok.columns:
        ok = ok.assign(sync="free")

    fig, axes = common.new_figure(len(paths), 2, width=5.2, height=3.8)
    Ks = sorted(int(k) for k in ok[ok["path"].isin(paths)]["K"].unique())
    style = _Style(
        markers=dict(zip(Ks, "osD^vP*X", strict=False)),
        palette=dict(zip(Ks, sns.color_palette("deep", len(Ks)), strict=True)),
        syncs=[s for s in ("free", "barrier") if (ok["sync"] == s).any()],
        mixed=bool(_rate(ok[ok["path"].isin(paths)])[1].any()),
    )
    refs, notes, used_period = [], [frames.failure_note(df)], False
    for (period_ax, rate_ax), path in zip(axes, paths, strict=True):
        drawn = _draw_path(
            period_ax, rate_ax, ok[ok["path"] == path], model, path, style, len(paths) > 1
        )
        refs += drawn.refs
        notes += drawn.notes
        used_period |= drawn.used_period
    for ax in axes[-1]:
        ax.set_xlabel("burst size V at G=0")

    handles = [
        Line2D(
            [],
            [],
            color=style.palette[K],
            marker=style.markers.get(K, "o"),
            linestyle="none",
            label=f"K={K}",
        )
        for K in Ks
    ]
    handles += [
        Line2D(
            [],
            [],
            color="0.3",
            marker="o",
            linestyle="none",
            label=labels.SYNC_LABEL[s],
            **common.marker_fill(s, "0.3"),
        )
        for s in style.syncs
    ]
    if used_period:
        handles.append(
            Line2D(
                [], [], color="0.3", label="+: V/period (no aggregate issue rate)", **PERIOD_MARK
            )
        )
        notes.append(
            "+: V/period where a record has no aggregate issue rate (free producers that drift "
            "apart shorten each one's own period, so this rate can exceed the line rate)"
        )
    return common.finish_figure(
        fig,
        "Zero-gap bursts vs burst size: the drain rate R",
        labels.doc_label(dataset_dir, doc),
        notes,
        legend=handles + refs,
    )


@dataclass(frozen=True)
class _Style:
    markers: dict
    palette: dict
    syncs: list[str]
    mixed: bool  # some records carry the aggregate rate: V/period stand-ins are marked apart


@dataclass
class _Drawn:
    refs: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    used_period: bool = False


def _draw_path(period_ax, rate_ax, ok, model: dict, path: str, style: _Style, many: bool):
    """One store path's row: its records and its own references (fit, ceilings, line rate)."""
    drawn = _Drawn()
    far = storepath.far_end(path)
    prefix = f"{path}: " if many else ""
    try:
        fit = fitted.for_path(model, path)
    except load.ModelFileError:
        fit = None
        drawn.notes.append(f"{far}: the model file has no fit for this path, references omitted")
    R = fitted.drain_rate(fit) if fit else None
    R_value, R_low, R_high = fitted.param_ci(fit["params"]["R_GBps"] if fit else None)
    ceilings = fitted.ceilings(fit) if fit else {}
    offsets = dict(zip(style.syncs, (0.97, 1.03) if len(style.syncs) == 2 else (1.0,), strict=True))
    # The rate axis stops a little above the highest reference (the line rate): a rate
    # beyond it is impossible for the path, so it is drawn on the top edge with its value.
    refs_top = max([*ceilings.values(), R_value if R else 0.0])
    top = 1.05 * refs_top if refs_top else np.inf
    off_scale = []
    for K in sorted(int(k) for k in ok["K"].unique()):
        for sync in style.syncs:
            rows = ok[(ok["K"] == K) & (ok["sync"] == sync)].sort_values("V")
            if rows.empty:
                continue
            color = style.palette[K]
            marks = dict(
                color=color,
                marker=style.markers.get(K, "o"),
                linestyle="none",
                markersize=5,
                **common.marker_fill(sync, color),
            )
            # Free and barrier points of one V sit side by side rather than on each other.
            x = rows["V"].to_numpy(float) * offsets[sync]
            period_ax.errorbar(
                x, rows[f"{METRIC}_median"], yerr=common.error_bars(rows, METRIC), **marks
            )
            rate, aggregate = _rate(rows)
            high = rate > top
            off_scale += [(xi, r, color) for xi, r in zip(x[high], rate[high], strict=True)]
            shown = np.minimum(rate, 0.985 * top)  # off-scale rates sit just under the edge
            rate_ax.plot(x, shown, **marks)
            if style.mixed and not aggregate.all():
                drawn.used_period = True
                stand_in = ~aggregate
                rate_ax.plot(x[stand_in], shown[stand_in], color=color, **PERIOD_MARK)
    for xi, r, color in off_scale:
        rate_ax.annotate(
            f"{r:.0f}",
            (xi, 0.985 * top),
            xytext=(0, -10),
            textcoords="offset points",
            ha="center",
            fontsize=common.LEGEND_FONT,
            color=color,
        )

    V = np.geomspace(float(ok["V"].min()) * 0.9, float(ok["V"].max()) * 1.1, 100)
    if R is not None:
        period_ax.plot(V, V / R, color="k", linestyle="--", linewidth=1)
        rate_ax.axhline(R_value, color="k", linestyle="--", linewidth=1)
        label = f"{prefix}fitted R {R_value:.0f} GB/s"
        drawn.refs.append(Line2D([], [], color="k", linestyle="--", label=label))
        if np.isfinite(R_low) and np.isfinite(R_high):
            rate_ax.axhspan(R_low, R_high, color="k", alpha=0.1)
    elif fit is not None:
        drawn.notes.append(f"{far}: fitted R omitted: R was not fitted")
    for name, value in ceilings.items():
        line = _ref_style(name)
        rate_ax.axhline(value, color="0.4", linestyle=line, linewidth=1)
        label = f"{prefix}{name} {value:.0f} GB/s"
        drawn.refs.append(Line2D([], [], color="0.4", linestyle=line, label=label))
    if fit is not None and not ceilings:
        drawn.notes.append(f"{far}: no ceilings in the model file: ceiling references omitted")
    if off_scale:
        rate_ax.set_ylim(top=top)
        drawn.notes.append(
            f"{far}: {len(off_scale)} rate(s) above {top:.0f} GB/s drawn on the top edge, "
            "value beside"
        )
    for ax in (period_ax, rate_ax):
        ax.set_xscale("log", base=2)
        common.byte_ticks(ax.xaxis, ok["V"])
    period_ax.set_yscale("log")
    common.plain_log_ticks(period_ax.yaxis)
    period_ax.set_ylabel("each producer's period (us)\nmedian and 95% CI")
    period_ax.set_title(f"{far}\nperiod vs V (dashed: V/R)", fontsize=common.PANEL_TITLE_FONT)
    rate_ax.set_ylabel("drain rate (GB/s)")
    what = "aggregate issue rate" if style.mixed else "V / period"
    rate_ax.set_title(f"{far}\n{what}", fontsize=common.PANEL_TITLE_FONT)
    return drawn
