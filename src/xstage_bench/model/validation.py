"""Validation of the fitted laws: every capacity variant refitted without a held-out fifth
of the records, then every record's issue time (and period, for periodic records)
predicted and compared; the variant with the least held-out error is the model's.

This module exists so that what the laws predict and how well, the fit's test, is read
apart from how the parameters are fitted (stages.py) and assembled (fit.py).

The held-out records are drawn stratified: records are grouped by study, K and regime
(periodic: zero gap, a gap shorter than the drain time, a gap that drains the burst;
isolated: the smaller or larger half of its K's sizes), ordered within each group by a
seeded hash of their id, and every fifth is held out from a seeded offset. So each
study, K and regime is tested in proportion, a group of two or more is never all fitted,
and the split is the same from run to run (one random 20% split could hold out none of
the few records that decide a regime: over ten such splits the host path's held-out p90
ranged 29-3375%).
"""

from __future__ import annotations

import hashlib

import numpy as np

from xstage_bench.model import laws
from xstage_bench.model.capacity import LAWS
from xstage_bench.model.records import ISOLATED_KINDS, ROLES, FitData, Loaded, Recs
from xstage_bench.model.stages import Params, fit_laws

HOLDOUT_PERCENT = 20
STRIDE = 100 // HOLDOUT_PERCENT  # every STRIDE-th record of a group is held out
WORST_ROWS = 5  # the held-out rows the model misses most, listed in the model file
CHOICE_RESOLUTION = 1e-3  # held-out medians within 0.1 points tie: p90 decides, then size

ISSUE = "issue"  # the record's own issue-time metric (Recs.metric)
PERIOD = "period_us"


def _hash(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def regime(recs: Recs, j: int, R0: float | None) -> str:
    """The record's regime from its point and the fastest zero-gap drain R0 (bytes/us),
    known before any fit: periodic by its gap against the drain time, isolated by size."""
    if recs.kind[j] in ISOLATED_KINDS:
        mine = recs.V[(recs.K == recs.K[j]) & (np.asarray(recs.study) == recs.study[j])]
        return "isolated_small" if recs.V[j] <= np.median(mine) else "isolated_large"
    if recs.G[j] == 0:
        return "zero_gap"
    if R0 is None or recs.G[j] < recs.V[j] / R0:
        return "backlog"
    return "drained"


def held_out_ids(fit: FitData, seed: int = 0, fold: int = 0) -> set[str]:
    """The ids held out of the fit set, stratified by study, K and regime (module doc);
    folds 0 to STRIDE - 1 hold out disjoint fifths that together cover every record."""
    zg = fit.zero_gap
    R0 = float(np.max(zg.V / zg.y)) if len(zg) else None
    groups: dict[str, dict[str, None]] = {}  # ordered sets: an id is one record
    for recs in (fit.periodic, fit.isolated):
        for j, rid in enumerate(recs.ids):
            name = f"{recs.study[j]}/K={recs.K[j]:g}/{regime(recs, j, R0)}"
            groups.setdefault(name, {})[rid] = None
    held = set()
    for name, ids in groups.items():
        ranked = sorted(ids, key=lambda i: _hash(f"{seed}:{i}"))
        offset = _hash(f"{seed}:{name}") % STRIDE
        held |= {rid for rank, rid in enumerate(ranked) if (rank + offset) % STRIDE == fold}
    return held


def predict(p: Params, recs: Recs, what: str) -> np.ndarray | None:
    """The laws' issue time (ISSUE) or period (PERIOD) of each record, or None where p
    cannot predict it.

    Periodic records: the steady train's issue time and period (laws.train_*); isolated
    bursts and drain probes: the isolated law. Without a Q only the periodic law is left.
    """
    if p.R is None or not p.has_T0:
        return None
    T0 = p.T0_of(recs)
    Q = p.Q(recs.K)
    lag = (p.lag.fraction, p.lag.rate)
    if what == PERIOD:
        return None if Q is None else laws.train_period(T0, recs.G, recs.V, p.R, Q, *lag)
    isolated = np.isin(recs.kind, ISOLATED_KINDS)
    if Q is None:
        return None if isolated.any() else laws.issue_time(T0, recs.G, recs.V, p.R)
    train = laws.train_issue_time(T0, recs.G, recs.V, p.R, Q, *lag)
    return np.where(isolated, laws.isolated_issue_time(T0, recs.V, Q, p.R, *lag), train)


def error_key(law: str) -> str:
    """The rows' column of one capacity variant's relative error."""
    return f"rel_error_{law}"


def _rows(
    recs: Recs, what: str, fits: dict[str, Params], in_fit: bool, held: set[str], path: str
) -> list:
    preds = {law: predict(p, recs, what) for law, p in fits.items()}
    if all(pred is None for pred in preds.values()):
        return []  # nothing to validate (e.g. no Q, isolated law)
    rows = []
    for j, rid in enumerate(recs.ids):
        y = float(recs.y[j])
        row = {
            "id": rid,
            "study": recs.study[j],
            "kind": recs.kind[j],
            "K": int(recs.K[j]),
            "V": int(recs.V[j]),
            "gap_us": float(recs.G[j]),
            "dest": path,
            "path": path,
            "sync": "barrier" if recs.aligned[j] else recs.sync[j],
            "aligned": bool(recs.aligned[j]),
            "metric": PERIOD if what == PERIOD else recs.metric[j],
            "measured_us": y,
            "in_fit_set": in_fit,
            "held_out": rid in held if in_fit else True,
        }
        for law, pred in preds.items():
            row[f"predicted_{law}_us"] = None if pred is None else float(pred[j])
            row[error_key(law)] = None if pred is None else float((pred[j] - y) / y)
        rows.append(row)
    return rows


def with_law(rows: list[dict], law: str) -> list[dict]:
    """The rows with the chosen variant's prediction as predicted_us and rel_error."""
    return [
        {**r, "predicted_us": r[f"predicted_{law}_us"], "rel_error": r[error_key(law)]}
        for r in rows
    ]


def summarize_errors(rows: list[dict], key: str = "rel_error") -> dict:
    errors = np.abs([r[key] for r in rows if r[key] is not None])
    return {
        "n": int(errors.size),
        "median_abs_rel_error": float(np.median(errors)) if errors.size else None,
        "p90_abs_rel_error": float(np.quantile(errors, 0.9)) if errors.size else None,
    }


def summaries(rows: list[dict], key: str = "rel_error") -> dict:
    """The error summaries of one variant (key: its rel_error column).

    validation_summary: held-out rows of the fit set; validation_summary_free: every
    free-running row (never fitted); validation_by_metric: the first, per metric;
    validation_by_group: per "study/sync:metric", over held-out rows, with "all" (fitted
    rows too, so in-sample) beside it to show where the laws miss systematically.
    """
    fit_held = fit_held_out(rows, key)
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(f"{r['study']}/{r['sync']}:{r['metric']}", []).append(r)
    return {
        "validation_summary": summarize_errors(fit_held, key),
        "validation_summary_free": summarize_errors(
            [r for r in rows if not r["in_fit_set"] and not r["aligned"]], key
        ),
        "validation_by_metric": {
            m: summarize_errors([r for r in fit_held if r["metric"] == m], key)
            for m in sorted({r["metric"] for r in rows})
        },
        "validation_by_group": {
            g: {
                **summarize_errors([r for r in rs if r["held_out"]], key),
                "all": summarize_errors(rs, key),
            }
            for g, rs in sorted(groups.items())
        },
    }


def fit_held_out(rows: list[dict], key: str = "rel_error") -> list[dict]:
    """The held-out rows of the fit set that have an error (what validation_summary and
    the held-out check judge)."""
    return [r for r in rows if r["held_out"] and r["in_fit_set"] and r[key] is not None]


def worst_rows(rows: list[dict], n: int = WORST_ROWS) -> list[dict]:
    """The n held-out rows of the fit set with the largest |rel_error|, worst first."""
    held = fit_held_out(rows)
    held.sort(key=lambda r: -abs(r["rel_error"]))
    keys = ("id", "metric", "K", "V", "gap_us", "measured_us", "predicted_us", "rel_error")
    return [{k: r[k] for k in keys} for r in held[:n]]


def choose_law(heldout: dict[str, dict]) -> str | None:
    """The capacity variant with the least held-out median |error| (medians within
    CHOICE_RESOLUTION tie, then the lower p90, then the fewer free numbers); None where no
    variant predicted a held-out record. heldout: law -> error summary."""
    scored = [
        (round(s["median_abs_rel_error"] / CHOICE_RESOLUTION), s["p90_abs_rel_error"], i, law)
        for i, law in enumerate(LAWS)
        if (s := heldout.get(law)) and s["n"]
    ]
    return min(scored)[3] if scored else None


def _fold(loaded: Loaded, held: set[str]) -> tuple[list[dict], dict[str, Params]]:
    """Every capacity variant fitted without the `held` records; the fit set's rows."""

    def training(recs: Recs) -> Recs:
        return recs.where([i not in held for i in recs.ids])

    train = FitData(*(training(getattr(loaded.fit, role)) for role in ROLES))
    fits = fit_laws(train)
    data = loaded.fit
    rows: list[dict] = []
    for recs, what in ((data.periodic, ISSUE), (data.isolated, ISSUE), (data.period, PERIOD)):
        rows += _rows(recs, what, fits, True, held, loaded.path)
    return rows, fits


def validate(loaded: Loaded, seed: int = 0) -> tuple[list[dict], dict[str, Params]]:
    """Fit every capacity variant without the held-out records (fold 0), then predict
    every record's issue time (and period, for periodic records): the fit set's, held-out
    ones flagged, and those validated apart. Returns the rows (each variant's prediction
    and error) and each variant's training fit."""
    held = held_out_ids(loaded.fit, seed)
    rows, fits = _fold(loaded, held)
    data = loaded.apart
    for recs, what in ((data.periodic, ISSUE), (data.isolated, ISSUE), (data.period, PERIOD)):
        rows += _rows(recs, what, fits, False, held, loaded.path)
    return rows, fits


def cross_validated(loaded: Loaded, seed: int = 0) -> tuple[dict[str, dict], dict[str, dict]]:
    """Each capacity variant's held-out error over all STRIDE folds, so that every record
    of the fit set is predicted once by a fit that never saw it: (over the isolated bursts,
    where the capacity acts and which choose the law; over every row of the fit set).

    One fifth holds too few of the bursts the capacity acts on to tell the variants apart,
    and over every row the periodic records, which hardly depend on Q, set the median: a
    window law that misplaces each K's knee can still win it (seen on a simulated path of
    one shared capacity)."""
    held_rows: list[dict] = []
    for fold in range(STRIDE):
        rows, _ = _fold(loaded, held_out_ids(loaded.fit, seed, fold))
        held_rows += [r for r in rows if r["held_out"]]
    isolated = [r for r in held_rows if r["kind"] in ISOLATED_KINDS]

    def per_law(rows: list[dict]) -> dict[str, dict]:
        return {law: {**summarize_errors(rows, error_key(law)), "folds": STRIDE} for law in LAWS}

    return per_law(isolated), per_law(held_rows)


def no_rows_reason(train: Params) -> str:
    why = train.reasons.get("T0") or train.reasons.get("R") or "no record to predict"
    return f"no training fit: {why}"
