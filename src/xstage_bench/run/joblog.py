"""Tee a job's stdout and stderr into its Snakemake log file, so progress stays visible;
register the job while it runs (orphans.py)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


class _Tee:
    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
            s.flush()
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


@contextlib.contextmanager
def tee_to(log_path: str | Path) -> Iterator[None]:
    """Every job's frame: its output teed into its log, and the job registered for the
    life of the block (orphans.py: a run killed under it ends it on the next run)."""
    from xstage_bench.run import orphans

    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with orphans.registered(), open(log_path, "w") as log:
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out, err


@contextlib.contextmanager
def measuring_job(
    log_path: str | Path | None, gpu_ids: list[int | str], *, lock: bool = True
) -> Iterator[None]:
    """What every measuring rule does around its work: tee its log, and hold the per-GPU
    lock so that a second harness run (another snakemake) cannot measure on its GPUs
    meanwhile. lock=False for a CPU test, which holds no GPU and so waits for no one."""
    from xstage_bench.measurement.gpulock import GpuLock

    with (
        tee_to(log_path) if log_path else contextlib.nullcontext(),
        GpuLock(gpu_ids) if lock else contextlib.nullcontext(),
    ):
        yield
