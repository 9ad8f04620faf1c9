"""fig-drain: steady-state period at zero gap over V, one marker per K/B split.

At G=0 the period is V/R once the drain dominates, whatever the split of V over K
producers; the left panel shows the period with the fitted V/R line, the right one the
achieved rate V/period against the fitted R and its CI, so a split that disagrees stands out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure

from xstage_bench.figures import common

STUDY = "drain"
METRIC = "period_us"


def plot(dataset_dir: Path) -> Figure:
    doc = common.raw_doc(dataset_dir, f"microbench:{STUDY}")
    model = common.model_doc(dataset_dir)
    df = common.records_frame(doc)
    ok = common.ok_rows(df, dataset_dir, f"microbench/{STUDY}.json", (METRIC,))
    ok = ok[ok["gap_us"] == 0]
    if "dest" in ok.columns:
        ok = ok[ok["dest"] == "peer"]
    if ok.empty:
        raise common.NoDataError(
            f"dataset '{dataset_dir.name}': microbench/{STUDY}.json has no ok peer record at G=0"
        )
    R = common.drain_rate(model)
    R_value, R_low, R_high = common.param_ci(model["params"]["R_GBps"])

    fig, axes = common.new_figure(1, 2)
    period_ax, rate_ax = axes[0]
    Ks = sorted(ok["K"].unique())
    markers = dict(zip(Ks, "osD^vP*X", strict=False))
    palette = dict(zip(Ks, sns.color_palette("deep", len(Ks)), strict=True))
    for K in Ks:
        rows = ok[ok["K"] == K].sort_values("V")
        mib = rows["V"] / common.MIB
        period_ax.errorbar(
            mib,
            rows[f"{METRIC}_median"],
            yerr=common.error_bars(rows, METRIC),
            color=palette[K],
            marker=markers.get(K, "o"),
            linestyle="none",
            markersize=4,
            capsize=2,
            label=f"K={K} (B=V/{K})",
        )
        rate = rows["V"] / rows[f"{METRIC}_median"] / common.GBPS_TO_BYTES_PER_US
        rate_ax.plot(
            mib,
            rate,
            color=palette[K],
            marker=markers.get(K, "o"),
            linestyle="none",
            markersize=4,
            label=f"K={K}",
        )

    V = np.linspace(0.0, float(ok["V"].max()) * 1.05, 100)
    if R is not None:
        period_ax.plot(
            V / common.MIB,
            V / R,
            color="k",
            linestyle="--",
            linewidth=1,
            label=f"V/R, R = {R_value:.0f} GB/s",
        )
        rate_ax.axhline(
            R_value, color="k", linestyle="--", linewidth=1, label=f"fitted R = {R_value:.0f} GB/s"
        )
        if np.isfinite(R_low) and np.isfinite(R_high):
            rate_ax.axhspan(R_low, R_high, color="k", alpha=0.1, label="R 95% CI")
    period_ax.set_xlabel("burst size V (MiB)")
    period_ax.set_ylabel("period at G=0 (us), median and 95% CI")
    period_ax.legend(fontsize=6)
    rate_ax.set_xlabel("burst size V (MiB)")
    rate_ax.set_ylabel("V / period (GB/s)")
    rate_ax.legend(fontsize=6)
    model_note = None if R is not None else "fitted R line omitted: R was not fitted"
    return common.finish_figure(
        fig,
        "Zero-gap period vs burst size: the drain rate R",
        common.doc_label(dataset_dir, doc),
        [common.failure_note(df), model_note],
    )
