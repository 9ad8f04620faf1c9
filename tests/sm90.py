"""Compile a Gluon kernel for sm_90 in a child process and count patterns in its PTX.

In a child because a Gluon kernel must not be defined while TRITON_INTERPRET is set, which
the interpreter tests of a session set and unset. No GPU needed.
"""

from __future__ import annotations

import json
import os
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
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, module, call, json.dumps(patterns)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
