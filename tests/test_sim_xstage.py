"""The X-Stage simulator: the Burst-Gap laws must come out of its own dynamics.

Test path: per-producer issue rate a = 10 GB/s (10000 bytes/us), drain R = 20 GB/s
(20000 bytes/us), t0_fixed = 0.5 us. K = 8 producers of B = 10000 bytes: V = 80000,
T0 = 0.5 + 1 = 1.5 us, V/R = 4 us, G* = 2.5 us.
"""

from dataclasses import replace

import numpy as np
import pytest
from fixtures import MICROBENCH_DEFAULTS

from xstage_bench.data.hardware import HardwareProfile
from xstage_bench.data.results import read_raw
from xstage_bench.megamoe import drain
from xstage_bench.model import laws
from xstage_bench.sim import run, xstage

K, B, V = 8, 10_000, 80_000
T0, R = 1.5, 20_000.0


def profile(capacity: float) -> HardwareProfile:
    return HardwareProfile(
        name="test",
        sm_count=8,
        t0_fixed_us=0.5,
        issue_rate_per_sm_GBps=10.0,
        drain_rate_GBps=20.0,
        capacity_bytes=capacity,
        nvlink_line_rate_GBps=25.0,
    )


def params(capacity: float = 100_000) -> drain.PathParams:
    return xstage.path_params(profile(capacity))


def steady(trace: xstage.BurstTrace, warmup: int = 6):
    """The bursts after the path has reached its steady state (the laws' regime)."""
    return trace.t_iss_slowest()[warmup:], trace.period()[warmup:]


def test_processor_sharing_on_a_full_path():
    # Two issuers of 500 bytes: the path (Q=100) fills at 2*50-10 = 90 bytes/us, then
    # each admits R/2; both finish when all but Q has drained: (1000-100)/10 = 90 us.
    path = drain.StorePath(drain=10.0, capacity=100.0, issue_rate=50.0)
    path.add("a", 500)
    path.add("b", 500)
    finished = []
    while path.n:
        t = path.next_time()
        finished += [(tok, t) for tok, _ in path.advance(t)]
    assert sorted(tok for tok, _ in finished) == ["a", "b"]
    assert all(t == pytest.approx(90.0) for _, t in finished)
    assert path.empty_time() == pytest.approx(100.0)


def assert_two_issuers_run(path: drain.StorePath, want: list[tuple]) -> None:
    """Issuers a (200 bytes) and b (1000) start together on `path`; each event is (time,
    level, capacity, who finished) as `want` lists them."""
    path.add("a", 200.0)
    path.add("b", 1000.0)
    steps = []
    while path.n:
        t = path.next_time()
        done = path.advance(t)
        steps.append((t, path.q, path.capacity, [tok for tok, _ in done]))
    assert len(steps) == len(want)
    for got, (t, q, cap, done) in zip(steps, want, strict=True):
        assert got == (pytest.approx(t, abs=1e-4), pytest.approx(q), cap, done)


def test_the_capacity_grows_with_the_producers_issuing_and_shrinks_when_one_leaves():
    # Q(K) = S + K q with S = 100, q = 50. Two issuers (200 and 1000 bytes) fill Q(2) = 200
    # at 90 bytes/us (2.22 us), then admit R/2 each: a's last byte at 20 us. Q(1) = 150:
    # the 50 bytes beyond it drain first (5 us), then b admits at R: 800 more by 105 us.
    path = drain.StorePath(drain=10.0, capacity=100.0, issue_rate=50.0, capacity_per_issuer=50.0)
    want = [
        (2.2222, 200, 200, []),
        (20, 200, 150, ["a"]),
        (25, 150, 150, []),
        (105, 150, 100, ["b"]),
    ]
    assert_two_issuers_run(path, want)
    # first in, first out: b's last byte drains when all 150 still held have
    assert path.empty_time() == pytest.approx(120.0)


def test_the_capacity_stops_growing_at_its_ceiling():
    # Q(K) = min(S + K q, C) with S = 100, q = 50, C = 175: two issuers (200 and 1000
    # bytes) fill Q(2) = 175, not 200, at 90 bytes/us (1.94 us), then admit R/2 each: a's
    # last byte at 22.5 us. Q(1) = 150: the 25 bytes beyond it drain first (2.5 us), then b
    # admits at R: 800 more by 105 us.
    path = drain.StorePath(
        drain=10.0,
        capacity=100.0,
        issue_rate=50.0,
        capacity_per_issuer=50.0,
        capacity_ceiling=175.0,
    )
    want = [
        (1.9444, 175, 175, []),
        (22.5, 175, 150, ["a"]),
        (25, 150, 150, []),
        (105, 150, 100, ["b"]),
    ]
    assert_two_issuers_run(path, want)


@pytest.mark.parametrize("producers", [2, 8, 32])
def test_a_profile_with_a_ceiling_caps_the_capacity_of_a_run(producers):
    """Q(K) = min(10000 + K 5000, 30000): below the ceiling at K = 2, at it from K = 4 on."""
    law = replace(profile(10_000), capacity_per_producer_bytes=5_000, capacity_ceiling_bytes=30_000)
    assert xstage.path_params(law).capacity_ceiling == 30_000
    assert xstage.path_params(law, "local").capacity_ceiling == 300_000
    assert xstage.path_params(profile(10_000)).capacity_ceiling == float("inf")
    point = {"kind": "isolated", "K": producers, "B": B, "V": producers * B, "gap_us": 0.0}
    samples = xstage.simulate_microbench_point(
        {**point, "sync": "barrier"},
        law,
        bursts=1,
        warmup_bursts=0,
        launches=1,
        rng=np.random.default_rng(0),
    )
    Q = laws.capacity(producers, 1e4, 5e3, 3e4)
    expected = laws.isolated_issue_time(0.5 + B / 10_000, producers * B, Q, R)
    assert samples["t_iss_slowest_us"][0] == pytest.approx(float(expected))


@pytest.mark.parametrize("G", [0.0, 1.0, 2.0, 2.5, 5.0, 30.0])
def test_steady_train_follows_the_periodic_laws(G):
    t_iss, per = steady(xstage.simulate_bursts(K, B, 16, G, params()))
    np.testing.assert_allclose(t_iss, laws.issue_time(T0, G, V, R), rtol=1e-9)
    np.testing.assert_allclose(per, laws.period(T0, G, V, R), rtol=1e-9)


def test_zero_gap_period_is_V_over_R_for_every_split():
    for k in (4, 8, 16):
        _, per = steady(xstage.simulate_bursts(k, V // k, 16, 0.0, params()))
        np.testing.assert_allclose(per, V / R, rtol=1e-9)


def test_long_gap_gives_the_backpressure_free_issue_time():
    for b in (2_000, 10_000, 40_000):
        t_iss, _ = steady(xstage.simulate_bursts(K, b, 8, 60.0, params(10 * K * b)))
        np.testing.assert_allclose(t_iss, params().t0_us(b), rtol=1e-9)


def test_issuer_resumes_work_during_the_x_stage():
    # Below G* the issuer pays V/R - G, not the completion-coupled G + V/R.
    _, per = steady(xstage.simulate_bursts(K, B, 16, 2.0, params()))
    assert per == pytest.approx(np.full_like(per, 4.0))
    assert per[0] < 2.0 + V / R  # not the completion-coupled period G + V/R = 6 us


def test_isolated_burst_beyond_Q_stalls_to_the_drain():
    Q = 30_000
    trace = xstage.simulate_bursts(K, B, 1, 0.0, params(Q))
    law = laws.isolated_issue_time(T0, V, Q, R)  # (V-Q)/R = 2.5 us
    # The fixed overhead overlaps the stores (PathParams.issue_end): the sim is the law,
    # so the fit of its own output recovers Q (see test_fit).
    assert trace.t_iss_slowest()[0] == pytest.approx(law, rel=1e-12)
    # The drain runs from the first byte, at the start, to the last: visible after V/R.
    assert trace.drained_at == pytest.approx(V / R)


@pytest.mark.parametrize("Q", [1_000, 30_000, 60_000, 70_000, 79_000, 200_000])
def test_isolated_burst_is_the_law_at_every_capacity(Q):
    trace = xstage.simulate_bursts(K, B, 1, 0.0, params(Q))
    assert trace.t_iss_slowest()[0] == pytest.approx(laws.isolated_issue_time(T0, V, Q, R))


def lagged(capacity: float, fraction: float, rate_ratio: float, per_issuer: float = 0.0):
    return replace(
        params(capacity),
        capacity_per_issuer=per_issuer,
        lag_fraction=fraction,
        lag_rate_ratio=rate_ratio,
    )


# Q = 30000 (V - Q = 50000): 1000 and 20000 stall on the slow start, 80000 on (1 - f) Q.
@pytest.mark.parametrize("per_producer", [1_000, 4_000, 10_000, 20_000, 80_000])
@pytest.mark.parametrize(("fraction", "rate_ratio"), [(0.4, 0.5), (0.7, 0.0), (0.2, 0.9)])
@pytest.mark.parametrize(("shared", "per_issuer"), [(30_000, 0.0), (6_000, 3_000.0)])
def test_an_isolated_burst_through_a_lagging_drain_is_the_lagged_law(
    per_producer, fraction, rate_ratio, shared, per_issuer
):
    # laws.stall_time: min((V - Q)/(rho R), (V - (1 - f) Q)/R) beyond the knee, Q = Q(K)
    path = lagged(shared, fraction, rate_ratio, per_issuer)
    trace = xstage.simulate_bursts(K, per_producer, 1, 0.0, path)
    T0_burst = 0.5 + per_producer / 10_000
    Q = laws.capacity(K, shared, per_issuer)
    law = laws.isolated_issue_time(T0_burst, K * per_producer, Q, R, fraction, rate_ratio)
    assert trace.t_iss_slowest()[0] == pytest.approx(float(law), rel=1e-9)


def test_no_lag_is_todays_drain_and_a_drained_gap_meets_the_slow_start_again():
    # f = 0, or rho = 1 (min((V - Q)/R, ...) is (V - Q)/R): the paper's (V - Q)/R
    for path in (lagged(30_000, 0.0, 0.5), lagged(30_000, 0.5, 1.0)):
        trace = xstage.simulate_bursts(K, B, 1, 0.0, path)
        assert trace.t_iss_slowest()[0] == pytest.approx(2.5)
    # A gap that drains the path: every burst is the isolated one, lag and all; zero gap:
    # the path never idles, so the drain stays at R and the period is V/R.
    path = lagged(30_000, 0.4, 0.5)
    isolated = laws.isolated_issue_time(T0, V, 30_000, R, 0.4, 0.5)
    drained = xstage.simulate_bursts(K, B, 4, 10.0, path, sync="barrier")
    assert drained.t_iss_slowest() == pytest.approx(np.full(4, float(isolated)))
    _, period = steady(xstage.simulate_bursts(K, B, 16, 0.0, path))
    assert period == pytest.approx(np.full_like(period, V / R))


def test_a_lagging_drain_holds_the_last_byte_through_its_slow_start():
    # drain 10, at 5 until 20 bytes behind (f = 0.2 of Q = 100): 4 us of slow start. One
    # issuer of 30 bytes passes at 50 bytes/us, admitted by 0.6 us with 27 held (3 drained):
    # 17 more drain at 5 by 4 us, the last 10 at 10 by 5 us.
    path = drain.StorePath(
        drain=10.0, capacity=100.0, issue_rate=50.0, lag_fraction=0.2, lag_rate_ratio=0.5
    )
    path.add("a", 30.0)
    t = path.next_time()
    assert path.advance(t) == [("a", 1)] and t == pytest.approx(0.6)
    assert path.empty_time() == pytest.approx(5.0)
    path.advance(7.0)  # idle: through the slow start's end to empty
    assert (path.q, path.empty_time()) == (0.0, 7.0)
    with pytest.raises(ValueError, match="drain lag"):
        drain.StorePath(drain=10.0, capacity=100.0, issue_rate=50.0, lag_fraction=1.5)


@pytest.mark.parametrize("producers", [2, 8, 32])
def test_the_capacity_follows_the_law_for_the_producers_of_a_run(producers):
    """Q(K) = S + K q: S = 10000 bytes shared, q = 5000 bytes per producer."""
    law = replace(profile(10_000), capacity_per_producer_bytes=5_000)
    peer = xstage.path_params(law)
    assert (peer.capacity, peer.capacity_per_issuer) == (10_000, 5_000)
    local = xstage.path_params(law, "local")
    assert (local.capacity, local.capacity_per_issuer) == (100_000, 50_000)
    # a microbench point meets its own K's capacity: the isolated law with Q(K)
    point = {"kind": "isolated", "K": producers, "B": B, "V": producers * B, "gap_us": 0.0}
    rng = np.random.default_rng(0)
    samples = xstage.simulate_microbench_point(
        {**point, "sync": "barrier"}, law, bursts=1, warmup_bursts=0, launches=1, rng=rng
    )
    T0 = 0.5 + B / 10_000
    expected = laws.isolated_issue_time(T0, producers * B, laws.capacity(producers, 1e4, 5e3), R)
    assert samples["t_iss_slowest_us"][0] == pytest.approx(float(expected))


def test_an_event_loop_that_cannot_finish_raises():
    # A 1 ms fixed overhead beside a 1 PB/s issue rate: at t ~ 1e6 us the step that would
    # finish a burst is below the float clock's resolution. It must raise, not spin.
    stuck = drain.PathParams(t0_fixed_us=1e6, issue_rate=1e9, drain=1e9, capacity=1e9)
    with pytest.raises(drain.SimulationError, match="ran past .* steps"):
        xstage.simulate_bursts(K, B, 4, 0.0, stuck)
    with pytest.raises(drain.SimulationError, match="more than the simulator's bound"):
        xstage.simulate_bursts(K, B, 10**9, 0.0, params())


def test_isolated_burst_within_Q_issues_in_T0():
    trace = xstage.simulate_bursts(K, B, 1, 0.0, params(100_000))
    assert trace.t_iss_slowest()[0] == pytest.approx(T0)


def test_first_bursts_fill_the_path_and_are_faster():
    trace = xstage.simulate_bursts(K, B, 16, 0.0, params())
    slowest = trace.t_iss_slowest()
    assert slowest[0] == pytest.approx(T0)
    assert slowest[-1] == pytest.approx(V / R)


def test_free_producers_drift_apart_and_a_barrier_realigns_them():
    rng = np.random.default_rng(3)
    offsets = rng.uniform(0.0, 1.0, K)
    free = xstage.simulate_bursts(K, B, 16, 1.0, params(), start_offsets_us=offsets)
    barrier = xstage.simulate_bursts(
        K, B, 16, 1.0, params(), sync="barrier", start_offsets_us=offsets
    )
    lockstep = xstage.simulate_bursts(K, B, 16, 1.0, params())
    assert np.all(free.t_iss_window()[4:] > free.t_iss_slowest()[4:])
    np.testing.assert_allclose(barrier.t_iss_window(), barrier.t_iss_slowest())
    np.testing.assert_allclose(barrier.t_iss_slowest(), lockstep.t_iss_slowest())


def test_barrier_waits_for_the_slowest_then_the_gap():
    trace = xstage.simulate_bursts(K, B, 6, 3.0, params(), sync="barrier")
    np.testing.assert_allclose(np.diff(trace.start[:, 0]), trace.t_iss_slowest()[:-1] + 3.0)


def test_ceilings_and_local_path():
    p = profile(100_000)
    rng = np.random.default_rng(0)
    kw = dict(bursts=4, warmup_bursts=1, launches=2, rng=rng)
    big = 64 << 20
    peer = xstage.simulate_microbench_point(
        {"kind": "ceiling", "method": "sm_store", "dest": "peer", "V": big}, p, **kw
    )
    local = xstage.simulate_microbench_point(
        {"kind": "ceiling", "method": "sm_store", "dest": "local", "V": big}, p, **kw
    )
    copy = xstage.simulate_microbench_point(
        {"kind": "ceiling", "method": "copy_engine", "dest": "peer", "V": big}, p, **kw
    )
    assert peer["bandwidth_GBps"][0] == pytest.approx(20.0, rel=1e-3)
    # The local path drains 10x faster, so 8 SMs at 10 GB/s each become the limit.
    assert 20.0 * xstage.LOCAL_PATH_FACTOR > 80.0
    assert local["bandwidth_GBps"][0] == pytest.approx(80.0, rel=1e-2)
    assert copy["bandwidth_GBps"] == [pytest.approx(25.0 * xstage.COPY_ENGINE_EFFICIENCY)] * 2


def test_narrow_stores_issue_slower_and_several_peers_are_unsupported():
    assert xstage.path_params(profile(1e5), width=4).issue_rate == pytest.approx(10_000 / 4)
    point = {"kind": "periodic", "K": K, "B": B, "V": V, "gap_us": 0.0, "peers": 2, "sync": "free"}
    with pytest.raises(xstage.UnsupportedPoint, match="peers=2"):
        xstage.simulate_microbench_point(
            point, profile(1e5), bursts=4, warmup_bursts=1, launches=1, rng=np.random.default_rng(0)
        )


def microbench_config(**study) -> dict:
    return {
        "microbench": {
            "bursts": 10,
            "warmup_bursts": 3,
            "launches": 2,
            "defaults": dict(MICROBENCH_DEFAULTS),
            "studies": {"s": study},
        }
    }


def test_simulate_microbench_writes_a_valid_labelled_raw_file(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text(
        "name: t\nsm_count: 8\nt0_fixed_us: 0.5\nissue_rate_per_sm_GBps: 10\n"
        "drain_rate_GBps: 20\ncapacity_bytes: 100000\nnvlink_line_rate_GBps: 25\n"
    )
    cfg = microbench_config(kind="periodic", K=[K], V=[V], gap_us=[0, 30], peers=[1, 2])
    out = tmp_path / "raw" / "s.json"
    run.simulate_microbench(cfg, str(prof), "s", "sim-test", str(out))
    doc = read_raw(out)
    assert doc["backend"] == "sim" and doc["environment"]["simulated"] is True
    assert doc["environment"]["hardware_profile"]["capacity_bytes"] == 100000
    assert doc["config"]["sim"]["noise_rel"] == 0.01
    by_status = {}
    for r in doc["records"]:
        by_status.setdefault(r["status"], []).append(r)
    assert len(by_status["unsupported"]) == 2 and len(by_status["ok"]) == 2
    zero = next(r for r in by_status["ok"] if r["point"]["gap_us"] == 0)
    assert len(zero["samples"]["t_iss_slowest_us"]) == (10 - 3) * 2
    assert len(zero["samples"]["warmup_t_iss_slowest_us"]) == 3 * 2
    assert len(zero["samples"]["period_us"]) == (10 - 3 - 1) * 2
    summary = zero["summary"]["period_us"]
    assert summary["median"] == pytest.approx(V / R, rel=0.01)
    assert summary["rel_iqr"] > 0  # the seeded noise makes the spread non-degenerate
    # Seeded: a second run gives the same samples.
    out2 = tmp_path / "raw" / "s2.json"
    run.simulate_microbench(cfg, str(prof), "s", "sim-test", str(out2))
    assert read_raw(out2)["records"] == doc["records"]


def test_noise_free_run_and_drain_probe(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text(
        "name: t\nsm_count: 8\nt0_fixed_us: 0.5\nissue_rate_per_sm_GBps: 10\n"
        "drain_rate_GBps: 20\ncapacity_bytes: 30000\nnvlink_line_rate_GBps: 25\n"
    )
    cfg = microbench_config(kind="drain_probe", K=[K], V=[V])
    out = tmp_path / "probe.json"
    run.simulate_microbench(
        cfg, str(prof), "s", "sim-test", str(out), run.SimOptions(noise_rel=0.0)
    )
    (record,) = read_raw(out)["records"]
    assert record["samples"]["visible_us"] == [pytest.approx(V / R)] * 2
    assert record["samples"]["t_iss_slowest_us"] == [pytest.approx((V - 30000) / R)] * 2


def test_trace_statistics_by_hand():
    # Two producers (cohorts), three bursts: starts and ends by hand.
    trace = xstage.BurstTrace(
        start=np.array([[0.0, 1.0], [4.0, 5.0], [9.0, 12.0]]),
        end=np.array([[2.0, 4.0], [7.0, 6.0], [10.0, 13.5]]),
        drained_at=20.0,
    )
    np.testing.assert_allclose(trace.t_iss_slowest(), [3.0, 3.0, 1.5])  # longest own loop
    np.testing.assert_allclose(trace.t_iss_window(), [4.0, 3.0, 4.5])  # first start, last end
    # each producer's own start-to-start: (4, 4) then (5, 7); the median over producers
    np.testing.assert_allclose(trace.period(), [4.0, 6.0])


def test_start_jitter_spreads_the_producers_of_a_free_running_train():
    point = {"kind": "periodic", "K": K, "B": B, "gap_us": 1.0, "sync": "free"}
    kw = dict(bursts=8, warmup_bursts=2, launches=1)

    def samples(jitter):
        rng = np.random.default_rng(0)
        return xstage.simulate_microbench_point(
            point, profile(100_000), rng=rng, start_jitter_us=jitter, **kw
        )

    still, jittered = samples(0.0), samples(5.0)
    assert still["t_iss_window_us"] == still["t_iss_slowest_us"]  # lock-step: one cohort
    # up to 5 us between the first producer's start and the last one's end
    assert min(np.subtract(jittered["t_iss_window_us"], jittered["t_iss_slowest_us"])) > 0.5


def test_bad_paths_trains_and_offsets_are_refused():
    with pytest.raises(ValueError, match="positive drain and issue rate"):
        drain.StorePath(drain=0.0, capacity=1.0, issue_rate=1.0)
    with pytest.raises(ValueError, match="bad burst train"):
        xstage.simulate_bursts(K, B, 4, -1.0, params())
    with pytest.raises(ValueError, match="need 8 start offsets"):
        xstage.simulate_bursts(K, B, 4, 0.0, params(), start_offsets_us=np.zeros(3))
    path = drain.StorePath(drain=10.0, capacity=100.0, issue_rate=50.0)
    path.advance(5.0)
    with pytest.raises(ValueError, match="back in time"):
        path.advance(4.0)
