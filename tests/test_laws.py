"""The Burst-Gap laws against hand-computed cases (us, bytes, bytes/us).

The running example: T0 = 1 us, V = 1000 bytes, R = 100 bytes/us, so V/R = 10 us.
"""

import numpy as np
import pytest

from xstage_bench.model import laws


def test_rate_conversion():
    assert laws.gbps_to_bytes_per_us(365.0) == pytest.approx(365_000.0)
    assert laws.bytes_per_us_to_gbps(717_000.0) == pytest.approx(717.0)


def test_period_is_the_slower_of_issue_plus_gap_and_drain():
    assert laws.period(1, 2, 1000, 100) == pytest.approx(10.0)  # drain-bound
    assert laws.period(1, 20, 1000, 100) == pytest.approx(21.0)  # issue + gap


def test_issue_time_overhead_and_hiding_gap():
    assert laws.issue_time(1, 2, 1000, 100) == pytest.approx(8.0)
    assert laws.issue_time(1, 20, 1000, 100) == pytest.approx(1.0)
    assert laws.hiding_gap(1, 1000, 100) == pytest.approx(9.0)
    assert laws.hiding_gap(20, 1000, 100) == pytest.approx(0.0)


def test_backlog_and_isolated_burst():
    assert laws.backlog_peak(1, 1000, 100) == pytest.approx(900.0)
    assert laws.backlog_peak(20, 1000, 100) == pytest.approx(0.0)
    assert laws.isolated_issue_time(1, 1000, 300, 100) == pytest.approx(7.0)  # (V-Q)/R
    assert laws.isolated_issue_time(1, 1000, 995, 100) == pytest.approx(1.0)  # T0


def test_train_issue_time_never_beats_the_isolated_burst():
    # Q = 300: a burst alone stalls (V-Q)/R = 7 us.
    assert laws.train_issue_time(1, 2, 1000, 100, 300) == pytest.approx(8.0)  # periodic law
    assert laws.train_issue_time(1, 5, 1000, 100, 300) == pytest.approx(7.0)  # isolated law
    assert laws.train_issue_time(1, 50, 1000, 100, 300) == pytest.approx(7.0)


def test_laws_broadcast_and_agree_with_each_other():
    rng = np.random.default_rng(1)
    T0, G = rng.uniform(0.1, 5, 50), rng.uniform(0, 30, 50)
    V, R = rng.uniform(1e4, 1e7, 50), rng.uniform(1e4, 1e6, 50)
    np.testing.assert_allclose(laws.period(T0, G, V, R) - G, laws.issue_time(T0, G, V, R))
    gstar = laws.hiding_gap(T0, V, R)  # the gap at which the issue time falls to T0
    np.testing.assert_allclose(laws.issue_time(T0, gstar, V, R), T0)
    hidden = gstar > 0
    assert np.all(laws.issue_time(T0, gstar - 0.01, V, R)[hidden] > T0[hidden])
    assert laws.period(1.0, np.array([2.0, 20.0]), 1000, 100).shape == (2,)


def test_train_period_adds_the_gap_to_the_train_issue_time():
    # Q = 300: the isolated stall (7 us) outlasts the periodic law once G > 3 us.
    assert laws.train_period(1, 2, 1000, 100, 300) == pytest.approx(10.0)  # V/R
    assert laws.train_period(1, 50, 1000, 100, 300) == pytest.approx(57.0)  # stall + G
    assert laws.train_period(1, 50, 1000, 100, 5000) == pytest.approx(51.0)  # T0 + G


def test_the_capacity_law_has_the_shared_Q_and_the_window_as_its_special_cases():
    assert laws.capacity(132, 1 << 20, 0) == pytest.approx(1 << 20)  # shared: q = 0
    assert laws.capacity(132, 0, 16384) == pytest.approx(132 * 16384)  # window: S = 0
    np.testing.assert_allclose(laws.capacity([33, 66], 1000.0, 10.0), [1330.0, 1660.0])


def test_the_capped_law_saturates_at_its_ceiling_and_holds_the_others():
    K = np.array([33, 66, 132, 264])
    S, q, C = 1 << 19, 24 * 1024, 2.75 * (1 << 20)
    np.testing.assert_allclose(laws.capacity(K, S, q, C), np.minimum(S + K * q, C))
    assert laws.capacity(66, S, q, C) == pytest.approx(S + 66 * q)  # below the ceiling
    assert laws.capacity(264, S, q, C) == pytest.approx(C)  # at it
    # special cases: no ceiling (the default, inf), a ceiling above every K, the shared Q
    np.testing.assert_allclose(laws.capacity(K, S, q), S + K * q)
    np.testing.assert_allclose(laws.capacity(K, S, q, S + 264 * q), S + K * q)
    np.testing.assert_allclose(laws.capacity(K, 1 << 20, 0, 2 << 20), 1 << 20)
    # a ceiling below S caps every K: one shared capacity C
    np.testing.assert_allclose(laws.capacity(K, 4 << 20, q, C), C)


def test_a_lagging_drain_stalls_a_burst_less_near_the_knee_and_more_beyond():
    # Q = 300, R = 100, lag 0.5 (Q/R = 3 us: R starts 1.5 us late), 0.5 R until then
    assert laws.stall_time(1000, 300, 100) == pytest.approx(7.0)  # no lag: (V - Q)/R
    assert laws.stall_time(400, 300, 100, 0.5, 0.5) == pytest.approx(2.0)  # 100 at 50/us
    assert laws.stall_time(1000, 300, 100, 0.5, 0.5) == pytest.approx(8.5)  # (V - 150)/R
    assert laws.isolated_issue_time(1, 1000, 300, 100, 0.5, 0.5) == pytest.approx(8.5)
    assert laws.isolated_issue_time(1, 250, 300, 100, 0.5, 0.5) == pytest.approx(1.0)  # T0
    # a drain that stops for lag Q/R: the stall jumps by 1.5 us at the knee
    assert laws.stall_time(301, 300, 100, 0.5, 0.0) == pytest.approx(1.51)


def test_the_lagging_stall_is_when_the_drain_has_made_room():
    """stall_time inverts the drained bytes max(lag_rate R t, R t - lag Q)."""
    rng = np.random.default_rng(2)
    Q, R = rng.uniform(1e5, 1e6, 40), rng.uniform(1e3, 1e5, 40)
    lag, rate = rng.uniform(0, 1, 40), rng.uniform(0, 1, 40)
    V = Q + rng.uniform(1e3, 1e7, 40)
    t = laws.stall_time(V, Q, R, lag, rate)
    drained = np.maximum(rate * R * t, R * t - lag * Q)
    np.testing.assert_allclose(drained, V - Q, rtol=1e-9)
    assert np.all(t >= (V - Q) / R)  # a lagging drain never makes room sooner


def test_the_train_laws_take_the_lag_of_the_isolated_burst():
    # G = 50 drains the path: each burst is isolated, (V - 150)/R = 8.5 us
    assert laws.train_issue_time(1, 50, 1000, 100, 300, 0.5, 0.5) == pytest.approx(8.5)
    assert laws.train_period(1, 50, 1000, 100, 300, 0.5, 0.5) == pytest.approx(58.5)
    assert laws.train_issue_time(1, 2, 1000, 100, 300, 0.5, 0.5) == pytest.approx(8.5)
