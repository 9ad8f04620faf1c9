"""tab-megamoe-playback: the fused kernel's time predicted by the Burst-Gap model (issue 52,
item 4). Per arm of our kernel (configuration, share f, schedule and lead, on the main
grid and the lead map): the measured kernel time, the time its tile list takes played
through the path's fitted drain with the hold and without, their errors, and how its tile
costs were calibrated. Then the error summary, with the calibration arms apart; and where
the dataset has a lead map, the lead rule replayed on its swept leads against the best
swept lead and the best constant lead."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from xstage_bench.data import layout
from xstage_bench.report.analysis import labels, megamoe, megamoe_lead
from xstage_bench.report.analysis import megamoe_playback as mp
from xstage_bench.report.tables.common import MAIN, MAX_COLUMNS, Columns, Table
from xstage_bench.report.tables.megamoe_lead import configuration

KEYS = ("path", "configuration", "f", "grid", "schedule", "lead")  # name an arm's row
PREDICTION = (
    "measured us",
    "predicted us (hold)",
    "error (hold)",
    "predicted us (no hold)",
    "error (no hold)",
    "calibration",
)


def markdown_columns(frame: pd.DataFrame) -> dict[str, Columns]:
    """The Markdown copy's parts: the prediction first, then the arm's other columns (its
    point and calibration) in parts that fit a screen; the CSV keeps every column."""
    rest = [c for c in frame.columns if c not in (*KEYS, *PREDICTION)]
    width = MAX_COLUMNS - len(KEYS)
    parts = [("prediction", PREDICTION)] + [
        (f"the arm's point and calibration ({n + 1})", tuple(rest[i : i + width]))
        for n, i in enumerate(range(0, len(rest), width))
    ]
    return {MAIN: Columns(KEYS, tuple(parts))}


def arms_frame(predicted: pd.DataFrame) -> pd.DataFrame:
    """The per-arm rows, named for reading, in grid, configuration, f, schedule order."""
    frame = predicted.assign(configuration=[configuration(r) for r in predicted.to_dict("records")])
    frame = frame.rename(
        columns={
            "measured_us": "measured us",
            "predicted_us_hold": "predicted us (hold)",
            "predicted_us_no_hold": "predicted us (no hold)",
            "error_hold": "error (hold)",
            "error_no_hold": "error (no hold)",
        }
    )
    frame = frame.sort_values(
        ["grid", "path", "configuration", "f", "schedule", "lead_rows"], kind="stable"
    )
    first = [*KEYS, *PREDICTION]
    return frame[[*first, *(c for c in frame.columns if c not in first)]].reset_index(drop=True)


def lead_rule_sections(dataset_dir: Path, replayed: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The rule replayed on the lead map's swept leads (by play_megamoe), per point and
    scored, beside the map's own auto arm (as measured: the rule of the run that made it)."""
    if replayed.empty:
        return []
    _, leads = megamoe_lead.lead_sweep(dataset_dir)
    leads_metric = megamoe_lead.lead_metric(leads)
    constants = megamoe_lead.constant_leads(leads, leads_metric)
    scores = [
        {
            "lead": "rule replayed on the swept leads",
            **megamoe_lead.auto_score(
                replayed["replayed_speedup"], replayed["best_speedup"], constants
            ),
        }
    ]
    best = megamoe_lead.best_and_auto(leads, leads_metric)
    if "auto_speedup" in best.columns:
        scores.append(
            {
                "lead": "auto as measured",
                **megamoe_lead.auto_score(best["auto_speedup"], best["best_speedup"], constants),
            }
        )
    per_point = replayed.assign(
        configuration=[configuration(r) for r in replayed.to_dict("records")]
    ).rename(columns={"remote_fraction": "f"})
    per_point = per_point[
        ["path", "configuration", "f", "replayed_lead", "replayed_speedup", "best_lead"]
        + ["best_speedup"]
    ]
    return [
        (
            f"The lead rule on the lead map ({leads_metric.name} speedups): within "
            f"{megamoe_lead.WITHIN_BEST:.0%} of the best swept lead, and against the best "
            "constant lead",
            pd.DataFrame(scores),
        ),
        ("The lead rule replayed per point (candidates: the swept leads)", per_point),
    ]


def summary_note(summary: pd.DataFrame) -> str:
    every = summary[summary["arms"] == "every arm"].iloc[0]
    apart = summary[summary["arms"] == mp.CALIBRATION].iloc[0]
    return (
        f"{int(every['n'])} arms predicted: median |error| {every['median |error| hold']:.1%}, "
        f"p90 {every['p90 |error| hold']:.1%} with the hold; "
        f"{every['median |error| no_hold']:.1%} and {every['p90 |error| no_hold']:.1%} "
        f"without; {int(apart['n'])} calibration arms apart (their own scale; median "
        f"|error| {apart['median |error| hold']:.1%})."
    )


def _at_most(ceiling: float) -> str:
    return f", at most {ceiling:.4g}" if math.isfinite(ceiling) else ""


def _lag(far: mp.PathParams, fitted: dict | None) -> str:
    """The drain's lag as played, or as fitted and not played (lead.PLAYS_DRAIN_LAG)."""
    if far.lag_fraction:
        return (
            f", the drain {far.lag_fraction:.3g} Q(K) behind R once busy, at "
            f"{far.lag_rate_ratio:.3g} R until then"
        )
    if fitted and fitted["fraction"] and fitted["rate_ratio"] < 1:
        return (
            f", a drain lag fitted ({fitted['fraction']:.3g} Q(K) at "
            f"{fitted['rate_ratio']:.3g} R) but not played"
        )
    return ""


def build(dataset_dir: Path) -> Table:
    played = mp.read_playback(dataset_dir)  # read and its sources hashed once
    doc, metric, predicted = mp.predictions(dataset_dir, played)
    summary = mp.error_summary(predicted)
    paths = megamoe.ordered_paths(predicted["path"])
    first = played["paths"][paths[0]]
    fits = "; ".join(
        f"{path}: R {far.drain / 1e3:.4g} GB/s, t0_fixed {far.t0_fixed_us:.3g} us, issue "
        f"{far.issue_rate / 1e3:.4g} GB/s per program, Q(K) = {far.capacity:.4g} + K "
        f"{far.capacity_per_issuer:.4g} bytes{_at_most(far.capacity_ceiling)}"
        f"{_lag(far, played['paths'][path].get('drain_lag_fitted'))}"
        for path, far in mp.far_paths(played).items()
    )
    counts = predicted["calibration"].value_counts()
    notes = [
        summary_note(summary),
        f"measured: the median {metric.label} ({metric.sample}); predicted: the arm's own "
        "tile list (megamoe/playback.py) through the path's fitted drain from "
        f"{layout.MODEL_JSON} ({fits}), {first['num_programs']} programs; error = predicted / "
        "measured - 1; played once per dataset by the rule play_megamoe into "
        f"{layout.MEGAMOE_PLAYBACK} (a prediction, computed on the CPU).",
        "hold: a program that stored waits at its next tile claim until its own stores "
        "drained (first in, first out at R); no hold: it moves on once they are issued.",
        f"tile costs: FLOPs at X = {first['tflops']:g} TFLOP/s, scaled per configuration and "
        "schedule so that its calibration arm (its smallest measured share, the same lead "
        "first) plays in its measured time ('"
        + mp.CONTROL
        + "': exact, nothing crosses the path there; '"
        + mp.SHARE
        + "': no f = 0 control measured; '"
        + mp.FLOPS
        + "': one share only, uncalibrated). Arms by calibration: "
        + ", ".join(f"{k} {int(v)}" for k, v in counts.items())
        + ".",
    ]
    sections = [("Error summary: |predicted / measured - 1|", summary)]
    sections += lead_rule_sections(dataset_dir, pd.DataFrame(played["lead_rule"]))
    frame = arms_frame(predicted)
    return Table(
        frame,
        f"MegaMoE kernel time predicted by the Burst-Gap playback, {megamoe.paths_text(paths)}",
        labels.doc_label(dataset_dir, doc),
        notes,
        sections,
        markdown_columns(frame),
    )
