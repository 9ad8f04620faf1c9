"""Raw records as data frames: one row per record, and which rows are usable."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from xstage_bench.data import storepath
from xstage_bench.report.analysis.load import NoDataError


def is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def records_frame(doc: dict) -> pd.DataFrame:
    """One row per record: point columns, status, and median/ci_low/ci_high per metric.

    Metric columns are '<metric>_median', '<metric>_ci_low', '<metric>_ci_high'; scalar
    extras become 'extra_<key>'. Failed records keep their point columns and status. Every
    row has its store path ('path': peer, host or local; records older than paths are the
    peer path's, storepath.point_path).
    """
    rows = []
    for record in doc["records"]:
        row = {k: v for k, v in record["point"].items() if k != "id" and is_scalar(v)}
        row["path"] = storepath.point_path(record["point"])
        row.update(
            id=record["id"],
            status=record["status"],
            error=record.get("error"),
            throttled=record.get("throttled"),
        )
        for metric, s in (record.get("summary") or {}).items():
            row[f"{metric}_median"] = s["median"]
            row[f"{metric}_ci_low"] = s.get("ci_low", np.nan)
            row[f"{metric}_ci_high"] = s.get("ci_high", np.nan)
        for key, value in (record.get("extra") or {}).items():
            if is_scalar(value):
                row[f"extra_{key}"] = value
        rows.append(row)
    return pd.DataFrame(rows)


def ok_rows(
    df: pd.DataFrame, dataset_dir: Path, source: str, metrics: tuple[str, ...]
) -> pd.DataFrame:
    """The ok rows that carry every metric; NoDataError naming the file when there are none."""
    if df.empty:
        raise NoDataError(f"dataset '{dataset_dir.name}': {source} has no records")
    ok = df[df["status"] == "ok"]
    if ok.empty:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(Counter(df["status"]).items()))
        raise NoDataError(f"dataset '{dataset_dir.name}': {source} has no ok record ({statuses})")
    for metric in metrics:
        column = f"{metric}_median"
        if column not in ok.columns:
            raise NoDataError(
                f"dataset '{dataset_dir.name}': {source} has no ok record with metric '{metric}'"
            )
        ok = ok[ok[column].notna()]
    if ok.empty:
        raise NoDataError(
            f"dataset '{dataset_dir.name}': {source} has no ok record with "
            f"metric(s) {', '.join(metrics)}"
        )
    return ok


def failure_note(df: pd.DataFrame, action: str = "not plotted") -> str | None:
    """'3 points failed (timeout: 1, wrong: 2), not plotted' or None when all are ok."""
    if df.empty:
        return None
    bad = df[df["status"] != "ok"]
    parts = []
    if len(bad):
        counts = Counter(bad["status"])
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
        noun = "point" if len(bad) == 1 else "points"
        parts.append(f"{len(bad)} {noun} failed ({detail}), {action}")
    if "throttled" in df.columns:
        throttled = int((df["throttled"] == True).sum())  # noqa: E712 (column holds None too)
        if throttled:
            parts.append(f"{throttled} point(s) flagged throttled")
    return "; ".join(parts) or None


def remote_paths(df: pd.DataFrame) -> list[str]:
    """The store paths (peer, host) that rows of `df` measured, in storepath.PATHS order."""
    present = set(df["path"]) if "path" in df.columns else set()
    return [p for p in storepath.PATHS if p in present]
