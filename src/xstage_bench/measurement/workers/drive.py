"""Rank 0's sweep: the points asked for one by one, each broadcast so that every rank
executes it, the point in flight noted on disk for the launcher (launcher.record_crash),
and a fabric found broken ended with the exit code that asks for fresh processes.

Points that a ratio compares can be measured together (`drive(group_of=...)`): when the
first point of a group is asked, rank 0 broadcasts the group's points of this run, every
rank checks them all (`Lockstep.measure_group`), then times those that passed in paired
rounds (`Lockstep.timed_paired`, timing.measure_paired's protocol); the group's other
records are handed to the sweep from a cache as it asks for them. A run that stops inside
a group measures the group's unrecorded points again, together; pairs never span runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from pathlib import Path

from xstage_bench.measurement import sweep
from xstage_bench.measurement.workers.lockstep import Lockstep

RESTART_EXIT_CODE = 76  # a worker's fabric is unusable (a barrier timed out): start afresh


def running_marker(out: Path) -> Path:
    """Where rank 0 notes the point in flight, so a crash can be pinned on it."""
    return out.with_name(out.name + ".running.json")


def drive(
    state: Lockstep,
    job: dict,
    points: list[dict],
    *,
    experiment: str,
    config: dict,
    refresh: sweep.RefreshRule | None = None,
    group_of: Callable[[dict], Hashable] | None = None,
):
    """Rank 0: run the sweep over `points` into job["out"], broadcasting each point so that
    every rank executes it (`state.execute`), then release the others (None). `refresh`:
    as run_sweep's.

    With `group_of`, the points of this run with one key are measured together: the first
    one asked broadcasts {"group": [points]} and `state.execute` returns every record of
    the group by id; the sweep gets the others from a cache (see the module doc)."""
    from xstage_bench.measurement import environment, faults

    out = Path(job["out"])
    marker = running_marker(out)
    env = environment.capture_measured(job["device_type"])
    env["process_model"] = "one process per GPU (torch.distributed)"
    groups: dict[Hashable, list[dict]] = {}
    cache: dict[str, dict] = {}

    def plan(todo: list[dict]) -> None:
        for point in todo:
            groups.setdefault(group_of(point), []).append(point)

    def measure(point: dict) -> dict:
        if point["id"] in cache:
            return cache.pop(point["id"])
        if state.broken:  # a barrier timed out earlier: this fabric cannot be trusted
            raise SystemExit(RESTART_EXIT_CODE)
        marker.write_text(json.dumps(point))
        faults.apply_before_measure(point["id"])
        if group_of is None:
            state.command(point)
            record = state.execute(point)
        else:
            group = groups.pop(group_of(point), None) or [point]
            message = {"group": group}
            state.command(message)
            records = state.execute(message)
            record = records.pop(point["id"])
            cache.update(records)
        marker.unlink(missing_ok=True)
        return record

    try:
        sweep.run_sweep(
            points,
            measure,
            out,
            experiment=experiment,
            backend="cuda",
            dataset=job["dataset"],
            environment=env,
            config=config,
            point_timeout_s=job["point_timeout_s"],
            refresh=refresh,
            plan=plan if group_of is not None else None,
        )
    finally:
        state.command(None)
