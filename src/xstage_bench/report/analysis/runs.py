"""Which run of a raw file timed a record: a file is written by its first run and then by
each resume (environment.resumes), so two records of one file may be hours apart, and a
ratio between them is a ratio across runs unless both come from the same one."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from datetime import datetime


def _starts(doc: dict) -> list[datetime]:
    """When each run of the file started, in order: run i is the i-th of these."""
    env = doc["environment"]
    return sorted(
        datetime.fromisoformat(run["started_at"]) for run in (env, *env.get("resumes", []))
    )


def run_of(doc: dict) -> Callable[[dict], int | None]:
    """record -> index of the run that timed it (0: the file's first run, then each resume
    in order): the last run that started before the record's first clock sample; None for
    a record without one."""
    starts = _starts(doc)

    def index(record: dict) -> int | None:
        at = ((record.get("clocks") or {}).get("before") or {}).get("time")
        if at is None:
            return None
        return bisect.bisect_right(starts, datetime.fromisoformat(at)) - 1

    return index


def started(doc: dict, run: int) -> str:
    """When run `run` of the file started (UTC, to the minute)."""
    return _starts(doc)[run].strftime("%Y-%m-%d %H:%M")
