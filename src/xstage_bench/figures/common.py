"""What every figure (and table) shares: loading a dataset's files, flattening records,
labelling measured vs simulated data, noting failed points, and saving.

Renderers read raw files only through `results.read_raw` (schema-validated), so a malformed
file stops the render with an error naming the file and field; a file that is simply not
there raises NoDataError naming the dataset and the file.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # renderers run headless (CI, Snakemake jobs); set before pyplot loads

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.artist import Artist  # noqa: E402
from matplotlib.axis import Axis  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    FixedLocator,
    FuncFormatter,
    LogLocator,
    NullFormatter,
    NullLocator,
)

from xstage_bench import layout  # noqa: E402
from xstage_bench.megamoe.routing import fraction_label  # noqa: E402
from xstage_bench.model.laws import BYTES_PER_US_PER_GBPS as GBPS_TO_BYTES_PER_US  # noqa: E402
from xstage_bench.results import read_raw  # noqa: E402
from xstage_bench.stats import geomean  # noqa: E402, F401 (figures and tables use common.geomean)

DPI = 100
# Text sizes (points) chosen for reading at report size, where a figure shows about as
# wide as a laptop screen: tick labels follow the seaborn theme below.
TITLE_FONT = 13
PANEL_TITLE_FONT = 10.5
LEGEND_FONT = 9.5
NOTE_FONT = 9
NOTE_LINE_IN = 0.17  # height of one line of notes, in inches
MIB = 1 << 20
KIB = 1 << 10
ELEMENT_BYTES = 2  # bf16 activations and outputs (MegaMoE combine, attention output)

sns.set_theme(style="whitegrid", context="paper", font_scale=1.3)


class NoDataError(ValueError):
    """The dataset has no file, or no usable records, for a product."""


class ModelFileError(ValueError):
    """model/burst_gap.json exists but is not what the model fitter writes."""


# ---------------------------------------------------------------- loading


def _missing(dataset_dir: Path, rel: str, what: str) -> NoDataError:
    return NoDataError(
        f"dataset '{dataset_dir.name}' ({dataset_dir}): no {what}: {rel} does not exist"
    )


def raw_doc(dataset_dir: Path, read: str) -> dict:
    """A raw document named as in layout (a path or 'microbench:<study>'), validated."""
    path = layout.resolve(dataset_dir, read)
    if not path.exists():
        raise _missing(dataset_dir, str(path.relative_to(dataset_dir)), "raw data")
    return read_raw(path)


def optional_raw_doc(dataset_dir: Path, read: str) -> dict | None:
    """Like raw_doc, but None when the file does not exist (a bad file still raises)."""
    path = layout.resolve(dataset_dir, read)
    return read_raw(path) if path.exists() else None


def model_doc(dataset_dir: Path) -> dict:
    """The fitted Burst-Gap model of the dataset (model/burst_gap.json)."""
    path = dataset_dir / layout.MODEL_JSON
    if not path.exists():
        raise _missing(dataset_dir, layout.MODEL_JSON, "fitted model")
    try:
        model = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelFileError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    for key in ("backend", "params", "per_K", "validation", "validation_summary", "checks"):
        if key not in model:
            raise ModelFileError(f"{path}: missing key '{key}'")
    for name in ("R_GBps", "Q_bytes", "t0_fixed_us", "issue_rate_per_sm_GBps"):
        if name not in model["params"]:
            raise ModelFileError(f"{path}: missing key 'params/{name}'")
    return model


def optional_model_doc(dataset_dir: Path) -> dict | None:
    path = dataset_dir / layout.MODEL_JSON
    return model_doc(dataset_dir) if path.exists() else None


def model_environment(dataset_dir: Path, model: dict) -> dict | None:
    """The environment of the first raw file the model was fitted from, when it is present.

    Sources may be written relative to the repository or to the dataset: the part from
    'raw/' on is looked up inside this dataset.
    """
    for source in model.get("sources", []):
        parts = Path(source).parts
        if "raw" not in parts:
            continue
        path = dataset_dir.joinpath(*parts[parts.index("raw") :])
        if path.exists():
            return read_raw(path)["environment"]
    return None


# ---------------------------------------------------------------- records as a DataFrame


def _scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def records_frame(doc: dict) -> pd.DataFrame:
    """One row per record: point columns, status, and median/ci_low/ci_high per metric.

    Metric columns are '<metric>_median', '<metric>_ci_low', '<metric>_ci_high'; scalar
    extras become 'extra_<key>'. Failed records keep their point columns and status.
    """
    rows = []
    for record in doc["records"]:
        row = {k: v for k, v in record["point"].items() if k != "id" and _scalar(v)}
        row.update(
            id=record["id"],
            status=record["status"],
            error=record.get("error"),
            throttled=record.get("throttled"),
        )
        for metric, s in (record.get("summary") or {}).items():
            row[f"{metric}_median"] = s["median"]
            row[f"{metric}_ci_low"] = s.get("ci_low", np.nan)
            row[f"{metric}_ci_high"] = s.get("ci_high", np.nan)
        for key, value in (record.get("extra") or {}).items():
            if _scalar(value):
                row[f"extra_{key}"] = value
        rows.append(row)
    return pd.DataFrame(rows)


def ok_rows(
    df: pd.DataFrame, dataset_dir: Path, source: str, metrics: tuple[str, ...]
) -> pd.DataFrame:
    """The ok rows that carry every metric; NoDataError naming the file when there are none."""
    if df.empty:
        raise NoDataError(f"dataset '{dataset_dir.name}': {source} has no records")
    ok = df[df["status"] == "ok"]
    if ok.empty:
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(Counter(df["status"]).items()))
        raise NoDataError(f"dataset '{dataset_dir.name}': {source} has no ok record ({statuses})")
    for metric in metrics:
        column = f"{metric}_median"
        if column not in ok.columns:
            raise NoDataError(
                f"dataset '{dataset_dir.name}': {source} has no ok record with metric '{metric}'"
            )
        ok = ok[ok[column].notna()]
    if ok.empty:
        raise NoDataError(
            f"dataset '{dataset_dir.name}': {source} has no ok record with "
            f"metric(s) {', '.join(metrics)}"
        )
    return ok


def error_bars(rows: pd.DataFrame, metric: str) -> np.ndarray:
    """Asymmetric error bars (median to CI bounds) for matplotlib's errorbar."""
    median = rows[f"{metric}_median"].to_numpy(float)
    low = rows[f"{metric}_ci_low"].to_numpy(float)
    high = rows[f"{metric}_ci_high"].to_numpy(float)
    return np.vstack([np.clip(median - low, 0, None), np.clip(high - median, 0, None)])


def failure_note(df: pd.DataFrame, action: str = "not plotted") -> str | None:
    """'3 points failed (timeout: 1, wrong: 2), not plotted' or None when all are ok."""
    if df.empty:
        return None
    bad = df[df["status"] != "ok"]
    parts = []
    if len(bad):
        counts = Counter(bad["status"])
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
        noun = "point" if len(bad) == 1 else "points"
        parts.append(f"{len(bad)} {noun} failed ({detail}), {action}")
    if "throttled" in df.columns:
        throttled = int((df["throttled"] == True).sum())  # noqa: E712 (column holds None too)
        if throttled:
            parts.append(f"{throttled} point(s) flagged throttled")
    return "; ".join(parts) or None


# ---------------------------------------------------------------- labels and saving


def is_simulated(dataset_dir: Path, backend: str | None) -> bool:
    return layout.is_simulated_dataset(dataset_dir.name) or backend == "sim"


def dataset_label(dataset_dir: Path, backend: str | None, environment: dict | None) -> str:
    """'sim-h200 (simulated, profile H200 (seed))' or 'h200x2: 2x NVIDIA H200'."""
    name = dataset_dir.name
    environment = environment or {}
    if is_simulated(dataset_dir, backend):
        profile = (environment.get("hardware_profile") or {}).get("name")
        return f"{name} (simulated" + (f", profile {profile})" if profile else ")")
    gpus = Counter(g["name"] for g in environment.get("gpus", []))
    if not gpus:
        return f"{name}: measured (GPU not recorded)"
    return f"{name}: " + ", ".join(f"{n}x {gpu}" for gpu, n in gpus.items())


def doc_label(dataset_dir: Path, doc: dict) -> str:
    return dataset_label(dataset_dir, doc["backend"], doc["environment"])


def model_label(dataset_dir: Path, model: dict) -> str:
    return dataset_label(dataset_dir, model["backend"], model_environment(dataset_dir, model))


def new_figure(
    nrows: int = 1, ncols: int = 1, *, width: float = 5.0, height: float = 3.6, **kwargs
) -> tuple[Figure, np.ndarray]:
    """A figure of nrows x ncols panels of about width x height inches each."""
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kwargs
    )
    return fig, axes


def _wrap(notes: list[str | None], width_in: float) -> list[str]:
    """Notes wrapped to the figure's width (never cut): one list entry per printed line."""
    chars = max(40, int(width_in * 72 / (NOTE_FONT * 0.6)))
    return [line for n in notes if n for line in textwrap.wrap(n, chars, subsequent_indent="  ")]


def _stamp_simulated(fig: Figure) -> None:
    """A faint 'simulated' across every panel, behind the data: the plot itself says so."""
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>" or not ax.get_visible() or not ax.axison:
            continue
        ax.text(
            0.5,
            0.5,
            "SIMULATED",
            transform=ax.transAxes,
            ha="center",
            va="center",
            rotation=20,
            fontsize=26,
            fontweight="bold",
            color="tab:purple",
            alpha=0.13,
            zorder=0,
        )


def finish_figure(
    fig: Figure,
    title: str,
    label: str,
    notes: list[str | None],
    legend: list[Artist] | None = None,
) -> Figure:
    """Title with the dataset label on its own line, notes at the bottom (wrapped, never
    cut), optionally one legend right of the panels, level with the top of the data (it
    hides none), and 'SIMULATED' inside every panel of a simulated dataset."""
    fig.suptitle(f"{title}\n{label}", fontsize=TITLE_FONT)
    if "(simulated" in label:  # dataset_label marks every simulated dataset so
        _stamp_simulated(fig)
    width, height = fig.get_size_inches()
    right = 1.0
    handle = None
    if legend:
        handle = fig.legend(handles=legend, loc="upper left", fontsize=LEGEND_FONT, frameon=False)
        extent = handle.get_window_extent(fig.canvas.get_renderer())
        legend_in = extent.width / fig.dpi + 0.2
        fig.set_size_inches(width + legend_in, height)  # the panels keep their size
        right = width / (width + legend_in)
    lines = _wrap(notes, fig.get_size_inches()[0])
    notes_in = 0.25 + NOTE_LINE_IN * len(lines)
    fig.set_size_inches(fig.get_size_inches()[0], height + notes_in)  # panels keep their size
    if lines:
        fig.text(
            0.01, 0.005, "\n".join(lines), fontsize=NOTE_FONT, va="bottom", ha="left", color="0.25"
        )
    fig.tight_layout(rect=(0, notes_in / (height + notes_in), right, 1))
    if handle is not None:
        top = max(ax.get_position().y1 for ax in fig.axes)
        handle.set_bbox_to_anchor((right, top), transform=fig.transFigure)
    return fig


def save_figure(fig: Figure, out: Path) -> None:
    """Write the figure as `out` (PDF) and as PNG next to it, then free it.

    The PDF carries no creation date, so re-rendering the same data gives the same bytes
    (a fresh clone that re-renders a committed reference leaves its tree clean).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"CreationDate": None})
    fig.savefig(out.with_suffix(".png"), dpi=DPI)
    plt.close(fig)


def fmt_bytes(n: float) -> str:
    """'4 MiB' for 4 MiB and for 4 MiB rounded down to whole stores (V = K*B)."""
    if n >= 0.99 * MIB:
        return f"{round(n / MIB, 2):g} MiB"
    if n >= 0.99 * KIB:
        return f"{round(n / KIB, 1):g} KiB"
    return f"{n:g} B"


def byte_ticks(axis: Axis, values: np.ndarray) -> None:
    """Ticks at the measured sizes, labelled '256 KiB', '4 MiB' (log axes in bytes)."""
    labelled: dict[str, float] = {}
    for v in np.unique(np.asarray(values, dtype=float)):
        labelled.setdefault(fmt_bytes(v), v)  # K*B rounding gives near-equal sizes one tick
    axis.set_major_locator(FixedLocator(list(labelled.values())))
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt_bytes(v)))
    axis.set_minor_locator(NullLocator())


def plain_log_ticks(axis: Axis) -> None:
    """Log-axis labels as plain numbers at 1, 2, 5 x 10^n rather than powers of ten."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


# ---------------------------------------------------------------- the fitted model


def param(model: dict, name: str) -> float | None:
    """A fitted parameter's value, or None where the fitter could not determine it."""
    entry = model["params"].get(name) or {}
    value = entry.get("value")
    return None if value is None else float(value)


def param_ci(entry: dict | None) -> tuple[float, float, float]:
    """(value, ci_low, ci_high) of a parameter entry, NaN where absent."""
    entry = entry or {}
    return tuple(  # type: ignore[return-value]
        np.nan if entry.get(k) is None else float(entry[k]) for k in ("value", "ci_low", "ci_high")
    )


def drain_rate(model: dict) -> float | None:
    """R in bytes/us."""
    r = param(model, "R_GBps")
    return None if r is None else r * GBPS_TO_BYTES_PER_US


def t0_us(model: dict, K: float, V: float | np.ndarray) -> float | np.ndarray | None:
    """Backpressure-free issue time for K producers and V bytes: t0_fixed + (V/K)/issue_rate."""
    fixed = param(model, "t0_fixed_us")
    rate = param(model, "issue_rate_per_sm_GBps")
    if fixed is None or rate is None:
        return None
    return fixed + (np.asarray(V, dtype=float) / K) / (rate * GBPS_TO_BYTES_PER_US)


def capacity_for_K(model: dict, K: int) -> float | None:
    """Q fitted for this K when the fitter gave one, else the pooled Q."""
    for entry in model.get("per_K", []):
        if entry.get("K") == K:
            q = (entry.get("Q_bytes") or {}).get("value")
            if q is not None:
                return float(q)
    return param(model, "Q_bytes")


WINDOW_VARIANT = "per_producer_Q"


def window_model(model: dict) -> dict | None:
    """The per-producer-window fit (Q = K*q) as a model with its own params, when fitted."""
    variant = (model.get("variants") or {}).get(WINDOW_VARIANT)
    if not variant or (variant["params"].get("q_bytes") or {}).get("value") is None:
        return None
    return {"params": variant["params"]}


def fitted_to_aligned(model: dict) -> bool:
    """Were the periodic laws fitted to aligned (barrier) records rather than free ones?"""
    return (model.get("fit_set") or {}).get("periodic") == "aligned"


def peer_ceilings(model: dict) -> dict[str, float]:
    """Horizontal references for rates (GB/s): the run's peer ceilings and the line rate."""
    ceilings = model.get("ceilings") or {}
    refs = {
        f"{method.replace('_', '-')} peer ceiling": float(v)
        for method, v in (ceilings.get("peer_GBps") or {}).items()
    }
    if ceilings.get("nvlink_line_rate_GBps"):
        refs["NVLink line rate (spec)"] = float(ceilings["nvlink_line_rate_GBps"])
    return refs


# Aligned (barrier) records are drawn filled, free-running ones hollow.
SYNC_LABEL = {"barrier": "aligned (grid barrier before each burst)", "free": "free-running"}


def marker_fill(sync: str, color) -> dict:
    """Marker face for a sync mode: filled for barrier, hollow for free."""
    return {"markerfacecolor": color if sync == "barrier" else "none", "markeredgecolor": color}


# ---------------------------------------------------------------- shared data derivations

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
    if "local_control" in (point.get("schedule"), point.get("variant")):
        return "local_control"
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
            "expert_wave and interleaved records (variant absent or 'ours')"
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
    ok = df[(df["status"] == "ok") & df["schedule"].isin(["expert_wave", "interleaved"])]
    if ok.empty or "time_us_median" not in ok.columns:
        times = pd.DataFrame(columns=[*keys, "expert_wave", "interleaved"]).set_index(keys)
    else:
        times = ok.pivot_table(
            index=keys, columns="schedule", values="time_us_median", aggfunc="first"
        )
    for schedule in ("expert_wave", "interleaved"):
        if schedule not in times.columns:
            times[schedule] = np.nan
    times = times.rename(columns={"expert_wave": "wave_us", "interleaved": "interleaved_us"})
    times["speedup"] = times["wave_us"] / times["interleaved_us"]
    configs = df[keys].drop_duplicates().set_index(keys).index
    times = times.reindex(configs)
    complete = times[times["speedup"].notna()].reset_index()
    incomplete = times[times["speedup"].isna()].reset_index()
    return complete[[*keys, "wave_us", "interleaved_us", "speedup"]], incomplete[keys]


BASELINE_COLUMNS = (
    "ours_best_us",
    "unfused_us",
    "deepgemm_wave_us",
    "deepgemm_lag_us",
    "deepgemm_best_us",
    "ours_over_unfused",
    "ours_over_deepgemm",
    "ours_speedup",
    "deepgemm_lag_speedup",
)


def megamoe_baselines(doc: dict) -> pd.DataFrame:
    """Per configuration with an ok time of ours: our best schedule's time beside the
    baselines' (ok records only). Ratios are times, ours over the baseline's best (below 1:
    ours is faster); speedups are wave time over interleaved (ours) or over L2-lag
    (DeepGEMM) time. Empty when the dataset holds no ok baseline record (the simulator
    writes none)."""
    df = remote_fraction_labels(records_frame(doc))
    if df.empty or "variant" not in df.columns:
        return pd.DataFrame(columns=[*MEGAMOE_CONFIG_COLUMNS, *BASELINE_COLUMNS])
    keys = [c for c in MEGAMOE_CONFIG_COLUMNS if c in df.columns]
    ok = df[(df["status"] == "ok") & df["time_us_median"].notna()].copy()
    if not ok["variant"].isin(["unfused", "deepgemm"]).any():
        return pd.DataFrame(columns=[*keys, *BASELINE_COLUMNS])
    ok["series"] = ok["variant"].fillna("ours") + "/" + ok["schedule"]
    wide = ok.pivot_table(index=keys, columns="series", values="time_us_median", aggfunc="first")
    names = {
        "ours/expert_wave": "ours_wave_us",
        "ours/interleaved": "ours_interleaved_us",
        "unfused/unfused": "unfused_us",
        "deepgemm/expert_wave": "deepgemm_wave_us",
        "deepgemm/interleaved": "deepgemm_lag_us",
    }
    wide = wide.rename(columns=names).reindex(columns=list(names.values()))
    out = pd.DataFrame(index=wide.index)
    out["ours_best_us"] = wide[["ours_wave_us", "ours_interleaved_us"]].min(axis=1)
    out["unfused_us"] = wide["unfused_us"]
    out["deepgemm_wave_us"] = wide["deepgemm_wave_us"]
    out["deepgemm_lag_us"] = wide["deepgemm_lag_us"]
    out["deepgemm_best_us"] = wide[["deepgemm_wave_us", "deepgemm_lag_us"]].min(axis=1)
    out["ours_over_unfused"] = out["ours_best_us"] / out["unfused_us"]
    out["ours_over_deepgemm"] = out["ours_best_us"] / out["deepgemm_best_us"]
    out["ours_speedup"] = wide["ours_wave_us"] / wide["ours_interleaved_us"]
    out["deepgemm_lag_speedup"] = wide["deepgemm_wave_us"] / wide["deepgemm_lag_us"]
    out = out[out["ours_best_us"].notna()]
    return out.reset_index()[[*keys, *BASELINE_COLUMNS]]


def serial_over_fused(doc: dict) -> pd.DataFrame:
    """Per (backend, world_size, heads, seq_len): serial and fused times and their ratio, for
    both the sender-visible and the completion clock (ok records only)."""
    df = records_frame(doc)
    if df.empty:
        return df
    ok = df[(df["status"] == "ok") & df["mode"].isin(["serial", "fused"])]
    keys = [k for k in ("backend", "world_size", "heads", "seq_len") if k in df.columns]
    out = None
    for clock in ("sender", "completion"):
        column = f"{clock}_us_median"
        if column not in ok.columns:
            continue
        wide = ok.pivot_table(index=keys, columns="mode", values=column, aggfunc="first")
        if not {"serial", "fused"} <= set(wide.columns):
            continue
        wide = wide[["serial", "fused"]].rename(
            columns={"serial": f"serial_{clock}_us", "fused": f"fused_{clock}_us"}
        )
        wide[f"speedup_{clock}"] = wide[f"serial_{clock}_us"] / wide[f"fused_{clock}_us"]
        out = wide if out is None else out.join(wide, how="outer")
    if out is None:
        return pd.DataFrame(columns=keys)
    return out.reset_index().sort_values(keys, ignore_index=True)


def fraction_name(fraction: str) -> str:
    """How a remote fraction label reads in a legend."""
    if fraction == "natural":
        return "f natural ((P-1)/P)"
    if float(fraction) == 0:
        return "f = 0 (local-store control)"
    return f"f = {fraction}"


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
    if ("time_us_median", "interleaved") not in wide.columns or (
        "time_us_median",
        "expert_wave",
    ) not in wide.columns:
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
        out["wave_equivalent_tflops"] = achieved.get("expert_wave")
    out["wave_us"] = wide[("time_us_median", "expert_wave")]
    out["interleaved_us"] = wide[("time_us_median", "interleaved")]
    out["speedup"] = out["wave_us"] / out["interleaved_us"]
    out["speedup_low"] = (
        wide[("time_us_ci_low", "expert_wave")] / wide[("time_us_ci_high", "interleaved")]
    )
    out["speedup_high"] = (
        wide[("time_us_ci_high", "expert_wave")] / wide[("time_us_ci_low", "interleaved")]
    )
    return out[out["speedup"].notna()].reset_index()


def emulated_sweep(dataset_dir: Path) -> tuple[dict, pd.DataFrame]:
    """The dataset's emulated MegaMoE document and emulated_speedups of it; NoDataError
    when no point has both schedules ok."""
    doc = raw_doc(dataset_dir, layout.MEGAMOE_EMULATED_RAW)
    speedups = emulated_speedups(doc)
    if speedups.empty:
        raise NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_EMULATED_RAW} has no point with "
            "ok expert_wave and interleaved records"
        )
    return doc, speedups
