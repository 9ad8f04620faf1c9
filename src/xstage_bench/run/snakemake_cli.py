"""What Snakemake's command line gets wrong before the Snakefile runs, told with the fix.

Snakemake reads `--configfile` and parses `--config` before it reads the Snakefile, so the
workflow cannot explain what goes wrong there. Seen: a YAML error gave "Config file is not
valid JSON or YAML" with no file or line; a target after `--configfile` (which takes every
word after it) was read as a config file, a missing one "not found", an existing PDF a
traceback; `--config timing.warmup=2` ended in a traceback. `install()` wraps the two
Snakemake functions involved:

- a config file that does not load names itself, the line and column of a YAML error and
  what to do, and a "config file" that is a target (a figure, a raw result file, a missing
  path without a config suffix) says to put targets before `--configfile`;
- `--config a.b=v` sets the nested key `a.b` (merged into the config like any `--config`
  value), as one would expect, instead of failing;
- a `--config` list or mapping holds numbers and bools as a config file would
  (`gpu_ids=[0]` is `[0]`; Snakemake alone gives `['0']`).

The Snakemake plugin `snakemake-logger-plugin-xstage` (plugins/, installed beside the
harness) calls `install()` when Snakemake loads its plugins, which it does before it
parses its command line: the one moment code of ours can run. Without it, Snakemake's own
messages stand; `xstage validate FILE` names a YAML error's line either way.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
# Keys every raw result file has (data/schemas/raw.schema.json) and no config does: a raw
# .json target after --configfile loads as a mapping, then failed as "config key 'backend'".
RAW_KEYS = frozenset({"schema", "experiment", "backend", "records"})


def _looks_like_a_target(path: Path) -> bool:
    return path.suffix.lower() not in CONFIG_SUFFIXES


def _target_hint(path: Path) -> str:
    return (
        f"'{path}' was read as a config file: --configfile takes every word after it, so a "
        f"target after it is read as one. Put targets first: snakemake {path} --configfile ..."
    )


def configfile_problem(path: str | Path, filetype: str = "Config") -> str | None:
    """Why a config file given to Snakemake does not load, with the fix; None if it does."""
    path = Path(path)
    if not path.exists():
        why = f"{filetype} file {path} not found."
        return f"{why} {_target_hint(path)}" if _looks_like_a_target(path) else why
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"{filetype} file {path} is not text. {_target_hint(path)}"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = ": ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x)
        hint = f" {_target_hint(path)}" if _looks_like_a_target(path) else ""
        return (
            f"{path}{where}: not valid YAML: {what or e} (fix it there; `xstage validate "
            f"{path}` checks a config without running){hint}"
        )
    if not isinstance(data, dict):
        hint = (
            _target_hint(path) if _looks_like_a_target(path) else "it needs keys at the top level"
        )
        return f"{filetype} file {path} does not hold a mapping: {hint}"
    if RAW_KEYS <= set(data):
        return f"{filetype} file {path} is a raw result file, not a config. {_target_hint(path)}"
    return None


_DOTTED = re.compile(r"^([A-Za-z_][\w-]*)((?:\.[A-Za-z_][\w-]*)+)=(.*)$", re.S)


def nested_config_entries(entries: list[str] | None) -> tuple[list[str], list[tuple]]:
    """Split `--config` entries into Snakemake's own (key=value) and dotted ones, each of
    those as (the key path, its value text)."""
    plain, dotted = [], []
    for entry in entries or []:
        match = _DOTTED.match(entry)
        if match:
            dotted.append(((match.group(1), *match.group(2)[1:].split(".")), match.group(3)))
        else:
            plain.append(entry)
    return plain, dotted


def typed_config_value(parsed, text: str):
    """A `--config` value as a config file would hold it. Snakemake types a number or a
    bool itself but reads a list or mapping with YAML's BaseLoader, all strings (seen:
    `attention.seq_lens=[8192,16384]` refused as "'16384' is not of type 'integer'");
    those are read again with yaml.safe_load. A scalar keeps Snakemake's own type."""
    if not isinstance(parsed, list | dict):
        return parsed
    try:
        return yaml.safe_load(text.strip("'\""))  # the quotes Snakemake strips
    except yaml.YAMLError:
        return parsed  # BaseLoader read it: as typed as it gets


def install() -> bool:
    """Wrap Snakemake's config-file loading and `--config` parsing (see the module doc);
    False where this Snakemake lacks them (nothing is changed then)."""
    try:
        from snakemake import cli
        from snakemake.common import configfile
        from snakemake.exceptions import WorkflowError
        from snakemake.utils import update_config
    except ImportError:
        return False
    if getattr(configfile, "_xstage_installed", False):
        return True
    if not hasattr(configfile, "_load_configfile") or not hasattr(cli, "parse_config"):
        return False
    load, parse = configfile._load_configfile, cli.parse_config

    def load_configfile(configpath_or_obj, filetype="Config"):
        if isinstance(configpath_or_obj, str | Path):
            problem = configfile_problem(configpath_or_obj, filetype)
            if problem:
                raise WorkflowError(problem)
        return load(configpath_or_obj, filetype)

    def parse_config(entries):
        plain, dotted = nested_config_entries(entries)
        config = {}
        for entry in plain:
            key, value = parse([entry]).popitem()  # Snakemake's checks and typing
            text = entry.split("=", 1)[1]
            update_config(config, {key: typed_config_value(value, text)})
        for keys, text in dotted:
            value = parse([f"value={text}"])["value"] if text != "" else None
            value = typed_config_value(value, text)
            for key in reversed(keys):
                value = {key: value}
            update_config(config, value)
        return config

    configfile._load_configfile = load_configfile
    cli.parse_config = parse_config
    configfile._xstage_installed = True
    return True
