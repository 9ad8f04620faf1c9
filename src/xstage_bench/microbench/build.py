"""Compile the microbenchmark kernels (kernels/microbench/*.cu) into cubins with nvcc."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

NVCC_FLAGS = ("-cubin", "-O3", "-lineinfo")


class BuildError(RuntimeError):
    """nvcc is missing or refused the source; the message says which and why."""


def build_cubin(src: Path, out: Path, arch: str = "sm_90") -> Path:
    """nvcc -arch=<arch> -cubin -O3 -lineinfo -o <out> <src>; returns `out`."""
    src, out = Path(src), Path(out)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BuildError(f"cannot build {src}: nvcc is not on PATH (install the CUDA toolkit)")
    if not src.is_file():
        raise BuildError(f"cannot build {src}: no such file")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc, f"-arch={arch}", *NVCC_FLAGS, "-o", str(out), str(src)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"nvcc failed on {src} (exit {result.returncode}):\n{result.stderr}")
    return out
