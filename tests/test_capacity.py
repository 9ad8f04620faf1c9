"""The capacity law's fit (model/capacity.py): each variant recovers the law it can hold,
no single burst decides it, and a knee it cannot see is refused.

Records follow the isolated law exactly: T0 = 0.5 us, R = 1000 bytes/us,
Q(K) = min(S + K q, C).
"""

import math

import numpy as np
import pytest
from scipy.optimize import least_squares

from xstage_bench.model import capacity, laws
from xstage_bench.model.records import Recs

R, T0 = 1000.0, 0.5
KS = (4, 8, 16)
SATURATING_KS = (4, 8, 16, 32, 64)  # the capped law's knees grow, then meet the ceiling


def isolated(
    S: float,
    q: float,
    outlier_at: int | None = None,
    C: float = math.inf,
    Ks: tuple[int, ...] = KS,
    lag: capacity.DrainLag = capacity.NO_LAG,
    sizes: int = 10,
) -> Recs:
    """Isolated bursts of every K in Ks over sizes around the knee; the record at
    `outlier_at` timed 3x too slow; the drain lagging by `lag` beyond the knee."""
    K = np.repeat(Ks, sizes).astype(float)
    V = np.tile(np.geomspace(2_000, 200_000, sizes), len(Ks))
    y = laws.isolated_issue_time(T0, V, laws.capacity(K, S, q, C), R, lag.fraction, lag.rate)
    if outlier_at is not None:
        y[outlier_at] *= 3.0
    n = len(V)
    return Recs(
        ids=tuple(f"iso/{j}" for j in range(n)),
        study=("isolated",) * n,
        kind=("isolated",) * n,
        sync=("barrier",) * n,
        aligned=np.ones(n, dtype=bool),
        K=K,
        V=V,
        B=V / K,
        G=np.zeros(n),
        y=y,
        samples=tuple(np.array([v]) for v in y),
        series=tuple(f"K={k:g}" for k in K),
        metric=("t_iss_slowest_us",) * n,
        loop=y.copy(),
    )


@pytest.mark.parametrize(
    ("law", "S", "q"),
    [
        ("shared", 20_000.0, 0.0),
        ("window", 0.0, 2_500.0),
        ("shared_plus_window", 10_000.0, 1_500.0),
    ],
)
def test_each_variant_recovers_the_law_it_can_hold(law, S, q):
    iso = isolated(S, q)
    found = capacity.fit(iso, R, np.full(len(iso), T0), law)
    assert found.law == law
    assert found.S == pytest.approx(S, abs=1.0) and found.q == pytest.approx(q, abs=0.1)
    # the fullest variant finds the special cases too
    both = capacity.fit(iso, R, np.full(len(iso), T0), "shared_plus_window")
    assert both.S == pytest.approx(S, abs=1.0) and both.q == pytest.approx(q, abs=0.1)


def test_no_single_burst_decides_the_capacity():
    """The first burst beyond K = 16's knee timed 3x too slow (a preempted launch, say)
    moves the robust fit by under 2.5%; plain least squares from the truth itself moves
    the capacity at K = 16 by over 10%."""
    S, q = 10_000.0, 1_500.0
    iso = isolated(S, q, outlier_at=26)
    assert iso.K[26] == 16 and iso.V[26] > laws.capacity(16, S, q) > iso.V[25]
    found = capacity.fit(iso, R, np.full(len(iso), T0), "shared_plus_window")
    assert found.at(16) == pytest.approx(S + 16 * q, rel=0.025)
    assert found.at(4) == pytest.approx(S + 4 * q, rel=0.025)

    def residuals(x):
        return (np.maximum(T0, (iso.V - laws.capacity(iso.K, *x)) / R) - iso.y) / iso.y

    plain = least_squares(residuals, [S, q], bounds=(0, np.inf), x_scale=[1e4, 1e3]).x
    assert abs(laws.capacity(16, *plain) / (S + 16 * q) - 1) > 0.10


def test_the_starts_are_each_Ks_knee_and_floor():
    iso = isolated(10_000.0, 1_500.0)
    held = capacity.held(iso, R)
    assert set(held) == set(map(float, KS))
    for K, Q in held.items():  # a floor: no more than the law's capacity at that K
        assert Q <= laws.capacity(K, 10_000.0, 1_500.0) + 1e-6
    line = capacity.law_through({4: 16_000.0, 8: 22_000.0, 16: 34_000.0}, "shared_plus_window")
    assert (line.S, line.q) == pytest.approx((10_000.0, 1_500.0))
    # never below zero: knees that fall with K give a flat line, not a negative window
    falling = capacity.law_through({4: 30_000.0, 16: 10_000.0}, "shared_plus_window")
    assert falling.q == 0.0 and falling.S > 0


def test_describe_names_the_numbers_of_the_chosen_variant():
    assert capacity.describe(capacity.Capacity("shared", 1 << 20, 0.0)) == "S 1.00 MiB"
    assert capacity.describe(capacity.Capacity("window", 0.0, 15 * 1024)) == "K x 15.0 KiB"
    both = capacity.Capacity("shared_plus_window", 1 << 20, 15 * 1024)
    assert capacity.describe(both) == "S 1.00 MiB + K x 15.0 KiB"


def fit_capped(iso: Recs) -> capacity.Capacity:
    return capacity.fit(iso, R, np.full(len(iso), T0), "capped")


def test_the_capped_law_recovers_a_ceiling_the_knees_reach():
    """Q(K) = min(4000 + K 1500, 40000): the knees grow up to K = 16 (28000 bytes at
    K = 16, 40000 from K = 24 on), then stay at C; the uncapped law can only bend its
    line through them."""
    S, q, C = 4_000.0, 1_500.0, 40_000.0
    iso = isolated(S, q, C=C, Ks=SATURATING_KS)
    found = fit_capped(iso)
    assert found.law == "capped" and found.capped
    assert (found.S, found.q, found.C) == pytest.approx((S, q, C), rel=0.02)
    np.testing.assert_allclose(found.at(SATURATING_KS), laws.capacity(SATURATING_KS, S, q, C))
    line = capacity.fit(iso, R, np.full(len(iso), T0), "shared_plus_window")
    assert not line.capped
    assert np.max(np.abs(line.at(SATURATING_KS) / found.at(SATURATING_KS) - 1)) > 0.10


@pytest.mark.parametrize(
    ("S", "q"), [(20_000.0, 0.0), (0.0, 2_500.0), (10_000.0, 1_500.0)], ids=str
)
def test_the_capped_law_holds_each_law_without_a_ceiling(S, q):
    """Knees of a law with no ceiling: the capped fit gives the same capacity at every K,
    and a ceiling no K fitted reaches is no ceiling (C = inf), not a number."""
    iso = isolated(S, q)
    found = fit_capped(iso)
    np.testing.assert_allclose(found.at(KS), laws.capacity(KS, S, q), rtol=1e-3)
    assert found.at(KS[-1]) <= found.C


def test_a_ceiling_beyond_every_K_fitted_is_none():
    iso = isolated(10_000.0, 1_500.0)
    found = fit_capped(iso)
    assert not found.capped and found.C == math.inf
    assert (found.S, found.q) == pytest.approx((10_000.0, 1_500.0), rel=0.01)


def test_no_single_burst_decides_the_ceiling():
    """The first burst beyond K = 64's knee (at C) timed 3x too slow moves the robust fit's
    capacity at every K by under 2.5%."""
    S, q, C = 4_000.0, 1_500.0, 40_000.0
    outlier = 40 + int(np.argmax(np.geomspace(2_000, 200_000, 10) > C))
    iso = isolated(S, q, outlier_at=outlier, C=C, Ks=SATURATING_KS)
    assert iso.K[outlier] == 64 and iso.V[outlier] > C > iso.V[outlier - 1]
    found = fit_capped(iso)
    expected = laws.capacity(SATURATING_KS, S, q, C)
    np.testing.assert_allclose(found.at(SATURATING_KS), expected, rtol=0.025)


def test_the_hinge_starts_bend_at_each_K():
    points = {4.0: 10_000.0, 8.0: 16_000.0, 16.0: 28_000.0, 32.0: 40_000.0, 64.0: 40_000.0}
    starts = capacity.hinges(points)
    assert len(starts) == len(points) - 1 and all(c.law == "capped" for c in starts)
    best = capacity.law_through(points, "capped")
    assert (best.S, best.q) == pytest.approx((4_000.0, 1_500.0))
    assert best.C == pytest.approx(40_000.0)
    assert starts[-1].C == math.inf  # the whole line: no K above it to cap at


def test_describe_names_the_ceiling():
    capped = capacity.Capacity("capped", 1 << 20, 15 * 1024, 2.5 * (1 << 20))
    assert capacity.describe(capped) == "min(S 1.00 MiB + K x 15.0 KiB, C 2.50 MiB)"
    unbound = capacity.Capacity("capped", 1 << 20, 15 * 1024)
    assert capacity.describe(unbound) == (
        "S 1.00 MiB + K x 15.0 KiB (no ceiling within the K fitted)"
    )


def test_the_lag_and_the_capacity_are_recovered_together():
    """Bursts whose drain lags beyond the knee (at 0.4 R at first, as if the path held 60%
    of Q once long): fit_with_lag finds both; without the lag the knee comes out low."""
    lag = capacity.DrainLag(0.4, 0.4)
    iso = isolated(10_000.0, 1_500.0, lag=lag, sizes=30)
    T0s = np.full(len(iso), T0)
    found, fitted = capacity.fit_with_lag(iso, R, T0s, "shared_plus_window")
    assert found.S == pytest.approx(10_000.0, rel=0.01)
    assert found.q == pytest.approx(1_500.0, rel=0.01)
    assert fitted.fraction == pytest.approx(0.4, abs=0.01)
    assert fitted.rate == pytest.approx(0.4, abs=0.01)
    # the plain law (no lag) misses the bursts beyond the knee by far more
    without = capacity.fit(iso, R, T0s, "shared_plus_window")

    def worst(cap: capacity.Capacity, d: capacity.DrainLag) -> float:
        y = laws.isolated_issue_time(T0s, iso.V, cap.at(iso.K), R, d.fraction, d.rate)
        return float(np.max(np.abs(y - iso.y) / iso.y))

    assert worst(found, fitted) < 0.01 < 0.2 < worst(without, capacity.NO_LAG)


def test_without_a_lag_the_lag_fit_is_the_plain_law():
    iso = isolated(10_000.0, 1_500.0, sizes=30)
    found, fitted = capacity.fit_with_lag(iso, R, np.full(len(iso), T0), "shared_plus_window")
    assert found.S == pytest.approx(10_000.0, rel=0.01)
    assert found.q == pytest.approx(1_500.0, rel=0.01)
    assert fitted.fraction == pytest.approx(0.0, abs=0.01)


def test_a_held_lag_is_the_one_the_knee_is_fitted_with():
    lag = capacity.DrainLag(0.5, 0.5)
    iso = isolated(20_000.0, 0.0, lag=lag, sizes=30)
    found = capacity.fit(iso, R, np.full(len(iso), T0), "shared", lag=lag)
    assert found.S == pytest.approx(20_000.0, rel=0.01)
