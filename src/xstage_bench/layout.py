"""Where a dataset's files live, and which raw files each figure and table is made from.

The Snakefile builds its rules from these tables, and the figure scripts read the same
paths, so the DAG and the renderers cannot disagree about a figure's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MODEL_JSON = "model/burst_gap.json"
MODEL_PROFILE = "model/profile.yaml"


def microbench_raw(study: str) -> str:
    return f"raw/microbench/{study}.json"


MEGAMOE_RAW = "raw/megamoe.json"
MEGAMOE_TRACE_RAW = "raw/megamoe_trace.json"
ATTENTION_RAW = "raw/attention.json"


@dataclass(frozen=True)
class Product:
    """One figure or table: its id, the stage its data comes from, and what it reads."""

    name: str
    stage: str  # microbench | model | megamoe | attention | all
    reads: tuple[str, ...]  # dataset-relative paths (microbench studies as "microbench:<study>")
    caption: str
    optional: tuple[str, ...] = ()  # reads the product uses when the dataset has them


def _mb(*studies: str) -> tuple[str, ...]:
    return tuple(f"microbench:{s}" for s in studies)


FIGURES = (
    Product(
        "fig-issue-vs-gap",
        "microbench",
        _mb("gap_sweep", "gap_sweep_barrier") + (MODEL_JSON,),
        "Issue time T_iss vs gap G for several burst sizes V, free-running and aligned "
        "(barrier) producers, both T_iss definitions, model lines, local control.",
        optional=_mb("gap_sweep_barrier"),
    ),
    Product(
        "fig-drain",
        "microbench",
        _mb("drain") + (MODEL_JSON,),
        "Period and drain rate vs V at G=0 for K/B splits of the same V, free and aligned, "
        "with the fitted R, the peer ceilings and the NVLink line rate.",
    ),
    Product(
        "fig-isolated",
        "microbench",
        _mb("isolated") + (MODEL_JSON,),
        "Isolated-burst issue time vs V per K; the knee gives the capacity Q (shared Q and "
        "per-producer window fits).",
    ),
    Product(
        "fig-backpressure-map",
        "microbench",
        _mb("gap_sweep", "gap_sweep_barrier") + (MODEL_JSON,),
        "Measured and modelled issue overhead over (V, G) with the model's G* curve, from "
        "the aligned gap sweep where there is one.",
        optional=_mb("gap_sweep_barrier"),
    ),
    Product(
        "fig-model-validation",
        "model",
        (MODEL_JSON,),
        "Predicted vs measured issue times and periods, held-out and free-running points "
        "marked, with the error summaries and the model checks.",
    ),
    Product(
        "fig-megamoe-speedup",
        "megamoe",
        (MEGAMOE_RAW,),
        "Interleaved vs expert-wave speedup over the 84 configurations, sorted and grouped.",
    ),
    Product(
        "fig-megamoe-timeline",
        "megamoe",
        (MEGAMOE_TRACE_RAW,),
        "Per-CTA timeline of Linear-1/Linear-2 tiles and remote-store spans, one config.",
    ),
    Product(
        "fig-store-span-cdf",
        "megamoe",
        (MEGAMOE_TRACE_RAW,),
        "Per-tile remote-store span CDF: expert-wave, interleaved, local-store control.",
    ),
    Product(
        "fig-ulysses",
        "attention",
        (ATTENTION_RAW,),
        "Ulysses attention time vs sequence length: alone, serial, fused, per backend.",
    ),
)

TABLES = (
    Product(
        "tab-burst-gap-params",
        "model",
        (MODEL_JSON,),
        "T0, R, Q with confidence intervals per K, beside the paper's B200 values.",
    ),
    Product(
        "tab-megamoe",
        "megamoe",
        (MEGAMOE_RAW,),
        "Geomean, median, min and max interleaved speedup per group, beside the paper.",
    ),
    Product(
        "tab-ulysses",
        "attention",
        (ATTENTION_RAW,),
        "Fused-over-serial speedups per backend and length, beside the paper's FA3 table.",
    ),
    Product(
        "tab-claims",
        "all",
        (MODEL_JSON, MEGAMOE_RAW, ATTENTION_RAW),
        "Every quantitative claim of the paper, with this dataset's number beside it.",
    ),
    Product(
        "tab-noise",
        "all",
        (),
        "Relative spread of every measured point, and the points above the noise target.",
    ),
)

PRODUCTS = {p.name: p for p in FIGURES + TABLES}


def resolve(dataset_dir: Path, read: str) -> Path:
    """A dataset-relative read ('microbench:<study>' or a path) as a path."""
    if read.startswith("microbench:"):
        return dataset_dir / microbench_raw(read.split(":", 1)[1])
    return dataset_dir / read


def figure_path(dataset_dir: Path, name: str, ext: str = "pdf") -> Path:
    return dataset_dir / "figures" / f"{name}.{ext}"


def table_path(dataset_dir: Path, name: str, ext: str = "csv") -> Path:
    return dataset_dir / "tables" / f"{name}.{ext}"


def is_simulated_dataset(name: str) -> bool:
    return name.startswith("sim-")
