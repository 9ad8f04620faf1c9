"""tab-process-model: our MegaMoE kernel measured with one process driving every GPU
(raw/megamoe.json) and with one process per GPU (raw/megamoe_per_gpu.json), point by
point: the ratio of median times and whether the two agree within noise (compare.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from xstage_bench import layout
from xstage_bench.analysis import labels, load
from xstage_bench.compare import compare_docs
from xstage_bench.tables.common import Table


def build(dataset_dir: Path) -> Table:
    single = load.raw_doc(dataset_dir, layout.MEGAMOE_RAW)
    per_gpu = load.raw_doc(dataset_dir, layout.MEGAMOE_PER_GPU_RAW)
    ours = {**single, "records": [r for r in single["records"] if not r["point"].get("variant")]}
    comparison = compare_docs(ours, per_gpu, metric="time_us")
    if comparison.rows.empty:
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': no point is ok in both {layout.MEGAMOE_RAW} "
            f"and {layout.MEGAMOE_PER_GPU_RAW}"
        )
    frame = pd.DataFrame([{**comparison.summary(), "tolerance": comparison.tolerance}])
    notes = [
        "ratio = per-GPU-process median time_us / single-process median time_us, per "
        "configuration and schedule of our kernel; a point agrees when the bootstrap CIs "
        f"of the two medians overlap or they differ by at most {comparison.tolerance:.0%}.",
        "time_us differs in definition: single process, GPU 0's events around every rank's "
        "kernel, a stream-event barrier and the reductions; per GPU, the slowest rank's "
        "events after a device barrier around its kernel, a device barrier and its reduction.",
    ]
    for label, ids in (
        ("only in the single-process run", comparison.only_a),
        ("only in the per-GPU run", comparison.only_b),
        ("not ok in one run, left out", comparison.not_ok),
    ):
        if ids:
            notes.append(f"{len(ids)} point(s) {label}")
    notes += [f"environment differs: {d}" for d in comparison.environment]
    per_point = comparison.rows[["id", "median_a", "median_b", "ratio", "agree"]].rename(
        columns={"median_a": "single_us", "median_b": "per_gpu_us"}
    )
    return Table(
        frame,
        "MegaMoE: one process for all GPUs vs one process per GPU",
        labels.doc_label(dataset_dir, per_gpu),
        notes,
        [("Per point", per_point)],
    )
