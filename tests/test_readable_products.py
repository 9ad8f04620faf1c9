"""Every figure and table a committed dataset holds is readable (issue 56): every axis
that shows data has tick labels, a panel title runs to two lines at most, a Markdown table
shows at most tables.common.MAX_COLUMNS columns, and a few notes stand before the data.

The synthetic fixtures cover what no reference holds; the committed figures are checked
where they are rendered again anyway, in test_committed_products. ref-h200x1's
fig-issue-vs-gap had bare y axes (matplotlib's LogLocator gave no tick over four decades)
and panel titles of five lines.
"""

import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from fixtures import (
    make_dataset,
    write_megamoe_emulated,
    write_megamoe_host,
    write_megamoe_per_gpu,
)
from readability import unreadable

from xstage_bench.report.figures.common import PlainLogLocator
from xstage_bench.report.render import FIGURES, TABLES, NoDataError
from xstage_bench.report.tables import common
from xstage_bench.report.tables.common import Columns, Table

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sim_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data"), "sim-fixture", playback=True)


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_figure_of_the_synthetic_dataset_is_readable(name, sim_dataset):
    try:
        fig = FIGURES[name](sim_dataset)
    except NoDataError as e:  # the lead map needs a host dataset's lead sweep
        pytest.skip(f"the synthetic dataset has no data for {name}: {e}")
    try:
        assert not unreadable(fig), unreadable(fig)
    finally:
        plt.close(fig)


def test_a_log_axis_over_many_decades_keeps_its_labels():
    """LogLocator with subs (1, 2, 5) returned no tick over 0.2 to 7000 us: decades then."""
    locator = PlainLogLocator()
    assert 100 in locator.tick_values(10, 1000) and 200 in locator.tick_values(10, 1000)
    wide = locator.tick_values(0.18, 6842)
    assert {0.1, 1, 10, 100, 1000} <= set(np.round(wide, 6))


def markdown_tables(text: str) -> list[list[str]]:
    """Each Markdown table of `text` as its header's cells."""
    lines = text.splitlines()
    return [
        [c.strip() for c in line.strip("|").split(" | ")]
        for line, rule in zip(lines, lines[1:], strict=False)
        if line.startswith("|") and rule.startswith("|---")
    ]


def notes_before_the_data(text: str) -> int:
    head = text.split("\n|", 1)[0].split("\n## ", 1)[0]
    return sum(line.startswith("- ") for line in head.splitlines())


@pytest.fixture(scope="module")
def table_datasets(tmp_path_factory) -> list[Path]:
    """Datasets that hold every table between them: the synthetic one with the emulated
    sweep and a per-GPU run, and a host-path one with the lead map. (Tables are checked
    on synthetic data: rendered from the references they take minutes; the column limit
    is a property of the columns, which these datasets all have.)"""
    every = make_dataset(tmp_path_factory.mktemp("data"), "sim-every-table", playback=True)
    write_megamoe_emulated(every)
    write_megamoe_per_gpu(every)
    host = tmp_path_factory.mktemp("data") / "h200x1-host"
    write_megamoe_host(host)
    return [every, host]


def test_every_table_shows_at_most_twelve_columns_after_a_few_notes(table_datasets):
    checked = set()
    for dataset in table_datasets:
        for name, build in TABLES.items():
            try:
                table = build(dataset)
            except NoDataError:
                continue
            text = common.markdown(table)  # refuses a part wider than MAX_COLUMNS
            widths = [len(header) for header in markdown_tables(text)]
            assert widths and max(widths) <= common.MAX_COLUMNS, f"{name}: {widths}"
            assert notes_before_the_data(text) <= common.LEAD_NOTES, name
            # every column of the CSV is shown, its CI in its value's cell
            shown = {c.removesuffix(" (CI)") for header in markdown_tables(text) for c in header}
            assert set(table.frame.columns) - shown <= _ci_columns(table.frame), name
            checked.add(name)
    assert checked == set(TABLES), f"no dataset here holds {set(TABLES) - checked}"


def _ci_columns(frame: pd.DataFrame) -> set[str]:
    return {c for c in frame.columns if re.search(r"(ci_low|ci_high|CI low|CI high)$", c)}


def test_a_table_too_wide_is_refused_naming_it_and_the_fix():
    wide = pd.DataFrame({f"c{i}": [i] for i in range(common.MAX_COLUMNS + 1)})
    with pytest.raises(
        ValueError, match=r"'wide', main frame: 13 columns .*tables\.common\.Columns"
    ):
        common.markdown(Table(wide, "wide", "label"))
    parts = Columns(("c0",), (("first", ("c1", "c2")), ("rest", tuple(wide.columns[3:]))))
    text = common.markdown(Table(wide, "wide", "label", columns={common.MAIN: parts}))
    assert [len(h) for h in markdown_tables(text)] == [3, 11]
    assert "## first" in text and "## rest" in text


def test_a_split_that_drops_a_column_is_refused():
    frame = pd.DataFrame({"key": [1], "a": [2], "b": [3]})
    with pytest.raises(ValueError, match=r"column\(s\) b in no part"):
        common.markdown(
            Table(frame, "t", "l", columns={common.MAIN: Columns(("key",), (("a", ("a",)),))})
        )


def test_a_value_and_its_ci_share_one_cell_and_the_caption_says_so():
    frame = pd.DataFrame(
        {
            "geomean": [1.0345],
            "geomean_ci_low": [1.03],
            "geomean_ci_high": [1.039],
            "layer time speedup": [1.1],
            "layer time CI low": [1.05],
            "layer time CI high": [1.2],
            "ratio": [0.9],
            "ci_low": [0.8],
            "ci_high": [float("nan")],
        }
    )
    text = common.markdown(Table(frame, "t", "l", notes=["one", "two", "three", "four"]))
    assert "| geomean (CI) | layer time speedup (CI) | ratio (CI) |" in text
    assert "| 1.034 (1.03–1.039) | 1.1 (1.05–1.2) | 0.9 |" in text
    lead, caption = text.split("## Notes")
    assert "- three" in lead and "- four" not in lead
    assert "- four" in caption and common.CI_CELL_NOTE in caption
