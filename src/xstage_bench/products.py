"""Every figure and table, declared once: its name and what it reads.

A product reads raw microbench studies ("microbench:<study>"), raw experiment files
(layout.EXPERIMENT_FILES), the fitted model (layout.MODEL_JSON, MODEL_PROFILE), every
raw file of the dataset (layout.ALL_RAW), and, for tab-claims, files of the datasets shown
beside this one (`counterpart_reads`). From this one declaration come the Snakemake rules
and their inputs (figures.smk, common.smk), which products a dataset gets (`Holding`),
and the renderer of each product (render.py: the module named after it, `renderer`).
tests/test_declared_reads.py checks each renderer opens only what its product declares.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from xstage_bench import layout
from xstage_bench.layout import (
    ALL_RAW,
    ATTENTION_RAW,
    MEGAMOE_EMULATED_RAW,
    MEGAMOE_PER_GPU_RAW,
    MEGAMOE_RAW,
    MEGAMOE_TRACE_RAW,
    MODEL_JSON,
    MODEL_PROFILE,
)

MICROBENCH = "microbench"
MODEL_FILES = (MODEL_JSON, MODEL_PROFILE)  # one rule fits both from the microbench studies


@dataclass(frozen=True)
class Product:
    """One figure or table: its id and every file its renderer opens, dataset-relative.

    Its caption, for `snakemake --report`, is workflow/report/<name>.rst; its renderer is
    `plot` (a figure) or `build` (a table) of the module `renderer` names.
    """

    name: str  # fig-<what> or tab-<what>
    reads: tuple[str, ...]
    optional: tuple[str, ...] = ()  # reads the product uses when the dataset has them
    # reads of each dataset shown beside this one (tables.counterparts.datasets_read)
    counterpart_reads: tuple[str, ...] = ()

    @property
    def is_figure(self) -> bool:
        return self.name.startswith("fig-")

    @property
    def folder(self) -> str:
        return "figures" if self.is_figure else "tables"

    @property
    def formats(self) -> tuple[str, str]:
        """(main, companion) file extension: PDF and PNG, or CSV and Markdown."""
        return ("pdf", "png") if self.is_figure else ("csv", "md")

    @property
    def rule(self) -> str:
        """Its Snakemake rule: figure_fig_drain, table_tab_claims."""
        return f"{self.folder[:-1]}_{self.name.replace('-', '_')}"

    @property
    def renderer(self) -> str:
        """The module that renders it: xstage_bench.figures.drain for fig-drain."""
        return f"xstage_bench.{self.folder}.{self.name.split('-', 1)[1].replace('-', '_')}"

    def output(self, dataset_dir: Path, companion: bool = False) -> Path:
        ext = self.formats[1 if companion else 0]
        return Path(dataset_dir) / self.folder / f"{self.name}.{ext}"

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(r for r in self.reads if r not in self.optional)


def _mb(*studies: str) -> tuple[str, ...]:
    return tuple(f"microbench:{s}" for s in studies)


FIGURES = (
    Product(
        "fig-issue-vs-gap",
        _mb("gap_sweep", "gap_sweep_barrier") + (MODEL_JSON,),
        optional=_mb("gap_sweep_barrier"),
    ),
    Product("fig-drain", _mb("drain") + (MODEL_JSON,)),
    Product("fig-isolated", _mb("isolated") + (MODEL_JSON,)),
    Product(
        "fig-backpressure-map",
        _mb("gap_sweep", "gap_sweep_barrier") + (MODEL_JSON,),
        optional=_mb("gap_sweep_barrier"),
    ),
    Product("fig-model-validation", (MODEL_JSON,)),
    Product("fig-megamoe-speedup", (MEGAMOE_RAW,)),
    Product("fig-megamoe-timeline", (MEGAMOE_TRACE_RAW,)),
    Product("fig-store-span-cdf", (MEGAMOE_TRACE_RAW,)),
    Product(
        "fig-ulysses",
        (ATTENTION_RAW, MODEL_JSON),  # the model's completion-coupled line, where there is one
        optional=(MODEL_JSON,),
    ),
    Product(
        "fig-megamoe-crossover",
        (MEGAMOE_EMULATED_RAW, MODEL_JSON),
        optional=(MODEL_JSON,),
    ),
)

_CLAIMS_READS = (MODEL_JSON, MEGAMOE_RAW, MEGAMOE_TRACE_RAW, MEGAMOE_EMULATED_RAW, ATTENTION_RAW)

TABLES = (
    Product("tab-burst-gap-params", (MODEL_JSON,)),
    Product("tab-megamoe", (MEGAMOE_RAW,)),
    Product("tab-ulysses", (ATTENTION_RAW,)),
    Product("tab-process-model", (MEGAMOE_RAW, MEGAMOE_PER_GPU_RAW)),
    Product(
        "tab-megamoe-crossover",
        (MEGAMOE_EMULATED_RAW, MODEL_JSON, MODEL_PROFILE),
        optional=(MODEL_JSON, MODEL_PROFILE),
    ),
    Product(
        "tab-claims",
        _CLAIMS_READS,
        optional=_CLAIMS_READS,  # each claim is answered from what the dataset has
        counterpart_reads=(ALL_RAW, MODEL_JSON),
    ),
    Product("tab-noise", (ALL_RAW,)),
)

PRODUCTS = {p.name: p for p in FIGURES + TABLES}


def made_from(read: str) -> str:
    """The experiment whose raw files make a read (the model is fitted from microbench)."""
    if read.startswith("microbench:") or read in MODEL_FILES:
        return MICROBENCH
    for experiment, files in layout.EXPERIMENT_FILES.items():
        if read in files:
            return experiment
    raise ValueError(f"read '{read}' is made by no experiment (layout.EXPERIMENT_FILES)")


@dataclass(frozen=True)
class Holding:
    """What a dataset holds (or a run will make): its experiments and microbench studies.
    Which products it gets, and their inputs, follow from the products' reads."""

    experiments: frozenset[str]
    studies: tuple[str, ...]

    @classmethod
    def of(cls, experiments: Iterable[str], studies: Iterable[str]) -> Holding:
        return cls(frozenset(experiments), tuple(studies))

    @classmethod
    def on_disk(cls, dataset_dir: Path) -> Holding:
        """What the dataset's final raw files are (an experiment by its first file)."""
        dataset_dir = Path(dataset_dir)
        studies = layout.studies_on_disk(dataset_dir)
        held = {MICROBENCH} if studies else set()
        held |= {
            experiment
            for experiment, files in layout.EXPERIMENT_FILES.items()
            if (dataset_dir / files[0]).exists()
        }
        return cls.of(held, studies)

    def has(self, read: str) -> bool:
        if read == ALL_RAW:
            return bool(self.experiments)
        if read.startswith("microbench:"):
            return read.split(":", 1)[1] in self.studies
        return made_from(read) in self.experiments

    def all_raw(self) -> list[str]:
        """Every raw file, dataset-relative: the studies, then each experiment's files."""
        files = [layout.microbench_raw(s) for s in self.studies]
        for experiment, experiment_files in layout.EXPERIMENT_FILES.items():
            if experiment in self.experiments:
                files += experiment_files
        return files

    def reads(self, reads: tuple[str, ...]) -> list[str]:
        """The reads it has, as dataset-relative paths (ALL_RAW expanded)."""
        paths: list[str] = []
        for read in reads:
            if read == ALL_RAW:
                paths += self.all_raw()
            elif self.has(read):
                paths.append(str(layout.resolve(Path(""), read)))
        return paths

    def gives(self, product: Product) -> bool:
        """A product is made when the dataset has every read it needs, and one at least."""
        return all(self.has(r) for r in product.required) and any(
            self.has(r) for r in product.reads
        )


def counterpart_datasets(dataset: str) -> list[str]:
    """The datasets tab-claims shows beside `dataset` (tables.counterparts)."""
    from xstage_bench.tables import counterparts  # pandas: only a rendering run needs it

    return [d for d in counterparts.datasets_read(dataset) if d != dataset]
