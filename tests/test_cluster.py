"""The SLURM profile: each GPU job asks for a whole node of the right GPUs, exclusively; the
cluster command of docs/running.md keeps the profile's resources; figures and tables never
become jobs. The profile against a real Slurm is CI's (.ci/slurm.sh)."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import fixtures
import pytest
import yaml

from xstage_bench.data.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
slurm_utils = pytest.importorskip(
    "snakemake_executor_plugin_slurm.utils", reason="snakemake-executor-plugin-slurm not installed"
)


class Resources(dict):
    __getattr__ = dict.get


def copy_workflow(tmp_path, results=False):
    fixtures.copy_workflow(tmp_path)  # with the default profile, as a user's clone has it
    if results:
        shutil.copytree(ROOT / "results", tmp_path / "results")


def readme_cluster_command():
    """docs/running.md's cluster command: its exported variables and its snakemake arguments."""
    readme = (ROOT / "docs" / "running.md").read_text()
    exports = re.search(r"^ {4}export (SBATCH_\S+ SBATCH_\S+)", readme, re.M)
    command = re.search(r"^ {4}snakemake --profile workflow/profiles/slurm (.*)$", readme, re.M)
    assert exports and command, "docs/running.md: no cluster command"
    env = dict(kv.split("=", 1) for kv in exports.group(1).split())
    return env, shlex.split(command.group(1))


def dry_run_jobs(
    tmp_path, args=("--configfile", "config/h200x8.yaml", "--config", "measure=submit"), env=None
):
    copy_workflow(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBATCH_")} | (env or {})
    out = subprocess.run(
        # --quiet host: the default profile's quiet log hides the job details read here
        [str(SNAKEMAKE), "-n", "--profile", "workflow/profiles/slurm", "--quiet", "host", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = re.split(r"\n(?=rule \w+:)", out.stdout + out.stderr)
    parsed = []
    for block in jobs:
        rule = re.match(r"rule (\w+):", block)
        res = re.search(r"resources: (.*)", block)
        if rule and res:
            fields = dict(kv.split("=", 1) for kv in res.group(1).split(", "))
            parsed.append((rule.group(1), fields))
    return parsed


def test_gpu_jobs_ask_for_a_whole_exclusive_node(tmp_path):
    jobs = dry_run_jobs(tmp_path)
    gpu_jobs = [(rule, res) for rule, res in jobs if "_measure" in rule]
    assert {rule for rule, _ in gpu_jobs} == {
        "microbench_measure",
        "megamoe_measure",
        "megamoe_measure_per_gpu",
        "attention_measure",
    }
    assert len([r for r, _ in gpu_jobs if r == "microbench_measure"]) == len(
        load_config(ROOT / "config" / "h200x8.yaml")["microbench"]["studies"]
    )
    for rule, res in gpu_jobs:
        assert res["gpu"] == "8" and res["gpu_model"] == "h200", rule
        assert res["slurm_extra"] == "--exclusive", rule
        # The plugin's own submission string for these resources:
        job = SimpleNamespace(resources=Resources(gpu=int(res["gpu"]), gpu_model=res["gpu_model"]))
        assert slurm_utils.set_gres_string(job).strip() == "--gpus=h200:8"
    cpu_jobs = [res for rule, res in jobs if "_measure" not in rule]
    assert cpu_jobs and all("gpu" not in res for res in cpu_jobs)


def test_every_gpu_rule_asks_for_a_whole_exclusive_node():
    # A GPU rule the profile left out went out with the default 8 GB, two CPUs and no
    # --exclusive (megamoe_measure_emulated did): every rule that takes the gpu resource
    # has its own entry.
    gpu_rules = set()
    for rules in (ROOT / "workflow" / "rules").glob("*.smk"):
        for block in re.split(r"\n(?=rule \w+:)", rules.read_text()):
            rule = re.match(r"rule (\w+):", block)
            if rule and "gpu=GPU_JOB" in block:
                gpu_rules.add(rule.group(1))
    profile = yaml.safe_load((ROOT / "workflow/profiles/slurm/config.yaml").read_text())
    assert "megamoe_measure_emulated" in gpu_rules and len(gpu_rules) == 5, gpu_rules
    for rule in gpu_rules:
        res = profile["set-resources"].get(rule, {})
        assert res.get("slurm_extra") == "--exclusive" and res.get("gpu_model"), rule


def test_submit_mode_needs_explicit_world_size_and_dataset():
    config = load_config(ROOT / "config" / "h200x8.yaml")
    config.update(measure="submit", world_size="auto")
    from xstage_bench.data.config import validate_config

    with pytest.raises(ConfigError, match="'world_size'"):
        validate_config(config)


def test_readme_command_keeps_the_profile_defaults(tmp_path):
    # A --default-resources for account and partition replaced the profile's whole list: CPU
    # jobs went out with no time limit, 1000 MB and one CPU.
    env, args = readme_cluster_command()
    jobs = dry_run_jobs(tmp_path, args, env)
    profile = yaml.safe_load((ROOT / "workflow/profiles/slurm/config.yaml").read_text())
    for rule, res in jobs:
        want = {"runtime": "20", "mem_mb": "8000", "cpus_per_task": "2"}
        want |= {k: str(v) for k, v in profile["set-resources"].get(rule, {}).items()}
        want |= {"slurm_account": env["SBATCH_ACCOUNT"], "slurm_partition": env["SBATCH_PARTITION"]}
        assert {k: res.get(k) for k in want} == want, rule


def test_without_account_or_partition_the_cluster_chooses(tmp_path):
    # Empty means "not given" to the plugin: it guesses the account and asks for the cluster's
    # default partition.
    jobs = dry_run_jobs(tmp_path, ("--configfile", "config/smoke.yaml"))
    assert jobs and all(
        res["slurm_account"] == res["slurm_partition"] == "" and res["mem_mb"] == "8000"
        for _, res in jobs
    )


def test_status_from_squeue():
    # sacct fails without the accounting database, and the plugin then never sees jobs end.
    profile = yaml.safe_load((ROOT / "workflow/profiles/slurm/config.yaml").read_text())
    assert profile["slurm-status-command"] == "squeue"


def test_figures_and_tables_run_beside_snakemake(tmp_path):
    # Slurm's commands are stubs that record their calls and fail: a table made under the SLURM
    # profile must not have asked for a job.
    copy_workflow(tmp_path, results=True)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for tool in ("sbatch", "srun", "squeue", "sacct", "sinfo", "scontrol", "scancel"):
        (stubs / tool).write_text(f'#!/bin/sh\necho {tool} "$@" >> {stubs}/calls\nexit 1\n')
        (stubs / tool).chmod(0o755)
    table = "results/ref-h200x2/tables/tab-megamoe.csv"
    out = subprocess.run(
        [
            str(SNAKEMAKE),
            "--profile",
            "workflow/profiles/slurm",
            "--configfile",
            "config/smoke.yaml",
            "--slurm-init-seconds-before-status-checks",
            "1",
            "--quiet",
            "host",
            "-f",
            table,
        ],
        cwd=tmp_path,
        env=os.environ | {"PATH": f"{stubs}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "localrule table_tab_megamoe:" in out.stdout + out.stderr
    calls = (stubs / "calls").read_text() if (stubs / "calls").exists() else ""
    assert "sbatch" not in calls
