"""Fit the Burst-Gap parameters T0, R, Q to raw microbenchmark records (any backend).

This module runs the fit of every store path and assembles model/burst_gap.json: the
stages it runs are in stages.py, their confidence intervals in bootstrap.py, the held-out
validation in validation.py, the refit hardware profile in refit_profile.py.

The stages follow the paper's measurement plan (stages.py says how): R from zero-gap
periodic bursts, whose K/B splits of one V must agree (check split_consistency); T0 from
bursts that meet an empty path, periodic records whose gap drains the whole burst and
isolated bursts; Q from the isolated-burst knee, pooled and per K. (Drain probes are
isolated bursts too, but their kernel's fixed cost differs: they are validated apart.)

Q comes in two variants, each a full fit of its own: one capacity Q shared by the path
(the paper's model), and a per-producer window, Q = K * q, which the paper's own numbers
(Q grows with K) suggest. `params` and `validation` hold the shared-Q model; the window
variant's parameters and errors sit beside them, and a check says which fits better.

Which records are fitted: aligned bursts where the dataset has them (see records.py);
free-running records are then validated apart, with their own summary. R comes from the
aggregate issue rate where records have it (V / issue_rate as the period).

The stages depend on each other (R's fit needs T0 where a burst is issue-bound, T0's needs
Q, Q's needs T0 and R), so they alternate a few rounds from a robust start. Confidence
intervals come from a seeded bootstrap over records and over each record's samples.
A held-out fifth of the fitted records (by id hash) checks the laws' predictions.

Every store path the records measured (peer, host) is fitted on its own, from its own
records: its T0, R and Q with CIs, its validation and its checks (R against that path's
SM-store ceiling of the same run and against its line rate: NVLink's from the base profile
for the peer path, the host link's from the raw files' environment for the host path).
The local control is never fitted. A parameter a path's records cannot give is null, its
reason naming the path and why (e.g. "host path: T0 needs backpressure-free bursts ..."),
never a guess. model/document.py says how one file holds the paths:
the top level is the peer path's fit where there is one (else the host path's), the
others sit in `other_paths`; the refit hardware profile is the top level's.

Each path's fit holds, beside what every reader needs (params, per_K, validation,
validation_summary, checks):
- fit_set: per role (zero_gap, periodic, isolated, and period, which is validated only),
  whether aligned records or all were fitted; fit.validated_apart says what never is;
  zero_gap_sources: how many zero-gap periods came from issue_rate_GBps, from period_us;
- validation rows, one per record and metric (t_iss_slowest_us for every record, and
  period_us for periodic ones, predicted by laws.train_period): sync ("barrier" for every
  aligned record, drain probes included), aligned, in_fit_set (False: validated apart and
  never fitted, so held_out is True), predicted_window_us and rel_error_window (the
  per-producer window's prediction beside the shared-Q one);
- validation_summary: held-out rows of the fit set (shared Q); validation_summary_free:
  every free-running row validated apart; validation_by_metric: the first, per metric;
  validation_by_group: per "study/sync:metric", over held-out rows, with "all" (fitted
  rows too) beside it to show where the laws miss systematically;
- variants.per_producer_Q: params (q_bytes per producer, R, t0_fixed, issue rate, with
  CIs) and the same summaries for the window variant;
- ceilings: the path's ceilings of the same run (`<path>_GBps`: median GB/s per method)
  and its line rate (nvlink_line_rate_GBps from the base profile, or host_line_rate_GBps
  from the environment's host link; a specification, not a measurement);
- checks (see checks.py): split_consistency, t0_plateau_flat, stall_in_store_loop,
  one_Q_explains_isolated, per_producer_Q_fits_better, r_matches_sm_store_ceiling,
  r_within_line_rate, heldout_error_within_target.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from xstage_bench.data import storepath
from xstage_bench.data.config import ConfigError
from xstage_bench.data.hardware import load_profile
from xstage_bench.data.results import RawResultError, atomic_write_text
from xstage_bench.model import checks, laws
from xstage_bench.model.bootstrap import N_BOOTSTRAP, bootstrap, param_block, params_block
from xstage_bench.model.document import LINE_RATE_KEY, write_model
from xstage_bench.model.records import (
    NOT_FITTED_KINDS,
    FitData,
    Loaded,
    load,
    paths_in,
    read_docs,
    reference_stores,
)
from xstage_bench.model.refit_profile import profile_yaml
from xstage_bench.model.stages import T0_REFERENCE_B, FitError, Params, PerK, fit_chain, fit_per_K
from xstage_bench.model.validation import HOLDOUT_PERCENT, no_rows_reason, summaries, validate

WINDOW = "per_producer_Q"


def _stall_check(data: FitData, p: Params, per_K: list[dict]) -> dict:
    """checks.stall_in_store_loop with each K's own Q (the pooled one where a K has none)."""
    per = data.periodic
    if p.R is None or not p.has_T0 or p.Q is None or data.period is None:
        return checks.not_evaluated("needs the pooled R, T0 and Q")
    Q_of_K = {k["K"]: k["Q_bytes"]["value"] for k in per_K if k["Q_bytes"]["value"]}
    Q = np.array([Q_of_K.get(int(K), p.Q) for K in per.K])
    T0 = p.T0(per.B)
    return checks.stall_in_store_loop(
        per,
        data.period,
        T0,
        laws.issue_time(T0, per.G, per.V, p.R),
        laws.isolated_issue_time(T0, per.V, Q, p.R),
    )


def _per_K(data: FitData, pooled: Params, Ks: list[float], reps: dict) -> list[dict]:
    why = pooled.reasons
    out = []
    for K in Ks:
        k = (
            fit_per_K(data, pooled, K)
            if pooled.R is not None
            else PerK(None, None, None, {q: f"needs R ({why['R']})" for q in ("R", "Q", "T0")})
        )
        out.append(
            {
                "K": int(K),
                "R_GBps": param_block(k.R, reps.get(f"R@{K:g}"), 1e-3, k.reasons.get("R")),
                "Q_bytes": param_block(k.Q, reps.get(f"Q@{K:g}"), 1.0, k.reasons.get("Q")),
                "T0_us": param_block(k.T0_ref, reps.get(f"T0@{K:g}"), 1.0, k.reasons.get("T0")),
            }
        )
    return out


def fit_files(
    raw_paths: list[str],
    dataset: str,
    out_json: str,
    out_profile: str,
    base_profile: str | None,
    *,
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 0,
) -> dict:
    """Fit T0, R, Q per store path from raw microbench files; write model/burst_gap.json
    (every path, document.py) and profile.yaml (the top-level path's).

    A file that cannot be read raises RawResultError naming it, files the fit cannot take
    together FitInputError; a fit that fails on the numbers raises FitError naming the
    files it was fitting.
    """
    docs = read_docs(raw_paths)
    paths = paths_in(docs)
    loaded = {path: load(docs, path) for path in paths}
    try:
        fits = {path: _fit_path(loaded[path], base_profile, n_bootstrap, seed) for path in paths}
    except (ConfigError, RawResultError):
        raise
    except (ValueError, ArithmeticError) as e:
        files = ", ".join(str(p) for p in raw_paths)
        raise FitError(f"fitting {files}: {type(e).__name__}: {e}") from e
    primary = paths[0]
    result = {
        "dataset": dataset,
        "backend": loaded[primary].backend,
        "sources": [str(p) for p in raw_paths],
        "paths": paths,
        **fits[primary][0],
    }
    if len(paths) > 1:
        result["other_paths"] = {path: fits[path][0] for path in paths[1:]}
    write_model(out_json, result)
    atomic_write_text(
        out_profile,
        profile_yaml(
            fits[primary][1],
            dataset,
            result["sources"],
            base_profile,
            loaded[primary].sm_count,
            primary,
        ),
    )
    return result


def _ceilings(loaded: Loaded, base_profile: str | None) -> dict:
    """The path's ceilings of the same run and its line rate (a specification)."""
    path = loaded.path
    if path == storepath.PEER:
        line = load_profile(base_profile).nvlink_line_rate_GBps if base_profile else None
        source = f"{base_profile} (specification)" if base_profile else None
    else:
        link = loaded.host_link or {}
        line = link.get("line_rate_GBps")
        source = (
            f"raw environment host_links[0]: {link.get('kind')} gen {link.get('gen')} "
            f"x{link.get('width')} (specification)"
            if line is not None
            else None
        )
    return {
        "path": path,
        f"{path}_GBps": {m: c["median_GBps"] for m, c in loaded.ceilings.items()},
        "n_samples": {m: c["n"] for m, c in loaded.ceilings.items()},
        LINE_RATE_KEY[path]: line,
        "line_rate_source": source,
    }


def _naming_path(p: Params, path: str) -> Params:
    """p with the reason of each parameter it lacks naming the store path, so that a
    missing T0 says whose it is wherever the reason is read (a figure's panel, a table)."""
    return replace(p, reasons={name: f"{path} path: {why}" for name, why in p.reasons.items()})


def _fit_path(
    loaded: Loaded, base_profile: str | None, n_bootstrap: int, seed: int
) -> tuple[dict, Params]:
    """One store path's fit: the block document.py puts at the top level or in other_paths."""
    data = loaded.fit
    pooled = fit_chain(data)
    window = fit_chain(data, window=True)
    Ks = sorted(set(data.zero_gap.K) | set(data.periodic.K) | set(data.isolated.K))
    reps = bootstrap(data, pooled, window, Ks, n_bootstrap, seed) if pooled.R is not None else {}
    params = params_block(_naming_path(pooled, loaded.path), reps)
    per_K = _per_K(data, pooled, Ks, reps)
    validation, train_shared = validate(loaded)
    shared_summaries = summaries(validation)
    window_summaries = summaries(validation, "rel_error_window")
    if not validation:
        shared_summaries["validation_summary"]["reason"] = no_rows_reason(train_shared)
    ceilings = _ceilings(loaded, base_profile)
    line_rate = ceilings[LINE_RATE_KEY[loaded.path]]
    block = {
        "path": loaded.path,
        "params": params,
        "per_K": per_K,
        "T0_reference_B_bytes": T0_REFERENCE_B,
        "records": loaded.counts,
        "fit": {
            "n_bootstrap": n_bootstrap,
            "seed": seed,
            "holdout_percent": HOLDOUT_PERCENT,
            "reference_stores": reference_stores(loaded.path),
            "validated_apart": {
                "kinds": list(NOT_FITTED_KINDS),
                "sync": "free, where a role has aligned records (see fit_set)",
            },
        },
        "fit_set": loaded.fit_set,
        "zero_gap_sources": loaded.zero_gap_sources,
        "ceilings": ceilings,
        "validation": validation,
        **shared_summaries,
        "variants": {
            WINDOW: {
                "params": params_block(_naming_path(window, loaded.path), reps, "w:"),
                **window_summaries,
            }
        },
        "checks": {
            "split_consistency": checks.split_consistency(
                data.zero_gap, pooled.R, pooled.T0 if pooled.has_T0 else None
            ),
            "t0_plateau_flat": checks.t0_plateau_flat(data.periodic, pooled.R),
            "stall_in_store_loop": _stall_check(data, pooled, per_K),
            "one_Q_explains_isolated": checks.one_Q(per_K),
            "per_producer_Q_fits_better": checks.per_producer_Q_fits_better(validation),
            "r_matches_sm_store_ceiling": checks.r_matches_ceiling(params["R_GBps"], ceilings),
            "r_within_line_rate": checks.r_within_line_rate(
                params["R_GBps"], per_K, line_rate, loaded.path
            ),
            "heldout_error_within_target": checks.heldout_error_within_target(
                shared_summaries, window_summaries, loaded.fit_set
            ),
        },
    }
    return block, pooled
