"""Per-CTA %globaltimer stamps of a launch, checked, become the data contract's sample
metrics (issue times, start skew, period, measured gap, issue rate; with the grid barrier,
the sender-visible issue time and the hold; a drain probe's visibility and fence times).

This module exists so that how a launch's stamps are read is decided, and tested, on the
CPU, apart from the GPU half (bench.py) that reads them back.

Stamps are nanoseconds on the sending GPU's %globaltimer (32 ns resolution on H200);
metrics are microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from xstage_bench.microbench.errors import MicrobenchError


class TrainStamps(NamedTuple):
    """One burst_train launch's stamps, each [bursts, K] in ns; reach (the time each CTA
    reached the grid barrier before a burst) only with sync = barrier."""

    start: np.ndarray
    end: np.ndarray
    reach: np.ndarray | None = None


def check_stamps(stamps: np.ndarray, label: str) -> None:
    """Every stamp must be set and each burst must end after it starts."""
    if np.any(stamps == 0):
        raise MicrobenchError(f"{label}: some stamps were never written")
    if np.any(stamps[1] < stamps[0]):
        raise MicrobenchError(f"{label}: a burst ends before it starts")


def check_reach(start: np.ndarray, end: np.ndarray, reach: np.ndarray, label: str) -> None:
    """A CTA reaches the barrier before the burst it opens, and after its previous burst."""
    if np.any(reach == 0):
        raise MicrobenchError(f"{label}: some barrier stamps were never written")
    if np.any(reach > start) or np.any(reach[1:] < end[:-1]):
        raise MicrobenchError(f"{label}: a barrier stamp lies outside its gap")


def _us(ns: np.ndarray) -> list[float]:
    return [float(x) / 1e3 for x in ns]


def train_metrics(
    start: np.ndarray,
    end: np.ndarray,
    warmup: int,
    kind: str,
    producer_bytes: int,
    reach: np.ndarray | None = None,
) -> dict:
    """Sample metrics of one launch from per-CTA stamps (arrays of shape [bursts, K], ns).

    Per burst: t_iss_slowest = max over producers of its own store loop; t_iss_window =
    last producer's end - first producer's start; start_skew = last start - first start.
    Periodic launches add period (median over producers of each one's start of burst n+1 -
    its start of burst n, for steady n with a successor: free producers drift apart, and the
    earliest producer's period would time only the leader), gap_measured (median over
    producers of its next start - its own end) and one issue_rate per launch (see
    `issue_rate_GBps`). The first `warmup` bursts go to warmup_* metrics. Periodic launches
    with the grid barrier (`reach`) add `barrier_metrics`.
    """
    start = start.astype(np.int64)
    end = end.astype(np.int64)
    n = start.shape[0]
    if not 0 <= warmup < n:
        raise ValueError(f"warmup={warmup} must be in [0, {n}) bursts")
    slowest = (end - start).max(axis=1)
    window = end.max(axis=1) - start.min(axis=1)
    skew = start.max(axis=1) - start.min(axis=1)
    metrics = {
        "t_iss_slowest_us": _us(slowest[warmup:]),
        "t_iss_window_us": _us(window[warmup:]),
        "start_skew_us": _us(skew[warmup:]),
        "warmup_t_iss_slowest_us": _us(slowest[:warmup]),
        "warmup_t_iss_window_us": _us(window[:warmup]),
    }
    if kind == "periodic":
        metrics["period_us"] = _us(np.median(np.diff(start, axis=0), axis=1)[warmup:])
        metrics["gap_measured_us"] = _us(np.median(start[1:] - end[:-1], axis=1)[warmup:])
        rate = issue_rate_GBps(start, end, warmup, producer_bytes)
        metrics["issue_rate_GBps"] = [] if rate is None else [rate]
        if reach is not None:
            metrics.update(barrier_metrics(start, end, reach.astype(np.int64), warmup))
    return metrics


def barrier_metrics(start: np.ndarray, end: np.ndarray, reach: np.ndarray, warmup: int) -> dict:
    """Where an aligned train's backpressure went, from the barrier stamps (ns arrays).

    A producer whose stores still drain can finish its store loop at once and be held at
    its next memory operation instead: the barrier's arrival atomic after its gap. So per
    steady burst n with a successor:
    - gap_spent = median over producers of reach[n+1] - end[n] (the gap as it ran);
    - barrier_base (one per launch) = the first barrier's time from the last producer's
      arrival to the burst's start: the barrier's own cost, with no stores before it;
    - hold = start[n+1] - the last arrival at its barrier - barrier_base: how long the
      barrier stayed closed after every producer had arrived, waiting for the drain;
    - t_vis_slowest = the slowest producer's store loop + hold (a hold below 0, a barrier
      that opened sooner after the last arrival than the launch's first did, is the
      timer's tick, not a wait: counted as 0): the sender-visible issue
      time, from the burst's start until the slowest producer could issue its next memory
      operation, what the Burst-Gap laws call the issue time. Not period - gap_spent -
      barrier_base, which equals it only when every producer's gap lasts as long: gaps
      spun in cycles differ between SMs by a share of G, and the barrier opens on the
      longest, so that difference charged the gap's spread to the issue time (one H100,
      K = 132, V = 1 MiB: 0.38 us at G = 25 us, 3.0 us at G = 500, the loop 0.3 us, no hold).
    Starts are medians over producers: the barrier releases them together.
    """
    first_start = np.median(start, axis=1)
    last_reach = reach.max(axis=1)
    base = first_start[0] - last_reach[0]
    steady = slice(warmup, None)  # of per-successor arrays: bursts 0 .. n-2
    gap = np.median(reach[1:] - end[:-1], axis=1)[steady]
    hold = (first_start[1:] - last_reach[1:])[steady] - base
    slowest = (end - start).max(axis=1)[:-1][steady]
    return {
        "gap_spent_us": _us(gap),
        "barrier_base_us": _us([base]),
        "hold_us": _us(hold),
        "t_vis_slowest_us": _us(slowest + np.maximum(hold, 0)),
    }


def issue_rate_GBps(start: np.ndarray, end: np.ndarray, warmup: int, producer_bytes: int):
    """Bytes issued per ns while every producer is in its steady bursts, or None.

    The window runs from the last producer's first steady start to the first producer's
    last end; bytes are those of the bursts that end inside it. Producers that run free
    drift apart, so the earliest producer's period then says how fast the leader runs, not
    how fast the path drains; this aggregate rate does not depend on their alignment, and
    under sustained backpressure it is the drain rate R (bytes/ns = GB/s).
    """
    t_a, t_b = start[warmup].max(), end[-1].min()
    inside = int(((end > t_a) & (end <= t_b)).sum())
    if t_b <= t_a or inside == 0:
        return None
    return inside * producer_bytes / float(t_b - t_a)


def probe_metrics(stamps: np.ndarray, warmup: int) -> dict:
    """Drain-probe metrics from stamps of shape [4 (start, end, fence, ack), bursts, K].

    visible = earliest ack - earliest start (an upper bound, see burst.cu); fence = last
    producer's fence return - earliest start (every store of the burst acknowledged).
    """
    start, end, fence, ack = (s.astype(np.int64) for s in stamps)
    first = start.min(axis=1)
    metrics = train_metrics(start, end, warmup, "isolated", producer_bytes=0)
    metrics["visible_us"] = _us((ack.min(axis=1) - first)[warmup:])
    metrics["fence_us"] = _us((fence.max(axis=1) - first)[warmup:])
    return metrics


def pool(into: dict[str, list[float]], metrics: Mapping[str, Sequence[float]]) -> None:
    """Append one launch's samples to the pooled samples of a point."""
    for name, values in metrics.items():
        into.setdefault(name, []).extend(values)


def stamps_extra(start: np.ndarray, end: np.ndarray, reach: np.ndarray | None = None) -> dict:
    """Per-CTA stamps of one launch for the record, in ns relative to its first start."""
    t0 = int(start.min())
    extra = {
        "unit": "ns since the launch's first burst start",
        "start": (start.astype(np.int64) - t0).tolist(),
        "end": (end.astype(np.int64) - t0).tolist(),
    }
    if reach is not None:
        extra["reach"] = (reach.astype(np.int64) - t0).tolist()
    return extra
