"""The capacity law Q(K) = S + K q, and its fit to the knees of the isolated bursts.

This module exists so that what the capacity is (laws.capacity), which of its variants a
fit uses and how the two numbers are fitted sit apart from the other stages (stages.py).

Three variants of one law, each a full fit of its own (validation.py chooses among them by
held-out error):
- "shared": q = 0, one capacity S shared by the path (the paper's Q);
- "window": S = 0, a window q per producer (the knee grows in proportion to K);
- "shared_plus_window": both, S >= 0 and q >= 0.

The fit is robust: residuals are relative, and beyond ROBUST_SCALE they count linearly
(soft_l1), so that no single burst can set the capacity, as one record set the old shared
Q at the top of its own interval. It starts from several points (the knees and floors of
each K, the previous round's values) and keeps the best, so a local minimum of the knee's
max() does not decide it either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from xstage_bench.model import laws
from xstage_bench.model.records import Recs

SHARED, WINDOW, BOTH = "shared", "window", "shared_plus_window"
LAWS = (SHARED, WINDOW, BOTH)  # fewest free numbers first
FREE = {SHARED: ("S",), WINDOW: ("q",), BOTH: ("S", "q")}
ROBUST_SCALE = 0.05  # relative residuals beyond 5% count linearly (soft_l1)
MiB = float(1 << 20)
KiB = 1024.0
UNIT = {"S": MiB, "q": KiB}  # what the solver moves in, so both steps are of one size


class CapacityError(ValueError):
    """The isolated bursts cannot give the capacity; the message says why."""


@dataclass(frozen=True)
class Capacity:
    """One variant's capacity: Q(K) = S + K q (bytes; q per producer)."""

    law: str
    S: float
    q: float

    def at(self, K) -> np.ndarray:
        return laws.capacity(K, self.S, self.q)


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
    number, least squares for both, never below zero."""
    K = np.array(list(points))
    Q = np.maximum(np.array(list(points.values())), 0.0)
    if law == SHARED:
        return Capacity(law, float(np.median(Q)), 0.0)
    if law == WINDOW:
        return Capacity(law, 0.0, float(np.median(Q / K)))
    if len(K) < 2:
        return Capacity(law, float(Q[0]), 0.0)
    q, S = np.polyfit(K, Q, 1)
    return Capacity(law, float(max(S, 0.0)), float(max(q, 0.0)))


def _starts(iso: Recs, R: float, law: str, previous: Capacity | None) -> list[Capacity]:
    found = [knees(iso, R), held(iso, R)]
    starts = [law_through(points, law) for points in found]
    if law == BOTH:  # from each special case too
        starts += [law_through(points, other) for points in found for other in (SHARED, WINDOW)]
        starts = [Capacity(BOTH, c.S, c.q) for c in starts]
    if previous is not None:
        starts.append(Capacity(law, previous.S, previous.q))
    return starts


def fit(
    iso: Recs, R: float, T0: np.ndarray, law: str, previous: Capacity | None = None
) -> Capacity:
    """The variant's S and q from isolated bursts: T_iss = max(T0, (V - Q(K))/R).

    T0 is each burst's backpressure-free issue time. Raises CapacityError where fewer than
    two bursts stall beyond T0 with the fitted capacity (the knee is not measured).
    """
    if len(iso) == 0:
        raise CapacityError("no isolated-burst records (study 'isolated')")
    if law not in LAWS:
        raise ValueError(f"unknown capacity law {law!r}; one of {', '.join(LAWS)}")
    free = FREE[law]
    floor = float(np.min(iso.V / np.maximum(iso.K, 1.0))) * 1e-3  # least_squares needs > 0

    def capacity(x) -> Capacity:
        values = {name: float(v) * UNIT[name] for v, name in zip(x, free, strict=True)}
        return Capacity(law, values.get("S", 0.0), values.get("q", 0.0))

    def residuals(x) -> np.ndarray:
        return (np.maximum(T0, (iso.V - capacity(x).at(iso.K)) / R) - iso.y) / iso.y

    best = None
    for start in _starts(iso, R, law, previous):
        x0 = [max(getattr(start, name), floor) / UNIT[name] for name in free]
        result = least_squares(
            residuals,
            x0,
            bounds=(0.0, np.inf),
            loss="soft_l1",
            f_scale=ROBUST_SCALE,
            x_scale="jac",
        )
        if best is None or result.cost < best.cost:
            best = result
    found = capacity(best.x)
    stalled = (iso.V - found.at(iso.K)) / R > 1.1 * T0
    if np.count_nonzero(stalled) < 2:
        raise CapacityError(
            "fewer than two isolated bursts stall beyond T0, so the knee is not measured: "
            f"the capacity is above about {_bound(iso, R, T0)}"
        )
    return found


def _bound(iso: Recs, R: float, T0: np.ndarray) -> str:
    return ", ".join(
        f"{float(np.max((iso.V - R * T0)[iso.K == K])) / MiB:.2f} MiB at K={K:g}"
        for K in np.unique(iso.K)
    )


def describe(c: Capacity) -> str:
    """'S 1.02 MiB + K x 15.1 KiB' and the like, for details and notes."""
    parts = []
    if c.law != WINDOW:
        parts.append(f"S {c.S / MiB:.2f} MiB")
    if c.law != SHARED:
        parts.append(f"K x {c.q / KiB:.1f} KiB")
    return " + ".join(parts)
