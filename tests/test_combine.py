"""The top-k weighted reduction of a home rank's combine buffer (xstage_kernels.combine)
under the Triton interpreter, against torch.bmm (reduction.combine_reference) and an exact
sum, and wired into the layer: the check reads the reduction that ran, so a wrong one
fails the point.

Needs torch and triton (skipped otherwise, as in CI's numpy-only job). triton.jit reads
TRITON_INTERPRET when it decorates, so the fixture sets it before triton is first imported
in this process and reloads the kernel modules (as tests/test_megamoe_cpu.py does).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

HAVE_TORCH_TRITON = all(importlib.util.find_spec(m) for m in ("torch", "triton"))
KERNEL_MODULES = ("xstage_kernels.combine", "xstage_kernels.megamoe")


@pytest.fixture
def interpreted(monkeypatch):
    """xstage_kernels.combine (and the fused kernel, for the layer tests) decorated under
    TRITON_INTERPRET=1, restored afterwards."""
    if not HAVE_TORCH_TRITON:
        pytest.skip("torch and triton not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.zeros, InterpretedFunction):
        pytest.skip("triton was imported before TRITON_INTERPRET was set in this process")
    modules = {}
    for name in KERNEL_MODULES:
        fresh = name not in sys.modules
        modules[name] = importlib.import_module(name)
        if not fresh:
            importlib.reload(modules[name])
    yield modules["xstage_kernels.combine"]
    monkeypatch.delenv("TRITON_INTERPRET")
    for module in modules.values():
        importlib.reload(module)


def _inputs(T: int, topk: int, H: int, seed: int):
    """Fresh random weights (T, 1, topk) bf16, as rank_buffers stores them, a combine
    buffer (T * topk, H) bf16 with magnitudes over four decades, and a NaN-poisoned output
    at the head of a longer NaN buffer (its tail catches stores past the end)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(T, topk, generator=gen).softmax(-1) * 2 - 0.5
    weights = weights.to(torch.bfloat16).reshape(T, 1, topk)
    scale = 10.0 ** torch.randint(-2, 2, (T * topk, 1), generator=gen)
    comb = (torch.randn(T * topk, H, generator=gen) * scale).to(torch.bfloat16)
    buf = torch.full((T * H + 257,), float("nan"), dtype=torch.bfloat16)
    return weights, comb, buf[: T * H].view(T, H), buf


def _exact(weights, comb):
    """The sum in float64, and the sum of the terms' magnitudes (the fp32 rounding bound)."""
    T, _, topk = weights.shape
    w = weights.double().view(T, topk, 1)
    c = comb.double().view(T, topk, -1)
    return (w * c).sum(1), (w * c).abs().sum(1)


# H=200 and H=1000: no block width divides them (masked last block; 200 is not even a
# multiple of 16, so no vector loads); H=1408 the DiT-MoE shape's (blocks of 128 channels,
# 32 tokens); T=1 and T=37 leave token blocks part empty.
SHAPES = [
    (1, 1, 128),
    (37, 1, 256),
    (37, 2, 1408),
    (20, 6, 4096),
    (19, 8, 384),
    (5, 10, 200),
    (9, 3, 1000),
]


@pytest.mark.parametrize("T,topk,H", SHAPES)
def test_the_kernel_matches_torch_bmm_and_the_exact_sum(interpreted, T, topk, H):
    import torch

    from xstage_bench.megamoe.layer.reduction import combine_reference

    weights, comb, out, buf = _inputs(T, topk, H, seed=T * 1000 + topk * 10 + H)
    interpreted.combine(weights, comb, out)
    assert not torch.isnan(out).any(), "the kernel left poisoned outputs"
    assert torch.isnan(buf[T * H :]).all(), "the kernel stored past its output"
    assert out.dtype == torch.bfloat16
    exact, magnitude = _exact(weights, comb)
    # one bf16 rounding of a fp32 sum, plus fp32's error. The interpreter truncates fp32 to
    # bf16 (a GPU rounds to nearest even, half this): under one ulp, 2^-7 relative.
    bound = exact.abs() * 2.0**-7 + magnitude * 2.0**-20 + 1e-30
    assert ((out.double() - exact).abs() <= bound).all()
    ref = torch.full((T, H), float("nan"), dtype=torch.bfloat16)
    combine_reference(weights, comb, ref)
    # torch.bmm rounds its own fp32 sum: at most one bf16 ulp apart
    torch.testing.assert_close(out.float(), ref.float(), rtol=2.0**-7, atol=magnitude.max() * 1e-6)


def test_blocks_take_the_widest_width_dividing_h(interpreted):
    blocks = interpreted.blocks
    # 1024-wide blocks take 2 tokens (timed faster on one H200); narrower ones fill TILE
    assert blocks(4096) == (2, 1024) and blocks(7168) == (2, 1024) and blocks(6144) == (2, 1024)
    assert blocks(1408) == (32, 128) and blocks(2560) == (8, 512) and blocks(768) == (16, 256)
    assert blocks(200) == (16, 256) and blocks(1000) == (8, 512)  # masked last block
    for H in (128, 1408, 2560):
        block_t, block_h = blocks(H)
        assert block_t * block_h == interpreted.TILE and H % block_h == 0


def test_other_tiles_compute_the_same_sum(interpreted):
    """The micro-benchmark's knobs (block_t, block_h) change the grid, not the result."""
    import torch

    weights, comb, out, _ = _inputs(13, 6, 640, seed=3)
    interpreted.combine(weights, comb, out)
    for block_t, block_h in ((1, 128), (2, 1024), (64, 64)):
        other = torch.full_like(out, float("nan"))
        interpreted.combine(weights, comb, other, block_t=block_t, block_h=block_h)
        assert torch.equal(out, other)


def test_bad_buffers_are_refused_by_name(interpreted):
    import torch

    weights, comb, out, _ = _inputs(4, 2, 128, seed=1)
    with pytest.raises(ValueError, match="comb must be"):
        interpreted.combine(weights, comb[:7], out)
    with pytest.raises(ValueError, match="weights must hold"):
        interpreted.combine(weights[:3], comb, out)
    with pytest.raises(ValueError, match="out must be contiguous"):
        interpreted.combine(weights, comb, torch.empty(128, 4, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match="must be bf16"):
        interpreted.combine(weights, comb.float(), out)
    interpreted.combine(weights[:0], comb[:0], out[:0])  # no tokens: nothing to launch


def test_combine_rank_runs_the_named_reduction_and_cpu_defaults_to_bmm(interpreted):
    import torch

    from xstage_bench.megamoe.layer import reduction
    from xstage_bench.megamoe.layer.rank import RankBuffers

    T, topk, H = 12, 4, 256
    weights, comb, out, _ = _inputs(T, topk, H, seed=7)
    none = dict.fromkeys(("plan", "grid", "x", "xs", "xs_steps", "h", "hs", "row_dst", "sync"))
    rb = RankBuffers(**none, comb=comb, out=out, combine_weights=weights, tiles={})
    point = {"tokens_per_rank": T, "topk": topk, "H": H}
    assert reduction.default_reduction("cpu") == reduction.BMM
    assert reduction.default_reduction("cuda") == reduction.TRITON
    results = {}
    for name in (reduction.TRITON, reduction.BMM, None):
        out.fill_(float("nan"))
        reduction.combine_rank(rb, point, name)
        results[name] = out.clone()
    ref = torch.empty_like(out)
    reduction.combine_reference(weights, comb, ref)
    assert torch.equal(results[None], ref) and torch.equal(results[reduction.BMM], ref)
    torch.testing.assert_close(
        results[reduction.TRITON].float(), ref.float(), rtol=2.0**-7, atol=1e-3
    )
    with pytest.raises(ValueError, match="unknown reduction"):
        reduction.combine_rank(rb, point, "einsum")
    assert reduction.describe(reduction.TRITON)["reduction"] == "triton"
    assert "torch.bmm" in reduction.describe(reduction.BMM)["computes"]


def test_the_raw_config_names_the_reduction_inside_time_us():
    from xstage_bench.data.config import load_config
    from xstage_bench.megamoe.runner import raw_config

    if not HAVE_TORCH_TRITON:
        pytest.skip("torch and triton not installed")
    from pathlib import Path

    config = load_config(Path(__file__).resolve().parents[1] / "config.yaml")
    for device_type, name in (("cuda", "triton"), ("cpu", "torch.bmm")):
        raw = raw_config(config, config["megamoe"], 1, 32, device_type, paths=["peer", "host"])
        assert raw["combine"]["reduction"] == name
        for path in ("peer", "host"):
            assert f"reduction, by {name} (`combine`" in raw["definitions"][path]["time_us"]


def test_the_layer_check_reads_the_triton_reduction_and_fails_a_wrong_one(interpreted, monkeypatch):
    """The host path at f=0.5 on two CPU ranks, the problem switched to the Triton
    reduction (a GPU's): the check passes on its output, device rows and host rows alike;
    a reduction that leaves its output unwritten, or sums the wrong rows, fails it."""
    from fixtures import TINY_POINT, tiny_cpu_measurer

    from xstage_bench.megamoe import reference
    from xstage_bench.megamoe.layer import reduction

    m = tiny_cpu_measurer(2)
    point = {
        **TINY_POINT,
        "routing": "balanced",
        "tokens_per_rank": 24,
        "world_size": 2,
        "path": "host",
        "remote_fraction": 0.5,
        "schedule": "expert_wave",
        "id": "tiny/w8a8/balanced/T=24/P=2/path=host/f=0.5/expert_wave",
    }
    prob = m.problem(point)
    assert prob.reduction == reduction.BMM  # the CPU's own
    prob.reduction = reduction.TRITON
    calls = []
    kernel_combine = interpreted.combine

    def counted(weights, comb, out, **kw):
        calls.append(out.shape[0])
        kernel_combine(weights, comb, out, **kw)

    monkeypatch.setattr(interpreted, "combine", counted)
    try:
        error, facts = m.check(point)
    except Exception as e:  # triton.runtime.errors.InterpreterError
        if "0-dimensional" in str(e):
            pytest.skip(f"the Triton interpreter cannot run with this numpy: {e}")
        raise
    assert error is None, error
    assert max(facts["rel_error"]) < reference.INTERPRETER_TOLERANCE
    # per rank: the timed reduction over all 24 tokens, then the check's over the 12 host ones
    assert calls == [24, 24, 12, 12]

    monkeypatch.setattr(interpreted, "combine", lambda weights, comb, out, **kw: None)
    error, _ = m.check(point)
    assert error == "output rows left NaN (unwritten) on ranks [0, 1]"

    def first_row_only(weights, comb, out, **kw):
        out.copy_(comb.view(out.shape[0], -1, out.shape[1])[:, 0])

    monkeypatch.setattr(interpreted, "combine", first_row_only)
    error, _ = m.check(point)
    assert error is not None and error.startswith("relative error vs the torch reference")
