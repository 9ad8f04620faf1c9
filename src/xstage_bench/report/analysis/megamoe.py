"""MegaMoE sweeps as frames: configurations per store path, how they, their paths and
shares are named, and schedule speedups with their CIs in both metrics. The baselines
beside ours are analysis.megamoe_baselines'; the compute-emulated sweep and where it
reaches the paper's load on each path, analysis.megamoe_emulated's.

Records older than store paths are the peer path (storepath.point_path); records older
than paired rounds are unpaired (their CIs resample each schedule's samples on its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from xstage_bench.data import layout, storepath
from xstage_bench.data.grid import LOCAL_CONTROL, NATURAL, fraction_label, side_arm
from xstage_bench.megamoe.schedule import COMPARED, INTERLEAVED, WAVE
from xstage_bench.report.analysis.load import NoDataError, raw_doc
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
RUN_FIELDS = (
    "id",
    "schedule",
    "variant",
    "lead_rows",
    "lead_rows_requested",
    "lead_sweep",
    "decided_on",
    "oracle",
)


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
    if point.get("variant") in COMPARED:  # a trace record names its run (even at f = 0)
        return point["variant"]
    if "remote_fraction" in point and fraction_label(point["remote_fraction"]) == "0":
        return LOCAL_CONTROL
    return point.get("schedule")


def stores_far(point: dict) -> bool:
    """Whether a traced run stored rows across its path: not the local control, and not a
    run at the host path's share f = 0 (every row stays on the GPU)."""
    if trace_series(point) == LOCAL_CONTROL:
        return False
    share = point.get("remote_fraction")
    return not (storepath.point_path(point) == storepath.HOST and fraction_label(share) == "0")


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
    """A records frame without the side arms: the lead sweep's extra interleaved arms and
    the oracle arms (grid.side_arm)."""
    side = [c for c in ("lead_sweep", "oracle") if c in df.columns]
    if df.empty or not side:
        return df
    return df[~df[side].eq(True).any(axis=1)]


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


def at_baseline_setting(frame: pd.DataFrame) -> pd.DataFrame:
    """The configurations where the baselines run (megamoe.points): natural routing, and
    on the host path its f = 0 control (nothing goes to the host there, the problem a
    baseline computes)."""
    if "remote_fraction" not in frame.columns:
        return frame
    natural = frame["remote_fraction"] == NATURAL
    control = (frame["path"] == storepath.HOST) & (frame["remote_fraction"] == fraction_label(0))
    return frame[natural | control]


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
        if not is_ours(point) or side_arm(point) or point.get("schedule") not in COMPARED:
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
