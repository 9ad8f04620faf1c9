"""The one per-point protocol: clocks, check, measure, record."""

import pytest

from xstage_bench.measurement.protocol import Measured, PointFailed, measure_point, wrong

POINT = {"id": "p/1", "K": 1}


class Sampler:
    def __init__(self):
        self.calls = 0

    def sample(self):
        self.calls += 1
        return {"available": False, "reason": "test"}


def test_a_checked_point_is_measured_and_recorded_with_its_clocks():
    sampler, steps = Sampler(), []

    def check():
        steps.append(("check", sampler.calls))
        return {"rel_error": [0.01]}

    def measure(facts):
        steps.append(("measure", facts))
        return Measured(
            {"time_us": [1.0, 2.0, 3.0]}, {**facts, "tflops": 1.0}, correct=True, line="  ok"
        )

    record = measure_point(POINT, check, measure, sampler=sampler)
    assert steps == [("check", 1), ("measure", {"rel_error": [0.01]})]
    assert sampler.calls == 2  # before the check, after the measurement
    assert record["status"] == "ok" and record["correct"] is True
    assert record["extra"] == {"rel_error": [0.01], "tflops": 1.0}
    assert "clocks" in record and record["summary"]["time_us"]["n"] == 3


def test_a_failed_check_is_recorded_with_its_reason_and_never_timed(capsys):
    def measure(facts):
        raise AssertionError("a failed point must not be timed")

    def check():
        raise wrong("output rows left NaN (unwritten) on ranks [1]", {"rel_error": []})

    record = measure_point(POINT, check, measure, sampler=Sampler())
    assert record["status"] == "wrong" and record["correct"] is False
    assert record["error"] == "output rows left NaN (unwritten) on ranks [1]"
    assert record["extra"] == {"rel_error": []} and "clocks" not in record
    assert "  p/1: wrong: output rows left NaN" in capsys.readouterr().err

    def unsupported():
        raise PointFailed("no such backend", status="unsupported")

    record = measure_point(POINT, unsupported, measure)
    assert record["status"] == "unsupported" and "extra" not in record


def test_a_following_rank_records_nothing():
    assert measure_point(POINT, lambda: None, lambda facts: None) is None


@pytest.mark.parametrize("status", ["failed", "timeout"])
def test_a_failure_while_timing_keeps_the_check_facts(status):
    def measure(facts):
        raise PointFailed("timing: boom", status=status, correct=True, extra=facts)

    record = measure_point(POINT, lambda: {"max_abs_err": 0.0}, measure)
    assert record["status"] == status and record["correct"] is True
    assert record["extra"] == {"max_abs_err": 0.0}


def test_a_measurement_must_say_what_its_check_established():
    """Issue 26: `Measured.correct` once defaulted to True, so a measurer that never checked
    claimed it had. It has no default now."""
    with pytest.raises(TypeError, match="correct"):
        Measured({"time_us": [1.0]}, {})
    assert Measured({"time_us": [1.0]}, {}, correct=None).correct is None


def test_the_gemm_ceiling_samples_clocks_like_every_other_record(monkeypatch):
    """Issue 26: the 84 gemm_ceiling records of ref-h200x2 carried no clock samples."""
    from types import SimpleNamespace

    from xstage_bench.megamoe import ceiling
    from xstage_bench.megamoe.baselines.measure import GemmCeiling

    monkeypatch.setattr(ceiling, "check_gemm", lambda torch, precision, device: 0.0)
    monkeypatch.setattr(ceiling, "measure_hbm_gbs", lambda torch, device, policy: 4000.0)
    monkeypatch.setattr(
        ceiling,
        "measure_ceiling",
        lambda torch, point, device, policy, hbm: ([2.0, 3.0], {"tflops": 9.0, "roofline_us": 1.0}),
    )
    sampler = Sampler()
    measurer = SimpleNamespace(cuda=True, torch=None, devices=[0], policy=None, sampler=sampler)
    record = GemmCeiling(measurer).measure({"id": "c/gemm_ceiling", "precision": "w8a8"})
    assert record["status"] == "ok" and sampler.calls == 2
    assert record["clocks"]["before"] == {"available": False, "reason": "test"}
