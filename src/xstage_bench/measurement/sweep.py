"""Run a list of points through a measure function: resumable, fault-safe, with a watchdog.

A sweep keeps its progress in `<out>.partial.json`, a complete valid raw document rewritten
atomically after every point, so whatever stops it (an exception, Ctrl-C, a killed job, a
hung kernel) leaves a file a rerun resumes from: only the points not yet recorded are
measured. A point whose measure raises is recorded as failed and the sweep goes on.

A finished sweep also grows in place: when the config differs from the one it was written
with only by added variants (a new baseline), a rerun keeps every recorded point and
measures only the new variants' points. And it is refreshed in place: when the experiment
says which points a config difference concerns (`refresh`, e.g. the record of the kernel
that ran one precision), a rerun measures those points again and keeps the others.

A kernel stuck on the GPU cannot be interrupted from Python, so the watchdog does not try:
when a point runs past `point_timeout_s` it records that point as "timeout" in the partial
file and ends the process with WATCHDOG_EXIT_CODE. The rerun skips the recorded point. The
watchdog is a thread, so it fires only while the measuring thread lets go of the GIL (CUDA
synchronisation and sleeps do; a C call that holds the GIL would delay it).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from xstage_bench.data.provenance import GROWABLE_AXES
from xstage_bench.data.results import (
    OK,
    RawResultError,
    atomic_write_text,
    failed_record,
    raw_document,
    read_raw,
    validate_raw,
    write_raw,
)
from xstage_bench.measurement import log
from xstage_bench.measurement.environment import finish as finish_environment

# EX_TEMPFAIL from sysexits.h: "temporary failure, the user is invited to retry" — a rerun
# continues past the point that timed out.
WATCHDOG_EXIT_CODE = 75


CHECKPOINT_EVERY_S = 5.0  # most work a killed sweep can lose
# Set to 1 to measure again the points a finished or interrupted sweep recorded as not ok
# (failed, wrong, timeout, unsupported), keeping its ok points as they are.
RETRY_ENV = "XSTAGE_RETRY_FAILED"


def retry_requested() -> bool:
    return os.environ.get(RETRY_ENV, "").strip().lower() in ("1", "true", "yes")


def partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial.json")


_log = log.get(__name__)


def _format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _point_ids(points: list[dict]) -> list[str]:
    ids = []
    for i, point in enumerate(points):
        if not isinstance(point, dict) or "id" not in point:
            raise ValueError(f"point {i} has no 'id': {point!r}")
        ids.append(point["id"])
    repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
    if repeated:
        raise ValueError(f"point ids must be unique; repeated: {', '.join(repeated)}")
    return ids


class _SweepState:
    """The records so far and the partial file they are mirrored to.

    `cond` guards both: the measuring thread and the watchdog each record a point and write
    the partial file under it, so exactly one of them records a point that ends at its
    deadline.
    """

    def __init__(self, header: dict, ids: list[str], records: dict[str, dict], partial: Path):
        self.header = header
        self.ids = ids
        self.records = records
        self.partial = partial
        self.cond = threading.Condition()
        self.running: dict | None = None  # the point being measured, seen by the watchdog

    def document(self) -> dict:
        ordered = [self.records[i] for i in self.ids if i in self.records]
        return raw_document(**self.header, records=ordered)

    def write_partial(self) -> None:
        # Records were validated one by one as they came in (_checked_record): re-validating
        # the whole document at every checkpoint would make a sweep quadratic in its points.
        atomic_write_text(self.partial, json.dumps(self.document(), indent=1) + "\n")


class _Watchdog(threading.Thread):
    """Ends the process when one point runs longer than `timeout_s` (see module doc)."""

    def __init__(self, state: _SweepState, timeout_s: float, label: str):
        super().__init__(name="sweep-watchdog", daemon=True)
        self.state = state
        self.timeout_s = timeout_s
        self.label = label
        self.deadline: float | None = None
        self.stopped = False

    def arm(self, point: dict) -> None:
        with self.state.cond:
            self.state.running = point
            self.deadline = time.monotonic() + self.timeout_s
            self.state.cond.notify_all()

    def stop(self) -> None:
        with self.state.cond:
            self.stopped = True
            self.state.cond.notify_all()

    def run(self) -> None:
        cond = self.state.cond
        with cond:
            while not self.stopped:
                if self.state.running is None or self.deadline is None:
                    cond.wait()
                    continue
                remaining = self.deadline - time.monotonic()
                if remaining > 0:
                    cond.wait(remaining)
                    continue
                self._expire(self.state.running)

    def _expire(self, point: dict) -> None:
        state = self.state
        message = f"timeout: point ran longer than {self.timeout_s:g} s (sweep watchdog)"
        state.records[point["id"]] = failed_record(point["id"], point, message, status="timeout")
        try:
            state.write_partial()
            saved = f"recorded as timeout in {state.partial}"
        except BaseException as e:  # the process ends either way; say what was lost
            saved = f"could NOT record it ({type(e).__name__}: {e})"
        _log.info(
            f"[{self.label}] watchdog: point {point['id']} ran longer than "
            f"{self.timeout_s:g} s; {saved}; ending the process with exit code "
            f"{WATCHDOG_EXIT_CODE} (a stuck GPU kernel cannot be interrupted); rerun to continue"
        )
        sys.stdout.flush()
        os._exit(WATCHDOG_EXIT_CODE)


# Two configs whose numbers agree to this relative precision are the same config: a model
# refitted from the same files reproduces its T0, R and Q only to about 1e-9 (the order of
# floating-point sums), and must not make a finished sweep foreign.
CONFIG_REL_TOL = 1e-6


def same_config(a, b) -> bool:
    """Configs equal but for floats within CONFIG_REL_TOL (a float and an equal int agree)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_config(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_config(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    numbers = isinstance(a, int | float) and isinstance(b, int | float)
    if numbers and (isinstance(a, float) or isinstance(b, float)):
        return abs(a - b) <= CONFIG_REL_TOL * max(abs(a), abs(b))
    return a == b


# Config keys a sweep may grow by without invalidating its records: the variants measured
# per configuration, and the baselines' descriptions that come with them.
GROWABLE = ("variants", "baselines")


def added_variants(previous: dict, config: dict) -> list[str]:
    """What `config` adds to `previous` when that is all that differs: variants, and values
    of a section's grid axes (GROWABLE_AXES), as 'variant x' and 'megamoe.tokens_per_rank
    16384'; [] when anything else differs or an earlier variant, baseline or value is gone."""
    config = json.loads(json.dumps(config))
    before, after = previous.get("variants"), config.get("variants")
    if not isinstance(before, list) or not isinstance(after, list):
        return []
    if not same_config(_without_variants(previous), _without_variants(config)):
        return []
    if not set(before) <= set(after):
        return []
    if not set(previous.get("baselines", {})) <= set(config.get("baselines", {})):
        return []
    added = [f"variant {v}" for v in after if v not in before]
    for name, section in config.items():
        old = previous.get(name)
        if not isinstance(section, dict) or not isinstance(old, dict):
            continue
        for axis in GROWABLE_AXES:
            values, had = section.get(axis), old.get(axis)
            if not isinstance(values, list) or not isinstance(had, list):
                continue
            if any(not any(same_config(h, v) for v in values) for h in had):
                return []  # a value the records were measured at is gone
            added += [
                f"{name}.{axis} {json.dumps(v)}"
                for v in values
                if not any(same_config(h, v) for h in had)
            ]
    return added


class Refresh(NamedTuple):
    """What a config difference makes stale: why, and which points (by their point dict)."""

    reason: str
    stale: Callable[[dict], bool]


# refresh(previous config, config) -> Refresh when the configs differ only in what it
# covers, else None (then a finished file is measured again in full).
RefreshRule = Callable[[dict, dict], Refresh | None]


def records_refresh(
    previous: dict,
    config: dict,
    split: Callable[[dict], tuple[dict, dict]],
    stale: Callable[[dict, list[str]], bool],
    prefix: str = "",
) -> Refresh | None:
    """The common part of a refresh rule over per-key records (the kernel that ran each
    precision or backend): `split(config)` gives (the config less the records, the records
    by key); when only records differ, `stale(point, changed keys)` names the points."""
    rest_before, before = split(json.loads(json.dumps(previous)))
    rest_after, after = split(json.loads(json.dumps(config)))
    changed = sorted(k for k in {*before, *after} if before.get(k) != after.get(k))
    if not same_config(rest_before, rest_after) or not changed:
        return None
    return Refresh(
        f"{prefix}{', '.join(changed)} (the kernel that ran it changed)",
        lambda point: stale(point, changed),
    )


def _without_variants(config: dict) -> dict:
    """The config less what may grow, at the top and in its sections (the experiment's own
    section repeats the variants, and holds the grid's axes)."""
    growable = ("variants", *GROWABLE_AXES)
    return {
        k: {kk: vv for kk, vv in v.items() if kk not in growable} if isinstance(v, dict) else v
        for k, v in config.items()
        if k not in GROWABLE
    }


def _check_resumable(
    previous: dict, partial: Path, header: dict, ids: list[str], refresh: RefreshRule | None
) -> None:
    """A partial file from another sweep must not be mixed into this one."""
    for key in ("experiment", "backend", "dataset", "study"):
        if previous.get(key) != header.get(key):
            raise RawResultError(
                f"{partial}: was written for {key}={previous.get(key)!r}, this sweep has "
                f"{key}={header.get(key)!r}; remove the file to start over"
            )
    config = json.loads(json.dumps(header["config"]))
    compatible = added_variants(previous["config"], config) or (
        refresh is not None and refresh(previous["config"], config) is not None
    )
    if not same_config(previous["config"], config) and not compatible:
        raise RawResultError(
            f"{partial}: was written with a different config; remove the file to start over"
        )
    unknown = sorted({r["id"] for r in previous["records"]} - set(ids))
    if unknown:
        raise RawResultError(
            f"{partial}: holds points this sweep does not have ({', '.join(unknown[:5])}); "
            "remove the file to start over"
        )


def _finished(out: Path) -> dict | None:
    """A finished raw file at `out`, or None (absent, or unreadable: it will be replaced)."""
    try:
        return read_raw(out) if out.exists() else None
    except RawResultError:
        return None


def _resumed_environment(first: dict, now: dict, remeasured: str | None = None) -> dict:
    """Keep the environment of the run that started the sweep; list every resumption (and
    what it measured again, for a refresh)."""
    env = dict(first)
    resume = {k: now.get(k) for k in ("host", "started_at", "git")}
    if remeasured:
        resume["remeasured"] = remeasured
    env["resumes"] = [*first.get("resumes", []), resume]
    return env


def _checked_record(record, point: dict, header: dict) -> dict:
    """The record `measure` returned, or a failed record saying why it is unusable."""
    point_id = point["id"]
    if not isinstance(record, dict) or record.get("id") != point_id:
        got = record.get("id") if isinstance(record, dict) else type(record).__name__
        return failed_record(point_id, point, f"measure returned a record for {got!r}")
    try:
        validate_raw(raw_document(**header, records=[record]), f"record for point {point_id}")
    except RawResultError as e:
        return failed_record(point_id, point, f"measure returned an invalid record: {e}")
    return record


@contextmanager
def kept_until_done(out: Path, doc: dict):
    """Keep a finished sweep's document as its partial file while the same job does more.

    Snakemake puts back the previous version of an update() output when its job fails,
    so a later step's failure (a second sweep of the same rule) would take a finished
    sweep's records with it; the partial file is no declared output and stays, and a rerun
    resumes from it with nothing left to measure."""
    partial = partial_path(Path(out))
    atomic_write_text(partial, json.dumps(doc, indent=1) + "\n")
    yield
    partial.unlink(missing_ok=True)


def run_sweep(
    points: list[dict],
    measure: Callable[[dict], dict],
    out: Path,
    *,
    experiment: str,
    backend: str,
    dataset: str,
    environment: dict,
    config: dict,
    study: str | None = None,
    point_timeout_s: float | None = None,
    retry_failed: bool = False,
    progress: Callable[[str], None] | None = None,
    checkpoint_every_s: float = CHECKPOINT_EVERY_S,
    refresh: RefreshRule | None = None,
    plan: Callable[[list[dict]], None] | None = None,
) -> dict:
    """Measure every point not yet recorded, write the raw document to `out`, return it.

    `measure(point)` returns `results.ok_record(...)` or `failed_record(...)` for that point;
    an exception it raises becomes a failed record ("Type: message"). KeyboardInterrupt and
    SystemExit propagate (the partial file keeps every finished point). A finished `out`
    whose config lacks only some of this config's variants or grid values is grown: its
    records are kept and only the added points measured (added_variants); one whose config differs
    as `refresh` allows has the points it names measured again, the others kept (so has a
    partial file written with such a config: an interrupted run's, or a finished file copied
    there to resume from). With
    `retry_failed`
    (or XSTAGE_RETRY_FAILED=1), points recorded with a status other than ok are measured
    again, from the partial file or, when there is none, from a finished `out` of the same
    sweep; its ok points are kept as they are. `progress` receives one
    line per point (default: printed to stderr). Repeated point ids raise ValueError; a
    corrupt or foreign partial file raises RawResultError naming it. The partial file is
    rewritten at most every `checkpoint_every_s` and whenever the sweep stops, so a killed
    process loses at most that much work. `plan(points)`, if given, is told the points
    this run will measure, in order, before the first (an experiment that measures several
    points together, workers.drive's groups, measures only those of this run).
    """
    out = Path(out)
    ids = _point_ids(points)
    partial = partial_path(out)
    label = study or experiment
    say = progress or _log.info
    header = {
        "experiment": experiment,
        "backend": backend,
        "dataset": dataset,
        "environment": environment,
        "config": config,
        "study": study,
    }
    retry_failed = retry_failed or retry_requested()
    records: dict[str, dict] = {}
    finished = _finished(out) if not partial.exists() else None
    grown = added_variants(finished["config"], config) if finished else []
    stale = refresh(finished["config"], config) if finished and refresh and not grown else None
    # a retry continues the same sweep only: a finished file of another config is measured
    # again in full, as without the retry
    retry_finished = retry_failed and finished and same_config(finished["config"], config)
    reuse = finished and (retry_finished or grown or stale)
    if retry_failed and finished and not reuse:
        say(f"[{label}] {out} was written with another config: measured again in full")
    source = partial if partial.exists() else (out if reuse else None)
    if source is not None:
        previous = finished if source == out else read_raw(source)  # out was read above
        _check_resumable(previous, source, header, ids, refresh)
        if source == partial and refresh is not None:
            # a partial file written by another kernel: its points of that kernel are stale
            stale = refresh(previous["config"], config)
        kept = [r for r in previous["records"] if not (stale and stale.stale(r["point"]))]
        records = {r["id"]: r for r in kept}
        remeasured = (
            f"{stale.reason}: {len(previous['records']) - len(kept)} point(s)" if stale else None
        )
        header["environment"] = _resumed_environment(
            previous["environment"], environment, remeasured
        )
        say(f"[{label}] resuming from {source}: {len(records)}/{len(ids)} points recorded")
        if grown:
            say(f"[{label}] the config adds {', '.join(grown)}: measuring only their points")
        if stale:
            say(f"[{label}] {remeasured} measured again, the others kept")
        if retry_failed:
            again = sum(r["status"] != OK for r in records.values())
            say(f"[{label}] retrying {again} point(s) recorded not ok ({RETRY_ENV})")

    todo = [
        p
        for p in points
        if p["id"] not in records or (retry_failed and records[p["id"]]["status"] != OK)
    ]
    if not todo and source == out and not stale:
        # a retry or a grown config that finds nothing to measure leaves the file as it
        # was: no resume entry claiming this run's code wrote any of it
        say(f"[{label}] {out}: nothing to measure, left as it was")
        return finished
    if plan is not None:
        plan(todo)
    state = _SweepState(header, ids, records, partial)
    state.write_partial()  # fail fast on a bad header, before any GPU time is spent
    watchdog = _Watchdog(state, point_timeout_s, label) if point_timeout_s else None
    if watchdog:
        watchdog.start()
    spent = 0.0
    last_checkpoint = time.monotonic()
    unsaved = False
    try:
        for n, point in enumerate(todo, start=1):
            t0 = time.monotonic()
            if watchdog:
                watchdog.arm(point)
            try:
                record = measure(point)
            except Exception as e:
                record = failed_record(point["id"], point, f"{type(e).__name__}: {e}")
            with state.cond:
                state.running = None
                state.records[point["id"]] = _checked_record(record, point, header)
                unsaved = True
                if time.monotonic() - last_checkpoint >= checkpoint_every_s:
                    state.write_partial()
                    last_checkpoint, unsaved = time.monotonic(), False
            took = time.monotonic() - t0
            spent += took
            eta = _format_duration(spent / n * (len(todo) - n))
            done = len(ids) - len(todo) + n
            status = state.records[point["id"]]["status"]
            say(f"[{label}] {done}/{len(ids)} {point['id']} {status} {took:.1f} s (ETA {eta})")
    finally:
        if watchdog:
            watchdog.stop()
        if unsaved:
            with state.cond:
                state.write_partial()

    finish_environment(header["environment"])
    doc = state.document()
    write_raw(out, doc)
    partial.unlink()
    return doc
