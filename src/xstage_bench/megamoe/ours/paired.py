"""The per-point protocol (protocol.measure_point) for a set of arms measured together.

What a ratio compares is timed in one job, in paired rounds (timing.measure_paired), so
that every ratio is of samples taken seconds apart. For a set of arms (our kernel's
schedules and leads of one configuration): the clocks are sampled once before the set,
each arm is checked on its own (a wrong or failed arm is recorded so, untimed, and left
out of the rounds), the arms that passed are timed together, and the clocks are sampled
again after; every record of the set carries the same clock fields.
"""

from __future__ import annotations

from collections.abc import Callable

from xstage_bench.measurement.clocks import record_fields
from xstage_bench.measurement.protocol import Measured, PointFailed, failed_point, measured_point
from xstage_bench.megamoe.schedule import WAVE


def measure_arms(
    arms: list[dict],
    check: Callable[[dict], dict],
    measure: Callable[[list[dict], dict[str, dict]], dict[str, Measured]],
    *,
    sampler=None,
) -> dict[str, dict]:
    """{arm id: record} for every arm: `check(point)` returns the arm's facts or raises
    PointFailed; `measure(passed arms, {id: facts})` times the arms that passed, together,
    and returns {id: Measured} (a PointFailed from it fails all of them)."""
    before = sampler.sample() if sampler is not None else None
    records: dict[str, dict] = {}
    facts: dict[str, dict] = {}
    for point in arms:
        try:
            facts[point["id"]] = check(point)
        except PointFailed as failed:
            records[point["id"]] = failed_point(point, failed)
    passed = [p for p in arms if p["id"] in facts]
    if passed:
        try:
            measured = measure(passed, facts)
        except PointFailed as failed:
            measured = None
            for point in passed:
                records[point["id"]] = failed_point(point, failed)
        if measured is not None:
            fields = record_fields(before, sampler.sample()) if sampler is not None else {}
            for point in passed:
                records[point["id"]] = measured_point(point, measured[point["id"]], fields)
    return {p["id"]: records[p["id"]] for p in arms}


def compared_ratios(arms: list[dict]) -> list[tuple[str, str]]:
    """What the report compares within a set, as timing.measure_paired's `ratios`: the
    expert-wave arm's time over every other arm's (each speedup of tab-megamoe and of the
    lead map); none when the set has no expert-wave arm."""
    waves = [a["id"] for a in arms if a.get("schedule") == WAVE]
    if not waves:
        return []
    return [(waves[0], a["id"]) for a in arms if a["id"] != waves[0]]
