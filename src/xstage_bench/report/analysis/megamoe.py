"""MegaMoE sweeps as frames: configurations per store path, schedule speedups with their
CIs in both metrics, the baselines beside ours, the compute-emulated sweep, and where the
emulated sweep reaches the paper's load on each path.

Records older than store paths are the peer path (storepath.point_path); records older
than paired rounds are unpaired (their CIs resample each schedule's samples on its own).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from xstage_bench.data import layout, storepath
from xstage_bench.data.grid import LOCAL_CONTROL, NATURAL, fraction_label
from xstage_bench.megamoe.baselines import BASELINES
from xstage_bench.megamoe.schedule import COMPARED, INTERLEAVED, WAVE
from xstage_bench.report import paper
from xstage_bench.report.analysis import fitted
from xstage_bench.report.analysis.frames import is_scalar, records_frame
from xstage_bench.report.analysis.load import NoDataError, optional_model_doc, raw_doc
from xstage_bench.report.analysis.speedup_ci import RatioSamples


@dataclass(frozen=True)
class Metric:
    """One timed quantity of a MegaMoE record, named once for raw config, tables and
    figures: its samples' key, its name, what it includes, the prefix of its frame
    columns (`<prefix>speedup`, `<prefix>wave_us`, ...) and the extra holding useful
    TFLOP/s over it."""

    sample: str
    name: str
    parts: str
    prefix: str
    tflops: str

    @property
    def label(self) -> str:
        """'layer time (kernel + barrier + reduction)' or 'kernel time'."""
        return f"{self.name} ({self.parts})" if self.parts else self.name

    def column(self, what: str) -> str:
        return f"{self.prefix}{what}"


# time_us: GPU events around the fused kernel, the barrier after it and the GPU's top-k
# weighted reduction; kernel_us: the fused kernel alone (raw config "definitions").
LAYER = Metric("time_us", "layer time", "kernel + barrier + reduction", "", "tflops")
KERNEL = Metric("kernel_us", "kernel time", "", "kernel_", "tflops_kernel")
METRICS = (LAYER, KERNEL)

MEGAMOE_CONFIG_COLUMNS = (
    "path",
    "shape",
    "precision",
    "routing",
    "tokens_per_rank",
    "world_size",
    "remote_fraction",
)
MEGAMOE_GROUPS = ("shape", "precision", "routing", "remote_fraction")
# Point fields that are no part of a configuration: which run of it a record is.
RUN_FIELDS = ("id", "schedule", "variant", "lead_rows", "lead_rows_requested", "lead_sweep")


def megamoe_config_key(point: dict) -> tuple:
    """What identifies a MegaMoE configuration: the point without its run fields (schedule,
    variant, lead), its path named (records older than paths: peer)."""
    fields = {k: v for k, v in point.items() if k not in RUN_FIELDS}
    fields["path"] = storepath.point_path(point)
    return tuple(sorted((k, str(v)) for k, v in fields.items()))


def trace_series(point: dict) -> str | None:
    """Which run of a traced configuration a record is: expert_wave, interleaved or
    local_control (written as the schedule, beside a schedule as the variant, or, on the
    host path, as the share f = 0: no row stored into host memory)."""
    if LOCAL_CONTROL in (point.get("schedule"), point.get("variant")):
        return LOCAL_CONTROL
    if "remote_fraction" in point and fraction_label(point["remote_fraction"]) == "0":
        return LOCAL_CONTROL
    return point.get("schedule")


def megamoe_config_name(point: dict) -> str:
    """'glm-5.2, w8a8, skewed, tokens_per_rank=1024, world_size=2' (the path is a column
    of its own, or the section's)."""
    return ", ".join(
        str(point[k]) if k in MEGAMOE_GROUPS else f"{k}={point[k]}"
        for k in MEGAMOE_CONFIG_COLUMNS
        if k in point and k != "path"
    )


def share_word(path: str) -> str:
    """What f is on a path: the host share (rows stored into host memory) or the remote
    fraction (rows stored into the peer GPU)."""
    return "host share" if path == storepath.HOST else "remote fraction"


def fraction_text(path: str, fraction: str) -> str:
    """How one f of a path reads: 'natural routing', 'host share f = 0 (local control)'."""
    if fraction == NATURAL:
        return "natural routing"
    control = " (local control)" if fraction == "0" else ""
    return f"{share_word(path)} f = {fraction}{control}"


def path_title(path: str) -> str:
    """'peer path (peer GPU (NVLink))': how a panel, section or row names its path."""
    return f"{path} path ({storepath.far_end(path)})"


def paths_text(paths) -> str:
    """'store paths: peer (peer GPU (NVLink)), host (host memory)' for a title."""
    paths = ordered_paths(paths)
    word = "store path" if len(paths) == 1 else "store paths"
    return f"{word}: " + ", ".join(f"{p} ({storepath.far_end(p)})" for p in paths)


def ordered_paths(paths) -> list[str]:
    """Paths in storepath's order (peer, host), any other after them."""
    known = [p for p in storepath.PATHS if p in set(paths)]
    return known + sorted(set(paths) - set(known))


def with_paths(df: pd.DataFrame) -> pd.DataFrame:
    """A records frame with `path` on every row ('peer' where the record predates paths)."""
    if df.empty:
        return df
    path = df["path"] if "path" in df.columns else pd.Series(np.nan, index=df.index)
    return df.assign(path=path.where(path.notna(), storepath.PEER))


def main_grid(df: pd.DataFrame) -> pd.DataFrame:
    """A records frame without the lead sweep's extra interleaved arms."""
    if df.empty or "lead_sweep" not in df.columns:
        return df
    return df[~df["lead_sweep"].eq(True)]


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
    return speedups[speedups["remote_fraction"] == NATURAL]


def headline_sets(speedups: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(path, what, configurations) of each headline: per path, natural routing where the
    path has it (the paper's setting), else one headline per share f (the host path: f = 0
    is the local control, each other share its own load)."""
    sets = []
    for path in ordered_paths(speedups["path"]):
        part = speedups[speedups["path"] == path]
        fractions = set(part["remote_fraction"])
        if NATURAL in fractions:
            what = "all" if fractions == {NATURAL} else "natural routing"
            sets.append((path, what, part[part["remote_fraction"] == NATURAL]))
            continue
        for fraction in sorted(fractions, key=float):
            rows = part[part["remote_fraction"] == fraction]
            sets.append((path, fraction_text(path, fraction), rows))
    return sets


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


def is_ours(point: dict) -> bool:
    return point.get("variant") in (None, "ours")


def config_fields(point: dict) -> dict:
    """A point's configuration columns: its path named, its remote fraction labelled."""
    fields = {k: point[k] for k in MEGAMOE_CONFIG_COLUMNS if k in point}
    fields["path"] = storepath.point_path(point)
    fields["remote_fraction"] = fraction_label(point.get("remote_fraction"))
    return fields


def in_same_rounds(a: dict, b: dict) -> bool:
    """Were two records timed in the same paired rounds (extra.paired, each naming the
    other among its arms)? Records older than paired rounds were not."""
    pa = (a.get("extra") or {}).get("paired") or {}
    pb = (b.get("extra") or {}).get("paired") or {}
    return b["id"] in pa.get("arms", ()) and a["id"] in pb.get("arms", ())


def ratio_columns(base: dict, candidate: dict) -> dict:
    """base time over candidate time (a speedup of `candidate`) in every metric both
    records have samples of: medians, ratio, its CI and verdict (stats.ratio_ci, paired
    where the two were timed in the same rounds), `noisy`, and the samples themselves
    (`<prefix>samples`, for headline CIs); `paired`, `n` and `throttled` (either record
    flagged) of the pair."""
    paired = in_same_rounds(base, candidate)
    row: dict = {
        "paired": paired,
        "throttled": bool(base.get("throttled") or candidate.get("throttled")),
    }
    for metric in METRICS:
        a = (base.get("samples") or {}).get(metric.sample)
        b = (candidate.get("samples") or {}).get(metric.sample)
        if not a or not b:
            continue
        samples = RatioSamples.of(a, b, paired)
        found = samples.ci()
        row.update(
            {
                metric.column("wave_us"): float(np.median(samples.numerator)),
                metric.column("interleaved_us"): float(np.median(samples.denominator)),
                metric.column("speedup"): found["ratio"],
                metric.column("speedup_ci_low"): found["ci_low"],
                metric.column("speedup_ci_high"): found["ci_high"],
                metric.column("verdict"): found["verdict"],
                metric.column("noisy"): found["noisy"],
                metric.column("samples"): samples,
            }
        )
        row.setdefault("n", found["n"])
    return row


def megamoe_speedups(doc: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per configuration of the main grid (lead-sweep arms apart): expert-wave time over
    interleaved time for our kernel (variant absent or 'ours'), in every metric the
    records have (METRICS: `speedup` is the layer time's, `kernel_speedup` the kernel
    time's), each with its CI, verdict and `noisy` flag. Returns (complete
    configurations, configurations lacking an ok schedule)."""
    runs: dict[tuple, dict[str, dict]] = {}
    fields: dict[tuple, dict] = {}
    for record in doc["records"]:
        point = record["point"]
        if not is_ours(point) or point.get("lead_sweep") or point.get("schedule") not in COMPARED:
            continue
        key = megamoe_config_key(point)
        fields.setdefault(key, config_fields(point))
        if record["status"] == "ok" and (record.get("samples") or {}).get(LAYER.sample):
            runs.setdefault(key, {})[point["schedule"]] = record
    keys = [c for c in MEGAMOE_CONFIG_COLUMNS if any(c in f for f in fields.values())]
    complete, incomplete = [], []
    for key, config in fields.items():
        found = runs.get(key, {})
        if set(found) != set(COMPARED):
            incomplete.append(config)
            continue
        wave, interleaved = found[WAVE], found[INTERLEAVED]
        complete.append(
            {
                **config,
                "wave_id": wave["id"],
                "interleaved_id": interleaved["id"],
                **ratio_columns(wave, interleaved),
            }
        )
    return (
        _ordered(pd.DataFrame(complete), keys),
        pd.DataFrame(incomplete, columns=keys).reindex(columns=keys),
    )


def _ordered(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Configuration keys first, in MEGAMOE_CONFIG_COLUMNS' order, then the rest."""
    if frame.empty:
        return pd.DataFrame(columns=[*keys, "speedup"])
    return frame[[*keys, *(c for c in frame.columns if c not in keys)]]


def metrics_of(speedups: pd.DataFrame) -> list[Metric]:
    """The metrics some configuration of `speedups` has a speedup in (the simulator times
    the layer only; sweeps before kernel_us was recorded have no kernel time)."""
    return [
        m
        for m in METRICS
        if m.column("speedup") in speedups.columns and speedups[m.column("speedup")].notna().any()
    ]


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
)


def kernel_vs_ceiling(doc: dict) -> pd.DataFrame:
    """Per configuration at natural routing with a gemm_ceiling record: our kernel's best
    schedule (kernel time and TFLOP/s, from the events around each rank's kernel) beside
    cuBLAS on the same two GEMMs, and the roofline time (megamoe/ceiling.py)."""
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
    out = out[out["kernel_us"].notna()]
    return out.reset_index()[[*keys, *CEILING_COLUMNS]]


EMULATED_KEYS = (
    "path",
    "shape",
    "tokens_per_rank",
    "world_size",
    "emulated_tflops",
    "remote_fraction",
)


def emulated_speedups(doc: dict) -> pd.DataFrame:
    """Per (path, shape, X, f) of the emulated sweep: expert-wave over interleaved time in
    each metric the records have (ratio_columns: medians, ratio, CI, verdict, noisy), and
    the rate the expert-wave run achieved (`wave_equivalent_tflops`) where recorded. On
    the host path f is the host share; 0 is the local control on every path."""
    runs: dict[tuple, dict[str, dict]] = {}
    for record in doc["records"]:
        point = record["point"]
        if record["status"] != "ok" or point.get("schedule") not in COMPARED:
            continue
        if not (record.get("samples") or {}).get(LAYER.sample):
            continue
        fields = {**point, **config_fields(point)}
        key = tuple(fields.get(k) for k in EMULATED_KEYS)
        runs.setdefault(key, {})[point["schedule"]] = record
    rows = []
    for key, found in runs.items():
        if set(found) != set(COMPARED):
            continue
        row = dict(zip(EMULATED_KEYS, key, strict=True))
        achieved = (found[WAVE].get("extra") or {}).get("equivalent_tflops")
        if achieved is not None:
            row["wave_equivalent_tflops"] = float(achieved)
        rows.append({**row, **ratio_columns(found[WAVE], found[INTERLEAVED])})
    if not rows:
        return pd.DataFrame(
            columns=[*EMULATED_KEYS, "speedup", "speedup_ci_low", "speedup_ci_high"]
        )
    frame = pd.DataFrame(rows)
    # per path and shape (in the order measured), by rate, then share: a table per rate
    order = {k: list(dict.fromkeys(frame[k])) for k in ("shape", "remote_fraction")}
    order["path"] = ordered_paths(frame["path"])
    rank = {f"_{k}": frame[k].map({v: i for i, v in enumerate(o)}) for k, o in order.items()}
    frame = frame.assign(**rank).sort_values(
        ["_path", "_shape", "emulated_tflops", "_remote_fraction"], kind="stable"
    )
    return frame.drop(columns=list(rank)).reset_index(drop=True)


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


def path_drain_rate_GBps(model: dict, path: str) -> float | None:
    """The drain rate R fitted for `path` (model.document.path_fit: the top-level fit, or
    the path's part of `other_paths`); None where the model did not fit that path."""
    from xstage_bench.model.document import ModelFileError, path_fit

    try:
        return fitted.param(path_fit(model, path), "R_GBps")
    except ModelFileError:
        return None


def crossover_rate_tflops(
    dataset_dir: Path, path: str = storepath.PEER
) -> tuple[float, str] | None:
    """(X at the paper's compute-to-drain ratio, the R it used) for `path`, from the
    dataset's model; None without a fitted R for that path."""
    model = optional_model_doc(dataset_dir)
    r = path_drain_rate_GBps(model, path) if model else None
    if r is None:
        return None
    return paper.PAPER_FLOP_PER_BYTE * r * 1e9 / 1e12, f"R = {r:.0f} GB/s"
