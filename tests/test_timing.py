import contextlib
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from xstage_bench.data.config import load_config
from xstage_bench.data.results import ok_record
from xstage_bench.measurement import timing
from xstage_bench.measurement.timing import (
    BUDGET,
    MAX_REPS,
    STABLE,
    Samples,
    TimingError,
    TimingPolicy,
    cuda_event_timer,
    measure,
    measure_fixed,
    relative_iqr,
)

ROOT = Path(__file__).resolve().parents[1]


def policy(**overrides) -> TimingPolicy:
    values = dict(
        warmup=2, min_reps=5, max_reps=20, target_rel_iqr=0.02, budget_s=100.0, flush_l2=False
    )
    values.update(overrides)
    return TimingPolicy(**values)


def scripted(values):
    """A run_once that returns the scripted values in order, counting calls."""
    it = iter(values)

    def run_once():
        run_once.calls += 1
        return next(it)

    run_once.calls = 0
    return run_once


def test_stops_early_when_stable_and_discards_warmup():
    run_once = scripted([900.0, 800.0] + [100.0, 100.5, 99.8, 100.2, 100.1] + [500.0] * 50)
    samples = measure(run_once, policy())
    assert samples == [100.0, 100.5, 99.8, 100.2, 100.1]  # the warm-up 900/800 are gone
    assert samples.stop_reason == STABLE
    assert samples.warmup == 2
    assert run_once.calls == 7


def test_stable_needs_min_reps_first():
    run_once = scripted([0.0, 0.0] + [10.0] * 50)
    samples = measure(run_once, policy(min_reps=8))
    assert len(samples) == 8
    assert samples.stop_reason == STABLE


def test_noisy_runs_to_max_reps():
    run_once = scripted([1.0, 1.0] + [50.0, 150.0] * 50)
    samples = measure(run_once, policy(max_reps=12))
    assert len(samples) == 12
    assert samples.stop_reason == MAX_REPS


def test_budget_stops_with_fake_clock():
    now = [0.0]

    def clock():
        return now[0]

    def run_once():
        now[0] += 0.3  # each call costs 0.3 s of fake wall-clock time
        run_once.calls += 1
        return 50.0 if run_once.calls % 2 else 150.0

    run_once.calls = 0
    samples = measure(run_once, policy(budget_s=2.0, min_reps=5, warmup=3), clock=clock)
    # The budget starts after the 3 warm-up calls: 7 timed calls reach 2.1 s >= 2.0 s.
    assert len(samples) == 7
    assert samples.stop_reason == BUDGET
    assert samples.elapsed_s == pytest.approx(2.1)


def test_budget_never_cuts_below_min_reps():
    now = [0.0]

    def run_once():
        now[0] += 5.0
        run_once.calls += 1
        return 7.0 if run_once.calls % 2 else 9.0  # noisy: never STABLE

    run_once.calls = 0
    samples = measure(run_once, policy(budget_s=1.0, min_reps=5, warmup=0), clock=lambda: now[0])
    assert len(samples) == 5 and samples.stop_reason == BUDGET


def test_samples_feed_ok_record_as_a_list():
    samples = measure(scripted([1.0] * 10), policy(warmup=0))
    assert isinstance(samples, list)
    record = ok_record("p", {"id": "p"}, {"time_us": samples})
    assert record["samples"]["time_us"] == [1.0] * 5
    assert record["summary"]["time_us"]["rel_iqr"] == 0.0


def test_non_finite_sample_is_an_error():
    with pytest.raises(TimingError, match="nan"):
        measure(scripted([float("nan")] * 10), policy(warmup=0))


def test_relative_iqr_matches_definition():
    assert relative_iqr([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.0 - 2.0) / 3.0)
    assert relative_iqr([0.0, 0.0, 0.0]) == 0.0


def test_policy_from_repo_config():
    cfg = load_config(ROOT / "config.yaml")
    p = TimingPolicy.from_config(cfg["timing"])
    assert p.min_reps == cfg["timing"]["min_reps"] and p.flush_l2 == cfg["timing"]["flush_l2"]


def test_policy_errors_name_the_key():
    good = dict(warmup=1, min_reps=3, max_reps=5, target_rel_iqr=0.1, budget_s=1.0, flush_l2=False)
    with pytest.raises(ValueError, match="timing.budget_s"):
        TimingPolicy.from_config({k: v for k, v in good.items() if k != "budget_s"})
    with pytest.raises(ValueError, match="timing.bogus"):
        TimingPolicy.from_config({**good, "bogus": 1})
    with pytest.raises(ValueError, match="timing.max_reps"):
        TimingPolicy.from_config({**good, "max_reps": 2})


def test_cuda_timers_without_torch_raise_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(TimingError, match="torch, which is not installed"):
        cuda_event_timer(lambda: None, device=0, flush_l2=False)


def test_cuda_timers_without_cuda_raise_clear_error(monkeypatch):
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake)
    with pytest.raises(TimingError, match="is_available"):
        cuda_event_timer(lambda: None, device=0, flush_l2=True)


def fake_torch(log: list, l2_bytes: int = 4096, elapsed_ms: float = 2.0, started=()):
    """Just enough of torch.cuda to check what the timers enqueue, and in which order.
    `started`: what the start event's query answers, call after call (then False)."""
    started = list(started)

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self, stream):
            log.append("event")

        def query(self):
            return bool(started.pop(0)) if started else False

        def synchronize(self):
            log.append("sync")

        def elapsed_time(self, other):
            return elapsed_ms

    class Buffer:
        def __init__(self, size):
            self.size = size

        def zero_(self):
            log.append(f"flush {self.size}")

    class Graph:
        def replay(self):
            log.append("replay")

    stream = types.SimpleNamespace(wait_stream=lambda other: None)
    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        device=lambda d: contextlib.nullcontext(),
        stream=lambda s: contextlib.nullcontext(),
        current_stream=lambda d=None: stream,
        Stream=lambda d=None: stream,
        Event=Event,
        CUDAGraph=Graph,
        graph=lambda g: contextlib.nullcontext(),
        get_device_properties=lambda d: types.SimpleNamespace(L2_cache_size=l2_bytes),
        _sleep=lambda cycles: log.append(f"sleep {cycles}"),
    )
    return types.SimpleNamespace(
        cuda=cuda,
        uint8="uint8",
        device=lambda kind, index: f"{kind}:{index}",
        empty=lambda size, dtype, device: Buffer(size),
    )


def test_event_timer_flushes_exact_l2_outside_timed_region(monkeypatch):
    log = []
    monkeypatch.setitem(sys.modules, "torch", fake_torch(log, l2_bytes=60 * 2**20))
    run_once = cuda_event_timer(lambda: log.append("fn"), device=0, flush_l2=True)
    assert run_once() == pytest.approx(2000.0)  # 2 ms -> microseconds
    assert log == [f"flush {60 * 2**20}", "event", "fn", "event", "sync"]


def test_host_lead_keeps_the_gpu_busy_through_the_enqueue_and_counts_waits(monkeypatch):
    log = []
    # The start event had already passed when the host finished its second call only.
    monkeypatch.setitem(sys.modules, "torch", fake_torch(log, started=[False, True]))
    clock = iter([0.0, 100e-6, 5.0, 5.0 + 30e-6])  # enqueues of 100 us, then 30 us
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    lead = timing.HostLead()
    run_once = cuda_event_timer(lambda: log.append("fn"), device=0, flush_l2=True, lead=lead)
    run_once()
    run_once()
    cycles = timing.HostLead.CYCLES_PER_US
    first, then = timing.HostLead.FIRST_US, 2 * 100 + timing.HostLead.MARGIN_US
    flush = f"flush {4096}"
    assert log == [
        *(flush, f"sleep {int(first * cycles)}", "event", "fn", "event", "sync"),
        *(flush, f"sleep {int(then * cycles)}", "event", "fn", "event", "sync"),
    ]
    extra = lead.as_extra()
    assert extra["host_enqueue_us"] == pytest.approx(65.0)
    assert extra["gpu_waited_for_host"] == 1 and extra["host_lead_calls"] == 2
    assert timing.lead_facts(lead) == extra and timing.lead_facts(None) == {}


def test_host_lead_follows_the_recent_enqueues_and_is_off_unless_asked():
    lead = timing.HostLead()
    lead.enqueue_us = [900.0] + [10.0] * timing.HostLead.RECENT
    assert lead.sleep_us() == 2 * 10.0 + timing.HostLead.MARGIN_US  # 900 us fell out
    assert timing.host_lead(policy()) is None
    assert isinstance(timing.host_lead(policy(host_lead=True)), timing.HostLead)
    with pytest.raises(ValueError, match="host_lead"):
        policy(host_lead="yes")
    # Not a key of the timing block: the experiment that wants it sets it.
    good = dict(warmup=1, min_reps=3, max_reps=5, target_rel_iqr=0.1, budget_s=1.0, flush_l2=False)
    with pytest.raises(ValueError, match="unknown key 'timing.host_lead'"):
        TimingPolicy.from_config({**good, "host_lead": True})


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda_available(), reason="needs torch with a CUDA device")
def test_real_gpu_timers():
    import torch

    x = torch.ones(1 << 20, device="cuda:0")
    p = policy(warmup=1, min_reps=3, max_reps=10, budget_s=5.0, flush_l2=True)
    samples = measure(cuda_event_timer(lambda: x.mul_(1.0), device=0, flush_l2=True), p)
    assert isinstance(samples, Samples) and all(s > 0 for s in samples)


def test_fixed_count_fits_the_budget_and_takes_the_agreed_count():
    # budget 100 s of 20 us calls would be millions: clipped to max_reps.
    run_once = scripted([20.0] * 100)
    assert measure_fixed(run_once, policy()) == [20.0] * 20
    assert run_once.calls == 2 + 20  # warm-up, then the first timed call and 19 more
    # 1 ms budget of 200 us calls: 5 (= min_reps); the ranks agree on rank 0's count, 7.
    run_once = scripted([200.0] * 100)
    seen = []
    samples = measure_fixed(run_once, policy(budget_s=0.001), agree=lambda n: seen.append(n) or 7)
    assert seen == [5] and len(samples) == 7


def test_paired_rounds_alternate_and_pair_samples():
    order = []
    times = {"a": iter(range(100, 200)), "b": iter(range(300, 400))}

    def arm(name):
        def run():
            order.append(name)
            return float(next(times[name]))

        return run

    policy = timing.TimingPolicy(
        warmup=1, min_reps=4, max_reps=4, target_rel_iqr=1e-9, budget_s=100.0, flush_l2=False
    )
    out = timing.measure_paired({"a": arm("a"), "b": arm("b")}, policy)
    # warm-up round (a b), then a b, b a, a b, b a
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert out["a"] == [101.0, 102.0, 103.0, 104.0] and out["b"] == [301.0, 302.0, 303.0, 304.0]
    assert out["a"].stop_reason == timing.MAX_REPS and out["a"].rounds == [0, 1, 2, 3]
    assert timing.paired_extra(["a", "b"], "b", out["b"])["position"] == [1, 0, 1, 0]


def test_paired_stops_when_every_arm_is_stable():
    steady = lambda: 5.0  # noqa: E731
    noisy = iter([1.0, 9.0] * 50)
    policy = timing.TimingPolicy(
        warmup=0, min_reps=3, max_reps=20, target_rel_iqr=0.05, budget_s=100.0, flush_l2=False
    )
    out = timing.measure_paired({"s": steady, "n": lambda: next(noisy)}, policy)
    assert len(out["s"]) == 20 and out["s"].stop_reason == timing.MAX_REPS


def test_policy_noisy_budget_is_optional_and_checked():
    good = dict(warmup=1, min_reps=3, max_reps=5, target_rel_iqr=0.1, budget_s=1.0, flush_l2=False)
    assert TimingPolicy.from_config(good).noisy_budget_s == 0.0
    assert TimingPolicy.from_config({**good, "noisy_budget_s": 2.5}).noisy_budget_s == 2.5
    with pytest.raises(ValueError, match="timing.noisy_budget_s"):
        TimingPolicy.from_config({**good, "noisy_budget_s": -1})


def noisy_pair(spread: float, rounds_until_quiet: int = 10**9):
    """Arms a and b (b 10% faster), b's samples spread by +-`spread` until
    `rounds_until_quiet` samples of b were taken, then steady."""
    rng = np.random.default_rng(0)
    taken = {"b": 0}

    def a():
        return 110.0

    def b():
        taken["b"] += 1
        if taken["b"] > rounds_until_quiet:
            return 100.0
        return 100.0 * (1 + spread * rng.uniform(-1, 1))

    return {"a": a, "b": b}


def test_a_noisy_ratio_is_measured_again_until_its_ci_is_within_target():
    # b is noisy for the first 12 samples (the whole first phase), steady after: the
    # extra rounds bring the paired CI within +-3% and the record says how many it took.
    p = policy(warmup=0, min_reps=4, max_reps=12, target_rel_iqr=0.01, noisy_budget_s=100.0)
    out = timing.measure_paired(noisy_pair(0.3, rounds_until_quiet=12), p, ratios=[("a", "b")])
    added = out["a"].remeasure.rounds_added
    assert added > 0 and added % p.min_reps == 0 and len(out["a"]) == 12 + added
    assert out["a"].remeasure.still_noisy == 0
    extra = timing.paired_extra(["a", "b"], "a", out["a"])["remeasure"]
    (ratio,) = extra["ratios"]
    assert extra["rounds_added"] == added and ratio["noisy"] is False
    assert (ratio["numerator"], ratio["denominator"]) == ("a", "b")
    assert ratio["ci_low"] > 1.0  # b faster, now clearly


def test_a_ratio_that_stays_noisy_is_left_noisy_at_the_round_cap():
    p = policy(warmup=0, min_reps=3, max_reps=3, target_rel_iqr=0.01, noisy_budget_s=100.0)
    out = timing.measure_paired(noisy_pair(0.9), p, ratios=[("a", "b")])
    cap = timing.NOISY_MAX_ROUNDS_FACTOR * p.max_reps
    assert out["a"].remeasure.rounds_added == cap and len(out["b"]) == p.max_reps + cap
    assert out["a"].remeasure.still_noisy == 1
    assert timing.paired_extra(["a", "b"], "b", out["b"])["remeasure"]["still_noisy"] == 1


def test_no_rounds_added_without_budget_or_when_quiet():
    p = policy(warmup=0, min_reps=4, max_reps=12, target_rel_iqr=0.01)  # noisy_budget_s 0
    out = timing.measure_paired(noisy_pair(0.6), p, ratios=[("a", "b")])
    assert out["a"].remeasure.rounds_added == 0 and out["a"].remeasure.still_noisy == 1
    quiet = policy(warmup=0, min_reps=4, max_reps=12, noisy_budget_s=100.0)
    out = timing.measure_paired(noisy_pair(0.0), quiet, ratios=[("a", "b")])
    assert out["a"].remeasure.rounds_added == 0 and len(out["a"]) == 4
    plain = timing.measure_paired(noisy_pair(0.0), quiet)
    assert plain["a"].remeasure is None
    assert "remeasure" not in timing.paired_extra(["a", "b"], "a", plain["a"])


def test_the_noisy_budget_bounds_the_extra_rounds():
    ticks = iter(range(10**6))
    p = policy(warmup=0, min_reps=4, max_reps=1000, target_rel_iqr=0.01, budget_s=1000.0)
    p = TimingPolicy(**{**p.__dict__, "noisy_budget_s": 10.0})
    out = timing.measure_paired(
        noisy_pair(0.6), p, ratios=[("a", "b")], clock=lambda: float(next(ticks))
    )
    # one clock tick per round's check: the first phase stops at max_reps (budget 2000
    # ticks not reached), the extra rounds stop once 10 ticks have passed
    assert 0 < out["a"].remeasure.rounds_added <= 11 * p.min_reps


def test_a_ratio_of_an_unknown_arm_is_an_error():
    with pytest.raises(ValueError, match=r"\['c'\]"):
        timing.measure_paired(noisy_pair(0.0), policy(), ratios=[("a", "c")])
