"""The home rank's top-k weighted reduction of its combine buffer, and which one ran.

After the fused kernel every home rank holds, in its combine buffer, topk bf16 rows per
token (slot t * topk + k) and reduces them into its (T, H) output:
out[t] = sum_k w[t, k] comb[t * topk + k], fp32 accumulation, bf16 out. That reduction is
inside every timed layer (time_us), so which one ran is part of the record: the raw
config names it (`describe`, runner.raw_config).

On a GPU it is xstage_kernels.combine (TRITON), a streaming Triton kernel meant to run at
HBM bandwidth. `combine_reference` (BMM) is the same sum as torch.bmm of the (T, 1, topk)
weights with the (T, topk, H) buffer, a bf16 batched GEMV: the plain reference the kernel
is tested against (tests/test_combine.py), and what the CPU path runs. A problem's check
and its timed runs go through the same reduction (problem.MoEProblem.reduction), so a wrong
reduction fails the check.
"""

from __future__ import annotations

from xstage_bench.megamoe.layer.rank import RankBuffers
from xstage_kernels import combine as combine_kernel

TRITON = "triton"
BMM = "torch.bmm"
REDUCTIONS = (TRITON, BMM)


def default_reduction(device_type: str) -> str:
    """The reduction a rank on this device type runs: the Triton kernel on CUDA, torch.bmm
    elsewhere (the CPU path)."""
    return TRITON if device_type == "cuda" else BMM


def describe(name: str) -> dict:
    """The raw config's `combine`: which reduction ran and what it computes."""
    if name == TRITON:
        return {
            "reduction": TRITON,
            "source": "kernels/xstage_kernels/combine.py (Triton)",
            "computes": "out[t] = sum_k w[t, k] comb[t * topk + k] in fp32, bf16 out; one "
            f"program per {combine_kernel.TILE} outputs (BLOCK_T tokens x BLOCK_H channels, "
            "BLOCK_H the widest of "
            + ", ".join(str(b) for b in combine_kernel.BLOCK_H_CHOICES)
            + " dividing H), the top-k loop unrolled",
            "num_warps": combine_kernel.NUM_WARPS,
        }
    if name == BMM:
        return {
            "reduction": BMM,
            "computes": "torch.bmm of the (T, 1, topk) bf16 weights with the (T, topk, H) "
            "combine buffer (a bf16 batched GEMV, fp32 accumulation)",
        }
    raise ValueError(f"unknown reduction {name!r}; known: {', '.join(REDUCTIONS)}")


def combine_reference(weights, comb, out) -> None:
    """out (T, H) = torch.bmm of weights (T, 1, topk) with comb (T * topk, H) viewed as
    (T, topk, H)."""
    import torch

    T, H = out.shape
    topk = weights.shape[-1]
    torch.bmm(weights, comb.view(T, topk, H), out=out.view(T, 1, H))


def reduce(weights, comb, out, name: str) -> None:
    """out (T, H) = the top-k weighted sum of comb's rows by reduction `name` (weights
    (T, 1, topk) bf16, comb (T * topk, H) bf16)."""
    if name == TRITON:
        combine_kernel.combine(weights, comb, out)
    elif name == BMM:
        combine_reference(weights, comb, out)
    else:
        raise ValueError(f"unknown reduction {name!r}; known: {', '.join(REDUCTIONS)}")


def combine_rank(rb: RankBuffers, point: dict, name: str | None = None) -> None:
    """The home rank's top-k weighted reduction of its combine buffer into rb.out, by
    reduction `name` (default: its device's, default_reduction)."""
    T, topk, H = point["tokens_per_rank"], point["topk"], point["H"]
    comb = rb.comb.view(T * topk, H)
    reduce(rb.combine_weights, comb, rb.out, name or default_reduction(rb.comb.device.type))
