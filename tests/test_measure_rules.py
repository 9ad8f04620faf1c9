"""Every measuring rule, run the way a user runs it: through Snakemake, on the CPU.

config/ci-measure.yaml sets measure_device: cpu, so the same rules a GPU run uses start
`python -m xstage_bench.measure` on gloo and the Triton interpreter: single-process and
one-process-per-GPU MegaMoE, attention, and the microbenchmark as far as it goes without
a GPU. A rule that breaks under Snakemake (as spawned workers of a `script:` rule once
did) fails here. Needs torch, triton and snakemake in one environment (.venv-kernels).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import copy_workflow

from xstage_bench.data.results import read_raw

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("torch", "triton", "snakemake")),
    reason="needs torch, triton and snakemake in one environment (.venv-kernels)",
)


def snakemake(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """The measured raw files of config/ci-measure.yaml, made once in a copy of the repo."""
    work = tmp_path_factory.mktemp("repo")
    copy_workflow(work)
    out = snakemake(work, "measured_raw", "--configfile", "config/ci-measure.yaml")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return work, work / "results" / "cpu-test" / "raw", out.stderr


def statuses(doc: dict) -> dict[str, str]:
    return {r["id"]: r["status"] for r in doc["records"]}


def test_every_raw_file_is_valid_and_labelled_a_cpu_test(cpu_run):
    _, raw, log = cpu_run
    files = sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*.json"))
    assert files == [
        "attention.json",
        "megamoe.json",
        "megamoe_emulated.json",
        "megamoe_per_gpu.json",
        "megamoe_trace.json",
        "microbench/gap_sweep.json",
    ]
    for name in files:
        env = read_raw(raw / name)["environment"]
        assert env["device_type"] == "cpu", name
        assert "not a measurement" in env["note"], name
    assert "Testing the measuring rules on the CPU" in log


def test_megamoe_both_process_models_check_and_time_every_point(cpu_run):
    _, raw, _ = cpu_run
    for name, paths in (("megamoe.json", {"peer", "host"}), ("megamoe_per_gpu.json", {"peer"})):
        doc = read_raw(raw / name)
        assert set(statuses(doc).values()) == {"ok"}, name
        # (2 schedules decided on the device + interleaved's host list) x (natural, 0.875), on
        # every path this run measures (2 ranks: both)
        assert len(doc["records"]) == 6 * len(paths), name
        assert {r["point"]["path"] for r in doc["records"]} == paths, name
        oracles = [r for r in doc["records"] if r["id"].endswith("/interleaved/oracle")]
        assert len(oracles) == 2 * len(paths), name
        assert all(r["point"]["decided_on"] == "list" for r in oracles), name
        others = [r for r in doc["records"] if r not in oracles]
        assert all(r["point"]["decided_on"] == "device" for r in others), name
    single = read_raw(raw / "megamoe.json")["records"]
    inter = [r for r in single if r["point"]["schedule"] == "interleaved"]
    # the device-decided interleaved arm and its oracle compute the same rows
    assert len(inter) == 8 and all(r["extra"]["bitwise_equal_to_expert_wave"] for r in inter)
    # each configuration's arms were timed in the same rounds
    assert all(len(r["extra"]["paired"]["arms"]) == 3 for r in single)
    peer = [r for r in single if r["point"]["path"] == "peer"]
    # the re-homed configuration sends 7/8 of the combine rows to the other rank
    natural, rehomed = (
        next(r for r in peer if r["point"].get("remote_fraction") == f) for f in (None, 0.875)
    )
    assert rehomed["extra"]["nvlink_bytes"] == pytest.approx(
        natural["extra"]["nvlink_bytes"] * 0.875 / 0.5, rel=0.1
    )
    # on the host path 7/8 of each rank's tokens have their rows stored into host memory
    host = {r["point"]["remote_fraction"]: r for r in single if r["point"]["path"] == "host"}
    assert host[0.0]["extra"]["host_bytes"] == 0
    T, topk, H = 32, 2, 256
    assert host[0.875]["extra"]["host_bytes"] == 2 * round(0.875 * T) * topk * H * 2


def test_attention_runs_ours_and_records_a_missing_backend(cpu_run):
    """Both store paths (store_paths: auto on two ranks), each group's modes paired."""
    _, raw, _ = cpu_run
    doc = read_raw(raw / "attention.json")
    got = statuses(doc)
    assert {k: v for k, v in got.items() if k.startswith("triton/")} == {
        f"triton/{m}/H=2/S=128/P=2{path}": "ok"
        for m in ("alone", "serial", "fused")
        for path in ("", "/path=host")
    }
    assert {v for k, v in got.items() if k.startswith("fa3/")} == {"unsupported"}
    assert doc["config"]["store_paths"] == ["peer", "host"]
    groups = {
        r["point"]["path"]: r["extra"]["paired"]["group"]
        for r in doc["records"]
        if r["status"] == "ok"
    }
    assert len(set(groups.values())) == 2


def test_what_needs_a_gpu_is_recorded_with_the_reason(cpu_run):
    _, raw, _ = cpu_run
    micro = read_raw(raw / "microbench" / "gap_sweep.json")
    assert len(micro["records"]) == 4  # the study's points, planned on both store paths
    assert {r["point"]["path"] for r in micro["records"]} == {"peer", "host"}
    assert micro["config"]["store_paths"] == ["peer", "host"]
    assert {r["status"] for r in micro["records"]} == {"failed"}
    assert all("burst benchmark cannot start" in r["error"] for r in micro["records"])
    for name in ("megamoe_trace.json", "megamoe_emulated.json"):
        records = read_raw(raw / name)["records"]
        assert records and {r["status"] for r in records} == {"unsupported"}
        assert all("%globaltimer" in r["error"] for r in records)


def test_a_rerun_has_nothing_to_do(cpu_run):
    work, _, _ = cpu_run
    out = snakemake(work, "-n", "measured_raw", "--configfile", "config/ci-measure.yaml")
    assert out.returncode == 0
    assert "Nothing to be done" in out.stdout + out.stderr


def test_a_kernel_change_reruns_only_the_jobs_that_run_that_kernel(cpu_run):
    """Our kernels' build is a param of the jobs that run them (measure.kernel_stamp):
    another build (here the FP8 kernel XSTAGE_MOE_FP8_KERNEL picks) makes Snakemake run the
    MegaMoE jobs again, whose sweeps then re-measure only the stale points; attention and
    the microbenchmarks stay done."""
    work, _, _ = cpu_run
    env = {**os.environ, "XSTAGE_MOE_FP8_KERNEL": "tl"}
    args = ("-n", "measured_raw", "--configfile", "config/ci-measure.yaml")
    out = snakemake(work, *args, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    changed = re.search(r"params have changed since last execution:\s*\n\s*(.+)", text)
    assert changed, text[-4000:]
    assert set(changed.group(1).split(", ")) == {"megamoe_measure", "megamoe_measure_per_gpu"}
    assert "attention_measure" not in text and "microbench_" not in text, text[-4000:]
