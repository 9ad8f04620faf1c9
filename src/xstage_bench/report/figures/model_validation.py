"""fig-model-validation: predicted vs measured, held-out points highlighted.

The left panel puts every validated point against the y = x line; the other two show the
relative residual per study and sync mode, one panel per metric (the issue time each
record names: the store loop t_iss_slowest, or for aligned periodic records the
sender-visible time, measured or derived from the period; and for periodic records the
period), so a systematic miss (one study,
one regime) is visible rather than averaged away. Colours tell apart the records the
laws were fitted to, the held-out ones, and those validated apart and never fitted:
free-running producers and drain probes. One row of panels per store path the model
fits (peer GPU, host memory), each with that path's validation; a path whose fit has no
T0 (so no law to validate) or no validated record gets one panel saying "no data" and the
fit's reason. Under the figure one line per path counts its checks, and tab-model-checks
gives each with its detail.
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
from xstage_bench.report.analysis import fitted, labels, load
from xstage_bench.report.figures import common
from xstage_bench.report.tables import model_checks

TARGET = 0.05  # the held-out median |error| the fit aims at (model.checks)
CATEGORIES = {  # category -> (colour, marker size)
    "fitted": ("0.65", 10),
    "held out": ("tab:red", 22),
    "never fitted: free-running": ("tab:blue", 12),
    "never fitted: aligned, other kernel": ("tab:orange", 16),
}
RATIO_TICKS = (0.01, 0.1, 0.2, 0.5, 0.8, 1.0, 1.25, 2, 5, 10, 100)
METRIC_MARKER = {
    "t_iss_slowest_us": "o",
    "t_vis_slowest_us": "^",
    "t_vis_derived_us": "v",
    "period_us": "s",
}
METRIC_NAME = {
    "t_iss_slowest_us": "store loop",
    "t_vis_slowest_us": "sender-visible issue time",
    "t_vis_derived_us": "issue time from the period",
    "period_us": "period",
}


def _category(row: pd.Series) -> str:
    if row.get("in_fit_set", True):
        return "held out" if row["held_out"] else "fitted"
    return "never fitted: " + (
        "aligned, other kernel" if row.get("aligned", False) else "free-running"
    )


def _errors_text(summary: dict | None) -> str:
    if not summary or not summary.get("n"):
        return "none"
    return (
        f"median |err| {summary['median_abs_rel_error']:.1%}, "
        f"p90 {summary['p90_abs_rel_error']:.1%} (n={summary['n']})"
    )


def _scatter(ax, val: pd.DataFrame, far: str) -> None:
    for category, (color, size) in CATEGORIES.items():
        for metric, marker in METRIC_MARKER.items():
            rows = val[(val["category"] == category) & (val["metric"] == metric)]
            if rows.empty:
                continue
            hollow = category.startswith("never fitted")
            ax.scatter(
                rows["measured_us"],
                rows["predicted_us"],
                s=size,
                marker=marker,
                facecolors="none" if hollow else color,
                edgecolors=color if hollow else ("k" if category == "held out" else "none"),
                linewidths=0.7,
            )
    values = val[["measured_us", "predicted_us"]].to_numpy(float)
    bounds = np.array([values.min(), values.max()])
    ax.plot(bounds, bounds, color="k", linewidth=1)
    ax.fill_between(bounds, bounds * 0.9, bounds * 1.1, color="k", alpha=0.08)
    ax.set_xscale("log")
    ax.set_yscale("log")
    common.plain_log_ticks(ax.xaxis)
    common.plain_log_ticks(ax.yaxis)
    ax.set_xlabel("measured (us)")
    ax.set_ylabel("predicted (us)")
    ax.set_title(f"{far}\npredicted vs measured", fontsize=common.PANEL_TITLE_FONT)


def _residuals(ax, val: pd.DataFrame, metric: str, far: str) -> None:
    rows = val[val["metric"] == metric]
    if rows.empty:
        ax.set_axis_off()
        ax.set_title(
            f"{far}: {METRIC_NAME.get(metric, metric)}: no validated record",
            fontsize=common.PANEL_TITLE_FONT,
        )
        return
    order = sorted(rows["group"].unique(), key=lambda g: (g.split(", ")[-1], g))
    present = [c for c in CATEGORIES if (rows["category"] == c).any()]
    sns.stripplot(
        data=rows,
        x="group",
        y="ratio",
        hue="category",
        hue_order=present,
        order=order,
        palette={c: CATEGORIES[c][0] for c in present},
        marker=METRIC_MARKER.get(metric, "o"),
        dodge=True,
        size=3,
        ax=ax,
        legend=False,
    )
    ax.axhline(1.0, color="k", linewidth=1)
    ax.axhspan(1 - TARGET, 1 + TARGET, color="tab:green", alpha=0.2)
    # The error as the ratio predicted / measured on a log axis: a miss by 2x up or down is
    # the same distance from 1, and the ticks read as plain factors.
    ax.set_yscale("log")
    low, high = rows["ratio"].min(), rows["ratio"].max()
    ax.set_ylim(min(low / 1.15, 0.8), max(high * 1.15, 1.25))
    bottom, top = ax.get_ylim()
    near_one = top / bottom < 20  # close ticks around 1 only where they have room
    ticks = [t for t in RATIO_TICKS if bottom <= t <= top and (near_one or t not in (0.8, 1.25))]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("")
    ax.set_ylabel("predicted / measured")
    ax.tick_params(axis="x", labelsize=9)
    for label in ax.get_xticklabels():
        label.set(rotation=40, ha="right", rotation_mode="anchor")
    ax.set_title(
        f"{far}\n{METRIC_NAME.get(metric, metric)}",
        fontsize=common.PANEL_TITLE_FONT,
    )


def _validation(model: dict) -> pd.DataFrame:
    """One path's validated rows with their category, group and predicted/measured ratio."""
    val = pd.DataFrame(model["validation"])
    if val.empty:
        return val
    val = val[val["measured_us"].notna() & val["predicted_us"].notna()].copy()
    if "metric" not in val.columns:
        val["metric"] = "t_iss_slowest_us"
    val["category"] = val.apply(_category, axis=1)
    sync = val["sync"] if "sync" in val.columns else pd.Series("", index=val.index)
    val["sync_mode"] = sync.fillna("")
    val["group"] = val["study"] + ", " + val["sync_mode"]
    val["ratio"] = val["predicted_us"] / val["measured_us"]
    return val[val["ratio"] > 0]


def _path_notes(model: dict, prefix: str) -> list[str]:
    """One line per path: the held-out error and the checks' count; every error per metric
    and variant, and each check with its detail, are tab-model-checks' rows."""
    held_out = _errors_text(model["validation_summary"])
    return [
        f"{prefix}held out ({_law(model)}): {held_out}; checks: {model_checks.counts(model)} "
        "(each in tab-model-checks)"
    ]


def _law(model: dict) -> str:
    law = fitted.capacity_law(model)
    return f"capacity law {law['chosen']}" if law else "shared Q"


def _no_data_reason(model: dict, val: pd.DataFrame) -> str | None:
    """Why a path's fit has nothing to draw (its T0's reason first), or None."""
    if fitted.param(model, "t0_fixed_us") is None:
        return (model["params"].get("t0_fixed_us") or {}).get("reason", "T0 was not fitted")
    if val.empty:
        return model["validation_summary"].get("reason", "no validated record")
    return None


def plot(dataset_dir: Path) -> Figure:
    model = load.model_doc(dataset_dir)
    paths = fitted.paths(model)
    fits = {path: fitted.for_path(model, path) for path in paths}
    vals = {path: _validation(fit) for path, fit in fits.items()}
    why = {path: _no_data_reason(fits[path], vals[path]) for path in paths}
    drawn = [path for path in paths if why[path] is None]
    metrics = [m for m in METRIC_MARKER if any((vals[p]["metric"] == m).any() for p in drawn)]

    fig, axes = common.new_figure(len(paths), 1 + len(metrics), width=5.0, height=5.4)
    for row_axes, path in zip(axes, paths, strict=True):
        far = storepath.far_end(path)
        if why[path] is not None:  # one panel says why; the row's others stay empty
            title = f"{far}: predicted vs measured"
            common.no_data_panel(row_axes[0], title, why[path], 40)
            for ax in row_axes[1:]:
                ax.set_axis_off()
            continue
        _scatter(row_axes[0], vals[path], far)
        for ax, metric in zip(row_axes[1:], metrics, strict=True):
            _residuals(ax, vals[path], metric, far)

    present = {category for p in drawn for category in vals[p]["category"]}
    handles = [
        Line2D([], [], color=color, marker="o", linestyle="none", label=category)
        for category, (color, _) in CATEGORIES.items()
        if category in present
    ]
    handles += [
        Line2D([], [], color="0.3", marker=marker, linestyle="none", label=METRIC_NAME[m])
        for m, marker in METRIC_MARKER.items()
        if m in metrics
    ]
    # The bands are explained once here: a panel title has room for two short lines only.
    notes = [
        "grey band: within 10% of measured; green band: the held-out target, "
        f"within {TARGET:.0%}; a dot is one validated record"
    ]
    for path in paths:
        prefix = f"{storepath.far_end(path)}: " if len(paths) > 1 else ""
        notes += _path_notes(fits[path], prefix)
    return common.finish_figure(
        fig,
        "Burst-Gap model: predicted vs measured",
        labels.model_label(dataset_dir, model),
        notes,
        legend=handles,
    )
