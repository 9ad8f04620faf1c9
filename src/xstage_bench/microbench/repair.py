"""Bring committed microbench raw files to the form records have now, noting each change
in the file (an entry of `environment.repairs`, the raw schema's, dated, with the ids it
changed):

    python -m xstage_bench.microbench.repair results/ref-h200x1 results/ref-h200x2 ...

- Until 089da0d a metric no launch could give (issue_rate_GBps with no steady window) was
  recorded as an empty sample list; records now leave it out and name it, with the reason,
  in `extra.metrics_without_samples` (runner.PointMeasurer._measured), and rawchecks
  refuses an empty list.
- Until this change an aligned train's sender-visible time `t_vis_slowest_us` was period -
  gap_spent - barrier_base, which charged the spread of the producers' gaps to the issue
  time (stamp_metrics.barrier_metrics); it is now, per burst, the slowest producer's store
  loop plus the hold (never below 0), both in the record's own samples, burst by burst.

Every other field is left as it was. A file with nothing to repair is not written, so a
second run changes nothing. Files are read as plain JSON (read_raw would refuse them) and
written back through write_raw: validated, atomic, formatted as every raw file is.
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
from xstage_bench.data.stats import summarize
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


VISIBLE, LOOP, HOLD = "t_vis_slowest_us", "t_iss_slowest_us", "hold_us"
VISIBLE_CHANGE = (
    "t_vis_slowest_us recomputed, burst by burst, as t_iss_slowest_us + hold_us (a hold "
    "below 0, the timer's tick, as 0) from the record's own samples (each launch's steady "
    "bursts with a successor); its summary with it; every other field unchanged"
)
VISIBLE_WHY = (
    "issue 52: it was period - gap_spent - barrier_base, which equals the slowest store loop "
    "plus the hold only when every producer's gap lasts as long; gaps spun in cycles differ "
    "between SMs by a share of G and the barrier opens on the longest, so the spread was "
    "counted as issue time (stamp_metrics.barrier_metrics)"
)


def visible_from_loop_and_hold(record: dict) -> bool:
    """Recompute an ok record's t_vis_slowest_us from its store loop and hold; True if it
    changed. Each launch pools its steady bursts' loops and, one fewer, their holds (the
    last burst has no successor), so launch n's burst i is loop[n * m + i] + hold[n * (m -
    1) + i] with m the loops a launch."""
    samples = record.get("samples") or {}
    if record["status"] != OK or VISIBLE not in samples:
        return False
    loop, hold, launches = samples[LOOP], samples[HOLD], record["extra"]["launches"]
    per = len(loop) // launches
    if len(loop) != launches * per or len(hold) != launches * (per - 1):
        raise ValueError(
            f"record {record['id']!r}: {len(loop)} store loops and {len(hold)} holds do not "
            f"split into {launches} launches"
        )
    # a hold below 0 is the timer's tick, not a wait (stamp_metrics.barrier_metrics)
    visible = [
        loop[n * per + i] + max(hold[n * (per - 1) + i], 0.0)
        for n in range(launches)
        for i in range(per - 1)
    ]
    if len(visible) == len(samples[VISIBLE]) and all(
        abs(a - b) < 1e-9 for a, b in zip(visible, samples[VISIBLE], strict=True)
    ):
        return False
    samples[VISIBLE] = visible
    record["summary"][VISIBLE] = summarize(visible)
    return True


# (what a record needs, what changed, why): applied in turn, each noted where it changed any
REPAIRS = (
    (leave_out_empty, CHANGE, WHY),
    (visible_from_loop_and_hold, VISIBLE_CHANGE, VISIBLE_WHY),
)


def repair_doc(doc: dict, date: str) -> list[str]:
    """Repair a microbench document in place, noting each repair in environment.repairs;
    the ids of the records repaired (none: the document is untouched)."""
    if doc.get("experiment") != "microbench":
        return []
    repaired: list[str] = []
    for repair, change, why in REPAIRS:
        ids = [record["id"] for record in doc["records"] if repair(record)]
        if ids:
            note = {"date": date, "change": change, "why": why, "by": SCRIPT, "records": ids}
            env = doc["environment"]
            env["repairs"] = [*env.get("repairs", []), note]
            repaired += [i for i in ids if i not in repaired]
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
