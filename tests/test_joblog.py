"""A measuring rule's job: its GPUs, its log, and the per-GPU lock around the work."""

import sys
from types import SimpleNamespace

from xstage_bench.gpulock import GpuLock
from xstage_bench.joblog import gpu_job


def fake_snakemake(tmp_path, gpu_ids):
    return SimpleNamespace(
        params=SimpleNamespace(gpu_ids=gpu_ids), log=[str(tmp_path / "logs" / "job.log")]
    )


def test_gpu_job_locks_its_gpus_and_tees_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("XSTAGE_LOCK_DIR", str(tmp_path / "locks"))
    with gpu_job(fake_snakemake(tmp_path, [0, 1])) as gpu_ids:
        assert gpu_ids == [0, 1]
        print("progress line", file=sys.stderr)
        held = sorted(p.name for p in (tmp_path / "locks").iterdir())
        assert held == ["gpu0.lock", "gpu1.lock"]
    assert "progress line" in (tmp_path / "logs" / "job.log").read_text()
    with GpuLock([0, 1], lock_dir=tmp_path / "locks", wait_s=0):
        pass  # released on exit: another run can take them at once


def test_a_job_on_other_gpus_is_not_blocked(tmp_path, monkeypatch):
    monkeypatch.setenv("XSTAGE_LOCK_DIR", str(tmp_path / "locks"))
    with (
        gpu_job(fake_snakemake(tmp_path, [0, 1])),
        gpu_job(fake_snakemake(tmp_path, [2, 3])) as ids,
    ):
        assert ids == [2, 3]
