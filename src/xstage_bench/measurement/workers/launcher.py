"""The parent process of a world: start its ranks with a safe environment, wait for them,
end them all when one fails, and, when an attempt ends early, record the point it died in
and resume the sweep in fresh processes until it is complete.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from xstage_bench.data import results
from xstage_bench.measurement import log, sweep
from xstage_bench.measurement.workers.drive import RESTART_EXIT_CODE, running_marker

# Never let NCCL, PyTorch or NVSHMEM use NVLink multicast (DEVICE.md): it can take the
# host's GPUs down for everyone. Exported before any worker starts.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

_log = log.get(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record_crash(out: Path, code: int) -> bool:
    """The workers died inside a point: record that point as failed in the partial file.

    False when no point was running (they died starting up or ending): a rerun would only
    die the same way.
    """
    marker, partial = running_marker(out), sweep.partial_path(out)
    if not marker.exists() or not partial.exists():
        return False
    point = json.loads(marker.read_text())
    marker.unlink()
    doc = results.read_raw(partial)
    if not any(r["id"] == point["id"] for r in doc["records"]):
        doc["records"].append(
            results.failed_record(
                point["id"], point, f"a worker process died (exit code {code}) during this point"
            )
        )
        results.write_raw(partial, doc)
    return True


def run_attempt(worker: Callable, job: dict) -> list[int | None]:
    """Spawn the workers and wait; when one fails, end the others. Exit codes by rank."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(
        worker, args=(job,), nprocs=job["world_size"], join=False, start_method="spawn"
    )
    procs = ctx.processes
    try:
        while True:
            codes = [p.exitcode for p in procs]
            if all(c is not None for c in codes):
                return codes
            if any(c not in (None, 0) for c in codes):
                time.sleep(2.0)  # let the others notice and exit on their own
                return [p.exitcode for p in procs]
            time.sleep(0.2)
    finally:  # also on SIGTERM or Ctrl-C of this process: never leave a worker on a GPU
        for p in procs:
            if p.exitcode is None:
                p.terminate()
                p.join(10)
                if p.exitcode is None:
                    p.kill()
                    p.join()


def launch(
    worker: Callable,
    job: dict,
    out: str | Path,
    *,
    tag: str,
    device_type: str = "cuda",
    wait_timeout_s: float = 60.0,
    max_restarts: int = 5,
) -> None:
    """Run `worker` on `job["world_size"]` ranks until the sweep into `out` is complete.

    Every attempt gets a fresh port and run id; `job` gains out, device_type, the bounded
    waits' timeouts and those. `device_type="cpu"` runs on gloo and the Triton interpreter
    (tests only).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.environ.update(SAFE_ENV)
    if threading.current_thread() is threading.main_thread():
        # A SIGTERM (a job killed by its scheduler) unwinds like Ctrl-C, ending the workers.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if device_type == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    for attempt in range(max_restarts + 1):
        attempt_job = {
            **job,
            "out": str(out),
            "device_type": device_type,
            "port": free_port(),
            "run_id": f"{uuid.uuid4().hex[:8]}a{attempt}",
            "wait_timeout_s": wait_timeout_s,
            "collective_timeout_s": max(2 * wait_timeout_s, 120.0),
        }
        codes = run_attempt(worker, attempt_job)
        if all(c == 0 for c in codes):
            return
        _log.info("[%s] attempt %d: worker exit codes %s", tag, attempt + 1, codes)
        if codes[0] in (sweep.WATCHDOG_EXIT_CODE, RESTART_EXIT_CODE):
            continue  # the point is recorded; resume after it in fresh processes
        if not record_crash(out, next(c for c in codes if c)):
            raise RuntimeError(
                f"{tag} workers failed outside any point (exit codes {codes}); see the log above"
            )
    raise RuntimeError(
        f"{tag} sweep did not finish after {max_restarts + 1} attempts; "
        f"rerun to resume from {sweep.partial_path(out)}"
    )
