"""What made a raw file: the config section of its experiment. The raw file is its own record.

Every raw file records what made it: a simulated one `config_sha256`, the hash of its
config section (`section_hash`); a measured one its `config`, what the measuring job was
given. Nothing else is written, so nothing else can drift from the file: no stamp that a
dry run or an unrelated target rewrites (seen: `snakemake -n` with a changed list wrote a
measured dataset's stamp, and the config that had measured it was then refused).

- A simulated file is stale when the hash it records is not the current section's
  (`simulated_change`); the DAG forces its job when the job is part of the run
  (common.smk), so a dry run lists it and writes nothing, an unrelated target leaves it
  alone, and "remaking it" is printed only for a file the run remakes.
- A measured file is never remade, nor reused, under a config it was not made with:
  `measured_changes` compares the section with the same section of each of its raw files'
  own config, and the run stops on a difference. A sweep that only adds variants or values
  of its grid's axes is no difference: the sweep grows it in place (sweep.added_variants).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from xstage_bench.data import layout, storepath
from xstage_bench.data.results import json_problem

# Grid axes of an experiment's section (megamoe) a sweep may grow by: each value's points
# are measured on their own, so the records of the values it had stay what they were
# (measurement.sweep.added_variants grows a finished file by them).
GROWABLE_AXES = ("shapes", "precisions", "routings", "tokens_per_rank", "remote_fractions")


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
    """Section name -> section, for every raw file a simulated dataset holds."""
    out = {
        f"microbench-{study}": microbench_section(config, study)
        for study in config["microbench"]["studies"]
    }
    out["megamoe"] = experiment_section(config, "megamoe")
    out["attention"] = experiment_section(config, "attention")
    return out


def stamped_files(name: str) -> tuple[str, ...]:
    """The dataset-relative raw files one section makes."""
    if name.startswith("microbench-"):
        return (layout.microbench_raw(name.removeprefix("microbench-")),)
    if name == "megamoe":
        return (layout.MEGAMOE_RAW, layout.MEGAMOE_TRACE_RAW, layout.MEGAMOE_PER_GPU_RAW)
    return (layout.ATTENTION_RAW,)


def section_hash(section: dict) -> str:
    text = json.dumps(section, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


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


# --- what a raw file records ------------------------------------------------------------

_TAIL_HASH = re.compile(rb'\n "config_sha256": "([0-9a-f]{64})"\n}\s*$')


def recorded_hash(path: Path) -> str | None:
    """The config_sha256 a raw file records (None: none, or not a readable raw file).
    results.write_raw puts it last, so the file's tail holds it; else the whole is read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 200))
            match = _TAIL_HASH.search(f.read())
        if match:
            return match.group(1).decode()
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    value = doc.get("config_sha256") if isinstance(doc, dict) else None
    return value if isinstance(value, str) else None


def _recorded_doc(path: Path) -> dict | None:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("config"), dict) else None


UNREADABLE = "the file is unreadable"


def unreadable_change(changed: list[str]) -> bool:
    """Whether simulated_change's answer says the file could not be read (not another
    config)."""
    return bool(changed) and changed[0].startswith(UNREADABLE)


def _unreadable(path: Path) -> str | None:
    """Why a file cannot be read as JSON ("not valid JSON (... at line 3, column 9)"), or
    None when it can."""
    try:
        json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        return f"not valid JSON ({json_problem(e)})"
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except OSError as e:
        return e.strerror or str(e)
    return None


def recorded_config(path: Path) -> dict | None:
    """The config a raw file records, or None (absent, not JSON, no config)."""
    doc = _recorded_doc(path)
    return doc["config"] if doc else None


def measured_paths(doc: dict) -> list[str]:
    """The store paths a raw file measured: its config's `store_paths` where it records
    them, else those its points name (files older than paths: the peer path)."""
    if doc["config"].get("store_paths"):
        return list(doc["config"]["store_paths"])
    found = set()
    for record in doc.get("records") or []:
        if isinstance(record, dict) and isinstance(record.get("point"), dict):
            found.add(storepath.point_path(record["point"]))
    return [p for p in storepath.PATHS if p in found] or [storepath.PEER]


def _section_in(config: dict, name: str) -> dict | None:
    """The section `name` as a raw file's config holds it, or None where it lacks one."""
    try:
        if name.startswith("microbench-"):
            return microbench_section(config, name.removeprefix("microbench-"))
        return experiment_section(config, name)
    except (KeyError, TypeError):
        return None


# --- simulated files ----------------------------------------------------------------------


def simulated_change(raw: Path, name: str, section: dict) -> list[str] | None:
    """None when the simulated raw file is absent or was made from `section`; else what
    differs, as far as the file's own config tells (the simulator rewrites some keys, e.g.
    the backends and the resolved world size, so those are left out of the list). A file
    that is not valid JSON (cut short) records no config: the one line says so."""
    raw = Path(raw)
    if not raw.exists() or recorded_hash(raw) == section_hash(section):
        return None
    unreadable = _unreadable(raw)
    if unreadable:
        # Not another config: a file cut short (a killed copy, an edit). Comparing its
        # absent config with this one listed every key as "added".
        return [f"{UNREADABLE}: {unreadable}, so it is remade whole"]
    old = _section_in(recorded_config(raw) or {}, name) or {}
    return [
        line
        for line in differences(old, section)
        if not line.startswith(("world_size:", "attention.backends:"))
    ]


# --- measured files -----------------------------------------------------------------------


def _comparable(section: dict, raw_file: str, paths: list[str] | None, world_size: Any) -> dict:
    """A section as far as a raw file can be held to it: without the per-GPU run's own grid,
    the variants (a sweep grows by variants in place) and the lead map; a microbench
    `dest: remote` as the paths it stands for; `world_size: auto` as the size it resolved
    to (None: unknown, then not compared)."""
    out = json.loads(json.dumps(section))
    if world_size is None:
        out.pop("world_size", None)
    elif "world_size" in out:
        out["world_size"] = world_size
    mb = out.get("microbench")
    if isinstance(mb, dict) and paths is not None:
        for axes in (mb.get("defaults") or {}, *(mb.get("studies") or {}).values()):
            if "dest" in axes:
                dests = axes["dest"] if isinstance(axes["dest"], list) else [axes["dest"]]
                axes["dest"] = storepath.destinations(dests, paths)
    moe = out.get("megamoe")
    if isinstance(moe, dict):
        for key in ("variants", *GROWABLE_AXES):  # compared as growth (_variants_dropped)
            moe.pop(key, None)
        # a changed lead map re-measures its own arms and keeps the rest of the file
        # (megamoe/refresh.py): the file is remade under the new config, not reused
        moe.pop("lead_sweep", None)
    return out


def _variants_dropped(made: dict, section: dict, raw_file: str) -> list[str]:
    """Variants, and values of the grid's axes, a measured sweep holds that the config no
    longer lists (a grown sweep may add them, never lose them). The per-GPU run's file
    holds the grid megamoe.per_gpu rewrote (megamoe.distributed), not the config's: its
    axes are not compared (megamoe.json holds the whole grid)."""
    grid = () if raw_file == layout.MEGAMOE_PER_GPU_RAW else GROWABLE_AXES
    out = []
    for key in ("variants", *grid):
        before = (made.get("megamoe") or {}).get(key)
        after = (section.get("megamoe") or {}).get(key)
        if not isinstance(before, list) or not isinstance(after, list):
            if before != after:
                out.append(f"megamoe.{key}: {json.dumps(before)} -> {json.dumps(after)}")
            continue
        if any(b not in after for b in before):
            out.append(f"megamoe.{key}: {json.dumps(before)} -> {json.dumps(after)}")
    return out


def measured_changes(
    dataset_dir: Path,
    name: str,
    section: dict,
    store_paths: list[str] = (storepath.PEER,),
    world_size: int | None = None,
) -> list[str]:
    """What differs between `section` (this run's, `world_size: auto` as `world_size`) and
    the section each existing raw file of a measured dataset was made with (its own
    `config`); [] when they agree or nothing is there yet. Where they differ in a microbench
    `dest`, `remote` stands for this run's `store_paths` and, in the file, for the paths it
    measured (older files: the peer path), so an older file's `dest: peer` is this config's
    `remote` over the peer path. A file without a readable config is left to the readers,
    which name what is wrong."""
    for rel in stamped_files(name):
        doc = _recorded_doc(Path(dataset_dir) / rel)
        made = _section_in(doc["config"], name) if doc is not None else None
        if made is None:
            continue
        # A file that records `world_size: auto` does not say what it resolved to (nor does
        # a caller that passes no world size): the sizes are then not compared.
        size = made.get("world_size")
        now = (
            world_size if section.get("world_size") == storepath.AUTO else section.get("world_size")
        )
        if size == storepath.AUTO or now is None:
            size = now = None
        made_paths = measured_paths(doc)
        dropped = _variants_dropped(made, section, rel)
        changed = dropped + differences(
            _comparable(made, rel, None, size), _comparable(section, rel, None, now)
        )
        if changed and not dropped:
            # Older files name a path where a config now says `dest: remote`: the same
            # points when `remote` stands for the paths the file measured.
            changed = differences(
                _comparable(made, rel, made_paths, size),
                _comparable(section, rel, list(store_paths), now),
            )
        if changed:
            return [f"{rel}: {line}" for line in changed]
    return []
