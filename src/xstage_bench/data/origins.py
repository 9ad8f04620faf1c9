"""How each dataset was made, read from its raw files: measured on which GPUs (the
environment block) or simulated from which hardware profile.

The report's summary page lists it per dataset; `check_listing` is the committed record
that a reference dataset's raw files were read back valid (rule check_reference).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from xstage_bench.data import layout
from xstage_bench.data.results import read_raw


@dataclass(frozen=True)
class RawFile:
    path: str  # relative to the dataset
    experiment: str
    backend: str
    records: int
    ok: int
    sha256: str
    environment: dict


def read_file(dataset_dir: Path, path: Path, reference: bool = False) -> RawFile:
    """A raw file read back through the schema (a malformed one raises, naming it);
    `reference`: the dataset is a reference, measured whatever its file says."""
    doc = read_raw(path, dataset_dir.name if reference else None)
    return RawFile(
        path=str(path.relative_to(dataset_dir)),
        experiment=doc["experiment"],
        backend=doc["backend"],
        records=len(doc["records"]),
        ok=sum(r["status"] == "ok" for r in doc["records"]),
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        environment=doc["environment"],
    )


def check_listing(dataset_dir: Path) -> str:
    """One line per raw file of a reference dataset: path, experiment, backend, ok/total
    records, sha256 prefix."""
    dataset_dir = Path(dataset_dir)
    lines = [f"# {dataset_dir.name}: raw files read back valid against the raw schema"]
    for path in layout.raw_files(dataset_dir):
        f = read_file(dataset_dir, path, reference=True)
        lines.append(
            f"{f.path}\t{f.experiment}\t{f.backend}\t{f.ok}/{f.records} ok\tsha256 {f.sha256[:16]}"
        )
    return "\n".join(lines) + "\n"


def changed_since_check(dataset_dir: Path, listing: str) -> list[str]:
    """The raw files of a dataset that are not what its check_listing read (another
    sha256, new, or gone), relative to the dataset: [] when its products were made from
    what it holds now."""
    dataset_dir = Path(dataset_dir)
    checked = {}
    for line in listing.splitlines():
        fields = line.split("\t")
        if not line.startswith("#") and fields[-1].startswith("sha256 "):
            checked[fields[0]] = fields[-1].removeprefix("sha256 ")
    now = {str(p.relative_to(dataset_dir)): p for p in layout.raw_files(dataset_dir)}
    changed = [
        rel
        for rel, path in now.items()
        if not hashlib.sha256(path.read_bytes()).hexdigest().startswith(checked.get(rel, "-"))
    ]
    return sorted(changed + [rel for rel in checked if rel not in now])


@dataclass(frozen=True)
class DatasetProvenance:
    name: str
    kind: str  # measured | simulated
    made: str  # 'measured on 2x NVIDIA H200 (driver ..., CUDA ...)' or 'simulated from ...'
    when: str  # first start to last end of its raw files
    code: str  # git sha(s) of the harness, dirty flagged
    experiments: list[str]  # 'megamoe (252 records, 168 ok)'


def _gpus(environment: dict) -> str:
    gpus = Counter(g["name"] for g in environment.get("gpus", []))
    return ", ".join(f"{n}x {name}" for name, n in gpus.items()) or "GPUs not recorded"


def _made(environment: dict, profile_path: str | None) -> tuple[str, str]:
    profile = environment.get("hardware_profile")
    if environment.get("simulated") or profile:
        name = (profile or {}).get("name", "?")
        where = f" ({profile_path})" if profile_path else ""
        source = (profile or {}).get("source")
        detail = f"; the profile's source: {source}" if source else ""
        return "simulated", f"simulated from the hardware profile '{name}'{where}{detail}"
    packages = environment.get("packages") or {}
    versions = ", ".join(
        f"{k} {v}"
        for k, v in (
            ("driver", environment.get("driver")),
            ("CUDA", environment.get("cuda")),
            ("torch", packages.get("torch")),
        )
        if v
    )
    host = environment.get("host")
    return "measured", f"measured on {_gpus(environment)}" + (
        f" ({versions}; host {host})" if versions or host else ""
    )


def _sha(git: dict) -> str:
    sha = (git.get("sha") or "not recorded")[:10]
    return sha + (" (dirty)" if git.get("dirty") else "")


def describe(dataset_dir: Path, profile_path: str | None = None) -> DatasetProvenance:
    """How a dataset was made, from every raw file's environment block."""
    dataset_dir = Path(dataset_dir)
    files = [read_file(dataset_dir, p) for p in layout.raw_files(dataset_dir)]
    if not files:
        return DatasetProvenance(dataset_dir.name, "unknown", "no raw files", "", "", [])
    kind, made = _made(files[0].environment, profile_path)
    starts = sorted(f.environment.get("started_at", "") for f in files)
    ends = sorted(f.environment.get("finished_at", "") for f in files)
    shas = sorted({_sha(f.environment.get("git") or {}) for f in files})
    experiments: Counter[str] = Counter()
    ok: Counter[str] = Counter()
    for f in files:
        experiments[f.experiment] += f.records
        ok[f.experiment] += f.ok
    return DatasetProvenance(
        name=dataset_dir.name,
        kind=kind,
        made=made,
        when=f"{starts[0][:16]} to {ends[-1][:16]}".replace("T", " "),
        code=", ".join(shas),
        experiments=[f"{e} ({experiments[e]} records, {ok[e]} ok)" for e in sorted(experiments)],
    )
