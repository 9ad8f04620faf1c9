"""Where a dataset's files live, and which raw files each figure and table is made from.

The Snakefile builds its rules from these tables, and the figure scripts read the same
paths, so the DAG and the renderers cannot disagree about a figure's inputs.
"""

from __future__ import annotations

import re
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
EXPERIMENT_RAW = (
    MEGAMOE_RAW,
    MEGAMOE_TRACE_RAW,
    MEGAMOE_PER_GPU_RAW,
    MEGAMOE_EMULATED_RAW,
    ATTENTION_RAW,
)
ALL_RAW = "raw:*"  # a read of every final raw file the dataset has (tab-noise)
STUDY_NAME = re.compile(r"[a-z0-9_]+")  # as config.schema.json's microbench study names


@dataclass(frozen=True)
class Product:
    """One figure or table: its id, the stage its data comes from, and what it reads.

    Its caption, for `snakemake --report`, is workflow/report/<name>.rst.
    """

    name: str
    stage: str  # microbench | model | megamoe | megamoe_per_gpu | attention | all
    # Every file the renderer opens, dataset-relative (microbench studies as
    # "microbench:<study>", ALL_RAW for every raw file); the DAG makes the rule's inputs
    # from it, and tests/test_declared_reads.py checks it against what the renderer opens.
    reads: tuple[str, ...]
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
        (ATTENTION_RAW, MODEL_JSON),  # the model's completion-coupled line, where there is one
        optional=(MODEL_JSON,),
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
        (MEGAMOE_EMULATED_RAW, MODEL_JSON, MODEL_PROFILE),
        optional=(MODEL_JSON, MODEL_PROFILE),
    ),
    Product(
        "tab-claims",
        "all",
        (MODEL_JSON, MEGAMOE_RAW, MEGAMOE_TRACE_RAW, MEGAMOE_EMULATED_RAW, ATTENTION_RAW),
        optional=(MODEL_JSON, MEGAMOE_RAW, MEGAMOE_TRACE_RAW, MEGAMOE_EMULATED_RAW, ATTENTION_RAW),
    ),
    Product(
        "tab-noise",
        "all",
        (ALL_RAW,),
    ),
)

PRODUCTS = {p.name: p for p in FIGURES + TABLES}


def resolve(dataset_dir: Path, read: str) -> Path:
    """A dataset-relative read ('microbench:<study>' or a path) as a path."""
    if read.startswith("microbench:"):
        return dataset_dir / microbench_raw(read.split(":", 1)[1])
    return dataset_dir / read


def studies_on_disk(dataset_dir: Path) -> list[str]:
    """Microbench studies with a final raw file. Resume state (<study>.json.partial.json)
    and any other stray name are not studies."""
    return sorted(
        p.stem
        for p in (Path(dataset_dir) / "raw" / "microbench").glob("*.json")
        if STUDY_NAME.fullmatch(p.stem)
    )


def raw_files(dataset_dir: Path) -> list[Path]:
    """Every final raw file the dataset has: what ALL_RAW reads."""
    dataset_dir = Path(dataset_dir)
    files = [dataset_dir / microbench_raw(s) for s in studies_on_disk(dataset_dir)]
    files += [dataset_dir / f for f in EXPERIMENT_RAW if (dataset_dir / f).exists()]
    return sorted(files)


def declared_reads(product: Product, dataset_dir: Path) -> list[str]:
    """A product's reads for a dataset on disk, ALL_RAW expanded into paths."""
    reads = []
    for read in product.reads:
        if read == ALL_RAW:
            reads += [str(p.relative_to(dataset_dir)) for p in raw_files(dataset_dir)]
        else:
            reads.append(read)
    return reads


def is_simulated_dataset(name: str) -> bool:
    return name.startswith("sim-")
