"""The fit's stages: T0, R and Q, each a small scipy least-squares fit on relative
residuals of per-record medians, and the chain that alternates them.

This module exists so that the arithmetic of the fit can be read apart from what the
model file holds (fit.py), its confidence intervals (bootstrap.py) and its held-out
validation (validation.py); all three call these stages.

- R from zero-gap periodic bursts: period = max(T0, V/R);
- T0 = t0_fixed + B/issue_rate from bursts that meet an empty path (the large-G plateau
  and isolated bursts), with the isolated law max(T0, (V - Q)/R) so that bursts beyond
  the knee do not bias it;
- Q from the isolated-burst knee, max(T0, (V - Q)/R): one capacity shared by the path, or
  with window=True a per-producer window q (Q = K * q).

The stages depend on each other (R's fit needs T0 where a burst is issue-bound, T0's needs
Q, Q's needs T0 and R), so fit_chain alternates them a few rounds from a robust start;
fit_per_K refits R, Q and T0 on one K's records with the others held at the pool's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import least_squares

from xstage_bench.model.records import FitData, Recs, concat, plateau

MiB = float(1 << 20)
KiB = 1024.0
T0_REFERENCE_B = 32768  # per-K T0 is reported at the paper's B = 32 KB per producer
ROUNDS = 4


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
