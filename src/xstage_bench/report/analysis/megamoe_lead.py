"""The real kernel's lead map: interleaved-over-expert-wave speedup per configuration,
share f and Linear-1 lead, and how far the model's `auto` lead is from the best swept one.

The sweep (megamoe/*) adds to the main grid extra interleaved arms of some configurations,
one per swept lead (`lead_sweep: true`, id `<config id>/interleaved/lead=<n|auto>`),
timed in the same rounds as the configuration's expert waves where the run pairs them.
Every arm is compared with the configuration's expert-wave record of the main grid; the
main grid's own interleaved record is one more arm, unless a swept arm asks for the same
lead.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from xstage_bench.data import layout, stats
from xstage_bench.megamoe.schedule import INTERLEAVED, WAVE
from xstage_bench.report import paper
from xstage_bench.report.analysis import megamoe
from xstage_bench.report.analysis.load import NoDataError, raw_doc
from xstage_bench.report.analysis.speedup_ci import RatioSamples

AUTO = "auto"
# How the model's lead compares with the best swept one (ratio of their interleaved
# times, auto over best, with its CI): stats' verdicts read for the two leads.
AUTO_VERDICT = {
    stats.FASTER: "best swept lead faster",
    stats.SLOWER: "auto faster",
    stats.TIE: "tie",
}


def lead_label(point: dict) -> str:
    """'auto' for the model's lead, else the rows asked for ('256')."""
    requested = point.get("lead_rows_requested", point.get("lead_rows"))
    if requested == AUTO:
        return AUTO
    return "default" if requested is None else str(int(requested))


def has_lead_sweep(doc: dict) -> bool:
    """Whether the sweep holds lead-sweep arms (whatever became of them)."""
    return any(r["point"].get("lead_sweep") for r in doc["records"])


def lead_speedups(doc: dict) -> pd.DataFrame:
    """One row per (configuration, lead) of every configuration with lead-sweep arms:
    its configuration columns, `lead` (label), `lead_rows` (resolved), `auto`, and
    megamoe.ratio_columns of expert waves over that arm (both metrics where recorded).
    Empty when the sweep has no ok lead-sweep arm with an ok expert-wave record."""
    waves: dict[tuple, dict] = {}
    arms: dict[tuple, dict[str, dict]] = {}
    main: dict[tuple, dict] = {}
    fields: dict[tuple, dict] = {}
    for record in doc["records"]:
        point = record["point"]
        if record["status"] != "ok" or not megamoe.is_ours(point):
            continue
        key = megamoe.megamoe_config_key(point)
        fields.setdefault(key, megamoe.config_fields(point))
        if point.get("lead_sweep") and point.get("schedule") == INTERLEAVED:
            arms.setdefault(key, {})[lead_label(point)] = record
        elif point.get("schedule") == WAVE:
            waves[key] = record
        elif point.get("schedule") == INTERLEAVED:
            main[key] = record
    rows = []
    for key, swept in arms.items():
        if key not in waves:
            continue
        every = dict(swept)
        if key in main:
            every.setdefault(lead_label(main[key]["point"]), main[key])
        for lead, arm in every.items():
            resolved = arm["point"].get("lead_rows")
            rows.append(
                {
                    **fields[key],
                    "lead": lead,
                    "lead_rows": np.nan if resolved is None else int(resolved),
                    "auto": lead == AUTO,
                    "swept": lead in swept,
                    "wave_id": waves[key]["id"],
                    "interleaved_id": arm["id"],
                    "rounds_with": tuple(
                        ((arm.get("extra") or {}).get("paired") or {}).get("arms", ())
                    ),
                    **megamoe.ratio_columns(waves[key], arm),
                }
            )
    if not rows:
        return pd.DataFrame(columns=[*megamoe.MEGAMOE_CONFIG_COLUMNS, "lead", "speedup"])
    frame = pd.DataFrame(rows)
    frame["_order"] = [np.inf if lead == AUTO else _number(lead) for lead in frame["lead"]]
    keys = [c for c in megamoe.MEGAMOE_CONFIG_COLUMNS if c in frame.columns]
    frame = frame.sort_values([*keys, "_order"], kind="stable", ignore_index=True)
    return frame.drop(columns="_order")


def _number(lead: str) -> float:
    return float(lead) if lead.isdigit() else np.inf


def lead_metric(leads: pd.DataFrame) -> megamoe.Metric:
    """The metric the lead map is read in: kernel time where every arm has it (the lead
    changes the kernel alone; the barrier and reduction only dilute the ratio), else the
    layer time."""
    kernel = megamoe.KERNEL.column("speedup")
    if kernel in leads.columns and leads[kernel].notna().all():
        return megamoe.KERNEL
    return megamoe.LAYER


def config_keys(leads: pd.DataFrame) -> list[str]:
    return [c for c in megamoe.MEGAMOE_CONFIG_COLUMNS if c in leads.columns]


def best_and_auto(leads: pd.DataFrame, metric: megamoe.Metric) -> pd.DataFrame:
    """Per configuration (and f): the best swept numeric lead and its speedup with CI,
    the model's auto lead (its resolved rows) and its speedup with CI, auto's speedup over
    the best's, and the verdict of auto's interleaved time against the best's
    (stats.ratio_ci, paired where both arms were timed in the same rounds). The main
    grid's interleaved arm is a column of the map but no swept lead: a sweep that tried
    only lead 0 has its best swept lead at 0, not at the main grid's lead."""
    speedup = metric.column("speedup")
    rows = []
    for _, part in leads.groupby(config_keys(leads), sort=False, dropna=False):
        numeric = part[part["swept"] & ~part["auto"] & part["lead"].str.isdigit()]
        auto = part[part["auto"]]
        row = {k: part.iloc[0][k] for k in config_keys(leads)}
        best = numeric.loc[numeric[speedup].idxmax()] if len(numeric) else None
        if best is not None:
            row.update(
                best_lead=int(best["lead"]),
                best_speedup=best[speedup],
                best_ci_low=best[metric.column("speedup_ci_low")],
                best_ci_high=best[metric.column("speedup_ci_high")],
            )
        if len(auto):
            a = auto.iloc[0]
            row.update(
                auto_lead_rows=a["lead_rows"],
                auto_speedup=a[speedup],
                auto_ci_low=a[metric.column("speedup_ci_low")],
                auto_ci_high=a[metric.column("speedup_ci_high")],
            )
        if best is not None and len(auto):
            a = auto.iloc[0]
            row["auto_over_best"] = a[speedup] / best[speedup]
            row.update(_auto_vs_best(a, best, metric))
        rows.append(row)
    return pd.DataFrame(rows)


def _auto_vs_best(auto: pd.Series, best: pd.Series, metric: megamoe.Metric) -> dict:
    """auto's interleaved time over the best lead's, with CI and verdict."""
    a, b = auto[metric.column("samples")], best[metric.column("samples")]
    paired = (
        best["interleaved_id"] in auto["rounds_with"]
        and auto["interleaved_id"] in best["rounds_with"]
    )
    found = RatioSamples.of(a.denominator, b.denominator, paired).ci()
    return {
        "auto_time_over_best": found["ratio"],
        "auto_time_over_best_ci_low": found["ci_low"],
        "auto_time_over_best_ci_high": found["ci_high"],
        "auto_vs_best": AUTO_VERDICT[found["verdict"]],
    }


def lead_sweep(dataset_dir: Path) -> tuple[dict, pd.DataFrame]:
    """The dataset's MegaMoE document and its lead map (megamoe_lead.lead_speedups);
    NoDataError when the sweep has no ok lead-sweep arm beside an ok expert-wave record."""
    doc = raw_doc(dataset_dir, layout.MEGAMOE_RAW)
    leads = lead_speedups(doc)
    if leads.empty:
        found = "lead-sweep records but no usable" if has_lead_sweep(doc) else "no"
        raise NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_RAW} has {found} lead-sweep "
            "arm (lead_sweep: true) with an ok expert-wave record of its configuration"
        )
    return doc, leads


WITHIN_BEST = paper.LEAD_WITHIN_BEST  # a lead "lands on the best" within this of the best's


def constant_leads(leads: pd.DataFrame, metric: megamoe.Metric) -> pd.Series:
    """Each swept numeric lead's mean speedup over the points where every one of them was
    measured: how each would do as one constant lead for the whole map."""
    numeric = leads[leads["swept"] & ~leads["auto"] & leads["lead"].str.isdigit()]
    if numeric.empty:
        return pd.Series(dtype=float)
    wide = numeric.pivot_table(
        index=config_keys(leads), columns="lead", values=metric.column("speedup"), aggfunc="first"
    ).dropna()
    means = wide.mean()
    means.index = means.index.astype(int)
    return means.sort_index()


def auto_score(picked: pd.Series, best: pd.Series, constants: pd.Series) -> dict:
    """How a lead rule did over a map (per point: `picked`, its speedup; `best`, the best
    swept lead's): the points where it lands within WITHIN_BEST of the best, and its mean
    speedup against the best single constant lead's (constant_leads)."""
    ok = picked.notna() & best.notna()
    within = picked[ok] >= (1 - WITHIN_BEST) * best[ok]
    row = {
        "points": int(ok.sum()),
        f"within {WITHIN_BEST:.0%} of best": int(within.sum()),
        "mean speedup": float(picked[ok].mean()) if ok.any() else np.nan,
    }
    if len(constants):
        row["best constant lead"] = int(constants.idxmax())
        row["its mean speedup"] = float(constants.max())
        row["mean / best constant's"] = row["mean speedup"] / float(constants.max())
    return row
