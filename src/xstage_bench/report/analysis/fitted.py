"""The fitted Burst-Gap model's parameters as numbers: values with CIs, T0 and R in the
units the laws use, the capacity law Q(K) = min(S + K q, C) and its variants, the path's
ceilings.

A model file fits every store path it measured (model/document.py): `paths(model)` lists
them and `for_path(model, path)` gives one path's fit, which every function here reads as
it reads a whole file (a file's top level is its first path's fit, so code that ignores
paths reads that one).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from xstage_bench.data import storepath
from xstage_bench.data.hardware import HardwareProfile
from xstage_bench.model.document import (
    ceiling_rates,
    fitted_paths,
    line_rate,
    path_fit,
    primary_path,
)
from xstage_bench.model.laws import BYTES_PER_US_PER_GBPS as GBPS_TO_BYTES_PER_US
from xstage_bench.model.laws import capacity

paths = fitted_paths  # every store path the model fits, the top level's first
for_path = path_fit  # one path's fit, in the shape of a one-path model
path_of = primary_path  # the path a (one-path) fit describes


def path_label(path: str) -> str:
    """'host memory' etc.: how a path's far end is named in figures and tables."""
    return storepath.far_end(path)


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
    """Backpressure-free issue time for K producers and V bytes: t0_fixed + (V/K)/issue_rate,
    t0_fixed paid once per producer an SM runs where the model's T0 law says so (T0_law:
    per_wave, ceil(K / sm_count) of them; files written before it hold per_burst)."""
    fixed = param(model, "t0_fixed_us")
    rate = param(model, "issue_rate_per_sm_GBps")
    if fixed is None or rate is None:
        return None
    law = model.get("T0_law") or {}
    if law.get("law") == "per_wave" and law.get("sm_count"):
        fixed *= math.ceil(K / law["sm_count"])
    return fixed + (np.asarray(V, dtype=float) / K) / (rate * GBPS_TO_BYTES_PER_US)


def ceiling(model: dict) -> float:
    """The capacity law's ceiling C in bytes: inf where the law has none (C_bytes null, or
    absent in files written before the ceiling)."""
    C = param(model, "C_bytes")
    return np.inf if C is None else C


def law_capacity(model: dict, K: float) -> float | None:
    """Q(K) = min(S + K q, C) of the model's capacity law (laws.capacity), None in files
    written before the law (no S_bytes, q_bytes) or where it gave no capacity."""
    S, q = param(model, "S_bytes"), param(model, "q_bytes")
    if S is None or q is None:
        return None
    return float(capacity(K, S, q, ceiling(model)))


def capacity_for_K(model: dict, K: int) -> float | None:
    """The model's capacity for K producers: its law (law_capacity) where the file has
    one; in files written before the law, Q fitted for this K, else the pooled Q."""
    if (law := law_capacity(model, K)) is not None:
        return law
    for entry in model.get("per_K", []):
        if entry.get("K") == K:
            value = (entry.get("Q_bytes") or {}).get("value")
            if value is not None:
                return float(value)
    return param(model, "Q_bytes")


def capacity_law(model: dict) -> dict | None:
    """The fit's capacity_law block (which variant of min(S + K q, C), and why), None in
    files written before the law."""
    return model.get("capacity_law")


def variant_model(model: dict, law: str) -> dict | None:
    """One capacity variant's fit (shared, window, shared_plus_window, capped) as a model
    with its own params, where the file has it and it determined a capacity."""
    variant = (model.get("variants") or {}).get(law)
    if not variant or (variant["params"].get("S_bytes") or {}).get("value") is None:
        return None
    return {"params": variant["params"]}


def fitted_to_aligned(model: dict) -> bool:
    """Were the periodic laws fitted to aligned (barrier) records rather than free ones?"""
    return (model.get("fit_set") or {}).get("periodic") == "aligned"


CEILING_NAME = {"sm_store": "sm-store", "copy_engine": "copy-engine"}
LINE_NAME = {
    storepath.PEER: "NVLink line rate (spec)",
    storepath.HOST: "host link line rate (spec)",
}


def ceilings(model: dict) -> dict[str, float]:
    """Horizontal references for rates (GB/s): the ceilings of the fit's path measured in
    the same run, and the path's line rate; labelled with the path's far end."""
    block = model.get("ceilings") or {}
    path = block.get("path", path_of(model))
    where = "peer" if path == storepath.PEER else path_label(path)
    refs = {
        f"{CEILING_NAME.get(method, method)} {where} ceiling": float(v)
        for method, v in ceiling_rates(block, path).items()
    }
    line = line_rate(block, path)
    if line:
        refs[LINE_NAME[path]] = line
    return refs


PROFILE_KEYS = {  # hardware-profile key -> the fitted parameter it takes
    "t0_fixed_us": "t0_fixed_us",
    "issue_rate_per_sm_GBps": "issue_rate_per_sm_GBps",
    "drain_rate_GBps": "R_GBps",
    "capacity_bytes": "S_bytes",
    "capacity_per_producer_bytes": "q_bytes",
    "capacity_ceiling_bytes": "C_bytes",
}


def path_profile(profile: HardwareProfile, model: dict, path: str) -> HardwareProfile:
    """`profile` (e.g. the dataset's refit model/profile.yaml, which is the top level's
    path) with T0, R and Q of `path`'s fit where that fit has them."""
    fit = for_path(model, path)
    values = {key: param(fit, name) for key, name in PROFILE_KEYS.items()}
    ceiling = values.pop("capacity_ceiling_bytes")
    given = {k: v for k, v in values.items() if v is not None}
    if values["capacity_bytes"] is not None:  # the fit's law, its ceiling too (None: none)
        given["capacity_ceiling_bytes"] = ceiling
    elif (shared := param(fit, "Q_bytes")) is not None:  # a file written before the law
        given["capacity_bytes"] = shared
    name = profile.name if path == path_of(model) else f"{profile.name}, {path} path"
    return replace(profile, name=name, **given)
