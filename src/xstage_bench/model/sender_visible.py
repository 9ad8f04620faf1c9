"""Which time an aligned periodic record is fitted on: the sender-visible issue time.

In an aligned train (sync = barrier) the stall of a small per-producer burst leaves the
timed store loop: the loop ends in about T0 and the wait lands on the producer's next
memory operation, the grid barrier's atomic, which returns only once the burst has
drained (issue #52; host path, V = 2 MiB, G = 0: the store loop is 1% of the period at
K = 132). What the laws call the issue time of such a burst is therefore the time until
the producer could issue its next operation, not its store loop. Per record, best first:

- measured, `t_vis_slowest_us`: per burst, the slowest producer's store loop plus the
  hold its barrier atomic waited beyond the atomic's base cost (kernels that record it);
- derived, `t_vis_derived_us` (runs before that field): period - G - the barrier's cost,
  never below the store loop. The barrier's cost is its atomic plus the alignment wait
  for the last producer, which grows with the gap (producers' gaps differ by ~1%), so it
  is a line in G: fitted to the series' own records whose gap drains the burst twice over
  at the fastest zero-gap drain rate (nothing is held there), or where a series has fewer
  than two such gaps, to all of them. It cannot tell an alignment wait from a hold where
  the two differ from the line, so it is labelled derived wherever it is used, and the
  sender-visible time needs a new run;
- the store loop, `t_iss_slowest_us`: free-running records (their next operation is the
  gap's register work, which does not wait), and aligned ones where neither of the above
  can be had (no period, or no drained record to learn the barrier's cost from).
"""

from __future__ import annotations

import numpy as np

MEASURED = "t_vis_slowest_us"
DERIVED = "t_vis_derived_us"
STORE_LOOP = "t_iss_slowest_us"
DRAINED_FACTOR = 2.0  # a gap of twice the drain time V/R0 has certainly emptied the path
NEEDS_NEW_RUN = (
    "the sender-visible issue time of aligned periodic records is derived from their "
    "period (t_vis_derived_us): it needs a new run that records t_vis_slowest_us"
)


def _series(point: dict) -> str:
    return f"{point.get('study', '')}/K={point['K']}/V={point['V']}"


def _line(G: np.ndarray, cost: np.ndarray) -> tuple[float, float]:
    """(cost at G = 0 in us, us per us of gap), a robust line never below zero."""
    if len(np.unique(G)) < 2:
        return max(float(np.median(cost)), 0.0), 0.0
    # Imported here, not at the top: scipy.stats takes ~1 s to load, and every Snakemake run
    # imports this module while it builds the DAG (claims.counterparts -> paper -> model.checks).
    from scipy.stats import theilslopes

    slope, intercept, _, _ = theilslopes(cost, G)
    return max(float(intercept), 0.0), max(float(slope), 0.0)


def barrier_cost(records: list[dict], R0: float | None) -> dict:
    """The barrier's cost as lines in G: {"pooled": (b0, b1) or None, "series": {name:
    (b0, b1)}, "n_drained": n} from the aligned periodic records whose gap drains their
    burst twice over at R0 (bytes/us)."""
    drained: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        p, s = r["point"], r["samples"]
        G = p.get("gap_us", 0.0)
        if R0 and G > 0 and G >= DRAINED_FACTOR * p["V"] / R0 and s.get("period_us"):
            cost = np.median(s["period_us"]) - G - np.median(s["t_iss_slowest_us"])
            drained.setdefault(_series(p), []).append((G, float(cost)))
    every = [pair for pairs in drained.values() for pair in pairs]
    pooled = _line(*map(np.array, zip(*every, strict=True))) if every else None
    series = {
        name: _line(*map(np.array, zip(*pairs, strict=True)))
        for name, pairs in drained.items()
        if len({G for G, _ in pairs}) >= 2
    }
    return {"pooled": pooled, "series": series, "n_drained": len(every)}


def samples(record: dict, cost: dict) -> tuple[np.ndarray, str]:
    """(samples, metric) of one aligned periodic record (module doc: measured, derived,
    or the store loop); cost is barrier_cost's answer."""
    s, p = record["samples"], record["point"]
    if s.get(MEASURED):
        return np.asarray(s[MEASURED], dtype=float), MEASURED
    line = cost["series"].get(_series(p), cost["pooled"])
    loop = np.asarray(s["t_iss_slowest_us"], dtype=float)
    if line is None or not s.get("period_us"):
        return loop, STORE_LOOP
    G = p.get("gap_us", 0.0)
    derived = np.asarray(s["period_us"], dtype=float) - G - (line[0] + line[1] * G)
    return np.maximum(derived, np.median(loop)), DERIVED


def describe(cost: dict, metrics: list[str]) -> dict:
    """What the model file says of the aligned periodic records' metric."""
    counts = {m: metrics.count(m) for m in (MEASURED, DERIVED, STORE_LOOP)}
    block: dict = {"records_per_metric": counts}
    if counts[DERIVED]:
        b0, b1 = cost["pooled"]
        block["barrier_cost"] = {
            "pooled_base_us": b0,
            "pooled_us_per_us_of_gap": b1,
            "series_with_own_line": len(cost["series"]),
            "drained_records": cost["n_drained"],
            "drained_when": f"G >= {DRAINED_FACTOR:g} V / R0, R0 the fastest zero-gap drain",
        }
        block["note"] = NEEDS_NEW_RUN
    return block
