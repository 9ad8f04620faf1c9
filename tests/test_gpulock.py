import json
import subprocess
import sys
import textwrap
import threading

import pytest

from xstage_bench.measurement.gpulock import LOCK_DIR_ENV, GpuBusyError, GpuLock, default_lock_dir

HOLDER_SCRIPT = textwrap.dedent(
    """
    import sys
    from xstage_bench.measurement.gpulock import GpuLock

    with GpuLock([8, 7], lock_dir=sys.argv[1], wait_s=0):
        print("locked", flush=True)
        sys.stdin.readline()  # hold until the test says so
    """
)


@pytest.fixture
def holder(tmp_path):
    """Another process holding fake GPUs 7 and 8; call .release() to let go."""
    script = tmp_path / "hold.py"
    script.write_text(HOLDER_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "locks")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "locked"

    def release():
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=10)

    proc.release = release
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_second_process_waits_then_raises_busy(tmp_path, holder):
    messages = []
    lock = GpuLock(
        [8], lock_dir=tmp_path / "locks", wait_s=0.3, poll_s=0.05, report=messages.append
    )
    with pytest.raises(GpuBusyError, match=rf"GPU 8 is busy: held by pid {holder.pid} \("):
        lock.acquire()
    assert len(messages) == 1  # one report per holder, not one per poll
    assert messages[0].startswith(f"GPU 8 is held by pid {holder.pid} (")
    assert "hold.py" in messages[0] and "since" in messages[0]


def test_busy_error_releases_devices_already_taken(tmp_path, holder):
    locks = tmp_path / "locks"
    with pytest.raises(GpuBusyError):
        GpuLock([3, 8], lock_dir=locks, wait_s=0.1, poll_s=0.05, report=lambda m: None).acquire()
    with GpuLock([3], lock_dir=locks, wait_s=0):  # GPU 3 was given back
        pass


def test_waiter_gets_lock_once_holder_releases(tmp_path, holder):
    messages = []
    threading.Timer(0.3, holder.release).start()
    lock = GpuLock(
        [7, 8], lock_dir=tmp_path / "locks", wait_s=10, poll_s=0.05, report=messages.append
    )
    with lock:
        record = json.loads((tmp_path / "locks" / "gpu7.lock").read_text())
        assert record["pid"] != holder.pid
        assert "command" in record and "since" in record
    assert messages and "GPU 7 is held by" in messages[0]
    assert (tmp_path / "locks" / "gpu7.lock").read_text() == ""  # holder record cleared


def test_lock_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "elsewhere"))
    assert default_lock_dir() == tmp_path / "elsewhere"
    with GpuLock([0, 1]) as lock:
        assert lock.lock_dir == tmp_path / "elsewhere"
        assert sorted(p.name for p in lock.lock_dir.iterdir()) == ["gpu0.lock", "gpu1.lock"]
