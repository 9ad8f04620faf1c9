"""The Burst-Gap laws of the X-Stage paper, as numpy-vectorized functions.

K producers store V bytes in all per burst, then compute for a gap G. Three parameters:
T0 (backpressure-free issue time of the burst), R (drain rate of the path), Q (outstanding
capacity), where Q follows the capacity law Q(K) = min(S + K q, C): a part S shared by the
path and a window q per producer, up to a ceiling C of the path (`capacity`; the paper's
one Q is q = 0, and C = inf is no ceiling). Units throughout:
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


def isolated_issue_time(T0: ArrayLike, V: ArrayLike, Q: ArrayLike, R: ArrayLike) -> NDArray:
    """One burst on an empty path: max(T0, (V - Q)/R); beyond Q it issues at the drain rate."""
    return np.maximum(_f(T0), (_f(V) - _f(Q)) / _f(R))


def train_issue_time(
    T0: ArrayLike, G: ArrayLike, V: ArrayLike, R: ArrayLike, Q: ArrayLike
) -> NDArray:
    """Issue time of a burst in a steady train, from the two laws together.

    The periodic law assumes the backlog carries over between bursts; once G exceeds Q/R
    the path empties in the gap and each burst is an isolated one, never faster than
    the isolated law. So the train's issue time is the larger of the two.
    """
    return np.maximum(issue_time(T0, G, V, R), isolated_issue_time(T0, V, Q, R))


def train_period(T0: ArrayLike, G: ArrayLike, V: ArrayLike, R: ArrayLike, Q: ArrayLike) -> NDArray:
    """Period of a steady train from the two laws together: the train's issue time plus G.

    This is the period law max(T0 + G, V/R) with T0 raised to the isolated issue time
    where a burst stalls even on an empty path (V beyond Q); since the train's issue time
    is at least V/R - G, the period is never shorter than V/R.
    """
    return train_issue_time(T0, G, V, R, Q) + _f(G)
