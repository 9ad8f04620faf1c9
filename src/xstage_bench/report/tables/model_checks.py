"""tab-model-checks: how well the Burst-Gap model predicts, and each of its checks, per path.

The table beside fig-model-validation: what the figure once carried as a dozen lines of
footnote (the held-out errors per metric and variant, every check with its detail) is a
row each here, so that the figure shows its data and this table the verdicts. One row per
(path, item): the held-out error of the fit set (all metrics, then each metric), each
variant of the capacity law over the cross-validation folds (the chosen one marked), the
free-running records, the findings reported beside the checks (the store loop's share of
the sender-visible time), the held-out rows the model misses most, then every check of
model.checks (passed, FAILED, or not evaluated where the data cannot answer it) with its
detail.
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


def _row(path: str, kind: str, item: str, detail: str, result: str = "") -> dict:
    return {
        "path": path,
        "far_end": storepath.far_end(path),
        "kind": kind,
        "item": item,
        "result": result,
        "detail": detail,
    }


def _law_rows(path: str, law: dict) -> list[dict]:
    rows = []
    for name, summary in law["heldout"].items():
        chosen = ", chosen" if name == law["chosen"] else ""
        folds = summary.get("folds")
        over = f" over {folds} folds" if folds else ""
        item = f"capacity law {name}{chosen}: isolated bursts, held out{over}"
        rows.append(_error_row(path, item, summary))
    return rows


def _finding_rows(path: str, fit: dict) -> list[dict]:
    share = (fit.get("findings") or {}).get("store_loop_share")
    if not share or not share["n"]:
        return []
    per_K = ", ".join(f"K={K}: {v:.0%}" for K, v in share["per_K"].items())
    return [
        _row(
            path, "finding", "store_loop_share", f"{per_K} ({share['n']} records): {share['what']}"
        )
    ]


def _worst_rows(path: str, fit: dict) -> list[dict]:
    return [
        _row(
            path,
            "worst held-out row",
            w["id"],
            f"{w['metric']}: measured {w['measured_us']:.3g} us, predicted "
            f"{w['predicted_us']:.3g} us ({w['rel_error']:+.0%})",
        )
        for w in fit.get("worst_heldout") or []
    ]


def path_rows(path: str, fit: dict) -> list[dict]:
    """The rows of one path's fit (fitted.for_path's document)."""
    law = fitted.capacity_law(fit)
    which = f"capacity law {law['chosen']}" if law else "shared Q"
    rows = [_error_row(path, f"fit set, held out ({which})", fit["validation_summary"])]
    for metric, summary in (fit.get("validation_by_metric") or {}).items():
        rows.append(_error_row(path, f"fit set, held out: {metric}", summary))
    if law:
        rows += _law_rows(path, law)
    free = fit.get("validation_summary_free")
    if free and free.get("n"):
        rows.append(_error_row(path, "free-running records (never fitted)", free))
    rows += _finding_rows(path, fit) + _worst_rows(path, fit)
    for name, check in fit["checks"].items():
        rows.append(_row(path, "check", name, check["detail"], CHECK_RESULT[check["passed"]]))
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
