"""The Snakemake DAG: which jobs the full config makes, one-figure targets, bad configs."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixtures import copy_workflow

from xstage_bench.data import layout
from xstage_bench.report import products

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"

pytestmark = pytest.mark.skipif(not SNAKEMAKE.exists(), reason="snakemake is not installed")


@pytest.fixture()
def workdir(tmp_path):
    """A copy of the workflow without any results, so job counts do not depend on them."""
    return copy_workflow(tmp_path)


def snakemake(workdir, *args):
    return subprocess.run(
        [str(SNAKEMAKE), *args], cwd=workdir, capture_output=True, text=True, timeout=300
    )


def job_counts(workdir, *args):
    out = snakemake(workdir, *args, "-n", "--cores", "1", "--quiet", "rules")
    assert out.returncode == 0, out.stderr
    table = out.stdout.split("Job stats:")[1]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", table, flags=re.M))
    return {k: int(v) for k, v in counts.items()}


def test_full_config_dry_run_lists_every_stage(workdir):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    n_sim = len(config["datasets"]["simulated"])
    counts = job_counts(workdir, "--config", "measure=never")
    assert counts["microbench_simulate"] == n_sim * len(config["microbench"]["studies"])
    assert counts["megamoe_simulate"] == n_sim * 2  # sweep + mechanism trace
    assert counts["attention_simulate"] == n_sim
    assert counts["fit_burst_gap"] == n_sim
    simulated = products.Holding.of(layout.SIMULATED_EXPERIMENTS, config["microbench"]["studies"])
    for name, product in products.PRODUCTS.items():
        # the process-model comparison and the emulated sweep are made only on GPUs
        expected = n_sim if simulated.gives(product) else 0
        assert counts.get(product.rule, 0) == expected, name
    assert not simulated.gives(products.PRODUCTS["tab-process-model"])
    if shutil.which("nvcc"):
        assert counts.get("build_cubin", 0) == len(list((ROOT / "kernels").rglob("*.cu")))


def test_one_figure_builds_only_what_it_needs(workdir):
    counts = job_counts(workdir, "results/sim-b200/figures/fig-megamoe-speedup.pdf")
    assert counts == {"megamoe_simulate": 1, "figure_fig_megamoe_speedup": 1, "total": 2}


def test_one_rule_per_declared_product(workdir):
    out = snakemake(workdir, "--list-rules")
    assert out.returncode == 0, out.stderr
    rendering = {r for r in out.stdout.split() if r.startswith(("figure_", "table_"))}
    assert rendering == {p.rule for p in products.PRODUCTS.values()}


def test_the_claims_table_waits_for_the_datasets_beside_it(workdir):
    """tab-claims of sim-h200 shows sim-b200's answers beside its own (counterpart_reads):
    it reads every raw file and the model of both."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    counts = job_counts(workdir, "results/sim-h200/tables/tab-claims.csv")
    n_studies = len(config["microbench"]["studies"])
    assert counts["microbench_simulate"] == 2 * n_studies
    assert counts["megamoe_simulate"] == 2 * 2
    assert counts["attention_simulate"] == counts["fit_burst_gap"] == 2
    assert counts["table_tab_claims"] == 1


def test_bad_config_stops_with_the_key_named(workdir):
    bad = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    bad["attention"]["heads"] = ["many"]
    (workdir / "bad.yaml").write_text(yaml.safe_dump(bad))
    out = snakemake(workdir, "-n", "--cores", "1", "--configfile", "bad.yaml")
    assert out.returncode != 0
    assert "config key 'attention.heads[0]'" in out.stdout + out.stderr


def test_a_simulated_dataset_of_another_config_is_named_with_the_config_that_makes_it(workdir):
    # Its raw file left by a smoke run, the default config knows no profile for it: that
    # was a bare KeyError.
    drain = workdir / "results" / "sim-h200-smoke" / layout.microbench_raw("drain")
    drain.parent.mkdir(parents=True)
    drain.write_text("{}")
    out = snakemake(workdir, "-n", "--cores", "1", "results/sim-h200-smoke/figures/fig-drain.pdf")
    assert out.returncode != 0
    assert (
        "dataset 'sim-h200-smoke' is not in config key 'datasets.simulated' of this run's "
        "config (sim-h200, sim-b200) (--configfile config/smoke.yaml makes it)"
    ) in out.stdout + out.stderr


def test_a_misspelled_reference_dataset_is_named(workdir):
    # It was only skipped, with a warning, and the run went on without it.
    (workdir / "results" / "ref-h200x2").mkdir(parents=True)
    out = snakemake(workdir, "-n", "--cores", "1", "--config", "datasets.reference=[ref-h200x9]")
    assert out.returncode != 0
    assert (
        "config key 'datasets.reference': 'ref-h200x9' is not in results/ "
        "(did you mean 'ref-h200x2'?)"
    ) in out.stdout + out.stderr


def test_lint_is_clean(workdir):
    out = snakemake(workdir, "--lint")
    assert out.returncode == 0, out.stdout + out.stderr


def test_figures_with_an_optional_study_are_made_without_it(workdir):
    """fig-issue-vs-gap reads gap_sweep_barrier when a dataset has it, and is still made
    (one row fewer) for a dataset that lacks it."""
    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    del config["microbench"]["studies"]["gap_sweep_barrier"]
    config["datasets"]["reference"] = []
    (workdir / "free.yaml").write_text(yaml.safe_dump(config))
    counts = job_counts(workdir, "--configfile", "free.yaml")
    n_sim = len(config["datasets"]["simulated"])
    assert counts["figure_fig_issue_vs_gap"] == counts["figure_fig_backpressure_map"] == n_sim
    assert "microbench:gap_sweep_barrier" in products.PRODUCTS["fig-issue-vs-gap"].optional


def test_every_product_has_a_report_caption():
    for product in products.PRODUCTS:
        caption = ROOT / "workflow" / "report" / f"{product}.rst"
        assert caption.is_file() and caption.read_text().strip(), product


def test_a_measured_dataset_with_megamoe_per_gpu_compares_the_process_models(workdir):
    counts = job_counts(
        workdir,
        "measured",
        "--configfile",
        "config/h200x4.yaml",
        "--config",
        "measure=submit",
    )
    assert counts["megamoe_measure"] == counts["megamoe_measure_per_gpu"] == 1
    assert counts["table_tab_process_model"] == 1


def _megamoe_command(workdir, configfile: str) -> tuple[str, str]:
    """The MegaMoE measuring job's shell command in a dry run, and the whole dry run."""
    out = snakemake(
        workdir,
        "results/cpu-test/raw/megamoe.json",
        "-n",
        "-p",
        "--cores",
        "1",
        "--quiet",
        "host",
        "--configfile",
        configfile,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout + out.stderr
    return next(line for line in text.splitlines() if "xstage_bench.measure megamoe " in line), text


def test_a_lead_chosen_by_the_model_makes_the_megamoe_job_wait_for_the_fit(workdir):
    command, _ = _megamoe_command(workdir, "config/ci-measure.yaml")
    assert "--model" not in command  # integer leads: the MegaMoE job needs no model
    (workdir / "auto.yaml").write_text(
        "extends: config/ci-measure.yaml\nmegamoe: {lead_rows: auto}\n"
    )
    command, text = _megamoe_command(workdir, "auto.yaml")
    assert "--model results/cpu-test/model/burst_gap.json" in command
    assert "rule fit_burst_gap:" in text  # the fit runs first, and the microbenchmarks before it
