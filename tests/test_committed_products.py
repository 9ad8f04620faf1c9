"""Every committed figure and table is what today's renderers make of the committed data
(issue 55, item 2): each product of each reference dataset is rendered again from its raw
files, model and playback into a scratch folder and must equal the committed files byte for
byte (PDFs carry no creation date: figures.common.save_figure). A product left behind when
its data or its renderer changed fails here, naming the command that remakes it, before a
newcomer's first run rewrites it. tab-claims included: beside a measured dataset it shows
measured datasets only (claims.counterparts.shown_beside), which are all committed.
Each figure is also checked readable on the way (readability.unreadable, issue 56).
"""

import filecmp
from pathlib import Path

import numpy as np
import pytest
from readability import unreadable

from xstage_bench.report import products
from xstage_bench.report.figures.common import save_figure
from xstage_bench.report.render import FIGURES, render_product

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
REFERENCES = sorted(d.name for d in RESULTS.iterdir() if (d / "logs" / "raw-check.txt").is_file())


def committed_products() -> list[tuple[str, str]]:
    """(dataset, product) for every product file a reference dataset holds."""
    return [
        (dataset, name)
        for dataset in REFERENCES
        for name, product in products.PRODUCTS.items()
        if product.output(RESULTS / dataset).is_file()
    ]


def test_the_references_hold_products():
    assert {"ref-h200x1", "ref-h200x2"} <= set(REFERENCES)
    assert len(committed_products()) >= 2 * 20
    # the figure issue 56 found with bare axes is among those checked readable
    assert ("ref-h200x1", "fig-issue-vs-gap") in committed_products()
    # tab-claims, whose counterpart columns once went stale (issue 55)
    assert ("ref-h200x2", "tab-claims") in committed_products()


@pytest.mark.parametrize(("dataset", "name"), committed_products())
def test_a_committed_product_is_what_its_data_gives(dataset, name, tmp_path):
    product = products.PRODUCTS[name]
    committed = [product.output(RESULTS / dataset, companion=c) for c in (False, True)]
    # Read from the committed dataset, written to a scratch folder: nothing under results/
    # is touched.
    out = product.output(tmp_path)
    if product.is_figure:  # as render_product draws it, read on the way
        np.random.seed(0)  # render._render's seed of seaborn's jitter
        fig = FIGURES[name](RESULTS / dataset)
        assert not unreadable(fig), f"{dataset}/{name}: {unreadable(fig)}"
        save_figure(fig, out)
    else:
        render_product(name, RESULTS / dataset, out)
    remake = f"snakemake --cores all -f {committed[0].relative_to(ROOT)}"
    for before, after in zip(committed, (out, product.output(tmp_path, True)), strict=True):
        assert filecmp.cmp(before, after, shallow=False), (
            f"{before.relative_to(ROOT)} is not what its data gives today: remake it ({remake}) "
            "and commit it"
        )
