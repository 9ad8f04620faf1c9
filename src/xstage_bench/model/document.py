"""The fitted model's file, model/burst_gap.json: validated against
schemas/model.schema.json where model/fit.py writes it and where a renderer reads it."""

from __future__ import annotations

import json
import os
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from xstage_bench.results import atomic_write_text


class ModelFileError(ValueError):
    """A model file (or document about to be written) is not what the model fitter writes."""


@cache
def model_schema() -> dict:
    text = resources.files("xstage_bench").joinpath("schemas/model.schema.json").read_text()
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
        raise ModelFileError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    validate_model(doc, str(path))
    return doc
