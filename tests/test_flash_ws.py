"""The warp-specialized attention kernel (kernels/xstage_kernels/flash_ws.py) without a GPU.

Gluon has no interpreter, so its numbers are checked on a GPU only (every attention point
is compared with torch's SDPA, poisoned output, before it is timed). Here: it compiles for
sm_90 with the structure its docstring promises (partitions with their own register
budgets, bf16 wgmma for both products, TMA loads, per-slot mbarriers, 16-byte epilogue
stores, no CTA-wide barrier once the partitions run); which kernel a call picks; and the
refresh rule that re-measures only the backend whose kernel changed.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
import sm90

HAVE_TRITON = all(importlib.util.find_spec(m) for m in ("torch", "triton"))
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="torch and triton not installed")
PATTERNS = {
    "wgmma": r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16",
    "tma_loads": r"cp\.async\.bulk\.tensor",
    "expect_tx": r"mbarrier\.arrive\.expect_tx",
    "vector_stores": r"st\.global\.v4",
    "cta_barriers": r"bar\.sync\s+\d+;",
    "wait_one": r"wgmma\.wait_group\.sync\.aligned 1;",
}


@needs_triton
@pytest.mark.parametrize("head_dim", [64, 128])
def test_compiles_for_sm90_with_warp_specialized_partitions(head_dim):
    from xstage_kernels import flash_ws

    got = sm90.compiled("flash_ws", f"kernels.compile_for_sm90({head_dim})", PATTERNS)
    assert got["shared"] <= sm90.SHARED_BYTES
    # the Q tile and STAGES slots of a K and a V block, bf16, and little else (the epilogue
    # goes through the Q tile)
    kv_and_q = 2 * head_dim * (flash_ws.BLOCK_M + 2 * flash_ws.STAGES * flash_ws.BLOCK_N)
    assert kv_and_q <= got["shared"] <= kv_and_q + 1024
    assert {flash_ws.MATH_REGS, flash_ws.PRODUCER_REGS} <= set(got["setmaxnreg"])
    # per math warpgroup and K/V block: Q K^T over head_dim, P V over BLOCK_N, k16 each;
    # the overlapped loop has its first Q K^T and last P V outside the loop as well
    per_block = 2 * (head_dim + flash_ws.BLOCK_N) // 16
    assert got["wgmma"] == per_block * (2 if flash_ws.OVERLAP else 1)
    assert got["wait_one"] == (2 if flash_ws.OVERLAP else 0)
    # Q once, K and V per slot; a 128-byte swizzled box is at most 128 bytes wide
    boxes = -(-2 * head_dim // 128)
    assert got["expect_tx"] == 3 and got["tma_loads"] == 3 * boxes
    assert got["vector_stores"] > 0
    assert got["cta_barriers"] == 0  # only warpgroup barriers (bar.sync id, 128)


@needs_triton
@pytest.mark.parametrize("stages", [2, 3])
def test_each_launch_option_compiles_within_shared_memory(stages):
    from xstage_kernels import flash_ws

    call = f"kernels.compile_for_sm90(128, stages={stages}, overlap=1)"
    got = sm90.compiled("flash_ws", call, PATTERNS)
    assert got["shared"] <= sm90.SHARED_BYTES
    # overlapped: each math warpgroup waits with one MMA (block j-1's P V) still in flight
    assert got["wait_one"] == 2
    assert got["wgmma"] == 2 * 2 * (128 + flash_ws.BLOCK_N) // 16
    assert got["cta_barriers"] == 0


@needs_triton
def test_a_call_picks_the_gluon_kernel_only_where_it_applies(monkeypatch):
    import torch

    from xstage_kernels import flash_ulysses

    monkeypatch.delenv(flash_ulysses.KERNEL_ENV, raising=False)
    q = torch.empty(1, 256, 2, 128, dtype=torch.bfloat16)
    # A CPU tensor runs tl (the interpreter); so does an explicit block config.
    assert flash_ulysses.launch_config(q, q, q)["kernel"] == "tl"
    assert flash_ulysses.launch_config(q, q, q, {"BLOCK_M": 16})["kernel"] == "tl"
    monkeypatch.setenv(flash_ulysses.KERNEL_ENV, "cutlass")
    with pytest.raises(ValueError, match="XSTAGE_ATTENTION_KERNEL='cutlass'"):
        flash_ulysses.attention_kernel()


def test_a_kernel_change_of_one_backend_makes_its_pairing_groups_stale():
    """The backends of a shape are timed in the same rounds: when triton's kernel changes,
    FA3's points are timed again beside it, or triton over FA3 would compare two runs."""
    from xstage_bench.attention.raw_config import TL_KERNEL, kernel_refresh

    older = {"attention": {"backends": ["fa3", "triton"]}, "timing": {}, "world_size": "auto"}
    ws = {"kernel": "ws", "source": "kernels/xstage_kernels/flash_ws.py"}
    config = {**older, "kernels": {"triton": ws}}
    for previous in (older, {**older, "kernels": {"triton": TL_KERNEL}}):
        refresh = kernel_refresh(previous, config)
        assert refresh is not None and refresh.reason.endswith(
            "triton (the kernel that ran it changed)"
        )
        assert refresh.stale({"backend": "triton", "mode": "fused"})
        assert refresh.stale({"backend": "fa3", "mode": "alone"})
    assert kernel_refresh(config, config) is None
    assert kernel_refresh(older, {**config, "world_size": 4}) is None


@needs_triton
def test_the_ab_script_takes_launch_options_and_the_sweeps_shapes(monkeypatch):
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "kernels" / "ab"))
    monkeypatch.delitem(sys.modules, "flash_ab", raising=False)
    import flash_ab

    assert flash_ab.parse_option("OVERLAP=0,1") == ("OVERLAP", [0, 1])
    for bad in ("BLOCK_M=64,128", "OVERLAP=1", "OVERLAP=1,1"):
        with pytest.raises(ValueError, match="--option"):
            flash_ab.parse_option(bad)
    assert flash_ab.fixed_option("STAGES=3") == ("STAGES", 3)
    with pytest.raises(ValueError, match="--set 'STAGES=x'"):
        flash_ab.fixed_option("STAGES=x")
    attention = {"host_world_sizes": [2, 8], "heads": [24, 40], "seq_lens": [8192]}
    # one GPU plays rank 0: H/P heads over all S tokens
    assert flash_ab.shapes(attention, None, None) == [(12, 8192), (20, 8192), (3, 8192), (5, 8192)]
    assert flash_ab.shapes(attention, [4096], [24]) == [(12, 4096), (3, 4096)]


@needs_triton
def test_the_launched_build_keeps_its_mmas_asynchronous():
    """OVERLAP reads one MMA's scores while the next runs: ptxas must not serialize the
    kernel's MMAs for it (sm90.serialized)."""
    report = sm90.ptxas_report("flash_ws", "kernels.compile_for_sm90(128)")
    assert "_flash_fwd_ws" in report and re.search(r"Used \d+ registers", report), report
    assert sm90.serialized(report) == []
