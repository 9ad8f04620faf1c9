"""The fit's stages: T0, R and the capacity law, each a small scipy least-squares fit on
relative residuals of per-record medians, and the chain that alternates them.

This module exists so that the arithmetic of the fit can be read apart from what the
model file holds (fit.py), its confidence intervals (bootstrap.py) and its held-out
validation (validation.py); all three call these stages.

- R from zero-gap periodic bursts: period = max(T0, V/R);
- T0 = t0_fixed + B/issue_rate from bursts that meet an empty path (the large-G plateau
  and isolated bursts), with the isolated law max(T0, stall) (laws.stall_time) so that
  bursts beyond the knee do not bias it;
- the capacity Q(K) = min(S + K q, C) from the isolated-burst knees, in one of its
  variants (capacity.py: shared, window, shared_plus_window, capped), and with it the
  drain's lag beyond the knee (capacity.fit_with_lag, Params.lag).

The stages depend on each other (R's fit needs T0 where a burst is issue-bound, T0's needs
Q, Q's needs T0 and R), so fit_chain alternates them a few rounds from a robust start;
where a capacity leaves no burst backpressure-free for T0 (isolated bursts that drain
slower than R pull the knee towards 0), T0 is fitted again with what each K's bursts are
seen to hold (capacity.held), and a T0 that still cannot be fitted is None with its
reason, never a guess.
fit_per_K gives one K's own numbers with the others held at the pool's: R as the slope of
its zero-gap periods over V (period = V/R + c), its knee Q and its T0.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import least_squares

from xstage_bench.model import capacity, laws
from xstage_bench.model.capacity import NO_LAG, SHARED, Capacity, CapacityError, DrainLag
from xstage_bench.model.records import FitData, Recs, concat, plateau, waves

T0_REFERENCE_B = 32768  # per-K T0 is reported at the paper's B = 32 KB per producer
PER_BURST, PER_WAVE = "per_burst", "per_wave"  # T0's laws (Params.t0_per_wave)
ROUNDS = 4
# The issue rate's upper bound, bytes/us per producer (10 TB/s): no SM stores faster than
# its L1 takes stores (128 B/clk, ~0.25 TB/s at 2 GHz), so a measured rate never meets
# it; where the records are flat in B the gradient is too, and without a bound the rate
# ran off to ~1e15 GB/s.
MAX_ISSUE_RATE = 1e7


class FitError(ValueError):
    """A parameter the data cannot determine; the message says why."""


@dataclass(frozen=True)
class Params:
    """One fit's result; a None parameter carries its reason.

    capacity is the law's S, q and C (capacity.py), None where the knee was not measured;
    lag is the drain's lag beyond the knee (laws.stall_time), NO_LAG with no capacity.
    """

    R: float | None = None  # bytes/us
    t0_fixed: float | None = None  # us
    issue_rate: float | None = None  # bytes/us per producer
    capacity: Capacity | None = None
    law: str = SHARED
    reasons: dict = field(default_factory=dict)
    lag: DrainLag = NO_LAG  # the drain's lag beyond the knee, fitted with the capacity
    # T0's law: t0_fixed once per burst (False), or once per producer an SM runs (True:
    # ceil(K / SMs) x t0_fixed, where more producers than SMs share them); _T0_stage chooses
    t0_per_wave: bool = False

    def T0(self, B, waves=None) -> np.ndarray:
        """t0_fixed + B / issue rate; waves, ceil(K / SMs) per burst, scale t0_fixed in
        the per-wave law (None: one)."""
        fixed = self.t0_fixed
        if self.t0_per_wave and waves is not None:
            fixed = fixed * np.asarray(waves, dtype=float)
        return fixed + np.asarray(B, dtype=float) / self.issue_rate

    def T0_of(self, recs: Recs) -> np.ndarray:
        """Each record's T0, at its B and its producers per SM."""
        return self.T0(recs.B, waves(recs))

    def Q(self, K) -> np.ndarray | None:
        """The capacity a burst of K producers meets, per record (laws.capacity)."""
        if self.capacity is None:
            return None
        return self.capacity.at(np.asarray(K, dtype=float))

    @property
    def has_T0(self) -> bool:
        return self.t0_fixed is not None


def _solve(residuals, x0, lower, upper=np.inf):
    return least_squares(residuals, x0, bounds=(lower, upper), x_scale="jac")


def fit_R(zg: Recs, p: Params, R0: float | None = None) -> float:
    """Drain rate (bytes/us) from zero-gap periods: period = max(T0, V/R)."""
    if len(zg) == 0:
        raise FitError("no zero-gap periodic records (study 'drain' or a gap sweep at G=0)")
    T0 = p.T0_of(zg) if p.has_T0 else 0.0
    x0 = (R0 or float(np.median(zg.V / zg.y))) / 1e3
    x = _solve(lambda x: (np.maximum(T0, zg.V / (x[0] * 1e3)) - zg.y) / zg.y, [x0], [1e-9]).x
    return float(x[0] * 1e3)


def fit_T0(
    recs: Recs,
    R: float,
    Q: np.ndarray | None,
    start: Params | None = None,
    others: tuple[Params, ...] = (),
    lag: DrainLag = NO_LAG,
    per_wave: bool = False,
) -> tuple:
    """(t0_fixed_us, issue_rate bytes/us) from bursts on an empty path, isolated law.

    Q is the capacity each record's burst meets (None: no stall is modelled), lag the
    drain's beyond it (laws.stall_time) and per_wave T0's law (Params.t0_per_wave). The fit
    starts from each of _T0_starts (start: the previous round's; others: other fits' T0,
    e.g. the other capacity variants') and keeps the least cost: where the rate's gradient
    is flat (a rate so high that B/rate is nothing beside t0_fixed) one start cannot leave,
    so no single start decides it.
    """
    return _fit_T0(recs, R, Q, start, others, lag, per_wave)[:2]


def _fit_T0(recs, R, Q, start, others, lag, per_wave) -> tuple[float, float, float]:
    """fit_T0's t0_fixed and issue rate, and the least cost they leave."""
    stall = (
        laws.stall_time(recs.V, Q, R, lag.fraction, lag.rate)
        if Q is not None
        else np.full(len(recs), -np.inf)
    )
    free = stall < 0.8 * recs.y  # clearly issue-bound
    if len(np.unique(recs.B[free])) < 2:
        raise FitError(
            "T0 needs backpressure-free bursts of at least two sizes B per "
            "producer (plateau or isolated records)"
        )

    fixed_per = waves(recs) if per_wave else 1.0

    def residuals(x) -> np.ndarray:
        return (np.maximum(x[0] * fixed_per + recs.B / (x[1] * 1e3), stall) - recs.y) / recs.y

    best = None
    for t0_fixed, rate in _T0_starts(recs, free, (start, *others)):
        result = _solve(
            residuals, [t0_fixed, rate / 1e3], [0.0, 1e-9], [np.inf, MAX_ISSUE_RATE / 1e3]
        )
        if best is None or result.cost < best.cost:
            best = result
    return float(best.x[0]), float(best.x[1] * 1e3), float(best.cost)


def _T0_starts(recs: Recs, free: np.ndarray, fits: tuple) -> list[tuple[float, float]]:
    """(t0_fixed us, issue_rate bytes/us) starts, each once and within the rate's bounds:
    each fit's own T0; the straight line through the issue-bound bursts where it rises
    with B (flat or falling, its rate is infinite); and t0_fixed ~ 0 with the median
    B / T_iss of those bursts, the lowest rate they allow, so that one finite start is
    always there."""
    starts = [(p.t0_fixed, p.issue_rate) for p in fits if p is not None and p.has_T0]
    slope, intercept = np.polyfit(recs.B[free], recs.y[free], 1)
    if slope > 0:
        starts.append((max(intercept, 1e-3), 1.0 / slope))
    starts.append((1e-3, float(np.median(recs.B[free] / recs.y[free]))))
    within = [(max(t, 0.0), min(max(r, 1e-3), MAX_ISSUE_RATE)) for t, r in starts]
    return list(dict.fromkeys(within))


def _drain_beyond_knee(iso: Recs) -> float | None:
    """The isolated bursts' drain rate beyond the knee (bytes/us): the slope of V over
    T_iss in the top third of V, where the law is (V - Q)/R; None with one T_iss there."""
    top = iso.V >= np.quantile(iso.V, 2 / 3)
    if len(np.unique(iso.y[top])) < 2:
        return None
    return float(np.polyfit(iso.y[top], iso.V[top], 1)[0])


def fit_chain(
    data: FitData,
    start: Params | None = None,
    rounds: int = ROUNDS,
    law: str = SHARED,
    t0_starts: tuple[Params, ...] = (),
) -> Params:
    """Alternate the R, T0 and capacity stages; a parameter the data cannot give stays None.

    `law` is the capacity variant (capacity.LAWS); a start carries its own. t0_starts are
    other fits whose T0 every round's T0 stage starts from too (fit_T0).
    """
    reasons: dict[str, str] = {}
    try:
        R = fit_R(data.zero_gap, start or Params(), start.R if start else None)
    except FitError as e:
        why = str(e)
        return Params(
            law=law,
            reasons={"R": why, "T0": f"needs R ({why})", "Q": f"needs R ({why})"},
        )
    p = replace(start, R=R) if start else Params(R=R, law=law)
    cap = p.capacity
    if cap is None and len(data.isolated):
        cap = capacity.law_through(capacity.knees(data.isolated, R), p.law)
    for round_ in range(rounds):
        reasons = {}
        try:
            # T0's law is chosen in a chain's first round (held after: R and Q barely move)
            choose = start is None and round_ == 0
            p = _T0_stage(data, R, replace(p, capacity=cap), t0_starts, choose)
        except FitError as e:
            return Params(R=R, law=p.law, reasons={"T0": str(e), "Q": f"needs T0 ({e})"})
        try:
            # After a first round that searched every start (or a round without a capacity).
            later = round_ > 0 and cap is not None
            cap, lag = capacity.fit_with_lag(
                data.isolated, R, p.T0_of(data.isolated), p.law, cap, p.lag, later
            )
        except CapacityError as e:
            reasons["Q"] = str(e)
            cap, lag = None, NO_LAG
        p = replace(p, capacity=cap, lag=lag)
        R = fit_R(data.zero_gap, p, R)
        p = replace(p, R=R)
    return replace(p, reasons=reasons)


def fit_laws(data: FitData, laws: tuple[str, ...] = capacity.LAWS) -> dict[str, Params]:
    """Every capacity variant's chain, fewest free numbers first, each T0 stage started
    from the T0 of the variants fitted before it too: a capacity low at small K leaves few
    bursts backpressure-free, and their own line may not rise with B where the shared
    law's T0 is a start the T0 stage keeps only if it fits better (fit_T0)."""
    fits: dict[str, Params] = {}
    for law in laws:
        fits[law] = fit_chain(data, law=law, t0_starts=tuple(fits.values()))
    return fits


def t0_records(data: FitData, R: float) -> Recs:
    """The bursts T0 is fitted on: those that meet an empty path (a gap that drains the
    burst, or alone); the T0 stage keeps the clearly backpressure-free ones."""
    return concat(plateau(data.periodic, R), data.isolated)


def _T0_stage(
    data: FitData, R: float, p: Params, others: tuple[Params, ...] = (), choose: bool = True
) -> Params:
    """T0 fitted with the chain's capacity, or where that leaves too few bursts
    backpressure-free, with what each K's bursts are seen to hold.

    choose: where some burst has more producers than SMs, T0's law (Params.t0_per_wave)
    is the one of least cost; both have the same two free numbers, so the cost compares
    them fairly. Otherwise (a bootstrap replicate) p's law is kept.

    A capacity below what the bursts hold makes bursts that never stalled stall in the
    isolated law, and with Q ~ 0 none is left backpressure-free for T0: a knee start that
    is low gives that where the bursts beyond the knee drain slower than R, and so can the
    capacity's fit. capacity.held is a floor the records measure whatever the drain rate
    (a K without isolated bursts takes the lowest K's floor).
    """
    recs = t0_records(data, R)
    tries = [("the law's", p.Q(recs.K))]  # None: no capacity, no stall modelled
    if len(data.isolated):
        floors = capacity.held(data.isolated, R)
        lowest = min(floors.values())
        tries.append(("held", np.array([floors.get(float(K), lowest) for K in recs.K])))
    error = ""
    for name, Q in tries:
        try:
            lag = p.lag if name == "the law's" else NO_LAG
            start = p if p.has_T0 else None
            T0_laws = (False, True) if choose and np.any(waves(recs) > 1) else (p.t0_per_wave,)
            fits = [(*_fit_T0(recs, R, Q, start, others, lag, w), w) for w in T0_laws]
            t0_fixed, rate, _, per_wave = min(fits, key=lambda f: f[2])
            return replace(p, t0_fixed=t0_fixed, issue_rate=rate, t0_per_wave=per_wave)
        except FitError as e:
            error = str(e)
    if tries[-1][0] == "held":
        error += (
            f"; with the capacity each K's bursts are seen to hold and R = {R / 1e3:.1f} GB/s"
            ", fewer are"
        )
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
    c: float | None = None  # us: the intercept of the K's zero-gap periods over V


def slope_R(zg: Recs, p: Params) -> tuple[float, float]:
    """(R, c) of one K/B split: its zero-gap periods over V as period = V/R + c.

    Only drain-bound records count (V/R above 1.2 T0 where T0 is fitted), weighted by
    1/period so that each period's relative error counts alike; a fixed cost per burst
    (the intercept c) then does not bias R as it biases V/period at small V.
    """
    bound = zg.where(zg.V / p.R > 1.2 * p.T0_of(zg)) if p.has_T0 and p.R else zg
    if len(np.unique(bound.V)) < 2:
        raise FitError(
            f"R's slope needs drain-bound zero-gap periods at two V or more "
            f"({len(np.unique(bound.V))} here)"
        )
    slope, c = np.polyfit(bound.V, bound.y, 1, w=1.0 / bound.y)
    if slope <= 0:
        raise FitError("the zero-gap periods do not grow with V")
    return float(1.0 / slope), float(c)


def fit_per_K(data: FitData, pooled: Params, K: float) -> PerK:
    """One K's R (slope_R), knee Q (a capacity of its own) and T0, the other parameters
    held at the pool's."""
    reasons = {}
    R = Q = T0 = c = None
    try:
        R, c = slope_R(data.zero_gap.where(data.zero_gap.K == K), pooled)
    except FitError as e:
        reasons["R"] = str(e)
    if pooled.R is None or not pooled.has_T0:
        reasons["Q"] = reasons["T0"] = "needs the pooled R and T0"
        return PerK(R, Q, T0, reasons, c)
    iso = data.isolated.where(data.isolated.K == K)
    previous = None if pooled.capacity is None else Capacity(SHARED, float(pooled.Q(K)), 0.0)
    try:
        if len(iso) == 0:
            raise CapacityError(f"no isolated bursts at K={K:g}")
        Q = capacity.fit(iso, pooled.R, pooled.T0_of(iso), SHARED, previous, pooled.lag).S
    except CapacityError as e:
        reasons["Q"] = str(e)
    plat = plateau(data.periodic, pooled.R)
    recs = concat(plat.where(plat.K == K), iso)
    try:
        if len(recs) == 0:
            raise FitError(f"no plateau or isolated records at K={K:g}")
        Q_K = Q if Q is not None else (None if previous is None else previous.S)
        Q_recs = None if Q_K is None else np.full(len(recs), Q_K)
        per_wave = pooled.t0_per_wave
        t0_fixed, rate = fit_T0(recs, pooled.R, Q_recs, pooled, lag=pooled.lag, per_wave=per_wave)
        T0 = float(
            replace(pooled, t0_fixed=t0_fixed, issue_rate=rate).T0(T0_REFERENCE_B, waves(recs)[0])
        )
    except FitError as e:
        reasons["T0"] = str(e)
    return PerK(R, Q, T0, reasons, c)
