"""The Burst-Gap laws of the X-Stage paper, as numpy-vectorized functions.

K producers store V bytes in all per burst, then compute for a gap G. Three parameters:
T0 (backpressure-free issue time of the burst), R (drain rate of the path), Q (outstanding
capacity), where Q follows the capacity law Q(K) = min(S + K q, C): a part S shared by the
path and a window q per producer, up to a ceiling C of the path (`capacity`; the paper's
one Q is q = 0, and C = inf is no ceiling). Beyond Q the drain lags (`stall_time`; no lag
is the paper's (V - Q)/R). Units throughout:
microseconds, bytes, and bytes per microsecond for rates;
`gbps_to_bytes_per_us` converts the GB/s (1e9 bytes/s) that profiles and tables quote.
Every function broadcasts over numpy arrays and returns a float (or bool) array.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

BYTES_PER_US_PER_GBPS = 1e9 * 1e-6  # 1 GB/s moves 1000 bytes per microsecond


def gbps_to_bytes_per_us(rate_GBps: ArrayLike) -> NDArray:
    return np.asarray(rate_GBps, dtype=float) * BYTES_PER_US_PER_GBPS


def bytes_per_us_to_gbps(rate: ArrayLike) -> NDArray:
    return np.asarray(rate, dtype=float) / BYTES_PER_US_PER_GBPS


def _f(x: ArrayLike) -> NDArray:
    return np.asarray(x, dtype=float)


def capacity(K: ArrayLike, S: ArrayLike, q: ArrayLike, C: ArrayLike = np.inf) -> NDArray:
    """Q(K) = min(S + K q, C): the outstanding capacity a burst of K producers meets.

    S is shared by the path, q is each producer's own window and C the most the path
    holds however many producers issue; the paper's shared Q is q = 0, a pure
    per-producer window S = 0, and C = inf (the default) no ceiling. Every law below
    takes Q from here.
    """
    return np.minimum(_f(S) + _f(K) * _f(q), _f(C))


def period(T0: ArrayLike, G: ArrayLike, V: ArrayLike, R: ArrayLike) -> NDArray:
    """Steady-state period: max(T0 + G, V/R); the path cannot drain faster than R."""
    return np.maximum(_f(T0) + _f(G), _f(V) / _f(R))


def issue_time(T0: ArrayLike, G: ArrayLike, V: ArrayLike, R: ArrayLike) -> NDArray:
    """Sender-visible issue time of a steady burst: max(T0, V/R - G)."""
    return np.maximum(_f(T0), _f(V) / _f(R) - _f(G))


def hiding_gap(T0: ArrayLike, V: ArrayLike, R: ArrayLike) -> NDArray:
    """G*: the smallest gap that hides the drain, [V/R - T0]+."""
    return np.maximum(_f(V) / _f(R) - _f(T0), 0.0)


def backlog_peak(T0: ArrayLike, V: ArrayLike, R: ArrayLike) -> NDArray:
    """q_peak0: bytes still outstanding when a burst on an empty path is issued, [V - R*T0]+."""
    return np.maximum(_f(V) - _f(R) * _f(T0), 0.0)


def stall_time(
    V: ArrayLike, Q: ArrayLike, R: ArrayLike, lag: ArrayLike = 0.0, lag_rate: ArrayLike = 1.0
) -> NDArray:
    """How long a burst on an empty path takes to issue its V bytes once Q of them fill the
    path: the time the drain takes to make room for the V - Q bytes beyond the capacity.

    The drain lags: t after the path filled it has drained max(lag_rate R t, R t - lag Q)
    bytes, a drain at R that starts lag x Q/R late (a fraction `lag` of the time R takes
    to drain a full path), meanwhile at lag_rate x R. Solved for V - Q: min((V - Q)/
    (lag_rate R), (V - (1 - lag) Q)/R), so a burst just beyond the knee drains slowly and
    a long one at R, as if the path held (1 - lag) Q. lag = 0 (the default) is the paper's
    (V - Q)/R. Negative where V fits in Q (no stall).
    """
    Q, R = _f(Q), _f(R)
    excess = _f(V) - Q
    with np.errstate(divide="ignore"):
        slow = np.where(excess > 0, excess / (_f(lag_rate) * R), -np.inf)
    return np.where(excess > 0, np.minimum(slow, (excess + _f(lag) * Q) / R), excess / R)


def isolated_issue_time(
    T0: ArrayLike,
    V: ArrayLike,
    Q: ArrayLike,
    R: ArrayLike,
    lag: ArrayLike = 0.0,
    lag_rate: ArrayLike = 1.0,
) -> NDArray:
    """One burst on an empty path: max(T0, stall_time); beyond Q it issues as the path
    drains, (V - Q)/R where the drain does not lag (lag = 0, the default)."""
    return np.maximum(_f(T0), stall_time(V, Q, R, lag, lag_rate))


def train_issue_time(
    T0: ArrayLike,
    G: ArrayLike,
    V: ArrayLike,
    R: ArrayLike,
    Q: ArrayLike,
    lag: ArrayLike = 0.0,
    lag_rate: ArrayLike = 1.0,
) -> NDArray:
    """Issue time of a burst in a steady train, from the two laws together.

    The periodic law assumes the backlog carries over between bursts; once G exceeds Q/R
    the path empties in the gap and each burst is an isolated one, never faster than
    the isolated law. So the train's issue time is the larger of the two.
    """
    return np.maximum(issue_time(T0, G, V, R), isolated_issue_time(T0, V, Q, R, lag, lag_rate))


def train_period(
    T0: ArrayLike,
    G: ArrayLike,
    V: ArrayLike,
    R: ArrayLike,
    Q: ArrayLike,
    lag: ArrayLike = 0.0,
    lag_rate: ArrayLike = 1.0,
) -> NDArray:
    """Period of a steady train from the two laws together: the train's issue time plus G.

    This is the period law max(T0 + G, V/R) with T0 raised to the isolated issue time
    where a burst stalls even on an empty path (V beyond Q); since the train's issue time
    is at least V/R - G, the period is never shorter than V/R.
    """
    return train_issue_time(T0, G, V, R, Q, lag, lag_rate) + _f(G)
