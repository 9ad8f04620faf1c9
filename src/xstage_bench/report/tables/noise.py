"""tab-noise: the relative spread (IQR / median) of every metric of every ok record, in every
raw file of the dataset, with the points above the noise target and the throttled ones
flagged.

Trace files (megamoe_trace) are left out: their samples are one per tile, a distribution
the kernel produces on purpose, not repetitions of one measurement.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from xstage_bench.data import layout
from xstage_bench.data.results import read_raw
from xstage_bench.report.analysis import labels, load
from xstage_bench.report.tables.common import Table

NOISE_TARGET = 0.05
NOT_REPETITIONS = ("megamoe_trace",)


def raw_files(dataset_dir: Path) -> list[Path]:
    """Every final raw file of the dataset (layout.ALL_RAW: resume state is not a result)."""
    return layout.raw_files(dataset_dir)


def build(dataset_dir: Path, target: float = NOISE_TARGET) -> Table:
    files = raw_files(dataset_dir)
    if not files:
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': no raw files under {dataset_dir / 'raw'}"
        )
    rows, failed, skipped, label = [], 0, [], None
    for path in files:
        doc = read_raw(path)
        label = label or labels.doc_label(dataset_dir, doc)
        name = str(path.relative_to(dataset_dir))
        if doc["experiment"] in NOT_REPETITIONS:
            skipped.append(name)
            continue
        for record in doc["records"]:
            if record["status"] != "ok":
                failed += 1
                continue
            for metric, s in record["summary"].items():
                rel_iqr = np.nan if s.get("rel_iqr") is None else float(s["rel_iqr"])
                rows.append(
                    {
                        "file": name,
                        "id": record["id"],
                        "metric": metric,
                        "n": s["n"],
                        "median": s["median"],
                        "rel_iqr": rel_iqr,
                        "above_target": bool(rel_iqr > target),
                        "throttled": bool(record.get("throttled")),
                    }
                )
    frame = pd.DataFrame(
        rows,
        columns=["file", "id", "metric", "n", "median", "rel_iqr", "above_target", "throttled"],
    )
    above = int(frame["above_target"].sum())
    throttled_points = frame.loc[frame["throttled"], ["file", "id"]].drop_duplicates()
    noisy_points = frame.loc[frame["above_target"], ["file", "id"]].drop_duplicates()
    notes = [
        f"{above} of {len(frame)} point-metrics ({len(noisy_points)} points) above the noise "
        f"target rel_iqr > {target:g}; {len(throttled_points)} points flagged throttled; "
        f"{failed} failed points (no numbers).",
        "rel_iqr = (q3 - q1) / median of the samples; empty where the median is 0.",
    ]
    if skipped:
        notes.append("left out (per-tile distributions, not repetitions): " + ", ".join(skipped))
    return Table(frame, f"Noise: relative IQR per point (target {target:g})", label, notes)
