"""Fit the Burst-Gap parameters T0, R, Q to raw microbenchmark records (any backend).

The stages follow the paper's measurement plan, each a small scipy least-squares fit on
relative residuals of per-record medians:

- R from zero-gap periodic bursts: period = max(T0, V/R), pooled and per K; the K/B
  splits of one V must agree (check split_consistency);
- T0 = t0_fixed + B/issue_rate from bursts that meet an empty path: periodic records
  whose gap drains the whole burst (G >= V/R, the large-G plateau) and isolated bursts,
  with the isolated law max(T0, (V - Q)/R) so that bursts beyond the knee do not bias it;
- Q from the isolated-burst knee, max(T0, (V - Q)/R), pooled and per K. (Drain probes are
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
The local control is never fitted. model/document.py says how one file holds the paths:
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

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

from xstage_bench.data import storepath
from xstage_bench.data.config import ConfigError
from xstage_bench.data.hardware import load_profile
from xstage_bench.data.results import RawResultError, atomic_write_text
from xstage_bench.model import checks, laws
from xstage_bench.model.document import LINE_RATE_KEY, write_model
from xstage_bench.model.records import (
    ISOLATED_KINDS,
    NOT_FITTED_KINDS,
    ROLES,
    FitData,
    Loaded,
    Recs,
    concat,
    load,
    paths_in,
    plateau,
    read_docs,
    reference_stores,
)

MiB = float(1 << 20)
KiB = 1024.0
T0_REFERENCE_B = 32768  # per-K T0 is reported at the paper's B = 32 KB per producer
N_BOOTSTRAP = 200
HOLDOUT_PERCENT = 20
ROUNDS = 4
WINDOW = "per_producer_Q"


class FitError(ValueError):
    """A parameter the data cannot determine; the message says why."""


@dataclass(frozen=True)
class Params:
    """One fit's result; a None parameter carries its reason.

    Q is the shared capacity in bytes, or with window=True the per-producer window q, so
    that a burst of K producers meets Q = K * q.
    """

    R: float | None = None  # bytes/us
    t0_fixed: float | None = None  # us
    issue_rate: float | None = None  # bytes/us per producer
    Q: float | None = None  # bytes (shared), or bytes per producer (window)
    window: bool = False
    reasons: dict = field(default_factory=dict)

    def T0(self, B) -> np.ndarray:
        return self.t0_fixed + np.asarray(B, dtype=float) / self.issue_rate

    def Q_for(self, K) -> np.ndarray | None:
        """The capacity a burst of K producers meets, per record."""
        if self.Q is None:
            return None
        K = np.asarray(K, dtype=float)
        return self.Q * K if self.window else np.full(K.shape, self.Q)

    @property
    def has_T0(self) -> bool:
        return self.t0_fixed is not None


def _solve(residuals, x0, lower) -> np.ndarray:
    return least_squares(residuals, x0, bounds=(lower, np.inf), x_scale="jac").x


def fit_R(zg: Recs, p: Params, R0: float | None = None) -> float:
    """Drain rate (bytes/us) from zero-gap periods: period = max(T0, V/R)."""
    if len(zg) == 0:
        raise FitError("no zero-gap periodic records (study 'drain' or a gap sweep at G=0)")
    T0 = p.T0(zg.B) if p.has_T0 else 0.0
    x0 = (R0 or float(np.median(zg.V / zg.y))) / 1e3
    x = _solve(lambda x: (np.maximum(T0, zg.V / (x[0] * 1e3)) - zg.y) / zg.y, [x0], [1e-9])
    return float(x[0] * 1e3)


def fit_T0(recs: Recs, R: float, Q: np.ndarray | None, start: Params | None = None) -> tuple:
    """(t0_fixed_us, issue_rate bytes/us) from bursts on an empty path, isolated law.

    Q is the capacity each record's burst meets (None: no stall is modelled).
    """
    stall = (recs.V - Q) / R if Q is not None else np.full(len(recs), -np.inf)
    free = stall < 0.8 * recs.y  # clearly issue-bound
    if len(np.unique(recs.B[free])) < 2:
        raise FitError(
            "T0 needs backpressure-free bursts of at least two sizes B per "
            "producer (plateau or isolated records)"
        )
    if start is not None and start.has_T0:
        x0 = [start.t0_fixed, start.issue_rate / 1e3]
    else:  # a robust linear start on the issue-bound bursts
        slope, intercept = np.polyfit(recs.B[free], recs.y[free], 1)
        x0 = [max(intercept, 1e-3), 1.0 / max(slope, 1e-12) / 1e3]
    x = _solve(
        lambda x: (np.maximum(x[0] + recs.B / (x[1] * 1e3), stall) - recs.y) / recs.y,
        x0,
        [0.0, 1e-9],
    )
    return float(x[0]), float(x[1] * 1e3)


def _scale(iso: Recs, window: bool) -> np.ndarray:
    return iso.K if window else np.ones(len(iso))


def q_start(iso: Recs, R: float, window: bool = False) -> float:
    """A robust start for Q (or q): beyond the knee, V - R*T_iss is about Q whatever V is."""
    top = iso.V >= np.quantile(iso.V, 2 / 3)
    Q = (iso.V[top] - R * iso.y[top]) / _scale(iso, window)[top]
    return max(float(np.median(Q)), float(np.min(iso.V / _scale(iso, window))) * 1e-2)


def fit_Q(iso: Recs, R: float, p: Params, Q0: float | None = None) -> float:
    """Outstanding capacity from isolated bursts: T_iss = max(T0, (V - Q)/R).

    With p.window the capacity is K * q and the result is q, bytes per producer.
    """
    if len(iso) == 0:
        raise FitError("no isolated-burst records (study 'isolated')")
    T0 = p.T0(iso.B)
    unit = KiB if p.window else MiB
    scale = _scale(iso, p.window) * unit
    x0 = (Q0 if Q0 is not None else q_start(iso, R, p.window)) / unit
    x = _solve(lambda x: (np.maximum(T0, (iso.V - x[0] * scale) / R) - iso.y) / iso.y, [x0], [0.0])
    Q = float(x[0] * unit)
    if np.count_nonzero((iso.V - Q * _scale(iso, p.window)) / R > 1.1 * T0) < 2:
        bound = float(np.max((iso.V - R * T0) / _scale(iso, p.window)))
        what = (
            f"q is above about {bound / KiB:.1f} KiB per producer"
            if p.window
            else (f"Q is above about {bound / MiB:.2f} MiB")
        )
        raise FitError(
            f"fewer than two isolated bursts stall beyond T0, so the knee is not measured: {what}"
        )
    return Q


def fit_chain(
    data: FitData, start: Params | None = None, rounds: int = ROUNDS, window: bool = False
) -> Params:
    """Alternate the R, T0 and Q stages; a parameter the data cannot give stays None."""
    reasons: dict[str, str] = {}
    try:
        R = fit_R(data.zero_gap, start or Params(), start.R if start else None)
    except FitError as e:
        why = str(e)
        return Params(
            window=window,
            reasons={"R": why, "T0": f"needs R ({why})", "Q": f"needs R ({why})"},
        )
    p = replace(start, R=R) if start else Params(R=R, window=window)
    Q = p.Q
    if Q is None and len(data.isolated):
        Q = q_start(data.isolated, R, window)
    for _ in range(rounds):
        reasons = {}
        try:
            recs = concat(plateau(data.periodic, R), data.isolated)
            Q_recs = None if Q is None else replace(p, Q=Q).Q_for(recs.K)
            t0_fixed, rate = fit_T0(recs, R, Q_recs, p if p.has_T0 else None)
            p = replace(p, t0_fixed=t0_fixed, issue_rate=rate)
        except FitError as e:
            return Params(R=R, window=window, reasons={"T0": str(e), "Q": f"needs T0 ({e})"})
        try:
            Q = fit_Q(data.isolated, R, p, Q)
        except FitError as e:
            reasons["Q"] = str(e)
            Q = None
        p = replace(p, Q=Q)
        R = fit_R(data.zero_gap, p, R)
        p = replace(p, R=R)
    return replace(p, reasons=reasons)


@dataclass(frozen=True)
class PerK:
    R: float | None
    Q: float | None
    T0_ref: float | None  # T0 at T0_REFERENCE_B
    reasons: dict


def fit_per_K(data: FitData, pooled: Params, K: float) -> PerK:
    """R, Q and T0 refitted on one K's records, the other parameters held at the pool's."""
    reasons = {}
    R = Q = T0 = None
    try:
        R = fit_R(data.zero_gap.where(data.zero_gap.K == K), pooled, pooled.R)
    except FitError as e:
        reasons["R"] = str(e)
    if pooled.R is None or not pooled.has_T0:
        reasons["Q"] = reasons["T0"] = "needs the pooled R and T0"
        return PerK(R, Q, T0, reasons)
    iso = data.isolated.where(data.isolated.K == K)
    try:
        Q = fit_Q(iso, pooled.R, pooled, pooled.Q)
    except FitError as e:
        reasons["Q"] = str(e)
    plat = plateau(data.periodic, pooled.R)
    recs = concat(plat.where(plat.K == K), iso)
    try:
        if len(recs) == 0:
            raise FitError(f"no plateau or isolated records at K={K:g}")
        Q_K = Q if Q is not None else pooled.Q
        Q_recs = None if Q_K is None else np.full(len(recs), Q_K)
        t0_fixed, rate = fit_T0(recs, pooled.R, Q_recs, pooled)
        T0 = t0_fixed + T0_REFERENCE_B / rate
    except FitError as e:
        reasons["T0"] = str(e)
    return PerK(R, Q, T0, reasons)


# ---- bootstrap -----------------------------------------------------------------------

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


def _param(
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


def _params_block(p: Params, reps: dict, prefix: str = "") -> dict:
    why = p.reasons
    q_name = "q_bytes" if p.window else "Q_bytes"
    return {
        "R_GBps": _param(p.R, reps.get(f"{prefix}R"), 1e-3, why.get("R")),
        q_name: _param(p.Q, reps.get(f"{prefix}Q"), 1.0, why.get("Q")),
        "t0_fixed_us": _param(p.t0_fixed, reps.get(f"{prefix}t0_fixed"), 1.0, why.get("T0")),
        "issue_rate_per_sm_GBps": _param(
            p.issue_rate, reps.get(f"{prefix}issue_rate"), 1e-3, why.get("T0")
        ),
    }


# ---- validation ----------------------------------------------------------------------


def held_out(record_id: str) -> bool:
    """Deterministic split: about HOLDOUT_PERCENT% of ids, by hash, never fitted."""
    return int(hashlib.sha256(record_id.encode()).hexdigest()[:8], 16) % 100 < HOLDOUT_PERCENT


T_ISS = "t_iss_slowest_us"
PERIOD = "period_us"


def predict(p: Params, recs: Recs, metric: str) -> np.ndarray | None:
    """The laws' value of `metric` for each record, or None where p cannot predict it.

    Periodic records: the steady train's issue time and period (laws.train_*); isolated
    bursts and drain probes: the isolated law. Without a Q only the periodic law is left.
    """
    if p.R is None or not p.has_T0:
        return None
    T0 = p.T0(recs.B)
    Q = p.Q_for(recs.K)
    if metric == PERIOD:
        return None if Q is None else laws.train_period(T0, recs.G, recs.V, p.R, Q)
    isolated = np.isin(recs.kind, ISOLATED_KINDS)
    if Q is None:
        return None if isolated.any() else laws.issue_time(T0, recs.G, recs.V, p.R)
    train = laws.train_issue_time(T0, recs.G, recs.V, p.R, Q)
    return np.where(isolated, laws.isolated_issue_time(T0, recs.V, Q, p.R), train)


def _rel(pred: np.ndarray | None, j: int, measured: float) -> tuple[float | None, float | None]:
    if pred is None:
        return None, None
    return float(pred[j]), float((pred[j] - measured) / measured)


def _rows(recs: Recs, metric: str, shared: Params, window: Params, in_fit: bool, path: str) -> list:
    pred = predict(shared, recs, metric)
    if pred is None:
        return []  # no shared-Q prediction: nothing to validate (e.g. no Q, isolated law)
    pred_w = predict(window, recs, metric)
    rows = []
    for j, rid in enumerate(recs.ids):
        y = float(recs.y[j])
        predicted, rel = _rel(pred, j, y)
        predicted_w, rel_w = _rel(pred_w, j, y)
        rows.append(
            {
                "id": rid,
                "study": recs.study[j],
                "kind": recs.kind[j],
                "K": int(recs.K[j]),
                "V": int(recs.V[j]),
                "gap_us": float(recs.G[j]),
                "dest": path,
                "path": path,
                "sync": "barrier" if recs.aligned[j] else recs.sync[j],
                "aligned": bool(recs.aligned[j]),
                "metric": metric,
                "measured_us": y,
                "predicted_us": predicted,
                "rel_error": rel,
                "predicted_window_us": predicted_w,
                "rel_error_window": rel_w,
                "in_fit_set": in_fit,
                "held_out": held_out(rid) if in_fit else True,
            }
        )
    return rows


def summarize_errors(rows: list[dict], key: str = "rel_error") -> dict:
    errors = np.abs([r[key] for r in rows if r[key] is not None])
    return {
        "n": int(errors.size),
        "median_abs_rel_error": float(np.median(errors)) if errors.size else None,
        "p90_abs_rel_error": float(np.quantile(errors, 0.9)) if errors.size else None,
    }


def summaries(rows: list[dict], key: str = "rel_error") -> dict:
    """The error summaries of one variant (key: its rel_error column).

    validation_summary: held-out rows of the fit set; validation_summary_free: every
    free-running row (never fitted); validation_by_metric: the first, per metric;
    validation_by_group: per "study/sync:metric", over held-out rows, with "all" (fitted
    rows too, so in-sample) beside it to show where the laws miss systematically.
    """
    held = [r for r in rows if r["held_out"]]
    fit_held = [r for r in held if r["in_fit_set"]]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"{r['study']}/{r['sync']}:{r['metric']}", []).append(r)
    return {
        "validation_summary": summarize_errors(fit_held, key),
        "validation_summary_free": summarize_errors(
            [r for r in rows if not r["in_fit_set"] and not r["aligned"]], key
        ),
        "validation_by_metric": {
            m: summarize_errors([r for r in fit_held if r["metric"] == m], key)
            for m in sorted({r["metric"] for r in rows})
        },
        "validation_by_group": {
            g: {
                **summarize_errors([r for r in rs if r["held_out"]], key),
                "all": summarize_errors(rs, key),
            }
            for g, rs in sorted(groups.items())
        },
    }


def validate(loaded: Loaded) -> tuple[list[dict], Params]:
    """Fit both variants without the held-out records, then predict every record's
    t_iss_slowest (and period, for periodic records): the fit set's, held-out ones
    flagged, and those validated apart."""

    def training(recs: Recs) -> Recs:
        return recs.where([not held_out(i) for i in recs.ids])

    train = FitData(*(training(getattr(loaded.fit, role)) for role in ROLES))
    shared = fit_chain(train)
    window = fit_chain(train, window=True)
    rows: list[dict] = []
    for data, in_fit in ((loaded.fit, True), (loaded.apart, False)):
        for recs, metric in ((data.periodic, T_ISS), (data.isolated, T_ISS), (data.period, PERIOD)):
            rows += _rows(recs, metric, shared, window, in_fit, loaded.path)
    return rows, shared


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


def _no_rows_reason(shared: Params) -> str:
    why = shared.reasons.get("T0") or shared.reasons.get("R") or "no record to predict"
    return f"no training fit: {why}"


# ---- output --------------------------------------------------------------------------


def _profile_yaml(
    p: Params,
    dataset: str,
    sources: list[str],
    base_path: str | None,
    sm_count: int | None,
    path: str = storepath.PEER,
) -> str:
    """A hardware profile with the fitted parameters of one store path; what was not
    fitted says so. A host-path profile keeps the base profile's NVLink line rate (the
    simulator's peer link): its drain path is host memory, and its header says so."""
    fitted = {
        "t0_fixed_us": None if p.t0_fixed is None else round(p.t0_fixed, 4),
        "issue_rate_per_sm_GBps": None if p.issue_rate is None else round(p.issue_rate / 1e3, 2),
        "drain_rate_GBps": None if p.R is None else round(p.R / 1e3, 2),
        "capacity_bytes": None if p.Q is None else round(p.Q),
    }
    base = load_profile(base_path).as_dict() if base_path else {}
    names = ", ".join(Path(s).name for s in sources)
    name = f"{dataset} (fitted)" if path == storepath.PEER else f"{dataset} (fitted, {path} path)"
    prof = {"name": name, "source": f"fit of {dataset}: {names}"}
    if path != storepath.PEER:
        prof["source"] += f" (store path '{path}': {storepath.far_end(path)})"
    if base_path:
        prof.update({k: v for k, v in base.items() if k not in ("name", "source")})
    elif sm_count:
        prof["sm_count"] = sm_count
    notes = []
    for key, value in fitted.items():
        if value is not None:
            prof[key] = value
        elif key in prof:
            notes.append(
                f"# {key}: not fitted ({p.reasons.get(_reason_key(key), '')}); "
                f"kept from {base_path}"
            )
        else:
            notes.append(f"# {key}: not fitted ({p.reasons.get(_reason_key(key), '')})")
    header = [f"# Hardware profile refitted from dataset '{dataset}' by xstage_bench.model.fit."]
    if path != storepath.PEER:
        header.append(
            f"# Store path '{path}' ({storepath.far_end(path)}): T0, R and Q are that path's; "
            "nvlink_line_rate_GBps is the base profile's."
        )
    if not base_path:
        header.append("# No base profile: keys the fit does not give are absent.")
    return "\n".join(header + notes) + "\n" + yaml.safe_dump(prof, sort_keys=False)


def _reason_key(profile_key: str) -> str:
    return {"drain_rate_GBps": "R", "capacity_bytes": "Q"}.get(profile_key, "T0")


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
                "R_GBps": _param(k.R, reps.get(f"R@{K:g}"), 1e-3, k.reasons.get("R")),
                "Q_bytes": _param(k.Q, reps.get(f"Q@{K:g}"), 1.0, k.reasons.get("Q")),
                "T0_us": _param(k.T0_ref, reps.get(f"T0@{K:g}"), 1.0, k.reasons.get("T0")),
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

    A file that cannot be read raises RawResultError naming it; a fit that fails on the
    numbers raises FitError naming the files it was fitting.
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
        _profile_yaml(
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


def _fit_path(
    loaded: Loaded, base_profile: str | None, n_bootstrap: int, seed: int
) -> tuple[dict, Params]:
    """One store path's fit: the block document.py puts at the top level or in other_paths."""
    data = loaded.fit
    pooled = fit_chain(data)
    window = fit_chain(data, window=True)
    Ks = sorted(set(data.zero_gap.K) | set(data.periodic.K) | set(data.isolated.K))
    reps = bootstrap(data, pooled, window, Ks, n_bootstrap, seed) if pooled.R is not None else {}
    params = _params_block(pooled, reps)
    per_K = _per_K(data, pooled, Ks, reps)
    validation, train_shared = validate(loaded)
    shared_summaries = summaries(validation)
    window_summaries = summaries(validation, "rel_error_window")
    if not validation:
        shared_summaries["validation_summary"]["reason"] = _no_rows_reason(train_shared)
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
        "variants": {WINDOW: {"params": _params_block(window, reps, "w:"), **window_summaries}},
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
