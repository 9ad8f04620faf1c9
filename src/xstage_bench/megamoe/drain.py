"""The X-Stage path as a fluid: producers' stores entering a finite path that drains at R.

The path holds at most Q(K) = min(S + K q, C) outstanding bytes while K producers issue
into it (the capacity law; q = 0 is one shared capacity S, C = inf no ceiling) and drains
them at R, first in, first out. A producer issuing a burst admits bytes at its own issue
rate while the path has room; once the path is full, admission is the drain rate R shared
equally among the producers still issuing. When a producer stops issuing, the capacity
shrinks by its q (below the ceiling): bytes beyond the new capacity drain before anyone is
admitted again. The state is piecewise linear between events, so a simulation jumps from
event to event: a producer starts or finishes issuing, the path fills, or it empties.
Nothing here evaluates the Burst-Gap laws; the tests check that the laws come out of
these dynamics.

It lives beside the kernel's tile lists, not in the simulator (sim/, a higher layer),
because the MegaMoE lead is chosen by playing a tile list through it when a point is
built (playback.py, ours/lead.py); the microbenchmark and attention simulators use it too.
Times are microseconds, sizes bytes, rates bytes per microsecond.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass

from xstage_bench.model import laws

_EPS_BYTES = 1e-3  # fluid quantities closer than a thousandth of a byte are equal
# An event loop takes a few steps per unit of work (a burst, a tile): start, finish, the
# path filling and emptying. Far more means it is stuck (a step too small to move a float
# clock, from extreme rates); beyond MAX_EVENTS a run is too large to be worth simulating.
STEPS_PER_WORK = 64
MIN_STEPS = 1000
MAX_EVENTS = 50_000_000


class SimulationError(RuntimeError):
    """A simulation that cannot finish: its event loop ran past its bound."""


class EventBudget:
    """Counts the steps of one event loop and raises SimulationError past its bound."""

    def __init__(self, work: int, what: str):
        self.limit = STEPS_PER_WORK * int(work) + MIN_STEPS
        self.what = what
        self.steps = 0
        if self.limit > MAX_EVENTS:
            raise SimulationError(
                f"{what}: {work} units of work would take up to {self.limit} events, more than "
                f"the simulator's bound of {MAX_EVENTS}; reduce the grid"
            )

    def step(self) -> None:
        self.steps += 1
        if self.steps > self.limit:
            raise SimulationError(
                f"{self.what}: the event loop ran past {self.limit} steps without finishing "
                "(a rate or size in the hardware profile or point is too extreme to simulate)"
            )


class StorePath:
    """One outstanding-capacity path: q in [0, min(S + n q_each, C)] bytes with n issuers,
    drained at R, shared by the issuers.

    Issuers share admission by processor sharing: each one progresses at the same
    per-producer rate, so a virtual clock `_vt` (bytes admitted per producer since the
    start) orders their finishes and a heap finds the next one in O(log n).
    """

    def __init__(
        self,
        drain: float,
        capacity: float,
        issue_rate: float,
        capacity_per_issuer: float = 0.0,
        capacity_ceiling: float = math.inf,
    ):
        if drain <= 0 or capacity < 0 or issue_rate <= 0 or capacity_per_issuer < 0:
            raise ValueError(
                f"path needs positive drain and issue rate and capacities >= 0, got drain "
                f"{drain}, capacity {capacity} + {capacity_per_issuer} per issuer, issue rate "
                f"{issue_rate}"
            )
        if min(capacity + capacity_per_issuer, capacity_ceiling) <= 0:
            raise ValueError("path needs a positive capacity for one issuer")
        self.drain = drain
        self.shared_capacity = capacity
        self.capacity_per_issuer = capacity_per_issuer
        self.capacity_ceiling = capacity_ceiling
        self.issue_rate = issue_rate
        self.t = 0.0
        self.q = 0.0
        self.n = 0  # producers issuing now (a cohort of m counts m times)
        self._vt = 0.0
        self._seq = 0
        self._heap: list[tuple[float, int, Hashable, int]] = []

    @property
    def capacity(self) -> float:
        """Q(K) = min(S + K q, C) at the K producers issuing now."""
        return laws.capacity(
            self.n, self.shared_capacity, self.capacity_per_issuer, self.capacity_ceiling
        )

    def _regime(self) -> tuple[float, float, float, float]:
        """(bytes per microsecond admitted by each issuer, dq/dt, the capacity, the level q
        drains down to): bytes beyond the capacity (an issuer left a full path) drain first,
        admitting nothing, down to the capacity; otherwise the path drains to empty."""
        n, q = self.n, self.q
        # laws.capacity in plain floats: this runs at every event of a playback
        cap = min(self.shared_capacity + n * self.capacity_per_issuer, self.capacity_ceiling)
        if n == 0:
            return 0.0, (-self.drain if q > 0 else 0.0), cap, 0.0
        if q > cap + _EPS_BYTES:
            return 0.0, -self.drain, cap, cap
        offered = n * self.issue_rate
        if q >= cap and offered > self.drain:
            return self.drain / n, 0.0, cap, 0.0  # full: admission limited to the drain
        if q <= 0 and offered <= self.drain:
            return self.issue_rate, 0.0, cap, 0.0  # empty and the drain keeps up: passes through
        return self.issue_rate, offered - self.drain, cap, 0.0

    def next_time(self) -> float:
        """Absolute time of the next change: an issuer finishes, the path fills or empties,
        or drains down to its capacity."""
        rate, dq, cap, floor = self._regime()
        dt = math.inf
        if self._heap and rate > 0:
            dt = max(self._heap[0][0] - self._vt, 0.0) / rate
        if dq > 0:
            dt = min(dt, (cap - self.q) / dq)
        elif dq < 0:
            dt = min(dt, (self.q - floor) / -dq)
        return self.t + dt

    def advance(self, t: float) -> list[tuple[Hashable, int]]:
        """Move to time t (no later than next_time()); return the issuers that finished."""
        if t < self.t:
            raise ValueError(f"cannot go back in time: {t} < {self.t}")
        rate, dq, cap, floor = self._regime()
        dt = t - self.t
        self.t = t
        self._vt += rate * dt
        q = self.q + dq * dt
        if dq > 0 and cap - q <= _EPS_BYTES:
            q = cap  # full (never past it)
        elif dq < 0 and q - floor <= _EPS_BYTES:
            q = floor  # empty, or down to the capacity (never below it)
        self.q = q
        done = []
        heap = self._heap
        while heap and heap[0][0] <= self._vt + _EPS_BYTES:
            _, _, token, m = heapq.heappop(heap)
            self.n -= m
            done.append((token, m))
        return done

    def add(self, token: Hashable, nbytes: float, m: int = 1) -> None:
        """Start m identical producers issuing nbytes each, now."""
        heapq.heappush(self._heap, (self._vt + nbytes, self._seq, token, m))
        self._seq += 1
        self.n += m

    def empty_time(self) -> float:
        """When the path will have drained everything admitted so far (first in, first
        out: the last byte admitted drains then)."""
        return self.t + self.q / self.drain


@dataclass(frozen=True)
class PathParams:
    """What a burst meets on its way: fixed overhead, issue rate, drain rate, capacity
    Q(K) = min(capacity + K capacity_per_issuer, capacity_ceiling)."""

    t0_fixed_us: float
    issue_rate: float  # bytes/us, per producer
    drain: float  # bytes/us
    capacity: float  # bytes: S, shared by the producers
    capacity_per_issuer: float = 0.0  # bytes: q, each producer issuing adds
    capacity_ceiling: float = math.inf  # bytes: C, the most the path holds

    def t0_us(self, B: float) -> float:
        """Backpressure-free issue time of one producer's B bytes."""
        return self.t0_fixed_us + B / self.issue_rate

    def issue_end(self, start: float, B: float, admitted: float) -> float:
        """When a producer that began a burst of B bytes at `start` has issued it.

        Its stores enter the path from the start, and the fixed overhead overlaps them:
        the burst ends when the path has admitted its last byte, never before T0. This is
        the Burst-Gap model's definition, so one burst on an empty path takes
        max(T0, (V - Q)/R), laws.isolated_issue_time, which the fit uses.
        """
        return max(admitted, start + self.t0_us(B))

    def new_path(self) -> StorePath:
        return StorePath(
            self.drain,
            self.capacity,
            self.issue_rate,
            self.capacity_per_issuer,
            self.capacity_ceiling,
        )
