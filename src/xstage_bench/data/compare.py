"""Two runs of one experiment side by side: per point, the ratio of their medians and
whether the difference is within noise.

Used to show that two ways of measuring the same thing agree (MegaMoE with one process
for all GPUs vs one process per GPU), or that a rerun reproduces a committed dataset:

    xstage compare results/ref-h200x2/raw/megamoe.json results/h200x2/raw/megamoe_per_gpu.json

A point agrees when the bootstrap CIs of the two medians overlap, or when the medians
differ by at most `tolerance` (relative): a CI covers the noise within one run, not the
drift of clocks and temperature between runs minutes apart, which is about as large.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from xstage_bench.data.results import OK
from xstage_bench.data.stats import geomean

DEFAULT_TOLERANCE = 0.03
PREFERRED_METRICS = ("time_us", "sender_us")
ENVIRONMENT_KEYS = ("host", "driver", "cuda", "python")


class CompareError(ValueError):
    """The two files cannot be compared; the message says why."""


@dataclass
class Comparison:
    metric: str
    tolerance: float
    rows: pd.DataFrame  # one row per point ok in both runs
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    not_ok: list[str] = field(default_factory=list)  # in both, not ok in one of them
    environment: list[str] = field(default_factory=list)  # what differs between the runs

    def summary(self) -> dict:
        ratio = self.rows["ratio"].to_numpy(dtype=float)
        if ratio.size == 0:
            return {"points": 0}
        return {
            "points": int(ratio.size),
            "geomean_ratio": geomean(ratio),
            "median_ratio": float(np.median(ratio)),
            "min_ratio": float(ratio.min()),
            "max_ratio": float(ratio.max()),
            "agree": int(self.rows["agree"].sum()),
            "ci_disjoint": int((~self.rows["ci_overlap"]).sum()),
        }

    def lines(self) -> list[str]:
        """A plain-text report."""
        s = self.summary()
        out = [f"metric {self.metric}: {s['points']} points ok in both runs"]
        if s["points"]:
            out.append(
                f"ratio b/a of medians: geomean {s['geomean_ratio']:.4f}, median "
                f"{s['median_ratio']:.4f}, range [{s['min_ratio']:.4f}, {s['max_ratio']:.4f}]"
            )
            out.append(
                f"agree (CIs overlap or within {self.tolerance:.0%}): {s['agree']}/{s['points']}"
                f"; CIs disjoint: {s['ci_disjoint']}"
            )
            worst = self.rows.reindex(
                (self.rows["ratio"] - 1).abs().sort_values(ascending=False).index
            ).head(5)
            out.append("largest differences:")
            for _, r in worst.iterrows():
                out.append(
                    f"  {r['id']}: {r['median_a']:.4g} -> {r['median_b']:.4g} "
                    f"(x{r['ratio']:.4f}{'' if r['agree'] else ', disagrees'})"
                )
        for label, ids in (
            ("only in a", self.only_a),
            ("only in b", self.only_b),
            ("not ok in one run", self.not_ok),
        ):
            if ids:
                more = ", ..." if len(ids) > 3 else ""
                out.append(f"{label}: {len(ids)} ({', '.join(ids[:3])}{more})")
        out += [f"environment differs: {d}" for d in self.environment]
        return out


def primary_metric(doc: dict) -> str:
    """The metric a run's points are compared on: its main time."""
    for record in doc["records"]:
        if record["status"] == OK:
            names = list(record["summary"])
            return next((m for m in PREFERRED_METRICS if m in names), names[0])
    raise CompareError(f"{doc['experiment']} run '{doc['dataset']}' has no ok point")


def _environment_differences(a: dict, b: dict) -> list[str]:
    ea, eb = a["environment"], b["environment"]
    diffs = []
    for key in ENVIRONMENT_KEYS:
        if ea.get(key) != eb.get(key):
            diffs.append(f"{key}: {ea.get(key)!r} vs {eb.get(key)!r}")
    pa, pb = ea.get("packages") or {}, eb.get("packages") or {}
    for name in sorted(set(pa) | set(pb)):
        if pa.get(name) != pb.get(name):
            diffs.append(f"{name}: {pa.get(name)} vs {pb.get(name)}")
    sha_a, sha_b = (ea.get("git") or {}).get("sha"), (eb.get("git") or {}).get("sha")
    if sha_a != sha_b:
        diffs.append(f"git sha: {str(sha_a)[:7]} vs {str(sha_b)[:7]}")
    return diffs


def compare_docs(
    a: dict, b: dict, *, metric: str | None = None, tolerance: float = DEFAULT_TOLERANCE
) -> Comparison:
    """Compare run `b` with run `a` (ratio b/a) on their common points."""
    if a["experiment"] != b["experiment"]:
        raise CompareError(f"different experiments: {a['experiment']} vs {b['experiment']}")
    if not 0 <= tolerance < 1:
        raise CompareError(f"tolerance must be in [0, 1), got {tolerance}")
    metric = metric or primary_metric(a)
    ra = {r["id"]: r for r in a["records"]}
    rb = {r["id"]: r for r in b["records"]}
    rows, not_ok = [], []
    for pid in (i for i in ra if i in rb):
        x, y = ra[pid], rb[pid]
        if x["status"] != OK or y["status"] != OK:
            not_ok.append(pid)
            continue
        if metric not in x["summary"] or metric not in y["summary"]:
            raise CompareError(f"point {pid} has no metric '{metric}' in both runs")
        sx, sy = x["summary"][metric], y["summary"][metric]
        ratio = sy["median"] / sx["median"]
        overlap = sx["ci_low"] <= sy["ci_high"] and sy["ci_low"] <= sx["ci_high"]
        rows.append(
            {
                "id": pid,
                "median_a": sx["median"],
                "median_b": sy["median"],
                "ratio": ratio,
                "ci_overlap": bool(overlap),
                "agree": bool(overlap or abs(ratio - 1) <= tolerance),
                "rel_iqr_a": sx.get("rel_iqr"),
                "rel_iqr_b": sy.get("rel_iqr"),
            }
        )
    columns = ["id", "median_a", "median_b", "ratio", "ci_overlap", "agree"]
    frame = pd.DataFrame(rows, columns=columns + ["rel_iqr_a", "rel_iqr_b"])
    if not all(math.isfinite(r) and r > 0 for r in frame["ratio"]):
        raise CompareError(f"a median of '{metric}' is zero or not finite")
    return Comparison(
        metric,
        tolerance,
        frame,
        only_a=[i for i in ra if i not in rb],
        only_b=[i for i in rb if i not in ra],
        not_ok=not_ok,
        environment=_environment_differences(a, b),
    )
