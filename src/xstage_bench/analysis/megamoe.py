"""MegaMoE sweeps as frames: configurations, schedule speedups, the baselines beside ours,
the compute-emulated sweep, and where the emulated sweep reaches the paper's load."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from xstage_bench import layout, paper
from xstage_bench.analysis import fitted
from xstage_bench.analysis.frames import is_scalar, records_frame
from xstage_bench.analysis.load import NoDataError, optional_model_doc, raw_doc
from xstage_bench.megamoe.baselines import BASELINES
from xstage_bench.megamoe.routing import LOCAL_CONTROL, fraction_label
from xstage_bench.megamoe.schedule import COMPARED, INTERLEAVED, WAVE

MEGAMOE_CONFIG_COLUMNS = (
    "shape",
    "precision",
    "routing",
    "tokens_per_rank",
    "world_size",
    "remote_fraction",
)
MEGAMOE_GROUPS = ("shape", "precision", "routing", "remote_fraction")


def megamoe_config_key(point: dict) -> tuple:
    """What identifies a MegaMoE configuration: the point without schedule and variant."""
    return tuple(
        sorted((k, str(v)) for k, v in point.items() if k not in ("id", "schedule", "variant"))
    )


def trace_series(point: dict) -> str | None:
    """Which run of a traced configuration a record is: expert_wave, interleaved or
    local_control (written either as the schedule or, beside a schedule, as the variant)."""
    if LOCAL_CONTROL in (point.get("schedule"), point.get("variant")):
        return LOCAL_CONTROL
    return point.get("schedule")


def megamoe_config_name(point: dict) -> str:
    """'glm-5.2, w8a8, skewed, tokens_per_rank=1024, world_size=2'."""
    return ", ".join(
        str(point[k]) if k in MEGAMOE_GROUPS else f"{k}={point[k]}"
        for k in MEGAMOE_CONFIG_COLUMNS
        if k in point
    )


def remote_fraction_labels(df: pd.DataFrame) -> pd.DataFrame:
    """remote_fraction as a label ('natural' where routing chose, else '0.875'), so that a
    sweep over both keeps them apart and natural rows are never dropped as missing."""
    if "remote_fraction" not in df.columns:
        return df
    labels = [
        fraction_label(None if isinstance(v, float) and np.isnan(v) else v)
        for v in df["remote_fraction"]
    ]
    return df.assign(remote_fraction=labels)


def natural_routing(speedups: pd.DataFrame) -> pd.DataFrame:
    """The configurations with routing's own remote fraction (all, where none is set)."""
    if "remote_fraction" not in speedups.columns:
        return speedups
    return speedups[speedups["remote_fraction"] == "natural"]


def megamoe_sweep(dataset_dir: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """The dataset's MegaMoE raw document and megamoe_speedups of it; NoDataError when no
    configuration has both of our schedules."""
    doc = raw_doc(dataset_dir, layout.MEGAMOE_RAW)
    speedups, incomplete = megamoe_speedups(doc)
    if speedups.empty:
        raise NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_RAW} has no configuration with ok "
            f"{WAVE} and {INTERLEAVED} records (variant absent or 'ours')"
        )
    return doc, speedups, incomplete


def megamoe_speedups(doc: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per configuration: expert_wave / interleaved time for our kernel (variant absent or
    'ours'). Returns (complete configurations, configurations lacking an ok schedule)."""
    df = remote_fraction_labels(records_frame(doc))
    if df.empty:
        return df, df
    if "variant" in df.columns:
        df = df[df["variant"].isna() | (df["variant"] == "ours")]
    keys = [c for c in MEGAMOE_CONFIG_COLUMNS if c in df.columns]
    ok = df[(df["status"] == "ok") & df["schedule"].isin(COMPARED)]
    if ok.empty or "time_us_median" not in ok.columns:
        times = pd.DataFrame(columns=[*keys, *COMPARED]).set_index(keys)
    else:
        times = ok.pivot_table(
            index=keys, columns="schedule", values="time_us_median", aggfunc="first"
        )
    for schedule in COMPARED:
        if schedule not in times.columns:
            times[schedule] = np.nan
    times = times.rename(columns={WAVE: "wave_us", INTERLEAVED: "interleaved_us"})
    times["speedup"] = times["wave_us"] / times["interleaved_us"]
    configs = df[keys].drop_duplicates().set_index(keys).index
    times = times.reindex(configs)
    complete = times[times["speedup"].notna()].reset_index()
    incomplete = times[times["speedup"].isna()].reset_index()
    return complete[[*keys, "wave_us", "interleaved_us", "speedup"]], incomplete[keys]


BASELINE_COLUMNS = (
    "ours_best_us",
    "unfused_us",
    "unfused_fp8_us",
    "unfused_bf16_us",
    "deepgemm_wave_us",
    "deepgemm_lag_us",
    "deepgemm_best_us",
    "flashinfer_us",
    "ours_over_unfused",
    "ours_over_unfused_fp8",
    "ours_over_unfused_bf16",
    "ours_over_deepgemm",
    "ours_over_flashinfer",
    "ours_speedup",
    "deepgemm_lag_speedup",
)


def megamoe_baselines(doc: dict) -> pd.DataFrame:
    """Per configuration with an ok time of ours: our best schedule's time beside the
    baselines' (ok records only). Ratios are times, ours over the baseline's best (below 1:
    ours is faster); speedups are wave time over interleaved (ours) or over L2-lag
    (DeepGEMM) time. FlashInfer has one time per configuration (its own schedule), at
    natural routing only. Empty when the dataset holds no ok baseline record (the
    simulator writes none)."""
    df = remote_fraction_labels(records_frame(doc))
    if df.empty or "variant" not in df.columns:
        return pd.DataFrame(columns=[*MEGAMOE_CONFIG_COLUMNS, *BASELINE_COLUMNS])
    keys = [c for c in MEGAMOE_CONFIG_COLUMNS if c in df.columns]
    ok = df[(df["status"] == "ok") & df["time_us_median"].notna()].copy()
    if not ok["variant"].isin(BASELINES).any():
        return pd.DataFrame(columns=[*keys, *BASELINE_COLUMNS])
    ok["series"] = ok["variant"].fillna("ours") + "/" + ok["schedule"]
    wide = ok.pivot_table(index=keys, columns="series", values="time_us_median", aggfunc="first")
    names = {
        f"ours/{WAVE}": "ours_wave_us",
        f"ours/{INTERLEAVED}": "ours_interleaved_us",
        "unfused/unfused": "unfused_us",
        f"deepgemm/{WAVE}": "deepgemm_wave_us",
        f"deepgemm/{INTERLEAVED}": "deepgemm_lag_us",
        "flashinfer/flashinfer": "flashinfer_us",
    }
    wide = wide.rename(columns=names).reindex(columns=list(names.values()))
    out = pd.DataFrame(index=wide.index)
    out["ours_best_us"] = wide[["ours_wave_us", "ours_interleaved_us"]].min(axis=1)
    out["unfused_us"] = wide["unfused_us"]
    out["deepgemm_wave_us"] = wide["deepgemm_wave_us"]
    out["deepgemm_lag_us"] = wide["deepgemm_lag_us"]
    out["deepgemm_best_us"] = wide[["deepgemm_wave_us", "deepgemm_lag_us"]].min(axis=1)
    out["flashinfer_us"] = wide["flashinfer_us"]
    out["ours_over_unfused"] = out["ours_best_us"] / out["unfused_us"]
    paths = unfused_path_times(doc, keys)
    for column, ratio in UNFUSED_PATHS.values():
        out[column] = paths[column].reindex(out.index) if column in paths else np.nan
        out[ratio] = out["ours_best_us"] / out[column]
    out["ours_over_deepgemm"] = out["ours_best_us"] / out["deepgemm_best_us"]
    out["ours_over_flashinfer"] = out["ours_best_us"] / out["flashinfer_us"]
    out["ours_speedup"] = wide["ours_wave_us"] / wide["ours_interleaved_us"]
    out["deepgemm_lag_speedup"] = wide["deepgemm_wave_us"] / wide["deepgemm_lag_us"]
    out = out[out["ours_best_us"].notna()]
    return out.reset_index()[[*keys, *BASELINE_COLUMNS]]


def has_records(doc: dict, variant: str) -> bool:
    """Whether the sweep measured `variant` at all (whatever became of its points)."""
    return any(r["point"].get("variant") == variant for r in doc["records"])


def variant_outcome(doc: dict, variant: str, name: str) -> str:
    """What happened to a baseline's records: '84 failed (<error>); 84 unsupported
    (<error>)', or that the dataset has none."""
    records = [r for r in doc["records"] if r["point"].get("variant") == variant]
    if not records:
        return f"the dataset has no {name} record"
    parts = []
    for status in sorted({r["status"] for r in records}):
        some = [r for r in records if r["status"] == status]
        # Each distinct reason, most common first: one precision's "not supported" must not
        # hide another's "not installed".
        reasons = Counter(str(r["error"]).splitlines()[0][:90] for r in some if r.get("error"))
        detail = "; ".join(
            why if len(reasons) == 1 else f"{n}: {why}" for why, n in reasons.most_common()
        )
        parts.append(f"{len(some)} {status}" + (f" ({detail})" if detail else ""))
    return "; ".join(parts)


# The unfused pipeline's GEMM paths that get columns of their own (baselines/unfused.py):
# gemm -> (its time, ours over it). Sweeps from before each path was timed have neither.
UNFUSED_PATHS = {
    "fp8_grouped_rowwise": ("unfused_fp8_us", "ours_over_unfused_fp8"),
    "bf16_grouped": ("unfused_bf16_us", "ours_over_unfused_bf16"),
}
UNFUSED_PATH_RATIOS = tuple(ratio for _, ratio in UNFUSED_PATHS.values())


def _config_rows(doc: dict, variant: str) -> list[tuple[dict, dict]]:
    """(scalar point fields, extra) of the ok records of one variant."""
    return [
        ({k: v for k, v in r["point"].items() if k != "id" and is_scalar(v)}, r.get("extra") or {})
        for r in doc["records"]
        if r["point"].get("variant") == variant and r["status"] == "ok"
    ]


def _keyed(rows: list[dict], keys: list[str]) -> pd.DataFrame:
    """Rows as a frame indexed by the configuration keys (remote_fraction labelled, and
    'natural' where the records have none)."""
    frame = pd.DataFrame(rows)
    frame = frame.reindex(columns=[*frame.columns, *(k for k in keys if k not in frame)])
    return remote_fraction_labels(frame).set_index(keys)


def unfused_path_times(doc: dict, keys: list[str]) -> pd.DataFrame:
    """Per configuration, the median time (us) of each checked GEMM path of the unfused
    pipeline (its record's gemm_time_us), indexed by `keys`; empty for sweeps before it."""
    rows = [
        {
            **point,
            **{
                UNFUSED_PATHS[g][0]: us
                for g, us in extra["gemm_time_us"].items()
                if g in UNFUSED_PATHS
            },
        }
        for point, extra in _config_rows(doc, "unfused")
        if "gemm_time_us" in extra
    ]
    return _keyed(rows, keys) if rows else pd.DataFrame()


CEILING_COLUMNS = (
    "kernel_tflops",
    "ceiling_tflops",
    "fraction_of_ceiling",
    "kernel_us",
    "roofline_us",
    "roofline_over_kernel",
)


def kernel_vs_ceiling(doc: dict) -> pd.DataFrame:
    """Per configuration at natural routing with a gemm_ceiling record: our kernel's best
    schedule (kernel time and TFLOP/s, from the events around each rank's kernel) beside
    cuBLAS on the same two GEMMs, and the roofline time (megamoe/ceiling.py)."""
    ceilings = [
        {**point, "ceiling_tflops": extra["tflops"], "roofline_us": extra["roofline_us"]}
        for point, extra in _config_rows(doc, "gemm_ceiling")
    ]
    df = remote_fraction_labels(records_frame(doc))
    if not ceilings or df.empty or "kernel_us_median" not in df.columns:
        return pd.DataFrame(columns=[*MEGAMOE_CONFIG_COLUMNS, *CEILING_COLUMNS])
    keys = [c for c in MEGAMOE_CONFIG_COLUMNS if c in df.columns]
    ours = df[
        (df["variant"].isna() | (df["variant"] == "ours"))
        & (df["status"] == "ok")
        & df["schedule"].isin(COMPARED)
    ]
    best = ours.sort_values("kernel_us_median").groupby(keys, sort=False).first()
    ceiling = _keyed(ceilings, keys)
    out = pd.DataFrame(index=ceiling.index)
    out["kernel_tflops"] = best["extra_tflops_kernel"].reindex(out.index)
    out["ceiling_tflops"] = ceiling["ceiling_tflops"]
    out["fraction_of_ceiling"] = out["kernel_tflops"] / out["ceiling_tflops"]
    out["kernel_us"] = best["kernel_us_median"].reindex(out.index)
    out["roofline_us"] = ceiling["roofline_us"]
    out["roofline_over_kernel"] = out["roofline_us"] / out["kernel_us"]
    out = out[out["kernel_us"].notna()]
    return out.reset_index()[[*keys, *CEILING_COLUMNS]]


def emulated_speedups(doc: dict) -> pd.DataFrame:
    """Per (shape, X, f) of the emulated sweep: expert-wave over interleaved time, with the
    ratio's extremes over the two medians' CIs, and both schedules' wait and span stats."""
    df = remote_fraction_labels(records_frame(doc))
    keys = ["shape", "tokens_per_rank", "world_size", "emulated_tflops", "remote_fraction"]
    if df.empty or not {"time_us_median", *keys} <= set(df.columns):
        return pd.DataFrame(columns=[*keys, "speedup", "speedup_low", "speedup_high"])
    ok = df[df["status"] == "ok"]
    wide = ok.pivot_table(
        index=keys,
        columns="schedule",
        values=["time_us_median", "time_us_ci_low", "time_us_ci_high"],
        aggfunc="first",
        sort=False,
    )
    if any(("time_us_median", s) not in wide.columns for s in COMPARED):
        return pd.DataFrame(columns=[*keys, "speedup", "speedup_low", "speedup_high"])
    out = pd.DataFrame(index=wide.index)
    if "extra_equivalent_tflops" in ok.columns:
        achieved = ok.pivot_table(
            index=keys,
            columns="schedule",
            values="extra_equivalent_tflops",
            aggfunc="first",
            sort=False,
        )
        out["wave_equivalent_tflops"] = achieved.get(WAVE)
    out["wave_us"] = wide[("time_us_median", WAVE)]
    out["interleaved_us"] = wide[("time_us_median", INTERLEAVED)]
    out["speedup"] = out["wave_us"] / out["interleaved_us"]
    out["speedup_low"] = wide[("time_us_ci_low", WAVE)] / wide[("time_us_ci_high", INTERLEAVED)]
    out["speedup_high"] = wide[("time_us_ci_high", WAVE)] / wide[("time_us_ci_low", INTERLEAVED)]
    return out[out["speedup"].notna()].reset_index()


def emulated_sweep(dataset_dir: Path) -> tuple[dict, pd.DataFrame]:
    """The dataset's emulated MegaMoE document and emulated_speedups of it; NoDataError
    when no point has both schedules ok."""
    doc = raw_doc(dataset_dir, layout.MEGAMOE_EMULATED_RAW)
    speedups = emulated_speedups(doc)
    if speedups.empty:
        raise NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_EMULATED_RAW} has no point with "
            f"ok {WAVE} and {INTERLEAVED} records"
        )
    return doc, speedups


def crossover_rate_tflops(dataset_dir: Path) -> tuple[float, str] | None:
    """(X at the paper's compute-to-drain ratio, the R it used) from the dataset's model."""
    model = optional_model_doc(dataset_dir)
    r = fitted.param(model, "R_GBps") if model else None
    if r is None:
        return None
    return paper.PAPER_FLOP_PER_BYTE * r * 1e9 / 1e12, f"R = {r:.0f} GB/s"
