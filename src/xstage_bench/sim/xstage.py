"""Discrete-event model of the X-Stage: producers injecting bursts into a finite path.

The path (capacity Q, drain R, issue time T0) is the fluid of megamoe/drain.py, with the
profile's parameters (`path_params`); here K producers play burst trains through it, as
the microbenchmarks run them. Nothing here evaluates the Burst-Gap laws; the tests check
that the laws come out of these dynamics.

Producers that behave identically (no start jitter) are kept as one cohort of m
producers, which makes a lock-step run cost a few events per burst whatever K is.
Times are microseconds, sizes bytes, rates bytes per microsecond.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from xstage_bench.data.hardware import HardwareProfile
from xstage_bench.megamoe.drain import EventBudget, PathParams
from xstage_bench.model.laws import bytes_per_us_to_gbps, gbps_to_bytes_per_us

# Model assumptions for the local path and the ceilings (documented in the raw config).
LOCAL_PATH_FACTOR = 10.0  # local stores: 10x R and 10x Q (H200: 4.0 TB/s local vs ~365 GB/s peer)
COPY_ENGINE_EFFICIENCY = 0.9  # a copy engine reaches 90% of the path's line rate
WIDEST_STORE = 16  # bytes; narrower stores issue proportionally fewer bytes per instruction


def path_params(profile: HardwareProfile, dest: str = "peer", width: int = 16) -> PathParams:
    """The profile's peer path, or the local path (LOCAL_PATH_FACTOR x R and Q); its capacity
    follows the profile's law Q(K) = min(S + K q, C) (capacity_bytes,
    capacity_per_producer_bytes, capacity_ceiling_bytes: None is no ceiling)."""
    if dest not in ("peer", "local"):
        raise ValueError(f"dest must be 'peer' or 'local', got {dest!r}")
    if width <= 0 or width > WIDEST_STORE:
        raise ValueError(f"store width must be in 1..{WIDEST_STORE} bytes, got {width}")
    factor = LOCAL_PATH_FACTOR if dest == "local" else 1.0
    ceiling = math.inf if profile.capacity_ceiling_bytes is None else profile.capacity_ceiling_bytes
    return PathParams(
        t0_fixed_us=profile.t0_fixed_us,
        issue_rate=float(gbps_to_bytes_per_us(profile.issue_rate_per_sm_GBps))
        * width
        / WIDEST_STORE,
        drain=float(gbps_to_bytes_per_us(profile.drain_rate_GBps)) * factor,
        capacity=profile.capacity_bytes * factor,
        capacity_per_issuer=profile.capacity_per_producer_bytes * factor,
        capacity_ceiling=ceiling * factor,
    )


@dataclass(frozen=True)
class BurstTrace:
    """Per-cohort, per-burst stamps of one launch (a cohort's producers share them)."""

    start: np.ndarray  # (bursts, cohorts): the burst's fixed overhead begins
    end: np.ndarray  # (bursts, cohorts): the producer's last byte is admitted
    drained_at: float  # the path is empty again after the last burst

    def t_iss_slowest(self) -> np.ndarray:
        """Per burst: the longest store loop of any one producer."""
        return (self.end - self.start).max(axis=1)

    def t_iss_window(self) -> np.ndarray:
        """Per burst: last producer's end minus first producer's start."""
        return self.end.max(axis=1) - self.start.min(axis=1)

    def period(self) -> np.ndarray:
        """Per burst, the median over producers of each one's own start-to-next-start time.

        Each producer's own period survives drift between producers; the earliest producer's
        period would only time the leader (one fewer value than bursts).
        """
        return np.median(np.diff(self.start, axis=0), axis=1)


def simulate_bursts(
    K: int,
    B: float,
    bursts: int,
    gap_us: float,
    params: PathParams,
    *,
    sync: str = "free",
    start_offsets_us: np.ndarray | None = None,
) -> BurstTrace:
    """K producers each issue `bursts` bursts of B bytes, computing gap_us between bursts.

    sync "free": each producer starts its next burst G after its own last byte.
    sync "barrier": all producers wait for the slowest, compute G, and start together
    (a barrier precedes every burst, so start offsets do not apply).
    """
    if K < 1 or bursts < 1 or B <= 0 or gap_us < 0:
        raise ValueError(f"bad burst train: K={K}, bursts={bursts}, B={B}, gap_us={gap_us}")
    if sync not in ("free", "barrier"):
        raise ValueError(f"sync must be 'free' or 'barrier', got {sync!r}")
    if start_offsets_us is None or sync == "barrier":
        offsets, counts = np.zeros(1), np.array([K])
    else:
        if len(start_offsets_us) != K:
            raise ValueError(f"need {K} start offsets, got {len(start_offsets_us)}")
        offsets, counts = np.unique(np.asarray(start_offsets_us, dtype=float), return_counts=True)
    cohorts = len(offsets)
    budget = EventBudget(bursts * cohorts, f"burst train K={K}, B={B:g}, bursts={bursts}")
    start = np.full((bursts, cohorts), np.nan)
    end = np.full((bursts, cohorts), np.nan)
    burst_of = np.zeros(cohorts, dtype=int)
    unfinished = np.full(bursts, cohorts)
    path = params.new_path()
    # External events: (time, seq, what, cohort); "start" begins a burst (its bytes go to
    # the path at once), "end" is when the producer has issued it (PathParams.issue_end).
    events: list[tuple[float, int, str, int]] = []
    seq = 0

    def push(t: float, what: str, c: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, what, c))
        seq += 1

    for c in range(cohorts):
        push(float(offsets[c]), "start", c)
    while events or path.n:
        budget.step()
        t = min(events[0][0] if events else math.inf, path.next_time())
        for c, _ in path.advance(t):
            push(params.issue_end(start[burst_of[c], c], B, t), "end", c)
        while events and events[0][0] <= t:
            _, _, what, c = heapq.heappop(events)
            if what == "start":
                if not np.isnan(start[burst_of[c], c]):
                    burst_of[c] += 1
                start[burst_of[c], c] = t
                path.add(c, B, int(counts[c]))
                continue
            b = burst_of[c]
            end[b, c] = t
            unfinished[b] -= 1
            if b + 1 == bursts:
                continue
            if sync == "free":
                push(t + gap_us, "start", c)
            elif unfinished[b] == 0:
                for other in range(cohorts):
                    push(t + gap_us, "start", other)
    return BurstTrace(start=start, end=end, drained_at=path.empty_time())


def single_burst_bandwidth_GBps(V: float, K: int, params: PathParams) -> float:
    """Throughput of one large burst from K producers, first start to last byte drained."""
    trace = simulate_bursts(K, V / K, 1, 0.0, params)
    elapsed_us = trace.drained_at - trace.start.min()
    return float(bytes_per_us_to_gbps(V / elapsed_us))


class UnsupportedPoint(ValueError):
    """A grid point the simulator does not model; recorded as status 'unsupported'."""


def _train_samples(
    point: dict,
    params: PathParams,
    *,
    bursts: int,
    warmup_bursts: int,
    launches: int,
    rng: np.random.Generator,
    start_jitter_us: float,
) -> dict[str, list[float]]:
    K, B, kind = point["K"], point["B"], point["kind"]
    n = bursts if kind == "periodic" else 1
    samples: dict[str, list[float]] = {}

    def put(name: str, values: np.ndarray) -> None:
        samples.setdefault(name, []).extend(float(v) for v in values)

    for _ in range(launches):
        offsets = rng.uniform(0.0, start_jitter_us, K) if start_jitter_us > 0 else None
        trace = simulate_bursts(
            K, B, n, point["gap_us"], params, sync=point["sync"], start_offsets_us=offsets
        )
        slowest, window = trace.t_iss_slowest(), trace.t_iss_window()
        if kind == "periodic":
            put("t_iss_slowest_us", slowest[warmup_bursts:])
            put("t_iss_window_us", window[warmup_bursts:])
            put("period_us", trace.period()[warmup_bursts:])
            put("warmup_t_iss_slowest_us", slowest[:warmup_bursts])
            put("warmup_t_iss_window_us", window[:warmup_bursts])
        else:
            put("t_iss_slowest_us", slowest)
            put("t_iss_window_us", window)
            if kind == "drain_probe":
                put("visible_us", [trace.drained_at - trace.start.min()])
    return samples


def simulate_microbench_point(
    point: dict,
    profile: HardwareProfile,
    *,
    bursts: int,
    warmup_bursts: int,
    launches: int,
    rng: np.random.Generator,
    start_jitter_us: float = 0.0,
) -> dict[str, list[float]]:
    """The sample metrics of one microbench grid point, as the GPU runner reports them.

    periodic: per steady burst (warm-up bursts reported apart); isolated and drain_probe:
    one burst on an empty path per launch; ceiling: the path's throughput per launch.
    Store width scales the issue rate (width/16); the address pattern and the gap mode
    are not modelled (no caches, no timers); several peers are not modelled at all.
    """
    if point.get("peers", 1) != 1:
        raise UnsupportedPoint(f"peers={point['peers']}: the simulator models one peer path")
    params = path_params(profile, point.get("dest", "peer"), point.get("width", WIDEST_STORE))
    kind = point["kind"]
    if kind == "ceiling":
        if point["method"] == "sm_store":
            bw = single_burst_bandwidth_GBps(point["V"], profile.sm_count, params)
        else:
            line_rate = (
                profile.nvlink_line_rate_GBps
                if point["dest"] == "peer"
                else float(bytes_per_us_to_gbps(params.drain))
            )
            bw = COPY_ENGINE_EFFICIENCY * line_rate
        return {"bandwidth_GBps": [bw] * launches}
    if kind not in ("periodic", "isolated", "drain_probe"):
        raise UnsupportedPoint(f"unknown microbench kind {kind!r}")
    return _train_samples(
        point,
        params,
        bursts=bursts,
        warmup_bursts=warmup_bursts,
        launches=launches,
        rng=rng,
        start_jitter_us=start_jitter_us,
    )
