"""tab-megamoe-lead: the real kernel's lead map (issue 25, items 3 and 7). Per
configuration and share f: the interleaved-over-expert-wave speedup for every swept
Linear-1 lead, the best swept lead with its CI, the model's `auto` lead (the rows it
resolved to) with its CI, how far auto's speedup is from the best's, and whether the two
leads' interleaved times are told apart (a verdict at 95%). Then a summary per path and f,
and every lead's ratios in both metrics with CIs and verdicts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from xstage_bench.data import stats
from xstage_bench.data.stats import NOISY_HALF_WIDTH
from xstage_bench.report.analysis import frames, labels, megamoe, megamoe_lead
from xstage_bench.report.tables.common import MAIN, MAX_COLUMNS, Columns, Table
from xstage_bench.report.tables.megamoe import add_speedup_columns


def configuration(row: dict) -> str:
    """The configuration's name without its share (a column of its own)."""
    return megamoe.megamoe_config_name({k: v for k, v in row.items() if k != "remote_fraction"})


def lead_columns(leads: pd.DataFrame, metric: megamoe.Metric) -> pd.DataFrame:
    """Per configuration and f, one speedup column per lead ('speedup lead=256')."""
    keys = megamoe_lead.config_keys(leads)
    wide = leads.pivot_table(
        index=keys, columns="lead", values=metric.column("speedup"), aggfunc="first", sort=False
    )
    order = list(dict.fromkeys(leads["lead"]))
    wide = wide.reindex(columns=order)
    wide.columns = [f"speedup lead={lead}" for lead in wide.columns]
    return wide.reset_index()


def summary_per_share(best: pd.DataFrame) -> pd.DataFrame:
    """Per path and f: how many configurations, which swept lead is best how often, and
    how far auto is from the best (median and worst of auto/best, verdict counts)."""
    rows = []
    for (path, fraction), part in best.groupby(["path", "remote_fraction"], sort=True):
        row = {"path": path, "f": fraction, "configurations": len(part)}
        if "best_lead" in part.columns:
            counts = part["best_lead"].dropna().astype(int).value_counts()
            row["best swept lead (times best)"] = ", ".join(
                f"{lead} ({n})" for lead, n in counts.sort_index().items()
            )
        if "auto_over_best" in part.columns:
            ratio = part["auto_over_best"].dropna()
            if len(ratio):
                row.update(
                    {
                        "auto/best speedup median": float(ratio.median()),
                        "auto/best speedup min": float(ratio.min()),
                    }
                )
            verdicts = part["auto_vs_best"].value_counts()
            for verdict in megamoe_lead.AUTO_VERDICT.values():
                row[verdict] = int(verdicts.get(verdict, 0))
        rows.append(row)
    return pd.DataFrame(rows)


def per_lead(leads: pd.DataFrame) -> pd.DataFrame:
    """Every (configuration, f, lead): its ratios in each metric with CI, verdict and
    noisy flag; pairing and throttling."""
    frame = pd.DataFrame(
        {
            "path": leads["path"],
            "configuration": [configuration(r) for r in leads.to_dict("records")],
            "f": leads["remote_fraction"],
            "lead": leads["lead"],
            "lead rows": leads["lead_rows"],
        }
    )
    add_speedup_columns(frame, leads)
    frame["paired"] = leads["paired"]
    frame["throttled"] = leads["throttled"]
    return frame


def build(dataset_dir: Path) -> Table:
    doc, leads = megamoe_lead.lead_sweep(dataset_dir)
    metric = megamoe_lead.lead_metric(leads)
    keys = megamoe_lead.config_keys(leads)
    best = megamoe_lead.best_and_auto(leads, metric)
    frame = lead_columns(leads, metric).merge(best, on=keys, how="left")
    frame.insert(0, "configuration", [configuration(r) for r in frame.to_dict("records")])
    frame = frame.rename(columns={"remote_fraction": "f"})
    frame = frame.drop(columns=[k for k in keys if k not in ("path", "remote_fraction")])
    first = ["path", "configuration", "f"]
    frame = frame[[*first, *(c for c in frame.columns if c not in first)]]
    paths = megamoe.ordered_paths(leads["path"])
    swept = sorted({int(x) for x in leads.loc[leads["swept"] & ~leads["auto"], "lead"]})
    noisy = int(leads[metric.column("noisy")].sum())
    notes = [
        f"speedup = expert-wave {metric.name} / interleaved {metric.name} (medians) of our "
        f"kernel, '{metric.label}' = {metric.sample}: the lead changes the kernel alone"
        + (
            ""
            if metric is megamoe.KERNEL
            else " (these records have no kernel time; the layer time adds the same barrier "
            "and reduction to both)"
        )
        + "; both metrics per lead in the last section.",
        "paths: "
        + "; ".join(megamoe.path_title(p) for p in paths)
        + "; f: "
        + "; ".join(f"{p}: {megamoe.share_word(p)}" for p in paths)
        + " (0: the local control).",
        f"lead = the interleaved schedule's lead_rows (Linear-1 rows run ahead of Linear-2); "
        f"swept: {', '.join(str(x) for x in swept)}; auto: the model's choice as the run "
        "resolved it (its rows in auto_lead_rows; the rule of the code that ran: today the "
        "candidate lead whose tile list plays fastest through the path's fitted drain, "
        "megamoe/ours/lead.py); a lead column not swept is the main grid's interleaved arm.",
        "best_lead: the swept numeric lead with the largest speedup (a point estimate: its "
        "CI beside it); auto_over_best: auto's speedup / the best's; auto_time_over_best: "
        "auto's interleaved time / the best lead's, 95% bootstrap CI (paired where the arms "
        "ran in the same rounds), verdict 'best swept lead faster', 'auto faster' or 'tie'.",
        f"{noisy} of {len(leads)} (configuration, f, lead) ratio(s) noisy (CI beyond "
        f"+-{NOISY_HALF_WIDTH:.0%}); {int(leads['throttled'].sum())} with a record flagged "
        f"throttled; {int((~leads['paired']).sum())} unpaired.",
        frames.failure_note(frames.records_frame(doc), "left out"),
    ]
    wins = leads[metric.column("verdict")].value_counts()
    notes.append(
        "per lead, interleaved faster / slower / tie: "
        f"{int(wins.get(stats.FASTER, 0))} / {int(wins.get(stats.SLOWER, 0))} / "
        f"{int(wins.get(stats.TIE, 0))}"
    )
    sections = [
        ("Per path and f: the best swept lead and the model's auto", summary_per_share(best)),
    ]
    constants = megamoe_lead.constant_leads(leads, metric)
    if "auto_speedup" in best.columns and len(constants):
        score = megamoe_lead.auto_score(best["auto_speedup"], best["best_speedup"], constants)
        sections.append(
            (
                f"auto against the best swept lead (within {megamoe_lead.WITHIN_BEST:.0%}) "
                "and the best constant lead (mean speedup over the points every swept lead ran)",
                pd.DataFrame([score]),
            )
        )
    sections.append((PER_LEAD, per_lead(leads)))
    return Table(
        frame,
        f"MegaMoE lead map: interleaved vs expert-wave speedup by share f and lead "
        f"({metric.name}), {megamoe.paths_text(paths)}",
        labels.doc_label(dataset_dir, doc),
        notes,
        sections,
        markdown_columns(frame),
    )


Part = tuple[str, tuple[str, ...]]  # a Markdown part: its title, its columns


def _speedup_parts(frame: pd.DataFrame, keys: int, best: tuple[str, ...]) -> list[Part]:
    """The speedup per lead, then the best lead, in one part where they fit a screen and in
    parts of the most leads that fit where they do not (issue 52's lead map has nine)."""
    speedups = tuple(c for c in frame.columns if c.startswith("speedup lead="))
    width = MAX_COLUMNS - keys
    if len(speedups) + len(best) <= width:
        return [("speedup per lead", speedups + best)]
    chunks = [speedups[i : i + width] for i in range(0, len(speedups), width)] + [best]
    return [(f"speedup per lead ({n + 1} of {len(chunks)})", c) for n, c in enumerate(chunks)]


PER_LEAD = "Per lead: both metrics with CIs and verdicts"
LEAD_STATS = ("speedup", "verdict", "noisy")  # per metric, in the per-lead section


def markdown_columns(frame: pd.DataFrame) -> dict[str, Columns]:
    """How the Markdown copy splits the wide frames (the CSV keeps every column): the
    speedup per lead apart from the model's auto lead; each metric per lead apart."""
    per_lead = [
        (metric.name, ("lead rows",) + tuple(f"{metric.name} {what}" for what in LEAD_STATS))
        for metric in megamoe.METRICS
    ]
    keys = ("path", "configuration", "f")
    best = ("best_lead", "best_speedup")
    auto = ("auto_lead_rows", "auto_speedup", "best_speedup", "auto_over_best")
    auto += ("auto_time_over_best", "auto_vs_best")
    return {
        MAIN: Columns(
            keys, (*_speedup_parts(frame, len(keys), best), ("the model's auto lead", auto))
        ),
        PER_LEAD: Columns(
            ("path", "configuration", "f", "lead"),
            tuple((name, (*columns, "paired", "throttled")) for name, columns in per_lead),
        ),
    }
