"""A measuring rule's job: its GPUs, its log, and the per-GPU lock around the work."""

import sys
from types import SimpleNamespace

from xstage_bench.gpulock import GpuLock
from xstage_bench.joblog import gpu_job


def fake_snakemake(tmp_path, config, gpus):
    return SimpleNamespace(
        config=config, resources=SimpleNamespace(gpu=gpus), log=[str(tmp_path / "logs" / "job.log")]
    )


def test_gpu_job_locks_its_gpus_and_tees_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("XSTAGE_LOCK_DIR", str(tmp_path / "locks"))
    with gpu_job(fake_snakemake(tmp_path, {}, 2)) as gpu_ids:
        assert gpu_ids == [0, 1]
        print("progress line", file=sys.stderr)
        held = sorted(p.name for p in (tmp_path / "locks").iterdir())
        assert held == ["gpu0.lock", "gpu1.lock"]
    assert "progress line" in (tmp_path / "logs" / "job.log").read_text()
    with GpuLock([0, 1], lock_dir=tmp_path / "locks", wait_s=0):
        pass  # released on exit: another run can take them at once


def test_config_gpu_ids_take_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("XSTAGE_LOCK_DIR", str(tmp_path / "locks"))
    with gpu_job(fake_snakemake(tmp_path, {"gpu_ids": [2, 3]}, 2)) as gpu_ids:
        assert gpu_ids == [2, 3]
