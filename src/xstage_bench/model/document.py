"""The fitted model's file, model/burst_gap.json: validated against
schemas/model.schema.json where model/fit.py writes it and where a renderer reads it.

One file holds every store path's fit. Its top level is the fit of its `path` (the peer
path where the dataset measured it, else the host path), exactly as a one-path file, so a
reader that knows nothing of paths reads that one; `paths` lists every path fitted (the
top level's first) and `other_paths` holds each other path's fit, the same blocks.
`path_fit(model, path)` gives any path's fit in the top level's shape. Files written
before paths existed have neither key and are the peer path's fit.
"""

from __future__ import annotations

import json
import os
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from xstage_bench.data import storepath
from xstage_bench.data.results import atomic_write_text, json_problem

SHARED_KEYS = ("dataset", "backend", "sources")  # the file's, not one path's
LINE_RATE_KEY = {storepath.PEER: "nvlink_line_rate_GBps", storepath.HOST: "host_line_rate_GBps"}


class ModelFileError(ValueError):
    """A model file (or document about to be written) is not what the model fitter writes."""


@cache
def model_schema() -> dict:
    text = resources.files("xstage_bench.data").joinpath("schemas/model.schema.json").read_text()
    return json.loads(text)


def validate_model(doc: Any, source: str) -> None:
    """Raise ModelFileError naming `source` and the first offending field."""
    validator = jsonschema.Draft202012Validator(model_schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(top level)"
        raise ModelFileError(f"{source}: field '{where}': {first.message}")


def write_model(path: str | os.PathLike, doc: dict) -> None:
    """Validate, then write atomically."""
    validate_model(doc, str(path))
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")


def read_model(path: str | os.PathLike) -> dict:
    """Load and validate a model file; any problem raises ModelFileError naming it."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelFileError(f"{path}: not valid JSON ({json_problem(e)})") from None
    validate_model(doc, str(path))
    return doc


def primary_path(model: dict) -> str:
    """The path of the file's top-level fit (peer in files older than paths)."""
    return model.get("path", storepath.PEER)


def fitted_paths(model: dict) -> list[str]:
    """Every path the file fits, the top level's first."""
    return list(model.get("paths") or [primary_path(model)])


def path_fit(model: dict, path: str) -> dict:
    """The fit of `path` in the shape of a one-path model file (ModelFileError if the
    file has none for it)."""
    if path == primary_path(model):
        return model
    other = (model.get("other_paths") or {}).get(path)
    if other is None:
        raise ModelFileError(
            f"model of dataset '{model.get('dataset')}' has no fit for store path '{path}' "
            f"(it fits {', '.join(fitted_paths(model))})"
        )
    return {**{k: model[k] for k in SHARED_KEYS if k in model}, **other}


def ceiling_rates(ceilings: dict, path: str) -> dict[str, float]:
    """A path's ceilings (method -> median GB/s) from a fit's `ceilings` block."""
    return dict(ceilings.get(f"{path}_GBps") or {})


def line_rate(ceilings: dict, path: str) -> float | None:
    """A path's line rate (GB/s, a specification) from a fit's `ceilings` block."""
    value = ceilings.get(LINE_RATE_KEY[path])
    return None if value is None else float(value)
