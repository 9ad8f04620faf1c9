"""Exclusive per-GPU locks, so two measuring jobs never share a GPU.

Snakemake's `gpu` resource keeps one workflow from overlapping its own GPU jobs; these
locks also cover a second workflow, a manual run, or a test on the same machine. Each GPU
has a lock file `<lock_dir>/gpu<N>.lock`, N its number on the machine (a measuring job
undoes CUDA_VISIBLE_DEVICES: measure.py; where that names GPUs by UUID, the lock is
named by the UUID, and does not exclude a run that names the GPU by its number), held
with `fcntl.flock`: the kernel drops the
lock when the holder exits or dies, so a crashed run never leaves a stale lock. The holder
writes its pid, command line and start time into the file so that a waiting run can say
who it waits for.

Locks are taken in sorted device order, so two runs asking for overlapping sets cannot
deadlock. A lock is not re-entrant: the same process asking twice for a GPU waits for
itself. The directory is `XSTAGE_LOCK_DIR` if set, else /tmp/xstage-gpu-locks; every user
of the GPUs must be able to write there.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from xstage_bench.measurement import log
from xstage_bench.measurement.environment import now_iso

DEFAULT_LOCK_DIR = Path("/tmp/xstage-gpu-locks")
LOCK_DIR_ENV = "XSTAGE_LOCK_DIR"


_log = log.get(__name__)


class GpuBusyError(RuntimeError):
    """A GPU stayed locked by another process for longer than we were willing to wait."""


def default_lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)


def _holder_info() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "since": now_iso(),
    }


def describe_holder(text: str) -> str:
    """A lock file's content as a phrase ("pid 12 (python run.py) since ...")."""
    try:
        info = json.loads(text)
        return f"pid {info['pid']} ({info['command']}) since {info['since']}"
    except (ValueError, KeyError, TypeError):
        return "an unknown process (its lock file holds no holder record yet)"


class GpuLock:
    """Context manager holding an exclusive lock on each of `device_ids`.

    Waits up to `wait_s` seconds in all (checking every `poll_s`), reporting each new
    holder it waits for through `report` (default: stderr), then raises GpuBusyError and
    releases whatever it had already taken.
    """

    def __init__(
        self,
        device_ids: list[int | str],
        *,
        lock_dir: Path | None = None,
        wait_s: float = 600.0,
        poll_s: float = 1.0,
        report: Callable[[str], None] | None = None,
    ):
        # one order for every run (ints, then UUIDs), so that no two runs deadlock
        self.device_ids = sorted(set(device_ids), key=lambda d: (isinstance(d, str), d))
        self.lock_dir = Path(lock_dir) if lock_dir is not None else default_lock_dir()
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.report = report or _log.info
        self._held: list[int] = []  # file descriptors, in the order taken

    def path(self, device: int | str) -> Path:
        return self.lock_dir / f"gpu{device}.lock"

    def __enter__(self) -> GpuLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        if self._held:
            raise RuntimeError(f"GpuLock for GPUs {self.device_ids} is already held")
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.wait_s
        try:
            for device in self.device_ids:
                self._held.append(self._take(device, deadline))
        except BaseException:
            self.release()
            raise

    def _take(self, device: int | str, deadline: float) -> int:
        fd = os.open(self.path(device), os.O_RDWR | os.O_CREAT, 0o666)
        reported = None
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = describe_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
                if time.monotonic() >= deadline:
                    raise GpuBusyError(
                        f"GPU {device} is busy: held by {holder} (lock file "
                        f"{self.path(device)}); gave up after waiting {self.wait_s:g} s"
                    )
                if holder != reported:
                    self.report(
                        f"GPU {device} is held by {holder}; waiting up to {self.wait_s:g} s"
                    )
                    reported = holder
                time.sleep(max(0.0, min(self.poll_s, deadline - time.monotonic())))
            record = json.dumps(_holder_info()).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def release(self) -> None:
        """Clear the holder record and drop every lock taken (safe to call twice)."""
        while self._held:
            fd = self._held.pop()
            try:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
