"""One harness run per directory at a time: the project's own lock.

Snakemake locks its outputs, but when a run ends, Snakemake 9.27 deletes every lock of the
directory, another run's too, and a third run can then start beside the first (seen: both
failed, a figure went missing). So the main Snakemake process of a run that executes jobs
also holds `.snakemake/xstage-run.lock` (an flock) for as long as it lives; a second run in
the same directory stops at once, naming the holder. The kernel drops the lock when its
holder exits or dies, so a killed run never leaves it behind. Dry runs take no lock.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import sys
from pathlib import Path
from typing import TextIO

from xstage_bench.data.results import write_error
from xstage_bench.measurement.environment import now_iso

RUN_LOCK = Path(".snakemake") / "xstage-run.lock"


class RunLockBusy(RuntimeError):
    """Another harness run holds this directory's run lock."""


def hold_run_lock(path: Path = RUN_LOCK) -> TextIO:
    """Take the run lock or raise RunLockBusy naming its holder. Keep the returned file
    open for the life of the run: closing it releases the lock."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")  # noqa: SIM115 (held open on purpose)
    except OSError as e:
        raise write_error(e, path) from e
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that wrote nothing"
        handle.close()
        raise RunLockBusy(
            f"another harness run is using this directory ({holder}); wait for it to end, "
            f"or run in another clone"
        ) from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, started {now_iso()}: {shlex.join(sys.argv)}\n")
        handle.flush()
    except OSError as e:
        handle.close()
        raise write_error(e, path) from e
    return handle
