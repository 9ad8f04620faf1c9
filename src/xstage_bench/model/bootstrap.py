"""Confidence intervals of the fitted parameters: a seeded bootstrap over records and
over each record's samples, and the parameter blocks of the model file built from it.

This module exists so that the resampling (which refits every replicate through the
stages) and the shape of a parameter in the file (value, 95% interval, or the reason it is
missing) sit in one place, apart from the fit's assembly in fit.py.
"""

from __future__ import annotations

import numpy as np

from xstage_bench.model.capacity import CAPPED
from xstage_bench.model.records import ROLES, FitData, Recs
from xstage_bench.model.stages import Params, fit_chain, fit_per_K

N_BOOTSTRAP = 200

POOLED_KEYS = ("R", "S", "q", "C", "Q_ref", "t0_fixed", "issue_rate", "lag", "lag_rate")
PER_K_KEYS = ("R", "c", "Q", "T0")


def _boot_medians(recs: Recs, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, records): the median of a resample of each record's own samples."""
    out = np.empty((n, len(recs)))
    for j, s in enumerate(recs.samples):
        out[:, j] = np.median(rng.choice(s, size=(n, s.size)), axis=1)
    return out


def _pooled(p: Params, K_ref: float | None) -> dict[str, float | None]:
    cap = p.capacity
    return {
        "R": p.R,
        "S": None if cap is None else cap.S,
        "q": None if cap is None else cap.q,
        "C": None if cap is None else cap.C,  # inf: no ceiling
        "Q_ref": None if cap is None or K_ref is None else float(cap.at(K_ref)),
        "t0_fixed": p.t0_fixed,
        "issue_rate": p.issue_rate,
        "lag": None if cap is None else p.lag.fraction,  # fitted with the capacity
        "lag_rate": None if cap is None else p.lag.rate,
    }


def bootstrap(
    data: FitData,
    fits: dict[str, Params],
    chosen: str,
    Ks: list[float],
    K_ref: float | None,
    n: int,
    seed: int,
) -> dict:
    """Replicates of the chosen variant's pooled parameters ('<law>:<name>') and per-K
    ones ('<name>@<K>'), NaN where a replicate has none.

    Only the chosen variant is refitted: the others' CIs were shown nowhere, and their
    refits took most of a fit's time. A replicate's chain still starts its T0 stage from
    every variant's full-data fit, and the fits draw nothing from rng, so the chosen
    variant's replicates are what they were when every variant was refitted."""
    rng = np.random.default_rng(seed)
    medians = {role: _boot_medians(getattr(data, role), n, rng) for role in ROLES}
    keys = [f"{chosen}:{k}" for k in POOLED_KEYS]
    keys += [f"{q}@{K:g}" for K in Ks for q in PER_K_KEYS]
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
        start = fits[chosen]
        others = tuple(f for law, f in fits.items() if law != chosen)
        p = fit_chain(d, start=start, rounds=2, t0_starts=others) if start.R is not None else start
        for k, v in _pooled(p, K_ref).items():
            put(f"{chosen}:{k}", b, v)
        for K in Ks:
            k = fit_per_K(d, p, K)
            for q, v in (("R", k.R), ("c", k.c), ("Q", k.Q), ("T0", k.T0_ref)):
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
        # a ceiling some replicates lack is inf there: a bound among them is open (None);
        # interpolating between two infs gives nan, which is that, not an error
        with np.errstate(invalid="ignore"):
            bounds = np.nanpercentile(reps, [2.5, 97.5])
        lo, hi = (float(v) * scale if np.isfinite(v) else None for v in bounds)
    return {"value": value * scale, "ci_low": lo, "ci_high": hi}


FIXED_AT_ZERO = "fixed at 0 by the {law} law"
NO_CEILING = "no ceiling in the {law} law"
CEILING_NOT_REACHED = (
    "not measured: the fitted ceiling binds at no K fitted (S + K q stays below it up to "
    "the largest K), so the law is S + K q there"
)


def _ceiling_block(p: Params, reps: dict, why: str | None) -> dict:
    """C_bytes: the capped law's ceiling with its CI, or null with the reason there is
    none (another law, or a ceiling no K fitted reaches)."""
    cap = p.capacity
    if cap is None:
        return param_block(None, None, reason=why)
    if cap.capped:
        return param_block(cap.C, reps.get(f"{p.law}:C"))
    reason = CEILING_NOT_REACHED if p.law == CAPPED else NO_CEILING.format(law=p.law)
    return param_block(None, None, reason=reason)


def params_block(p: Params, reps: dict, K_ref: float | None) -> dict:
    """One variant's parameter blocks: R, S, q, C, Q at K_ref (min(S + K_ref q, C)),
    t0_fixed, issue rate, and the drain's lag beyond the knee (laws.stall_time: its
    fraction of Q/R and the rate, a fraction of R, until then). A number the variant's
    law holds at 0 is 0 with a reason saying so; a ceiling it lacks is null with its
    reason (_ceiling_block)."""
    why = p.reasons
    values = _pooled(p, K_ref)

    def block(name: str, scale: float, reason: str | None) -> dict:
        return param_block(values[name], reps.get(f"{p.law}:{name}"), scale, reason)

    out = {
        "R_GBps": block("R", 1e-3, why.get("R")),
        "Q_bytes": block("Q_ref", 1.0, why.get("Q")),
        "S_bytes": block("S", 1.0, why.get("Q")),
        "q_bytes": block("q", 1.0, why.get("Q")),
        "C_bytes": _ceiling_block(p, reps, why.get("Q")),
        "t0_fixed_us": block("t0_fixed", 1.0, why.get("T0")),
        "issue_rate_per_sm_GBps": block("issue_rate", 1e-3, why.get("T0")),
        "drain_lag_fraction": block("lag", 1.0, why.get("Q")),
        "drain_lag_rate_ratio": block("lag_rate", 1.0, why.get("Q")),
    }
    if K_ref is None and p.capacity is not None:
        out["Q_bytes"] = param_block(None, None, reason="no isolated bursts: no K to quote Q at")
    fixed = {"shared": "q_bytes", "window": "S_bytes"}.get(p.law)
    if fixed and p.capacity is not None:
        out[fixed] = {
            "value": 0.0,
            "ci_low": 0.0,
            "ci_high": 0.0,
            "reason": FIXED_AT_ZERO.format(law=p.law),
        }
    return out
