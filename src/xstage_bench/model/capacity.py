"""The capacity law Q(K) = min(S + K q, C), and its fit to the knees of the isolated bursts.

This module exists so that what the capacity is (laws.capacity), which of its variants a
fit uses and how its numbers are fitted sit apart from the other stages (stages.py).

Four variants of one law, each a full fit of its own (validation.py chooses among them by
held-out error):
- "shared": q = 0, one capacity S shared by the path (the paper's Q);
- "window": S = 0, a window q per producer (the knee grows in proportion to K);
- "shared_plus_window": both, S >= 0 and q >= 0;
- "capped": both up to a ceiling C of the path, min(S + K q, C) (the knee grows with K,
  then saturates). C = inf in the other three; a fitted C at or above S + K q at the
  largest K fitted binds nowhere the records reach, so it is inf too (not measured).

Beyond the knee the drain lags (DrainLag, laws.stall_time): isolated bursts just beyond
it stall less than (V - Q)/R and long ones more, as if the path held (1 - fraction) Q, on
every reference path (host and peer). fit_with_lag fits the lag with the capacity, since
the two trade against each other; fit holds it (one K's knee, stages.fit_per_K).

The fit is robust: residuals are relative, and beyond ROBUST_SCALE they count linearly
(soft_l1), so that no single burst can set the capacity, as one record set the old shared
Q at the top of its own interval. It starts from several points (the knees and floors of
each K, the previous round's values, and for the capped law a hinge at every K) and keeps
the best, so a local minimum of the knee's max() does not decide it either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares

from xstage_bench.model import laws
from xstage_bench.model.records import Recs

SHARED, WINDOW, BOTH, CAPPED = "shared", "window", "shared_plus_window", "capped"
LAWS = (SHARED, WINDOW, BOTH, CAPPED)  # fewest free numbers first
FREE = {SHARED: ("S",), WINDOW: ("q",), BOTH: ("S", "q"), CAPPED: ("S", "q", "C")}
ROBUST_SCALE = 0.05  # relative residuals beyond 5% count linearly (soft_l1)
MiB = float(1 << 20)
KiB = 1024.0
UNIT = {"S": MiB, "q": KiB, "C": MiB}  # what the solver moves in, so steps are of one size


class CapacityError(ValueError):
    """The isolated bursts cannot give the capacity; the message says why."""


@dataclass(frozen=True)
class Capacity:
    """One variant's capacity: Q(K) = min(S + K q, C) (bytes; q per producer)."""

    law: str
    S: float
    q: float
    C: float = math.inf  # the path's ceiling; inf: none (every law but capped)

    def at(self, K) -> np.ndarray:
        return laws.capacity(K, self.S, self.q, self.C)

    @property
    def capped(self) -> bool:
        return math.isfinite(self.C)


def held(iso: Recs, R: float) -> dict[float, float]:
    """Per K, the most bytes any of its isolated bursts is seen to hold: V - R T_iss.

    A burst that issued V bytes in T_iss on a path that drains at most R left at least
    that many queued, so the capacity at K is at least this, whatever the drain beyond
    the knee (a floor the records measure).
    """
    return {float(K): float(np.max((iso.V - R * iso.y)[iso.K == K])) for K in np.unique(iso.K)}


def knees(iso: Recs, R: float) -> dict[float, float]:
    """Per K, the median V - R T_iss over its top third of V: about Q(K) where the bursts
    beyond the knee drain at R (a start, never a result)."""
    out = {}
    for K in np.unique(iso.K):
        mine = iso.where(iso.K == K)
        top = mine.V >= np.quantile(mine.V, 2 / 3)
        out[float(K)] = float(np.median(mine.V[top] - R * mine.y[top]))
    return out


def law_through(points: dict[float, float], law: str) -> Capacity:
    """The variant's line through per-K capacities (a start): a median for one free
    number, least squares for both, never below zero; for the capped law, the hinge
    (hinges) that misses the points least."""
    K = np.array(list(points))
    Q = np.maximum(np.array(list(points.values())), 0.0)
    if law == SHARED:
        return Capacity(law, float(np.median(Q)), 0.0)
    if law == WINDOW:
        return Capacity(law, 0.0, float(np.median(Q / K)))
    if law == CAPPED:
        return min(hinges(points), key=lambda c: float(np.sum((c.at(K) - Q) ** 2)))
    if len(K) < 2:
        return Capacity(law, float(Q[0]), 0.0)
    q, S = np.polyfit(K, Q, 1)
    return Capacity(law, float(max(S, 0.0)), float(max(q, 0.0)))


def hinges(points: dict[float, float]) -> list[Capacity]:
    """Capped starts through per-K capacities: at each K, the line through that K and
    those below it, capped at the median capacity of the K above (the whole line, with
    no ceiling, at the largest K)."""
    ordered = dict(sorted(points.items()))
    K = list(ordered)
    out = []
    for i in range(1, len(K)):
        line = law_through({k: ordered[k] for k in K[: i + 1]}, BOTH)
        above = [max(ordered[k], 0.0) for k in K[i + 1 :]]
        C = float(np.median(above)) if above else math.inf
        out.append(Capacity(CAPPED, line.S, line.q, C))
    return out or [Capacity(CAPPED, max(ordered[K[0]], 0.0), 0.0)]


def _starts(iso: Recs, R: float, law: str, previous: Capacity | None) -> list[Capacity]:
    found = [knees(iso, R), held(iso, R)]
    starts = [law_through(points, law) for points in found]
    if law in (BOTH, CAPPED):  # from each special case too (no ceiling: it binds nowhere)
        special = (SHARED, WINDOW) if law == BOTH else (SHARED, WINDOW, BOTH)
        starts += [law_through(points, other) for points in found for other in special]
        starts = [Capacity(law, c.S, c.q, c.C) for c in starts]
    if law == CAPPED:
        starts += [c for points in found for c in hinges(points)]
    if previous is not None:
        starts.append(Capacity(law, previous.S, previous.q, previous.C))
    return list(dict.fromkeys(starts))  # each start once


@dataclass(frozen=True)
class DrainLag:
    """How the drain lags once a burst fills the path (laws.stall_time): it takes bytes at
    rate x R at first and at R a `fraction` of Q/R later, so a long burst stalls as if the
    path held (1 - fraction) Q. NO_LAG, the default, is the paper's (V - Q)/R."""

    fraction: float = 0.0
    rate: float = 1.0


NO_LAG = DrainLag()
LAG_GAIN = 0.05  # a lag must lower the robust cost of the isolated bursts by 5% to count


def fit(
    iso: Recs,
    R: float,
    T0: np.ndarray,
    law: str,
    previous: Capacity | None = None,
    lag: DrainLag = NO_LAG,
) -> Capacity:
    """The variant's S, q (and C) from isolated bursts: T_iss = max(T0, stall), the stall
    laws.stall_time with the drain's lag held at `lag` (NO_LAG: (V - Q(K))/R).

    T0 is each burst's backpressure-free issue time. Raises CapacityError where fewer than
    two bursts stall beyond T0 with the fitted capacity (the knee is not measured).
    """
    return _fit(iso, R, T0, law, previous, lag, None)[0]


def fit_with_lag(
    iso: Recs,
    R: float,
    T0: np.ndarray,
    law: str,
    previous: Capacity | None = None,
    lag: DrainLag | None = None,
    from_previous: bool = False,
) -> tuple[Capacity, DrainLag]:
    """The variant's capacity and the drain's lag together, from the same isolated bursts
    (fit): the knee sets Q, the bursts beyond it the lag, and the two trade against each
    other where a burst just beyond the knee stalls, so they are fitted at once, from each
    capacity start with each of _lag_starts. `lag` is the previous round's. from_previous:
    the lagged fit starts from the previous round's capacity and the plain fit's alone, not
    from every start (a chain's later rounds, where R and T0 have barely moved since the
    first searched them all: most of a fit's time).

    A lag is kept only where it misses the bursts less than no lag by LAG_GAIN of the
    robust cost: where no burst lies where the drain would lag (a knee the sizes skip),
    the lag and Q trade freely and a lag would be no finding."""
    plain, _, cost = _fit(iso, R, T0, law, previous, NO_LAG, None)
    near = None  # every start
    if from_previous:
        near = [plain] if previous is None else [plain, replace(previous, law=law)]
    lag_starts = _lag_starts(iso, R, lag)
    found, fitted, lagged = _fit(iso, R, T0, law, previous, lag or NO_LAG, lag_starts, near)
    return (found, fitted) if lagged < (1 - LAG_GAIN) * cost else (plain, NO_LAG)


def _lag_starts(iso: Recs, R: float, previous: DrainLag | None) -> list[DrainLag]:
    """No lag; the fraction that brings each K's floor (what its bursts are seen to hold,
    about its knee) down to what its longest bursts hold (about (1 - fraction) Q), at half
    the rate; and the previous round's lag."""
    floors, beyond = held(iso, R), knees(iso, R)
    lost = [1 - max(beyond[K], 0.0) / floors[K] for K in floors if floors[K] > 0]
    fraction = float(np.clip(np.median(lost), 0.0, 1.0)) if lost else 0.0
    starts = [NO_LAG, DrainLag(fraction, 0.5)]
    if previous is not None:
        starts.append(previous)
    return list(dict.fromkeys(starts))


def _fit(
    iso: Recs,
    R: float,
    T0: np.ndarray,
    law: str,
    previous: Capacity | None,
    lag: DrainLag,
    lag_starts: list[DrainLag] | None,
    starts: list[Capacity] | None = None,
) -> tuple[Capacity, DrainLag, float]:
    """fit and fit_with_lag: the lag held (lag_starts None) or fitted from each start
    (`starts`, _starts' by default); the capacity, the lag and the robust cost of the best
    start."""
    if len(iso) == 0:
        raise CapacityError("no isolated-burst records (study 'isolated')")
    if law not in LAWS:
        raise ValueError(f"unknown capacity law {law!r}; one of {', '.join(LAWS)}")
    free = FREE[law]
    n_free = len(free)
    floor = float(np.min(iso.V / np.maximum(iso.K, 1.0))) * 1e-3  # least_squares needs > 0
    unbound = float(np.max(iso.V))  # a ceiling no burst reaches: where "none" starts

    def capacity(x) -> Capacity:
        values = {name: float(v) * UNIT[name] for v, name in zip(x[:n_free], free, strict=True)}
        return Capacity(law, values.get("S", 0.0), values.get("q", 0.0), values.get("C", math.inf))

    def drain_lag(x) -> DrainLag:
        return lag if lag_starts is None else DrainLag(float(x[n_free]), float(x[-1]))

    def residuals(x) -> np.ndarray:
        d = drain_lag(x)
        stall = laws.stall_time(iso.V, capacity(x).at(iso.K), R, d.fraction, d.rate)
        return (np.maximum(T0, stall) - iso.y) / iso.y

    lower, upper = [0.0] * n_free, [np.inf] * n_free
    if lag_starts is not None:
        lower, upper = lower + [0.0, 0.0], upper + [1.0, 1.0]  # a fraction and a ratio
    best = None
    for start in starts or _starts(iso, R, law, previous):
        x0 = [max(min(getattr(start, name), unbound), floor) / UNIT[name] for name in free]
        for d in lag_starts or [None]:
            x = x0 if d is None else [*x0, d.fraction, min(max(d.rate, 1e-3), 1.0)]
            result = least_squares(
                residuals,
                x,
                bounds=(lower, upper),
                loss="soft_l1",
                f_scale=ROBUST_SCALE,
                x_scale="jac",
            )
            if best is None or result.cost < best.cost:
                best = result
    found = _unbound_ceiling(capacity(best.x), float(np.max(iso.K)))
    d = drain_lag(best.x)
    stalled = laws.stall_time(iso.V, found.at(iso.K), R, d.fraction, d.rate) > 1.1 * T0
    if np.count_nonzero(stalled) < 2:
        raise CapacityError(
            "fewer than two isolated bursts stall beyond T0, so the knee is not measured: "
            f"the capacity is above about {_bound(iso, R, T0)}"
        )
    return found, d, float(best.cost)


def _unbound_ceiling(c: Capacity, K_max: float) -> Capacity:
    """c with C = inf where the ceiling binds at no K fitted (S + K q stays at or below it
    up to K_max): the records do not measure it, and a start's value is no finding."""
    if c.capped and c.C >= c.S + K_max * c.q:
        return Capacity(c.law, c.S, c.q)
    return c


def _bound(iso: Recs, R: float, T0: np.ndarray) -> str:
    return ", ".join(
        f"{float(np.max((iso.V - R * T0)[iso.K == K])) / MiB:.2f} MiB at K={K:g}"
        for K in np.unique(iso.K)
    )


def describe(c: Capacity) -> str:
    """'S 1.02 MiB + K x 15.1 KiB', 'min(S 1.02 MiB + K x 15.1 KiB, C 2.60 MiB)' and the
    like, for details and notes."""
    parts = []
    if c.law != WINDOW:
        parts.append(f"S {c.S / MiB:.2f} MiB")
    if c.law != SHARED:
        parts.append(f"K x {c.q / KiB:.1f} KiB")
    line = " + ".join(parts)
    if c.law != CAPPED:
        return line
    if not c.capped:
        return f"{line} (no ceiling within the K fitted)"
    return f"min({line}, C {c.C / MiB:.2f} MiB)"
