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
where a Q leaves no burst backpressure-free for T0 (isolated bursts that drain slower than
R pull the knee's Q towards 0), T0 is fitted again with q_held, what the bursts are seen
to hold, and a T0 that still cannot be fitted is None with its reason, never a guess.
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


def q_held(iso: Recs, R: float, window: bool = False) -> float:
    """The largest Q (or q) that puts no K's capacity above what its isolated bursts are
    seen to hold, a floor that the records measure whatever the drain beyond the knee.

    A burst that issued V bytes in T_iss on a path that drains at most R left at least
    V - R*T_iss of them queued, so the capacity of its K (Q, or K*q) is at least the most
    any burst of that K held. A capacity at or below that at every K lets no burst that
    stalled pass as backpressure-free in T0's fit; the most over all K would, at the K's
    that hold less (where the variant's law is not the data's, or by noise).
    """
    return min(
        float(np.max((iso.V - R * iso.y)[iso.K == K])) / (K if window else 1.0)
        for K in np.unique(iso.K)
    )


def q_start(iso: Recs, R: float, window: bool = False) -> float:
    """A robust start for Q (or q): beyond the knee, V - R*T_iss is about Q whatever V is.

    That holds where the bursts beyond the knee drain at R. Where they drain slower (host
    bursts into pinned memory at ~0.87 R on one H200), V - R*T_iss falls with V and its
    median can be 0 or below: no estimate at all, and a start of ~0 leaves no burst
    backpressure-free for T0. The start is then q_held, what the bursts are seen to hold.
    A positive median is kept as the start (the committed references' fits begin there);
    one too low for T0 is fit_chain's to mend.
    """
    top = iso.V >= np.quantile(iso.V, 2 / 3)
    knee = float(np.median((iso.V[top] - R * iso.y[top]) / _scale(iso, window)[top]))
    floor = float(np.min(iso.V / _scale(iso, window))) * 1e-2  # least_squares needs Q > 0
    return max(knee if knee > floor else q_held(iso, R, window), floor)


def _drain_beyond_knee(iso: Recs) -> float | None:
    """The isolated bursts' drain rate beyond the knee (bytes/us): the slope of V over
    T_iss in the top third of V, where the law is (V - Q)/R; None with one T_iss there."""
    top = iso.V >= np.quantile(iso.V, 2 / 3)
    if len(np.unique(iso.y[top])) < 2:
        return None
    return float(np.polyfit(iso.y[top], iso.V[top], 1)[0])


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
            p, Q = _T0_stage(data, R, p, Q)
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


def _T0_stage(data: FitData, R: float, p: Params, Q: float | None) -> tuple[Params, float | None]:
    """T0 fitted with the chain's Q; returns it and the Q the chain goes on with.

    A Q below what the bursts are seen to hold makes bursts that never stalled stall in
    the isolated law, and with Q ~ 0 none is left backpressure-free for T0: a knee start
    that is positive but low gives that where the bursts beyond the knee drain slower than
    R (q_start), and so can fit_Q. Where T0 cannot be fitted with Q it is fitted again with
    q_held, a floor the records measure whatever the drain rate, and the chain goes on
    from it.
    """
    recs = concat(plateau(data.periodic, R), data.isolated)

    def with_Q(Q_try: float | None) -> Params:
        Q_recs = None if Q_try is None else replace(p, Q=Q_try).Q_for(recs.K)
        t0_fixed, rate = fit_T0(recs, R, Q_recs, p if p.has_T0 else None)
        return replace(p, t0_fixed=t0_fixed, issue_rate=rate)

    tries = [Q]
    held = q_held(data.isolated, R, p.window) if Q is not None and len(data.isolated) else None
    if held is not None and held > Q:
        tries.append(held)
    for Q_try in tries:
        try:
            return with_Q(Q_try), Q_try
        except FitError as e:
            error = str(e)
    if Q_try is not None:
        name, unit, unit_name = ("q", KiB, "KiB") if p.window else ("Q", MiB, "MiB")
        what = " (what the bursts are seen to hold)" if Q_try == held else ""
        error += f"; with {name} = {Q_try / unit:.3g} {unit_name}{what} and R = {R / 1e3:.1f} GB/s"
        error += ", fewer are"
    rate = _drain_beyond_knee(data.isolated) if len(data.isolated) else None
    if rate is not None and rate < R:
        error += (
            f"; the isolated bursts beyond the knee drain at about {rate / 1e3:.1f} GB/s, "
            "below R from the zero-gap periods"
        )
    raise FitError(error)


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
