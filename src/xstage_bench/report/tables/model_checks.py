"""tab-model-checks: how well the Burst-Gap model predicts, and each of its checks, per path.

The table beside fig-model-validation: what the figure once carried as a dozen lines of
footnote (the held-out errors per metric and variant, every check with its detail) is a
row each here, so that the figure shows its data and this table the verdicts. One row per
(path, item): the held-out error of the fit set (all metrics, then each metric), the
per-producer window variant, the free-running records, then every check of model.checks
(passed, FAILED, or not evaluated where the data cannot answer it) with its detail.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from xstage_bench.data import storepath
from xstage_bench.report.analysis import fitted, labels, load
from xstage_bench.report.tables.common import Table

COLUMNS = [
    "path",
    "far_end",
    "kind",
    "item",
    "result",
    "n",
    "median_abs_rel_error",
    "p90_abs_rel_error",
    "detail",
]
CHECK_RESULT = {True: "passed", False: "FAILED", None: "not evaluated"}


def _error_row(path: str, item: str, summary: dict | None) -> dict:
    summary = summary or {}
    return {
        "path": path,
        "far_end": storepath.far_end(path),
        "kind": "prediction error",
        "item": item,
        "result": "" if summary.get("n") else "no points",
        "n": summary.get("n", 0),
        "median_abs_rel_error": summary.get("median_abs_rel_error"),
        "p90_abs_rel_error": summary.get("p90_abs_rel_error"),
        "detail": summary.get("reason", ""),
    }


def path_rows(path: str, fit: dict) -> list[dict]:
    """The rows of one path's fit (fitted.for_path's document)."""
    rows = [_error_row(path, "fit set, held out (shared Q)", fit["validation_summary"])]
    for metric, summary in (fit.get("validation_by_metric") or {}).items():
        rows.append(_error_row(path, f"fit set, held out: {metric}", summary))
    window = (fit.get("variants") or {}).get(fitted.WINDOW_VARIANT)
    if window:
        rows.append(
            _error_row(path, "per-producer window variant, held out", window["validation_summary"])
        )
    free = fit.get("validation_summary_free")
    if free and free.get("n"):
        rows.append(_error_row(path, "free-running records (never fitted)", free))
    for name, check in fit["checks"].items():
        rows.append(
            {
                "path": path,
                "far_end": storepath.far_end(path),
                "kind": "check",
                "item": name,
                "result": CHECK_RESULT[check["passed"]],
                "detail": check["detail"],
            }
        )
    return rows


def counts(fit: dict) -> str:
    """'2 FAILED, 1 not evaluated, 6 passed': a path's checks in one phrase (the figure's)."""
    results = [CHECK_RESULT[c["passed"]] for c in fit["checks"].values()]
    return ", ".join(
        f"{results.count(r)} {r}" for r in ("FAILED", "not evaluated", "passed") if results.count(r)
    )


def build(dataset_dir: Path) -> Table:
    model = load.model_doc(dataset_dir)
    rows = [
        row for path in fitted.paths(model) for row in path_rows(path, fitted.for_path(model, path))
    ]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    failed = frame[(frame["kind"] == "check") & (frame["result"] == "FAILED")]
    notes = [
        f"{len(failed)} check(s) FAILED"
        + (
            ": "
            + ", ".join(f"{p}/{i}" for p, i in zip(failed["path"], failed["item"], strict=True))
            if len(failed)
            else ""
        ),
        "Prediction error: |predicted - measured| / measured over the records of each set "
        "(held out: never used in the fit).",
    ]
    return Table(
        frame,
        "Burst-Gap model: prediction errors and checks",
        labels.model_label(dataset_dir, model),
        notes,
    )
