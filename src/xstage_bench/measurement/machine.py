"""What this machine can measure: GPUs, peer access, and the dataset name they imply.

Called by the Snakefile at parse time, so it must be cheap and must never fail on a
machine without GPUs: it returns a verdict with the reason instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

from xstage_bench.data.storepath import HOST, PEER
from xstage_bench.measurement.clocks import visible_entries


@dataclass(frozen=True)
class GpuProbe:
    """The GPUs nvidia-smi lists, whether every pair has peer access, and why a path is
    out of reach. One GPU measures the host store path; the peer path needs two GPUs
    with peer access."""

    names: list[str] = field(default_factory=list)
    peer_access: bool = False
    reason: str = ""

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def can_measure(self) -> bool:
        return self.count >= 1

    @property
    def paths(self) -> list[str]:
        """The store paths this machine can measure (storepath.PATHS)."""
        if not self.can_measure:
            return []
        return [PEER, HOST] if self.count >= 2 and self.peer_access else [HOST]


def _nvidia_smi_names() -> tuple[list[str], str]:
    if shutil.which("nvidia-smi") is None:
        return [], "nvidia-smi not found (no NVIDIA driver on this machine)"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return [], f"nvidia-smi failed: {e}"
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names, "" if names else "nvidia-smi lists no GPU"


def _peer_access(count: int) -> tuple[bool, str]:
    """Every ordered pair must reach the other; checked through CuPy, else torch."""
    try:
        import cupy

        def can(a: int, b: int) -> bool:
            return bool(cupy.cuda.runtime.deviceCanAccessPeer(a, b))
    except ImportError:
        try:
            import torch

            def can(a: int, b: int) -> bool:
                return bool(torch.cuda.can_device_access_peer(a, b))
        except ImportError:
            return False, "neither cupy nor torch is installed, so peer access cannot be checked"
    missing = [f"{a}->{b}" for a in range(count) for b in range(count) if a != b and not can(a, b)]
    if missing:
        return False, f"no peer access between GPUs {', '.join(missing)}"
    return True, ""


def probe_gpus() -> GpuProbe:
    names, reason = _nvidia_smi_names()
    if not names:
        return GpuProbe(names, False, reason)
    if len(names) < 2:
        return GpuProbe(names, False, "one GPU: the peer path needs a second GPU")
    peer, reason = _peer_access(len(names))
    return GpuProbe(names, peer, reason)


def asked_gpus_problem(
    probe: GpuProbe, world_size: int, gpu_ids: list[int], visible: str | None
) -> str | None:
    """Why a run cannot measure on the GPUs its config asks for, or None: CUDA shows this
    machine's GPUs (nvidia-smi's count) or, where CUDA_VISIBLE_DEVICES is set (`visible`),
    as many as it lists, numbered from 0. Checked when the run is planned, before any job."""
    shown = probe.count
    where = f"this machine shows {shown} GPU(s)"
    entries = visible_entries(visible)
    if entries is not None:
        shown = min(shown, len(entries))
        where = f"CUDA shows {shown} GPU(s) here (CUDA_VISIBLE_DEVICES={visible!r})"
    if gpu_ids and max(gpu_ids) >= shown:
        return f"config key 'gpu_ids': GPU {max(gpu_ids)} does not exist: {where}"
    if world_size > shown:
        return f"config key 'world_size': {world_size} GPUs asked for, but {where}"
    return None


def dataset_name(gpu_names: list[str]) -> str:
    """e.g. ['NVIDIA H200', 'NVIDIA H200'] -> 'h200x2'; mixed models are named 'mixed'."""
    models = {
        re.sub(r"[^a-z0-9]+", "-", n.lower().replace("nvidia", "")).strip("-") for n in gpu_names
    }
    model = models.pop() if len(models) == 1 else "mixed"
    return f"{model}x{len(gpu_names)}"
