"""Confidence intervals of the fitted parameters: a seeded bootstrap over records and
over each record's samples, and the parameter blocks of the model file built from it.

This module exists so that the resampling (which refits every replicate through the
stages) and the shape of a parameter in the file (value, 95% interval, or the reason it is
missing) sit in one place, apart from the fit's assembly in fit.py.
"""

from __future__ import annotations

import numpy as np

from xstage_bench.model.records import ROLES, FitData, Recs
from xstage_bench.model.stages import Params, fit_chain, fit_per_K

N_BOOTSTRAP = 200

POOLED_KEYS = ("R", "Q", "t0_fixed", "issue_rate")


def _boot_medians(recs: Recs, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, records): the median of a resample of each record's own samples."""
    out = np.empty((n, len(recs)))
    for j, s in enumerate(recs.samples):
        out[:, j] = np.median(rng.choice(s, size=(n, s.size)), axis=1)
    return out


def bootstrap(
    data: FitData, pooled: Params, window: Params, Ks: list[float], n: int, seed: int
) -> dict:
    """Replicates of every pooled, window ('w:'-prefixed) and per-K parameter (NaN where a
    replicate has none)."""
    rng = np.random.default_rng(seed)
    medians = {role: _boot_medians(getattr(data, role), n, rng) for role in ROLES}
    keys = [*POOLED_KEYS, *(f"w:{k}" for k in POOLED_KEYS)]
    keys += [f"{q}@{K:g}" for K in Ks for q in ("R", "Q", "T0")]
    reps = {k: np.full(n, np.nan) for k in keys}

    def put(key: str, b: int, value: float | None) -> None:
        reps[key][b] = np.nan if value is None else value

    for b in range(n):
        picked = {}
        for role in ROLES:
            recs = getattr(data, role)
            idx = rng.integers(0, len(recs), len(recs))
            picked[role] = recs.take(idx, medians[role][b, idx])
        d = FitData(**picked)
        p = fit_chain(d, start=pooled, rounds=2)
        w = fit_chain(d, start=window, rounds=2, window=True) if window.R is not None else None
        for k in POOLED_KEYS:
            put(k, b, getattr(p, k))
            put(f"w:{k}", b, getattr(w, k) if w else None)
        for K in Ks:
            k = fit_per_K(d, p, K)
            for q, v in (("R", k.R), ("Q", k.Q), ("T0", k.T0_ref)):
                put(f"{q}@{K:g}", b, v)
    return reps


def param_block(
    value: float | None, reps: np.ndarray | None, scale: float = 1.0, reason: str | None = None
) -> dict:
    if value is None:
        return {
            "value": None,
            "ci_low": None,
            "ci_high": None,
            "reason": reason or "not determined",
        }
    lo = hi = None
    if reps is not None and np.isfinite(reps).any():
        lo, hi = (float(v) * scale for v in np.nanpercentile(reps, [2.5, 97.5]))
    return {"value": value * scale, "ci_low": lo, "ci_high": hi}


def params_block(p: Params, reps: dict, prefix: str = "") -> dict:
    why = p.reasons
    q_name = "q_bytes" if p.window else "Q_bytes"
    return {
        "R_GBps": param_block(p.R, reps.get(f"{prefix}R"), 1e-3, why.get("R")),
        q_name: param_block(p.Q, reps.get(f"{prefix}Q"), 1.0, why.get("Q")),
        "t0_fixed_us": param_block(p.t0_fixed, reps.get(f"{prefix}t0_fixed"), 1.0, why.get("T0")),
        "issue_rate_per_sm_GBps": param_block(
            p.issue_rate, reps.get(f"{prefix}issue_rate"), 1e-3, why.get("T0")
        ),
    }
