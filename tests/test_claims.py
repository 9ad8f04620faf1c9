"""tab-claims verdicts on SYNTHETIC datasets (tests/fixtures.py): every claim gets a verdict
computed from the data, a reason where it differs, why where it is not measured, and the
counterpart columns come from their own sources."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

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
    assert row["why"].startswith(f"{TRUTH['R_GBps']:g} (")  # the value, then its CI
    assert " vs 717 GB/s: " in row["why"]
    assert "2x NVIDIA H200" in row["why"] and paper.PAPER_LINK in row["why"]


def test_a_megamoe_speedup_not_reproduced_names_the_gpu_count(root):
    row = frame_of(root / "h200x2-fixture").loc["moe.geomean"]
    assert row["verdict"] in (verdicts.DIFFERS, verdicts.TIE)
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
    value = frame.loc["moe.completion_coupled_ceiling", "ours"].split(" ")[0]
    assert float(value) == pytest.approx(expected, abs=1e-3)
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
        answers={
            "moe.geomean": lambda src: Answer(
                (1.2,), "1.200 (1.1–1.3)", "emulated crossover", cis=((1.1, 1.3),)
            )
        },
    )
    monkeypatch.setattr(claims, "COUNTERPARTS", (counterparts.SIM_B200, emulated))
    frame = frame_of(root / "h200x2-fixture")
    assert frame.loc["moe.geomean", "emulated (P=8)"] == "1.200 (1.1–1.3)"
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
    found = Answer(values, ", ".join(f"{v:g}" for v in values), "", no_ci="a test value")
    assert verdicts.judge(claim, found, setting).verdict == expected


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


# ---------------------------------------------------------------- CIs in the cells (issue 26)

CELL_WITH_CI = re.compile(r"^-?[\d.]+%? \(-?[\d.]+%?–-?[\d.]+%?\)$")


def test_a_cell_shows_the_value_and_its_ci():
    assert claim_answers.with_ci(1.0451, (1.0389, 1.0512), ".3f") == "1.045 (1.039–1.051)"
    assert claim_answers.with_ci(1.0451, None, ".3f") == "1.045"


def test_a_measured_ratio_cell_carries_its_ci(root):
    frame = frame_of(root / "h200x2-fixture")
    assert CELL_WITH_CI.match(frame.loc["moe.geomean", "ours"])
    # one value and CI per head count where a row has several
    for cell in frame.loc["uly.fa3_S=8192", "ours"].split(", "):
        assert CELL_WITH_CI.match(cell), cell


def measured_answers(ds):
    """Every claim's answer from a measured dataset, as tab-claims computes it."""
    src = Sources.load(ds)
    assert not src.simulated
    return {c.id: claim_answers.MEASURED[c.id](src) for c in paper.CLAIMS}


def test_every_measured_ratio_row_has_a_ci(root, tmp_path):
    from fixtures import write_attention_paths, write_megamoe_host

    host = make_dataset(tmp_path, "h200x1", megamoe=False, attention=False, paths=("host",))
    write_megamoe_host(host)
    write_attention_paths(host, {("host", 2): 1.2, ("host", 8): 1.5}, world_size=1)
    ratios = {c.id for c in paper.CLAIMS if c.unit == "x"}
    for ds in (root / "h200x2-fixture", host):
        answers = measured_answers(ds)
        answered = {k for k in ratios if isinstance(answers[k], Answer)}
        assert len(answered) >= 7, ds.name
        for claim_id in answered:
            found = answers[claim_id]
            assert len(found.cis) == len(found.values), (ds.name, claim_id)
            assert all(CELL_WITH_CI.match(c) for c in found.text.split(", ")), found.text
        # the table shows them as computed
        frame = frame_of(ds)
        assert all(CELL_WITH_CI.match(frame.loc[k, "ours"].split(", ")[0]) for k in answered)


def test_every_measured_value_without_a_ci_is_named_in_the_notes(root):
    ds = root / "h200x2-fixture"
    bare = {k: a for k, a in measured_answers(ds).items() if isinstance(a, Answer) and not a.cis}
    assert {"moe.configs", "moe.span_wave", "moe.span_vs_local"} <= set(bare)
    (line,) = [n for n in claims.build(ds).notes if n.startswith("rows whose measured values")]
    for claim_id, found in bare.items():
        assert claim_id in line and found.no_ci in line, claim_id
        assert "(" not in found.text  # the value alone


def test_an_answer_without_a_ci_must_say_why():
    with pytest.raises(ValueError, match="does not say why"):
        Answer((1.0,), "1.000", "")


def test_simulated_values_carry_no_ci_and_the_notes_say_so(root):
    table = claims.build(root / "sim-b200")
    answered = table.frame[table.frame["ours_kind"] == "simulated"]
    assert len(answered) and not answered["ours"].str.contains("–").any()
    assert any("simulated values" in n and "ours" in n for n in table.notes)
    measured = claims.build(root / "h200x2-fixture")
    assert not measured.frame[SIM_COLUMN].str.contains("–").any()
    assert any(f"'{SIM_COLUMN}'" in n for n in measured.notes if n.startswith("simulated"))


def judged(claim_id: str, value: float, ci: tuple[float, float], root) -> verdicts.Verdict:
    setting = verdicts.Setting.of(Sources.load(root / "h200x2-fixture"))
    found = Answer((value,), claim_answers.with_ci(value, ci, ".3f"), "", cis=(ci,))
    return verdicts.judge(paper.CLAIMS_BY_ID[claim_id], found, setting)


@pytest.mark.parametrize(
    ("claim_id", "value", "ci", "expected"),
    [
        # the paper's 1.18 within 5%: [1.121, 1.239]
        ("moe.geomean", 1.20, (1.19, 1.21), verdicts.REPRODUCED),  # the whole CI inside
        ("moe.geomean", 1.15, (1.11, 1.19), verdicts.TIE),  # the value inside, the CI not
        ("moe.geomean", 1.11, (1.10, 1.13), verdicts.TIE),  # the value outside, the CI not
        ("moe.geomean", 1.10, (1.09, 1.11), verdicts.DIFFERS),  # the whole CI outside
        ("moe.geomean", 1.18, (1.00, 1.40), verdicts.TIE),  # straddles both edges
        # a parameter: the paper's value inside a wide CI is no longer enough
        ("bg.R", 700.0, (400.0, 800.0), verdicts.TIE),
        ("bg.R", 700.0, (690.0, 720.0), verdicts.REPRODUCED),
        # a bound: at most 0.5 us
        ("moe.span_vs_local", 0.4, (0.3, 0.45), verdicts.REPRODUCED),
        ("moe.span_vs_local", 0.4, (0.3, 0.6), verdicts.TIE),
        ("moe.span_vs_local", 0.7, (0.6, 0.8), verdicts.DIFFERS),
    ],
)
def test_the_verdict_reads_the_ci(claim_id, value, ci, expected, root):
    assert judged(claim_id, value, ci, root).verdict == expected


def test_a_ci_straddling_the_threshold_is_a_tie_that_names_it(root):
    """A value inside the tolerance whose CI reaches out of it is not reproduced."""
    result = judged("moe.geomean", 1.15, (1.11, 1.19), root)
    assert result.verdict == verdicts.TIE != verdicts.REPRODUCED
    assert "straddles 1.121, the paper's 1.18 less 5%" in result.why
    both = judged("moe.geomean", 1.18, (1.00, 1.40), root)
    assert "1.121" in both.why and "1.239" in both.why


def test_one_head_count_outside_makes_a_row_differ_one_straddling_a_tie(root):
    setting = verdicts.Setting.of(Sources.load(root / "h200x2-fixture"))
    claim = paper.CLAIMS_BY_ID["uly.fa3_S=32768"]  # 1.104 within 5%: [1.049, 1.159]
    inside, straddling, outside = (1.09, 1.11), (1.04, 1.06), (1.00, 1.02)

    def verdict(*cis):
        found = Answer(tuple(sum(c) / 2 for c in cis), "x", "", cis=cis)
        return verdicts.judge(claim, found, setting).verdict

    assert verdict(inside, inside) == verdicts.REPRODUCED
    assert verdict(inside, straddling) == verdicts.TIE
    assert verdict(straddling, outside) == verdicts.DIFFERS


def test_host_path_baseline_claims_are_answered_where_the_baselines_run():
    """One GPU: the baselines run at the host path's f = 0 control, so the claims on them
    pair ours there and say so in the note and the reason, never the claims' own f = 0.25
    (issue 26: one setting per row); the completion-coupled ceiling has no drain to add."""
    ds = Path(__file__).resolve().parents[1] / "results" / "ref-h200x1"
    frame = frame_of(ds)
    unfused = frame.loc["moe.over_unfused"]
    setting = claim_answers.HOST_BASELINE_SETTING
    assert unfused["verdict"] in VERDICTS - {verdicts.NOT_MEASURED}
    assert unfused["ours_note"].startswith(setting) and setting in unfused["why"]
    assert "f = 0.25" not in unfused["why"] and CELL_WITH_CI.match(unfused["ours"])
    ceiling = frame.loc["moe.completion_coupled_ceiling"]
    assert ceiling["verdict"] == verdicts.NOT_MEASURED
    assert ceiling["why"].startswith(setting) and "no drain" in ceiling["why"]


def test_the_capacity_claims_read_the_capacity_law_at_the_largest_K_fitted(root, tmp_path):
    frame = frame_of(root / "h200x2-fixture")
    Q = TRUTH["Q_bytes"]  # the fixture's law is the shared one: Q(132) = S
    assert frame.loc["bg.Q", "ours"].startswith(f"{Q / 2**20:.3g} (")
    assert frame.loc["bg.Q", "ours_note"].endswith(
        "the capacity law S + K q (shared) at K=132 (the largest K fitted)"
    )
    assert frame.loc["bg.Q_per_producer", "ours"].startswith(f"{Q / 132 / 1024:.3g} (")
    # a model file written before the law: the Q fitted to the largest K alone
    old = shutil.copytree(root / "h200x2-fixture", tmp_path / "h200x2-old")
    model_file = old / "model" / "burst_gap.json"
    model = json.loads(model_file.read_text())
    del model["capacity_law"]
    model_file.write_text(json.dumps(model))
    note = frame_of(old).loc["bg.Q", "ours_note"]
    assert note.endswith("fitted at K=132 (the largest K fitted)")
