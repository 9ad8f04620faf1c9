"""Our MegaMoE kernel beside what a user would run instead, as frames: per configuration,
our best schedule's time beside the baselines' (unfused torch and each of its GEMM paths,
DeepGEMM, FlashInfer) and the ratios between them; what became of a baseline's records
where it has no time; and our kernel against cuBLAS on the same GEMMs and the roofline
(megamoe/ceiling.py). Configurations are analysis.megamoe's.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from xstage_bench.data import grid
from xstage_bench.megamoe.baselines import BASELINES
from xstage_bench.megamoe.schedule import COMPARED, INTERLEAVED, WAVE
from xstage_bench.report.analysis.frames import is_scalar, records_frame
from xstage_bench.report.analysis.megamoe import (
    KERNEL,
    MEGAMOE_CONFIG_COLUMNS,
    main_grid,
    remote_fraction_labels,
    with_paths,
)

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
    df = main_grid(with_paths(remote_fraction_labels(records_frame(doc))))
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


def ours_layer_from(doc: dict) -> set[str]:
    """Where our ok records' timed layer starts (grid.layer_from): {EXPERT_ROWS} (the
    dispatch done once, outside the time), {HOME_TOKENS} (inside it, as the baselines'),
    both where a dataset mixes them, or none."""
    return {
        grid.layer_from(r.get("extra") or {})
        for r in doc["records"]
        if r["point"].get("variant") is None and r["status"] == "ok"
    }


def dispatch_coverage(doc: dict) -> str:
    """What our time and a baseline's cover, as a README line or a table note says it."""
    starts = ours_layer_from(doc)
    if starts == {grid.HOME_TOKENS}:
        return "both times with their dispatch inside (ours: dispatch and layout on the GPU)"
    if starts == {grid.EXPERT_ROWS}:
        return "its time with its dispatch inside, ours without (dispatched once beforehand)"
    return "ours timed with and without its dispatch inside (a mixed dataset)"


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
    return with_paths(remote_fraction_labels(frame)).set_index(keys)


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
    "roofline_over_deepgemm",
    "roofline_over_flashinfer",
)
# the libraries' times over the same roofline: how close each comes to the bound (their
# times include their dispatch and combine)
LIBRARY_TIMES = {
    "roofline_over_deepgemm": "deepgemm_best_us",
    "roofline_over_flashinfer": "flashinfer_us",
}


def kernel_vs_ceiling(doc: dict, libraries: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per configuration at natural routing with a gemm_ceiling record: our kernel's best
    schedule (kernel time and TFLOP/s, from the events around each rank's kernel) beside
    cuBLAS on the same two GEMMs, and the roofline time (megamoe/ceiling.py) over our
    kernel's time and over DeepGEMM's and FlashInfer's, where they ran (`libraries`: the
    doc's megamoe_baselines frame, where the caller has it already)."""
    ceilings = [
        {**point, "ceiling_tflops": extra["tflops"], "roofline_us": extra["roofline_us"]}
        for point, extra in _config_rows(doc, "gemm_ceiling")
    ]
    df = with_paths(remote_fraction_labels(records_frame(doc)))
    if not ceilings or df.empty or "kernel_us_median" not in df.columns:
        return pd.DataFrame(columns=[*MEGAMOE_CONFIG_COLUMNS, *CEILING_COLUMNS])
    keys = [c for c in MEGAMOE_CONFIG_COLUMNS if c in df.columns]
    df = main_grid(df)
    ours = df[
        (df["variant"].isna() | (df["variant"] == "ours"))
        & (df["status"] == "ok")
        & df["schedule"].isin(COMPARED)
    ]
    best = ours.sort_values("kernel_us_median").groupby(keys, sort=False).first()
    ceiling = _keyed(ceilings, keys)
    out = pd.DataFrame(index=ceiling.index)
    out["kernel_tflops"] = best[f"extra_{KERNEL.tflops}"].reindex(out.index)
    out["ceiling_tflops"] = ceiling["ceiling_tflops"]
    out["fraction_of_ceiling"] = out["kernel_tflops"] / out["ceiling_tflops"]
    out["kernel_us"] = best["kernel_us_median"].reindex(out.index)
    out["roofline_us"] = ceiling["roofline_us"]
    out["roofline_over_kernel"] = out["roofline_us"] / out["kernel_us"]
    libraries = megamoe_baselines(doc) if libraries is None else libraries
    libraries = libraries.set_index(keys) if not libraries.empty else None
    for column, time in LIBRARY_TIMES.items():
        took = libraries[time].reindex(out.index) if libraries is not None else np.nan
        out[column] = out["roofline_us"] / took
    out = out[out["kernel_us"].notna()]
    return out.reset_index()[[*keys, *CEILING_COLUMNS]]
