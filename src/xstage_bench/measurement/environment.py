"""The environment block every raw result carries: where and with what it was made.

`capture()` is called at the start of a job and `finish()` at its end. On a GPU machine it
adds the GPUs, driver, CUDA, peer access and `nvidia-smi topo -m`; on a CPU-only machine
(simulated runs) those keys are simply absent, and `simulated` says so.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

TRACKED_PACKAGES = (
    "xstage-bench",
    "numpy",
    "scipy",
    "pandas",
    "torch",
    "triton",
    "cupy-cuda13x",
    "cupy-cuda12x",
    "nvidia-ml-py",
    "snakemake",
    "flash-attn-4",
    "tokenspeed-fa3",
    "sgl-deep-gemm",
    "nvidia-cutlass-dsl",
)


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_state(repo: Path | None = None) -> dict:
    """The commit the code came from and whether the tree had uncommitted changes.

    A copy of the tree on a remote GPU machine reports what the sender put in
    XSTAGE_GIT_SHA and XSTAGE_GIT_DIRTY: the copy may carry no .git, or a stale one (seen
    on 2026-11-30: the copy's .git named an older commit, and the tree dirty against it).
    """
    repo = repo or Path(__file__).resolve().parent
    sha = None if os.environ.get("XSTAGE_GIT_SHA") else _run(["git", "rev-parse", "HEAD"], cwd=repo)
    if sha is None:
        dirty = os.environ.get("XSTAGE_GIT_DIRTY")
        return {
            "sha": os.environ.get("XSTAGE_GIT_SHA"),
            "dirty": None if dirty is None else dirty == "1",
        }
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return {"sha": sha, "dirty": bool(status) if status is not None else None}


def gpu_inventory() -> dict:
    """GPU facts through torch (names, SMs, L2) and nvidia-smi (driver, topology)."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    gpus = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        gpus.append(
            {
                "index": i,
                "name": p.name,
                "sm_count": p.multi_processor_count,
                "l2_bytes": int(getattr(p, "L2_cache_size", 0)),
                "memory_bytes": int(p.total_memory),
                "capability": f"{p.major}.{p.minor}",
            }
        )
    peer = {
        f"{a}->{b}": bool(torch.cuda.can_device_access_peer(a, b))
        for a in range(len(gpus))
        for b in range(len(gpus))
        if a != b
    }
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    from xstage_bench.measurement.hostmem import host_link

    return {
        "host_links": [host_link(i) for i in range(len(gpus))],
        "gpus": gpus,
        "driver": driver.splitlines()[0] if driver else None,
        "cuda": torch.version.cuda,
        "topology": _run(["nvidia-smi", "topo", "-m"]),
        "peer_access": peer,
    }


def capture(*, simulated: bool, hardware_profile: dict | None = None) -> dict:
    env = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "git": git_state(),
        "started_at": now_iso(),
        "finished_at": now_iso(),
        "simulated": simulated,
    }
    if simulated:
        env["hardware_profile"] = hardware_profile or {}
    else:
        env.update(gpu_inventory())
    return env


CPU_NOTE = "CPU run on the Triton interpreter: a test of the harness, not a measurement"


def capture_measured(device_type: str = "cuda") -> dict:
    """The environment block of a measuring run, saying plainly when it was a CPU test
    (measure_device: cpu), never a measurement."""
    env = capture(simulated=False)
    env["device_type"] = device_type
    if device_type != "cuda":
        env["note"] = CPU_NOTE
    return env


def finish(env: dict) -> dict:
    """Stamp the end time; returns the same dict for chaining."""
    env["finished_at"] = now_iso()
    return env
