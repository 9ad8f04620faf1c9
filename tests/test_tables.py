"""Every table renders from a small SYNTHETIC dataset (tests/fixtures.py) as CSV + Markdown,
and its numbers are the right ones on hand-made inputs."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fixtures import (
    AUTO_LEAD_ROWS,
    HOST_FRACTIONS,
    HOST_TRUTH,
    LAYER_EXTRA_US,
    MAIN_LEAD,
    ROOT,
    SIMULATED_HOLDING,
    add_path_drain_rate,
    host_config_id,
    host_configs,
    host_kernel_us,
    make_dataset,
    megamoe_configs,
    noisy_host_config,
    write_megamoe,
    write_megamoe_emulated,
    write_megamoe_host,
    write_megamoe_trace_host,
    write_microbench,
    write_model,
)

from xstage_bench.data import layout, stats
from xstage_bench.data.results import RawResultError, ok_record, raw_document, read_raw, write_raw
from xstage_bench.megamoe import schedule
from xstage_bench.report import paper, products
from xstage_bench.report.analysis import megamoe as analysis_megamoe
from xstage_bench.report.analysis.load import NoDataError
from xstage_bench.report.claims import claim_answers
from xstage_bench.report.render import TABLES, render_product
from xstage_bench.report.tables import claims, megamoe, noise
from xstage_bench.report.tables import megamoe_lead as megamoe_lead_table
from xstage_bench.report.tables import ulysses as ulysses_table
from xstage_bench.report.tables.common import Table, to_markdown, write_table


@pytest.fixture(scope="module")
def sim_dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("data"), "sim-fixture", playback=True)


# Every table a simulated dataset has (the process-model comparison needs two GPU runs,
# test_compare.py renders it; the emulated sweep is measured only, test_emulated.py).
SIMULATED_TABLES = sorted(n for n in TABLES if SIMULATED_HOLDING.gives(products.PRODUCTS[n]))


@pytest.mark.parametrize("name", SIMULATED_TABLES)
def test_table_renders_csv_and_markdown(name, sim_dataset, tmp_path):
    out = tmp_path / "tables" / f"{name}.csv"
    render_product(name, sim_dataset, out)
    frame = pd.read_csv(out)
    assert len(frame) > 0
    markdown = out.with_suffix(".md").read_text()
    assert markdown.startswith("# ")
    assert "simulated" in markdown
    assert markdown.count("\n|") >= len(frame) + 1  # header, rule, one line per row


def test_megamoe_stats_on_hand_made_speedups(tmp_path):
    ds = tmp_path / "sim-moe"
    speedups = [1.0, 1.2, 1.5, 0.9, 1.1, 1.3, 0.95, 1.62]
    write_megamoe(ds, speedups)
    frame = megamoe.build(ds).frame
    overall = frame[frame["group"] == "overall"].iloc[0]
    assert overall["n"] == 8
    assert overall["geomean"] == pytest.approx(np.prod(speedups) ** (1 / 8))
    assert overall["median"] == pytest.approx((1.1 + 1.2) / 2)
    assert overall["min"] == pytest.approx(0.9)
    assert overall["max"] == pytest.approx(1.62)
    assert overall["paper_geomean"] == paper.MEGAMOE_GEOMEAN
    # Per group: the configurations are ordered shape x precision x routing.
    configs = megamoe_configs()
    w8a8 = [s for c, s in zip(configs, speedups, strict=True) if c["precision"] == "w8a8"]
    row = frame[(frame["group"] == "precision") & (frame["value"] == "w8a8")].iloc[0]
    assert row["n"] == 4 and row["max"] == pytest.approx(max(w8a8))
    assert row["geomean"] == pytest.approx(np.prod(w8a8) ** (1 / 4))
    assert np.isnan(row["paper_geomean"])


def test_megamoe_config_missing_a_schedule_is_left_out_and_noted(tmp_path):
    ds = tmp_path / "sim-moe"
    path = write_megamoe(ds, [1.0, 2.0])  # only the first two configurations
    doc = json.loads(path.read_text())
    doc["records"] = [
        r
        for r in doc["records"]
        if not (r["id"].endswith("/interleaved") and r["point"]["routing"] == "skewed")
    ]
    path.write_text(json.dumps(doc))
    table = megamoe.build(ds)
    assert table.frame.iloc[0]["n"] == 1
    assert any("1 configuration(s) lack an ok time" in n for n in table.notes if n)


def test_megamoe_baseline_sections_compare_our_best_with_each_baseline(tmp_path):
    ds = tmp_path / "h200x2-moe"
    speedups = [1.25, 0.8] * 4  # interleaved at 80 us or 125 us; ours best: 80 or 100 us
    write_megamoe(ds, speedups, baselines=True)
    table = megamoe.build(ds)
    titles = [title for title, _ in table.sections]
    assert titles == [
        "Per configuration: speedups with CIs and verdicts",
        "Our best schedule against the baselines",
        "Our best schedule against the baselines, per configuration",
    ]
    summary, per_config = (frame for _, frame in table.sections[1:])

    def overall(name):
        return summary[(summary["comparison"] == name) & (summary["group"] == "overall")].iloc[0]

    best = np.array([min(100.0, 100.0 / s) for s in speedups])
    unfused = overall("ours/unfused, its fastest checked path (time)")
    assert unfused["n"] == 8 and unfused["geomean"] == pytest.approx(np.prod(best / 200) ** (1 / 8))
    w8a8 = [c["precision"] == "w8a8" for c in megamoe_configs()]
    deepgemm = overall("ours/DeepGEMM (time)")  # w4a8 is unsupported: w8a8 rows only
    assert deepgemm["n"] == 4
    assert deepgemm["geomean"] == pytest.approx(np.prod(best[w8a8] / 100) ** (1 / 4))
    assert overall("DeepGEMM L2-lag speedup")["median"] == pytest.approx(1.2)
    ours_same = overall("our interleaved speedup, same configurations")
    assert ours_same["n"] == 4
    assert ours_same["max"] == pytest.approx(max(np.array(speedups)[w8a8]))
    assert len(per_config) == 8
    first = per_config.iloc[0]
    assert first["ours/unfused"] == pytest.approx(best[0] / 200)
    assert np.isnan(first["ours/DeepGEMM"]) and first["unfused us"] == pytest.approx(200.0)
    assert any("include their dispatch" in n for n in table.notes if n)
    out = tmp_path / "tab-megamoe.csv"
    write_table(table, out)
    markdown = out.with_suffix(".md").read_text()
    assert "## Our best schedule against the baselines, per configuration" in markdown
    assert "ours/DeepGEMM" in markdown


def test_megamoe_host_side_section_sums_each_variants_enqueues_and_waits(tmp_path):
    ds = tmp_path / "h200x1-moe"
    write_megamoe(ds, [1.25, 0.8] * 4, baselines=True)
    raw = ds / layout.MEGAMOE_RAW
    doc = json.loads(raw.read_text())
    enqueue = {"ours": 30.0, "deepgemm": 80.0}
    seen = {"ours": 0, "deepgemm": 0}
    for record in doc["records"]:
        variant = record["point"].get("variant") or "ours"
        if record["status"] != "ok" or variant not in enqueue:
            continue
        seen[variant] += 1
        record["extra"].update(
            host_enqueue_us=enqueue[variant] * seen[variant],
            host_lead_calls=10,
            gpu_waited_for_host=1 if variant == "deepgemm" else 0,
            **({"launch": "cuda_graph"} if variant == "ours" else {}),
        )
    raw.write_text(json.dumps(doc))
    table = megamoe.build(ds)
    sections = dict(table.sections)
    host = sections["How each variant's calls were enqueued"].set_index("variant")
    assert list(host.index) == ["ours", "deepgemm"]  # the others carry no host facts
    ours, dg = host.loc["ours"], host.loc["deepgemm"]
    n = seen["ours"]
    assert ours["records"] == n and ours["launch"] == "cuda_graph"
    assert ours["host enqueue us median"] == pytest.approx(30.0 * (n + 1) / 2)
    assert ours["host enqueue us max"] == pytest.approx(30.0 * n)
    assert ours["calls the GPU may have waited in"] == 0 and ours["timed calls"] == 10 * n
    assert dg["launch"] == "eager" and dg["calls the GPU may have waited in"] == seen["deepgemm"]
    assert any(note and note.startswith("host side:") for note in table.notes)


def test_megamoe_flashinfer_beside_the_other_baselines_per_configuration_and_precision(
    tmp_path,
):
    from xstage_bench.report.analysis.megamoe_baselines import megamoe_baselines

    ds = tmp_path / "h200x2-moe"
    speedups = [1.25, 0.8] * 4  # ours best: 80 or 100 us
    path = write_megamoe(ds, speedups, baselines=True, flashinfer="ok")
    best = np.array([min(100.0, 100.0 / s) for s in speedups])
    w8a8 = np.array([c["precision"] == "w8a8" for c in megamoe_configs()])
    wide = megamoe_baselines(json.loads(path.read_text()))
    assert wide["flashinfer_us"].dropna().tolist() == [90.0] * 4  # w4a8: unsupported
    ratios = sorted(wide["ours_over_flashinfer"].dropna())
    assert ratios == pytest.approx(sorted(best[w8a8] / 90))
    table = megamoe.build(ds)
    summary, per_config = (frame for _, frame in table.sections[1:])
    rows = summary[summary["comparison"] == "ours/FlashInfer SM90 FP8 (time)"]
    overall = rows[rows["group"] == "overall"].iloc[0]
    assert overall["n"] == 4
    assert overall["geomean"] == pytest.approx(np.prod(best[w8a8] / 90) ** (1 / 4))
    assert rows[rows["group"] == "precision"]["value"].tolist() == ["w8a8"]
    assert per_config["FlashInfer us"].notna().tolist() == list(w8a8)
    assert per_config["ours/FlashInfer"].dropna().tolist() == pytest.approx(list(best[w8a8] / 90))
    note = next(n for n in table.notes if n and n.startswith("ours/FlashInfer"))
    assert "FP8 e4m3, 1x128 activation and 128x128 weight block scales" in note
    assert "includes its dispatch and combine" in note


def test_megamoe_flashinfer_without_an_ok_record_says_why_and_is_absent_when_unmeasured(
    tmp_path,
):
    ds = tmp_path / "h200x2-moe"
    write_megamoe(ds, [1.25] * 8, baselines=True, flashinfer="unsupported")
    table = megamoe.build(ds)
    summary, per_config = (frame for _, frame in table.sections[1:])
    row = summary[summary["comparison"] == "ours/FlashInfer SM90 FP8 (time)"].iloc[0]
    assert row["n"] == 0
    assert per_config["FlashInfer us"].isna().all()
    assert any("FlashInfer" in n and "8 unsupported (" in n for n in table.notes if n)
    plain = tmp_path / "h200x2-plain"
    write_megamoe(plain, [1.25] * 8, baselines=True)
    table = megamoe.build(plain)
    summary, per_config = (frame for _, frame in table.sections[1:])
    assert not summary["comparison"].str.contains("FlashInfer").any()
    assert not any("FlashInfer" in c for c in per_config.columns)
    assert not any("FlashInfer" in n for n in table.notes if n)


def test_megamoe_without_ok_baselines_has_no_baseline_section(tmp_path):
    ds = tmp_path / "sim-moe"
    write_megamoe(ds)  # ours only, plus one unsupported DeepGEMM record (as the simulator)
    table = megamoe.build(ds)
    assert [title for title, _ in table.sections] == [
        "Per configuration: speedups with CIs and verdicts"
    ]
    assert any("1 point failed (unsupported: 1)" in n for n in table.notes if n)


def test_noise_flags_the_noisy_point(tmp_path):
    ds = tmp_path / "sim-noise"
    records = [
        ok_record(
            "steady",
            {"kind": "periodic", "K": 1, "V": 4096, "B": 4096},
            {"period_us": [10.0, 10.1, 9.9, 10.0, 10.05]},
        ),
        ok_record(
            "noisy",
            {"kind": "periodic", "K": 2, "V": 4096, "B": 2048},
            {"period_us": [10.0, 14.0, 7.0, 12.0, 9.0]},
            throttled=True,
        ),
    ]
    env = {
        "host": "synthetic-test-fixture",
        "python": "3",
        "packages": {},
        "git": {"sha": None, "dirty": None},
        "started_at": "a",
        "finished_at": "b",
        "simulated": True,
    }
    write_raw(
        ds / "raw/microbench/drain.json",
        raw_document(
            experiment="microbench",
            backend="sim",
            dataset=ds.name,
            environment=env,
            config={},
            records=records,
            study="drain",
        ),
    )
    (ds / "raw/microbench/drain.json.partial.json").write_text("resume state, not a result")
    table = noise.build(ds)
    flagged = table.frame.set_index("id")
    assert bool(flagged.loc["noisy", "above_target"]) is True
    assert bool(flagged.loc["steady", "above_target"]) is False
    assert bool(flagged.loc["noisy", "throttled"]) is True
    assert "1 of 2 point-metrics (1 points) above" in table.notes[0]
    assert "1 points flagged throttled" in table.notes[0]
    assert not noise.build(ds, target=1.0).frame["above_target"].any()


def test_noise_target_reaches_the_table_through_render(sim_dataset, tmp_path):
    out = tmp_path / "tab-noise.csv"
    render_product("tab-noise", sim_dataset, out, noise_target=0.0)
    frame = pd.read_csv(out)
    assert (frame["above_target"] == (frame["rel_iqr"] > 0)).all()
    assert frame["above_target"].sum() > 100
    assert "target 0" in out.with_suffix(".md").read_text()


def test_noise_without_raw_files_is_no_data(tmp_path):
    with pytest.raises(NoDataError, match="no raw files"):
        noise.build(tmp_path / "sim-empty")


def test_claims_on_a_microbench_only_dataset(tmp_path):
    ds = make_dataset(tmp_path, "sim-mb", megamoe=False, attention=False)
    frame = claims.build(ds).frame.set_index("claim")
    assert set(frame.index) == {c.id for c in paper.CLAIMS}
    assert float(frame.loc["bg.R", "ours"]) == pytest.approx(365.0)
    assert frame.loc["bg.R", "paper"] == "717"
    assert frame.loc["bg.R", "paper_source"] == "(summary)"
    assert frame.loc["moe.geomean", "paper_source"] == "abstract"
    for claim in ("moe.geomean", "moe.span_wave", "uly.fa3_max", "uly.fa3_S=8192"):
        assert frame.loc[claim, "ours"] == claims.NOT_MEASURED


def test_claims_with_nothing_at_all_renders_not_measured(tmp_path):
    ds = tmp_path / "sim-nothing"
    ds.mkdir()
    out = tmp_path / "tab-claims.csv"
    render_product("tab-claims", ds, out)
    assert (pd.read_csv(out)["ours"] == claims.NOT_MEASURED).all()


def test_every_claim_has_an_answer_entry():
    ids = {c.id for c in paper.CLAIMS}
    assert set(claim_answers.MEASURED) == ids
    assert set(claim_answers.SIMULATED) == ids


def test_claims_refuse_a_malformed_file(tmp_path):
    ds = make_dataset(tmp_path, "sim-bad", attention=False)
    (ds / layout.MEGAMOE_RAW).write_text("{not json")
    with pytest.raises(RawResultError, match="megamoe.json: not valid JSON"):
        claims.build(ds)


def test_ulysses_speedups_and_paper_columns(sim_dataset):
    frame = ulysses_table.build(sim_dataset).frame
    row = frame[(frame["backend"] == "fa3") & (frame["seq_len"] == 8192)].iloc[0]
    assert row["speedup_sender"] == pytest.approx(row["serial_sender_us"] / row["fused_sender_us"])
    assert row["setting"] == "peer path, P=2"  # files without paths: the peer path
    # the paper's 8-GPU table sits beside our P = 8 rows only: one setting per row
    assert frame["paper_speedup"].isna().all() and (frame["ranks"] == 2).all()


GAINS = {("peer", 2): 1.10, ("peer", 8): 1.0, ("host", 2): 1.30, ("host", 8): 0.9}


def test_ulysses_paired_cis_and_verdicts(tmp_path):
    """Records timed in paired rounds get paired CIs: the drift common to a round cancels,
    so a 10% gain is 'faster', no gain a 'tie', a 10% loss 'slower'; the headlines count
    them and give the geomean with a CI."""
    from fixtures import write_attention_paths

    from xstage_bench.data import stats

    ds = tmp_path / "h200x2-paths"
    write_attention_paths(ds, GAINS)
    table = ulysses_table.build(ds)
    frame = table.frame
    assert frame["paired"].all()
    assert set(frame["setting"]) == {
        "peer path, P=2",
        "host path, P=2",
        "host path, P=8 emulated on 1 GPU",
    }
    verdicts = frame.groupby("setting")["verdict_sender"].agg(set).to_dict()
    assert verdicts == {
        "peer path, P=2": {"faster"},
        "host path, P=2": {"faster"},
        "host path, P=8 emulated on 1 GPU": {"slower"},
    }
    for _, row in frame.iterrows():
        assert (
            row["speedup_sender_ci_low"] <= row["speedup_sender"] <= row["speedup_sender_ci_high"]
        )
    # the CI is stats.ratio_ci's, paired; unpaired it would be far wider (the drift)
    doc = json.loads((ds / layout.ATTENTION_RAW).read_text())
    rec = {r["id"]: r["samples"]["sender_us"] for r in doc["records"]}
    serial, fused = (rec[f"fa3/{m}/H=24/S=8192/P=2/path=host"] for m in ("serial", "fused"))
    row = frame[(frame["setting"] == "host path, P=2") & (frame["backend"] == "fa3")].iloc[0]
    paired, unpaired = (stats.ratio_ci(serial, fused, paired=p) for p in (True, False))
    assert row["speedup_sender_ci_low"] == pytest.approx(paired["ci_low"])
    assert paired["ci_high"] - paired["ci_low"] < (unpaired["ci_high"] - unpaired["ci_low"]) / 3
    heads = dict(table.sections)[ulysses_table.HEADLINE_TITLE].set_index(["setting", "backend"])
    host2 = heads.loc[("host path, P=2", "fa3")]
    assert (host2["faster"], host2["slower"], host2["tie"]) == (2, 0, 0)
    assert host2["geomean_ci_low"] < host2["geomean"] < host2["geomean_ci_high"]
    assert host2["geomean"] == pytest.approx(1.30, rel=0.01)
    assert bool(host2["paired"])
    notes = " ".join(n for n in table.notes if n)
    assert "fa3, host path, P=8 emulated on 1 GPU: max" in notes
    assert "fused faster 0, slower 2, tie 0 of 2" in notes
    assert "host path: one GPU plays rank 0" in notes


def test_ulysses_unpaired_records_get_unpaired_cis(tmp_path):
    """Records without a shared pairing (older files, other runs) are compared unpaired,
    and the table says so."""
    from fixtures import write_attention_paths

    ds = tmp_path / "h200x1-unpaired"
    write_attention_paths(ds, GAINS, paired=False, world_size=1)
    table = ulysses_table.build(ds)
    frame = table.frame
    assert not frame["paired"].any()
    assert set(frame["setting"]) == {
        "host path, P=2 emulated on 1 GPU",
        "host path, P=8 emulated on 1 GPU",
    }
    from xstage_bench.data import stats

    # the CI is stats.ratio_ci's with each side resampled on its own

    doc = json.loads((ds / layout.ATTENTION_RAW).read_text())
    rec = {r["id"]: r["samples"]["sender_us"] for r in doc["records"]}
    pid = "triton/{}/H=24/S=16384/P=1/path=host/emulated-P=2"
    serial, fused = (rec[pid.format(m)] for m in ("serial", "fused"))
    row = frame[
        (frame["setting"] == "host path, P=2 emulated on 1 GPU")
        & (frame["backend"] == "triton")
        & (frame["seq_len"] == 16384)
    ].iloc[0]
    assert row["speedup_sender_ci_high"] == pytest.approx(
        stats.ratio_ci(serial, fused, paired=False)["ci_high"]
    )
    assert any("paired where the records were timed together" in n for n in table.notes if n)


def test_ulysses_pairs_only_records_of_one_timing(tmp_path):
    """A serial and a fused record from two timings (say a resumed run) are not paired."""
    from fixtures import write_attention_paths

    ds = tmp_path / "h200x2-resumed"
    path = write_attention_paths(ds, GAINS)
    doc = json.loads(path.read_text())
    for r in doc["records"]:
        if r["id"] == "fa3/fused/H=24/S=8192/P=2":
            r["extra"]["paired"]["group"] = "another-run"
    path.write_text(json.dumps(doc))
    frame = ulysses_table.build(ds).frame.set_index(["setting", "backend", "seq_len"])
    assert not frame.loc[("peer path, P=2", "fa3", 8192), "paired"]
    assert frame.loc[("peer path, P=2", "fa3", 16384), "paired"]


def test_ulysses_puts_each_backend_beside_fa3_attention_alone(tmp_path):
    """Attention alone: triton taking 1.25x FA3's time is at 0.8 of FA3's TFLOP/s, with a
    tight paired CI; the notes count the shapes at 0.95 or more."""
    from fixtures import write_attention_paths

    ds = tmp_path / "h200x1-beside"
    write_attention_paths(ds, GAINS, world_size=1, alone_time={"triton": 1.25})
    table = ulysses_table.build(ds)
    beside = dict(table.sections)[ulysses_table.BESIDE_TITLE]
    assert set(beside["backend"]) == {"triton"} and beside["paired"].all()
    assert len(beside) == 4  # P = 2 and 8, S = 8K and 16K
    assert beside["share_of_fa3"].to_numpy() == pytest.approx(0.8, rel=0.01)
    assert (beside["share_of_fa3_ci_high"] - beside["share_of_fa3_ci_low"] < 0.02).all()
    notes = " ".join(n for n in table.notes if n)
    assert "triton alone: 0.8" in notes and "at least 0.95 on 0 of 4 shapes" in notes
    assert "no host lead" in notes


def test_ulysses_renders_the_committed_reference():
    """ref-h200x2 (unpaired: measured before paired rounds): every setting's rows with
    unpaired CIs and verdicts, and the headlines with their CIs."""
    ds = Path(__file__).resolve().parents[1] / "results" / "ref-h200x2"
    table = ulysses_table.build(ds)
    frame = table.frame
    assert len(frame) == 60 and not frame["paired"].any()
    assert set(frame["setting"]) == {"peer path, P=2", "peer path, P=8 emulated on 2 GPUs"}
    assert set(frame["verdict_sender"]) <= {"faster", "slower", "tie"}
    best = frame.loc[frame["speedup_sender"].idxmax()]
    assert (best["backend"], best["ranks"], best["seq_len"]) == ("fa3", 8, 8192)
    assert best["speedup_sender"] == pytest.approx(1.813, abs=5e-4)
    heads = dict(table.sections)[ulysses_table.HEADLINE_TITLE]
    assert len(heads) == 6
    assert (heads["faster"] + heads["slower"] + heads["tie"] == heads["configurations"]).all()
    assert (heads["geomean_ci_low"] < heads["geomean"]).all()
    assert (heads["geomean"] < heads["geomean_ci_high"]).all()


def test_burst_gap_params_rows(tmp_path):
    ds = tmp_path / "sim-bg"
    write_microbench(ds, "drain")
    write_model(ds)
    frame = TABLES["tab-burst-gap-params"](ds).frame.set_index("scope")
    assert list(frame.index) == ["K=66", "K=132", "pooled", "law: S + K q (shared)", "paper B200"]
    assert set(frame["path"]) == {"peer"} and set(frame["far_end"]) == {"peer GPU (NVLink)"}
    assert frame.loc["pooled", "R_GBps"] == pytest.approx(365.0)
    # Pooled T0 at B = 32 KiB: t0_fixed + B / issue_rate = 0.1 + 32768 / 60e3 us.
    assert frame.loc["pooled", "T0_us"] == pytest.approx(0.1 + 32768 / 60e3)
    assert frame.loc["pooled", "T0_us_ci_low"] < frame.loc["pooled", "T0_us"]
    assert frame.loc["paper B200", "R_GBps"] == paper.B200_R_GBPS
    assert frame.loc["paper B200", "Q_MiB"] == pytest.approx(4.25)
    assert frame.loc["K=132", "Q_per_producer_KiB"] == pytest.approx(2 * 1024 / 132)
    # the capacity law's row: S in the Q columns with its CI, q per producer
    law = frame.loc["law: S + K q (shared)"]
    assert law["Q_MiB"] == pytest.approx(2.0) and law["Q_MiB_ci_low"] == pytest.approx(1.96)
    assert law["Q_per_producer_KiB"] == 0.0 and "Q_MiB is S" in law["source"]
    assert frame.loc["pooled", "source"].endswith("Q at K=132 from the capacity law")


def test_burst_gap_params_has_rows_per_path_and_K(tmp_path):
    ds = tmp_path / "h200x2-bg"
    write_microbench(ds, "drain", paths=("peer", "host"))
    write_model(ds, paths=("peer", "host"))
    frame = TABLES["tab-burst-gap-params"](ds).frame
    assert list(zip(frame["path"], frame["scope"], strict=True)) == [
        ("peer", "K=66"),
        ("peer", "K=132"),
        ("peer", "pooled"),
        ("peer", "law: S + K q (shared)"),
        ("host", "K=66"),
        ("host", "K=132"),
        ("host", "pooled"),
        ("host", "law: S + K q (shared)"),
        ("peer", "paper B200"),
    ]
    rows = frame.set_index(["path", "scope"])
    assert rows.loc[("host", "pooled"), "R_GBps"] == pytest.approx(HOST_TRUTH["R_GBps"])
    assert rows.loc[("host", "pooled"), "far_end"] == "host memory"
    assert rows.loc[("host", "K=132"), "Q_MiB"] == pytest.approx(1.0)
    assert rows.loc[("peer", "pooled"), "R_GBps"] == pytest.approx(365.0)
    # a one-path dataset names its path on every row
    only = tmp_path / "h200x1-bg"
    write_microbench(only, "drain", paths=("host",))
    write_model(only, paths=("host",))
    one = TABLES["tab-burst-gap-params"](only).frame
    assert list(one["path"]) == ["host"] * 4 + ["peer"]  # and the paper's peer path
    assert one.iloc[2]["R_GBps"] == pytest.approx(HOST_TRUTH["R_GBps"])


def test_markdown_is_written_without_tabulate(tmp_path):
    table = pd.DataFrame({"a": [1.23456789, float("nan")], "b": ["x|y", None]})
    assert to_markdown(table).splitlines() == [
        "| a | b |",
        "|---|---|",
        "| 1.235 | x\\|y |",
        "|  |  |",
    ]
    # a Table is written as its CSV (data only) and a Markdown copy: title, label, notes first
    write_table(Table(table, "the title", "the label", ["a note"]), tmp_path / "t.csv")
    assert pd.read_csv(tmp_path / "t.csv")["b"].tolist()[0] == "x|y"
    assert (tmp_path / "t.md").read_text().splitlines()[:5] == [
        "# the title",
        "",
        "the label",
        "",
        "- a note",
    ]


def test_claims_on_the_full_fixture(sim_dataset):
    frame = claims.build(sim_dataset).frame.set_index("claim")
    assert frame.loc["moe.span_wave", "ours"] == "9.1"
    assert frame.loc["moe.span_interleaved", "ours"] == "3.8"
    assert float(frame.loc["moe.span_vs_local", "ours"]) == pytest.approx(0.3)
    assert frame.loc["moe.configs", "ours"] == "8"
    assert frame.loc["uly.fa3_S=8192", "ours"] != claims.NOT_MEASURED
    assert frame.loc["uly.fa4_max", "ours"] == claims.NOT_MEASURED
    assert frame.loc["moe.geomean", "ours_kind"] == "simulated"


def test_megamoe_with_every_point_failed_is_no_data(tmp_path):
    ds = tmp_path / "sim-moe"
    path = write_megamoe(ds, [1.0, 2.0])
    doc = json.loads(path.read_text())
    doc["records"] = [
        {"id": r["id"], "point": r["point"], "status": "failed", "error": "boom"}
        for r in doc["records"]
    ]
    path.write_text(json.dumps(doc))
    with pytest.raises(NoDataError, match="raw/megamoe.json has no configuration"):
        megamoe.build(ds)
    claims_frame = claims.build(ds).frame.set_index("claim")
    assert claims_frame.loc["moe.geomean", "ours"] == claims.NOT_MEASURED


def test_megamoe_unfused_paths_and_gemm_ceiling_sections(tmp_path):
    ds = tmp_path / "h200x2-moe"
    # ours best: interleaved, 80 us; DeepGEMM's best 100 us and FlashInfer 90 us in w8a8
    path = write_megamoe(ds, [1.25] * 8, baselines=True, flashinfer="ok")
    doc = json.loads(path.read_text())
    records = []
    for r in doc["records"]:
        variant = r["point"].get("variant")
        if variant is None:  # our kernel: each rank's kernel 10 us under the layer time
            times = r["samples"]["time_us"]
            r = ok_record(
                r["id"],
                r["point"],
                {"time_us": times, "kernel_us": [t - 10 for t in times]},
                extra={**r["extra"], "tflops_kernel": 700.0},
            )
        elif variant == "unfused":
            times = {"fp8_grouped_rowwise": 160.0, "bf16_grouped": 200.0}
            r["extra"] = {**(r.get("extra") or {}), "gemm_time_us": times}
        records.append(r)
        if variant is None and r["point"]["schedule"] == "interleaved":
            point = {**r["point"], "variant": "gemm_ceiling", "schedule": "gemm_ceiling"}
            ceiling_id = r["id"].replace("/interleaved", "/gemm_ceiling")
            extra = {"tflops": 1400.0, "roofline_us": 35.0, "hbm_gbs": 4000.0}
            records.append(ok_record(ceiling_id, point, {"time_us": [30.0] * 3}, extra=extra))
    doc["records"] = records
    path.write_text(json.dumps(doc))
    table = megamoe.build(ds)
    sections = dict(table.sections)
    summary = sections["Our best schedule against the baselines"]
    overall = summary[summary["group"] == "overall"].set_index("comparison")
    fp8 = "ours/unfused FP8 grouped, per-token x per-channel scales (time)"
    assert overall.loc[fp8, "geomean"] == pytest.approx(80 / 160)
    assert overall.loc["ours/unfused bf16 grouped (time)", "geomean"] == pytest.approx(80 / 200)
    per_config = sections["Our best schedule against the baselines, per configuration"]
    assert per_config["unfused FP8 grouped us"].tolist() == [160.0] * 8
    ceiling = sections["Our kernel beside the GEMM ceiling, per configuration"]
    assert len(ceiling) == 8
    assert ceiling["fraction of ceiling"].tolist() == pytest.approx([0.5] * 8)
    assert ceiling["roofline / kernel"].tolist() == pytest.approx([35 / 70] * 8)
    # the libraries beside the same roofline, where they ran (w8a8 only)
    w8 = ceiling["configuration"].str.contains("w8a8")
    assert w8.sum() == 4
    assert ceiling.loc[w8, "roofline / DeepGEMM"].tolist() == pytest.approx([35 / 100] * 4)
    assert ceiling.loc[w8, "roofline / FlashInfer"].tolist() == pytest.approx([35 / 90] * 4)
    assert ceiling.loc[~w8, ["roofline / DeepGEMM", "roofline / FlashInfer"]].isna().all().all()
    by_precision = sections["Our kernel beside the GEMM ceiling"].set_index("precision")
    assert by_precision.loc["w8a8", "fraction of ceiling median"] == pytest.approx(0.5)
    assert by_precision.loc["w4a8 time / w8a8 time", "geomean"] == pytest.approx(1.0)
    assert any("cuBLAS on the same two GEMMs" in n for n in table.notes if n)
    # issue 26, item 5: kernel TFLOP/s is over kernel_us, the raw config's tflops over time_us
    assert any("over the kernel time (kernel_us, extra tflops_kernel" in n for n in table.notes)
    assert ceiling["kernel TFLOP/s"].tolist() == [700.0] * 8  # the records' tflops_kernel


def test_ulysses_puts_an_emulated_world_size_beside_the_real_one(tmp_path):
    from fixtures import ATTENTION, _write

    from xstage_bench.data import grid
    from xstage_bench.report.figures import ulysses as ulysses_figure

    ds = tmp_path / "h200x2-att"
    attention = {**ATTENTION, "heads": [8], "emulated_world_sizes": [8]}
    records = []
    for p in grid.attention_points(attention, 2):
        gain = 1.4 if "emulated_world_size" in p else 1.2  # serial / fused
        sender = {"alone": 100.0, "serial": 100.0 * gain, "fused": 100.0}[p["mode"]]
        samples = {"sender_us": [sender] * 3, "completion_us": [sender] * 3}
        records.append(ok_record(p["id"], p, samples))
    _write(ds, layout.ATTENTION_RAW, "attention", records)
    table = ulysses_table.build(ds)
    frame = table.frame
    assert set(zip(frame["ranks"], frame["emulated"], strict=True)) == {(2, False), (8, True)}
    emulated = frame[frame["emulated"]]
    assert emulated["speedup_sender"].tolist() == pytest.approx([1.4] * len(emulated))
    assert set(emulated["setting"]) == {"peer path, P=8 emulated on 2 GPUs"}
    # The paper's 8-GPU numbers sit beside the emulated P = 8 rows only.
    fa3 = frame[frame["backend"] == "fa3"]
    assert fa3[~fa3["emulated"]]["paper_speedup"].isna().all()
    assert fa3[fa3["emulated"]]["paper_speedup"].notna().any()
    assert any("fa3, peer path, P=8 emulated on 2 GPUs: max 1.400x" in n for n in table.notes if n)
    figure = ulysses_figure.plot(ds)
    titles = [ax.get_title() for ax in figure.axes]
    assert any("P=8 emulated on 2 GPUs" in t for t in titles)


# ------------------------------------------------ MegaMoE per store path, CIs and metrics


@pytest.fixture(scope="module")
def host_dataset(tmp_path_factory):
    """One GPU, the host path: paired rounds, a lead map, one noisy configuration and
    one throttled record (fixtures.write_megamoe_host)."""
    ds = tmp_path_factory.mktemp("data") / "h200x1-host"
    for study in ("drain", "isolated"):
        write_microbench(ds, study)
    write_model(ds)
    add_path_drain_rate(ds, "host", 52.0)
    write_megamoe_host(ds)
    write_megamoe_trace_host(ds)
    write_megamoe_emulated(ds, paths=("host",))
    return ds


def _rows(frame, **where):
    for key, value in where.items():
        frame = frame[frame[key] == value]
    return frame


def test_megamoe_host_path_has_one_headline_per_share_with_cis(host_dataset):
    table = megamoe.build(host_dataset)
    frame = table.frame
    assert set(frame["path"]) == {"host"}
    assert "host (host memory)" in table.title
    kernel = _rows(frame, metric="kernel time", group="overall")
    assert kernel["value"].tolist() == [
        "host share f = 0 (local control)",
        "host share f = 0.25",
        "host share f = 0.5",
    ]
    for f, (_, row) in zip(HOST_FRACTIONS, kernel.iterrows(), strict=True):
        truth = host_kernel_us(f, None) / host_kernel_us(f, MAIN_LEAD)
        assert row["n"] == 8
        assert row["geomean"] == pytest.approx(truth, rel=0.01)
        assert row["geomean_ci_low"] <= row["geomean"] <= row["geomean_ci_high"]
        assert row["median_ci_low"] <= row["median"] <= row["median_ci_high"]
        assert row["wins"] + row["losses"] + row["ties"] == 8
    control, quarter = kernel.iloc[0], kernel.iloc[1]
    assert control["ties"] == 8 and np.isnan(control["paper_geomean"])
    assert quarter["wins"] == 8 and quarter["paper_geomean"] == paper.MEGAMOE_GEOMEAN
    assert any("host share" in n and "local control" in n for n in table.notes)


def test_megamoe_metric_names_say_which_time_each_speedup_is_of(host_dataset):
    """Issue 26, item 5: 'layer time' is time_us (kernel + barrier + reduction), 'kernel
    time' is kernel_us, in the headline, the per-configuration section and the notes,
    computed here from the raw samples without the package."""
    doc = json.loads((host_dataset / layout.MEGAMOE_RAW).read_text())
    medians = {
        (r["id"], metric): float(np.median(r["samples"][metric]))
        for r in doc["records"]
        for metric in ("time_us", "kernel_us")
    }
    table = megamoe.build(host_dataset)
    per_config = dict(table.sections)["Per configuration: speedups with CIs and verdicts"]
    first = host_configs()[1]  # the first configuration at f = 0.25
    cid = host_config_id(*first)
    for metric, name in (("time_us", "layer time"), ("kernel_us", "kernel time")):
        want = medians[(f"{cid}/expert_wave", metric)] / medians[(f"{cid}/interleaved", metric)]
        assert per_config[f"{name} speedup"].iloc[1] == pytest.approx(want)
    layer = per_config["layer time speedup"].iloc[1]
    assert layer < per_config["kernel time speedup"].iloc[1]  # the layer adds 20 us to both
    metrics = set(table.frame["metric"])
    assert metrics == {"layer time (kernel + barrier + reduction)", "kernel time"}
    assert any(
        n.startswith("'layer time (kernel + barrier + reduction)' = time_us") for n in table.notes
    )
    assert any(n.startswith("'kernel time' = kernel_us") for n in table.notes)


def test_megamoe_with_layer_time_only_names_it(tmp_path):
    ds = tmp_path / "sim-moe"
    write_megamoe(ds)  # the simulator's records: time_us only
    frame = megamoe.build(ds).frame
    assert set(frame["metric"]) == {"layer time (kernel + barrier + reduction)"}


def test_megamoe_paired_rounds_narrow_each_configurations_ci(tmp_path):
    widths = {}
    for paired in (True, False):
        ds = tmp_path / f"h200x1-{paired}"
        write_megamoe_host(ds, paired=paired)
        speedups, _ = analysis_megamoe.megamoe_speedups(read_raw(ds / layout.MEGAMOE_RAW))
        assert speedups["paired"].all() == paired
        widths[paired] = speedups["kernel_speedup_ci_high"] - speedups["kernel_speedup_ci_low"]
    assert (widths[True] < widths[False]).mean() > 0.9


def test_megamoe_noisy_points_and_extremes_show_their_own_ci(host_dataset):
    table = megamoe.build(host_dataset)
    per_config = dict(table.sections)["Per configuration: speedups with CIs and verdicts"]
    noisy = [noisy_host_config(c, f) for c, f in host_configs()]
    assert per_config["kernel time noisy"].tolist() == noisy
    row = _rows(table.frame, metric="kernel time", group="overall", value="host share f = 0.5")
    row = row.iloc[0]
    assert row["noisy"] == 1
    at_half = per_config[[f == 0.5 for _, f in host_configs()]]
    low = at_half.loc[at_half["kernel time speedup"].idxmin()]
    assert (row["min"], row["min_ci_low"], row["min_ci_high"], row["min_noisy"]) == (
        low["kernel time speedup"],
        low["kernel time CI low"],
        low["kernel time CI high"],
        low["kernel time noisy"],
    )


def test_megamoe_throttled_points_are_counted_and_a_headline_leaves_them_out(host_dataset):
    frame = megamoe.build(host_dataset).frame
    half = _rows(frame, metric="kernel time", value="host share f = 0.5")
    overall = _rows(half, group="overall").iloc[0]
    cool = _rows(half, group="overall, throttled points left out").iloc[0]
    assert (overall["n"], overall["throttled"]) == (8, 1)
    assert (cool["n"], cool["throttled"]) == (7, 0)
    assert cool["geomean"] != overall["geomean"]
    # no flagged point at f = 0.25: one headline only
    quarter = _rows(frame, metric="kernel time", value="host share f = 0.25")
    assert _rows(quarter, group="overall, throttled points left out").empty


def test_megamoe_lead_table_finds_the_best_lead_and_how_far_auto_is(host_dataset):
    table = megamoe_lead_table.build(host_dataset)
    frame = table.frame
    assert "kernel time" in table.title and "host (host memory)" in table.title
    assert len(frame) == 2 * len(HOST_FRACTIONS)  # two shapes in the map, each share
    assert {f"speedup lead={lead}" for lead in ("0", "256", "1024", "4096", "auto")} <= set(
        frame.columns
    )
    loaded = frame[frame["f"] != "0"]
    assert (loaded["best_lead"] == 1024).all()
    assert (loaded["auto_lead_rows"] == AUTO_LEAD_ROWS).all()
    for _, row in loaded.iterrows():
        f = float(row["f"])
        # auto's speedup over the best's is the best lead's time over auto's
        truth = host_kernel_us(f, 1024) / host_kernel_us(f, AUTO_LEAD_ROWS)
        assert row["auto_over_best"] == pytest.approx(truth, rel=0.005)
        assert row["auto_vs_best"] == "best swept lead faster"
        assert row["best_ci_low"] <= row["best_speedup"] <= row["best_ci_high"]
    assert (frame[frame["f"] == "0"]["auto_vs_best"] == "tie").all()
    sections = dict(table.sections)
    score = next(f for t, f in table.sections if t.startswith("auto against")).iloc[0]
    # auto (512 rows) is 1.2% short of the best (1024) at f = 0.25, 2.2% at f = 0.5
    assert (score["points"], score["within 2% of best"]) == (6, 4)
    assert score["best constant lead"] == 1024 and score["mean / best constant's"] < 1
    per_lead = sections["Per lead: both metrics with CIs and verdicts"]
    assert len(per_lead) == len(frame) * 5 and per_lead["paired"].all()
    summary = sections["Per path and f: the best swept lead and the model's auto"]
    assert summary.set_index("f").loc["0.5", "best swept lead (times best)"] == "1024 (2)"


def test_the_best_swept_lead_is_never_the_main_grids_arm():
    """ref-h200x1-flashinfer swept lead 0 only (0.99: slower); the main grid's interleaved
    arm (lead 1024, 1.09) is a column of the map, but the README called it 'the best swept
    lead'."""
    from xstage_bench.report.analysis import megamoe_lead

    metric = analysis_megamoe.KERNEL
    rows = (("0", True, 0.99), ("1024", False, 1.09))
    leads = pd.DataFrame(
        [
            {
                "path": "host",
                "shape": "s",
                "remote_fraction": "0",
                "lead": lead,
                "auto": False,
                "swept": swept,
                metric.column("speedup"): ratio,
                metric.column("speedup_ci_low"): ratio - 0.01,
                metric.column("speedup_ci_high"): ratio + 0.01,
            }
            for lead, swept, ratio in rows
        ]
    )
    best = megamoe_lead.best_and_auto(leads, metric).iloc[0]
    assert (best["best_lead"], best["best_speedup"]) == (0, 0.99)


def test_megamoe_lead_table_without_a_lead_sweep_is_no_data(tmp_path):
    ds = tmp_path / "sim-moe"
    write_megamoe(ds)
    with pytest.raises(NoDataError, match="has no lead-sweep arm"):
        megamoe_lead_table.build(ds)


# ---------------------------------- MegaMoE: a third schedule, and the layer over the kernel

DEEPGEMM = schedule.DEEPGEMM_INTERLEAVED
OVER_WAVES = megamoe.over_group(DEEPGEMM, schedule.WAVE)
HEAD_TO_HEAD = megamoe.over_group(schedule.INTERLEAVED, DEEPGEMM)
DEEPGEMM_OVER_OURS = 1.1  # the third arm's time over our interleaved's, round by round


def add_third_schedule(ds: Path, where=lambda point: True) -> None:
    """write_megamoe_host's sweep with DeepGEMM upstream's interleaved order as a third arm
    of each main-grid configuration `where` holds: our interleaved's samples times
    DEEPGEMM_OVER_OURS, in the configuration's paired rounds (every arm names it)."""
    path = ds / layout.MEGAMOE_RAW
    doc = json.loads(path.read_text())
    by_id = {r["id"]: r for r in doc["records"]}
    added = []
    for record in doc["records"]:
        point = record["point"]
        if point["schedule"] != schedule.INTERLEAVED or point.get("lead_sweep"):
            continue
        if not where(point):
            continue
        record_id = record["id"].rsplit("/", 1)[0] + f"/{DEEPGEMM}"
        paired = record["extra"]["paired"]
        arms = [*paired["arms"], record_id]
        for arm in paired["arms"]:
            by_id[arm]["extra"]["paired"]["arms"] = arms
        knobs = ("lead_rows", "lead_rows_requested")
        third = {k: v for k, v in point.items() if k not in knobs}
        samples = {k: [v * DEEPGEMM_OVER_OURS for v in vs] for k, vs in record["samples"].items()}
        extra = {**record["extra"], "paired": {**paired, "arms": arms, "arm": record_id}}
        added.append(
            ok_record(
                record_id, {**third, "id": record_id, "schedule": DEEPGEMM}, samples, extra=extra
            )
        )
    doc["records"] += added
    path.write_text(json.dumps(doc))


def _host_sweep(ds: Path, third=None) -> Path:
    write_megamoe_host(ds)
    if third is not None:
        add_third_schedule(ds, third)
    return ds


def test_megamoe_third_schedule_rows_appear_exactly_where_it_was_measured(tmp_path):
    two = megamoe.build(_host_sweep(tmp_path / "h200x1-two"))
    assert not two.frame["group"].isin([OVER_WAVES, HEAD_TO_HEAD]).any()
    assert not any(OVER_WAVES in n for n in two.notes)

    three = megamoe.build(_host_sweep(tmp_path / "h200x1-three", third=lambda p: True)).frame
    new = three["group"].isin([OVER_WAVES, HEAD_TO_HEAD])
    assert new.sum() == len(HOST_FRACTIONS) * 2 * 2  # per share, metric and pair
    # everything else as without the third schedule, columns included
    pd.testing.assert_frame_equal(three[~new].reset_index(drop=True), two.frame)
    for _, row in three[three["group"] == HEAD_TO_HEAD].iterrows():
        # its time over ours, the same rounds: exactly the factor, and ours faster everywhere
        assert (row["n"], row["wins"], row["losses"], row["ties"]) == (8, 8, 0, 0)
        for stat in ("geomean", "median", "min", "max"):
            assert row[stat] == pytest.approx(DEEPGEMM_OVER_OURS)
            assert row[f"{stat}_ci_low"] == pytest.approx(DEEPGEMM_OVER_OURS)
        assert np.isnan(row["paper_geomean"])
    for _, row in three[three["group"] == OVER_WAVES].iterrows():
        ours = _rows(three, group="overall", metric=row["metric"], value=row["value"]).iloc[0]
        for stat in ("geomean", "median", "min", "max"):
            assert row[stat] == pytest.approx(ours[stat] / DEEPGEMM_OVER_OURS)
        assert row["throttled"] == 0  # the flagged record is our interleaved arm, not in this pair
    half = _rows(three, group=HEAD_TO_HEAD, metric="kernel time", value="host share f = 0.5")
    assert half["throttled"].tolist() == [1]

    quarter = megamoe.build(
        _host_sweep(tmp_path / "h200x1-quarter", third=lambda p: p["remote_fraction"] == 0.25)
    )
    rows = quarter.frame[quarter.frame["group"].isin([OVER_WAVES, HEAD_TO_HEAD])]
    assert set(rows["value"]) == {"host share f = 0.25"} and len(rows) == 4
    assert any(f"'{HEAD_TO_HEAD}'" in n and "paired in 8 of 8" in n for n in quarter.notes)


def test_megamoe_head_to_head_is_the_third_schedules_time_over_ours():
    """One configuration, three arms in the same rounds (a drift common to all): waves at
    1.2x, DeepGEMM's order at 1.1x our interleaved time."""
    config, f = host_configs()[1]
    cid = host_config_id(config, f)
    drift = np.array([100.0, 104.0, 98.0, 101.0, 99.0, 103.0, 97.0])
    times = {schedule.WAVE: 1.2, schedule.INTERLEAVED: 1.0, DEEPGEMM: 1.1}
    ids = [f"{cid}/{name}" for name in times]
    records = [
        ok_record(
            record_id,
            {**config, "id": record_id, "schedule": name},
            {"time_us": factor * drift + 20.0, "kernel_us": factor * drift},
            extra={"paired": {"arms": ids, "arm": record_id, "rounds": len(drift)}},
        )
        for (name, factor), record_id in zip(times.items(), ids, strict=True)
    ]
    doc = {"records": records}
    speedups, _ = analysis_megamoe.megamoe_speedups(doc)
    ratios = megamoe.other_schedule_ratios(doc, speedups)[DEEPGEMM]
    head, over = ratios.head_to_head.iloc[0], ratios.over_waves.iloc[0]
    assert head["paired"] and over["paired"]
    assert head["kernel_speedup"] == pytest.approx(1.1)  # its time / ours: above 1, ours faster
    assert head["kernel_verdict"] == stats.FASTER
    assert over["kernel_speedup"] == pytest.approx(1.2 / 1.1)
    assert speedups["kernel_speedup"].iloc[0] == pytest.approx(1.2)
    assert head["speedup"] == pytest.approx(
        (1.1 * 100 + 20) / (100 + 20)
    )  # the drift's median: 100
    rows = megamoe.other_schedule_rows(speedups, {DEEPGEMM: ratios})
    kernel = {r["group"]: r for r in rows if r["metric"] == "kernel time"}
    assert kernel[HEAD_TO_HEAD]["geomean"] == pytest.approx(1.1)
    assert (kernel[HEAD_TO_HEAD]["wins"], kernel[OVER_WAVES]["wins"]) == (1, 1)


def test_megamoe_whole_layer_over_kernel_time_of_the_interleaved_arm(host_dataset, tmp_path):
    """The fixture's layer adds LAYER_EXTRA_US to every kernel sample: per configuration
    the ratio is 1 + 20 / its median kernel time, computed here from the raw samples."""
    doc = json.loads((host_dataset / layout.MEGAMOE_RAW).read_text())
    ratio, name = {}, {}
    for r in doc["records"]:
        point = r["point"]
        if point["schedule"] == schedule.INTERLEAVED and not point.get("lead_sweep"):
            key = (point["precision"], r["id"])
            ratio[key] = np.median(r["samples"]["time_us"]) / np.median(r["samples"]["kernel_us"])
            name[key] = analysis_megamoe.megamoe_config_name(analysis_megamoe.config_fields(point))
    table = megamoe.build(host_dataset)
    section = dict(table.sections)["Whole layer over kernel time, interleaved"]
    assert section["precision"].tolist() == ["all", "w4a8", "w8a8"]
    assert (section["tokens_per_rank"] == 1024).all() and (section["path"] == "host").all()
    target = megamoe.LAYER_OVER_KERNEL_TARGETS[1024]
    for _, row in section.iterrows():
        mine = {k: v for k, v in ratio.items() if row["precision"] in ("all", k[0])}
        values = np.array(list(mine.values()))
        top = max(mine, key=mine.get)
        assert row["n"] == len(mine) == (24 if row["precision"] == "all" else 12)
        assert row["layer / kernel time median"] == pytest.approx(np.median(values))
        assert row["layer / kernel time max"] == pytest.approx(mine[top])
        assert row["max at"] == name[top]
        assert row["layer - kernel time us median"] == pytest.approx(LAYER_EXTRA_US)
        assert row["target"] == target
        assert row["median meets target"] == (np.median(values) <= target)
        assert row["above target"] == (values > target).sum()
    assert any(n.startswith("whole layer over kernel time") for n in table.notes)
    # the simulator times the layer only: no section
    ds = tmp_path / "sim-moe"
    write_megamoe(ds)
    assert "Whole layer over kernel time, interleaved" not in dict(megamoe.build(ds).sections)


def test_megamoe_products_of_the_committed_reference_still_render(tmp_path):
    """ref-h200x2 predates paths and paired rounds: its points read as the peer path,
    unpaired, and its MegaMoE table and crossover figure render (the other MegaMoE
    products read the same way from the fixtures' records without a path)."""
    ref = ROOT / "results" / "ref-h200x2"
    doc = read_raw(ref / layout.MEGAMOE_RAW)
    speedups, _ = analysis_megamoe.megamoe_speedups(doc)
    assert set(speedups["path"]) == {"peer"} and not speedups["paired"].any()
    assert len(analysis_megamoe.natural_routing(speedups)) == paper.MEGAMOE_CONFIGS
    assert not products.Holding.on_disk(ref).gives(products.PRODUCTS["tab-megamoe-lead"])
    render_product("tab-megamoe", ref, tmp_path / "tab-megamoe.csv")
    render_product("fig-megamoe-crossover", ref, tmp_path / "fig-megamoe-crossover.pdf")
    assert "peer (peer GPU (NVLink))" in (tmp_path / "tab-megamoe.md").read_text()


def test_process_model_of_a_per_gpu_run_with_no_ok_point_says_why(tmp_path):
    """On one GPU megamoe_per_gpu records every point unsupported: the table says so, with
    the records' reason, instead of failing the render (seen on 1x H200, gpu-smoke)."""
    from fixtures import _write, megamoe_configs

    from xstage_bench.data.results import failed_record
    from xstage_bench.report.tables import process_model

    ds = make_dataset(tmp_path, "h200x1-fixture", attention=False)
    why = "one process per GPU needs 2 GPUs"
    records = [
        failed_record(
            f"{c['id']}/expert_wave", {**c, "schedule": "expert_wave"}, why, status="unsupported"
        )
        for c in megamoe_configs()
    ]
    _write(ds, layout.MEGAMOE_PER_GPU_RAW, "megamoe", records)
    table = process_model.build(ds)
    assert "not measured" in table.title
    assert table.frame.to_dict("records") == [
        {"status": "unsupported", "points": len(records), "why": why}
    ]


def test_a_precision_ratio_across_runs_is_said_to_be_one():
    """tab-megamoe's 'w4a8 time / w8a8 time' is noted as a ratio across runs when our
    kernel's W4A8 and W8A8 records were timed by different runs of the file."""

    def record(precision, at, variant=None):
        point = {"precision": precision, "shape": "s", "variant": variant}
        return {"status": "ok", "point": point, "clocks": {"before": {"time": at}}}

    doc = {
        "environment": {
            "started_at": "2026-12-03T13:00:00+00:00",
            "resumes": [{"started_at": "2026-12-03T14:00:00+00:00"}],
        },
        "records": [
            record("w8a8", "2026-12-03T13:05:00+00:00"),
            record("w4a8", "2026-12-03T13:06:00+00:00", "unfused"),  # a baseline: not ours
            record("w4a8", "2026-12-03T14:05:00+00:00"),
        ],
    }
    (note,) = megamoe.precision_runs_note(doc)
    assert "W4A8 records from the run(s) started 2026-12-03 14:00" in note
    assert "W8A8 from 2026-12-03 13:00" in note
    doc["records"][2]["clocks"]["before"]["time"] = "2026-12-03T13:07:00+00:00"
    assert megamoe.precision_runs_note(doc) == []


def test_a_lead_map_of_nine_leads_shows_in_parts_of_a_screen():
    """Issue 52's lead map sweeps eight leads and auto: the Markdown copy splits them, each
    part at most MAX_COLUMNS wide, and every column is still shown once per part."""
    from xstage_bench.report.tables.common import MAX_COLUMNS

    leads = ["0", "256", "512", "768", "1024", "1536", "2048", "4096", "auto"]
    frame = pd.DataFrame(columns=["path", "configuration", "f", "best_lead", "best_speedup"])
    frame = frame.assign(**{f"speedup lead={lead}": [] for lead in leads})
    main = megamoe_lead_table.markdown_columns(frame)[megamoe_lead_table.MAIN]
    lead_parts = [cols for title, cols in main.parts if title.startswith("speedup per lead")]
    assert len(lead_parts) == 2
    assert all(len(main.keys) + len(cols) <= MAX_COLUMNS for _, cols in main.parts)
    shown = [c for cols in lead_parts for c in cols]
    assert shown == [f"speedup lead={lead}" for lead in leads] + ["best_lead", "best_speedup"]
    # five leads and the best fit one part, as every lead map before
    few = frame.drop(columns=[f"speedup lead={lead}" for lead in leads[5:]])
    titles = [t for t, _ in megamoe_lead_table.markdown_columns(few)[megamoe_lead_table.MAIN].parts]
    assert titles == ["speedup per lead", "the model's auto lead"]
