"""Render one figure or table of a dataset by its product name (layout.FIGURES / TABLES).

Figures are written as `out` (PDF) with a PNG of the same stem beside it; tables as `out`
(CSV) with a Markdown copy beside it. Each product is a pure function of the dataset's raw
and model files, so rerendering never needs a GPU.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from xstage_bench import layout
from xstage_bench.analysis.load import NoDataError
from xstage_bench.figures import (
    backpressure_map,
    drain,
    isolated,
    issue_vs_gap,
    megamoe_crossover,
    megamoe_speedup,
    megamoe_timeline,
    model_validation,
    store_span_cdf,
    ulysses,
)
from xstage_bench.figures.common import save_figure
from xstage_bench.tables import (
    burst_gap_params,
    claims,
    megamoe,
    noise,
    process_model,
)
from xstage_bench.tables import (
    megamoe_crossover as megamoe_crossover_table,
)
from xstage_bench.tables import ulysses as ulysses_table
from xstage_bench.tables.common import write_table

__all__ = ["FIGURES", "TABLES", "NoDataError", "render_product"]

FIGURES = {
    "fig-issue-vs-gap": issue_vs_gap.plot,
    "fig-drain": drain.plot,
    "fig-isolated": isolated.plot,
    "fig-backpressure-map": backpressure_map.plot,
    "fig-model-validation": model_validation.plot,
    "fig-megamoe-speedup": megamoe_speedup.plot,
    "fig-megamoe-timeline": megamoe_timeline.plot,
    "fig-store-span-cdf": store_span_cdf.plot,
    "fig-ulysses": ulysses.plot,
    "fig-megamoe-crossover": megamoe_crossover.plot,
}
TABLES = {
    "tab-burst-gap-params": burst_gap_params.build,
    "tab-megamoe": megamoe.build,
    "tab-process-model": process_model.build,
    "tab-megamoe-crossover": megamoe_crossover_table.build,
    "tab-ulysses": ulysses_table.build,
    "tab-claims": claims.build,
    "tab-noise": noise.build,
}


def render_product(
    name: str, dataset_dir: Path, out: Path, *, noise_target: float = noise.NOISE_TARGET
) -> None:
    """Render product `name` of `dataset_dir` into `out` (and its companion file).

    Raises NoDataError when the dataset has no data for the product, and RawResultError
    when one of its raw files is malformed (both name the file).
    """
    dataset_dir, out = Path(dataset_dir), Path(out)
    if name not in layout.PRODUCTS:
        raise ValueError(f"unknown product '{name}'; known: {', '.join(layout.PRODUCTS)}")
    # Render beside the target and move both files into place only once both are made: a
    # failure leaves the previous figure (a committed reference, say) as it was.
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.stem}.") as tmp:
        _render(name, dataset_dir, Path(tmp) / out.name, noise_target)
        for made in sorted(Path(tmp).iterdir()):
            os.replace(made, out.parent / made.name)


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
