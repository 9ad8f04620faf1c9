"""The fitted Burst-Gap model's parameters as numbers: values with CIs, T0 and R in the
units the laws use, per-K capacities, the per-producer-window variant, the peer ceilings."""

from __future__ import annotations

import numpy as np

from xstage_bench.model.laws import BYTES_PER_US_PER_GBPS as GBPS_TO_BYTES_PER_US


def param(model: dict, name: str) -> float | None:
    """A fitted parameter's value, or None where the fitter could not determine it."""
    entry = model["params"].get(name) or {}
    value = entry.get("value")
    return None if value is None else float(value)


def param_ci(entry: dict | None) -> tuple[float, float, float]:
    """(value, ci_low, ci_high) of a parameter entry, NaN where absent."""
    entry = entry or {}
    return tuple(  # type: ignore[return-value]
        np.nan if entry.get(k) is None else float(entry[k]) for k in ("value", "ci_low", "ci_high")
    )


def drain_rate(model: dict) -> float | None:
    """R in bytes/us."""
    r = param(model, "R_GBps")
    return None if r is None else r * GBPS_TO_BYTES_PER_US


def t0_us(model: dict, K: float, V: float | np.ndarray) -> float | np.ndarray | None:
    """Backpressure-free issue time for K producers and V bytes: t0_fixed + (V/K)/issue_rate."""
    fixed = param(model, "t0_fixed_us")
    rate = param(model, "issue_rate_per_sm_GBps")
    if fixed is None or rate is None:
        return None
    return fixed + (np.asarray(V, dtype=float) / K) / (rate * GBPS_TO_BYTES_PER_US)


def capacity_for_K(model: dict, K: int) -> float | None:
    """Q fitted for this K when the fitter gave one, else the pooled Q."""
    for entry in model.get("per_K", []):
        if entry.get("K") == K:
            q = (entry.get("Q_bytes") or {}).get("value")
            if q is not None:
                return float(q)
    return param(model, "Q_bytes")


WINDOW_VARIANT = "per_producer_Q"


def window_model(model: dict) -> dict | None:
    """The per-producer-window fit (Q = K*q) as a model with its own params, when fitted."""
    variant = (model.get("variants") or {}).get(WINDOW_VARIANT)
    if not variant or (variant["params"].get("q_bytes") or {}).get("value") is None:
        return None
    return {"params": variant["params"]}


def fitted_to_aligned(model: dict) -> bool:
    """Were the periodic laws fitted to aligned (barrier) records rather than free ones?"""
    return (model.get("fit_set") or {}).get("periodic") == "aligned"


def peer_ceilings(model: dict) -> dict[str, float]:
    """Horizontal references for rates (GB/s): the run's peer ceilings and the line rate."""
    ceilings = model.get("ceilings") or {}
    refs = {
        f"{method.replace('_', '-')} peer ceiling": float(v)
        for method, v in (ceilings.get("peer_GBps") or {}).items()
    }
    if ceilings.get("nvlink_line_rate_GBps"):
        refs["NVLink line rate (spec)"] = float(ceilings["nvlink_line_rate_GBps"])
    return refs
