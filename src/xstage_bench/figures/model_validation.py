"""fig-model-validation: predicted vs measured issue times, held-out points highlighted.

The left panel puts every validated point against the y = x line; the right one shows the
relative residual per study, so a systematic miss (one study, one regime) is visible rather
than averaged away. Model checks that did not pass are listed under the figure.
"""

from __future__ import annotations

from pathlib import Path
from textwrap import shorten

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from xstage_bench import layout
from xstage_bench.figures import common

NOTE_CHARS = 160  # check details can list every V; the figure shows the start


def _errors_text(rel_error: pd.Series) -> str:
    errors = rel_error.abs()
    return f"median |err| {errors.median():.1%}, p90 {errors.quantile(0.9):.1%}"


def _check_notes(checks: dict) -> list[str]:
    """Checks that failed, then those the data could not answer (passed is None)."""
    failed = [f"{n}: {c['detail']}" for n, c in checks.items() if c["passed"] is False]
    unknown = [f"{n}: {c['detail']}" for n, c in checks.items() if c["passed"] is None]
    notes = [shorten("model check FAILED - " + f, NOTE_CHARS) for f in failed]
    notes += [shorten("model check not evaluated - " + u, NOTE_CHARS) for u in unknown]
    passed = [n for n, c in checks.items() if c["passed"] is True]
    if passed:
        notes.append("model checks passed: " + ", ".join(passed))
    return notes


def plot(dataset_dir: Path) -> Figure:
    model = common.model_doc(dataset_dir)
    summary = model["validation_summary"]
    val = pd.DataFrame(model["validation"])
    if val.empty:
        reason = summary.get("reason", "no reason given")
        raise common.NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MODEL_JSON} has no validation points ({reason})"
        )
    val = val[val["measured_us"].notna() & val["predicted_us"].notna()]
    held = val[val["held_out"].astype(bool)]
    fitted = val[~val["held_out"].astype(bool)]

    fig, axes = common.new_figure(1, 2)
    scatter_ax, residual_ax = axes[0]
    scatter_ax.scatter(
        fitted["measured_us"],
        fitted["predicted_us"],
        s=10,
        color="0.6",
        label=f"fitted points (n={len(fitted)}): {_errors_text(fitted['rel_error'])}"
        if len(fitted)
        else "fitted points (none)",
    )
    scatter_ax.scatter(
        held["measured_us"],
        held["predicted_us"],
        s=22,
        marker="D",
        color="tab:red",
        edgecolor="k",
        linewidth=0.5,
        label=f"held out (n={len(held)}): {_errors_text(held['rel_error'])}"
        if len(held)
        else "held out (none)",
    )
    values = val[["measured_us", "predicted_us"]].to_numpy(float)
    bounds = np.array([values.min(), values.max()])
    scatter_ax.plot(bounds, bounds, color="k", linewidth=1, label="y = x")
    scatter_ax.fill_between(
        bounds, bounds * 0.9, bounds * 1.1, color="k", alpha=0.08, label="+-10%"
    )
    scatter_ax.set_xscale("log")
    scatter_ax.set_yscale("log")
    common.plain_log_ticks(scatter_ax.xaxis)
    common.plain_log_ticks(scatter_ax.yaxis)
    scatter_ax.set_xlabel("measured issue time (us)")
    scatter_ax.set_ylabel("predicted issue time (us)")
    scatter_ax.legend(fontsize=6, loc="upper left")

    sns.stripplot(
        data=val,
        x="study",
        y="rel_error",
        hue="held_out",
        ax=residual_ax,
        size=3,
        palette={False: "0.6", True: "tab:red"},
        dodge=True,
    )
    residual_ax.axhline(0, color="k", linewidth=1)
    residual_ax.set_ylabel("relative error")
    residual_ax.set_title("relative error = (predicted - measured) / measured", fontsize=8)
    residual_ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    residual_ax.legend(title="held out", fontsize=6, title_fontsize=6)

    notes = []
    if summary.get("median_abs_rel_error") is not None:
        notes.append(
            f"validation_summary of the fit: median |err| {summary['median_abs_rel_error']:.1%}, "
            f"p90 {summary['p90_abs_rel_error']:.1%} (n={summary['n']})"
        )
    metrics = sorted(set(val["metric"])) if "metric" in val.columns else []
    if metrics:
        notes.append("metric(s): " + ", ".join(metrics))
    notes += _check_notes(model["checks"])
    return common.finish_figure(
        fig,
        "Burst-Gap model: predicted vs measured",
        common.model_label(dataset_dir, model),
        notes,
    )
