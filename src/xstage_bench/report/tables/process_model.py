"""tab-process-model: our MegaMoE kernel measured with one process driving every GPU
(raw/megamoe.json) and with one process per GPU (raw/megamoe_per_gpu.json), point by
point, on the peer path (one process per GPU needs two GPUs or more): per metric (layer
time, kernel time, where both runs recorded it) the ratio of median times with its 95%
CI and whether the two agree within noise (compare.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd

from xstage_bench.data import layout, storepath
from xstage_bench.data.compare import Comparison, compare_docs
from xstage_bench.data.grid import side_arm
from xstage_bench.report.analysis import labels, load, megamoe
from xstage_bench.report.analysis.speedup_ci import RatioSamples
from xstage_bench.report.tables.common import Table


def _has_metric(doc: dict, metric: megamoe.Metric) -> bool:
    ok = [r for r in doc["records"] if r["status"] == "ok"]
    return bool(ok) and all(metric.sample in (r.get("summary") or {}) for r in ok)


def ratio_cis(single: dict, per_gpu: dict, comparison: Comparison) -> pd.DataFrame:
    """Per compared point: per-GPU over single-process median with a 95% bootstrap CI
    (unpaired: the two runs were taken at different times) and its verdict."""
    a = {r["id"]: r for r in single["records"]}
    b = {r["id"]: r for r in per_gpu["records"]}
    rows = []
    for pid in comparison.rows["id"]:
        found = RatioSamples.of(
            b[pid]["samples"][comparison.metric], a[pid]["samples"][comparison.metric], False
        ).ci()
        rows.append({"id": pid, "ci_low": found["ci_low"], "ci_high": found["ci_high"]})
        rows[-1]["verdict"] = {"faster": "single faster", "slower": "per-GPU faster"}.get(
            found["verdict"], "tie"
        )
    return pd.DataFrame(rows, columns=["id", "ci_low", "ci_high", "verdict"])


def not_measured(dataset_dir: Path, per_gpu: dict) -> Table:
    """The table of a per-GPU run that measured no point (on one GPU every point is
    unsupported): what was asked and why nothing was measured, from the records."""
    reasons = Counter((r["status"], r.get("error") or "") for r in per_gpu["records"])
    frame = pd.DataFrame(
        [{"status": status, "points": n, "why": why} for (status, why), n in reasons.items()]
    )
    return Table(
        frame,
        "MegaMoE: one process for all GPUs vs one process per GPU: not measured",
        labels.doc_label(dataset_dir, per_gpu),
        [f"{layout.MEGAMOE_PER_GPU_RAW} holds no ok point; its records say why."],
    )


def build(dataset_dir: Path) -> Table:
    single = load.raw_doc(dataset_dir, layout.MEGAMOE_RAW)
    per_gpu = load.raw_doc(dataset_dir, layout.MEGAMOE_PER_GPU_RAW)
    ours = {
        **single,
        "records": [
            r
            for r in single["records"]
            if not r["point"].get("variant")
            and not side_arm(r["point"])
            and storepath.point_path(r["point"]) == storepath.PEER
        ],
    }
    metrics = [m for m in megamoe.METRICS if _has_metric(ours, m) and _has_metric(per_gpu, m)]
    comparisons = {m: compare_docs(ours, per_gpu, metric=m.sample) for m in metrics}
    if not any(r["status"] == "ok" for r in per_gpu["records"]) and per_gpu["records"]:
        return not_measured(dataset_dir, per_gpu)
    if not metrics or comparisons[metrics[0]].rows.empty:
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': no point is ok in both {layout.MEGAMOE_RAW} "
            f"and {layout.MEGAMOE_PER_GPU_RAW}"
        )
    first = comparisons[metrics[0]]
    frame = pd.DataFrame(
        [
            {"metric": m.label, **c.summary(), "tolerance": c.tolerance}
            for m, c in comparisons.items()
        ]
    )
    notes = [
        f"{megamoe.path_title(storepath.PEER)}: one process per GPU needs two GPUs or more.",
        "ratio = per-GPU-process median / single-process median, per configuration and "
        "schedule of our kernel, in each metric: "
        + "; ".join(f"'{m.label}' = {m.sample}" for m in metrics)
        + "; a point agrees when the bootstrap CIs of the two medians overlap or they differ "
        f"by at most {first.tolerance:.0%}; ci_low/ci_high: 95% bootstrap CI of the ratio "
        "(unpaired: the runs were taken at different times).",
        "the layer time differs in definition: single process, GPU 0's events around every "
        "rank's kernel, a stream-event barrier and the reductions; per GPU, the slowest "
        "rank's events after a device barrier around its kernel, a device barrier and its "
        "reduction. The kernel time is the slowest rank's kernel alone in both.",
    ]
    for label, ids in (
        ("only in the single-process run", first.only_a),
        ("only in the per-GPU run", first.only_b),
        ("not ok in one run, left out", first.not_ok),
    ):
        if ids:
            notes.append(f"{len(ids)} point(s) {label}")
    notes += [f"environment differs: {d}" for d in first.environment]
    sections = []
    for metric, comparison in comparisons.items():
        per_point = comparison.rows[["id", "median_a", "median_b", "ratio", "agree"]].rename(
            columns={"median_a": "single_us", "median_b": "per_gpu_us"}
        )
        per_point = per_point.merge(ratio_cis(ours, per_gpu, comparison), on="id", how="left")
        per_point = per_point[
            ["id", "single_us", "per_gpu_us", "ratio", "ci_low", "ci_high", "verdict", "agree"]
        ]
        sections.append((f"Per point, {metric.label}", per_point))
    return Table(
        frame,
        "MegaMoE: one process for all GPUs vs one process per GPU (peer path)",
        labels.doc_label(dataset_dir, per_gpu),
        notes,
        sections,
    )
