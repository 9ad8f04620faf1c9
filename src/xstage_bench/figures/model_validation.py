"""fig-model-validation: predicted vs measured, held-out points highlighted.

The left panel puts every validated point against the y = x line; the other two show the
relative residual per study and sync mode, one panel per metric (the issue time
t_iss_slowest and, for periodic records, the period), so a systematic miss (one study,
one regime) is visible rather than averaged away. Colours tell apart the records the
laws were fitted to, the held-out ones, and those validated apart and never fitted:
free-running producers and drain probes. Model checks are listed under the figure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from xstage_bench import layout
from xstage_bench.analysis import fitted, labels, load
from xstage_bench.figures import common

TARGET = 0.05  # the held-out median |error| the fit aims at (model.checks)
CATEGORIES = {  # category -> (colour, marker size)
    "fitted": ("0.65", 10),
    "held out": ("tab:red", 22),
    "never fitted: free-running": ("tab:blue", 12),
    "never fitted: aligned, other kernel": ("tab:orange", 16),
}
RATIO_TICKS = (0.01, 0.1, 0.2, 0.5, 0.8, 1.0, 1.25, 2, 5, 10, 100)
METRIC_MARKER = {"t_iss_slowest_us": "o", "period_us": "s"}
METRIC_NAME = {"t_iss_slowest_us": "issue time t_iss_slowest", "period_us": "period"}


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


def _check_notes(checks: dict) -> list[str]:
    """Checks that failed, then those the data could not answer, then those that passed."""
    failed = [f"{n}: {c['detail']}" for n, c in checks.items() if c["passed"] is False]
    unknown = [f"{n}: {c['detail']}" for n, c in checks.items() if c["passed"] is None]
    notes = ["model check FAILED - " + f for f in failed]
    notes += ["model check not evaluated - " + u for u in unknown]
    passed = [n for n, c in checks.items() if c["passed"] is True]
    if passed:
        notes.append("model checks passed: " + ", ".join(passed))
    return notes


def _scatter(ax, val: pd.DataFrame) -> None:
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
    ax.set_title("predicted vs measured\n(band: +-10%)", fontsize=common.PANEL_TITLE_FONT)


def _residuals(ax, val: pd.DataFrame, metric: str) -> None:
    rows = val[val["metric"] == metric]
    if rows.empty:
        ax.set_axis_off()
        ax.set_title(
            f"{METRIC_NAME.get(metric, metric)}: no validated record",
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
        f"{METRIC_NAME.get(metric, metric)}: error per study and sync\n"
        f"(green: within {TARGET:.0%})",
        fontsize=common.PANEL_TITLE_FONT,
    )


def plot(dataset_dir: Path) -> Figure:
    model = load.model_doc(dataset_dir)
    summary = model["validation_summary"]
    val = pd.DataFrame(model["validation"])
    if val.empty:
        reason = summary.get("reason", "no reason given")
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MODEL_JSON} has no validation points ({reason})"
        )
    val = val[val["measured_us"].notna() & val["predicted_us"].notna()].copy()
    if "metric" not in val.columns:
        val["metric"] = "t_iss_slowest_us"
    val["category"] = val.apply(_category, axis=1)
    sync = val["sync"] if "sync" in val.columns else pd.Series("", index=val.index)
    val["sync_mode"] = sync.fillna("")
    val["group"] = val["study"] + ", " + val["sync_mode"]
    val["ratio"] = val["predicted_us"] / val["measured_us"]
    val = val[val["ratio"] > 0]
    metrics = [m for m in METRIC_MARKER if (val["metric"] == m).any()]

    fig, axes = common.new_figure(1, 1 + len(metrics), width=5.0, height=5.4)
    _scatter(axes[0, 0], val)
    for ax, metric in zip(axes[0, 1:], metrics, strict=True):
        _residuals(ax, val, metric)

    handles = [
        Line2D([], [], color=color, marker="o", linestyle="none", label=category)
        for category, (color, _) in CATEGORIES.items()
        if (val["category"] == category).any()
    ]
    handles += [
        Line2D([], [], color="0.3", marker=marker, linestyle="none", label=METRIC_NAME[m])
        for m, marker in METRIC_MARKER.items()
        if m in metrics
    ]
    notes = [f"fit set, held out (shared Q): {_errors_text(summary)}"]
    by_metric = model.get("validation_by_metric") or {}
    if by_metric:
        notes[0] += "; " + "; ".join(f"{m}: {_errors_text(s)}" for m, s in by_metric.items())
    window = (model.get("variants") or {}).get(fitted.WINDOW_VARIANT)
    if window:
        notes.append(
            f"per-producer window variant, held out: {_errors_text(window['validation_summary'])}"
        )
    free = model.get("validation_summary_free")
    if free and free.get("n"):
        notes.append(f"free-running records (never fitted): {_errors_text(free)}")
    notes += _check_notes(model["checks"])
    return common.finish_figure(
        fig,
        "Burst-Gap model: predicted vs measured",
        labels.model_label(dataset_dir, model),
        notes,
        legend=handles,
    )
