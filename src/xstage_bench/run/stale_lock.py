"""Snakemake's directory lock, left behind by a killed run, cleared when nothing holds it.

A run that is killed (SIGKILL, a lost session) leaves `.snakemake/locks/*.lock`, and the
next run refuses to start until someone runs `snakemake --unlock`. The lock files do not say
who made them, so a lock counts as stale only when no other Snakemake run (a main process;
a job's script under `.snakemake/scripts` is no run) is in this directory: a process we
cannot inspect (another user's) counts as running. Linux only
(/proc); elsewhere nothing is cleared and Snakemake's own message stands.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _ancestors(pid: int) -> set[int]:
    """pid and its parents: this Snakemake, and whatever started it."""
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        try:
            stat = (PROC / str(pid) / "stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return seen


# Where Snakemake writes a script rule's code before it runs it (`python .snakemake/scripts/
# tmpXXXX.name.py`, under a `bash -c` wrapper): a job's command line, never a run's.
JOB_SCRIPTS = b".snakemake/scripts/"


def _is_job(argv: list[bytes]) -> bool:
    """Whether a command line is a job of a run rather than a run (a main Snakemake
    process). A job holds no lock: a live run is seen by its main process, and the jobs a
    killed run left are no run (seen: a job still importing, not yet registered with
    orphans.py, took the rerun for a second one and Snakemake's lock stayed)."""
    return any(JOB_SCRIPTS in arg for arg in argv)


def other_snakemake_runs(workdir: Path, proc: Path = PROC) -> list[int]:
    """PIDs of Snakemake runs (main processes, not their jobs), other than this one and its
    parents, in `workdir`."""
    workdir = workdir.resolve()
    mine = _ancestors(os.getpid())
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        if not any(b"snakemake" in arg for arg in argv) or _is_job(argv):
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            found.append(int(entry.name))  # cannot tell where it runs: assume here
            continue
        if cwd == workdir:
            found.append(int(entry.name))
    return found


def clear_stale_locks(workdir: Path = Path(".")) -> list[Path]:
    """Remove Snakemake's lock files when no other Snakemake runs here; return those removed."""
    locks = sorted((workdir / ".snakemake" / "locks").glob("*.lock"))
    if not locks or not PROC.is_dir() or other_snakemake_runs(workdir):
        return []
    for lock in locks:
        lock.unlink(missing_ok=True)
    return locks
