"""Compile the microbenchmark kernels (kernels/microbench/*.cu) into cubins with nvcc.

`nvcc_command` is the one definition of the build: the DAG's build rule
(workflow/rules/build.smk) runs it, and `build_cubin` (the tests) runs it too.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ARCH = "sm_90"
# -Xptxas -v: ptxas reports registers, spills and shared memory per kernel (into the log).
NVCC_FLAGS = ("-cubin", "-O3", "-lineinfo", "-Xptxas", "-v")


class BuildError(RuntimeError):
    """nvcc is missing or refused the source; the message says which and why."""


def nvcc_command(src: str | Path, out: str | Path, arch: str = ARCH, nvcc: str = "nvcc") -> list:
    """nvcc -arch=<arch> -cubin -O3 -lineinfo -Xptxas -v -o <out> <src>, as argv."""
    return [nvcc, f"-arch={arch}", *NVCC_FLAGS, "-o", str(out), str(src)]


def build_cubin(src: Path, out: Path, arch: str = ARCH) -> Path:
    """Run `nvcc_command` (the build rule's command); returns `out`."""
    src, out = Path(src), Path(out)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise BuildError(f"cannot build {src}: nvcc is not on PATH (install the CUDA toolkit)")
    if not src.is_file():
        raise BuildError(f"cannot build {src}: no such file")
    out.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(nvcc_command(src, out, arch, nvcc), capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"nvcc failed on {src} (exit {result.returncode}):\n{result.stderr}")
    return out
