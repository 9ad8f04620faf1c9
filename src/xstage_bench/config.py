"""Load and validate the configuration; errors name the key and what was expected."""

from __future__ import annotations

import difflib
import json
import math
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml


class ConfigError(ValueError):
    """The configuration has a bad or missing value; the message names the key."""


@cache
def config_schema() -> dict:
    text = resources.files("xstage_bench").joinpath("schemas/config.schema.json").read_text()
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
    if len(set(names)) != len(names):
        raise ConfigError("config key 'megamoe.shapes': shape names must be unique")
    for i, shape in enumerate(config["megamoe"]["shapes"]):
        if shape["topk"] > shape["E"]:
            raise ConfigError(
                f"config key 'megamoe.shapes[{i}].topk': must be <= E ({shape['E']}), "
                f"got {shape['topk']}"
            )
    for key in ("lead_sweep", "emulated"):
        unknown = sorted(set((config["megamoe"].get(key) or {}).get("shapes", [])) - set(names))
        if unknown:
            raise ConfigError(
                f"config key 'megamoe.{key}.shapes': unknown shape(s) {unknown}; "
                f"megamoe.shapes has {sorted(names)}"
            )
    if config["world_size"] != "auto":
        _check_world_size(config, config["world_size"])
    return config


def checked_store_paths(config: dict, world_size: int) -> list[str]:
    """The config's `store_paths` resolved for `world_size` GPUs (storepath.resolve), a
    path this run cannot measure named as a ConfigError."""
    from xstage_bench import storepath

    try:
        return storepath.resolve(config.get("store_paths", storepath.AUTO), world_size)
    except storepath.StorePathError as e:
        raise ConfigError(str(e)) from None


def _check_world_size(config: dict, P: int) -> None:
    """What must divide over P ranks, and the paths P GPUs can measure, checked before any
    job is planned."""
    checked_store_paths(config, P)
    for i, shape in enumerate(config["megamoe"]["shapes"]):
        if shape["E"] % P:
            raise ConfigError(
                f"config key 'megamoe.shapes[{i}].E': {shape['E']} experts do not divide over "
                f"world_size {P}"
            )
    for key in ("heads", "seq_lens"):
        for i, n in enumerate(config["attention"][key]):
            if n % P:
                raise ConfigError(
                    f"config key 'attention.{key}[{i}]': {n} does not divide over world_size {P}"
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


def resolve_extends(config: dict[str, Any], root: str | Path = ".") -> dict[str, Any]:
    """A config with `extends: <file>` is that file's config with this one's keys over it.

    Lets a variant (e.g. config/h200x8.yaml) state only what differs; paths are relative
    to the project root, where Snakemake runs.
    """
    if not isinstance(config, dict) or "extends" not in config:
        return config
    base_path = Path(root) / config["extends"]
    base = resolve_extends(_read_yaml(base_path), root)
    if not isinstance(base, dict):
        raise ConfigError(f"config key 'extends': {base_path} does not hold a mapping")
    return _merged(base, {k: v for k, v in config.items() if k != "extends"})


def load_config(path: str | Path, root: str | Path = ".") -> dict[str, Any]:
    path = Path(path)
    try:
        return validate_config(resolve_extends(_read_yaml(path), root))
    except ConfigError as e:
        if str(e).startswith(str(path)):
            raise
        raise ConfigError(f"{path}: {e}") from None
