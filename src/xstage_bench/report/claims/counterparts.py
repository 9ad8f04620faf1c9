"""Counterpart columns of tab-claims: the same claims answered by another source, each in
its own labelled column beside ours (a simulated what-if, an emulated run).

A counterpart is one more column source: a label, its kind (simulated or emulated), where
its files are (a sibling dataset, or a file of the dataset itself) and how it answers
claims (claim id -> answer function, as in claim_answers; claims it does not answer stay
blank). To add one, append a Counterpart to COUNTERPARTS; where it reads another dataset,
name that dataset in `dataset` so the DAG makes tab-claims depend on its files. An emulated
MegaMoE run in this dataset, for example, would be

    Counterpart("emulated (paper's compute/drain ratio)", "emulated",
                dataset_file("raw/megamoe_emulated.json", "megamoe"),
                {k: claim_answers.MEASURED[k] for k in ("moe.geomean", "moe.max")})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from xstage_bench.data import layout, storepath
from xstage_bench.data.grid import side_arm
from xstage_bench.report.analysis import load, megamoe_emulated
from xstage_bench.report.analysis.speedup_ci import headline_ci
from xstage_bench.report.claims import claim_answers
from xstage_bench.report.claims.claim_answers import AnswerFn
from xstage_bench.report.claims.claim_sources import Sources, as_natural


@dataclass(frozen=True)
class Counterpart:
    column: str  # the column header, e.g. 'sim-b200 (simulated)'
    kind: str  # simulated | emulated
    sources: Callable[[Path], Sources | None]  # this dataset's dir -> its sources, or None
    answers: Mapping[str, AnswerFn]
    dataset: str | None = None  # the sibling dataset it reads, if any (for the DAG)
    # False: shown beside simulated datasets only. A measured dataset's tab-claims holds
    # measured files alone, so a committed reference's is what its committed data give
    # (issue 55), whatever a run simulates.
    beside_measured: bool = True


SMOKE = "-smoke"  # the suffix of a smoke run's datasets (config/smoke.yaml)


def sibling_name(name: str, dataset: str) -> str:
    """The sibling `name` of the same run as `dataset`: a smoke run's datasets are named
    <name>-smoke, and a smoke dataset is compared with the smoke run's sibling."""
    return name + SMOKE if dataset.endswith(SMOKE) else name


def sibling_dataset(name: str, path: str | None = None) -> Callable[[Path], Sources | None]:
    """Sources of results/<name> (of the same run), beside this dataset, on `path` (default
    its primary path); None when it holds no raw data or is this dataset itself (a column
    would only repeat ours)."""

    def sources(dataset_dir: Path) -> Sources | None:
        sibling = sibling_name(name, dataset_dir.name)
        other = dataset_dir.parent / sibling
        if dataset_dir.name == sibling or not (other / "raw").is_dir():
            return None
        return Sources.load(other, path)

    return sources


def other_path(path: str) -> Callable[[Path], Sources | None]:
    """This dataset's sources on `path`, where that is not the path of its own column (a
    dataset measured on both paths answers the claims on each, side by side)."""

    def sources(dataset_dir: Path) -> Sources | None:
        full = Sources.load(dataset_dir)
        if full.path == path or path not in full.measured_paths():
            return None
        return Sources.load(dataset_dir, path)

    return sources


def dataset_file(read: str, field: str) -> Callable[[Path], Sources | None]:
    """Sources holding one raw file of this dataset (an emulated run, say) where the answer
    functions look for that experiment (field: megamoe, trace or attention), beside the
    dataset's fitted model; None when the file is absent. Its DAG input is the dataset's own
    raw files (all_raw in common.smk must list it)."""

    def sources(dataset_dir: Path) -> Sources | None:
        doc = load.optional_raw_doc(dataset_dir, read)
        if doc is None:
            return None
        bare = Sources(dataset_dir, load.optional_model_doc(dataset_dir), None, None, None)
        return replace(bare, **{field: doc})

    return sources


def rehomed(fraction: float) -> Callable[[Path], Sources | None]:
    """This dataset's MegaMoE records whose combine rows were re-homed so that `fraction`
    of them cross NVLink, presented as the natural-routing sweep they stand in for."""

    def sources(dataset_dir: Path) -> Sources | None:
        doc = load.optional_raw_doc(dataset_dir, layout.MEGAMOE_RAW)
        if doc is None:
            return None
        records = as_natural(
            r
            for r in doc["records"]
            if r["point"].get("remote_fraction") == fraction
            and storepath.point_path(r["point"]) == storepath.PEER
            and not side_arm(r["point"])
        )
        if not records:
            return None
        bare = Sources(dataset_dir, None, None, None, None)
        return replace(bare, megamoe={**doc, "records": records})

    return sources


def emulated_at_top_rate(
    src: Sources, fraction: float = 7 / 8
) -> tuple[pd.DataFrame, str] | claim_answers.NotMeasured:
    """The emulated sweep's speedups at its highest rate, f = 7/8 (an 8-GPU node's share),
    one row per shape (with its CI and samples), and a note with the rate the kernel
    achieved there."""
    speedups = megamoe_emulated.emulated_speedups(src.megamoe)
    if "path" in speedups.columns:
        speedups = speedups[speedups["path"] == storepath.PEER]
    if speedups.empty:
        return claim_answers.NotMeasured("no emulated point on the peer path")
    top = speedups[
        (speedups["remote_fraction"] == f"{fraction:g}")
        & (speedups["emulated_tflops"] == speedups["emulated_tflops"].max())
    ]
    if top.empty:
        return claim_answers.NotMeasured(f"no emulated point with remote fraction {fraction:g}")
    achieved = top.get("wave_equivalent_tflops")
    note = f"nominal X = {top['emulated_tflops'].iloc[0]:g} TFLOP/s, f = {fraction:g}"
    if achieved is not None:
        note += f", achieved {achieved.min():.0f}-{achieved.max():.0f} TFLOP/s"
    return top, note + f" ({', '.join(top['shape'])})"


def _emulated_stat(stat: str) -> claim_answers.AnswerFn:
    """The geomean over the shapes at the top rate with its two-level bootstrap CI, or the
    largest with its own point's CI (layer time, as tab-megamoe reads our sweep)."""

    def answer(src: Sources) -> claim_answers.Found:
        found = emulated_at_top_rate(src)
        if isinstance(found, claim_answers.NotMeasured):
            return found
        top, note = found
        if stat == "geomean":
            value, low, high = headline_ci(list(top["samples"]), "geomean")
        else:
            best = top.loc[top["speedup"].idxmax()]
            value, low, high = best["speedup"], best["speedup_ci_low"], best["speedup_ci_high"]
        return claim_answers.answer_of(src, (value,), ((low, high),), ".3f", note)

    return answer


# Our kernel with 7/8 of the combine rows re-homed across NVLink (megamoe.remote_fractions):
# an 8-GPU node's per-GPU combine traffic, measured on this one.
REHOMED = Counterpart(
    column="7/8 of rows re-homed (measured)",
    kind="measured, re-homed",
    sources=rehomed(0.875),
    answers={
        k: claim_answers.MEASURED[k] for k in ("moe.geomean", "moe.median", "moe.min", "moe.max")
    },
)

# The compute-emulated kernel (megamoe/emulated.py) at its highest rate and f = 7/8.
EMULATED = Counterpart(
    column="emulated compute, top rate, f=7/8",
    kind="emulated",
    sources=dataset_file(layout.MEGAMOE_EMULATED_RAW, "megamoe"),
    answers={"moe.geomean": _emulated_stat("geomean"), "moe.max": _emulated_stat("max")},
)

# The paper's node as simulated: B200 parameters at P=8 (config/hardware/b200.yaml).
SIM_B200 = Counterpart(
    column="sim-b200 (simulated)",
    kind="simulated",
    sources=sibling_dataset("sim-b200"),
    answers=claim_answers.SIMULATED,
    dataset="sim-b200",
    beside_measured=False,
)

# A dataset measured on both paths: its host path's answers beside its peer path's.
HOST_PATH = Counterpart(
    column="host path (measured, this dataset)",
    kind="measured on the host store path",
    sources=other_path(storepath.HOST),
    answers=claim_answers.MEASURED,
)

# The committed references beside each other: the peer path on 2x H200 and the host path
# on 1x H200 answer the same claims.
REF_PEER = Counterpart(
    column="ref-h200x2 (peer path, 2x H200)",
    kind="measured (another committed dataset)",
    sources=sibling_dataset("ref-h200x2", storepath.PEER),
    answers=claim_answers.MEASURED,
    dataset="ref-h200x2",
)
REF_HOST = Counterpart(
    column="ref-h200x1 (host path, 1x H200)",
    kind="measured (another committed dataset)",
    sources=sibling_dataset("ref-h200x1", storepath.HOST),
    answers=claim_answers.MEASURED,
    dataset="ref-h200x1",
)

COUNTERPARTS: tuple[Counterpart, ...] = (REHOMED, EMULATED, HOST_PATH, REF_PEER, REF_HOST, SIM_B200)


def shown_beside(
    simulated: bool, among: tuple[Counterpart, ...] = COUNTERPARTS
) -> tuple[Counterpart, ...]:
    """The counterparts a dataset's tab-claims shows: beside a measured one, measured ones."""
    return tuple(c for c in among if simulated or c.beside_measured)


def datasets_read(dataset: str, simulated: bool) -> list[str]:
    """Sibling datasets some counterpart reads for `dataset` (the DAG adds their files to
    its tab-claims)."""
    return [sibling_name(c.dataset, dataset) for c in shown_beside(simulated) if c.dataset]
