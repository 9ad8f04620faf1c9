"""Load and validate the configuration; errors name the key and what was expected."""

from __future__ import annotations

import difflib
import json
import math
import os
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from xstage_bench.data import grid, workload


class ConfigError(ValueError):
    """The configuration has a bad or missing value; the message names the key."""


@cache
def config_schema() -> dict:
    text = resources.files("xstage_bench.data").joinpath("schemas/config.schema.json").read_text()
    return json.loads(text)


def _key(path) -> str:
    key = ""
    for part in path:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key or "(top level)"


def _alternative(schema: dict) -> str:
    """One branch of a oneOf, in words: "'auto'", "an integer from 2 to 72"."""
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array" and "enum" in schema.get("items", {}):
        return "a list of " + ", ".join(json.dumps(v) for v in schema["items"]["enum"])
    words = f"an {kind}" if str(kind)[:1] in "aeiou" else f"a {kind}"
    if "minimum" in schema and "maximum" in schema:
        return f"{words} from {schema['minimum']} to {schema['maximum']}"
    if "minimum" in schema:
        return f"{words} >= {schema['minimum']}"
    return words


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "oneOf":
        return "must be " + " or ".join(_alternative(s) for s in error.validator_value)
    # An anyOf failure is clearer through its most specific sub-error.
    if error.context:
        error = min(error.context, key=lambda e: len(e.message))
    return error.message


def _finite(value: Any, path: tuple = ()) -> None:
    """JSON Schema bounds let NaN and infinity through (every comparison with NaN is false)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _finite(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _finite(v, (*path, i))
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key '{_key(path)}': must be a finite number, got {value}")


def _misplaced_keys(errors: list[jsonschema.ValidationError]) -> str | None:
    """An unknown key beside a missing one is most likely a misspelling: name both."""
    for e in errors:
        if e.validator != "additionalProperties":
            continue
        allowed = list(e.schema.get("properties", {}))
        unknown = sorted(set(e.instance) - set(allowed), key=str)
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(str(name), allowed, n=1)
            key = _key((*e.absolute_path, name))
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        where = _key(e.absolute_path)
        place = "at the top level" if where == "(top level)" else f"under '{where}'"
        return f"config key {', '.join(hints)}: unknown; allowed {place}: {', '.join(allowed)}"
    return None


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Raise ConfigError for the first problem, naming the key (e.g. 'timing.min_reps')."""
    if not isinstance(config, dict):
        raise ConfigError("config: expected a mapping at the top level")
    _finite(config)
    validator = jsonschema.Draft202012Validator(config_schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.absolute_path), e.message))
    if errors:
        e = errors[0]
        key = _key(e.absolute_path)
        misplaced = _misplaced_keys([x for x in errors if x.absolute_path == e.absolute_path])
        if misplaced:
            raise ConfigError(misplaced)
        if e.validator == "required":
            raise ConfigError(f"config key '{key}': {e.message}")
        raise ConfigError(f"config key '{key}': {_describe(e)} (got {json.dumps(e.instance)})")
    timing = config["timing"]
    if timing["max_reps"] < timing["min_reps"]:
        raise ConfigError(
            f"config key 'timing.max_reps': must be >= timing.min_reps "
            f"({timing['min_reps']}), got {timing['max_reps']}"
        )
    mb = config["microbench"]
    if mb["warmup_bursts"] >= mb["bursts"]:
        raise ConfigError(
            f"config key 'microbench.warmup_bursts': must be < microbench.bursts "
            f"({mb['bursts']}), got {mb['warmup_bursts']}"
        )
    for name, study in mb["studies"].items():
        if study["kind"] != "ceiling" and "K" not in study:
            raise ConfigError(
                f"config key 'microbench.studies.{name}.K': required for kind '{study['kind']}'"
            )
    datasets = config["datasets"]
    if datasets["measured"].startswith("sim-"):
        raise ConfigError(
            "config key 'datasets.measured': a measured dataset cannot be named "
            f"sim-* (those are simulated), got '{datasets['measured']}'"
        )
    if datasets["measured"] in datasets["reference"]:
        raise ConfigError(
            f"config key 'datasets.measured': '{datasets['measured']}' is also a "
            "reference dataset; measuring would overwrite it"
        )
    gpu_ids = config.get("gpu_ids")
    if gpu_ids and config["world_size"] != "auto" and len(gpu_ids) != config["world_size"]:
        raise ConfigError(
            f"config key 'gpu_ids': {len(gpu_ids)} GPUs listed but world_size is "
            f"{config['world_size']}"
        )
    if config["measure"] == "submit":
        if config["world_size"] == "auto":
            raise ConfigError(
                "config key 'world_size': measure 'submit' (a cluster) needs the "
                "GPU count per job as an integer, got 'auto'"
            )
        if datasets["measured"] == "auto":
            raise ConfigError(
                "config key 'datasets.measured': measure 'submit' (a cluster) "
                "needs a dataset name (e.g. h200x8), got 'auto'"
            )
    names = [s["name"] for s in config["megamoe"]["shapes"]]
    custom = [
        s["name"] for s in (config["megamoe"].get("lead_sweep") or {}).get("custom_shapes", [])
    ]
    if len(set(names)) != len(names):
        raise ConfigError("config key 'megamoe.shapes': shape names must be unique")
    if set(custom) & set(names) or len(set(custom)) != len(custom):
        raise ConfigError(
            "config key 'megamoe.lead_sweep.custom_shapes': names must be unique and none "
            f"in megamoe.shapes (got {custom})"
        )
    _check_oracle_arms(config["megamoe"])
    for key, shape in _shapes(config["megamoe"]):
        if shape["topk"] > shape["E"]:
            raise ConfigError(
                f"config key '{key}.topk': must be <= E ({shape['E']}), got {shape['topk']}"
            )
    for key, known in (("lead_sweep", names + custom), ("emulated", names), ("per_gpu", names)):
        unknown = sorted(set((config["megamoe"].get(key) or {}).get("shapes", [])) - set(known))
        if unknown:
            where = "megamoe.shapes" + (" and its custom_shapes" if key == "lead_sweep" else "")
            raise ConfigError(
                f"config key 'megamoe.{key}.shapes': unknown shape(s) {unknown}; "
                f"{where} has {sorted(known)}"
            )
    if config["world_size"] != "auto":
        check_world_size(config, config["world_size"])
        _check_layer_from(config["megamoe"], config["world_size"])
    try:
        workload.check(config)  # what the values ask of memory and time together
    except workload.WorkloadError as e:
        raise ConfigError(str(e)) from None
    return config


def _check_oracle_arms(megamoe: dict) -> None:
    """An oracle arm runs a schedule from the host list beside its device-decided arm: it
    needs schedule_on 'device' and the schedule among megamoe.schedules."""
    oracles = megamoe.get("oracle_arms", [])
    if oracles and megamoe.get("schedule_on", grid.LIST) != grid.DEVICE:
        raise ConfigError(
            "config key 'megamoe.oracle_arms': needs megamoe.schedule_on 'device' (with "
            "'list' every arm already runs from the host-built list)"
        )
    missing = sorted(set(oracles) - set(megamoe["schedules"]))
    if missing:
        raise ConfigError(
            f"config key 'megamoe.oracle_arms': {missing} not in megamoe.schedules "
            f"{megamoe['schedules']}"
        )


def _check_layer_from(megamoe: dict, world_size: int) -> None:
    """The layer from home tokens dispatches on one GPU only (megamoe/layer/
    token_dispatch.py): a config that names more GPUs is told so before anything runs
    (with world_size 'auto' such points are recorded unsupported, with that reason)."""
    if grid.layer_from(megamoe) == grid.HOME_TOKENS and world_size > 1:
        raise ConfigError(
            f"config key 'megamoe.layer_from': 'home_tokens' runs on one GPU (the dispatch "
            f"across GPUs is not built); world_size is {world_size}: use 'expert_rows' or "
            "world_size 1"
        )


def _shapes(megamoe: dict) -> list[tuple[str, dict]]:
    """(config key, shape) of every MegaMoE shape: the grid's and the lead map's own."""
    custom = (megamoe.get("lead_sweep") or {}).get("custom_shapes", [])
    return [(f"megamoe.shapes[{i}]", s) for i, s in enumerate(megamoe["shapes"])] + [
        (f"megamoe.lead_sweep.custom_shapes[{i}]", s) for i, s in enumerate(custom)
    ]


def checked_store_paths(config: dict, world_size: int) -> list[str]:
    """The config's `store_paths` resolved for `world_size` GPUs (storepath.resolve), a
    path this run cannot measure named as a ConfigError."""
    from xstage_bench.data import storepath

    try:
        return storepath.resolve(config.get("store_paths", storepath.AUTO), world_size)
    except storepath.StorePathError as e:
        raise ConfigError(str(e)) from None


def check_world_size(config: dict, P: int) -> None:
    """What must divide over P ranks, and the paths P GPUs can measure, checked before any
    job is planned: here for a config's integer world_size, by the workflow for the GPU
    count that `auto` resolves to."""
    checked_store_paths(config, P)
    for key, shape in _shapes(config["megamoe"]):
        if shape["E"] % P:
            raise ConfigError(
                f"config key '{key}.E': {shape['E']} experts do not divide over world_size {P}"
            )
    for key in ("heads", "seq_lens"):
        for i, n in enumerate(config["attention"][key]):
            if n % P:
                raise ConfigError(
                    f"config key 'attention.{key}[{i}]': {n} does not divide over world_size {P}"
                )
    for i, size in enumerate(config["attention"].get("emulated_world_sizes", [])):
        if size < P:
            raise ConfigError(
                f"config key 'attention.emulated_world_sizes[{i}]': {size} is below "
                f"world_size {P} (two GPUs play a larger node)"
            )


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as e:
        # The parser was handed a string, so its own message says `in "<unicode string>"`.
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = ": ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x)
        raise ConfigError(f"{path}{where}: not valid YAML: {what or e}") from None


def _merged(base: dict, override: dict) -> dict:
    """Mappings merge key by key; any other value (lists included) replaces the base's."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = _merged(base[key], value)
        else:
            out[key] = value
    return out


def _key_line(path: Path, key: str) -> int | None:
    """The line of a top-level key in a YAML file, for messages (None if not found)."""
    try:
        node = yaml.compose(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    if isinstance(node, yaml.MappingNode):
        for k, _ in node.value:
            if getattr(k, "value", None) == key:
                return k.start_mark.line + 1
    return None


def _where(source: Path | None) -> str:
    if source is None:
        return "config key 'extends'"
    line = _key_line(source, "extends")
    return f"{source}, line {line}" if line else str(source)


def resolve_extends(
    config: dict[str, Any], source: str | Path | None = None, _chain: tuple[Path, ...] = ()
) -> dict[str, Any]:
    """A config with `extends: <file>` is that file's config with this one's keys over it.

    Lets a variant (e.g. config/h200x8.yaml) state only what differs. The path is relative
    to the file that names it (`source`), as an include is, so a variant works from any
    directory; a config given without a file (`--config extends=...`) resolves against the
    current directory. A cycle, a missing file or a base that is not a mapping is a
    ConfigError naming the file, the line of its `extends` and the fix.
    """
    if not isinstance(config, dict) or "extends" not in config:
        return config
    source = Path(source) if source is not None else None
    target = config["extends"]
    if not isinstance(target, str) or not target:
        raise ConfigError(
            f"{_where(source)}: config key 'extends': must name a config file, got "
            f"{json.dumps(target)}"
        )
    here = source.parent if source is not None else Path(".")
    base_path = here / target
    chain = (*_chain, source.resolve()) if source is not None else _chain
    if base_path.resolve() in chain:
        names = " -> ".join(str(p) for p in (*chain, base_path.resolve()))
        raise ConfigError(
            f"{_where(source)}: extends '{target}', which is already being extended: a cycle "
            f"({names}); one of these files must not extend the other"
        )
    if not base_path.is_file():
        hint = ""
        if source is not None and Path(target).is_file():
            rel = os.path.relpath(Path(target).resolve(), here.resolve())
            hint = f"; did you mean '{rel}'?"
        raise ConfigError(
            f"{_where(source)}: extends '{target}', but {base_path} does not exist (extends "
            f"is relative to the file that names it{hint})"
        )
    base = resolve_extends(_read_yaml(base_path), base_path, chain)
    if not isinstance(base, dict):
        raise ConfigError(f"{_where(source)}: extends {base_path}, which does not hold a mapping")
    return _merged(base, {k: v for k, v in config.items() if k != "extends"})


def extends_source(configfiles: list[str | Path]) -> Path | None:
    """Which of the config files Snakemake merged names `extends` (the last one does)."""
    for path in reversed([Path(p) for p in configfiles]):
        try:
            data = _read_yaml(path)
        except ConfigError:
            continue
        if isinstance(data, dict) and "extends" in data:
            return path
    return None


def load_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        return validate_config(resolve_extends(_read_yaml(path), path))
    except ConfigError as e:
        if str(e).startswith(str(path)):
            raise
        raise ConfigError(f"{path}: {e}") from None
