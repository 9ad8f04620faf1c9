"""Which of a dataset's files and records the claims of the paper are answered from: one
store path (the dataset's primary one, or one asked for), and per experiment the one
setting its claims speak for (MegaMoE on the host path: one host share; Ulysses: the
largest P held). claim_answers' answer functions read these Sources.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from xstage_bench.data import layout, storepath
from xstage_bench.data.grid import side_arm
from xstage_bench.model.document import fitted_paths, path_fit
from xstage_bench.model.document import primary_path as primary_fit_path
from xstage_bench.report.analysis import labels, load


@dataclass(frozen=True)
class Sources:
    """The dataset's files that claims are computed from, for ONE store path and one
    setting per experiment (`on_path`); None where absent. `path` is the store path the
    answers speak for; `settings` says, per experiment, which setting its records are."""

    dataset_dir: Path
    model: dict | None
    megamoe: dict | None
    trace: dict | None
    attention: dict | None
    path: str = storepath.PEER
    settings: dict = field(default_factory=dict)
    # MegaMoE records where the baselines run (claims_baseline_records): what the claims
    # on a baseline (over unfused, the completion-coupled ceiling) pair ours with.
    baselines: dict | None = None
    # Every MegaMoE record on the path, the lead map's with the main grid's (its arms are
    # compared with the main grid's expert waves): what the lead rule's verdicts read.
    lead_map: dict | None = None

    @classmethod
    def load(cls, dataset_dir: Path, path: str | None = None) -> Sources:
        """The dataset's sources on `path` (default: its primary path, `primary_path`)."""
        full = cls(
            dataset_dir=dataset_dir,
            model=load.optional_model_doc(dataset_dir),
            megamoe=load.optional_raw_doc(dataset_dir, layout.MEGAMOE_RAW),
            trace=load.optional_raw_doc(dataset_dir, layout.MEGAMOE_TRACE_RAW),
            attention=load.optional_raw_doc(dataset_dir, layout.ATTENTION_RAW),
        )
        return full.on_path(path or full.primary_path())

    def measured_paths(self) -> list[str]:
        """The store paths the dataset holds (its model's, then its records'), peer first."""
        found = set(fitted_paths(self.model)) if self.model is not None else set()
        for doc in (self.megamoe, self.attention):
            for r in (doc or {}).get("records", []):
                found.add(storepath.point_path(r["point"]))
        return [p for p in storepath.PATHS if p in found]

    def primary_path(self) -> str:
        """The path a dataset's claims speak for: the peer path where it has one (the
        paper's), else the host path."""
        return (self.measured_paths() or [storepath.PEER])[0]

    def on_path(self, path: str) -> Sources:
        """These sources restricted to `path`: the model's fit of it, and per experiment the
        one setting its claims speak for (claims_moe_records, claims_attention_records)."""
        model = self.model
        if model is not None and path in fitted_paths(model):
            model = path_fit(model, path)
        elif model is not None and path != primary_fit_path(model):
            model = None
        settings: dict = {}
        megamoe_doc = _with_records(self.megamoe, claims_moe_records, path, settings)
        baselines = _with_records(self.megamoe, claims_baseline_records, path, settings)
        lead_map = _with_records(self.megamoe, _on, path, {})
        trace = _with_records(self.trace, _on, path, {})
        attention_doc = _with_records(self.attention, claims_attention_records, path, settings)
        return replace(
            self,
            model=model,
            megamoe=megamoe_doc,
            baselines=baselines,
            lead_map=lead_map,
            trace=trace,
            attention=attention_doc,
            path=path,
            settings=settings,
        )

    @property
    def backend(self) -> str | None:
        for doc in (self.megamoe, self.attention, self.trace, self.model):
            if doc is not None:
                return doc["backend"]
        return None

    @property
    def cpu_test(self) -> bool:
        """Written by a CPU test of the measuring rules: it answers no claim."""
        return labels.is_cpu_test(self.environment())

    @property
    def simulated(self) -> bool:
        return labels.is_simulated(self.dataset_dir, self.backend)

    def environment(self) -> dict | None:
        for doc in (self.megamoe, self.attention, self.trace):
            if doc is not None:
                return doc["environment"]
        if self.model is not None:
            return load.model_environment(self.dataset_dir, self.model)
        return None


def _on(records: list[dict], path: str, settings: dict) -> list[dict]:
    return [r for r in records if storepath.point_path(r["point"]) == path]


def _with_records(doc: dict | None, pick, path: str, settings: dict) -> dict | None:
    return None if doc is None else {**doc, "records": pick(doc["records"], path, settings)}


def claims_host_share(records: list[dict]) -> float | None:
    """The host share f whose MegaMoE records answer the claims on the host path: the main
    grid's smallest share above 0 (f = 0 is the local control; the reference config picks
    its share near the Linear-2 phase's crossover, f* = R I / X)."""
    shares = {
        float(r["point"]["remote_fraction"])
        for r in records
        if not side_arm(r["point"]) and "remote_fraction" in r["point"]
    }
    shares.discard(0.0)
    return min(shares) if shares else None


def as_natural(records: Iterable[dict]) -> list[dict]:
    """Records of one remote fraction presented as the natural-routing sweep they stand in
    for (their remote_fraction left out; the caller names the setting)."""
    return [
        {**r, "point": {k: v for k, v in r["point"].items() if k != "remote_fraction"}}
        for r in records
    ]


def claims_moe_records(records: list[dict], path: str, settings: dict) -> list[dict]:
    """The MegaMoE records the claims read on `path`, the lead map left out. On the host
    path: the records at `claims_host_share`, presented as the natural-routing sweep the
    claims read (their share goes into `settings`)."""
    mine = [r for r in _on(records, path, settings) if not side_arm(r["point"])]
    if path != storepath.HOST:
        return mine
    share = claims_host_share(mine)
    if share is None:
        return []
    settings["megamoe"] = f"host path, f = {share:g} of the combine rows to host memory"
    return as_natural(r for r in mine if float(r["point"].get("remote_fraction", -1)) == share)


def claims_baseline_records(records: list[dict], path: str, settings: dict) -> list[dict]:
    """The MegaMoE records where the baselines run (megamoe.points): on the peer path the
    claims' own records; on the host path its f = 0 control (nothing goes to the host
    there, the problem a baseline computes), presented as natural routing."""
    mine = [r for r in _on(records, path, settings) if not side_arm(r["point"])]
    if path != storepath.HOST:
        return mine
    return as_natural(r for r in mine if float(r["point"].get("remote_fraction", -1)) == 0.0)


def attention_ranks(point: dict) -> int:
    """The P of a Ulysses point: the node it stands for (emulated or real)."""
    return int(point.get("emulated_world_size") or point["world_size"])


def claims_attention_records(records: list[dict], path: str, settings: dict) -> list[dict]:
    """The attention records the claims read on `path`: the one setting nearest the
    paper's 8 GPUs (the largest P held), said in `settings`."""
    mine = _on(records, path, settings)
    if not mine:
        return []
    P = max(attention_ranks(r["point"]) for r in mine)
    chosen = [r for r in mine if attention_ranks(r["point"]) == P]
    gpus = int(chosen[0]["point"]["world_size"])
    emulated = any("emulated_world_size" in r["point"] for r in chosen)
    settings["attention"] = f"{path} path, P={P}" + (
        f" emulated on {gpus} GPU{'s' if gpus > 1 else ''}" if emulated else ""
    )
    return chosen
