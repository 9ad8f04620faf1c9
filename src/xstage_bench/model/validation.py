"""Validation of the fitted laws: both variants refitted without a held-out fifth of the
records (by id hash), then every record's t_iss_slowest (and period, for periodic records)
predicted and compared, with the error summaries the model file and its checks read.

This module exists so that what the laws predict and how well, the fit's test, is read
apart from how the parameters are fitted (stages.py) and assembled (fit.py).
"""

from __future__ import annotations

import hashlib

import numpy as np

from xstage_bench.model import laws
from xstage_bench.model.records import ISOLATED_KINDS, ROLES, FitData, Loaded, Recs
from xstage_bench.model.stages import Params, fit_chain

HOLDOUT_PERCENT = 20


def held_out(record_id: str) -> bool:
    """Deterministic split: about HOLDOUT_PERCENT% of ids, by hash, never fitted."""
    return int(hashlib.sha256(record_id.encode()).hexdigest()[:8], 16) % 100 < HOLDOUT_PERCENT


T_ISS = "t_iss_slowest_us"
PERIOD = "period_us"


def predict(p: Params, recs: Recs, metric: str) -> np.ndarray | None:
    """The laws' value of `metric` for each record, or None where p cannot predict it.

    Periodic records: the steady train's issue time and period (laws.train_*); isolated
    bursts and drain probes: the isolated law. Without a Q only the periodic law is left.
    """
    if p.R is None or not p.has_T0:
        return None
    T0 = p.T0(recs.B)
    Q = p.Q_for(recs.K)
    if metric == PERIOD:
        return None if Q is None else laws.train_period(T0, recs.G, recs.V, p.R, Q)
    isolated = np.isin(recs.kind, ISOLATED_KINDS)
    if Q is None:
        return None if isolated.any() else laws.issue_time(T0, recs.G, recs.V, p.R)
    train = laws.train_issue_time(T0, recs.G, recs.V, p.R, Q)
    return np.where(isolated, laws.isolated_issue_time(T0, recs.V, Q, p.R), train)


def _rel(pred: np.ndarray | None, j: int, measured: float) -> tuple[float | None, float | None]:
    if pred is None:
        return None, None
    return float(pred[j]), float((pred[j] - measured) / measured)


def _rows(recs: Recs, metric: str, shared: Params, window: Params, in_fit: bool, path: str) -> list:
    pred = predict(shared, recs, metric)
    if pred is None:
        return []  # no shared-Q prediction: nothing to validate (e.g. no Q, isolated law)
    pred_w = predict(window, recs, metric)
    rows = []
    for j, rid in enumerate(recs.ids):
        y = float(recs.y[j])
        predicted, rel = _rel(pred, j, y)
        predicted_w, rel_w = _rel(pred_w, j, y)
        rows.append(
            {
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
                "metric": metric,
                "measured_us": y,
                "predicted_us": predicted,
                "rel_error": rel,
                "predicted_window_us": predicted_w,
                "rel_error_window": rel_w,
                "in_fit_set": in_fit,
                "held_out": held_out(rid) if in_fit else True,
            }
        )
    return rows


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
    held = [r for r in rows if r["held_out"]]
    fit_held = [r for r in held if r["in_fit_set"]]
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


def validate(loaded: Loaded) -> tuple[list[dict], Params]:
    """Fit both variants without the held-out records, then predict every record's
    t_iss_slowest (and period, for periodic records): the fit set's, held-out ones
    flagged, and those validated apart."""

    def training(recs: Recs) -> Recs:
        return recs.where([not held_out(i) for i in recs.ids])

    train = FitData(*(training(getattr(loaded.fit, role)) for role in ROLES))
    shared = fit_chain(train)
    window = fit_chain(train, window=True)
    rows: list[dict] = []
    for data, in_fit in ((loaded.fit, True), (loaded.apart, False)):
        for recs, metric in ((data.periodic, T_ISS), (data.isolated, T_ISS), (data.period, PERIOD)):
            rows += _rows(recs, metric, shared, window, in_fit, loaded.path)
    return rows, shared


def no_rows_reason(shared: Params) -> str:
    why = shared.reasons.get("T0") or shared.reasons.get("R") or "no record to predict"
    return f"no training fit: {why}"
