"""A dataset's files as documents: raw files through results.read_raw and the fitted model
through model.document.read_model (both schema-validated), so a malformed file stops a
render with an error naming the file and field; a file that is simply not there raises
NoDataError naming the dataset and the file."""

from __future__ import annotations

from pathlib import Path

from xstage_bench.data import layout
from xstage_bench.data.results import read_raw
from xstage_bench.model.document import ModelFileError, read_model

__all__ = ["ModelFileError", "NoDataError", "model_doc", "optional_model_doc", "raw_doc"]


class NoDataError(ValueError):
    """The dataset has no file, or no usable records, for a product."""


def _missing(dataset_dir: Path, rel: str, what: str) -> NoDataError:
    return NoDataError(
        f"dataset '{dataset_dir.name}' ({dataset_dir}): no {what}: {rel} does not exist"
    )


def raw_doc(dataset_dir: Path, read: str) -> dict:
    """A raw document named as in layout (a path or 'microbench:<study>'), validated."""
    path = layout.resolve(dataset_dir, read)
    if not path.exists():
        raise _missing(dataset_dir, str(path.relative_to(dataset_dir)), "raw data")
    return read_raw(path)


def optional_raw_doc(dataset_dir: Path, read: str) -> dict | None:
    """Like raw_doc, but None when the file does not exist (a bad file still raises)."""
    path = layout.resolve(dataset_dir, read)
    return read_raw(path) if path.exists() else None


def model_doc(dataset_dir: Path) -> dict:
    """The fitted Burst-Gap model of the dataset (model/burst_gap.json), validated."""
    path = dataset_dir / layout.MODEL_JSON
    if not path.exists():
        raise _missing(dataset_dir, layout.MODEL_JSON, "fitted model")
    return read_model(path)


def optional_model_doc(dataset_dir: Path) -> dict | None:
    path = dataset_dir / layout.MODEL_JSON
    return model_doc(dataset_dir) if path.exists() else None


def model_environment(dataset_dir: Path, model: dict) -> dict | None:
    """The environment of the first raw file the model was fitted from, when it is present.

    Sources may be written relative to the repository or to the dataset: the part from
    'raw/' on is looked up inside this dataset.
    """
    for source in model.get("sources", []):
        parts = Path(source).parts
        if "raw" not in parts:
            continue
        path = dataset_dir.joinpath(*parts[parts.index("raw") :])
        if path.exists():
            return read_raw(path)["environment"]
    return None
