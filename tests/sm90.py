"""Compile a Gluon kernel for sm_90 in a child process and count patterns in its PTX, or
read what ptxas says about it.

In a child because a Gluon kernel must not be defined while TRITON_INTERPRET is set, which
the interpreter tests of a session set and unset. No GPU needed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

SHARED_BYTES = 227 * 1024  # an H100/H200 CTA's shared memory

_CHILD = """
import json, re, sys
module, call, patterns = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
k = eval(call, {"kernels": __import__("xstage_kernels." + module, fromlist=["_"])})
ptx = k.asm["ptx"]
counts = {name: len(re.findall(p, ptx)) for name, p in patterns.items()}
counts["shared"] = k.metadata.shared
counts["setmaxnreg"] = sorted({int(n) for n in re.findall(r"setmaxnreg\\S+\\s+(\\d+)", ptx)})
print(json.dumps(counts))
"""


def compiled(module: str, call: str, patterns: dict[str, str]) -> dict:
    """Counts of each regex in the PTX of `kernels.<call>` (a compile_for_sm90 call of
    xstage_kernels.<module>), with the kernel's shared bytes and setmaxnreg values."""
    out = _in_child(_CHILD, module, call, json.dumps(patterns))
    return json.loads(out.strip().splitlines()[-1])


_PTX_CHILD = """
import sys
module, call = sys.argv[1], sys.argv[2]
k = eval(call, {"kernels": __import__("xstage_kernels." + module, fromlist=["_"])})
print(k.asm["ptx"])
"""


def compiled_ptx(module: str, call: str) -> str:
    """The PTX of `kernels.<call>` (a compile_for_sm90 call of xstage_kernels.<module>)."""
    return _in_child(_PTX_CHILD, module, call)


def _in_child(source: str, *args: str) -> str:
    """The stdout of `python -c source *args`, outside the interpreter mode."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", source, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


_PTXAS_CHILD = """
import subprocess, sys, tempfile
from pathlib import Path
from triton.backends.nvidia.compiler import get_ptxas
module, call = sys.argv[1], sys.argv[2]
k = eval(call, {"kernels": __import__("xstage_kernels." + module, fromlist=["_"])})
with tempfile.TemporaryDirectory() as d:
    ptx = Path(d, "kernel.ptx")
    ptx.write_text(k.asm["ptx"])
    cmd = [get_ptxas(90).path, "-arch=sm_90a", "-v", str(ptx), "-o", str(Path(d, "k.cubin"))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
print(out.stdout + out.stderr)
"""

# ptxas's notes that it made every wgmma of a function wait for the one before: C7514-C7516
# ("wgmma.mma_async instructions are serialized due to ..."), or a warpgroup wait it added.
_SERIALIZED = re.compile(
    r"wgmma\.mma_async instructions are serialized|warpgroup\.wait is injected"
)


def ptxas_report(module: str, call: str) -> str:
    """What `ptxas -v` (Triton's own, for sm_90a) says about the PTX of `kernels.<call>`."""
    return _in_child(_PTXAS_CHILD, module, call)


def serialized(report: str) -> list[str]:
    """The lines of a ptxas report saying it serialized a function's wgmma instructions."""
    return [line for line in report.splitlines() if _SERIALIZED.search(line)]
