"""Fit the Burst-Gap parameters T0, R, Q to raw microbenchmark records (any backend).

The stages follow the paper's measurement plan, each a small scipy least-squares fit on
relative residuals of per-record medians:

- R from zero-gap periodic bursts: period = max(T0, V/R), pooled and per K; the K/B
  splits of one V must agree (check split_consistency);
- T0 = t0_fixed + B/issue_rate from bursts that meet an empty path: periodic records
  whose gap drains the whole burst (G >= V/R, the large-G plateau) and isolated bursts,
  with the isolated law max(T0, (V - Q)/R) so that bursts beyond the knee do not bias it;
- Q from the isolated-burst knee, max(T0, (V - Q)/R), pooled and per K (check
  one_Q_explains_isolated: a Q that grows with K points to a per-producer window).
  Drain probes are isolated bursts too and join these records.

The stages depend on each other (R's fit needs T0 where a burst is issue-bound, T0's needs
Q, Q's needs T0 and R), so they alternate a few rounds from a robust start. Confidence
intervals come from a seeded bootstrap over records and over each record's samples.
A held-out fifth of the records (by id hash) checks the laws' predictions.

Only peer records of the reference store configuration (16-byte stores, rewriting the
same lines, one peer) enter the fit; local and other records stay for the figures.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

from xstage_bench.hardware import load_profile
from xstage_bench.model import laws
from xstage_bench.results import FAILED_STATUSES, atomic_write_text, read_raw
from xstage_bench.stats import bootstrap_median_ci

MiB = float(1 << 20)
T0_REFERENCE_B = 32768  # per-K T0 is reported at the paper's B = 32 KB per producer
REFERENCE_STORES = {"dest": "peer", "width": 16, "pattern": "same", "peers": 1}
N_BOOTSTRAP = 200
HOLDOUT_PERCENT = 20
ROUNDS = 4
SPLIT_CI_FLOOR = 0.01  # a K/B split's R interval is at least +-1% (clock and timer noise)
PLATEAU_TOLERANCE = 0.05  # issue time may vary 5% over the plateau gaps
ONE_Q_TOLERANCE = 0.10  # per-K Q within 10% of each other count as one Q


class FitError(ValueError):
    """A parameter the data cannot determine; the message says why."""


@dataclass(frozen=True)
class Recs:
    """Records of one role as arrays: K, V, B per producer, gap, and a value per record."""

    ids: tuple[str, ...]
    study: tuple[str, ...]
    kind: tuple[str, ...]
    K: np.ndarray
    V: np.ndarray
    B: np.ndarray
    G: np.ndarray
    y: np.ndarray  # per-record median of the role's metric
    samples: tuple[np.ndarray, ...]
    series: tuple[str, ...]  # the record's point without its gap (one curve over G)

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, idx, y: np.ndarray | None = None) -> Recs:
        idx = np.asarray(idx, dtype=int)

        def pick(seq: tuple) -> tuple:
            return tuple(seq[i] for i in idx)

        return Recs(
            pick(self.ids),
            pick(self.study),
            pick(self.kind),
            self.K[idx],
            self.V[idx],
            self.B[idx],
            self.G[idx],
            self.y[idx] if y is None else y,
            pick(self.samples),
            pick(self.series),
        )

    def where(self, mask) -> Recs:
        return self.take(np.flatnonzero(mask))


def _recs(records: list[dict], metric: str) -> Recs:
    pts = [r["point"] for r in records]
    samples = tuple(np.asarray(r["samples"][metric], dtype=float) for r in records)
    return Recs(
        ids=tuple(r["id"] for r in records),
        study=tuple(p.get("study", "") for p in pts),
        kind=tuple(p["kind"] for p in pts),
        K=np.array([p["K"] for p in pts], dtype=float),
        V=np.array([p["V"] for p in pts], dtype=float),
        B=np.array([p["B"] for p in pts], dtype=float),
        G=np.array([p.get("gap_us", 0.0) for p in pts], dtype=float),
        y=np.array([np.median(s) for s in samples]),
        samples=samples,
        series=tuple(
            f"{p.get('study', '')}/K={p['K']}/V={p['V']}/sync={p.get('sync')}/"
            f"gap_mode={p.get('gap_mode')}"
            for p in pts
        ),
    )


@dataclass(frozen=True)
class FitData:
    zero_gap: Recs  # periodic at G = 0, metric period_us
    periodic: Recs  # every periodic record, metric t_iss_slowest_us
    isolated: Recs  # isolated bursts and drain probes, metric t_iss_slowest_us


@dataclass(frozen=True)
class Params:
    """One fit's result; a None parameter carries its reason."""

    R: float | None = None  # bytes/us
    t0_fixed: float | None = None  # us
    issue_rate: float | None = None  # bytes/us per producer
    Q: float | None = None  # bytes
    reasons: dict = field(default_factory=dict)

    def T0(self, B) -> np.ndarray:
        return self.t0_fixed + np.asarray(B, dtype=float) / self.issue_rate

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


def plateau(periodic: Recs, R: float) -> Recs:
    """Periodic records whose gap drains the whole burst (G >= V/R): each meets an empty path."""
    return periodic.where(periodic.G >= periodic.V / R)


def _stall(recs: Recs, R: float, Q: float | None) -> np.ndarray:
    return (recs.V - Q) / R if Q is not None else np.full(len(recs), -np.inf)


def fit_T0(recs: Recs, R: float, Q: float | None, start: Params | None = None) -> tuple:
    """(t0_fixed_us, issue_rate bytes/us) from bursts on an empty path, isolated law."""
    stall = _stall(recs, R, Q)
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


def q_start(iso: Recs, R: float) -> float:
    """A robust start for Q: beyond the knee, V - R*T_iss is about Q whatever V is."""
    top = iso.V >= np.quantile(iso.V, 2 / 3)
    return max(float(np.median(iso.V[top] - R * iso.y[top])), float(iso.V.min()) * 1e-2)


def fit_Q(iso: Recs, R: float, p: Params, Q0: float | None = None) -> float:
    """Outstanding capacity (bytes) from isolated bursts: T_iss = max(T0, (V - Q)/R)."""
    if len(iso) == 0:
        raise FitError("no isolated-burst records (study 'isolated')")
    T0 = p.T0(iso.B)
    x0 = (Q0 if Q0 is not None else q_start(iso, R)) / MiB
    x = _solve(lambda x: (np.maximum(T0, (iso.V - x[0] * MiB) / R) - iso.y) / iso.y, [x0], [0.0])
    Q = float(x[0] * MiB)
    if np.count_nonzero((iso.V - Q) / R > 1.1 * T0) < 2:
        bound = float(np.max(iso.V - R * T0)) / MiB
        raise FitError(
            f"fewer than two isolated bursts stall beyond T0, so the knee is not "
            f"measured: Q is above about {bound:.2f} MiB"
        )
    return Q


def fit_chain(data: FitData, start: Params | None = None, rounds: int = ROUNDS) -> Params:
    """Alternate the R, T0 and Q stages; a parameter the data cannot give stays None."""
    reasons: dict[str, str] = {}
    try:
        R = fit_R(data.zero_gap, start or Params(), start.R if start else None)
    except FitError as e:
        why = str(e)
        return Params(reasons={"R": why, "T0": f"needs R ({why})", "Q": f"needs R ({why})"})
    p = replace(start, R=R) if start else Params(R=R)
    Q = p.Q
    if Q is None and len(data.isolated):
        Q = q_start(data.isolated, R)
    for _ in range(rounds):
        reasons = {}
        try:
            t0_fixed, rate = fit_T0(
                concat(plateau(data.periodic, R), data.isolated), R, Q, p if p.has_T0 else None
            )
            p = replace(p, t0_fixed=t0_fixed, issue_rate=rate)
        except FitError as e:
            return Params(R=R, reasons={"T0": str(e), "Q": f"needs T0 ({e})"})
        try:
            Q = fit_Q(data.isolated, R, p, Q)
        except FitError as e:
            reasons["Q"] = str(e)
            Q = None
        p = replace(p, Q=Q)
        R = fit_R(data.zero_gap, p, R)
        p = replace(p, R=R)
    return replace(p, reasons=reasons)


def concat(a: Recs, b: Recs) -> Recs:
    return Recs(
        a.ids + b.ids,
        a.study + b.study,
        a.kind + b.kind,
        *(np.concatenate([getattr(a, k), getattr(b, k)]) for k in "KVBGy"),
        a.samples + b.samples,
        a.series + b.series,
    )


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
        t0_fixed, rate = fit_T0(recs, pooled.R, Q if Q is not None else pooled.Q, pooled)
        T0 = t0_fixed + T0_REFERENCE_B / rate
    except FitError as e:
        reasons["T0"] = str(e)
    return PerK(R, Q, T0, reasons)


# ---- loading -------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    data: FitData
    backend: str
    counts: dict
    sm_count: int | None  # from the raw files' environment, for a profile without a base


def _is_reference(point: dict) -> bool:
    return all(point.get(k, v) == v for k, v in REFERENCE_STORES.items())


def load(raw_paths: list[str]) -> Loaded:
    """Read raw microbench files; sort their records into the fit's roles and count the rest."""
    backends: dict[str, str] = {}
    counts = {
        "used": 0,
        "local": 0,
        "other_stores": 0,
        "ceiling": 0,
        "failed": dict.fromkeys(FAILED_STATUSES, 0),
    }
    periodic, isolated, sm_count = [], [], None
    for path in raw_paths:
        doc = read_raw(path)
        if doc["experiment"] != "microbench":
            raise ValueError(f"{path}: experiment '{doc['experiment']}' is not microbench")
        backends[str(path)] = doc["backend"]
        env = doc["environment"]
        sm_count = (
            sm_count
            or env.get("hardware_profile", {}).get("sm_count")
            or next((g["sm_count"] for g in env.get("gpus", [])), None)
        )
        for r in doc["records"]:
            point = r["point"]
            if r["status"] != "ok":
                counts["failed"][r["status"]] += 1
            elif point["kind"] == "ceiling":
                counts["ceiling"] += 1
            elif point.get("dest", "peer") != "peer":
                counts["local"] += 1
            elif not _is_reference(point):
                counts["other_stores"] += 1
            else:
                if not r["samples"].get("t_iss_slowest_us"):
                    raise ValueError(f"{path}: record '{r['id']}' has no t_iss_slowest_us samples")
                counts["used"] += 1
                (periodic if point["kind"] == "periodic" else isolated).append(r)
    if len(set(backends.values())) > 1:
        raise ValueError(f"raw files from different backends cannot be fitted together: {backends}")
    zero_gap = [
        r
        for r in periodic
        if r["point"].get("gap_us", 0.0) == 0.0 and r["samples"].get("period_us")
    ]
    data = FitData(
        _recs(zero_gap, "period_us"),
        _recs(periodic, "t_iss_slowest_us"),
        _recs(isolated, "t_iss_slowest_us"),
    )
    backend = next(iter(backends.values()), "none")
    return Loaded(data, backend, counts, sm_count)


# ---- bootstrap -----------------------------------------------------------------------


def _boot_medians(recs: Recs, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, records): the median of a resample of each record's own samples."""
    out = np.empty((n, len(recs)))
    for j, s in enumerate(recs.samples):
        out[:, j] = np.median(rng.choice(s, size=(n, s.size)), axis=1)
    return out


def bootstrap(data: FitData, pooled: Params, Ks: list[float], n: int, seed: int) -> dict:
    """Replicates of every pooled and per-K parameter (NaN where a replicate has none)."""
    rng = np.random.default_rng(seed)
    roles = ("zero_gap", "periodic", "isolated")
    medians = {role: _boot_medians(getattr(data, role), n, rng) for role in roles}
    keys = ["R", "Q", "t0_fixed", "issue_rate"] + [
        f"{q}@{K:g}" for K in Ks for q in ("R", "Q", "T0")
    ]
    reps = {k: np.full(n, np.nan) for k in keys}
    for b in range(n):
        picked = {}
        for role in roles:
            recs = getattr(data, role)
            idx = rng.integers(0, len(recs), len(recs))
            picked[role] = recs.take(idx, medians[role][b, idx])
        d = FitData(**picked)
        p = fit_chain(d, start=pooled, rounds=2)
        for k in ("R", "Q", "t0_fixed", "issue_rate"):
            reps[k][b] = np.nan if getattr(p, k) is None else getattr(p, k)
        for K in Ks:
            k = fit_per_K(d, p, K)
            for q, v in (("R", k.R), ("Q", k.Q), ("T0", k.T0_ref)):
                reps[f"{q}@{K:g}"][b] = np.nan if v is None else v
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


# ---- validation ----------------------------------------------------------------------


def held_out(record_id: str) -> bool:
    """Deterministic split: about HOLDOUT_PERCENT% of ids, by hash, never fitted."""
    return int(hashlib.sha256(record_id.encode()).hexdigest()[:8], 16) % 100 < HOLDOUT_PERCENT


def validate(data: FitData) -> tuple[list[dict], dict]:
    """Fit without the held-out records, then predict every record's t_iss_slowest."""

    def split(recs: Recs) -> Recs:
        return recs.where([not held_out(i) for i in recs.ids])

    p = fit_chain(FitData(split(data.zero_gap), split(data.periodic), split(data.isolated)))
    rows: list[dict] = []
    if p.R is None or not p.has_T0:
        why = p.reasons.get("T0") or p.reasons.get("R")
        return rows, {
            "n": 0,
            "median_abs_rel_error": None,
            "p90_abs_rel_error": None,
            "reason": f"no training fit: {why}",
        }
    for recs, periodic in ((data.periodic, True), (data.isolated, False)):
        T0 = p.T0(recs.B)
        if periodic:
            pred = (
                laws.train_issue_time(T0, recs.G, recs.V, p.R, p.Q)
                if p.Q is not None
                else laws.issue_time(T0, recs.G, recs.V, p.R)
            )
        elif p.Q is not None:
            pred = laws.isolated_issue_time(T0, recs.V, p.Q, p.R)
        else:
            continue  # no Q, no isolated-law prediction
        for j, rid in enumerate(recs.ids):
            rows.append(
                {
                    "id": rid,
                    "study": recs.study[j],
                    "kind": recs.kind[j],
                    "K": int(recs.K[j]),
                    "V": int(recs.V[j]),
                    "gap_us": float(recs.G[j]),
                    "dest": "peer",
                    "metric": "t_iss_slowest_us",
                    "measured_us": float(recs.y[j]),
                    "predicted_us": float(pred[j]),
                    "rel_error": float((pred[j] - recs.y[j]) / recs.y[j]),
                    "held_out": held_out(rid),
                }
            )
    errors = np.abs([r["rel_error"] for r in rows if r["held_out"]])
    summary = {
        "n": int(errors.size),
        "median_abs_rel_error": float(np.median(errors)) if errors.size else None,
        "p90_abs_rel_error": float(np.quantile(errors, 0.9)) if errors.size else None,
    }
    return rows, summary


# ---- checks --------------------------------------------------------------------------


def _check(passed: bool | None, detail: str) -> dict:
    """passed is None where the data cannot answer the question; the detail says why."""
    return {"passed": None if passed is None else bool(passed), "detail": detail}


def check_split_consistency(zg: Recs, p: Params) -> dict:
    """Do the K/B splits of one V drain at one R? Each split's V/period with its CI."""
    if p.R is None:
        return _check(None, "not evaluated: no R")
    drain_bound = zg.V / p.R > 1.2 * (p.T0(zg.B) if p.has_T0 else 0.0)
    recs = zg.where(drain_bound)
    order = np.argsort(recs.V)
    groups: list[list[int]] = []
    for j in order:  # V within 1% is one V (each split rounds V to K*B)
        if groups and recs.V[j] <= recs.V[groups[-1][0]] * 1.01:
            groups[-1].append(j)
        else:
            groups.append([j])
    lines, bad = [], []
    for g in groups:
        if len(set(recs.K[g])) < 2:
            continue
        lows, highs, parts = [], [], []
        for j in g:
            lo, hi = bootstrap_median_ci(recs.samples[j])
            R_j = recs.V[j] / recs.y[j] / 1e3
            lows.append(min(recs.V[j] / hi / 1e3, R_j * (1 - SPLIT_CI_FLOOR)))
            highs.append(max(recs.V[j] / lo / 1e3, R_j * (1 + SPLIT_CI_FLOOR)))
            parts.append(f"K={recs.K[j]:g} ({recs.study[j]}): {R_j:.1f}")
        agree = max(lows) <= min(highs)
        line = f"V={recs.V[g[0]] / MiB:.2f} MiB: " + ", ".join(parts) + " GB/s"
        lines.append(line)
        if not agree:
            bad.append(line)
    if not lines:
        return _check(None, "not evaluated: no V was measured with two K/B splits at G=0")
    if bad:
        return _check(
            False, f"{len(bad)} of {len(lines)} V disagree beyond their CIs: " + "; ".join(bad)
        )
    return _check(True, f"{len(lines)} V, every K/B split within CIs: " + "; ".join(lines))


def check_t0_plateau_flat(periodic: Recs, p: Params) -> dict:
    """Is the issue time flat over the gaps that drain the whole burst?"""
    if p.R is None:
        return _check(None, "not evaluated: no R")
    plat = plateau(periodic, p.R)
    spreads = []
    for name in sorted(set(plat.series)):
        y = plat.y[[s == name for s in plat.series]]
        if y.size >= 2:
            spreads.append(((y.max() - y.min()) / np.median(y), name, y.size))
    if not spreads:
        return _check(None, "not evaluated: no series with two gaps beyond V/R")
    worst = max(spreads)
    flat = worst[0] <= PLATEAU_TOLERANCE
    return _check(
        flat,
        f"{len(spreads)} series; largest spread over the plateau "
        f"{worst[0]:.1%} ({worst[1]}, {worst[2]} gaps); tolerance "
        f"{PLATEAU_TOLERANCE:.0%}",
    )


def check_one_Q(per_K: list[dict]) -> dict:
    """Does one Q explain the isolated bursts of every K, or does Q grow with K?"""
    qs = [(k["K"], k["Q_bytes"]) for k in per_K if k["Q_bytes"]["value"] is not None]
    if len(qs) < 2:
        return _check(None, "not evaluated: Q fitted for fewer than two K")
    values = np.array([q["value"] for _, q in qs])
    lows = [q["ci_low"] if q["ci_low"] is not None else q["value"] for _, q in qs]
    highs = [q["ci_high"] if q["ci_high"] is not None else q["value"] for _, q in qs]
    spread = (values.max() - values.min()) / np.median(values)
    listing = ", ".join(
        f"K={K}: {q['value'] / MiB:.2f} MiB ({q['value'] / K / 1024:.1f} KiB per producer)"
        for K, q in qs
    )
    if max(lows) <= min(highs) or spread <= ONE_Q_TOLERANCE:
        return _check(True, f"one Q within CIs or {ONE_Q_TOLERANCE:.0%}: {listing}")
    grows = bool(np.all(np.diff(values) > 0))
    hint = (
        " Q grows with K: a per-producer window describes the knee better than one shared Q."
        if grows
        else ""
    )
    return _check(False, f"per-K Q disagree (spread {spread:.0%}): {listing}.{hint}")


# ---- output --------------------------------------------------------------------------


def _profile_yaml(
    p: Params, dataset: str, sources: list[str], base_path: str | None, sm_count: int | None
) -> str:
    """A hardware profile with the fitted parameters; what was not fitted says so."""
    fitted = {
        "t0_fixed_us": None if p.t0_fixed is None else round(p.t0_fixed, 4),
        "issue_rate_per_sm_GBps": None if p.issue_rate is None else round(p.issue_rate / 1e3, 2),
        "drain_rate_GBps": None if p.R is None else round(p.R / 1e3, 2),
        "capacity_bytes": None if p.Q is None else round(p.Q),
    }
    base = load_profile(base_path).as_dict() if base_path else {}
    names = ", ".join(Path(s).name for s in sources)
    prof = {"name": f"{dataset} (fitted)", "source": f"fit of {dataset}: {names}"}
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
    if not base_path:
        header.append("# No base profile: keys the fit does not give are absent.")
    return "\n".join(header + notes) + "\n" + yaml.safe_dump(prof, sort_keys=False)


def _reason_key(profile_key: str) -> str:
    return {"drain_rate_GBps": "R", "capacity_bytes": "Q"}.get(profile_key, "T0")


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
    """Fit T0, R, Q from raw microbench files; write model/burst_gap.json and profile.yaml."""
    loaded = load(raw_paths)
    data = loaded.data
    pooled = fit_chain(data)
    Ks = sorted(set(data.zero_gap.K) | set(data.periodic.K) | set(data.isolated.K))
    reps = bootstrap(data, pooled, Ks, n_bootstrap, seed) if pooled.R is not None else {}
    why = pooled.reasons
    params = {
        "R_GBps": _param(pooled.R, reps.get("R"), 1e-3, why.get("R")),
        "Q_bytes": _param(pooled.Q, reps.get("Q"), 1.0, why.get("Q")),
        "t0_fixed_us": _param(pooled.t0_fixed, reps.get("t0_fixed"), 1.0, why.get("T0")),
        "issue_rate_per_sm_GBps": _param(
            pooled.issue_rate, reps.get("issue_rate"), 1e-3, why.get("T0")
        ),
    }
    per_K = []
    for K in Ks:
        k = (
            fit_per_K(data, pooled, K)
            if pooled.R is not None
            else PerK(None, None, None, {q: f"needs R ({why['R']})" for q in ("R", "Q", "T0")})
        )
        per_K.append(
            {
                "K": int(K),
                "R_GBps": _param(k.R, reps.get(f"R@{K:g}"), 1e-3, k.reasons.get("R")),
                "Q_bytes": _param(k.Q, reps.get(f"Q@{K:g}"), 1.0, k.reasons.get("Q")),
                "T0_us": _param(k.T0_ref, reps.get(f"T0@{K:g}"), 1.0, k.reasons.get("T0")),
            }
        )
    validation, summary = validate(data)
    result = {
        "dataset": dataset,
        "backend": loaded.backend,
        "sources": [str(p) for p in raw_paths],
        "params": params,
        "per_K": per_K,
        "T0_reference_B_bytes": T0_REFERENCE_B,
        "records": loaded.counts,
        "fit": {
            "n_bootstrap": n_bootstrap,
            "seed": seed,
            "holdout_percent": HOLDOUT_PERCENT,
            "reference_stores": REFERENCE_STORES,
        },
        "validation": validation,
        "validation_summary": summary,
        "checks": {
            "split_consistency": check_split_consistency(data.zero_gap, pooled),
            "t0_plateau_flat": check_t0_plateau_flat(data.periodic, pooled),
            "one_Q_explains_isolated": check_one_Q(per_K),
        },
    }
    atomic_write_text(out_json, json.dumps(result, indent=1) + "\n")
    atomic_write_text(
        out_profile,
        _profile_yaml(pooled, dataset, result["sources"], base_profile, loaded.sm_count),
    )
    return result
