"""What made a raw file: the config section of its experiment, and a hash of it.

A raw file records `config_sha256`, the hash of the section that produced it. The DAG keeps
one stamp per raw file (`results/<dataset>/.config/<name>.json`, the section as JSON).
For a simulated dataset the stamp is rewritten only when the section changes and is an
input of the simulating rule, so a changed section makes the file newer than the raw
output and Snakemake remakes it (an unchanged one leaves it alone). A measured file is
never remade behind the user's back: a changed section stops the run, saying what differs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from xstage_bench import layout
from xstage_bench.results import atomic_write_text

STAMP_DIR = ".config"


def microbench_section(config: dict, study: str) -> dict:
    """What a microbench study's raw file depends on: the shared knobs and that study."""
    mb = config["microbench"]
    return {
        "microbench": {
            **{k: mb[k] for k in ("bursts", "warmup_bursts", "launches", "defaults")},
            "studies": {study: mb["studies"][study]},
        }
    }


def experiment_section(config: dict, experiment: str) -> dict:
    """What a megamoe (and its trace) or attention raw file depends on."""
    return {"world_size": config.get("world_size", "auto"), experiment: config[experiment]}


def sections(config: dict) -> dict[str, dict]:
    """Stamp name -> section, for every raw file a simulated dataset holds."""
    out = {
        f"microbench-{study}": microbench_section(config, study)
        for study in config["microbench"]["studies"]
    }
    out["megamoe"] = experiment_section(config, "megamoe")
    out["attention"] = experiment_section(config, "attention")
    return out


def stamped_files(name: str) -> tuple[str, ...]:
    """The dataset-relative raw files a stamp stands for."""
    if name.startswith("microbench-"):
        return (layout.microbench_raw(name.removeprefix("microbench-")),)
    if name == "megamoe":
        return (layout.MEGAMOE_RAW, layout.MEGAMOE_TRACE_RAW, layout.MEGAMOE_PER_GPU_RAW)
    return (layout.ATTENTION_RAW,)


def section_hash(section: dict) -> str:
    text = json.dumps(section, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def stamp_path(dataset_dir: Path, name: str) -> Path:
    return Path(dataset_dir) / STAMP_DIR / f"{name}.json"


def differences(old: Any, new: Any, key: str = "") -> list[str]:
    """Dotted keys whose values differ, with both values ("a.b: 1 -> 2")."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            sub = f"{key}.{k}" if key else str(k)
            if k not in old:
                out.append(f"{sub}: added")
            elif k not in new:
                out.append(f"{sub}: removed")
            else:
                out += differences(old[k], new[k], sub)
        return out
    if old != new:
        return [f"{key}: {json.dumps(old)} -> {json.dumps(new)}"]
    return []


def update_stamp(path: Path, section: dict) -> list[str] | None:
    """Write the stamp if the section changed. None: it was already current; [] : it was
    new; else what differs from the section that made the current raw file."""
    path = Path(path)
    try:
        previous = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        previous = None
    if previous == section:
        return None
    atomic_write_text(path, json.dumps(section, indent=1, sort_keys=True) + "\n")
    return [] if previous is None else differences(previous, section)


def measured_changes(dataset_dir: Path, name: str, section: dict) -> list[str]:
    """What differs between `section` and the one that made a measured dataset's raw files.

    Where those files exist and their stamp records another section, return the
    differences (the caller refuses to go on); otherwise record `section` and return [].
    A file measured before stamps existed is taken as made by the current section.
    """
    stamp = stamp_path(dataset_dir, name)
    made = any((Path(dataset_dir) / f).exists() for f in stamped_files(name))
    if made and stamp.exists():
        previous = json.loads(stamp.read_text())
        if previous != section:
            return differences(previous, section)
        return []
    update_stamp(stamp, section)
    return []
