"""The one per-point measurement protocol: sample clocks -> check -> measure -> record.

Every measuring experiment turns a point into its raw record through `measure_point`:
the microbenchmarks, our MegaMoE kernel (one process, and one process per GPU), its
baselines (unfused torch, DeepGEMM), the emulated sweep, the traced runs and attention.
The experiment supplies two steps:

- `check()` runs the point once and judges the result. It returns the facts the record
  keeps, or raises `PointFailed` (a wrong result, an unsupported point, a failure): the
  point is then recorded with that reason and never timed.
- `measure(facts)` times it (through the timing module) and returns `Measured`, or raises
  `PointFailed` too. It returns None on a rank that only follows rank 0 (measurement/workers).

The clocks are sampled before the check and after the measurement; `clocks.record_fields`
turns the two samples into the record's clocks and throttle verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xstage_bench.data.results import failed_record, ok_record
from xstage_bench.measurement import log
from xstage_bench.measurement.clocks import record_fields

_log = log.get(__name__)


class PointFailed(Exception):
    """A point that yields no trustworthy number: its record's error, status, `correct`
    and facts (None: the record has no `extra`)."""

    def __init__(
        self,
        error: str,
        *,
        status: str = "failed",
        correct: bool | None = None,
        extra: dict | None = None,
    ):
        super().__init__(error)
        self.error, self.status, self.correct, self.extra = error, status, correct, extra


def wrong(error: str, facts: dict | None = None) -> PointFailed:
    """A checked result that is wrong: status "wrong", correct False."""
    return PointFailed(error, status="wrong", correct=False, extra=facts)


@dataclass
class Measured:
    """A timed point: its samples (name -> list), its extra facts, whether it was checked
    correct (None: nothing to check against), and a progress line. `correct` has no
    default: each measurer says what its check established (issue 26: a default of True
    let a point claim a check it never had)."""

    samples: dict
    extra: dict
    correct: bool | None
    line: str | None = None


def measure_point(
    point: dict,
    check: Callable[[], dict | None],
    measure: Callable[[dict | None], Measured | None],
    *,
    sampler=None,
) -> dict | None:
    """The point's record: clocks sampled (with `sampler`, a clocks.ClockSampler), the
    check, the measurement, the record; a PointFailed from either step is recorded failed
    (and logged), untimed. Without a sampler the record holds no clocks."""
    before = sampler.sample() if sampler is not None else None
    try:
        facts = check()
        measured = measure(facts)
    except PointFailed as failed:
        return failed_point(point, failed)
    if measured is None:
        return None
    fields = record_fields(before, sampler.sample()) if sampler is not None else {}
    return measured_point(point, measured, fields)


def failed_point(point: dict, failed: PointFailed) -> dict:
    """The record of a point that failed its check or its timing (logged)."""
    _log.info("  %s: %s: %s", point["id"], failed.status, failed.error)
    return failed_record(
        point["id"],
        point,
        failed.error,
        status=failed.status,
        correct=failed.correct,
        extra=failed.extra,
    )


def measured_point(point: dict, measured: Measured, clock_fields: dict) -> dict:
    """The record of a timed point, with the clock fields of its sampling (logged)."""
    if measured.line:
        _log.info(measured.line)
    return ok_record(
        point["id"],
        point,
        measured.samples,
        correct=measured.correct,
        extra=measured.extra,
        **clock_fields,
    )
