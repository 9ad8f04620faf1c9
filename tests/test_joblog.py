"""A measuring rule's job: its GPUs, its log, and the per-GPU lock around the work."""

import sys

from xstage_bench.measurement.gpulock import GpuLock
from xstage_bench.run.joblog import measuring_job


def test_a_measuring_job_locks_its_gpus_and_tees_the_log(tmp_path, monkeypatch):
    monkeypatch.setenv("XSTAGE_LOCK_DIR", str(tmp_path / "locks"))
    with measuring_job(tmp_path / "logs" / "job.log", [0, 1]):
        print("progress line", file=sys.stderr)
        held = sorted(p.name for p in (tmp_path / "locks").iterdir())
        assert held == ["gpu0.lock", "gpu1.lock"]
    assert "progress line" in (tmp_path / "logs" / "job.log").read_text()
    with GpuLock([0, 1], lock_dir=tmp_path / "locks", wait_s=0):
        pass  # released on exit: another run can take them at once


def test_a_job_on_other_gpus_is_not_blocked(tmp_path, monkeypatch):
    monkeypatch.setenv("XSTAGE_LOCK_DIR", str(tmp_path / "locks"))
    with (
        measuring_job(tmp_path / "a.log", [0, 1]),
        measuring_job(tmp_path / "b.log", [2, 3]),
    ):
        held = sorted(p.name for p in (tmp_path / "locks").iterdir())
        assert held == ["gpu0.lock", "gpu1.lock", "gpu2.lock", "gpu3.lock"]
