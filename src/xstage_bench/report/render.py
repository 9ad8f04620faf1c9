"""Render one figure or table of a dataset by its product name (products.FIGURES / TABLES).

Figures are written as `out` (PDF) with a PNG of the same stem beside it; tables as `out`
(CSV) with a Markdown copy beside it. Each product is a pure function of the dataset's raw
and model files, so rerendering never needs a GPU.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from xstage_bench.data.results import write_error
from xstage_bench.report import products
from xstage_bench.report.analysis.load import NoDataError
from xstage_bench.report.figures.common import save_figure
from xstage_bench.report.tables import noise
from xstage_bench.report.tables.common import write_table

__all__ = ["FIGURES", "TABLES", "NoDataError", "render_product"]

# Each product's renderer: `plot` (figure) or `build` (table) of the module named after it.
FIGURES = {p.name: importlib.import_module(p.renderer).plot for p in products.FIGURES}
TABLES = {p.name: importlib.import_module(p.renderer).build for p in products.TABLES}
# Errors of writing, whatever file they name: reading a raw file gives none of these.
FULL_OR_READ_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def render_product(
    name: str, dataset_dir: Path, out: Path, *, noise_target: float = noise.NOISE_TARGET
) -> None:
    """Render product `name` of `dataset_dir` into `out` (and its companion file).

    Raises NoDataError when the dataset has no data for the product, and RawResultError
    when one of its raw files is malformed (both name the file).
    """
    dataset_dir, out = Path(dataset_dir), Path(out)
    if name not in products.PRODUCTS:
        raise ValueError(f"unknown product '{name}'; known: {', '.join(products.PRODUCTS)}")
    # Render beside the target and move both files into place only once both are made: a
    # failure leaves the previous figure (a committed reference, say) as it was.
    try:
        with _folder_kept_on_success(out.parent):
            with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.stem}.") as tmp:
                _render(name, dataset_dir, Path(tmp) / out.name, noise_target)
                for made in sorted(Path(tmp).iterdir()):
                    os.replace(made, out.parent / made.name)
    except OSError as e:
        if e.errno not in FULL_OR_READ_ONLY:
            raise
        # PIL's or matplotlib's error names no file (seen on a full disk): name the output.
        raise write_error(OSError(e.errno, os.strerror(e.errno)), out) from e


@contextlib.contextmanager
def _folder_kept_on_success(folder: Path) -> Iterator[None]:
    """Make `folder` and its missing parents; take back the ones made here if the body
    fails, so a product with no data leaves no empty results/<dataset>/ behind."""
    missing = [d for d in (folder, *folder.parents) if not d.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield
    except BaseException:
        for made in missing:  # deepest first
            with contextlib.suppress(OSError):  # not empty: something else wrote there
                made.rmdir()
        raise


def _render(name: str, dataset_dir: Path, out: Path, noise_target: float) -> None:
    if name in FIGURES:
        # seaborn's strip-plot jitter draws from numpy's global generator: seed it, so a
        # figure is a function of its data alone (same data, same bytes).
        np.random.seed(0)
        save_figure(FIGURES[name](dataset_dir), out)
    elif name == "tab-noise":
        write_table(noise.build(dataset_dir, target=noise_target), out)
    else:
        write_table(TABLES[name](dataset_dir), out)
