"""What a raw record must satisfy beyond its schema: agreement with itself and with physics.

A file can be valid JSON, follow the schema and still hold numbers no measurement made: a
summary edited beside unchanged samples (error bars read the summary, the fit reads the
samples), a point whose fields disagree with its id, one point recorded twice under two
ids, or a rate a million times the link's. `results.validate_raw` runs these checks on
every read and write, so such a file stops rendering with the record and the bound named.

- Summaries: every field is recomputed from the samples (`stats.summarize`). The bootstrap
  CI is reproduced exactly (same seed, same resamples) for up to `EXACT_CI_MAX_N` samples;
  above that (per-tile spans of a trace: tens of thousands) it must lie in the band of
  order statistics where the bootstrap's 2.5% and 97.5% quantiles of the median fall.
- Samples: every metric of an ok record holds at least one sample. A metric no launch could
  give is left out and named, with the reason, in `extra.metrics_without_samples`
  (microbench/runner.py): an empty list says nothing of why. microbench/repair.py rewrote
  the committed files written before that.
- Ids: the fields an id encodes (`K=132`, `T=1024`, a MegaMoE shape, an attention backend)
  equal the point's (grid.py makes both; V in a microbench id is the requested size, the
  point's V is it rounded to K whole producers).
- One record per physical point: two records whose points are equal but for the id.
- Bounds, from the environment block of a measured (GPU) file: a drain rate or ceiling in
  GB/s at most the line rate of the point's path (peer: the GPU's NVLink; host: the host link
  it recorded; local: its HBM, with headroom for bursts that L2 absorbs; an issue rate as a
  local one, since the path's outstanding capacity absorbs part of a burst), a duration at
  least one tick of the finest timer we read, a TFLOP/s at most the GPU's dense peak.
  Simulated and CPU-test files are model outputs or tests of the harness: their values are
  not bounded here. A file's own word does not lift the bounds where its dataset is a
  reference (config `datasets.reference`, measured on GPUs by definition): a file there
  that says it was simulated, ran on the CPU or had no GPU is refused (`measured_claims`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from xstage_bench.data import stats, storepath
from xstage_bench.data.grid import ORACLE

SUMMARY_REL_TOL = 1e-9  # a stored summary is the summary of the stored samples
EXACT_CI_MAX_N = 1024
ENVELOPE_Z = (1.0, 3.0)  # the 95% bootstrap bound lies ~1.96 sqrt(n)/2 ranks from the middle


# --- summaries --------------------------------------------------------------------------


@lru_cache(maxsize=32)
def _resample_counts(n: int) -> np.ndarray:
    """How often each sample index is drawn in each bootstrap resample of n samples: the
    draws of stats.bootstrap_median_ci (default_rng(seed 0), replace=True), as counts."""
    rng = np.random.default_rng(0)
    draws = rng.integers(0, n, size=(stats.BOOTSTRAP_RESAMPLES, n))
    rows = np.arange(stats.BOOTSTRAP_RESAMPLES)[:, None] * n
    counts = np.bincount((draws + rows).ravel(), minlength=stats.BOOTSTRAP_RESAMPLES * n)
    return counts.reshape(stats.BOOTSTRAP_RESAMPLES, n).astype(np.int32)


def bootstrap_ci(samples: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """stats.bootstrap_median_ci, computed from resample counts instead of resampled values:
    the same medians (each is one or the mean of two order statistics), a few times faster."""
    x = np.asarray(samples, dtype=float)
    n = x.size
    if n == 1:
        return float(x[0]), float(x[0])
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    cumulative = np.cumsum(_resample_counts(n)[:, order], axis=1)
    if n % 2:
        medians = ordered[(cumulative < (n + 1) // 2).sum(axis=1)]
    else:
        low = ordered[(cumulative < n // 2).sum(axis=1)]
        high = ordered[(cumulative < n // 2 + 1).sum(axis=1)]
        medians = (low + high) / 2
    alpha = (1.0 - confidence) / 2.0
    return float(np.quantile(medians, alpha)), float(np.quantile(medians, 1.0 - alpha))


def _ci_envelope(x: np.ndarray) -> tuple[tuple[float, float], tuple[float, float]]:
    """Ranges for (ci_low, ci_high) where many samples make the exact CI costly."""
    ordered = np.sort(x)
    n = x.size
    mid, spread = (n - 1) / 2, np.sqrt(n) / 2

    def at(rank: float) -> float:
        return float(ordered[int(np.clip(round(rank), 0, n - 1))])

    near, far = (z * spread + 2 for z in ENVELOPE_Z)
    return (at(mid - far), at(mid - near)), (at(mid + near), at(mid + far))


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return bool(np.isclose(a, b, rtol=SUMMARY_REL_TOL, atol=1e-12))


def summary_problem(name: str, summary: dict, values: list[float]) -> str | None:
    """What in a stored summary is not the summary of its samples, or None."""
    x = np.asarray(values, dtype=float)
    if summary["n"] != x.size:
        return f"summary '{name}': n is {summary['n']} but there are {x.size} samples"
    fresh = _summary_without_ci(x)
    if x.size <= EXACT_CI_MAX_N:
        fresh["ci_low"], fresh["ci_high"] = bootstrap_ci(x)
    for field in ("median", "q1", "q3", "rel_iqr", "min", "max", "ci_low", "ci_high"):
        if field not in summary or field not in fresh:
            continue
        if not _close(summary[field], fresh[field]):
            return (
                f"summary '{name}': {field} {summary[field]:g} is not the {field} of its "
                f"samples ({fresh[field]:g})"
            )
    if x.size > EXACT_CI_MAX_N and "ci_low" in summary and "ci_high" in summary:
        (lo_min, lo_max), (hi_min, hi_max) = _ci_envelope(x)
        if not (lo_min <= summary["ci_low"] <= lo_max and hi_min <= summary["ci_high"] <= hi_max):
            return (
                f"summary '{name}': CI [{summary['ci_low']:g}, {summary['ci_high']:g}] is not "
                f"a bootstrap CI of the median of its {x.size} samples (low in "
                f"[{lo_min:g}, {lo_max:g}], high in [{hi_min:g}, {hi_max:g}])"
            )
    return None


def _summary_without_ci(x: np.ndarray) -> dict:
    q1, median, q3 = np.quantile(x, [0.25, 0.5, 0.75])
    return {
        "median": float(median),
        "q1": float(q1),
        "q3": float(q3),
        "rel_iqr": float((q3 - q1) / median) if median != 0 else None,
        "min": float(x.min()),
        "max": float(x.max()),
    }


def empty_samples(record: dict) -> str | None:
    """What is wrong with an ok record's samples (none at all, or an empty list), or None."""
    if record["status"] != "ok":
        return None
    if not record.get("samples"):
        return (
            "status 'ok' with no samples: an ok record holds the samples of at least one "
            "metric (a point that gave no number is recorded failed, with why)"
        )
    for name, values in record["samples"].items():
        if not values:
            return (
                f"samples '{name}' is an empty list: a metric no launch gave is left out and "
                "named in extra.metrics_without_samples (python -m "
                "xstage_bench.microbench.repair repairs a file written before)"
            )
    return None


# --- ids --------------------------------------------------------------------------------

# The point field behind each `key=` of an id, per experiment (grid.py writes the ids).
_ID_KEYS = {
    "megamoe": {"T": "tokens_per_rank", "P": "world_size", "f": "remote_fraction"},
    "megamoe_emulated": {
        "T": "tokens_per_rank",
        "P": "world_size",
        "f": "remote_fraction",
        "X": "emulated_tflops",
    },
    "attention": {
        "H": "heads",
        "S": "seq_len",
        "P": "world_size",
        "emulated-P": "emulated_world_size",
    },
}
_ID_KEYS["megamoe_trace"] = _ID_KEYS["megamoe"]
# The point fields behind an id's leading words, and what its trailing words may name.
_LEADING = {
    "microbench": ("study",),
    "megamoe": ("shape", "precision", "routing"),
    "megamoe_trace": ("shape", "precision", "routing"),
    "megamoe_emulated": ("shape", "precision", "routing"),
    "attention": ("backend", "mode"),
}
_TRAILING = ("schedule", "variant")


def _same(encoded: str, value) -> bool:
    if isinstance(value, bool) or value is None:
        return encoded == str(value)
    try:
        return float(encoded) == float(value)
    except (TypeError, ValueError):
        return encoded == str(value)


def _microbench_v(encoded: str, point: dict) -> bool:
    """The id holds the requested V, the point V rounded to K producers of whole stores."""
    from xstage_bench.data.grid import producer_bytes

    if point.get("kind") == "ceiling" or "K" not in point:
        return _same(encoded, point.get("V"))
    try:
        return producer_bytes(int(encoded), int(point["K"])) * int(point["K"]) == point.get("V")
    except ValueError:
        return False


def id_problem(experiment: str, record: dict) -> str | None:
    """A field the record's id encodes that its point contradicts, or None."""
    point, rid = record["point"], record["id"]
    if "id" in point and not (point["id"] == rid or rid.startswith(f"{point['id']}/")):
        # A MegaMoE point keeps its configuration's id; the record adds the schedule.
        return f"point id '{point['id']}' is neither the record's id nor its configuration's"
    if experiment not in _LEADING:
        return None
    keys = _ID_KEYS.get(experiment, {})
    words = rid.split("/")
    if not any("=" in word for word in words):
        return None  # not a grid id (grid.py's always encode key=value fields)
    leading = []
    for word in words:
        if "=" in word:
            break
        leading.append(word)
    for field, word in zip(_LEADING[experiment], leading, strict=False):
        if field in point and point[field] != word:
            return f"the id names {field} '{word}' but the point has {point.get(field)!r}"
    trailing = words[len(leading) :]
    while trailing and "=" in trailing[0]:
        key, encoded = trailing.pop(0).split("=", 1)
        field = keys.get(key, key)
        if experiment == "microbench" and key == "V":
            ok = _microbench_v(encoded, point)
        elif field == "remote_fraction" and not _numeric(encoded):
            ok = point.get(field) in (None, encoded)
        else:
            ok = field in point and _same(encoded, point[field])
        if not ok:
            return f"the id names {key}={encoded} but the point has {field}={point.get(field)!r}"
    if experiment == "microbench":
        return None
    names = {point.get(f) for f in _TRAILING if point.get(f) is not None}
    for word in trailing if names else ():
        if "=" in word:  # an arm's knob after its schedule: '.../interleaved/lead=1024'
            key, encoded = word.split("=", 1)
            field = _ARM_KEYS.get(key, key)
            value = point.get(field)
            if not _same(encoded, value):
                return f"the id names {key}={encoded} but the point has {field}={value!r}"
        elif word == ORACLE and point.get("oracle"):
            continue  # the host-list arm beside a device-decided one (megamoe.oracle_arms)
        elif word not in names:
            return f"the id names '{word}' but the point's schedule/variant are {sorted(names)}"
    return None


# Knobs an arm's id names after its schedule (megamoe/points.py's lead map).
_ARM_KEYS = {"lead": "lead_rows_requested"}


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def duplicate_point(records: list[dict]) -> str | None:
    """Two records of one physical point (their points equal but for the id), or None."""
    seen: dict[str, str] = {}
    for record in records:
        key = json.dumps({k: v for k, v in record["point"].items() if k != "id"}, sort_keys=True)
        if key in seen:
            return (
                f"records '{seen[key]}' and '{record['id']}' are the same point (their points "
                "differ only in the id): one record per point"
            )
        seen[key] = record["id"]
    return None


# --- physical bounds --------------------------------------------------------------------


@dataclass(frozen=True)
class GpuLimits:
    """Datasheet figures of one GPU: NVLink line rate per direction, HBM bandwidth, and the
    dense peak of its fastest non-sparse MMA precision (FP8 on Hopper and Blackwell)."""

    nvlink_GBps: float
    hbm_GBps: float
    peak_tflops: float


# Matched against environment.gpus[].name, the first fragment found wins (GB200 before B200).
GPU_LIMITS = {
    "GB200": GpuLimits(nvlink_GBps=900, hbm_GBps=8000, peak_tflops=5000),
    "B200": GpuLimits(nvlink_GBps=900, hbm_GBps=8000, peak_tflops=4500),
    "H200": GpuLimits(nvlink_GBps=450, hbm_GBps=4800, peak_tflops=1979),
    "H100": GpuLimits(nvlink_GBps=450, hbm_GBps=3900, peak_tflops=1979),
    "A100": GpuLimits(nvlink_GBps=300, hbm_GBps=2039, peak_tflops=624),
}
# A GPU not in the table: twice the largest figure listed, so only absurd values stop.
UNKNOWN_GPU = GpuLimits(
    *(2 * max(getattr(g, f) for g in GPU_LIMITS.values()) for f in GpuLimits.__annotations__)
)
LINK_HEADROOM = 1.05  # a line rate is not exceeded; 5% for timer ticks on short windows
L2_HEADROOM = 2.5  # local bursts that fit in L2 are absorbed faster than HBM drains them
PEAK_HEADROOM = 1.05
PCIE_GEN6_X16_GBps = storepath.pcie_line_rate_GBps(6, 16)  # a host link that said nothing
NVLINK_C2C_GBps = 450.0  # Grace Hopper's chip-to-chip link, per direction
TIMER_TICK_US = 0.032  # %globaltimer's tick on the GPUs measured here (cudaEvent: coarser)
# Rates of issue, not of drain (microbench/stamp_metrics.py's issue_rate_GBps).
ISSUE_RATES = frozenset({"issue_rate_GBps"})
# Extras that are TFLOP/s of work the GPU did (not the emulated sweep's equivalent rate).
TFLOPS_EXTRAS = ("tflops", "tflops_kernel", "gemm_tflops")


def measured_claims(doc: dict, reference: str) -> str | None:
    """What a file of reference dataset `reference` says that a measurement on GPUs
    cannot (the field, and why it is refused), or None. Its bounds are a measurement's
    whatever it says: a file claiming otherwise would escape them (seen: samples times
    10^6 with `simulated: true`, rendered as R = 5.1e7 GB/s on "1x NVIDIA H200")."""
    env = doc.get("environment") or {}
    if doc.get("backend") != "cuda":
        claim = f"backend is '{doc.get('backend')}'"
    elif env.get("simulated"):
        claim = "environment.simulated is true"
    elif not env.get("gpus"):
        claim = "environment.gpus is empty"
    elif env.get("device_type") == "cpu":
        claim = "environment.device_type is 'cpu'"
    else:
        return None
    return (
        f"{claim}, but dataset '{reference}' is a reference (config key "
        "'datasets.reference'), measured on GPUs by definition: a file in it that says "
        "otherwise is refused, not rendered unbounded"
    )


def gpu_limits(name: str) -> tuple[str, GpuLimits]:
    for fragment, limits in GPU_LIMITS.items():
        if fragment in name:
            return fragment, limits
    return "an unlisted GPU (rawchecks.GPU_LIMITS)", UNKNOWN_GPU


@dataclass(frozen=True)
class Bounds:
    """What a measured file's values may reach, each with the words that name it."""

    rate_GBps: dict[str, tuple[float, str]]  # path -> (limit, what it is)
    peak_tflops: tuple[float, str]
    min_duration_us: float

    @classmethod
    def of(cls, doc: dict) -> Bounds | None:
        """The bounds of a measured file, None for a simulated or CPU-test one."""
        env = doc.get("environment") or {}
        gpus = env.get("gpus") or []
        if doc.get("backend") != "cuda" or env.get("simulated") or not gpus:
            return None
        if env.get("device_type") == "cpu":
            return None
        name = str(gpus[0].get("name", ""))
        fragment, gpu = gpu_limits(name)
        host_rate, host_what = _host_link(env.get("host_links") or [])
        return cls(
            rate_GBps={
                storepath.PEER: (
                    gpu.nvlink_GBps * LINK_HEADROOM,
                    f"the NVLink line rate of {fragment} ({gpu.nvlink_GBps:g} GB/s) + 5%",
                ),
                storepath.HOST: (host_rate * LINK_HEADROOM, f"{host_what} + 5%"),
                storepath.LOCAL: (
                    gpu.hbm_GBps * L2_HEADROOM,
                    f"{L2_HEADROOM:g}x the HBM bandwidth of {fragment} ({gpu.hbm_GBps:g} GB/s)",
                ),
            },
            peak_tflops=(
                gpu.peak_tflops * PEAK_HEADROOM,
                f"the dense peak of {fragment} ({gpu.peak_tflops:g} TFLOP/s) + 5%",
            ),
            min_duration_us=TIMER_TICK_US,
        )


def _host_link(links: list) -> tuple[float, str]:
    links = [link for link in links if isinstance(link, dict)]
    rates = [link["line_rate_GBps"] for link in links if link.get("line_rate_GBps")]
    if rates:
        return max(rates), f"the host link's recorded line rate ({max(rates):g} GB/s)"
    if any(link.get("kind") == "nvlink-c2c" for link in links):
        return NVLINK_C2C_GBps, f"the NVLink-C2C line rate ({NVLINK_C2C_GBps:g} GB/s)"
    return PCIE_GEN6_X16_GBps, f"PCIe Gen6 x16 ({PCIE_GEN6_X16_GBps:g} GB/s; no host link recorded)"


def bound_problem(bounds: Bounds, record: dict, durations: frozenset[str]) -> str | None:
    """A value of an ok record beyond the bounds, naming the value and the bound, or None."""
    samples = record.get("samples") or {}
    path = storepath.point_path(record["point"])
    for name, values in samples.items():
        if not values:
            continue
        if name.endswith("_GBps") and path in bounds.rate_GBps:
            # Stores issue into the GPU's own memory system first: a burst that the path's
            # outstanding capacity Q absorbs (about 3 MiB on one H200's host path) issues
            # faster than the link drains it (88 GB/s seen over a 63 GB/s PCIe link, 4 MiB
            # bursts of 33 producers). Issue rates are bounded as local stores; drain rates
            # and ceilings by the path's line rate.
            bounded_as = storepath.LOCAL if name in ISSUE_RATES else path
            limit, what = bounds.rate_GBps[bounded_as]
            top = max(values)
            if top > limit:
                return f"samples '{name}' reach {top:g} GB/s, above {what} on the {path} path"
        if name in durations and name.endswith("_us"):
            low = min(values)
            if low < bounds.min_duration_us:
                return (
                    f"samples '{name}' hold {low:g} us, below one tick of the GPU timer "
                    f"({bounds.min_duration_us:g} us)"
                )
    limit, what = bounds.peak_tflops
    for key, value in _tflops(record.get("extra") or {}):
        if value > limit:
            return f"extra '{key}' is {value:g} TFLOP/s, above {what}"
    return None


def _tflops(extra: dict):
    for key in TFLOPS_EXTRAS:
        value = extra.get(key)
        if isinstance(value, dict):
            for sub, v in value.items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    yield f"{key}.{sub}", float(v)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            yield key, float(value)
