"""The X-Stage path as a fluid: producers' stores entering a finite path that drains at R.

The path holds at most Q(K) = min(S + K q, C) outstanding bytes while K producers issue
into it (the capacity law; q = 0 is one shared capacity S, C = inf no ceiling) and drains
them at R, first in, first out. A producer issuing a burst admits bytes at its own issue
rate while the path has room; once the path is full, admission is the drain rate R shared
equally among the producers still issuing. When a producer stops issuing, the capacity
shrinks by its q (below the ceiling): bytes beyond the new capacity drain before anyone is
admitted again. The state is piecewise linear between events, so a simulation jumps from
event to event: a producer starts or finishes issuing, the path fills, or it empties.

The drain lags (laws.stall_time, the fit's drain_lag_fraction f and drain_lag_rate_ratio
rho): once the path leaves idle it drains at rho R, a slow start, until it is f Q(K)
bytes behind a drain at R, and at R from then on until it is idle again. So t after an
idle path began to fill it has drained max(rho R t, R t - f Q), and a burst on an empty
path issues exactly as stall_time says; a sustained stream, never idle, stays f Q behind,
as if the path held (1 - f) Q. f = 0 (the default) is no lag.

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

    The drain's slow start (module doc) is `_behind`, the bytes it is behind a drain at R
    since the path left idle: it drains at lag_rate_ratio x drain while _behind is below
    lag_fraction x the capacity now, so more producers joining lengthen it.
    """

    def __init__(
        self,
        drain: float,
        capacity: float,
        issue_rate: float,
        capacity_per_issuer: float = 0.0,
        capacity_ceiling: float = math.inf,
        lag_fraction: float = 0.0,
        lag_rate_ratio: float = 1.0,
    ):
        if not (0 <= lag_fraction <= 1 and 0 <= lag_rate_ratio <= 1):
            raise ValueError(
                f"drain lag needs a fraction and a rate ratio in [0, 1], got {lag_fraction} "
                f"and {lag_rate_ratio}"
            )
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
        # a rate ratio of 1 lags nothing: min((V - Q)/R, ...) is (V - Q)/R whatever f
        self.lag_fraction = lag_fraction if lag_rate_ratio < 1 else 0.0
        self.slow_drain = lag_rate_ratio * drain
        self._behind = 0.0  # bytes behind a drain at R since the path left idle
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

    def _capacity_now(self) -> float:
        """laws.capacity in plain floats: this runs at every event of a playback."""
        return min(self.shared_capacity + self.n * self.capacity_per_issuer, self.capacity_ceiling)

    def _drain_now(self, cap: float) -> float:
        """The drain's rate: slow while the path is busy and less than f Q behind."""
        if not self.lag_fraction:  # no lag (the playback's case): the hot path asks nothing
            return self.drain
        if self._behind < self.lag_fraction * cap - _EPS_BYTES and (self.n or self.q > 0):
            return self.slow_drain
        return self.drain

    def _regime(self) -> tuple[float, float, float, float, float]:
        """(bytes per microsecond admitted by each issuer, dq/dt, the capacity, the level q
        drains down to, the drain's rate): bytes beyond the capacity (an issuer left a full
        path) drain first, admitting nothing, down to the capacity; otherwise the path
        drains to empty."""
        n, q = self.n, self.q
        cap = self._capacity_now()
        drain = self._drain_now(cap)
        if n == 0:
            return 0.0, (-drain if q > 0 else 0.0), cap, 0.0, drain
        if q > cap + _EPS_BYTES:
            return 0.0, -drain, cap, cap, drain
        offered = n * self.issue_rate
        if q >= cap and offered > drain:
            return drain / n, 0.0, cap, 0.0, drain  # full: admission limited to the drain
        if q <= 0 and offered <= drain:
            return self.issue_rate, 0.0, cap, 0.0, drain  # empty, the drain keeps up: passes
        return self.issue_rate, offered - drain, cap, 0.0, drain

    def _slow_start_left(self, cap: float, drain: float) -> float:
        """How long the slow start lasts from now (inf where it does not end, 0 if over)."""
        if drain == self.drain:
            return math.inf
        return (self.lag_fraction * cap - self._behind) / (self.drain - drain)

    def next_time(self) -> float:
        """Absolute time of the next change: an issuer finishes, the path fills or empties,
        drains down to its capacity, or the drain's slow start ends."""
        rate, dq, cap, floor, drain = self._regime()
        dt = self._slow_start_left(cap, drain)
        if self._heap and rate > 0:
            dt = min(dt, max(self._heap[0][0] - self._vt, 0.0) / rate)
        if dq > 0:
            dt = min(dt, (cap - self.q) / dq)
        elif dq < 0:
            dt = min(dt, (self.q - floor) / -dq)
        return self.t + dt

    def advance(self, t: float) -> list[tuple[Hashable, int]]:
        """Move to time t (no later than next_time(), except where nobody issues: an idle
        path only drains, through its slow start's end and to empty); return the issuers
        that finished."""
        if t < self.t:
            raise ValueError(f"cannot go back in time: {t} < {self.t}")
        self._step(t if self.n or not self.lag_fraction else min(t, self.next_time()))
        while self.t < t:  # nobody issuing, the slow start ended or the path emptied
            self._step(min(t, self.next_time()))
        done = []
        heap = self._heap
        while heap and heap[0][0] <= self._vt + _EPS_BYTES:
            _, _, token, m = heapq.heappop(heap)
            self.n -= m
            done.append((token, m))
        if not self.n and self.q <= 0:
            self._behind = 0.0  # idle: the next bytes meet the slow start again
        return done

    def _step(self, t: float) -> None:
        """Move to t within one regime (or with nobody issuing, to empty and no further)."""
        rate, dq, cap, floor, drain = self._regime()
        dt = t - self.t
        self.t = t
        self._vt += rate * dt
        if drain < self.drain:
            self._behind += (self.drain - drain) * dt
        q = self.q + dq * dt
        if dq > 0 and cap - q <= _EPS_BYTES:
            q = cap  # full (never past it)
        elif dq < 0 and q - floor <= _EPS_BYTES:
            q = floor  # empty, or down to the capacity (never below it)
        self.q = q

    def add(self, token: Hashable, nbytes: float, m: int = 1) -> None:
        """Start m identical producers issuing nbytes each, now."""
        heapq.heappush(self._heap, (self._vt + nbytes, self._seq, token, m))
        self._seq += 1
        self.n += m

    def empty_time(self) -> float:
        """When the path will have drained everything admitted so far (first in, first
        out: the last byte admitted drains then), through what is left of the drain's slow
        start at the producers issuing now."""
        cap = self._capacity_now()
        drain = self._drain_now(cap)
        slow = self._slow_start_left(cap, drain)
        if self.q <= drain * slow:
            return self.t + self.q / drain
        return self.t + slow + (self.q - drain * slow) / self.drain


@dataclass(frozen=True)
class PathParams:
    """What a burst meets on its way: fixed overhead, issue rate, drain rate, capacity
    Q(K) = min(capacity + K capacity_per_issuer, capacity_ceiling), and the drain's lag
    beyond the knee (StorePath: lag_fraction f of Q(K) behind R, at lag_rate_ratio x R
    until then; f = 0 is none)."""

    t0_fixed_us: float
    issue_rate: float  # bytes/us, per producer
    drain: float  # bytes/us
    capacity: float  # bytes: S, shared by the producers
    capacity_per_issuer: float = 0.0  # bytes: q, each producer issuing adds
    capacity_ceiling: float = math.inf  # bytes: C, the most the path holds
    lag_fraction: float = 0.0  # f: the drain falls f Q(K) behind R once the path is busy
    lag_rate_ratio: float = 1.0  # rho: it drains at rho R until then

    def t0_us(self, B: float) -> float:
        """Backpressure-free issue time of one producer's B bytes."""
        return self.t0_fixed_us + B / self.issue_rate

    def issue_end(self, start: float, B: float, admitted: float) -> float:
        """When a producer that began a burst of B bytes at `start` has issued it.

        Its stores enter the path from the start, and the fixed overhead overlaps them:
        the burst ends when the path has admitted its last byte, never before T0. This is
        the Burst-Gap model's definition, so one burst on an empty path takes
        max(T0, stall), laws.isolated_issue_time, which the fit uses.
        """
        return max(admitted, start + self.t0_us(B))

    def new_path(self) -> StorePath:
        return StorePath(
            self.drain,
            self.capacity,
            self.issue_rate,
            self.capacity_per_issuer,
            self.capacity_ceiling,
            self.lag_fraction,
            self.lag_rate_ratio,
        )
