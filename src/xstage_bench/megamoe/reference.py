"""A plain torch reference for the fused MoE: dequantized weights, fp32 arithmetic.

For a sample of tokens of every home rank: dequantize the token's FP8 (or bf16) input, and
for each of its top-k experts dequantize that expert's weights, compute gate/up in fp32,
SwiGLU, Linear-2 in fp32, and add the weighted outputs per token. Two roundings the
kernel's data path performs by design are applied here too, so that the tolerance measures
the kernel rather than the formats: the intermediate is requantized as the kernel stores
it (FP8 per 128 channels, or bf16), and each expert output is rounded to bf16 (the combine
buffer's type) before the weighted sum; where our kernel rounds gate to bf16 before SwiGLU
(its W4A8 build), so does the reference (`Intermediate.gate_bf16`). Kernels that store the
intermediate differently (DeepGEMM's SM90 MegaMoE: per-64-channel power-of-two scales, the
top-k weight applied before quantization) are checked against the same reference told
their format (`Intermediate`, `stored_intermediate`), so that the tolerance still measures
the kernel; so is the unfused torch pipeline, whose Linear-1 GEMM returns bf16. A kernel
that quantizes the weights itself (FlashInfer, given their bf16 values) is checked with
the weights as it stores them (`stored_weights`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from xstage_bench.megamoe.quant import (
    SCALE_BLOCK,
    dequantize_rows,
    dequantize_weight,
    quantize_rows,
)

# Relative L2 error (||out - ref|| / ||ref||) a correct kernel stays under: what remains
# are fp32 summation order, rare flips of an FP8 intermediate rounding, and the bf16 combine.
TOLERANCE = 2e-2
# Under the Triton interpreter (CPU tests) the float -> FP8 conversion loses the carry when
# the mantissa rounds into the next power of two and flushes FP8 subnormals, about 5% on
# the intermediate: still far below the ~100% of a wrong row, expert or scale.
INTERPRETER_TOLERANCE = 0.1


def tolerance(device_type: str) -> float:
    """The relative error a correct kernel stays under on this device type."""
    return TOLERANCE if device_type == "cuda" else INTERPRETER_TOLERANCE


@dataclass
class HomeTokens:
    """One home rank's inputs as the kernel sees them."""

    xq: object  # (T, H) fp8 values, or bf16 activations
    xs: object | None  # (T, H/128) fp32 scales (fp8 precisions), else None
    ids: np.ndarray  # (T, topk) global expert ids
    weights: np.ndarray  # (T, topk) combine weights


@dataclass
class ExpertWeights:
    """One expert rank's weights as the kernel sees them."""

    w1: object  # (E/P, 2I, H) or packed (E/P, 2I, H/2)
    s1: object | None
    w2: object  # (E/P, H, I) or packed (E/P, H, I/2)
    s2: object | None


@dataclass(frozen=True)
class Intermediate:
    """How a kernel stores the Linear-1 output (after SwiGLU) for Linear-2 to read."""

    block: int = SCALE_BLOCK  # channels per FP8 scale
    weighted: bool = False  # the top-k combine weight is applied before quantization
    linear1_bf16: bool = False  # gate and up are rounded to bf16 before SwiGLU (torch GEMMs)
    gate_bf16: bool = False  # gate alone is (our W4A8 build: megamoe_ws.GATE_BF16)


OURS = Intermediate()


def ours_for(precision: str, x) -> Intermediate:
    """How our kernel stores the intermediate in a launch of `precision` on x's device (its
    W4A8 build on a GPU rounds gate to bf16: megamoe.rounds_gate_bf16)."""
    from xstage_kernels import megamoe as kernel

    return Intermediate(gate_bf16=kernel.rounds_gate_bf16(precision, x))


def _intermediate(h, precision: str, block: int):
    """The intermediate as the kernel stores and reloads it."""
    import torch

    if precision == "bf16":
        return h.to(torch.bfloat16).float()
    values, scales = quantize_rows(h, block)
    return dequantize_rows(values, scales, block)


def reference_outputs(
    homes: Sequence[HomeTokens],
    experts: Sequence[ExpertWeights] | Mapping[int, ExpertWeights],
    tokens: Sequence[np.ndarray],
    precision: str,
    intermediate_format: Intermediate = OURS,
    stored_weights: Callable | None = None,
    stored_intermediate: Callable | None = None,
) -> list:
    """fp32 (len(tokens[r]), H) MoE outputs of the sampled tokens of every home rank r,
    on that rank's device. Work is grouped by expert so each expert is dequantized once;
    `stored_weights(w1, w2) -> (w1, w2)`, if given, turns its fp32 weights into what the
    kernel under test computes with; `stored_intermediate(h) -> h`, if given, is the
    intermediate as that kernel stores and reloads it, in place of FP8 with one exact
    scale per `intermediate_format.block` channels (DeepGEMM's power-of-two scales).

    `experts` maps expert ranks to their weights; given only some ranks (a process that
    holds one rank's experts), the outputs are the partial sums over those ranks' experts.
    """
    import torch
    import torch.nn.functional as F

    if not isinstance(experts, Mapping):
        experts = dict(enumerate(experts))
    some = next(iter(experts.values()))
    local = some.w1.shape[0]
    intermediate = some.w2.shape[-1] * (2 if precision == "w4a8" else 1)
    work: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
    for r, (home, picked) in enumerate(zip(homes, tokens, strict=True)):
        for i, t in enumerate(picked.tolist()):
            for k, g in enumerate(home.ids[t].tolist()):
                if g // local in experts:
                    work[(g // local, g % local)].append((r, i, k))
    results = []
    for home, picked in zip(homes, tokens, strict=True):
        device = home.xq.device
        rows = torch.as_tensor(picked, device=device)
        if precision == "bf16":
            x = home.xq[rows].float()
        else:  # gather fp8 rows as bytes: not every torch build indexes float8 tensors
            values = home.xq.view(torch.uint8)[rows].view(home.xq.dtype)
            x = dequantize_rows(values, home.xs[rows])
        results.append((x, torch.zeros_like(x)))
    for (q, e), entries in sorted(work.items()):
        ex = experts[q]
        device = ex.w1.device
        w1 = dequantize_weight(ex.w1[e], None if ex.s1 is None else ex.s1[e], precision)
        w2 = dequantize_weight(ex.w2[e], None if ex.s2 is None else ex.s2[e], precision)
        if stored_weights is not None:
            w1, w2 = stored_weights(w1, w2)
        x = torch.stack([results[r][0][i].to(device) for r, i, _ in entries])
        w = torch.tensor(
            [float(homes[r].weights[int(tokens[r][i]), k]) for r, i, k in entries], device=device
        )[:, None]
        gate_up = x @ w1.T
        if intermediate_format.linear1_bf16:
            gate_up = gate_up.to(torch.bfloat16).float()
        elif intermediate_format.gate_bf16:
            gate_up[:, :intermediate] = gate_up[:, :intermediate].to(torch.bfloat16).float()
        h = F.silu(gate_up[:, :intermediate]) * gate_up[:, intermediate:]
        if intermediate_format.weighted:
            h = h * w
        if stored_intermediate is not None:
            h = stored_intermediate(h)
        else:
            h = _intermediate(h, precision, intermediate_format.block)
        y = h @ w2.T
        y = y.to(torch.bfloat16).float()
        if not intermediate_format.weighted:
            y = w * y
        for r in {r for r, _, _ in entries}:
            mine = [j for j, (rr, _, _) in enumerate(entries) if rr == r]
            at = [entries[j][1] for j in mine]
            acc = results[r][1]
            scaled = y[torch.tensor(mine, device=device)]
            acc.index_add_(0, torch.tensor(at, device=acc.device), scaled.to(acc.device))
    return [acc for _, acc in results]


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in fp32 (inf if out holds a NaN or an infinity)."""
    import torch

    out = out.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))
