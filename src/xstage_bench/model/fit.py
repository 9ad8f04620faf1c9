"""Fit the Burst-Gap parameters T0, R, Q to raw microbenchmark records (any backend).

This module runs the fit of every store path and assembles model/burst_gap.json: the
stages it runs are in stages.py and capacity.py, their confidence intervals in
bootstrap.py, the held-out validation in validation.py, the refit hardware profile in
refit_profile.py.

The stages follow the paper's measurement plan (stages.py says how): R from zero-gap
periodic bursts, each K/B split's own R the slope of its periods over V (check
split_consistency); T0 from bursts that meet an empty path, periodic records whose gap
drains the whole burst and isolated bursts; the capacity from the isolated-burst knees.
(Drain probes are isolated bursts too, but their kernel's fixed cost differs: they are
validated apart.)

The capacity follows the law Q(K) = min(S + K q, C) (laws.capacity), a part S shared by
the path and a window q per producer up to a ceiling C of the path, in four variants
(capacity.py): shared (q = 0, the paper's one Q), window (S = 0), shared_plus_window (no
ceiling) and capped (all three free). Each is a full fit of its own; the one whose
isolated bursts (where the capacity acts) have the least held-out error over five
stratified folds is the model's (`capacity_law`), and `params` holds it. The INTERFACE
other code reads (the MegaMoE playback and `auto` lead):
- params.S_bytes, params.q_bytes, params.C_bytes: the chosen variant's S, q and C,
  parameter blocks like the others (value, ci_low, ci_high, reason); a number the variant
  holds at 0 is 0 with a reason saying so, a ceiling it lacks is null with its reason (C
  = inf; files written before the ceiling have no C_bytes and no ceiling either);
- params.Q_bytes: Q(K_ref) = min(S + K_ref q, C), the capacity at the largest K whose
  isolated bursts were fitted (capacity_law.K_ref), with its bootstrap CI;
- params.drain_lag_fraction and params.drain_lag_rate_ratio: how the drain lags beyond
  the knee, fitted with the capacity (laws.stall_time: the drain takes bytes at
  rate_ratio x R once a burst fills the path and at R a fraction x Q/R later, so a long
  isolated burst stalls (V - (1 - fraction) Q)/R); 0 and 1 are the paper's (V - Q)/R.
  the MegaMoE playback reads it and does not play it (lead.PLAYS_DRAIN_LAG: its slow
  start made the playback worse; megamoe/drain.py can play it);
- capacity_law: {"law": "min(S + K q, C)" ("S + K q" in files written before the
  ceiling), "chosen": "shared" | "window" | "shared_plus_window" | "capped",
  "chosen_by": why, "fitted": "S 0.98 MiB + K x 15.2 KiB" or the like, "K_ref": K,
  "heldout": {variant: {n, median_abs_rel_error, p90_abs_rel_error, folds}} over the
  isolated bursts (what chose), and "heldout_all_records" the same over every row of
  the fit set}.

Which records are fitted: aligned bursts where the dataset has them (see records.py);
free-running records are then validated apart, with their own summary. R comes from the
aggregate issue rate where records have it (V / issue_rate as the period). Aligned
periodic records are fitted on the sender-visible issue time (sender_visible.py): the
measured t_vis_slowest_us, or in older runs a stand-in derived from the period
(t_vis_derived_us), and `sender_visible` says how many records took which and that the
stand-in needs a new run.

The stages depend on each other (R's fit needs T0 where a burst is issue-bound, T0's needs
Q, Q's needs T0 and R), so they alternate a few rounds from a robust start. Confidence
intervals come from a seeded bootstrap over records and over each record's samples.
A held-out fifth of the fitted records, stratified by study, K and regime, checks the
laws' predictions (validation.py).

Every store path the records measured (peer, host) is fitted on its own, from its own
records: its parameters with CIs, its validation and its checks (R against that path's
SM-store ceiling of the same run and against its line rate: NVLink's from the base profile
for the peer path, the host link's from the raw files' environment for the host path).
The local control is never fitted. A parameter a path's records cannot give is null, its
reason naming the path and why (e.g. "host path: T0 needs backpressure-free bursts ..."),
never a guess. model/document.py says how one file holds the paths:
the top level is the peer path's fit where there is one (else the host path's), the
others sit in `other_paths`; the refit hardware profile is the top level's.

Each path's fit holds, beside what every reader needs (params, capacity_law, per_K,
validation, validation_summary, checks):
- per_K: each K's R (slope) and period intercept, its own knee Q and its T0;
- fit_set: per role (zero_gap, periodic, isolated, and period, which is validated only),
  whether aligned records or all were fitted; fit.validated_apart says what never is;
  zero_gap_sources: how many zero-gap periods came from issue_rate_GBps, from period_us;
- validation rows, one per record and metric (its issue-time metric, which it names, and
  period_us for periodic ones, predicted by laws.train_period): sync ("barrier" for every
  aligned record, drain probes included), aligned, in_fit_set (False: validated apart and
  never fitted, so held_out is True), each variant's predicted_<law>_us and
  rel_error_<law> beside the chosen variant's predicted_us and rel_error;
- validation_summary: held-out rows of the fit set; validation_summary_free: every
  free-running row validated apart; validation_by_metric: the first, per metric;
  validation_by_group: per "study/sync:metric", over held-out rows, with "all" (fitted
  rows too) beside it to show where the laws miss systematically; worst_heldout: the
  held-out rows the model misses most;
- variants: each capacity variant's params (CIs for the chosen one alone: fit.bootstrapped)
  and summaries;
- findings.store_loop_share: the share of the sender-visible time spent in the store
  loop per K, a hardware finding reported beside the checks;
- ceilings: the path's ceilings of the same run (`<path>_GBps`: median GB/s per method)
  and its line rate (nvlink_line_rate_GBps from the base profile, or host_line_rate_GBps
  from the environment's host link; a specification, not a measurement);
- checks (see checks.py): split_consistency, t0_plateau_flat, stall_visible_to_sender,
  capacity_law_explains_isolated, r_matches_sm_store_ceiling, r_within_line_rate,
  heldout_error_within_target.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from xstage_bench.data import storepath
from xstage_bench.data.config import ConfigError
from xstage_bench.data.hardware import load_profile
from xstage_bench.data.results import RawResultError, atomic_write_text
from xstage_bench.model import capacity, checks, laws
from xstage_bench.model.bootstrap import N_BOOTSTRAP, bootstrap, param_block, params_block
from xstage_bench.model.capacity import LAWS, SHARED
from xstage_bench.model.document import LINE_RATE_KEY, write_model
from xstage_bench.model.records import (
    NOT_FITTED_KINDS,
    FitData,
    Loaded,
    load,
    paths_in,
    read_docs,
    reference_stores,
    waves,
)
from xstage_bench.model.refit_profile import profile_yaml
from xstage_bench.model.stages import (
    PER_BURST,
    PER_WAVE,
    T0_REFERENCE_B,
    FitError,
    Params,
    PerK,
    fit_laws,
    fit_per_K,
    t0_records,
)
from xstage_bench.model.validation import (
    CHOICE_RESOLUTION,
    HOLDOUT_PERCENT,
    STRIDE,
    choose_law,
    cross_validated,
    error_key,
    no_rows_reason,
    summaries,
    validate,
    with_law,
    worst_rows,
)

CAPACITY_LAW = "min(S + K q, C)"


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
                "period_intercept_us": param_block(
                    k.c, reps.get(f"c@{K:g}"), 1.0, k.reasons.get("R")
                ),
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
    rows, train = validate(loaded, seed)
    variant_summaries = {law: summaries(rows, error_key(law)) for law in LAWS}
    heldout, heldout_all = cross_validated(loaded, seed)
    chosen = choose_law(heldout)
    law = chosen or SHARED
    fits = fit_laws(data)
    pooled = fits[law]
    Ks = sorted(set(data.zero_gap.K) | set(data.periodic.K) | set(data.isolated.K))
    K_ref = float(np.max(data.isolated.K)) if len(data.isolated) else None
    reps = bootstrap(data, fits, law, Ks, K_ref, n_bootstrap, seed) if pooled.R is not None else {}
    params = params_block(_naming_path(pooled, loaded.path), reps, K_ref)
    per_K = _per_K(data, pooled, Ks, reps)
    validation = with_law(rows, law)
    chosen_summaries = summaries(validation)
    if not validation:
        chosen_summaries["validation_summary"]["reason"] = no_rows_reason(train[law])
    ceilings = _ceilings(loaded, base_profile)
    line_rate = ceilings[LINE_RATE_KEY[loaded.path]]
    block = {
        "path": loaded.path,
        "params": params,
        "capacity_law": _capacity_law(pooled, chosen, heldout, heldout_all, K_ref),
        "per_K": per_K,
        "T0_reference_B_bytes": T0_REFERENCE_B,
        "T0_law": _T0_law(pooled, data, loaded.sm_count),
        "records": loaded.counts,
        "fit": {
            "n_bootstrap": n_bootstrap,
            "bootstrapped": f"the {law} variant's parameters and per-K numbers (the chosen "
            "one); the other variants' are values without CIs",
            "seed": seed,
            "holdout_percent": HOLDOUT_PERCENT,
            "holdout": "stratified by study, K and regime; seeded (validation.py)",
            "reference_stores": reference_stores(loaded.path),
            "validated_apart": {
                "kinds": list(NOT_FITTED_KINDS),
                "sync": "free, where a role has aligned records (see fit_set)",
            },
        },
        "fit_set": loaded.fit_set,
        "zero_gap_sources": loaded.zero_gap_sources,
        "sender_visible": loaded.visible,
        "ceilings": ceilings,
        "validation": validation,
        **chosen_summaries,
        "worst_heldout": worst_rows(validation),
        "variants": {
            name: {
                "params": params_block(_naming_path(fits[name], loaded.path), reps, K_ref),
                **{k: v for k, v in variant_summaries[name].items() if k != "validation_by_group"},
            }
            for name in LAWS
        },
    }
    block["checks"], block["findings"] = _checks(data, pooled, Ks, block, loaded.fit_set, line_rate)
    return block, pooled


def _T0_law(p: Params, data: FitData, sm_count: int | None) -> dict:
    """The model file's T0_law block: T0 = t0_fixed + B / issue rate, t0_fixed paid once
    a burst or once per producer an SM runs (Params.t0_per_wave), and why."""
    recs = t0_records(data, p.R) if p.R else data.isolated
    beyond = sorted({int(K) for K, w in zip(recs.K, waves(recs), strict=True) if w > 1})
    by = (
        f"the fit of least cost on the backpressure-free bursts (both laws have two free "
        f"numbers); bursts of more producers than the {sm_count} SMs: K = "
        + ", ".join(map(str, beyond))
        if beyond
        else "no burst T0 is fitted on has more producers than SMs, where the laws differ"
    )
    return {
        "law": PER_WAVE if p.t0_per_wave else PER_BURST,
        "laws": {
            PER_BURST: "T0 = t0_fixed + B / issue_rate",
            PER_WAVE: "T0 = ceil(K / sm_count) t0_fixed + B / issue_rate",
        },
        "sm_count": sm_count,
        "chosen_by": by,
    }


def _capacity_law(
    p: Params, chosen: str | None, heldout: dict, heldout_all: dict, K_ref: float | None
) -> dict:
    """The model file's capacity_law block: which variant of Q(K) = min(S + K q, C) the
    path's params hold, why, and every variant's held-out error
    (validation.cross_validated)."""
    by = (
        f"the least held-out median |error| of the isolated bursts over {STRIDE} stratified "
        f"folds, each burst held out once (medians within {CHOICE_RESOLUTION:.1%} tie: the "
        "lower p90, then the fewer free numbers)"
        if chosen
        else "no isolated burst was predicted held out: the paper's shared capacity"
    )
    return {
        "law": CAPACITY_LAW,
        "chosen": p.law,
        "chosen_by": by,
        "fitted": None if p.capacity is None else capacity.describe(p.capacity),
        "K_ref": None if K_ref is None else int(K_ref),
        "Q_bytes_is": "min(S + K_ref q, C), the capacity at the largest K of the isolated "
        "bursts fitted",
        "heldout": heldout,
        "heldout_all_records": heldout_all,
    }


def _checks(
    data: FitData,
    p: Params,
    Ks: list[float],
    block: dict,
    fit_set: dict,
    line_rate: float | None,
) -> tuple[dict, dict]:
    """Every check of the path's fit (checks.py), and the findings beside them."""
    per, per_K = data.periodic, block["per_K"]
    found: dict = {}
    out = {
        "split_consistency": checks.split_consistency(per_K),
        "t0_plateau_flat": checks.t0_plateau_flat(per, p.R, p.Q(per.K)),
    }
    if p.R is None or not p.has_T0 or p.capacity is None:
        out["stall_visible_to_sender"] = checks.not_evaluated("needs the pooled R, T0 and Q")
    else:
        T0 = p.T0_of(per)
        train = laws.issue_time(T0, per.G, per.V, p.R)
        alone = laws.isolated_issue_time(T0, per.V, p.Q(per.K), p.R, p.lag.fraction, p.lag.rate)
        out["stall_visible_to_sender"] = checks.stall_visible_to_sender(per, T0, train, alone)
        found["store_loop_share"] = checks.store_loop_share(
            per, checks.backpressure_mask(per, T0, train, alone)
        )
    law_Q = {} if p.capacity is None else {int(K): float(p.Q(K)) for K in Ks}
    out["capacity_law_explains_isolated"] = checks.capacity_law_explains_isolated(
        per_K, law_Q, p.law
    )
    R = block["params"]["R_GBps"]
    out["r_matches_sm_store_ceiling"] = checks.r_matches_ceiling(R, block["ceilings"])
    out["r_within_line_rate"] = checks.r_within_line_rate(R, per_K, line_rate, block["path"])
    out["heldout_error_within_target"] = checks.heldout_error_within_target(
        block,
        {law: v["validation_summary"] for law, v in block["variants"].items()},
        fit_set,
    )
    return out, found
