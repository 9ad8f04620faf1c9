"""tab-burst-gap-params: the fitted T0, R and Q with 95% CIs, per store path, per K and
pooled, beside the paper's B200 values (a peer path: NVLink5).

One row per (path, K), a pooled row and a capacity-law row per path, each path fitted on
its own records (a dataset of one path has that path's rows only); `path` names it,
`far_end` says where its stores land. Per-K rows give each K's own fit (R the slope of its
zero-gap periods, Q its own knee); the pooled row's Q is the capacity law's at the largest
K fitted; the law row gives the law Q(K) = min(S + K q, C) itself: S (MiB) in the Q
columns, q (KiB) in the per-producer column, a ceiling C in its source.

T0 is quoted at B = 32 KiB per producer, the burst the paper quotes it for: per K as the
fitter reports it, pooled from t0_fixed + B / issue_rate. The pooled T0's interval combines
the ends of the t0_fixed and issue-rate intervals (a conservative bound, not a bootstrap
interval).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from xstage_bench.data import storepath
from xstage_bench.report import paper
from xstage_bench.report.analysis import fitted, labels, load
from xstage_bench.report.tables.common import Table

POOLED_PARAMS = ("R_GBps", "Q_bytes", "t0_fixed_us", "issue_rate_per_sm_GBps")


def _with_ci(name: str, values: tuple[float, float, float], scale: float = 1.0) -> dict:
    """{'R_GBps': v, 'R_GBps_ci_low': lo, 'R_GBps_ci_high': hi}, each divided by scale."""
    value, low, high = (v / scale for v in values)
    return {name: value, f"{name}_ci_low": low, f"{name}_ci_high": high}


def _pooled_t0(params: dict) -> tuple[float, float, float]:
    B = paper.B200_T0_B_BYTES
    fixed = fitted.param_ci(params["t0_fixed_us"])
    rate = np.array(fitted.param_ci(params["issue_rate_per_sm_GBps"]))
    rate = rate * fitted.GBPS_TO_BYTES_PER_US
    # The slowest issue rate gives the largest T0, so the rate's CI ends swap.
    return fixed[0] + B / rate[0], fixed[1] + B / rate[2], fixed[2] + B / rate[1]


def _row(path: str, scope: str, K: float, T0, R, Q, source: str) -> dict:
    return {
        "path": path,
        "far_end": storepath.far_end(path),
        "scope": scope,
        "K": K,
        **_with_ci("T0_us", T0),
        **_with_ci("R_GBps", R),
        **_with_ci("Q_MiB", Q, labels.MIB),
        "Q_per_producer_KiB": Q[0] / K / labels.KIB if np.isfinite(K) else np.nan,
        "source": source,
    }


def _law_row(fit: dict, path: str) -> dict | None:
    """The capacity law's row: S with its CI in the Q columns, q in the per-producer one,
    the ceiling C (where the law has one) in its source."""
    law = fitted.capacity_law(fit)
    S, q = fit["params"].get("S_bytes"), fit["params"].get("q_bytes")
    if not law or not S or S.get("value") is None:
        return None
    q_value, q_low, q_high = fitted.param_ci(q)
    C_value, C_low, C_high = fitted.param_ci(fit["params"].get("C_bytes"))
    capped = np.isfinite(C_value)  # a ceiling the law has and the records reach
    ceiling = (
        f"; C {C_value / labels.MIB:.3g} MiB (95% CI {C_low / labels.MIB:.3g}-"
        f"{C_high / labels.MIB:.3g} MiB)"
        if capped
        else ""
    )
    row = _row(
        path,
        f"law: {'min(S + K q, C)' if capped else 'S + K q'} ({law['chosen']})",
        np.nan,
        (np.nan,) * 3,
        (np.nan,) * 3,
        fitted.param_ci(S),
        f"capacity law chosen by held-out error; Q_MiB is S, Q_per_producer_KiB is q "
        f"(95% CI {q_low / labels.KIB:.3g}-{q_high / labels.KIB:.3g} KiB){ceiling}",
    )
    row["Q_per_producer_KiB"] = q_value / labels.KIB
    return row


def _path_rows(fit: dict, path: str) -> list[dict]:
    """Per-K rows and the pooled row of one path's fit."""
    params = fit["params"]
    reference_B = fit.get("T0_reference_B_bytes")
    at_B = f"T0 at B={labels.fmt_bytes(reference_B)}" if reference_B else "T0 as fitted"
    rows = [
        _row(
            path,
            f"K={entry['K']}",
            int(entry["K"]),
            fitted.param_ci(entry.get("T0_us")),
            fitted.param_ci(entry.get("R_GBps")),
            fitted.param_ci(entry.get("Q_bytes")),
            f"fit, this K ({at_B})",
        )
        for entry in sorted(fit["per_K"], key=lambda e: e["K"])
    ]
    pooled = _row(
        path,
        "pooled",
        np.nan,
        _pooled_t0(params),
        fitted.param_ci(params["R_GBps"]),
        fitted.param_ci(params["Q_bytes"]),
        f"fit, all K (T0 at B={labels.fmt_bytes(paper.B200_T0_B_BYTES)})",
    )
    pooled["t0_fixed_us"] = fitted.param(fit, "t0_fixed_us")
    pooled["issue_rate_per_sm_GBps"] = fitted.param(fit, "issue_rate_per_sm_GBps")
    K_ref = (fitted.capacity_law(fit) or {}).get("K_ref")
    if K_ref:
        pooled["source"] += f"; Q at K={K_ref} from the capacity law"
    T0_law = fit.get("T0_law") or {}
    if T0_law.get("law") == "per_wave":
        pooled["source"] += (
            f"; T0 law per_wave: t0_fixed paid ceil(K / {T0_law['sm_count']}) times, once "
            "per producer an SM runs (T0 quoted at K up to the SM count)"
        )
    law = _law_row(fit, path)
    return [*rows, pooled, *([law] if law else [])]


def build(dataset_dir: Path) -> Table:
    model = load.model_doc(dataset_dir)
    rows = []
    notes = [
        "T0 in us, R in GB/s (1e9 bytes/s), Q in MiB; CIs are 95%.",
        "The paper's values are from a secondary summary and belong to other hardware; "
        f"its Q per producer is about {paper.B200_Q_PER_PRODUCER_BYTES / labels.KIB:g} KiB.",
    ]
    for path in fitted.paths(model):
        fit = fitted.for_path(model, path)
        rows += _path_rows(fit, path)
        for name in POOLED_PARAMS:
            if fitted.param(fit, name) is None:
                reason = fit["params"][name].get("reason", "no reason given")
                prefix = f"{path} path: "  # newer fits name the path in the reason
                reason = reason.removeprefix(prefix)
                notes.append(f"{prefix}{name} not determined by the fit: {reason}")
    rows.append(
        _row(
            storepath.PEER,
            "paper B200",
            paper.B200_T0_K,
            (paper.B200_T0_US, np.nan, np.nan),
            (paper.B200_R_GBPS, np.nan, np.nan),
            (paper.B200_Q_BYTES, np.nan, np.nan),
            f"paper (summary): {paper.B200}; T0 at B=32 KB",
        )
    )
    frame = pd.DataFrame(rows)
    frame["K"] = frame["K"].astype("Int64")  # the pooled row has no K
    frame = frame[[c for c in frame.columns if c != "source"] + ["source"]]
    return Table(frame, "Burst-Gap parameters", labels.model_label(dataset_dir, model), notes)
