"""Jobs a killed run left behind: each job records its pid, the next run ends them.

SIGKILL of the main Snakemake process (a lost session, an OOM kill) leaves its jobs running,
reparented to init, and Snakemake's lock in place; the next run then refused to start until
the orphans ended on their own. So every job that enters `joblog.tee_to` (every script rule
and measuring job) registers itself in `.snakemake/xstage-jobs/<pid>.json`: its pid and
start time, the wrappers between it and the main process, and the run it belongs to (the
main process's pid and start time, which `mark_run` puts in the environment its jobs
inherit). It removes the entry when it ends. The next run that executes jobs, holding the
run lock (runlock.py, so no other run is alive here), finds the entries whose job still
runs but whose run does not, ends them (SIGINT first: a sweep writes its partial file and
stops; SIGKILL after a grace period) and goes on. Start times make a reused pid harmless.
Linux only (/proc); elsewhere nothing is registered or ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
JOBS_DIR = Path(".snakemake") / "xstage-jobs"
RUN_ENV = "XSTAGE_RUN"  # "<pid>:<start>" of the main Snakemake process of this run
# Tests only: a registered job waits this long before its work, so that a test can kill
# the run under it while it runs.
HOLD_ENV = "XSTAGE_TEST_HOLD_JOB_S"
GRACE_S = 10.0


def process_start(pid: int, proc: Path = PROC) -> int | None:
    """A process's start time (clock ticks since boot), or None when it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _parent(pid: int, proc: Path = PROC) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _alive(pid: int, start: int | None) -> bool:
    return start is not None and process_start(pid) == start


def mark_run() -> None:
    """Name this (main Snakemake) process as the run its jobs belong to."""
    if PROC.is_dir():
        os.environ[RUN_ENV] = f"{os.getpid()}:{process_start(os.getpid())}"


@dataclass(frozen=True)
class Job:
    """One registered job: itself and its wrappers (pid, start), and its run's (pid, start)."""

    entry: Path
    processes: tuple[tuple[int, int], ...]  # the job first, then the wrappers above it
    run: tuple[int, int]
    argv: str

    @property
    def pid(self) -> int:
        return self.processes[0][0]


def _chain_to(run_pid: int) -> list[tuple[int, int]]:
    """This process and its ancestors below the run's main process (Snakemake's wrappers)."""
    chain, pid = [], os.getpid()
    while pid and pid > 1 and pid != run_pid and len(chain) < 8:
        start = process_start(pid)
        if start is None:
            break
        chain.append((pid, start))
        pid = _parent(pid)
    return chain if pid == run_pid else chain[:1]


@contextlib.contextmanager
def registered(jobs_dir: Path = JOBS_DIR) -> Iterator[None]:
    """Record this job for the life of the block (nothing outside a marked run)."""
    run = os.environ.get(RUN_ENV, "")
    if not run or not PROC.is_dir():
        yield
        return
    run_pid, run_start = (int(x) for x in run.split(":"))
    entry = Path(jobs_dir) / f"{os.getpid()}.json"
    record = {
        "processes": _chain_to(run_pid),
        "run": [run_pid, run_start],
        "argv": " ".join(sys.argv)[:300],
    }
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        entry.write_text(json.dumps(record))
    except OSError:
        entry = None  # unregistered: a job must not fail for its bookkeeping
    try:
        hold = float(os.environ.get(HOLD_ENV) or 0)
        if hold > 0:
            time.sleep(hold)
        yield
    finally:
        if entry is not None:
            entry.unlink(missing_ok=True)


def orphans(jobs_dir: Path = JOBS_DIR) -> list[Job]:
    """Registered jobs that still run while their run does not; entries of jobs that ended
    (killed with their run) are removed."""
    found = []
    if not PROC.is_dir() or not Path(jobs_dir).is_dir():
        return found
    for entry in sorted(Path(jobs_dir).glob("*.json")):
        try:
            record = json.loads(entry.read_text())
            processes = tuple((int(p), int(s)) for p, s in record["processes"])
            run = (int(record["run"][0]), int(record["run"][1]))
        except (OSError, ValueError, KeyError, TypeError):
            entry.unlink(missing_ok=True)
            continue
        if not processes or not _alive(*processes[0]):
            entry.unlink(missing_ok=True)
        elif not _alive(*run):
            found.append(Job(entry, processes, run, str(record.get("argv", ""))))
    return found


def _descendants(pids: set[int]) -> set[int]:
    """Every process below `pids` (a job's workers)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            parent = _parent(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    out, todo = set(), list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def end(jobs: list[Job], grace_s: float = GRACE_S) -> list[int]:
    """End the jobs, their workers and their wrappers, each by its pid: SIGINT, then SIGKILL
    to what still runs after `grace_s`. Returns the pids signalled."""
    targets: dict[int, int | None] = {}
    for job in jobs:
        for pid, start in job.processes:
            targets[pid] = start
    for pid in _descendants(set(targets)):
        targets.setdefault(pid, process_start(pid))

    def running() -> list[int]:
        return [pid for pid, start in targets.items() if _alive(pid, start)]

    for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGKILL, grace_s)):
        for pid in running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while running() and time.monotonic() < deadline:
            time.sleep(0.05)
    for job in jobs:
        job.entry.unlink(missing_ok=True)
    return sorted(targets)
