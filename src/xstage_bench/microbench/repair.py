"""Bring microbench raw files written before 089da0d to the form records have now.

    python -m xstage_bench.microbench.repair results/ref-h200x1 results/ref-h200x2

Until 089da0d a metric no launch could give (issue_rate_GBps with no steady window) was
recorded as an empty sample list; records now leave it out and name it, with the reason, in
`extra.metrics_without_samples` (runner.PointMeasurer._measured), and rawchecks refuses an
empty list. This rewrites such records that way, leaves every other field as it was, and
says so in the file: an entry of `environment.repairs` (the raw schema's), dated, with the
ids it changed. A file with nothing to repair is not written, so a second run changes
nothing. Files are read as plain JSON (read_raw would refuse them) and written back through
write_raw: validated, atomic, formatted as every raw file is.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from xstage_bench.data import layout
from xstage_bench.data.results import OK, write_raw
from xstage_bench.microbench.runner import NO_SAMPLES

SCRIPT = "python -m xstage_bench.microbench.repair (src/xstage_bench/microbench/repair.py)"
CHANGE = (
    "an ok record's empty sample list is left out and named, with the reason new records "
    "give (microbench/runner.py NO_SAMPLES), in extra.metrics_without_samples; its other "
    "samples, its summary (which never had the metric) and every other field are unchanged"
)
WHY = (
    "issue 26: these records were written before 089da0d, when a metric no launch could "
    "give (issue_rate_GBps with no steady window) was recorded as an empty list; records "
    "now leave it out and say so, and rawchecks refuses an empty sample list in an ok record"
)


def leave_out_empty(record: dict) -> bool:
    """Rewrite an ok record's empty sample lists as new records have them; True if any."""
    samples = record.get("samples") or {}
    empty = sorted(name for name, values in samples.items() if not values)
    if record["status"] != OK or not empty:
        return False
    record["samples"] = {name: values for name, values in samples.items() if values}
    extra = record.get("extra") or {}
    named = {**extra.get("metrics_without_samples", {}), **{n: NO_SAMPLES[n] for n in empty}}
    record["extra"] = {**extra, "metrics_without_samples": named}
    return True


def repair_doc(doc: dict, date: str) -> list[str]:
    """Repair a microbench document in place, noting it in environment.repairs; the ids of
    the records repaired (none: the document is untouched)."""
    if doc.get("experiment") != "microbench":
        return []
    repaired = [record["id"] for record in doc["records"] if leave_out_empty(record)]
    if repaired:
        note = {"date": date, "change": CHANGE, "why": WHY, "by": SCRIPT, "records": repaired}
        env = doc["environment"]
        env["repairs"] = [*env.get("repairs", []), note]
    return repaired


def repair_file(path: Path, date: str) -> list[str]:
    """Repair one raw file, rewriting it only if a record changed; the ids repaired."""
    doc = json.loads(Path(path).read_text())
    repaired = repair_doc(doc, date)
    if repaired:
        write_raw(path, doc)
    return repaired


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="+", type=Path, help="dataset folders (results/<ds>)")
    parser.add_argument(
        "--date", default=datetime.now(UTC).date().isoformat(), help="the repair's day (UTC)"
    )
    args = parser.parse_args(argv)
    for dataset in args.datasets:
        for path in layout.raw_files(dataset):
            repaired = repair_file(path, args.date)
            print(f"{path}: {len(repaired)} record(s) repaired", *repaired, sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
