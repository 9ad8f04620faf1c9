"""The warp-specialized W8A8 kernel (kernels/xstage_kernels/megamoe_ws.py) without a GPU.

Gluon has no interpreter, so its numbers are checked on a GPU only (every point's check,
before timing). Here: it compiles for sm_90 in both builds, and the compiled code has the
structure the kernel's docstring promises (partitions with their own register budgets,
asynchronous FP8 wgmma, per-slot mbarriers, 16-byte epilogue stores, the proxy fence and
the release that publish the intermediate); and which kernel a launch picks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

HAVE_TRITON = all(importlib.util.find_spec(m) for m in ("torch", "triton"))
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="torch and triton not installed")
SM90_SHARED_BYTES = 227 * 1024

# Compiled in a child: a Gluon kernel must not be defined while TRITON_INTERPRET is set,
# which the interpreter tests of this session set and unset.
_COMPILE = """
import json, re, sys
from xstage_kernels import megamoe_ws
k = megamoe_ws.compile_for_sm90(trace=sys.argv[1] == "1")
ptx = k.asm["ptx"]
count = lambda pattern: len(re.findall(pattern, ptx))
print(json.dumps({
    "shared": k.metadata.shared,
    "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\\S+\\s+(\\d+)", ptx))),
    "wgmma": count(r"wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k32\\.f32\\.e4m3\\.e4m3"),
    "wgmma_wait": count(r"wgmma\\.wait_group"),
    "mbarrier_arrive": count(r"mbarrier\\.arrive"),
    "expect_tx": count(r"mbarrier\\.arrive\\.expect_tx"),
    "tma_loads": count(r"cp\\.async\\.bulk\\.tensor"),
    "vector_stores": count(r"st\\.global(\\.v4\\.b32|\\.v4\\.u32)"),
    "proxy_fence": count(r"fence\\.proxy\\.async\\.global"),
    "release_add": count(r"atom\\.global\\.gpu\\.release\\.add"),
    "atomic_max": count(r"atom\\.global\\.gpu\\.\\w+\\.max\\.s64"),
    "cta_barriers": count(r"(?<![\\w.])bar\\.sync\\s+0;|barrier\\.sync\\s+0;"),
}))
"""


def _compiled(trace: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", _COMPILE, "1" if trace else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@needs_triton
@pytest.mark.parametrize("trace", [False, True])
def test_compiles_for_sm90_with_warp_specialized_partitions(trace):
    from xstage_kernels import megamoe_ws

    got = _compiled(trace)
    assert got["shared"] <= SM90_SHARED_BYTES
    # The operand ring alone: STAGES slots of two 128 x 128 FP8 blocks.
    assert got["shared"] >= megamoe_ws.STAGES * 2 * megamoe_ws.BLOCK**2
    regs = {int(n) for n in got["setmaxnreg"]}
    assert {megamoe_ws.MATH_REGS, megamoe_ws.PRODUCER_REGS} <= regs
    # Four K sub-steps of 32 per 128-channel step, in each math warpgroup's loop.
    assert got["wgmma"] > 0 and got["wgmma"] % 4 == 0
    assert got["wgmma_wait"] > 0
    assert got["expect_tx"] > 0 and got["tma_loads"] >= 2 * got["expect_tx"]
    assert got["mbarrier_arrive"] > got["expect_tx"]  # empty slots and the tile ring
    assert got["vector_stores"] > 0
    assert got["proxy_fence"] > 0 and got["release_add"] > 0
    assert got["cta_barriers"] == 0  # partitions meet at mbarriers, never at a CTA barrier
    assert (got["atomic_max"] > 0) == trace


@needs_triton
def test_the_w8a8_kernel_is_chosen_by_environment_and_named_in_the_raw_config(monkeypatch):
    from xstage_bench.megamoe.runner import w8a8_kernel_record
    from xstage_kernels import megamoe

    monkeypatch.delenv(megamoe.W8A8_KERNEL_ENV, raising=False)
    assert megamoe.w8a8_kernel() == "ws"
    assert w8a8_kernel_record(megamoe, "cuda")["kernel"] == "ws"
    assert w8a8_kernel_record(megamoe, "cpu")["kernel"] == "tl"  # the interpreter runs tl
    monkeypatch.setenv(megamoe.W8A8_KERNEL_ENV, "tl")
    assert w8a8_kernel_record(megamoe, "cuda") == {
        "kernel": "tl",
        "source": "kernels/xstage_kernels/megamoe.py",
    }
    monkeypatch.setenv(megamoe.W8A8_KERNEL_ENV, "cutlass")
    with pytest.raises(ValueError, match="XSTAGE_MOE_W8A8_KERNEL='cutlass'"):
        megamoe.w8a8_kernel()
