"""What this machine can measure: GPUs, peer access, and the dataset name they imply.

Called by the Snakefile at parse time, so it must be cheap and must never fail on a
machine without GPUs: it returns a verdict with the reason instead. The GPUs are those
CUDA shows: nvidia-smi lists every GPU of the machine, CUDA only those that
CUDA_VISIBLE_DEVICES names (a shared 8-GPU node, a scheduler's share of it), numbered
from 0, and the peer-access check, the count and the dataset name are of those.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from xstage_bench.data.storepath import HOST, PEER
from xstage_bench.measurement.clocks import visible_entries


@dataclass(frozen=True)
class GpuProbe:
    """The GPUs CUDA shows, the pairs without peer access, and why a path is out of reach.
    One GPU measures the host store path; the peer path needs two GPUs with peer access.
    `no_peer`: the ordered pairs (CUDA's numbers) found without it, None where peer access
    was not checked (one GPU, or nothing to check it with)."""

    names: list[str] = field(default_factory=list)
    reason: str = ""
    no_peer: tuple[tuple[int, int], ...] | None = None

    @property
    def peer_access(self) -> bool:
        """Whether every pair of two or more GPUs was found to reach the other."""
        return self.count >= 2 and self.no_peer == ()

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
        return [PEER, HOST] if self.peer_access else [HOST]

    def peer_problem(self, gpu_ids: list[int]) -> str | None:
        """Why a run on `gpu_ids` cannot measure the peer path, or None: only their own
        pairs count (GPUs 0 and 1 of a PCIe node may reach each other where 0 and 7,
        under another CPU socket, do not)."""
        if len(set(gpu_ids)) < 2:
            return "one GPU: the peer path needs a second GPU"
        if self.peer_access:
            return None
        if self.no_peer is None:
            return self.reason or "peer access was not checked"
        missing = [f"{a}->{b}" for a, b in self.no_peer if a in gpu_ids and b in gpu_ids]
        return f"no peer access between GPUs {', '.join(missing)}" if missing else None


def _nvidia_smi_gpus() -> tuple[list[tuple[str, str]], str]:
    """(name, UUID) of every GPU of the machine, in nvidia-smi's (PCI) order."""
    if shutil.which("nvidia-smi") is None:
        return [], "nvidia-smi not found (no NVIDIA driver on this machine)"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,uuid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return [], f"nvidia-smi failed: {e}"
    gpus = []
    for line in filter(str.strip, out.splitlines()):
        name, _, uuid = line.rpartition(",")
        gpus.append((name.strip(), uuid.strip()))
    return gpus, "" if gpus else "nvidia-smi lists no GPU"


def cuda_visible(gpus: list[tuple[str, str]], visible: str | None) -> list[str]:
    """The names of the GPUs CUDA shows, in CUDA's order: every GPU where
    CUDA_VISIBLE_DEVICES (`visible`) is unset, else those its entries name (an index or a
    UUID prefix), up to the first entry that names none (CUDA ignores the rest)."""
    entries = visible_entries(visible)
    if entries is None:
        return [name for name, _ in gpus]
    shown = []
    for entry in entries:
        if entry.isdigit():
            found = [gpus[int(entry)]] if int(entry) < len(gpus) else []
        else:
            found = [g for g in gpus if g[1] and g[1].startswith(entry)]
        if len(found) != 1:
            break
        shown.append(found[0][0])
    return shown


def _no_peer_access(count: int) -> tuple[tuple[tuple[int, int], ...] | None, str]:
    """The ordered pairs that cannot reach each other (checked through CuPy, else torch),
    or None with the reason where neither is installed."""
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
            return None, "neither cupy nor torch is installed, so peer access cannot be checked"
    missing = tuple((a, b) for a in range(count) for b in range(count) if a != b and not can(a, b))
    if missing:
        pairs = ", ".join(f"{a}->{b}" for a, b in missing)
        return missing, f"no peer access between GPUs {pairs}"
    return missing, ""


def probe_gpus() -> GpuProbe:
    gpus, reason = _nvidia_smi_gpus()
    if not gpus:
        return GpuProbe([], reason)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = cuda_visible(gpus, visible)
    if not names:
        return GpuProbe([], f"CUDA_VISIBLE_DEVICES={visible!r} names none of this machine's GPUs")
    if len(names) < 2:
        return GpuProbe(names, "one GPU: the peer path needs a second GPU")
    missing, reason = _no_peer_access(len(names))
    return GpuProbe(names, reason, missing)


def asked_gpus_problem(
    probe: GpuProbe, world_size: int, gpu_ids: list[int], visible: str | None
) -> str | None:
    """Why a run cannot measure on the GPUs its config asks for, or None: CUDA shows the
    probe's GPUs, and never more than CUDA_VISIBLE_DEVICES (`visible`) lists, numbered
    from 0. Checked when the run is planned, before any job."""
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
