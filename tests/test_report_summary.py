"""The report's summary page from SYNTHETIC datasets: the claims table with a verdict in
every row, how each dataset was made, and each figure inlined with its caption."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from fixtures import make_dataset

from xstage_bench.data import layout, origins
from xstage_bench.report import summary as report_summary
from xstage_bench.report.render import render_product

CAPTIONS = Path(__file__).parent.parent / "workflow" / "report"
FIGURES = ("fig-drain", "fig-ulysses")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    datasets = [
        report_summary.Dataset(make_dataset(root, "h200x2-fixture")),
        report_summary.Dataset(make_dataset(root, "sim-b200"), "config/hardware/b200.yaml"),
    ]
    pngs = []
    for d in datasets:
        render_product("tab-claims", d.path, d.path / "tables" / "tab-claims.csv")
        for name in FIGURES:
            render_product(name, d.path, d.path / "figures" / f"{name}.pdf")
            pngs.append(d.path / "figures" / f"{name}.png")
    return report_summary.build(datasets, pngs, CAPTIONS)


def test_claims_table_of_the_measured_dataset_only(page):
    assert page.count('<table class="claims">') == 1
    assert "Claims: h200x2-fixture (measured)" in page
    verdicts = re.findall(r'<td class="verdict">([^<]*)</td>', page)
    assert len(verdicts) > 10 and all(verdicts)


def test_each_dataset_says_how_it_was_made(page):
    text = html.unescape(page)
    assert "measured on 2x NVIDIA H200" in text
    assert "simulated from the hardware profile 'synthetic profile' (config/hardware/b200" in text


def test_every_figure_is_an_inline_png_with_its_caption(page):
    assert page.count('<img src="data:image/png;base64,') == 2 * len(FIGURES)
    assert page.count('<span class="simulated-badge">simulated</span>') >= len(FIGURES)
    what = report_summary.caption_text(CAPTIONS / "fig-drain.rst")
    assert what and "{{" not in what and what in page
    assert "snakemake --cores all " in page and "/sim-b200/figures/fig-drain.png" in page


def test_page_is_ascii(page, tmp_path):
    out = tmp_path / "summary.html"
    report_summary.write(out, page + "\u00b5")
    assert out.read_bytes().isascii()


def test_check_listing_names_every_raw_file(tmp_path):
    ds = make_dataset(tmp_path, "ref-fixture", megamoe=False, attention=False)
    listing = origins.check_listing(ds)
    assert listing.count("\n") == 1 + len(layout.raw_files(ds))
    assert "raw/microbench/drain.json\tmicrobench\tcuda\t" in listing


def test_a_raw_file_changed_since_its_check_is_named(tmp_path):
    # ref-h200x1's listing was left from before a re-measure: its products were made from
    # raw files that its check never read.
    ds = make_dataset(tmp_path, "ref-fixture", megamoe=False, attention=False)
    listing = origins.check_listing(ds)
    assert origins.changed_since_check(ds, listing) == []
    drain = ds / "raw" / "microbench" / "drain.json"
    drain.write_text(drain.read_text() + " ")
    assert origins.changed_since_check(ds, listing) == ["raw/microbench/drain.json"]
    new = ds / "raw" / "microbench" / "extra.json"
    new.write_text(drain.read_text())
    drain.unlink()
    assert origins.changed_since_check(ds, listing) == [
        "raw/microbench/drain.json",
        "raw/microbench/extra.json",
    ]
