"""tab-megamoe: the interleaved-over-expert-wave speedup per store path, in both metrics
(layer time and kernel time), overall and per group, beside the paper's 84-configuration
summary: every headline with a CI over configurations and samples, every extreme with its
own configuration's CI, win/loss/tie counts, noisy and throttled points counted (and the
headline without the throttled ones where there are any). Where the data has a registered
schedule beyond the two compared, overall rows of its speedup over expert waves and of our
interleaved over it, the same statistics. Then the whole layer's time over the kernel's
(interleaved) per path, tokens per rank and precision; every configuration's ratios with
CIs and verdicts (and the other schedules' ratios over expert waves too). Where the
dataset holds the baselines, our best schedule against the unfused torch pipeline,
DeepGEMM's SM90 MegaMoE and (where measured) FlashInfer's SM90 FP8 MegaMoE (summary per
group), and the same per configuration."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pandas as pd

from xstage_bench.data import grid, stats, storepath
from xstage_bench.data.grid import side_arm
from xstage_bench.data.stats import NOISY_HALF_WIDTH
from xstage_bench.megamoe import schedule
from xstage_bench.report import paper
from xstage_bench.report.analysis import frames, labels, megamoe, megamoe_baselines, runs
from xstage_bench.report.analysis.speedup_ci import headline_ci
from xstage_bench.report.tables import megamoe_host, megamoe_oracle
from xstage_bench.report.tables.common import MAIN, Columns, Table

PAPER = {
    "paper_geomean": paper.MEGAMOE_GEOMEAN,
    "paper_median": paper.MEGAMOE_MEDIAN,
    "paper_min": paper.MEGAMOE_MIN,
    "paper_max": paper.MEGAMOE_MAX,
}
THROTTLED_LEFT_OUT = "overall, throttled points left out"
# Registered schedules beyond the compared pair: their per-configuration ratios, if measured.
OTHER_SCHEDULES = tuple(name for name in schedule.SCHEDULES if name not in schedule.COMPARED)
# Issue 29: the project's targets for the whole layer's time over the kernel's, per tokens
# per rank (the barrier and the top-k reduction should cost little beside the kernel).
LAYER_OVER_KERNEL_TARGETS = {1024: 1.15, 16384: 1.05}
LAYER_OVER_KERNEL = "layer / kernel time"  # how the section's ratio columns begin


def speedup_stats(speedup: pd.Series) -> dict:
    """Geomean, median, min and max of ratios without CIs (the baselines' sections)."""
    return {
        "n": len(speedup),
        "geomean": stats.geomean(speedup),
        "median": float(speedup.median()),
        "min": float(speedup.min()),
        "max": float(speedup.max()),
    }


def speedup_summary(configs: pd.DataFrame, metric: megamoe.Metric) -> dict:
    """One metric's speedup over `configs`: geomean and median with their two-level
    bootstrap CIs (speedup_ci.headline_ci), min and max each with its own configuration's
    CI and noisy flag, wins (interleaved faster: CI above 1), losses, ties, and how many
    configurations are noisy and how many throttled."""
    column = metric.column("speedup")
    configs = configs[configs[column].notna()]
    points = list(configs[metric.column("samples")])
    row: dict = {"n": len(configs)}
    for stat in ("geomean", "median"):
        value, low, high = headline_ci(points, stat)
        row.update({stat: value, f"{stat}_ci_low": low, f"{stat}_ci_high": high})
    for stat, at in (("min", configs[column].idxmin()), ("max", configs[column].idxmax())):
        extreme = configs.loc[at]
        row.update(
            {
                stat: extreme[column],
                f"{stat}_ci_low": extreme[metric.column("speedup_ci_low")],
                f"{stat}_ci_high": extreme[metric.column("speedup_ci_high")],
                f"{stat}_noisy": bool(extreme[metric.column("noisy")]),
            }
        )
    verdicts = configs[metric.column("verdict")]
    row.update(
        wins=int((verdicts == stats.FASTER).sum()),
        losses=int((verdicts == stats.SLOWER).sum()),
        ties=int((verdicts == stats.TIE).sum()),
        noisy=int(configs[metric.column("noisy")].sum()),
        throttled=int(configs["throttled"].sum()),
    )
    return row


def headline_rows(speedups: pd.DataFrame) -> list[dict]:
    """Per path and metric, the overall rows (megamoe.headline_sets: natural routing, or
    one per host share), each again without its throttled configurations where it has
    any; the paper's columns beside every overall row but the local control's."""
    rows = []
    for path, what, configs in megamoe.headline_sets(speedups):
        control = set(configs["remote_fraction"]) == {"0"}
        for metric in megamoe.metrics_of(configs):
            head = {"path": path, "metric": metric.label, "value": what}
            paper_columns = {} if control else PAPER
            rows.append(
                {**head, "group": "overall", **speedup_summary(configs, metric), **paper_columns}
            )
            cool = configs[~configs["throttled"]]
            if len(cool) < len(configs) and len(cool):
                rows.append(
                    {
                        **head,
                        "group": THROTTLED_LEFT_OUT,
                        **speedup_summary(cool, metric),
                        **paper_columns,
                    }
                )
    return rows


class ScheduleRatios(NamedTuple):
    """One schedule beyond the compared pair against each of them, a row per configuration
    of the speedups frame (empty where it lacks that schedule; megamoe.ratio_columns)."""

    over_waves: pd.DataFrame  # expert-wave time / its time: its speedup over expert waves
    head_to_head: pd.DataFrame  # its time / our interleaved time: interleaved's over it


def over_group(faster: str, baseline: str) -> str:
    """The group of an overall row of schedule `faster`'s speedup over `baseline` (the
    baseline's time over its): 'overall, DeepGEMM interleaved over expert waves'."""
    return f"overall, {schedule.SCHEDULES[faster].label} over {schedule.SCHEDULES[baseline].label}"


def other_schedule_rows(speedups: pd.DataFrame, others: dict[str, ScheduleRatios]) -> list[dict]:
    """Per headline set of `speedups` (the "overall" rows' path and share), metric and
    schedule of `others` (other_schedule_ratios): the summary of its speedup over expert
    waves, then of our interleaved over it, over the set's configurations that have it."""
    rows = []
    for path, what, configs in megamoe.headline_sets(speedups):
        for name, ratios in others.items():
            pairs = (
                (over_group(name, schedule.WAVE), ratios.over_waves.loc[configs.index]),
                (over_group(schedule.INTERLEAVED, name), ratios.head_to_head.loc[configs.index]),
            )
            both = megamoe.metrics_of(pairs[1][1])
            for metric in (m for m in megamoe.metrics_of(pairs[0][1]) if m in both):
                for group, part in pairs:
                    head = {"path": path, "metric": metric.label, "group": group, "value": what}
                    rows.append({**head, **speedup_summary(part, metric)})
    return rows


def oracle_rows(pairs: pd.DataFrame) -> pd.DataFrame:
    """Per path, share, schedule and metric: the device-decided arms' speedup over their
    oracle arms (megamoe_oracle.oracle_pairs), summarised as every speedup here."""
    rows = []
    for (path, share, name), part in pairs.groupby(
        ["path", "remote_fraction", "schedule"], sort=True
    ):
        for metric in megamoe.metrics_of(part):
            head = {"path": path, "share": share, "schedule": name, "metric": metric.label}
            rows.append({**head, **speedup_summary(part, metric)})
    return pd.DataFrame(rows)


def group_rows(speedups: pd.DataFrame) -> list[dict]:
    """Per path, metric and group (shape, precision, routing, f): the same summary."""
    rows = []
    for path in megamoe.ordered_paths(speedups["path"]):
        part = speedups[speedups["path"] == path]
        for metric in megamoe.metrics_of(part):
            for group in megamoe.MEGAMOE_GROUPS:
                if group not in part.columns:
                    continue
                for value, configs in part.groupby(group, sort=True):
                    if configs[metric.column("speedup")].notna().any():
                        head = {"path": path, "metric": metric.label, "group": group}
                        rows.append({**head, "value": value, **speedup_summary(configs, metric)})
    return rows


# Each metric's columns in a per-row table, and the speedup-frame column each one shows.
SPEEDUP_COLUMNS = {
    "speedup": "speedup",
    "CI low": "speedup_ci_low",
    "CI high": "speedup_ci_high",
    "verdict": "verdict",
    "noisy": "noisy",
}


def add_speedup_columns(frame: pd.DataFrame, speedups: pd.DataFrame) -> None:
    """Per metric of `speedups`: its ratio, CI, verdict and noisy flag as columns of `frame`
    (one row per row of `speedups`)."""
    for metric in megamoe.metrics_of(speedups):
        for shown, column in SPEEDUP_COLUMNS.items():
            frame[f"{metric.name} {shown}"] = speedups[metric.column(column)]


def other_schedule_ratios(doc: dict, speedups: pd.DataFrame) -> dict[str, ScheduleRatios]:
    """Per schedule of OTHER_SCHEDULES with an ok record of our kernel's main grid: its
    ScheduleRatios over the configurations of `speedups`, each ratio paired where its two
    records were timed in the same rounds (the arms of a configuration are)."""
    found: dict[str, dict[tuple, dict]] = {}
    for record in doc["records"]:
        point = record["point"]
        if (
            point.get("schedule") in OTHER_SCHEDULES
            and megamoe.is_ours(point)
            and not side_arm(point)
            and record["status"] == "ok"
            and (record.get("samples") or {}).get(megamoe.LAYER.sample)
        ):
            found.setdefault(point["schedule"], {})[megamoe.megamoe_config_key(point)] = record
    by_id = {r["id"]: r for r in doc["records"]}
    others = {}
    for name, by_config in found.items():
        over_waves, head_to_head = [], []
        for wave_id, interleaved_id in zip(
            speedups["wave_id"], speedups["interleaved_id"], strict=True
        ):
            wave = by_id[wave_id]
            other = by_config.get(megamoe.megamoe_config_key(wave["point"]))
            if other is None:
                over_waves.append({})
                head_to_head.append({})
                continue
            over_waves.append(megamoe.ratio_columns(wave, other))
            head_to_head.append(megamoe.ratio_columns(other, by_id[interleaved_id]))
        others[name] = ScheduleRatios(
            pd.DataFrame(over_waves, index=speedups.index),
            pd.DataFrame(head_to_head, index=speedups.index),
        )
    return others


def layer_over_kernel(speedups: pd.DataFrame) -> pd.DataFrame:
    """Per path, tokens per rank and precision (first all precisions together): over the
    configurations, the median and the maximum (and where) of the interleaved arm's
    median layer time over its median kernel time, the median of their difference (us),
    and, at the tokens per rank with a target (LAYER_OVER_KERNEL_TARGETS), whether the
    median meets it and how many configurations are above it. Empty without kernel times."""
    layer = megamoe.LAYER.column("interleaved_us")
    kernel = megamoe.KERNEL.column("interleaved_us")
    if kernel not in speedups.columns:
        return pd.DataFrame()
    measured = speedups[speedups[kernel].notna()]
    ratio = measured[layer] / measured[kernel]
    names = pd.Series(
        [megamoe.megamoe_config_name(r) for r in measured.to_dict("records")], index=measured.index
    )
    rows = []
    for path in megamoe.ordered_paths(measured["path"]):
        on_path = measured[measured["path"] == path]
        for tokens, part in on_path.groupby("tokens_per_rank", sort=True):
            target = LAYER_OVER_KERNEL_TARGETS.get(tokens)
            sets = [("all", part), *part.groupby("precision", sort=True)]
            for precision, configs in sets:
                ratios = ratio.loc[configs.index]
                median = float(ratios.median())
                rows.append(
                    {
                        "path": path,
                        "tokens_per_rank": tokens,
                        "precision": precision,
                        "n": len(configs),
                        f"{LAYER_OVER_KERNEL} median": median,
                        f"{LAYER_OVER_KERNEL} max": float(ratios.max()),
                        "max at": names[ratios.idxmax()],
                        "layer - kernel time us median": float(
                            (configs[layer] - configs[kernel]).median()
                        ),
                        "target": target,
                        "median meets target": None if target is None else median <= target,
                        "above target": None if target is None else int((ratios > target).sum()),
                    }
                )
    return pd.DataFrame(rows)


def per_configuration(speedups: pd.DataFrame, others: dict[str, ScheduleRatios]) -> pd.DataFrame:
    """Every configuration: its ratios in each metric with CI, verdict and noisy flag,
    whether its schedules were paired, and whether a record is flagged throttled; then,
    per schedule in `others` (other_schedule_ratios), its speedups over expert waves the
    same way."""
    frame = pd.DataFrame(
        {
            "path": speedups["path"],
            "configuration": [megamoe.megamoe_config_name(r) for r in speedups.to_dict("records")],
        }
    )
    add_speedup_columns(frame, speedups)
    frame["paired"] = speedups["paired"]
    frame["samples"] = speedups["n"]
    frame["throttled"] = speedups["throttled"]
    for name, ratios in others.items():
        label = schedule.SCHEDULES[name].label
        for metric in megamoe.metrics_of(ratios.over_waves):
            for shown, column in SPEEDUP_COLUMNS.items():
                frame[f"{label} {metric.name} {shown}"] = ratios.over_waves[metric.column(column)]
    return frame


def metric_notes(doc: dict, speedups: pd.DataFrame) -> list[str]:
    """What each metric is, named as in the columns, with the raw config's definition."""
    definitions = (doc.get("config") or {}).get("definitions") or {}
    notes = []
    for metric in megamoe.metrics_of(speedups):
        defined = definitions.get(metric.sample)
        text = f"'{metric.label}' = {metric.sample}" + (f": {defined}" if defined else "")
        notes.append(
            f"{text}; speedup = expert-wave {metric.name} / interleaved {metric.name} (medians)"
        )
    if megamoe_baselines.ours_layer_from(doc) == {grid.HOME_TOKENS}:
        notes.append(
            f"'{megamoe.LAYER.name}' also covers our dispatch and layout on the GPU, from the "
            "FP8 home tokens and top-k ids (megamoe.layer_from 'home_tokens')."
        )
    return notes


def other_schedule_notes(name: str, ratios: ScheduleRatios, configurations: int) -> list[str]:
    """What the rows and columns of one schedule beyond the compared pair are."""
    label = schedule.SCHEDULES[name].label
    ours = schedule.SCHEDULES[schedule.INTERLEAVED].label
    notes = []
    for metric in megamoe.metrics_of(ratios.over_waves):
        n = int(ratios.over_waves[metric.column("speedup")].notna().sum())
        notes.append(
            f"'{label} {metric.name} speedup' (per configuration, {n} of {configurations}) "
            f"= expert-wave {metric.name} / {label} {metric.name} (medians), CI as above."
        )
    head = ratios.head_to_head
    paired = int(head["paired"].sum()) if "paired" in head.columns else 0
    measured = int(head["n"].notna().sum()) if "n" in head.columns else 0
    notes.append(
        f"rows '{over_group(name, schedule.WAVE)}': expert-wave time / {label} time, wins "
        f"where {label} is faster; rows '{over_group(schedule.INTERLEAVED, name)}': {label} "
        f"time / {ours} time, wins where {ours} is faster, paired in {paired} of {measured} "
        "configurations (the arms timed in the same rounds); over the overall rows' "
        "configurations that have it, CIs and counts as above."
    )
    return notes


def layer_over_kernel_note() -> str:
    targets = ", ".join(f"{t:g} at {n} tokens" for n, t in LAYER_OVER_KERNEL_TARGETS.items())
    return (
        f"whole layer over kernel time ({schedule.INTERLEAVED} arm, every configuration of "
        f"the path and tokens per rank, all shares): per configuration median "
        f"{megamoe.LAYER.sample} / median {megamoe.KERNEL.sample}, and median "
        f"{megamoe.LAYER.sample} - median {megamoe.KERNEL.sample} (the barrier and the "
        f"top-k reduction); the median and max over configurations. Targets (issue 29): "
        f"{targets} per rank; 'median meets target': the median at or below it; 'above "
        "target': configurations over it."
    )


def build(dataset_dir: Path) -> Table:
    doc, speedups, incomplete = megamoe.megamoe_sweep(dataset_dir)
    others = other_schedule_ratios(doc, speedups)
    rows = headline_rows(speedups) + other_schedule_rows(speedups, others)
    frame = pd.DataFrame(rows + group_rows(speedups))
    columns = ["path", "metric", "group", "value"]
    frame = frame[[*columns, *(c for c in frame.columns if c not in columns)]]
    paths = megamoe.ordered_paths(speedups["path"])
    notes = [
        "our kernel (variant absent or 'ours'); the lead sweep's extra interleaved arms are "
        "in tab-megamoe-lead, not here.",
        *metric_notes(doc, speedups),
        "headline CIs (geomean, median): 95% bootstrap over configurations and, within each, "
        "its paired rounds (or, unpaired, each schedule's samples on its own); min and max: "
        "that configuration's own ratio CI (stats.ratio_ci). wins / losses / ties: "
        "configurations whose CI lies above 1 (interleaved faster) / below 1 / spans 1; "
        f"noisy: a ratio CI reaching further than +-{NOISY_HALF_WIDTH:.0%} from its value.",
        "paths: " + "; ".join(megamoe.path_title(p) for p in paths) + ".",
    ]
    if storepath.PEER in paths:
        notes.append(
            "peer path: remote_fraction is the share of the combine rows stored into the "
            "other GPU; natural is routing's own ((P-1)/P), a number re-homes rows to carry "
            "that share (0.875: an 8-GPU node's); the overall row is natural routing, the "
            "paper's setting."
        )
    if storepath.HOST in paths:
        notes.append(
            "host path: f is the host share, the share of home tokens whose combine rows "
            "are stored into host memory; f = 0 is the local control (no row leaves the "
            "GPU); one overall row per f."
        )
    throttled = int(speedups["throttled"].sum())
    notes.append(
        f"throttled: {throttled} configuration(s) with a record flagged throttled"
        + (f" (rows '{THROTTLED_LEFT_OUT}' leave them out)" if throttled else "")
    )
    unpaired = int((~speedups["paired"]).sum())
    if unpaired:
        notes.append(
            f"{unpaired} configuration(s) timed unpaired (the schedules measured one after the "
            "other, not in alternating rounds): their CIs resample each schedule on its own."
        )
    notes.append(
        f"paper: {paper.MEGAMOE_CONFIGS} configurations on a {paper.B200}; geomean and max "
        "from the abstract, median and min (summary)."
    )
    notes.append(frames.failure_note(frames.records_frame(doc), "left out"))
    if len(incomplete):
        notes.append(
            f"{len(incomplete)} configuration(s) lack an ok time for both schedules "
            "and are left out"
        )
    for name, ratios in others.items():
        notes += other_schedule_notes(name, ratios, len(speedups))
    sections = []
    columns = {MAIN: SUMMARY_COLUMNS}
    whole = layer_over_kernel(speedups)
    if not whole.empty:
        sections.append((f"Whole layer over kernel time, {schedule.INTERLEAVED}", whole))
        notes.append(layer_over_kernel_note())
    per_config = per_configuration(speedups, others)
    sections.append((PER_CONFIGURATION, per_config))
    columns[PER_CONFIGURATION] = per_configuration_columns(per_config)
    libraries = megamoe_baselines.megamoe_baselines(doc)
    baselines = megamoe.at_baseline_setting(libraries)
    if not baselines.empty:
        flashinfer = megamoe_baselines.has_records(doc, "flashinfer")
        sections += [
            ("Our best schedule against the baselines", baseline_summary(baselines, flashinfer)),
            (BASELINES_PER_CONFIGURATION, baseline_configs(baselines, flashinfer)),
        ]
        columns[BASELINES_PER_CONFIGURATION] = baseline_configs_columns(sections[-1][1])
        notes.append(
            "baselines: ours/unfused and ours/DeepGEMM are time ratios, our best schedule's "
            "median layer time over the baseline's (best schedule's) median time: below 1 ours "
            "is faster. The unfused and DeepGEMM times include their dispatch; "
            + (
                "so does ours (dispatch and layout on the GPU, inside the timed region). "
                if megamoe_baselines.ours_layer_from(doc) == {grid.HOME_TOKENS}
                else "ours does not (dispatch done once, outside the timed region). "
            )
            + "DeepGEMM L2-lag speedup = its wave time / its L2-lag time, where both ran."
        )
        if flashinfer:
            notes.append(flashinfer_note(doc))
    ceiling = megamoe_baselines.kernel_vs_ceiling(doc, libraries)
    if not ceiling.empty:
        sections += [
            ("Our kernel beside the GEMM ceiling", ceiling_summary(ceiling)),
            ("Our kernel beside the GEMM ceiling, per configuration", ceiling_configs(ceiling)),
        ]
        notes.append(
            "ceiling: cuBLAS on the same two GEMMs of one rank (rows = tokens x topk; FP8 "
            "row-wise torch._scaled_mm, or bf16), on GPU 0; kernel TFLOP/s = useful FLOPs over "
            f"the kernel time ({megamoe.KERNEL.sample}, extra {megamoe.KERNEL.tflops}; the "
            f"raw config's '{megamoe.LAYER.tflops}' is over the layer time), the slowest "
            "rank, best schedule; roofline = the larger of the FLOPs at the ceiling and the "
            "rank's weights + activations at the measured HBM copy bandwidth "
            "(megamoe/ceiling.py); roofline / DeepGEMM and / FlashInfer: the same roofline "
            "over their times (dispatch and combine inside). Natural routing."
        )
        notes += precision_runs_note(doc)
    pairs = megamoe_oracle.oracle_pairs(doc)
    if not pairs.empty:
        sections.append((ORACLE_SECTION, oracle_rows(pairs)))
        columns[ORACLE_SECTION] = ORACLE_COLUMNS
        notes.append(megamoe_oracle.oracle_note())
    host = megamoe_host.host_side(doc)
    if not host.empty:
        sections.append(("How each variant's calls were enqueued", host))
        notes.append(megamoe_host.host_side_note())
    return Table(
        frame,
        "MegaMoE interleaved vs expert-wave speedup, " + megamoe.paths_text(paths),
        labels.doc_label(dataset_dir, doc),
        notes,
        sections,
        columns,
    )


# How the Markdown copy splits the wide frames (the CSV keeps every column). A speedup
# summary's columns (speedup_summary), in the two parts both summaries show.
SUMMARY_STATS = ("n", "geomean", "median", "min", "min_noisy", "max", "max_noisy")
SUMMARY_COUNTS = ("counts", ("n", "wins", "losses", "ties", "noisy", "throttled"))
SUMMARY_COLUMNS = Columns(
    ("path", "metric", "group", "value"),
    (
        ("speedup", SUMMARY_STATS),
        SUMMARY_COUNTS,
        ("beside the paper", tuple(c for name in PAPER for c in (name[6:], name))),
    ),
)
PER_CONFIGURATION = "Per configuration: speedups with CIs and verdicts"
ORACLE_SECTION = "The device-decided schedules against the host list (oracle)"
ORACLE_COLUMNS = Columns(
    ("path", "share", "schedule", "metric"),
    (("oracle time over device time", SUMMARY_STATS), SUMMARY_COUNTS),
)
BASELINES_PER_CONFIGURATION = "Our best schedule against the baselines, per configuration"


def per_configuration_columns(frame: pd.DataFrame) -> Columns:
    """Our interleaved over expert waves in one part, each other schedule's in its own."""
    keys = ("path", "configuration")
    others = {schedule.SCHEDULES[name].label for name in OTHER_SCHEDULES}
    theirs = {o: tuple(c for c in frame.columns if c.startswith(o)) for o in sorted(others)}
    ours = tuple(c for c in frame.columns if not any(c in cols for cols in theirs.values()))
    parts = [("interleaved over expert waves", ours)]
    parts += [(f"{other} over expert waves", cols) for other, cols in theirs.items()]
    return Columns(keys, tuple(parts))


def baseline_configs_columns(frame: pd.DataFrame) -> Columns:
    """Each variant's time in one part, the ratios in another."""
    times = tuple(c for c in frame.columns if c.endswith(" us"))
    ratios = tuple(c for c in frame.columns if c != "configuration" and c not in times)
    return Columns(("configuration",), (("times (us)", times), ("ratios", ratios)))


# (name, column, only where this column is known): our speedup is summarized over the
# configurations where DeepGEMM ran both schedules, to sit beside its L2-lag speedup
COMPARISONS = (
    ("ours/unfused, its fastest checked path (time)", "ours_over_unfused", None),
    (
        "ours/unfused FP8 grouped, per-token x per-channel scales (time)",
        "ours_over_unfused_fp8",
        None,
    ),
    ("ours/unfused bf16 grouped (time)", "ours_over_unfused_bf16", None),
    ("ours/DeepGEMM (time)", "ours_over_deepgemm", None),
    ("ours/FlashInfer SM90 FP8 (time)", "ours_over_flashinfer", None),
    ("DeepGEMM L2-lag speedup", "deepgemm_lag_speedup", None),
    ("our interleaved speedup, same configurations", "ours_speedup", "deepgemm_lag_speedup"),
)


def baseline_summary(baselines: pd.DataFrame, flashinfer: bool = False) -> pd.DataFrame:
    """Geomean, median, min, max of each comparison, overall and per precision and shape;
    a comparison with no configuration is one row with n = 0. FlashInfer's row only where
    the sweep measured it."""
    rows = []
    for name, column, where in COMPARISONS:
        if column in megamoe_baselines.UNFUSED_PATH_RATIOS and baselines[column].isna().all():
            continue  # a sweep from before the unfused pipeline timed each path
        if column == "ours_over_flashinfer" and not flashinfer:
            continue
        values = baselines[baselines[column].notna()]
        if where is not None:
            values = values[values[where].notna()]
        if values.empty:
            rows.append({"comparison": name, "group": "overall", "value": "all", "n": 0})
            continue
        head = {"comparison": name, "group": "overall", "value": "all"}
        rows.append({**head, **speedup_stats(values[column])})
        for group in ("precision", "shape"):
            for value, part in values.groupby(group, sort=True):
                head = {"comparison": name, "group": group, "value": value}
                rows.append({**head, **speedup_stats(part[column])})
    return pd.DataFrame(rows)


def baseline_configs(baselines: pd.DataFrame, flashinfer: bool = False) -> pd.DataFrame:
    """One row per configuration: the times (us) and the ratios (FlashInfer's only where
    the sweep measured it)."""
    frame = pd.DataFrame(
        {
            "configuration": [megamoe.megamoe_config_name(r) for r in baselines.to_dict("records")],
            "ours best layer time us": baselines["ours_best_us"],
            "unfused us": baselines["unfused_us"],
            "unfused FP8 grouped us": baselines["unfused_fp8_us"],
            "unfused bf16 grouped us": baselines["unfused_bf16_us"],
            "DeepGEMM wave us": baselines["deepgemm_wave_us"],
            "DeepGEMM L2-lag us": baselines["deepgemm_lag_us"],
            "FlashInfer us": baselines["flashinfer_us"],
            "ours/unfused": baselines["ours_over_unfused"],
            "ours/unfused FP8": baselines["ours_over_unfused_fp8"],
            "ours/unfused bf16": baselines["ours_over_unfused_bf16"],
            "ours/DeepGEMM": baselines["ours_over_deepgemm"],
            "ours/FlashInfer": baselines["ours_over_flashinfer"],
            "our interleaved speedup": baselines["ours_speedup"],
            "DeepGEMM L2-lag speedup": baselines["deepgemm_lag_speedup"],
        }
    )
    # a sweep from before each unfused path was timed has no numbers for them
    paths = ("unfused FP8 grouped us", "unfused bf16 grouped us")
    paths += ("ours/unfused FP8", "ours/unfused bf16")
    empty = [name for name in paths if frame[name].isna().all()]
    if not flashinfer:
        empty += ["FlashInfer us", "ours/FlashInfer"]
    return frame.drop(columns=empty)  # in the configuration keys' order


def flashinfer_note(doc: dict) -> str:
    """What FlashInfer's time is, in the format its records name, and what became of its
    points when none is ok."""
    extras = [
        r.get("extra") or {}
        for r in doc["records"]
        if r["point"].get("variant") == "flashinfer" and r["status"] == "ok"
    ]
    if not extras:
        outcome = megamoe_baselines.variant_outcome(doc, "flashinfer", "FlashInfer")
        return f"FlashInfer SM90 FP8 MegaMoE: no configuration with an ok time ({outcome})."
    first = extras[0]
    return (
        f"ours/FlashInfer: FlashInfer {first.get('flashinfer_version', '')} "
        f"{first.get('flashinfer_backend', '')}, {first.get('format', 'FP8')}; one time per "
        "configuration (its own schedule) of either token routing, at the natural remote "
        "fraction only (its own dispatch places the rows); its time (compute_staged, FP8 "
        "inputs staged beforehand) includes its dispatch and combine; ours includes the "
        "combine (kernel, barrier, top-k reduction)"
        + (
            " and its dispatch and layout on the GPU, from the FP8 home tokens and top-k ids."
            if megamoe_baselines.ours_layer_from(doc) == {grid.HOME_TOKENS}
            else " and leaves the dispatch out."
        )
    )


def ceiling_summary(ceiling: pd.DataFrame) -> pd.DataFrame:
    """Per precision (and W8A8 at the most tokens): how close our kernel comes to cuBLAS on
    the same GEMMs and to the roofline; and W4A8's time over W8A8's, configuration by
    configuration."""
    rows = []
    top = ceiling["tokens_per_rank"].max()
    for label, part in [
        *((p, g) for p, g in ceiling.groupby("precision", sort=True)),
        (
            f"w8a8, {top} tokens",
            ceiling[(ceiling["precision"] == "w8a8") & (ceiling["tokens_per_rank"] == top)],
        ),
    ]:
        if part.empty:
            continue
        rows.append(
            {
                "precision": label,
                "n": len(part),
                "kernel TFLOP/s median": float(part["kernel_tflops"].median()),
                "kernel TFLOP/s max": float(part["kernel_tflops"].max()),
                "ceiling TFLOP/s median": float(part["ceiling_tflops"].median()),
                "fraction of ceiling median": float(part["fraction_of_ceiling"].median()),
                "roofline / kernel time median": float(part["roofline_over_kernel"].median()),
            }
        )
    keys = ["shape", "routing", "tokens_per_rank"]
    w4 = ceiling[ceiling["precision"] == "w4a8"].set_index(keys)["kernel_us"]
    w8 = ceiling[ceiling["precision"] == "w8a8"].set_index(keys)["kernel_us"]
    ratio = (w4 / w8).dropna()
    if len(ratio):
        rows.append(
            {
                "precision": "w4a8 time / w8a8 time",
                "n": len(ratio),
                "geomean": stats.geomean(ratio),
                "max": float(ratio.max()),
            }
        )
    return pd.DataFrame(rows)


def precision_runs_note(doc: dict) -> list[str]:
    """A note when our kernel's W4A8 and W8A8 records came from different runs of the file:
    then 'w4a8 time / w8a8 time' divides times taken apart, not in one run."""
    run_of = runs.run_of(doc)
    timed_in: dict[str, set] = {}
    for record in doc["records"]:
        point = record["point"]
        if record["status"] == "ok" and megamoe.is_ours(point) and not side_arm(point):
            timed_in.setdefault(point["precision"], set()).add(run_of(record))
    w4, w8 = timed_in.get("w4a8", set()), timed_in.get("w8a8", set())
    if not w4 or not w8 or w4 == w8 or None in w4 | w8:
        return []

    def when(indices: set) -> str:
        return ", ".join(runs.started(doc, i) for i in sorted(indices))

    return [
        "w4a8 time / w8a8 time divides times of different runs of this file (our W4A8 "
        f"records from the run(s) started {when(w4)} UTC, W8A8 from {when(w8)}): a ratio "
        "across runs, not timed side by side."
    ]


def ceiling_configs(ceiling: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "configuration": [megamoe.megamoe_config_name(r) for r in ceiling.to_dict("records")],
            "kernel TFLOP/s": ceiling["kernel_tflops"],
            "cuBLAS ceiling TFLOP/s": ceiling["ceiling_tflops"],
            "fraction of ceiling": ceiling["fraction_of_ceiling"],
            "kernel us": ceiling["kernel_us"],
            "roofline us": ceiling["roofline_us"],
            "roofline / kernel": ceiling["roofline_over_kernel"],
            "roofline / DeepGEMM": ceiling["roofline_over_deepgemm"],
            "roofline / FlashInfer": ceiling["roofline_over_flashinfer"],
        }
    )
