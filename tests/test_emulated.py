"""The compute-emulated MegaMoE sweep: its grid, and the crossover figure and table drawn
from a synthetic measured dataset (tests/fixtures.py) whose speedups are known."""

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fixtures import (
    EMULATED_FRACTIONS,
    EMULATED_RATES,
    HOST_EMULATED_FRACTIONS,
    add_path_drain_rate,
    make_dataset,
    write_megamoe_emulated,
)

from xstage_bench.data.results import read_raw
from xstage_bench.megamoe import schedule
from xstage_bench.megamoe.emulated import emulated_points
from xstage_bench.report import paper
from xstage_bench.report.analysis import megamoe_emulated
from xstage_bench.report.figures import megamoe_crossover as megamoe_crossover_figure
from xstage_bench.report.render import render_product

ROOT = Path(__file__).resolve().parents[1]
MOE = {
    "shapes": [{"name": "a", "H": 4096, "I": 2048, "E": 256, "topk": 6}],
    "schedules": ["expert_wave", "interleaved"],
    "emulated": {
        "shapes": ["a"],
        "tflops": [1000, 3000],
        "remote_fractions": [0, "natural", 0.875],
        "tokens_per_rank": 4096,
    },
}


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    ds = make_dataset(tmp_path_factory.mktemp("data"), "h200x2-emulated")
    write_megamoe_emulated(ds)
    return ds


def test_points_cover_rates_fractions_and_schedules_with_stable_ids():
    points = emulated_points(MOE, 2)
    assert len(points) == 2 * 3 * 2
    ids = [p["id"] for p in points]
    assert ids[:2] == ["a/T=4096/P=2/X=1000/f=0/expert_wave", "a/T=4096/P=2/X=1000/f=0/interleaved"]
    assert "a/T=4096/P=2/X=3000/f=natural/interleaved" in ids
    assert {p["remote_fraction"] for p in points} == {0.0, "natural", 0.875}
    # one shape and fraction's points are adjacent: they share one problem
    keys = [(p["shape"], p["remote_fraction"]) for p in points]
    assert keys == sorted(keys, key=keys.index)


def test_an_unknown_shape_is_named():
    bad = {**MOE, "emulated": {**MOE["emulated"], "shapes": ["b"]}}
    with pytest.raises(ValueError, match="megamoe.emulated.shapes.*'b'"):
        emulated_points(bad, 2)


def test_tile_waits_follow_the_flops_at_the_emulated_rate():
    # 132 programs at 1000 TFLOP/s: an L1 tile (4*128*128*4096 FLOPs) lasts 35.4 us
    l1, l2 = schedule.emulated_tile_ns(4096, 2048, 1000.0, 132)
    assert l1 == round(4 * 128 * 128 * 4096 / (1000e12 / 132) * 1e9)
    assert l1 / l2 == pytest.approx(2 * 4096 / 2048, rel=1e-4)  # whole ns
    assert schedule.emulated_tile_ns(4096, 2048, 2000.0, 132)[0] == pytest.approx(l1 / 2, abs=1)


def test_speedups_pair_the_schedules_per_rate_and_fraction(measured):
    speedups = megamoe_emulated.emulated_speedups(
        read_raw(measured / "raw" / "megamoe_emulated.json")
    )
    assert len(speedups) == len(EMULATED_RATES) * len(EMULATED_FRACTIONS)
    row = speedups[(speedups["remote_fraction"] == "0.875") & (speedups["emulated_tflops"] == 4500)]
    assert row["speedup"].item() == pytest.approx((1 + 0.3 * 0.875) / (1 + 0.05 * 0.875))
    control = speedups[speedups["remote_fraction"] == "0"]
    assert control["speedup"].tolist() == pytest.approx([1.0] * len(EMULATED_RATES))


def test_crossover_figure_and_table_render_labelled_emulated(measured, tmp_path):
    out = tmp_path / "figures" / "fig-megamoe-crossover.pdf"
    render_product("fig-megamoe-crossover", measured, out)
    assert out.read_bytes().startswith(b"%PDF") and out.with_suffix(".png").exists()
    table = tmp_path / "tables" / "tab-megamoe-crossover.csv"
    render_product("tab-megamoe-crossover", measured, table)
    frame = pd.read_csv(table)
    assert len(frame) == len(EMULATED_RATES) * len(EMULATED_FRACTIONS)
    assert {"expert_wave_wait_p90_us", "interleaved_span_us"} <= set(frame.columns)
    # the achieved rate is the expert-wave run's, below the nominal one
    assert (frame["wave_equivalent_tflops"] < 0.5 * frame["X_tflops"] + 1e-9).all()
    markdown = table.with_suffix(".md").read_text()
    assert "emulated" in markdown and "2x NVIDIA H200" in markdown
    # the dataset's fitted R places the paper's compute-to-drain ratio
    assert "corresponds to X =" in markdown


def test_the_simulator_predicts_beside_the_measurement(measured, tmp_path):
    """With the dataset's fitted profile there, every point gets the simulator's speedup
    for the same tile lists and routing, and the table names the median error."""
    shutil.copy(ROOT / "config" / "hardware" / "h200.yaml", measured / "model" / "profile.yaml")
    table = tmp_path / "tab-megamoe-crossover.csv"
    render_product("tab-megamoe-crossover", measured, table)
    frame = pd.read_csv(table)
    assert frame["sim_speedup"].notna().all()
    assert "median |error|" in table.with_suffix(".md").read_text()


@pytest.fixture(scope="module")
def both_paths(tmp_path_factory):
    """The emulated sweep on the peer path (records before paths) and the host path, the
    model fitted per path (host R = 52 GB/s, peer R = 365 GB/s)."""
    ds = make_dataset(tmp_path_factory.mktemp("data"), "h200x2-paths", attention=False)
    write_megamoe_emulated(ds, paths=("peer", "host"))
    add_path_drain_rate(ds, "host", 52.0)
    add_path_drain_rate(ds, "peer", 365.0)
    return ds


def test_crossover_has_a_row_per_path_marked_at_the_paths_own_r(both_paths):
    fig = megamoe_crossover_figure.plot(both_paths)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title().split(", ", 1)[1] for ax in panels] == [
        "peer path (peer GPU (NVLink))",
        "host path (host memory)",
    ]
    for ax, r in zip(panels, (365.0, 52.0), strict=True):
        marks = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"]
        assert marks == pytest.approx([paper.PAPER_FLOP_PER_BYTE * r * 1e9 / 1e12])
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "host, host share: f = 0.25" in labels


def test_crossover_lines_never_go_back_along_x(both_paths):
    """Issue 27, item 8: one line per share, its points sorted by the achieved rate."""
    fig = megamoe_crossover_figure.plot(both_paths)
    lines = [
        line
        for ax in fig.axes
        for line in ax.get_lines()
        if line.get_marker() == "o"  # the data lines (1.0 and the marks have none)
    ]
    assert len(lines) == len(EMULATED_FRACTIONS) + len(HOST_EMULATED_FRACTIONS)
    for line in lines:
        x = np.asarray(line.get_xdata(), dtype=float)
        assert (np.diff(x) >= 0).all()


def test_crossover_table_is_per_path_and_leaves_the_simulator_out_of_two_paths(
    both_paths, tmp_path
):
    shutil.copy(ROOT / "config" / "hardware" / "h200.yaml", both_paths / "model" / "profile.yaml")
    table = tmp_path / "tab-megamoe-crossover.csv"
    render_product("tab-megamoe-crossover", both_paths, table)
    frame = pd.read_csv(table)
    assert frame.groupby("path").size().to_dict() == {
        "host": len(EMULATED_RATES) * len(HOST_EMULATED_FRACTIONS),
        "peer": len(EMULATED_RATES) * len(EMULATED_FRACTIONS),
    }
    assert "sim_speedup" not in frame.columns
    markdown = table.with_suffix(".md").read_text()
    assert "host path: the paper's compute-to-drain ratio corresponds to X = 326" in markdown
    assert "R = 52 GB/s" in markdown and "several paths" in markdown


def test_a_model_fitted_per_path_gives_each_path_its_own_r():
    """The model file's shape (model/document.py): the top level is its first path's fit,
    `other_paths` holds the rest; a file older than paths fits the peer path."""
    top = {"params": {"R_GBps": {"value": 350.0}}}
    assert megamoe_emulated.path_drain_rate_GBps(top, "peer") == 350.0  # before paths: one fit
    assert megamoe_emulated.path_drain_rate_GBps(top, "host") is None  # not fitted for it
    both = {
        **top,
        "path": "peer",
        "paths": ["peer", "host"],
        "other_paths": {"host": {"params": {"R_GBps": {"value": 52.0}}}},
    }
    assert megamoe_emulated.path_drain_rate_GBps(both, "host") == 52.0
    assert megamoe_emulated.path_drain_rate_GBps(both, "peer") == 350.0
    host_only = {"path": "host", "paths": ["host"], "params": {"R_GBps": {"value": 51.0}}}
    assert megamoe_emulated.path_drain_rate_GBps(host_only, "host") == 51.0
    assert megamoe_emulated.path_drain_rate_GBps(host_only, "peer") is None


def test_a_third_schedule_s_mechanism_is_shown_beside_the_two_compared(tmp_path):
    # a GPU run of DeepGEMM's interleaving beside the two: its waits and spans are columns
    # of the mechanism part too, never a table that cannot be shown
    ds = make_dataset(tmp_path / "data", "h200x2-emulated")
    write_megamoe_emulated(ds, deepgemm=True)
    table = tmp_path / "tables" / "tab-megamoe-crossover.csv"
    render_product("tab-megamoe-crossover", ds, table)
    frame = pd.read_csv(table)
    assert len(frame) == len(EMULATED_RATES) * len(EMULATED_FRACTIONS)
    mechanism = table.with_suffix(".md").read_text().split("mechanism")[-1]
    assert "deepgemm_interleaved_wait_p90_us" in mechanism
    assert "deepgemm_interleaved_span_us" in mechanism
    figure = tmp_path / "figures" / "fig-megamoe-crossover.pdf"
    render_product("fig-megamoe-crossover", ds, figure)
    assert figure.read_bytes().startswith(b"%PDF")
