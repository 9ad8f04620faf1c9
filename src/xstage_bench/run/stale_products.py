"""Outputs made from a reference's raw file that changed, remembered until they are remade.

A committed reference's products read their inputs as old (ancient), and a raw file that
differs from what the reference's check read forces what reads it (common.smk,
CHANGED_READS). The run that checks the file again rewrites the check's listing; from then
on nothing compared the file with the products made from the old one, and a product that
run did not remake (it was not the target) was taken as current. So each run records, as
it starts, the outputs on disk made from a changed file, with the time. Until an output is
written after that time (its job succeeded), a later run forces it where its DAG holds it,
whatever the target. A failed job's output is put back with its old time (restored.py), so
it stays recorded. The record is this checkout's run state, beside Snakemake's own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

from xstage_bench.data.results import atomic_write_text

RECORD = Path(".snakemake") / "xstage-stale-outputs.json"


def _read(record: Path) -> dict[str, int]:
    try:
        return json.loads(record.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: nothing is known to be stale
        return {}


def _stale(path: str, since_ns: int) -> bool:
    try:
        return Path(path).stat().st_mtime_ns <= since_ns
    except FileNotFoundError:
        return False  # a missing output is made anyway


def pending(record: Path = RECORD) -> set[str]:
    """The recorded outputs not written since they were recorded."""
    return {path for path, since in _read(record).items() if _stale(path, since)}


def mark(paths: Iterable[str | Path], record: Path = RECORD) -> None:
    """Record `paths` as made from a changed file, now; entries remade since are dropped."""
    now = time.time_ns()
    kept = {path: since for path, since in _read(record).items() if _stale(path, since)}
    kept.update({str(path): now for path in paths})
    if kept or record.exists():
        atomic_write_text(record, json.dumps(kept, indent=1, sort_keys=True) + "\n")
