"""The SLURM profile: each GPU job asks for a whole node of the right GPUs, exclusively."""

import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from xstage_bench.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
slurm_utils = pytest.importorskip(
    "snakemake_executor_plugin_slurm.utils", reason="snakemake-executor-plugin-slurm not installed"
)


class Resources(dict):
    __getattr__ = dict.get


def dry_run_jobs(tmp_path):
    for name in ("Snakefile", "workflow", "config.yaml", "config", "kernels", "envs"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    out = subprocess.run(
        [
            str(SNAKEMAKE),
            "-n",
            "--profile",
            "workflow/profiles/slurm",
            "--configfile",
            "config/h200x8.yaml",
            "--config",
            "measure=submit",
        ],
        cwd=tmp_path,
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


def test_submit_mode_needs_explicit_world_size_and_dataset():
    config = load_config(ROOT / "config" / "h200x8.yaml")
    config.update(measure="submit", world_size="auto")
    from xstage_bench.config import validate_config

    with pytest.raises(ConfigError, match="'world_size'"):
        validate_config(config)
