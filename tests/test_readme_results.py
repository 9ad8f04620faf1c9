"""The results section (docs/results.md) is generated from the committed references (issue
26: a recompute found README numbers that no file held): the block between its markers
must be exactly what `xstage readme` makes of results/ref-* today."""

import errno
import json
import math
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from xstage_bench.cli import main
from xstage_bench.data import layout
from xstage_bench.megamoe import schedule
from xstage_bench.report import generated_docs, readme_results
from xstage_bench.report.tables import megamoe as megamoe_table
from xstage_bench.report.tables import model_checks

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def committed_block() -> str:
    """The results block of the committed references, made once (seconds) for the tests
    that read it: it is a pure function of the files under results/."""
    return readme_results.section(ROOT / "results")


def test_the_results_block_is_what_the_committed_files_give(committed_block):
    page = (ROOT / "docs" / "results.md").read_text()
    assert committed_block in page, (
        "docs/results.md's results block differs from the committed files: run "
        "`xstage readme --write` (and re-render the references first if a renderer changed)"
    )


def test_every_number_of_the_block_comes_from_a_file_not_from_the_readme(committed_block):
    # A number typed into the block by hand is overwritten by the next generation.
    readme = (ROOT / "docs" / "results.md").read_text()
    tampered = readme.replace("geomean 1.", "geomean 9.", 1)
    assert tampered != readme
    block = committed_block
    assert block in readme_results.replace_in(tampered, block)
    with pytest.raises(ValueError, match="no generated results block"):
        readme_results.replace_in("no markers here", block)


def test_a_third_schedule_and_the_layer_over_the_kernel_have_lines_where_measured():
    """DeepGEMM upstream's order has a line exactly where a reference measured it (from
    tab-megamoe's rows of it); every reference with kernel times has its whole-layer line."""
    for name in readme_results.REFERENCES:
        ds = ROOT / "results" / name
        doc = json.loads((ds / layout.MEGAMOE_RAW).read_text())
        schedules = {r["point"].get("schedule") for r in doc["records"]}
        table = pd.read_csv(ds / "tables" / "tab-megamoe.csv")
        lines = readme_results.other_schedule_lines(table)
        assert bool(lines) == (schedule.DEEPGEMM_INTERLEAVED in schedules), name
        assert all("over expert waves" in line and "ours faster" in line for line in lines)
        whole = readme_results.layer_over_kernel_lines(ds)
        assert len(whole) == 1 and "whole layer over kernel time" in whole[0], name


def test_each_baseline_with_ok_times_has_a_line_per_reference():
    """A baseline that ran in a reference has its line (ours over it, per tokens per rank),
    one that never ran has none: DeepGEMM in ref-h200x1, FlashInfer in ref-h200x2."""
    for name in readme_results.REFERENCES:
        ds = ROOT / "results" / name
        doc = json.loads((ds / layout.MEGAMOE_RAW).read_text())
        ran = {r["point"].get("variant") for r in doc["records"] if r["status"] == "ok"} & {
            "deepgemm",
            "flashinfer",
            "unfused",
        }
        lines = readme_results.baseline_lines(ds)
        assert len(lines) == len(ran), name
        assert all("1024 tokens" in line and "ours faster in" in line for line in lines)
        # a sweep timed with the host lead says so (ref-h200x1 since 336cec8), one without not
        lead = doc["config"]["megamoe"].get("host_lead", False)
        assert all(("GPU was still busy" in line) == lead for line in lines), name


def test_a_baseline_line_says_what_our_time_covers_and_never_mixes_coverages(tmp_path):
    """Ours timed from expert rows (the dispatch outside) or from home tokens (inside, as
    the baselines'), said on each line; a dataset holding both gets no ratio at all."""
    import shutil

    ds = tmp_path / "ref"
    shutil.copytree(ROOT / "results" / "ref-h200x1-flashinfer" / "raw", ds / "raw")
    raw = ds / layout.MEGAMOE_RAW
    doc = json.loads(raw.read_text())
    (line,) = readme_results.baseline_lines(ds)
    assert "ours without (dispatched once beforehand)" in line
    ours = [r for r in doc["records"] if r["point"].get("variant") is None and r["extra"]]
    for r in ours:
        r["extra"]["layer_from"] = "home_tokens"
    raw.write_text(json.dumps(doc))
    (line,) = readme_results.baseline_lines(ds)
    assert "both times with their dispatch inside" in line and "1024 tokens" in line
    notes = " ".join(megamoe_table.build(ds).notes)  # tab-megamoe says it too
    assert "so does ours" in notes and "also covers our dispatch" in notes
    ours[0]["extra"]["layer_from"] = "expert_rows"
    raw.write_text(json.dumps(doc))
    (line,) = readme_results.baseline_lines(ds)
    assert "not compared" in line and "tokens" not in line


def test_the_geomean_ci_over_configurations_brackets_the_geomean():
    ratios = [0.8, 0.9, 1.0, 1.1, 1.2]
    low, high = readme_results.geomean_ci_over_configurations(ratios)
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    assert low < geomean < high
    assert readme_results.geomean_ci_over_configurations([0.9] * 4) == pytest.approx((0.9, 0.9))


def test_the_provenance_names_the_code_of_every_run_that_wrote_records(tmp_path, monkeypatch):
    # a sweep resumed or retried at later commits holds records measured by each of them
    def run(sha: str, day: str) -> dict:
        return {"git": {"sha": sha}, "started_at": f"{day}T10:00:00Z"}

    env = {
        **run("336cec8ca7253f9b5e62d2dca1c25ed739d9ac19", "2026-12-01"),
        "gpus": [{"name": "NVIDIA H200"}],
        "resumes": [run("8f26a2b", "2026-12-02"), run("336cec8", "2026-12-02")],
    }
    doc = {"environment": env, "records": [{"status": "ok"}, {"status": "failed"}]}
    monkeypatch.setattr(readme_results, "_raw_docs", lambda ds: [doc])
    line = readme_results.provenance_line(tmp_path / "ref-x")
    assert "measured 2026-12-01, 2026-12-02 (code 336cec8, 8f26a2b); 1 of 2 points ok" in line


def test_a_baseline_line_says_same_run_only_when_the_records_say_so():
    """ref-h200x1 timed our kernel again two days after FlashInfer: its line must not say
    they were timed in the same run; ref-h200x1-flashinfer timed each configuration's
    pair in one run (its second run added the 16384-token configurations)."""
    column = "ours_over_flashinfer"

    def record(variant, at, **point):
        return {
            "status": "ok",
            "point": {"shape": "s", "tokens_per_rank": 1, "variant": variant, **point},
            "clocks": {"before": {"time": at}},
        }

    one = {"environment": {"started_at": "2026-12-02T10:00:00+00:00"}, "records": []}
    assert "same run" in readme_results._runs(one, column)
    env = {**one["environment"], "resumes": [{"started_at": "2026-12-02T12:00:00+00:00"}]}
    pairs = [
        record(None, "2026-12-02T10:01:00+00:00", schedule="expert_wave"),
        record("flashinfer", "2026-12-02T10:02:00+00:00", schedule="flashinfer"),
        record(None, "2026-12-02T12:01:00+00:00", schedule="expert_wave", tokens_per_rank=2),
        record("flashinfer", "2026-12-02T12:02:00+00:00", schedule="flashinfer", tokens_per_rank=2),
    ]
    grown = {"environment": env, "records": pairs}
    assert "each configuration's two timed one after the other in one run" in (
        readme_results._runs(grown, column)
    )
    pairs[1]["clocks"]["before"]["time"] = "2026-12-02T12:03:00+00:00"  # retried later
    assert (
        "timed ours and the baseline in different runs in 1 of 2 configurations, the "
        "baseline 2.0 h after ours" in readme_results._runs(grown, column)
    )
    for name, same in (("ref-h200x1", False), ("ref-h200x1-flashinfer", True)):
        lines = readme_results.baseline_lines(ROOT / "results" / name)
        line = next(line for line in lines if "FlashInfer" in line)
        assert ("one run" in line or "same run" in line) == same, name


def test_a_baseline_line_says_which_side_a_later_run_timed():
    """ref-h200x1's baselines were timed on 2026-12-02 and our kernel again on 12-03 and
    12-04 (later code): the line said 'a baseline may come from a later run than ours',
    the wrong way round, and not that every configuration's pair came from two runs."""
    column = "ours_over_deepgemm"

    def record(variant, at, **point):
        return {
            "status": "ok",
            "point": {"shape": "s", "tokens_per_rank": 1, "variant": variant, **point},
            "clocks": {"before": {"time": at}},
        }

    env = {
        "started_at": "2026-12-02T10:00:00+00:00",
        "resumes": [{"started_at": "2026-12-04T10:00:00+00:00"}],
    }
    doc = {
        "environment": env,
        "records": [
            record("deepgemm", "2026-12-02T10:02:00+00:00", schedule="expert_wave"),
            record(None, "2026-12-04T10:02:00+00:00", schedule="expert_wave"),
            record(None, "2026-12-04T10:03:00+00:00", schedule="interleaved"),
        ],
    }
    text = readme_results._runs(doc, column)
    assert "later run than ours" not in text
    assert "in different runs in 1 of 1 configurations, the baseline 48.0 h before ours" in text
    lines = readme_results.baseline_lines(ROOT / "results" / "ref-h200x1")
    line = next(line for line in lines if "DeepGEMM" in line)
    assert "in different runs in 36 of 36 configurations" in line and "h before ours" in line


def test_the_block_says_how_each_ratio_was_timed_and_marks_noisy_extremes(committed_block):
    """An audit recomputed the block from the raw files: the numbers held, but the text
    hid what the project's standard asks a reader to know. ref-h200x2's schedules and
    attention backends were timed unpaired (triton alone in another run than FA3), its
    peer-path min and emulated max came from points whose CI reaches beyond +-3%, the
    emulated speedup named no metric, and the one-point lead map of ref-h200x1-flashinfer
    read '1 points' and gave the main grid's arm (lead 1024) as its best swept lead, where
    it swept lead 0 only."""
    block = committed_block
    x2 = block[block.index("**ref-h200x2**") :]
    peer = next(line for line in x2.splitlines() if "peer path, natural routing" in line)
    assert "84 configurations, unpaired" in peer and "min 0.895 (noisy: CI beyond +-3%)" in peer
    emulated = next(line for line in x2.splitlines() if "compute emulated" in line)
    assert "(layer time, 84 points, unpaired" in emulated and "(noisy: CI" in emulated
    triton = next(line for line in x2.splitlines() if "Attention alone, triton" in line)
    assert "unpaired" in triton and "in another run than FA3 for 20 of 20" in triton
    host = block[block.index("**ref-h200x1**") : block.index("**ref-h200x2**")]
    assert host.count("paired rounds") >= 3 and "unpaired" in host  # the emulated sweep
    assert "1 points" not in block
    assert (
        "MegaMoE lead map (1 point of f and configuration, kernel time): the best swept lead "
        "reaches 0.990 (95% CI 0.980-0.999)"
    ) in block


def test_the_fit_line_gives_every_prediction_error_and_the_failed_checks(committed_block):
    """The held-out error of the fit set alone (a median over its 37 rows) read as the
    model's accuracy; its p90, the free-running records the fit never saw and the model's
    own failed checks belong beside it (each as the committed model file gives it)."""
    block = committed_block
    for name in ("ref-h200x1", "ref-h200x2"):
        model = json.loads((ROOT / "results" / name / layout.MODEL_JSON).read_text())
        free = model["validation_summary_free"]
        free_text = f"on {free['n']} free-running records never fitted "
        free_text += f"{free['median_abs_rel_error']:.1%}"
        ds = block[block.index(f"**{name}**") :]
        fit = next(line for line in ds.splitlines() if line.startswith("- Burst-Gap"))
        assert "held-out rows a median" in fit and "(p90 " in fit and free_text in fit, fit
        assert f"the model's own checks: {model_checks.counts(model)}" in fit, fit
        for check, result in model["checks"].items():
            assert (check in fit) == (result["passed"] is False), (check, fit)


def test_the_fit_line_gives_the_capacity_law_and_its_choice(tmp_path):
    from fixtures import make_dataset

    from xstage_bench.report.render import TABLES

    ds = make_dataset(tmp_path, "sim-fixture", megamoe=False, attention=False)
    model_file = ds / layout.MODEL_JSON
    model = json.loads(model_file.read_text())
    model["params"]["q_bytes"]["reason"] = "fixed at 0 by the shared law"
    model_file.write_text(json.dumps(model))
    (ds / "tables").mkdir()
    TABLES["tab-burst-gap-params"](ds).frame.to_csv(ds / "tables" / "tab-burst-gap-params.csv")
    (line,) = readme_results.burst_gap_lines(ds)
    assert (
        "Q(K) = S + K q (shared, chosen by held-out error): S 2.00 (95% CI 1.96-2.04) MiB, "
        "q 0.0 (fixed at 0 by the shared law) KiB, Q at K=132 2.00 (95% CI 1.96-2.04) MiB;"
    ) in line, line


def test_a_host_lead_line_counts_the_calls_the_gpu_may_have_waited_in(committed_block):
    """'each call enqueued while the GPU was still busy' is the method; a few calls still
    found the GPU idle (ref-h200x1: 15 of the unfused pipeline's), and the line says how
    many of ours and of the baseline's, as tab-megamoe's host-side section counts them."""
    table = (ROOT / "results/ref-h200x1/tables/tab-megamoe.md").read_text()

    def counted(variant: str) -> tuple[str, str]:  # (timed calls, calls the GPU may have waited in)
        row = re.search(rf"^\| {variant} \| \d+ \| \w+ \|.*\| (\d+) \| (\d+) \|$", table, re.M)
        assert row, f"no host-side row for {variant} in tab-megamoe"
        return row.group(1), row.group(2)

    (ours_calls, ours_waited), (its_calls, its_waited) = counted("ours"), counted("unfused")
    assert int(its_waited) > 0  # the case the line exists for
    block = committed_block
    x1 = block[block.index("**ref-h200x1**") : block.index("**ref-h200x2**")]
    unfused = next(line for line in x1.splitlines() if "unfused torch pipeline" in line)
    expected = (
        f"(the GPU may have waited for the host in {ours_waited} of {ours_calls} of ours, "
        f"{its_waited} of {its_calls} of its)"
    )
    assert expected in unfused, unfused
    x2 = block[block.index("**ref-h200x2**") :]
    assert "may have waited" not in x2  # measured before the host lead existed


def test_readme_refuses_a_results_directory_without_the_references(tmp_path, capsys):
    """`xstage readme --write --results <wrong dir>` exited 0 and wrote an empty block; one
    reference of four gave a block without the other three."""
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    before = readme.read_bytes()
    partial = tmp_path / "results"
    partial.mkdir()
    (partial / "ref-h200x2").symlink_to(ROOT / "results" / "ref-h200x2")
    for results, problem in (
        (tmp_path / "nowhere", "no such results directory"),
        (
            partial,
            "no raw/ folder of the reference dataset(s) ref-h100x1, ref-h200x1-flashinfer, "
            "ref-h200x1;",
        ),
    ):
        argv = ["readme", "--write", "--readme", str(readme), "--results", str(results)]
        assert main(argv) == 2
        assert f"xstage: error: {results}: {problem}" in capsys.readouterr().err
    assert readme.read_bytes() == before


def only_block(monkeypatch, text: str) -> None:
    """`xstage readme` with one generated block, the results block of README.md, made as
    `text` (the references not needed)."""
    block = generated_docs.Block("results", "README.md", lambda root, results: text)
    monkeypatch.setattr(generated_docs, "BLOCKS", (block,))
    monkeypatch.setattr(readme_results, "require_references", lambda root: None)


def test_readme_write_is_atomic(tmp_path, monkeypatch, capsys):
    """A write that fails part way (here the disk fills) leaves the README as it was and
    names it; a plain write_text left it truncated."""
    begin, end = readme_results.BEGIN, readme_results.END
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{begin}\nold\n{end}\n")
    only_block(monkeypatch, f"{begin}\nnew\n{end}")

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    argv = ["readme", "--write", "--readme", str(readme)]
    with monkeypatch.context() as full:
        full.setattr(os, "fsync", disk_full)
        assert main(argv) == 2
    assert f"cannot write {readme}: No space left on device" in capsys.readouterr().err
    assert readme.read_text() == f"intro\n{begin}\nold\n{end}\n"
    assert list(tmp_path.iterdir()) == [readme]  # no temporary file left behind
    assert main(argv) == 0
    assert readme.read_text() == f"intro\n{begin}\nnew\n{end}\n"


def test_readme_write_names_a_file_without_the_markers(tmp_path, monkeypatch, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    only_block(monkeypatch, "block")
    assert main(["readme", "--write", "--readme", str(readme)]) == 2
    assert f"xstage: error: {readme}: no generated results block" in capsys.readouterr().err
