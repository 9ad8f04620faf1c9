"""Every figure renders from a small SYNTHETIC dataset (tests/fixtures.py), says whether its
data is simulated or which GPUs measured it, counts failed points, and refuses missing or
malformed inputs with an error naming the file."""

import json
from pathlib import Path

import matplotlib.pyplot
import pytest
from fixtures import (
    AUTO_LEAD_ROWS,
    HOST_CEILINGS,
    HOST_LINE_RATE,
    HOST_TRUTH,
    SIMULATED_HOLDING,
    make_dataset,
    write_megamoe,
    write_megamoe_host,
    write_megamoe_trace_host,
    write_microbench,
    write_model,
)

from xstage_bench.data import layout
from xstage_bench.data.grid import producer_bytes
from xstage_bench.data.results import RawResultError
from xstage_bench.report import products
from xstage_bench.report.analysis.labels import fmt_bytes
from xstage_bench.report.analysis.load import NoDataError
from xstage_bench.report.analysis.megamoe import trace_series
from xstage_bench.report.figures import common
from xstage_bench.report.figures.common import save_figure
from xstage_bench.report.render import FIGURES, TABLES, render_product

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sim_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data"), "sim-fixture", playback=True)


@pytest.fixture(scope="module")
def measured_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data"), "h200x2-fixture")


def texts(fig):
    """The suptitle and every free text of a figure (where the notes are)."""
    return [fig.get_suptitle(), *(t.get_text() for t in fig.texts)]


def test_every_product_has_a_renderer():
    assert set(FIGURES) | set(TABLES) == set(products.PRODUCTS)
    assert set(FIGURES) == {p.name for p in products.FIGURES}


# Every figure a simulated dataset has (the emulated sweep is measured on GPUs only:
# test_emulated.py renders it).
SIMULATED_FIGURES = sorted(n for n in FIGURES if SIMULATED_HOLDING.gives(products.PRODUCTS[n]))


@pytest.mark.parametrize("name", SIMULATED_FIGURES)
def test_figure_renders_pdf_and_png_labelled_simulated(name, sim_dataset, tmp_path):
    fig = FIGURES[name](sim_dataset)
    assert "simulated" in fig.get_suptitle()
    # ...and inside the plot itself, in every panel that draws data
    panels = [ax for ax in fig.axes if ax.axison and ax.get_label() != "<colorbar>"]
    assert all("SIMULATED" in [t.get_text() for t in ax.texts] for ax in panels)
    # ...on top of the data, not hidden under bars (fig-megamoe-timeline's were)
    for ax in panels:
        stamp = next(t for t in ax.texts if t.get_text() == "SIMULATED")
        drawn = [a for a in ax.get_children() if a is not stamp and a.get_visible()]
        assert stamp.get_zorder() > max(a.get_zorder() for a in drawn)
    out = tmp_path / f"{name}.pdf"
    save_figure(fig, out)
    assert out.read_bytes().startswith(b"%PDF")
    png = out.with_suffix(".png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000


@pytest.mark.parametrize("name", ["fig-drain", "fig-model-validation", "fig-ulysses"])
def test_measured_figure_names_the_gpus(name, measured_dataset):
    fig = FIGURES[name](measured_dataset)
    title = fig.get_suptitle()
    assert "simulated" not in title
    assert "2x NVIDIA H200" in title
    assert not any("SIMULATED" in t.get_text() for ax in fig.axes for t in ax.texts)


def test_notes_are_wrapped_never_cut(sim_dataset):
    """Model-check details run long: the figure wraps them whole and grows to hold them."""
    fig = FIGURES["fig-model-validation"](sim_dataset)
    notes = "\n".join(t.get_text() for t in fig.texts)
    assert "[...]" not in notes
    assert all(len(line) < 200 for line in notes.splitlines())


def test_legend_sits_beside_the_panels(sim_dataset):
    fig = FIGURES["fig-ulysses"](sim_dataset)
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    right_of_panels = max(ax.get_window_extent().x1 for ax in fig.axes)
    assert legend.x0 >= right_of_panels


def test_render_product_dispatches_to_the_figure(sim_dataset, tmp_path):
    out = tmp_path / "figures" / "fig-drain.pdf"
    render_product("fig-drain", sim_dataset, out)
    assert out.stat().st_size > 0 and out.with_suffix(".png").exists()


@pytest.mark.parametrize("name", ["fig-megamoe-speedup", "fig-model-validation"])
def test_same_data_gives_the_same_bytes(name, sim_dataset, tmp_path):
    """A figure is a function of its data: no creation date, no unseeded jitter."""
    first, second = tmp_path / "a" / f"{name}.pdf", tmp_path / "b" / f"{name}.pdf"
    render_product(name, sim_dataset, first)
    render_product(name, sim_dataset, second)
    for ext in (".pdf", ".png"):
        assert first.with_suffix(ext).read_bytes() == second.with_suffix(ext).read_bytes()


def test_unknown_product_is_refused(sim_dataset, tmp_path):
    with pytest.raises(ValueError, match="unknown product 'fig-nope'"):
        render_product("fig-nope", sim_dataset, tmp_path / "x.pdf")


def test_failed_points_are_counted_on_the_figure(sim_dataset):
    notes = " ".join(texts(FIGURES["fig-issue-vs-gap"](sim_dataset)))
    assert "1 point failed (timeout: 1), not plotted" in notes
    megamoe_notes = " ".join(texts(FIGURES["fig-megamoe-speedup"](sim_dataset)))
    assert "1 point failed (unsupported: 1)" in megamoe_notes


def test_megamoe_speedup_adds_the_baseline_row_only_when_there_are_baselines(tmp_path):
    plain = make_dataset(tmp_path, "sim-moe", attention=False)
    assert len(FIGURES["fig-megamoe-speedup"](plain).axes) == 4  # bars, 3 group panels
    ds = tmp_path / "h200x2-moe"
    write_megamoe(ds, [1.25, 0.8] * 4, baselines=True)
    fig = FIGURES["fig-megamoe-speedup"](ds)
    assert len(fig.axes) == 6
    ratios, pair = fig.axes[4], fig.axes[5]
    labels = [t.get_text() for t in ratios.get_legend().get_texts()]
    assert labels[0].startswith("unfused torch pipeline (geomean") and "n=8" in labels[0]
    assert labels[1].startswith("DeepGEMM SM90 MegaMoE") and "n=4" in labels[1]
    unfused_y = sorted(ratios.collections[0].get_offsets()[:, 1])
    assert unfused_y[0] == pytest.approx(0.4) and unfused_y[-1] == pytest.approx(0.5)
    # DeepGEMM ran both schedules on the four w8a8 configurations: its speedup is 1.2
    assert list(pair.collections[0].get_offsets()[:, 1]) == pytest.approx([1.2] * 4)


def test_megamoe_speedup_plots_flashinfer_where_measured_and_says_why_it_has_no_ok_time(
    tmp_path,
):
    ds = tmp_path / "h200x2-moe"
    write_megamoe(ds, [1.25, 0.8] * 4, baselines=True, flashinfer="ok")
    ratios = FIGURES["fig-megamoe-speedup"](ds).axes[4]
    labels = [t.get_text() for t in ratios.get_legend().get_texts()]
    assert labels[-1].startswith("FlashInfer SM90 FP8 MegaMoE (geomean w8a8")
    assert "n=4" in labels[-1]
    assert ratios.collections[-1].get_offsets()[:, 1].tolist() == pytest.approx(
        sorted([80 / 90, 100 / 90] * 2)
    )
    bare = tmp_path / "h200x2-none"
    write_megamoe(bare, [1.25] * 8, baselines=True, flashinfer="unsupported")
    notes = " ".join(texts(FIGURES["fig-megamoe-speedup"](bare)))
    assert "FlashInfer SM90 FP8 MegaMoE: no configuration with an ok time, not plotted" in notes
    assert "8 unsupported (" in notes


def test_issue_vs_gap_states_both_definitions(sim_dataset):
    fig = FIGURES["fig-issue-vs-gap"](sim_dataset)
    titles = [ax.get_title() for ax in fig.axes]
    assert any("slowest producer" in t for t in titles)
    assert any("whole-burst window" in t for t in titles)


def _panel(fig, *words):
    """The panel whose title holds every word (titles may be wrapped to a narrowed panel)."""
    return next(ax for ax in fig.axes if all(w in " ".join(ax.get_title().split()) for w in words))


def _dashed_starts(ax) -> list[float]:
    return sorted(line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--")


def test_issue_vs_gap_has_a_free_and_an_aligned_row_with_model_lines_on_the_aligned_one(
    sim_dataset,
):
    """The dashed model line at G=0 is V/R with R from the model file (365 GB/s), drawn
    on the row the model was fitted to (aligned, in the fixture), not on the free one."""
    fig = FIGURES["fig-issue-vs-gap"](sim_dataset)
    assert len(fig.axes) == 4
    model = json.loads((sim_dataset / layout.MODEL_JSON).read_text())
    R = model["params"]["R_GBps"]["value"] * 1e3
    expected = sorted(132 * producer_bytes(V, 132) / R for V in (1 << 20, 4 << 20))
    aligned = _panel(fig, "aligned", "slowest producer")
    assert "gap_sweep_barrier" in aligned.get_title()
    assert _dashed_starts(aligned) == pytest.approx(expected, rel=1e-9)
    assert _dashed_starts(_panel(fig, "free-running", "slowest producer")) == []
    local = [line for line in _panel(fig, "free-running", "window").get_lines()]
    assert any(line.get_linestyle() == ":" for line in local)  # the local control


def test_issue_vs_gap_without_an_aligned_study_has_one_row_and_says_so(tmp_path):
    ds = make_dataset(tmp_path, "sim-free", megamoe=False, attention=False)
    (ds / layout.microbench_raw("gap_sweep_barrier")).unlink()
    fig = FIGURES["fig-issue-vs-gap"](ds)
    assert len(fig.axes) == 2
    notes = " ".join(texts(fig))
    assert "no study gap_sweep_barrier in this dataset" in notes
    assert "on the free-running row only" in notes  # the model still has a row to go on
    assert _dashed_starts(fig.axes[0])


def test_backpressure_map_reads_the_aligned_sweep_when_there_is_one(tmp_path):
    ds = make_dataset(tmp_path, "sim-map", megamoe=False, attention=False)
    fig = FIGURES["fig-backpressure-map"](ds)
    assert "(gap_sweep_barrier)" in fig.get_suptitle()
    assert [ax.get_title() for ax in fig.axes[:2]] == [
        "peer GPU (NVLink), K=132, measured",
        "peer GPU (NVLink), K=132, model: steady-train law",
    ]
    (ds / layout.microbench_raw("gap_sweep_barrier")).unlink()
    fig = FIGURES["fig-backpressure-map"](ds)
    assert "(gap_sweep)" in fig.get_suptitle()
    assert "this dataset has no gap_sweep_barrier" in " ".join(texts(fig))


def test_drain_marks_sync_and_draws_the_ceilings(sim_dataset):
    from fixtures import CEILINGS, LINE_RATE

    fig = FIGURES["fig-drain"](sim_dataset)
    rate_ax = _panel(fig, "aggregate issue rate")
    levels = {
        round(line.get_ydata()[0], 6) for line in rate_ax.get_lines() if len(line.get_ydata()) == 2
    }
    assert {CEILINGS["sm_store"], CEILINGS["copy_engine"], LINE_RATE, 365.0} <= levels
    faces = {
        str(line.get_markerfacecolor()) for line in rate_ax.get_lines() if line.get_marker() == "o"
    }
    assert "none" in faces and len(faces) > 1  # hollow free-running, filled aligned
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "free-running" in labels and "aligned (grid barrier before each burst)" in labels


def test_isolated_draws_every_variant_of_the_capacity_law_per_K(sim_dataset):
    from fixtures import CAPPED_AT, WINDOW_Q

    fig = FIGURES["fig-isolated"](sim_dataset)
    assert [ax.get_title().split("\n")[0] for ax in fig.axes] == [
        "peer GPU (NVLink), K=66",
        "peer GPU (NVLink), K=132",
    ]
    MiB = 1 << 20
    for ax, K in zip(fig.axes, (66, 132), strict=True):
        styles = {line.get_linestyle() for line in ax.get_lines()}
        assert {"--", "-.", "-"} <= styles and len(styles - {"--", "-.", "-", ":"}) == 1
        verticals = sorted(
            line.get_xdata()[0]
            for line in ax.get_lines()
            if line.get_xdata()[0] == line.get_xdata()[-1]
        )
        # shared: S; window: K q; shared_plus_window: S/2 + K q/2; capped: that line up to
        # its value at K = CAPPED_AT (the fixture's variants)
        assert K * WINDOW_Q in verticals and 2 * MiB in verticals
        assert pytest.approx(MiB + K * WINDOW_Q / 2) in verticals
        assert pytest.approx(MiB + min(K, CAPPED_AT) * WINDOW_Q / 2) in verticals
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(label.startswith("model, shared (chosen): Q = S") for label in labels)
    assert any(label.startswith("model, capped: Q = min(S + K q, C)") for label in labels)


def test_model_validation_marks_held_out_and_free_running(sim_dataset):
    fig = FIGURES["fig-model-validation"](sim_dataset)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"fitted", "held out", "never fitted: free-running", "period"} <= set(labels)
    # Issue 27: the details are tab-model-checks' rows; the figure counts the checks in a line
    notes = [n for n in texts(fig) if "checks:" in n]
    assert len(notes) == 1 and "held out (capacity law shared): median |err|" in notes[0]
    assert "(each in tab-model-checks)" in notes[0]
    assert not any("free-running records" in n or "window variant" in n for n in texts(fig))


def test_ulysses_without_model_omits_the_prediction_with_a_note(tmp_path):
    ds = make_dataset(tmp_path, "sim-nomodel", model=False, megamoe=False)
    fig = FIGURES["fig-ulysses"](ds)
    assert any("completion-coupled model omitted" in t for t in texts(fig))
    assert not any(
        line.get_linestyle() == ":" and line.get_color() == "k"
        for ax in fig.axes
        for line in ax.get_lines()
    )


def test_ulysses_backend_without_an_ok_point_gets_a_panel_saying_why(tmp_path):
    ds = make_dataset(tmp_path, "sim-no-triton", megamoe=False)
    path = ds / "raw" / "attention.json"
    doc = json.loads(path.read_text())
    for r in doc["records"]:
        if r["point"]["backend"] == "triton":
            r.update(status="unsupported", error="triton: not importable")
            for key in ("samples", "summary", "correct"):
                r.pop(key, None)
    path.write_text(json.dumps(doc))
    fig = FIGURES["fig-ulysses"](ds)
    titles = [ax.get_title() for ax in fig.axes]
    assert "triton: not measured\npeer path, P=2" in titles
    assert any(
        "unsupported: triton: not importable" in t.get_text().replace("\n", " ")
        for ax in fig.axes
        for t in ax.texts
    )


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        ("fig-issue-vs-gap", "raw/microbench/gap_sweep.json"),
        ("fig-drain", "raw/microbench/drain.json"),
        ("fig-isolated", "raw/microbench/isolated.json"),
        ("fig-model-validation", "model/burst_gap.json"),
        ("fig-megamoe-speedup", "raw/megamoe.json"),
        ("fig-megamoe-timeline", "raw/megamoe_trace.json"),
        ("fig-store-span-cdf", "raw/megamoe_trace.json"),
        ("fig-ulysses", "raw/attention.json"),
    ],
)
def test_missing_file_raises_no_data_naming_it(name, missing, tmp_path):
    ds = tmp_path / "sim-empty"
    ds.mkdir()
    with pytest.raises(NoDataError, match=missing) as info:
        render_product(name, ds, tmp_path / "out.pdf")
    assert "sim-empty" in str(info.value)
    assert not (tmp_path / "out.pdf").exists()


def test_microbench_without_model_raises_no_data_naming_the_model(tmp_path):
    ds = tmp_path / "sim-nofit"
    write_microbench(ds, "drain")
    with pytest.raises(NoDataError, match="model/burst_gap.json"):
        render_product("fig-drain", ds, tmp_path / "out.pdf")


def test_schema_invalid_raw_file_names_file_and_field(tmp_path):
    ds = tmp_path / "sim-bad"
    path = write_microbench(ds, "gap_sweep")
    write_model(ds)
    doc = json.loads(path.read_text())
    doc["records"][3]["samples"]["period_us"] = "fast"
    path.write_text(json.dumps(doc))
    with pytest.raises(
        RawResultError, match=r"gap_sweep\.json: field 'records/3/samples/period_us'"
    ):
        render_product("fig-issue-vs-gap", ds, tmp_path / "out.pdf")


def test_all_points_failed_is_no_data(tmp_path):
    ds = tmp_path / "sim-allfail"
    path = write_microbench(ds, "drain")
    write_model(ds)
    doc = json.loads(path.read_text())
    doc["records"] = [
        {"id": r["id"], "point": r["point"], "status": "failed", "error": "boom"}
        for r in doc["records"]
    ]
    path.write_text(json.dumps(doc))
    with pytest.raises(NoDataError, match=r"drain\.json has no ok record \(failed: 12\)"):
        render_product("fig-drain", ds, tmp_path / "out.pdf")


def test_byte_labels_absorb_store_alignment():
    assert fmt_bytes(132 * producer_bytes(4 << 20, 132)) == "4 MiB"  # rounded to K*B
    assert fmt_bytes(256 * 1024) == "256 KiB"
    assert fmt_bytes(1.5 * (1 << 20)) == "1.5 MiB"


def test_trace_series_reads_both_encodings_of_the_local_control():
    assert trace_series({"schedule": "local_control"}) == "local_control"
    assert trace_series({"schedule": "expert_wave", "variant": "local_control"}) == "local_control"
    assert trace_series({"schedule": "interleaved", "variant": "interleaved"}) == "interleaved"


def test_store_span_cdf_draws_one_distribution_per_run(sim_dataset):
    """Configurations aggregated: one curve per run, whatever the number of configurations,
    and the per-configuration medians in a panel of their own."""
    fig = FIGURES["fig-store-span-cdf"](sim_dataset)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert [label.split(":")[0] for label in labels] == [
        "peer, expert waves",
        "peer, interleaved",
        "peer, local-store control",
    ]
    assert "medians 3.50 us" in labels[2]
    cdf, detail = fig.axes[:2]
    assert len(cdf.get_lines()) == 3
    assert len(detail.collections) == 3


REPORT_WIDTH_PX = 1190  # the summary column at a 1400 px window (test_report_browser measures it)
CSS_PX_PER_PT = 96 / 72


def smallest_text_pt_at_report_width(fig) -> float:
    """The smallest text of a figure, in points, as the report shows it: the PNG (DPI px
    per inch) scaled down to the report's width when wider."""
    fig.canvas.draw()
    width_px = fig.get_size_inches()[0] * common.DPI
    scale = min(1.0, REPORT_WIDTH_PX / width_px)
    sizes = [
        t.get_fontsize()
        for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_fontsize"))
        if t.get_visible() and t.get_text().strip()
    ]
    return min(sizes) * common.DPI / 72 / CSS_PX_PER_PT * scale


def test_ulysses_is_readable_at_page_width_on_both_paths(tmp_path):
    """Issue 27: the old fig-ulysses was 12 panels across 2765 px. Now one row per setting,
    one column per backend: the committed reference and a two-path dataset both show every
    text at 8 pt or more at the report's width, each panel naming its path and P."""
    from fixtures import write_attention_paths

    ds = tmp_path / "h200x2-paths"
    write_attention_paths(ds, {("peer", 2): 1.1, ("host", 2): 1.3, ("host", 8): 0.9})
    reference = Path(__file__).resolve().parents[1] / "results" / "ref-h200x2"
    for dataset, settings in (
        (reference, ["peer path, P=2", "peer path, P=8 emulated on 2 GPUs"]),
        (ds, ["peer path, P=2", "host path, P=2", "host path, P=8 emulated on 1 GPU"]),
    ):
        fig = FIGURES["fig-ulysses"](dataset)
        assert smallest_text_pt_at_report_width(fig) >= 8.0
        titles = [ax.get_title() for ax in fig.axes]
        for backend in ("fa3", "triton"):
            for setting in settings:
                assert f"{backend}\n{setting}" in titles
        # alone, serial and fused are three lines of their own colours in every panel
        panel = next(ax for ax in fig.axes if ax.get_title() == f"fa3\n{settings[-1]}")
        colours = {line.get_color() for line in panel.get_lines()}
        assert {"tab:green", "tab:red", "tab:blue"} <= colours
        matplotlib.pyplot.close(fig)


# ---- two store paths -----------------------------------------------------------------


@pytest.fixture(scope="module")
def two_path_dataset(tmp_path_factory):
    """Microbenchmarks and fits on the peer path and the host path (R = 52 GB/s)."""
    root = tmp_path_factory.mktemp("paths")
    return make_dataset(root, "h200x2-paths", megamoe=False, attention=False, paths=PATHS)


PATHS = ("peer", "host")
PEER_FAR, HOST_FAR = "peer GPU (NVLink)", "host memory"


def _levels(ax) -> set[float]:
    return {round(line.get_ydata()[0], 6) for line in ax.get_lines() if len(line.get_ydata()) == 2}


def test_drain_has_a_row_per_path_with_that_paths_references(two_path_dataset):
    fig = FIGURES["fig-drain"](two_path_dataset)
    assert len(fig.axes) == 4
    host_rate = _panel(fig, HOST_FAR, "aggregate issue rate")
    assert {HOST_CEILINGS["sm_store"], HOST_CEILINGS["copy_engine"], HOST_LINE_RATE} <= _levels(
        host_rate
    )
    assert HOST_TRUTH["R_GBps"] in _levels(host_rate)
    assert 366.0 not in _levels(host_rate)  # the peer's SM-store ceiling stays on its row
    assert 366.0 in _levels(_panel(fig, PEER_FAR, "aggregate issue rate"))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "host: fitted R 52 GB/s" in labels and "peer: fitted R 365 GB/s" in labels
    assert "host: sm-store host memory ceiling 52 GB/s" in labels
    assert "host: host link line rate (spec) 63 GB/s" in labels


def test_isolated_has_a_row_per_path_with_its_capacity(two_path_dataset):
    fig = FIGURES["fig-isolated"](two_path_dataset)
    titles = [ax.get_title().split("\n")[0] for ax in fig.axes]
    assert titles == [f"{far}, K={K}" for far in (PEER_FAR, HOST_FAR) for K in (66, 132)]
    host = _panel(fig, HOST_FAR, "K=132")
    verticals = {
        line.get_xdata()[0]
        for line in host.get_lines()
        if line.get_xdata()[0] == line.get_xdata()[-1]
    }
    assert HOST_TRUTH["Q_bytes"] in verticals and 2 * (1 << 20) not in verticals
    assert any(line.get_linestyle() == ":" for line in host.get_lines())  # the local control


def test_issue_vs_gap_has_rows_per_path_and_sync_with_each_paths_model(two_path_dataset):
    fig = FIGURES["fig-issue-vs-gap"](two_path_dataset)
    assert len(fig.axes) == 8  # (peer, host) x (free, aligned) x two definitions
    expected = {
        far: sorted(132 * producer_bytes(V, 132) / (R * 1e3) for V in (1 << 20, 4 << 20))
        for far, R in ((PEER_FAR, 365.0), (HOST_FAR, HOST_TRUTH["R_GBps"]))
    }
    for far, starts in expected.items():
        assert _dashed_starts(_panel(fig, far, "aligned", "slowest producer")) == pytest.approx(
            starts, rel=1e-9
        )
        assert _dashed_starts(_panel(fig, far, "free-running", "slowest producer")) == []
    notes = " ".join(texts(fig))
    assert f"{HOST_FAR}: model lines" in notes and f"{PEER_FAR}: model lines" in notes


def test_backpressure_map_and_model_validation_per_path(two_path_dataset):
    fig = FIGURES["fig-backpressure-map"](two_path_dataset)
    titles = [ax.get_title() for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert titles == [
        f"{far}, K=132, {what}"
        for far in (PEER_FAR, HOST_FAR)
        for what in ("measured", "model: steady-train law")
    ]
    fig = FIGURES["fig-model-validation"](two_path_dataset)
    assert [ax.get_title().split("\n")[0] for ax in fig.axes[::3]] == [PEER_FAR, HOST_FAR]
    notes = " ".join(texts(fig))
    assert f"{HOST_FAR}: held out" in notes and f"{PEER_FAR}: held out" in notes


def test_a_host_only_dataset_renders_every_microbench_figure_labelled_host(tmp_path):
    ds = make_dataset(tmp_path, "h200x1-host", megamoe=False, attention=False, paths=("host",))
    for name in ("fig-drain", "fig-isolated", "fig-issue-vs-gap", "fig-backpressure-map"):
        fig = FIGURES[name](ds)
        titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
        assert titles and all(t.startswith(HOST_FAR) for t in titles), (name, titles)
        assert "1x NVIDIA H200" in fig.get_suptitle()


# ------------------------------------------------------------ MegaMoE per store path


@pytest.fixture(scope="module")
def host_dataset(tmp_path_factory):
    """One GPU, the host path (fixtures.write_megamoe_host), its trace beside the peer
    path's (records without a path)."""
    ds = tmp_path_factory.mktemp("data") / "h200x1-host"
    write_megamoe_host(ds)
    write_megamoe_trace_host(ds, peer_too=True)
    return ds


def test_trace_series_reads_the_host_paths_control_as_its_share_zero():
    assert trace_series({"schedule": "expert_wave", "remote_fraction": 0.0}) == "local_control"
    assert trace_series({"schedule": "expert_wave", "remote_fraction": 0.25}) == "expert_wave"


def test_megamoe_speedup_has_a_bars_panel_per_host_share_naming_the_path(host_dataset):
    fig = FIGURES["fig-megamoe-speedup"](host_dataset)
    assert "host (host memory)" in fig.get_suptitle()
    titles = [" ".join(ax.get_title().split()) for ax in fig.axes if ax.get_title()]  # unwrapped
    shares = ("0 (local control)", "0.25", "0.5")
    assert len(titles) == len(shares)
    for title, f in zip(titles, shares, strict=True):
        assert title.startswith(f"host path (host memory), host share f = {f} interleaved"), title
    assert "interleaved faster in 8, slower in 0, tie in 0" in titles[1]
    assert "1 noisy" in titles[2]  # fixtures.noisy_host_config, hatched
    bars = fig.axes[2].patches
    assert sum(bar.get_hatch() == "///" for bar in bars) == 1
    assert len(fig.axes) == 3 + 3  # three shares' bars, one row of group panels


def test_megamoe_lead_figure_draws_a_line_per_lead_and_marks_auto(host_dataset):
    fig = FIGURES["fig-megamoe-lead"](host_dataset)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2  # the two shapes of the map (w8a8, balanced)
    assert all(ax.get_title().startswith("host path:") for ax in panels)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:4] == ["lead 0 rows", "lead 256 rows", "lead 1024 rows", "lead 4096 rows"]
    assert labels[4].startswith("auto")
    chosen = {t.get_text() for t in panels[0].texts if t.get_text().isdigit()}
    assert chosen == {str(AUTO_LEAD_ROWS)}
    assert "kernel time" in panels[0].get_ylabel()


def test_megamoe_lead_figure_needs_the_lead_sweep(tmp_path):
    ds = tmp_path / "sim-moe"
    write_megamoe(ds)
    with pytest.raises(NoDataError, match="lead-sweep"):
        FIGURES["fig-megamoe-lead"](ds)


def test_timeline_draws_the_first_configuration_of_each_path(host_dataset):
    fig = FIGURES["fig-megamoe-timeline"](host_dataset)
    titles = [ax.get_title() for ax in fig.axes]
    assert [t.split(":")[0] for t in titles] == ["peer path"] * 2 + ["host path"] * 2
    assert "host share f = 0.25; interleaved" in titles[3]
    assert "peer (peer GPU (NVLink)), host (host memory)" in fig.get_suptitle()


def test_store_span_cdf_has_a_row_per_path_and_the_host_control_on_its_configuration(
    host_dataset,
):
    fig = FIGURES["fig-store-span-cdf"](host_dataset)
    peer_cdf, peer_detail, host_cdf, host_detail = fig.axes[:4]
    assert peer_cdf.get_title().startswith("peer path") and "host memory" in host_cdf.get_xlabel()
    assert [t.get_text() for t in host_detail.get_yticklabels()] == [
        "dit-moe-g-16e2a\nw4a8, balanced, T=1024, f=0.25"
    ]
    # expert waves, interleaved and the f = 0 control, all on the one row
    rows = [tuple(c.get_offsets()[:, 1]) for c in host_detail.collections]
    assert rows == [(0.0,), (0.0,), (0.0,)]
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "host, local-store control: medians 3.50 us" in labels


def test_a_trace_record_is_the_run_its_variant_names_even_at_host_share_zero():
    """A trace file at f = 0 only (results/ref-h200x1-flashinfer) still holds both
    schedules' runs beside the local control; main-grid points at f = 0 are the control."""
    from xstage_bench.report.analysis.megamoe import trace_series

    traced = {"schedule": "expert_wave", "path": "host", "remote_fraction": 0.0}
    assert trace_series({**traced, "variant": "interleaved"}) == "interleaved"
    assert trace_series({**traced, "variant": "local_control"}) == "local_control"
    assert trace_series(traced) == "local_control"  # a main-grid point at f = 0
    assert trace_series({**traced, "remote_fraction": 0.25}) == "expert_wave"
    # ... but such a run stores nothing across its path: no remote-store span to show
    from xstage_bench.report.analysis.megamoe import stores_far

    assert not stores_far({**traced, "variant": "interleaved"})
    assert stores_far({**traced, "variant": "interleaved", "remote_fraction": 0.25})
    assert stores_far({"schedule": "expert_wave", "variant": "expert_wave", "path": "peer"})
    assert not stores_far({**traced, "variant": "local_control", "remote_fraction": 0.25})


def test_next_op_lifts_the_operations_that_wait_for_the_drain(sim_dataset):
    fig = FIGURES["fig-next-op"](sim_dataset)
    peer_panel = fig.axes[0]
    assert "G = 100 us" in peer_panel.get_title()
    # the remote points (filled markers), x in launch.NEXT_OPS order: atomic 3, fence 4
    heights: dict[int, list[float]] = {}
    for line in peer_panel.get_lines():
        if line.get_markerfacecolor() == "none" or line.get_linestyle() != "None":
            continue
        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True):
            heights.setdefault(round(x), []).append(y)
    waiting = [y for x in (3, 4) for y in heights[x]]
    free = [y for x in (0, 1) for y in heights[x]]
    assert sum(waiting) / len(waiting) > sum(free) / len(free) + 3.0


def test_next_op_without_an_ok_point_draws_a_panel_saying_why(tmp_path):
    ds = tmp_path / "sim-next"
    path = write_microbench(ds, "next_op")
    doc = json.loads(path.read_text())
    for record in doc["records"]:
        record.update(status="unsupported", error="not modelled", samples={}, summary={})
    path.write_text(json.dumps(doc))
    fig = FIGURES["fig-next-op"](ds)
    assert any("no ok record" in t.get_text() for t in fig.axes[0].texts)
