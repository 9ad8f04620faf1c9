"""The Snakemake DAG: which jobs the full config makes, one-figure targets, bad configs."""

import importlib.util
import json
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
    # played once per simulated dataset (the references' committed playback is not remade)
    assert counts["play_megamoe"] == n_sim
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


def fake_gpu_node(tmp_path, count: int, visible: str | None = None, peers: str = "True") -> dict:
    """The environment of a node with `count` H200s, for a dry run on the CPU: an
    nvidia-smi on PATH that lists them, and a `cupy` whose peer query, as CUDA's, knows
    only the devices CUDA_VISIBLE_DEVICES shows; `peers`: whether a reaches b, in Python."""
    import os

    bin_dir, py_dir = tmp_path / "fake-bin", tmp_path / "fake-py" / "cupy"
    bin_dir.mkdir()
    py_dir.mkdir(parents=True)
    rows = "\\n".join(f"NVIDIA H200, GPU-{i}0c0ffee" for i in range(count))
    names = "\\n".join("NVIDIA H200" for _ in range(count))
    (bin_dir / "nvidia-smi").write_text(
        f'#!/bin/sh\ncase "$*" in *name,uuid*) printf "{rows}\\n";; *) printf "{names}\\n";; esac\n'
    )
    (bin_dir / "nvidia-smi").chmod(0o755)
    shown = len(visible.split(",")) if visible else count
    (py_dir / "__init__.py").write_text(
        "from types import SimpleNamespace\n"
        "def _can(a, b):\n"
        f"    if not (0 <= a < {shown} and 0 <= b < {shown}):\n"
        "        raise RuntimeError('cudaErrorInvalidDevice')\n"
        f"    return int({peers})\n"
        "cuda = SimpleNamespace(runtime=SimpleNamespace(deviceCanAccessPeer=_can))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(py_dir.parent), env.get("PYTHONPATH")]))
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env


def dry_run_on(workdir, env, config: dict):
    (workdir / "node.yaml").write_text(yaml.safe_dump({"extends": "config.yaml", **config}))
    return subprocess.run(
        [str(SNAKEMAKE), "measured", "-n", "-p", "--quiet", "host", "--configfile", "node.yaml"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


OWN_DATASETS = {"datasets": {"measured": "auto", "reference": [], "simulated": {}}}


def test_world_size_auto_is_checked_against_the_gpus_of_the_node(workdir, tmp_path):
    """`world_size: auto` on 8 GPUs: 12 heads do not divide over 8 ranks. The run stops
    when it is planned, naming the key, not when the attention job starts (hours in)."""
    config = {**OWN_DATASETS, "attention": {"heads": [12]}}
    out = dry_run_on(workdir, fake_gpu_node(tmp_path, 8), config)
    assert out.returncode != 0
    assert "'attention.heads[0]': 12 does not divide over world_size 8" in out.stderr
    assert "the 8 GPUs here" in out.stderr


def test_a_share_of_a_node_is_measured_as_the_gpus_cuda_shows(workdir, tmp_path):
    """CUDA_VISIBLE_DEVICES=4,5 on an 8-GPU node: two GPUs, dataset h200x2, each GPU job
    holding those two."""
    out = dry_run_on(workdir, fake_gpu_node(tmp_path, 8, visible="4,5"), OWN_DATASETS)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    assert "results/h200x2/raw/attention.json" in text
    assert "results/h200x8" not in text
    assert set(re.findall(r"gpu=(\d+)", text)) == {"2"}


def test_the_peer_path_needs_peer_access_between_the_run_s_own_gpus(workdir, tmp_path):
    """A PCIe node whose two halves (GPUs 0-3, 4-7) do not reach each other: a run on
    GPUs 0 and 1 measures both paths; one on every GPU, the host path alone."""
    env = fake_gpu_node(tmp_path, 8, peers="a // 4 == b // 4")
    pair = {**OWN_DATASETS, "world_size": 2, "gpu_ids": [0, 1]}
    out = dry_run_on(workdir, env, pair)
    assert out.returncode == 0, out.stderr[-3000:]
    assert '"store_paths": ["peer", "host"]' in out.stdout
    out = dry_run_on(workdir, env, OWN_DATASETS)
    assert out.returncode == 0, out.stderr[-3000:]
    assert '"store_paths": ["host"]' in out.stdout and '"peer"' not in out.stdout


def test_a_run_on_some_of_a_node_s_gpus_is_named_by_them(workdir, tmp_path):
    """world_size 2 (GPUs 2 and 3) on an 8-GPU node measures dataset h200x2: named
    h200x8, it would mix P = 2 files into the node's P = 8 dataset."""
    config = {**OWN_DATASETS, "world_size": 2, "gpu_ids": [2, 3]}
    out = dry_run_on(workdir, fake_gpu_node(tmp_path, 8), config)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "results/h200x2/raw/attention.json" in out.stdout
    assert "results/h200x8" not in out.stdout


def test_a_clone_whose_path_holds_a_space_and_an_umlaut_runs_its_script_jobs(tmp_path):
    """Issue 54: in a clone under a path with a space, with its virtual environment in it,
    every `script:` job failed ("/usr/bin/bash: line 1: /tmp/rel: Is a directory")."""
    clone = tmp_path / "x stage ü" / "repo"
    clone.mkdir(parents=True)
    copy_workflow(clone)
    (clone / ".venv").symlink_to(Path(sys.executable).parent.parent)  # as if made there
    target = "results/sim-h200-smoke/raw/attention.json"  # a script job (simulate.py)
    out = subprocess.run(
        [str(clone / ".venv" / "bin" / "python"), "-m", "snakemake", target]
        + ["--configfile", "config/smoke.yaml"],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (clone / target).stat().st_size


def xstage_validate(workdir, configfile: str, env=None):
    return subprocess.run(
        [str(SNAKEMAKE.parent / "xstage"), "validate", configfile],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda c: c["megamoe"]["shapes"][0].update(E=12), "shapes[0].E': 12 experts do not"),
        (lambda c: c["attention"].update(heads=[4]), "attention.heads[0]': 4 does not"),
    ],
    ids=["E", "heads"],
)
def test_what_divides_over_a_simulated_node_is_checked_before_any_job(workdir, mutate, key):
    """Issue 54: under world_size auto, without a GPU, values that do not divide over a
    simulated dataset's node (sim-b200-smoke: 8 GPUs) passed `xstage validate` and the dry
    run, then failed as a traceback inside the job."""
    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    mutate(config)  # divides over sim-h200-smoke's 2 GPUs, not over 8
    (workdir / "c.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    said = (
        f"{key} divide over world_size 8 (world_size 'auto': "
        "dataset 'sim-b200-smoke' is simulated at the 8 GPUs of config/hardware/b200.yaml's node)"
    )
    out = xstage_validate(workdir, "c.yaml")
    assert out.returncode == 2 and said in out.stderr, out.stdout + out.stderr
    out = snakemake(workdir, "-n", "--configfile", "c.yaml")
    assert out.returncode != 0 and said in out.stderr, out.stderr[-3000:]


def test_validate_checks_world_size_auto_against_the_gpus_here(workdir, tmp_path):
    config = {"extends": "config.yaml", **OWN_DATASETS, "attention": {"heads": [12]}}
    (workdir / "node.yaml").write_text(yaml.safe_dump(config))
    out = xstage_validate(workdir, "node.yaml", fake_gpu_node(tmp_path, 8))
    assert out.returncode == 2, out.stdout
    assert (
        "'attention.heads[0]': 12 does not divide over world_size 8 (world_size 'auto': the 8 "
        "GPUs here)" in out.stderr
    )


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has GPUs")
def test_validate_says_what_world_size_auto_leaves_to_the_gpus_of_a_run(workdir):
    out = xstage_validate(workdir, "config.yaml")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "config.yaml: valid",
        "  world_size 'auto': simulated datasets checked at their nodes' GPUs (sim-h200 at 2, "
        "sim-b200 at 8)",
        "  world_size 'auto': no measured world size checked, as no GPU can measure here: "
        "nvidia-smi not found (no NVIDIA driver on this machine). A run on GPUs checks their "
        "count before any job",
    ]


def test_validate_refuses_what_the_run_refuses_in_the_files_a_config_names(workdir):
    """Issue 54: a missing hardware profile and a misspelled reference were "valid"."""
    (workdir / "results" / "ref-h200x2").mkdir(parents=True)
    cases = {
        "datasets: {simulated: {sim-h200: config/hardware/h300.yaml}}": (
            "config key 'datasets.simulated.sim-h200': hardware profile "
            f"config/hardware/h300.yaml not found in the working directory {workdir}"
        ),
        "datasets: {reference: [ref-h200x3]}": (
            "config key 'datasets.reference': 'ref-h200x3' is not in results/ (did you mean "
            "'ref-h200x2'?)"
        ),
    }
    for body, said in cases.items():
        (workdir / "c.yaml").write_text(f"extends: config.yaml\n{body}\n")
        out = xstage_validate(workdir, "c.yaml")
        assert out.returncode == 2 and f"c.yaml: {said}" in out.stderr, out.stdout + out.stderr
        out = snakemake(workdir, "-n", "--configfile", "c.yaml")
        assert out.returncode != 0 and said in out.stderr, out.stderr[-3000:]


def test_a_profile_missing_from_a_subdirectory_names_the_working_directory(workdir):
    """Issue 54: `snakemake -s ../Snakefile` from a subdirectory reported a missing
    config/hardware/h200.yaml without saying that the working directory was the cause."""
    sub = workdir / "sub"
    sub.mkdir()
    target = "results/sim-h200/figures/fig-drain.pdf"
    out = snakemake(sub, "-s", "../Snakefile", "--configfile", "../config.yaml", "-n", target)
    assert out.returncode != 0
    assert (
        "config key 'datasets.simulated.sim-h200': hardware profile config/hardware/h200.yaml "
        f"not found in the working directory {sub.resolve()} (paths in a config are relative "
        f"to it); the workflow's folder has it: run from there (cd {workdir.resolve()})"
    ) in out.stderr, out.stderr[-3000:]


@pytest.mark.skipif(importlib.util.find_spec("triton") is not None, reason="this Python has triton")
def test_a_cpu_test_without_triton_says_what_to_install(workdir):
    """Issue 54: measure_device cpu under envs/cpu.txt failed inside a job with "No module
    named 'triton'"."""
    args = ("measured_raw", "--configfile", "config/ci-measure.yaml")
    said = "config key 'measure_device': 'cpu' runs the measuring rules under torch and Triton"
    out = snakemake(workdir, "-n", *args)
    assert out.returncode == 0 and f"a run would stop here: {said}" in out.stderr
    out = snakemake(workdir, *args)
    assert out.returncode != 0 and said in out.stderr, out.stderr[-3000:]
    assert "install envs/kernels-cpu.txt in an environment of its own" in out.stderr
    assert "Select jobs to execute" not in out.stdout + out.stderr  # before any job
    assert not (workdir / "results" / "cpu-test").exists()


def test_the_fit_takes_its_bootstrap_count_from_the_config(workdir):
    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    config["model"] = {"bootstrap_replicates": 20}
    (workdir / "c.yaml").write_text(yaml.safe_dump(config))
    model = "results/sim-h200-smoke/" + layout.MODEL_JSON
    out = snakemake(workdir, model, "--cores", "2", "--configfile", "c.yaml")
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((workdir / model).read_text())
    assert doc["fit"]["n_bootstrap"] == 20
    chosen = doc["capacity_law"]["chosen"]
    assert doc["fit"]["bootstrapped"].startswith(f"the {chosen} variant's")
    for law, variant in doc["variants"].items():  # CIs for the chosen variant alone
        R = variant["params"]["R_GBps"]
        assert (R["ci_low"] is not None) == (law == chosen), (law, R)
