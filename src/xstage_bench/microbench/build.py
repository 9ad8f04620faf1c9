"""Compile the microbenchmark kernels (kernels/microbench/*.cu) with nvcc.

`nvcc_command` is the one definition of the build: the DAG's build rule
(workflow/rules/build.smk) runs it, and `build_cubin` (the tests) runs it too.

The image (still named `<kernel>.cubin`, which the rules and the raw files' config name)
is a fatbin: Hopper machine code (sm_90) and its PTX (compute_90, what `-arch=sm_90`
embeds beside it). A GPU of a later architecture (B200: sm_100) cannot run sm_90 machine
code; the driver compiles the PTX for it when the module is loaded (cuModuleLoad, through
CuPy's RawModule, reads cubin, PTX and fatbin alike).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ARCH = "sm_90"
# -Xptxas -v: ptxas reports registers, spills and shared memory per kernel (into the log).
NVCC_FLAGS = ("-fatbin", "-O3", "-lineinfo", "-Xptxas", "-v")


class BuildError(RuntimeError):
    """nvcc is missing or refused the source; the message says which and why."""


def nvcc_command(src: str | Path, out: str | Path, arch: str = ARCH, nvcc: str = "nvcc") -> list:
    """nvcc -arch=<arch> -fatbin -O3 -lineinfo -Xptxas -v -o <out> <src>, as argv."""
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
