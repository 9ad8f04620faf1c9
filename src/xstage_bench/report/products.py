"""Every figure and table, declared once: its name and what it reads.

A product reads raw microbench studies ("microbench:<study>"), raw experiment files
(layout.EXPERIMENT_FILES), the fitted model (layout.MODEL_JSON, MODEL_PROFILE), the MegaMoE
arms played through it (layout.MEGAMOE_PLAYBACK, rule play_megamoe), every
raw file of the dataset (layout.ALL_RAW), and, for tab-claims, files of the datasets shown
beside this one (`counterpart_reads`). From this one declaration come the Snakemake rules
and their inputs (figures.smk, common.smk), which products a dataset gets (`Holding`),
and the renderer of each product (render.py: the module named after it, `renderer`).
tests/test_declared_reads.py checks each renderer opens only what its product declares.

A few products need more than a file: a part of one that not every run measures (the
MegaMoE lead map, `LEAD_SWEEP`). A product names such contents in `needs`; a dataset
holds them when its file on disk has them (`contents_on_disk`) or when this run's config
asks for them (`contents_of_config`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from xstage_bench.data import layout
from xstage_bench.data.layout import (
    ALL_RAW,
    ATTENTION_RAW,
    MEGAMOE_EMULATED_RAW,
    MEGAMOE_PER_GPU_RAW,
    MEGAMOE_PLAYBACK,
    MEGAMOE_RAW,
    MEGAMOE_TRACE_RAW,
    MODEL_JSON,
    MODEL_PROFILE,
)

MICROBENCH = "microbench"
MODEL_FILES = (MODEL_JSON, MODEL_PROFILE)  # one rule fits both from the microbench studies
# raw/megamoe.json's lead map: extra interleaved arms per swept lead (`lead_sweep: true`
# on their points), measured where the config's megamoe section has `lead_sweep`.
LEAD_SWEEP = "megamoe:lead_sweep"
LEAD_SWEEP_KEY = "lead_sweep"


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
    # contents of its reads it needs beyond the files themselves (LEAD_SWEEP)
    needs: tuple[str, ...] = ()

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
        """The module that renders it: xstage_bench.report.figures.drain for fig-drain."""
        return f"xstage_bench.report.{self.folder}.{self.name.split('-', 1)[1].replace('-', '_')}"

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
    Product("fig-next-op", _mb("next_op")),
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
    Product("fig-megamoe-lead", (MEGAMOE_RAW,), needs=(LEAD_SWEEP,)),
    Product("fig-megamoe-playback", (MEGAMOE_RAW, MODEL_JSON, MEGAMOE_PLAYBACK)),
)

_CLAIMS_READS = (MODEL_JSON, MEGAMOE_RAW, MEGAMOE_TRACE_RAW, MEGAMOE_EMULATED_RAW, ATTENTION_RAW)
_CLAIMS_READS += (MEGAMOE_PLAYBACK,)  # the model's verdict on the fused kernel (issue 52)

TABLES = (
    Product("tab-burst-gap-params", (MODEL_JSON,)),
    Product("tab-model-checks", (MODEL_JSON,)),
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
        counterpart_reads=(ALL_RAW, MODEL_JSON, MEGAMOE_PLAYBACK),
    ),
    Product("tab-noise", (ALL_RAW,)),
    Product("tab-megamoe-lead", (MEGAMOE_RAW,), needs=(LEAD_SWEEP,)),
    Product("tab-megamoe-playback", (MEGAMOE_RAW, MODEL_JSON, MEGAMOE_PLAYBACK)),
)

PRODUCTS = {p.name: p for p in FIGURES + TABLES}


def made_from(read: str) -> str:
    """The experiment whose raw files make a read (the model is fitted from microbench; the
    playback is of megamoe's arms, through that model: `Holding.has` asks for both)."""
    if read.startswith("microbench:") or read in MODEL_FILES:
        return MICROBENCH
    if read == MEGAMOE_PLAYBACK:
        return "megamoe"
    for experiment, files in layout.EXPERIMENT_FILES.items():
        if read in files:
            return experiment
    raise ValueError(f"read '{read}' is made by no experiment (layout.EXPERIMENT_FILES)")


@lru_cache(maxsize=64)
def _has_lead_sweep(path: str, mtime_ns: int, size: int) -> bool:
    """Whether a MegaMoE raw file holds lead-sweep records (cached per file version: the
    DAG asks once per product input)."""
    try:
        records = json.loads(Path(path).read_text()).get("records") or []
    except (OSError, ValueError):
        return False  # unreadable: the products that read it say why when they render
    return any((r.get("point") or {}).get("lead_sweep") for r in records)


def contents_on_disk(dataset_dir: Path) -> frozenset[str]:
    """The contents (LEAD_SWEEP) the dataset's raw files on disk hold."""
    path = Path(dataset_dir) / MEGAMOE_RAW
    if not path.exists():
        return frozenset()
    stat = path.stat()
    return (
        frozenset({LEAD_SWEEP})
        if _has_lead_sweep(str(path), stat.st_mtime_ns, stat.st_size)
        else frozenset()
    )


def contents_of_config(config: Mapping, experiments: Iterable[str]) -> frozenset[str]:
    """The contents a run of `config` makes when it measures `experiments`: the lead map
    where it measures megamoe with a `megamoe.lead_sweep` section."""
    megamoe = config.get("megamoe") or {}
    if "megamoe" in set(experiments) and megamoe.get(LEAD_SWEEP_KEY):
        return frozenset({LEAD_SWEEP})
    return frozenset()


@dataclass(frozen=True)
class Holding:
    """What a dataset holds (or a run will make): its experiments, microbench studies and
    the contents of its files some products need (`Product.needs`). Which products it
    gets, and their inputs, follow from the products' reads and needs."""

    experiments: frozenset[str]
    studies: tuple[str, ...]
    contents: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(
        cls, experiments: Iterable[str], studies: Iterable[str], contents: Iterable[str] = ()
    ) -> Holding:
        return cls(frozenset(experiments), tuple(studies), frozenset(contents))

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
        return cls.of(held, studies, contents_on_disk(dataset_dir))

    def has(self, read: str) -> bool:
        if read == ALL_RAW:
            return bool(self.experiments)
        if read.startswith("microbench:"):
            return read.split(":", 1)[1] in self.studies
        if read == MEGAMOE_PLAYBACK:
            return {MICROBENCH, made_from(read)} <= self.experiments
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
        """A product is made when the dataset has every read it needs, and one at least,
        and every content it needs."""
        return (
            all(self.has(r) for r in product.required)
            and any(self.has(r) for r in product.reads)
            and all(c in self.contents for c in product.needs)
        )


def counterpart_datasets(dataset: str, simulated: bool) -> list[str]:
    """The datasets tab-claims shows beside `dataset`, a simulated one or not
    (tables.counterparts)."""
    from xstage_bench.report.claims import counterparts  # pandas: only a rendering run needs it

    return [d for d in counterparts.datasets_read(dataset, simulated) if d != dataset]
