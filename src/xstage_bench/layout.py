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
# Our kernel measured again with one process per GPU (megamoe/distributed.py), to compare
# with MEGAMOE_RAW's single process; made only where measured_experiments asks for it.
MEGAMOE_PER_GPU_RAW = "raw/megamoe_per_gpu.json"
ATTENTION_RAW = "raw/attention.json"
# The compute-emulated MegaMoE sweep (megamoe/emulated.py): measured on GPUs with each
# tile's MMA replaced by a calibrated wait; made only where measured_experiments asks.
MEGAMOE_EMULATED_RAW = "raw/megamoe_emulated.json"


@dataclass(frozen=True)
class Product:
    """One figure or table: its id, the stage its data comes from, and what it reads.

    Its caption, for `snakemake --report`, is workflow/report/<name>.rst.
    """

    name: str
    stage: str  # microbench | model | megamoe | megamoe_per_gpu | attention | all
    reads: tuple[str, ...]  # dataset-relative paths (microbench studies as "microbench:<study>")
    optional: tuple[str, ...] = ()  # reads the product uses when the dataset has them


def _mb(*studies: str) -> tuple[str, ...]:
    return tuple(f"microbench:{s}" for s in studies)


FIGURES = (
    Product(
        "fig-issue-vs-gap",
        "microbench",
        _mb("gap_sweep", "gap_sweep_barrier") + (MODEL_JSON,),
        optional=_mb("gap_sweep_barrier"),
    ),
    Product(
        "fig-drain",
        "microbench",
        _mb("drain") + (MODEL_JSON,),
    ),
    Product(
        "fig-isolated",
        "microbench",
        _mb("isolated") + (MODEL_JSON,),
    ),
    Product(
        "fig-backpressure-map",
        "microbench",
        _mb("gap_sweep", "gap_sweep_barrier") + (MODEL_JSON,),
        optional=_mb("gap_sweep_barrier"),
    ),
    Product(
        "fig-model-validation",
        "model",
        (MODEL_JSON,),
    ),
    Product(
        "fig-megamoe-speedup",
        "megamoe",
        (MEGAMOE_RAW,),
    ),
    Product(
        "fig-megamoe-timeline",
        "megamoe",
        (MEGAMOE_TRACE_RAW,),
    ),
    Product(
        "fig-store-span-cdf",
        "megamoe",
        (MEGAMOE_TRACE_RAW,),
    ),
    Product(
        "fig-ulysses",
        "attention",
        (ATTENTION_RAW,),
    ),
    Product(
        "fig-megamoe-crossover",
        "megamoe_emulated",
        (MEGAMOE_EMULATED_RAW, MODEL_JSON),
        optional=(MODEL_JSON,),
    ),
)

TABLES = (
    Product(
        "tab-burst-gap-params",
        "model",
        (MODEL_JSON,),
    ),
    Product(
        "tab-megamoe",
        "megamoe",
        (MEGAMOE_RAW,),
    ),
    Product(
        "tab-ulysses",
        "attention",
        (ATTENTION_RAW,),
    ),
    Product(
        "tab-process-model",
        "megamoe_per_gpu",
        (MEGAMOE_RAW, MEGAMOE_PER_GPU_RAW),
    ),
    Product(
        "tab-megamoe-crossover",
        "megamoe_emulated",
        (MEGAMOE_EMULATED_RAW, MODEL_JSON),
        optional=(MODEL_JSON,),
    ),
    Product(
        "tab-claims",
        "all",
        (MODEL_JSON, MEGAMOE_RAW, ATTENTION_RAW),
    ),
    Product(
        "tab-noise",
        "all",
        (),
    ),
)

PRODUCTS = {p.name: p for p in FIGURES + TABLES}


def resolve(dataset_dir: Path, read: str) -> Path:
    """A dataset-relative read ('microbench:<study>' or a path) as a path."""
    if read.startswith("microbench:"):
        return dataset_dir / microbench_raw(read.split(":", 1)[1])
    return dataset_dir / read


def is_simulated_dataset(name: str) -> bool:
    return name.startswith("sim-")
