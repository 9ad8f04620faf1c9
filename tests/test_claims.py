"""tab-claims verdicts on SYNTHETIC datasets (tests/fixtures.py): every claim gets a verdict
computed from the data, a reason where it differs, why where it is not measured, and the
counterpart columns come from their own sources."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from fixtures import TRUTH, make_dataset, megamoe_configs, write_megamoe

from xstage_bench.report import paper
from xstage_bench.report.claims import claim_answers, counterparts, verdicts
from xstage_bench.report.claims.claim_answers import Answer, NotMeasured
from xstage_bench.report.claims.claim_sources import Sources
from xstage_bench.report.tables import claims

VERDICTS = set(verdicts.VERDICTS)
SIM_COLUMN = counterparts.SIM_B200.column


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A measured dataset (with the unfused baseline) beside a simulated 'sim-b200'."""
    root = tmp_path_factory.mktemp("results")
    measured = make_dataset(root, "h200x2-fixture")
    write_megamoe(measured, baselines=True)
    make_dataset(root, "sim-b200")
    return root


def frame_of(dataset):
    return claims.build(dataset).frame.set_index("claim")


def test_every_claim_has_a_verdict_and_a_why(root):
    frame = frame_of(root / "h200x2-fixture")
    assert set(frame.index) == {c.id for c in paper.CLAIMS}
    assert set(frame["verdict"]) <= VERDICTS
    assert (frame["why"].str.len() > 0).all()
    assert (frame["criterion"].str.len() > 0).all()


def test_a_differing_parameter_names_the_hardware(root):
    row = frame_of(root / "h200x2-fixture").loc["bg.R"]
    assert row["verdict"] == verdicts.DIFFERS
    assert row["why"].startswith(f"{TRUTH['R_GBps']:g} vs 717 GB/s: ")
    assert "2x NVIDIA H200" in row["why"] and paper.PAPER_LINK in row["why"]


def test_a_megamoe_speedup_that_differs_names_the_gpu_count(root):
    row = frame_of(root / "h200x2-fixture").loc["moe.geomean"]
    assert row["verdict"] == verdicts.DIFFERS
    assert "P=2 vs 8 GPUs" in row["why"]


def test_not_measured_says_why_from_the_records(root):
    row = frame_of(root / "h200x2-fixture").loc["uly.fa4_max"]
    assert row["verdict"] == verdicts.NOT_MEASURED
    assert row["ours"] == claims.NOT_MEASURED
    assert "fa4" in row["why"]


def test_completion_coupled_ceiling_from_interleaved_time_and_remote_bytes(root):
    """unfused / (interleaved + bytes per rank / R): the fixture's unfused time is 200 us,
    its interleaved 100/speedup us, 1 MiB over NVLink per configuration, two ranks."""
    frame = frame_of(root / "h200x2-fixture")
    speedups = [0.95 + 0.05 * i for i in range(len(megamoe_configs()))]
    drain_us = (1 << 20) / 2 / (TRUTH["R_GBps"] * 1e3)  # GB/s = 1e3 bytes/us
    expected = np.exp(np.mean([np.log(200.0 / (100.0 / s + drain_us)) for s in speedups]))
    assert float(frame.loc["moe.completion_coupled_ceiling", "ours"]) == pytest.approx(
        expected, abs=1e-3
    )
    assert "measured" in frame.loc["moe.completion_coupled_ceiling", "ours_note"]


def test_ceiling_without_a_baseline_says_why(root):
    row = frame_of(root / "sim-b200").loc["moe.completion_coupled_ceiling"]
    assert row["verdict"] == verdicts.NOT_MEASURED
    assert "unfused" in row["why"]


def test_the_simulated_counterpart_sits_in_its_own_column(root):
    frame = frame_of(root / "h200x2-fixture")
    assert float(frame.loc["bg.R", SIM_COLUMN]) == pytest.approx(TRUTH["R_GBps"])
    # The simulator writes no unfused baseline: n/a, and the note says why.
    assert frame.loc["moe.over_unfused", SIM_COLUMN] == claims.NOT_ANSWERED
    assert "unfused" in frame.loc["moe.over_unfused", f"{SIM_COLUMN} note"]


def test_a_dataset_is_not_its_own_counterpart(root):
    frame = frame_of(root / "sim-b200")
    assert (frame[SIM_COLUMN] == claims.NOT_ANSWERED).all()


def test_counterpart_column_without_its_dataset(tmp_path):
    frame = frame_of(make_dataset(tmp_path, "h200x2-alone", megamoe=False, attention=False))
    assert (frame[SIM_COLUMN] == claims.NOT_ANSWERED).all()
    assert (frame[f"{SIM_COLUMN} note"] == "source not present").all()


def test_a_new_counterpart_is_one_more_column(root, monkeypatch):
    """How an emulated source joins: its own sources and answers, nothing else changes."""
    emulated = counterparts.Counterpart(
        column="emulated (P=8)",
        kind="emulated",
        sources=lambda dataset_dir: Sources.load(dataset_dir),
        answers={"moe.geomean": lambda src: Answer((1.2,), "1.200", "emulated crossover")},
    )
    monkeypatch.setattr(claims, "COUNTERPARTS", (counterparts.SIM_B200, emulated))
    frame = frame_of(root / "h200x2-fixture")
    assert frame.loc["moe.geomean", "emulated (P=8)"] == "1.200"
    assert frame.loc["bg.R", "emulated (P=8)"] == claims.NOT_ANSWERED


def test_an_emulated_file_of_the_dataset_answers_through_the_same_functions(root, tmp_path):
    """A raw file of the dataset itself (here the MegaMoE sweep under another name) read as
    an emulated counterpart: the measured answer functions give its column."""
    ds = tmp_path / "h200x2-emulated"
    shutil.copytree(root / "h200x2-fixture", ds)
    shutil.copy(ds / "raw" / "megamoe.json", ds / "raw" / "megamoe_emulated.json")
    emulated = counterparts.Counterpart(
        column="emulated",
        kind="emulated",
        sources=counterparts.dataset_file("raw/megamoe_emulated.json", "megamoe"),
        answers={"moe.geomean": claim_answers.MEASURED["moe.geomean"]},
    )
    src = emulated.sources(ds)
    assert src.megamoe is not None and src.attention is None
    assert emulated.sources(root / "sim-b200") is None
    found = emulated.answers["moe.geomean"](src)
    assert found.text == frame_of(ds).loc["moe.geomean", "ours"]


@pytest.mark.parametrize(
    ("claim_id", "values", "expected"),
    [
        ("bg.R", (700.0,), verdicts.REPRODUCED),  # within 10%
        ("bg.R", (350.0,), verdicts.DIFFERS),
        ("moe.geomean", (1.20,), verdicts.REPRODUCED),  # within 5%
        ("moe.geomean", (1.10,), verdicts.DIFFERS),
        ("moe.span_wave", (9.5, 12.0), verdicts.REPRODUCED),  # ranges overlap
        ("moe.span_wave", (0.5, 0.8), verdicts.DIFFERS),
        ("moe.span_vs_local", (0.4,), verdicts.REPRODUCED),  # a bound
        ("moe.span_vs_local", (0.6,), verdicts.DIFFERS),
        ("moe.configs", (84.0,), verdicts.NOT_A_RESULT),
        ("moe.configs", (83.0,), verdicts.NOT_A_RESULT),
    ],
)
def test_criteria(claim_id, values, expected, root):
    setting = verdicts.Setting.of(Sources.load(root / "h200x2-fixture"))
    claim = paper.CLAIMS_BY_ID[claim_id]
    found = Answer(values, ", ".join(f"{v:g}" for v in values), "")
    assert verdicts.judge(claim, found, setting).verdict == expected


def test_the_paper_value_inside_our_ci_reproduces_a_parameter(root):
    setting = verdicts.Setting.of(Sources.load(root / "h200x2-fixture"))
    found = Answer((500.0,), "500", "", ci=(400.0, 800.0))
    assert verdicts.judge(paper.CLAIMS_BY_ID["bg.R"], found, setting).verdict == "reproduced"


def test_not_measured_keeps_the_why(root):
    setting = verdicts.Setting.of(Sources.load(root / "h200x2-fixture"))
    result = verdicts.judge(paper.CLAIMS_BY_ID["bg.R"], NotMeasured("no model"), setting)
    assert (result.verdict, result.why) == (verdicts.NOT_MEASURED, "no model")


def test_a_smoke_dataset_is_compared_with_the_smoke_runs_sibling(root, tmp_path):
    """A smoke run's datasets are <name>-smoke: its counterpart column reads the smoke
    sibling, never a full-size dataset left from another run (nor a folder without data)."""
    assert counterparts.sibling_name("sim-b200", "sim-h200-smoke") == "sim-b200-smoke"
    assert counterparts.sibling_name("sim-b200", "ref-h200x2") == "sim-b200"
    smoke = tmp_path / "sim-h200-smoke"
    shutil.copytree(root / "h200x2-fixture", smoke)
    (tmp_path / "sim-b200" / ".config").mkdir(parents=True)  # stamps only, no data
    assert counterparts.SIM_B200.sources(smoke) is None
    shutil.copytree(root / "sim-b200", tmp_path / "sim-b200-smoke")
    assert counterparts.SIM_B200.sources(smoke) is not None


def test_a_cpu_test_dataset_answers_no_claim_and_says_so(root, tmp_path):
    from xstage_bench.data.results import read_raw, write_raw

    ds = tmp_path / "cpu-test"
    shutil.copytree(root / "h200x2-fixture", ds)
    for path in (ds / "raw").rglob("*.json"):
        doc = read_raw(path)
        doc["environment"]["device_type"] = "cpu"
        write_raw(path, doc)
    table = claims.build(ds)
    assert set(table.frame["verdict"]) == {verdicts.NOT_MEASURED}
    assert table.frame["why"].str.contains("CPU test").all()
    assert "CPU test of the harness" in table.label


def test_a_host_path_dataset_answers_from_its_host_share_and_p8_with_the_setting_named(tmp_path):
    """One GPU (the host path): the MegaMoE claims read the main grid's smallest non-zero
    host share, the attention claims the P nearest the paper's 8; each row says which;
    a reference beside it answers in its own column."""
    from fixtures import write_attention_paths, write_megamoe_host

    host = make_dataset(tmp_path, "h200x1", megamoe=False, attention=False, paths=("host",))
    write_megamoe_host(host)
    write_attention_paths(host, {("host", 2): 1.2, ("host", 8): 1.5}, world_size=1)
    frame = frame_of(host)
    moe = frame.loc["moe.geomean"]
    assert moe["ours_note"].startswith("host path, f = 0.25 of the combine rows to host memory")
    assert moe["verdict"] in VERDICTS - {verdicts.NOT_MEASURED}
    uly = frame.loc["uly.fa3_max"]
    assert uly["ours_note"].startswith("host path, P=8 emulated on 1 GPU")
    assert "goes to host memory" in uly["why"] or uly["verdict"] == verdicts.REPRODUCED
    r = frame.loc["bg.R"]
    assert "to host memory" in r["why"]  # the link the fit is of, not NVLink
    # a committed peer-path sibling answers in its own column; this one has none here
    assert set(frame[counterparts.REF_PEER.column]) == {claims.NOT_ANSWERED}


def test_the_configuration_count_is_reported_but_counts_as_no_result(root):
    """84 = 84 is a property of the grid the config asks for: never 'reproduced'."""
    row = frame_of(root / "h200x2-fixture").loc["moe.configs"]
    assert row["verdict"] == verdicts.NOT_A_RESULT
    assert "property of the grid" in row["why"]


def test_a_simulated_dataset_does_not_reproduce_its_own_inputs(root):
    """Issue 26: sim-b200 'reproduced' T0, R and Q because its profile holds the paper's
    values; they are inputs there, not results. A measured dataset still gets a verdict."""
    frame = frame_of(root / "sim-b200")
    for claim_id in verdicts.SIMULATOR_INPUTS:
        assert frame.loc[claim_id, "verdict"] == verdicts.NOT_A_RESULT, claim_id
        assert "inputs of the simulated profile" in frame.loc[claim_id, "why"]
    assert frame.loc["moe.geomean", "verdict"] != verdicts.NOT_A_RESULT  # a simulated result
    measured = frame_of(root / "h200x2-fixture")
    assert measured.loc["bg.R", "verdict"] == verdicts.DIFFERS
