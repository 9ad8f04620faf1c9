"""The unfused MoE pipeline on P GPUs driven by one process: what a torch user writes.

Five stages, each its own kernels, enqueued on every rank's current stream:

1. dispatch: each home rank gathers the rows routed to each expert rank and copies them
   over NVLink into that rank's expert-major receive buffer. The runner drives every GPU
   from one process, so the all-to-all is this set of peer copies (copy engines, through
   torch's device-to-device copy) rather than torch.distributed's NCCL all_to_all, which
   needs one process per GPU; the rows that cross NVLink are the same.
2. Linear-1, a grouped GEMM over the rank's experts.
3. SwiGLU in fp32 (of the bf16 Linear-1 output torch's GEMMs return), then the
   intermediate stored as our kernel stores it: FP8 with one scale per row and 128
   channels (w8a8, w4a8) or bf16. The check uses our reference told of the bf16 Linear-1
   output (FORMAT): that rounding moves some FP8 roundings of the intermediate.
4. Linear-2, a grouped GEMM with a bf16 output.
5. combine: every output row copied back to its home rank's combine buffer (peer copies),
   then the top-k weighted sum (the same bf16 batched GEMV as our kernel's combine).

Three GEMM paths, as torch 2.11 offers them on sm90, each checked and timed on its own:

- fp8_grouped_rowwise: one torch._scaled_grouped_mm per GEMM (torch's FP8 grouped GEMM on
  Hopper), FP8 e4m3 with one scale per token row (activations) and one per output channel
  (weights), the scalings it supports there. Weights are requantized that way once at load
  from their dequantized values (the same masters as every path), activations once at
  home before the dispatch (as a row-wise pipeline would quantize them), the intermediate
  per row after SwiGLU. Against the block-format reference this path differs by three
  e4m3 requantizations (weights, activations, intermediate: about 6%; 6.4-7.0% measured on
  2x H200), so it is held to ROWWISE_TOLERANCE; that its grouped GEMM computes its own
  operands' product is checked once per device first (_check_rowwise_gemm, 1%).
- fp8_per_expert: torch._scaled_mm per expert with block scales (1x128 activations,
  128x128 weights), torch's block-scaled FP8 GEMM on Hopper. W4A8 weights are expanded to
  FP8 once at load (every 4-bit integer is an e4m3 value, so exactly): torch has no 4-bit
  x FP8 GEMM. On the 2x H200 image (torch 2.11) a candidate scale layout reproduced a
  dequantized matmul at M = 256 rows, yet the per-expert products were wrong (relative
  error 0.5-2.5) on most configurations; the check rejects the path where it is wrong.
- bf16_grouped: one torch._grouped_mm per GEMM in bf16, weights dequantized to bf16 once
  at load, received rows dequantized after the dispatch.

Rows are padded per expert to ALIGN_ROWS, the grouped GEMMs' row alignment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xstage_bench.megamoe import reference, routing
from xstage_bench.megamoe.quant import (
    SCALE_BLOCK,
    dequantize_rows,
    dequantize_weight,
    quantize_rows,
    unpack_int4,
)

ALIGN_ROWS = 16
FORMAT = reference.Intermediate(linear1_bf16=True)
GEMMS = ("fp8_grouped_rowwise", "fp8_per_expert", "bf16_grouped")
# What each path computes in, for tables.
GEMM_FORMAT = {
    "fp8_grouped_rowwise": "FP8, per-token x per-channel scales",
    "fp8_per_expert": "FP8, 1x128 x 128x128 block scales",
    "bf16_grouped": "bf16",
}
ROWWISE_TOLERANCE = 0.1

# The scale layouts torch._scaled_mm might want for (1x128, 128x128) block scales; the
# first that reproduces a dequantized matmul is kept (see _blockwise_layout).
_BLOCKWISE_LAYOUT: list = []


def gemm_paths(precision: str) -> tuple[str, ...]:
    """The GEMM paths a precision can use (bf16 has no FP8 path)."""
    return ("bf16_grouped",) if precision == "bf16" else GEMMS


def tolerance(gemm: str, default: float) -> float:
    """The relative error a correct product of this path stays under (see module doc)."""
    return max(default, ROWWISE_TOLERANCE) if gemm == "fp8_grouped_rowwise" else default


def rowwise(x):
    """fp32/bf16 (rows, K) -> (fp8 values, fp32 (rows,) scales): one scale per row."""
    values, scales = quantize_rows(x, block=x.shape[1])
    return values, scales[:, 0].contiguous()


_ROWWISE_CHECKED: set = set()


def _check_rowwise_gemm(torch, device) -> None:
    """torch._scaled_grouped_mm against the fp32 product of its own dequantized operands,
    on three groups (one empty) of a small problem; RuntimeError if it is wrong."""
    if device in _ROWWISE_CHECKED:
        return
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    rows, n, k = (32, 0, 48), 256, 512
    a, sa = rowwise(torch.randn(sum(rows), k, generator=gen, device=device))
    w = torch.randn(len(rows), n, k, generator=gen, device=device)
    ws = [rowwise(w[e]) for e in range(len(rows))]
    wq, wsc = torch.stack([v for v, _ in ws]), torch.stack([s for _, s in ws])
    ends = np.cumsum(rows)
    offs = torch.tensor(ends, dtype=torch.int32, device=device)
    got = torch._scaled_grouped_mm(
        a, wq.transpose(-2, -1), sa, wsc, offs=offs, out_dtype=torch.bfloat16
    ).float()
    want = torch.cat(
        [
            (a[s:t].float() * sa[s:t, None]) @ (wq[e].float() * wsc[e][:, None]).T
            for e, (s, t) in enumerate(zip(ends - rows, ends, strict=True))
        ]
    )
    err = float((got - want).norm() / want.norm())
    if err > 1e-2:
        raise RuntimeError(
            f"torch._scaled_grouped_mm (row-wise) is wrong: relative error {err:.3g}"
        )
    _ROWWISE_CHECKED.add(device)


def _blockwise_candidates(torch):
    def outer_major(s):
        return s.t().contiguous().t()

    return {
        "scale_a outer-major, scale_b (K/128, N/128) view": lambda sa, sw: (
            outer_major(sa),
            sw.t(),
        ),
        "scale_a row-major, scale_b (K/128, N/128) view": lambda sa, sw: (sa, sw.t()),
        "scale_a outer-major, scale_b (N/128, K/128)": lambda sa, sw: (outer_major(sa), sw),
    }


def _blockwise_layout(torch, device):
    """The scale layout under which torch._scaled_mm computes a block-scaled product
    correctly on this torch; RuntimeError naming every failure if none does."""
    if _BLOCKWISE_LAYOUT:
        return _BLOCKWISE_LAYOUT[0]
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    m, n, k = 256, 1024, 1024  # scale dimensions of 8 blocks, as the MoE shapes have
    a = torch.randn(m, k, generator=gen, device=device).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, generator=gen, device=device).to(torch.float8_e4m3fn)
    sa = torch.rand(m, k // SCALE_BLOCK, generator=gen, device=device) + 0.5
    sw = torch.rand(n // SCALE_BLOCK, k // SCALE_BLOCK, generator=gen, device=device) + 0.5
    want = (
        dequantize_rows(a, sa)
        @ (w.float() * sw.repeat_interleave(SCALE_BLOCK, 0).repeat_interleave(SCALE_BLOCK, 1)).T
    )
    failures = []
    for name, layout in _blockwise_candidates(torch).items():
        try:
            a_s, w_s = layout(sa, sw)
            got = torch._scaled_mm(a, w.t(), scale_a=a_s, scale_b=w_s, out_dtype=torch.bfloat16)
            err = float((got.float() - want).norm() / want.norm())
        except Exception as e:  # an unsupported layout raises; try the next
            failures.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        if err < 1e-2:
            _BLOCKWISE_LAYOUT.append(layout)
            return layout
        failures.append(f"{name}: relative error {err:.3g}")
    raise RuntimeError(
        "torch._scaled_mm has no working block-scaled layout: " + "; ".join(failures)
    )


@dataclass
class _Rank:
    """One expert rank's receive layout and buffers."""

    plan: routing.RankRows
    offs: object  # int32 (E/P,) cumulative padded row ends, for torch._grouped_mm
    experts: list  # (local expert, first row, end row) of every expert with rows
    dispatch: list  # per home rank: (token rows on the home's GPU, positions here) or None
    recv_x: object
    recv_xs: object | None
    recv_xr: object | None  # row-wise quantized rows (fp8_grouped_rowwise) and their scales
    recv_xrs: object | None
    comb: object  # this rank's combine buffer as a home rank (T * topk, H) bf16
    out: object  # (T, H) bf16


def _received(rk: _Rank, row_scaled: bool):
    """A rank's receive buffers for one activation format: (rows, their scales)."""
    return (rk.recv_xr, rk.recv_xrs) if row_scaled else (rk.recv_x, rk.recv_xs)


class UnfusedMoE:
    """The unfused pipeline of one configuration, over a MoEProblem's inputs and weights."""

    def __init__(self, problem, weight_cache: dict):
        import torch

        self.torch = torch
        self.prob = problem
        self.point = problem.point
        self.precision = problem.precision
        self.devices = problem.devices
        self.cache = weight_cache  # (gemm, rank) -> weights, shared by a shape's configurations
        T, topk, H = self.point["tokens_per_rank"], self.point["topk"], self.point["H"]
        plans = routing.dispatch_plan([h.ids for h in problem.homes], self.point["E"], ALIGN_ROWS)
        fp8 = self.precision != "bf16"
        self.ranks = []
        for d, plan in zip(self.devices, plans, strict=True):
            ends = np.cumsum(-(-plan.expert_rows // ALIGN_ROWS) * ALIGN_ROWS)
            starts = np.concatenate([[0], ends[:-1]])
            dispatch = []
            for r in range(len(self.devices)):
                at = np.flatnonzero(plan.home == r)
                dispatch.append(
                    None
                    if len(at) == 0
                    else (
                        torch.as_tensor(plan.token[at], device=self.devices[r]),
                        torch.as_tensor(at, device=d),
                    )
                )
            x_dtype = torch.uint8 if fp8 else torch.bfloat16  # fp8 rows move as bytes
            self.ranks.append(
                _Rank(
                    plan=plan,
                    offs=torch.as_tensor(ends.astype(np.int32), device=d),
                    experts=[
                        (e, int(s), int(t))
                        for e, (s, t) in enumerate(zip(starts, ends, strict=True))
                        if t > s
                    ],
                    dispatch=dispatch,
                    recv_x=torch.zeros(plan.padded_rows, H, dtype=x_dtype, device=d),
                    recv_xs=torch.zeros(plan.padded_rows, H // SCALE_BLOCK, device=d)
                    if fp8
                    else None,
                    recv_xr=torch.zeros(plan.padded_rows, H, dtype=x_dtype, device=d)
                    if fp8
                    else None,
                    recv_xrs=torch.zeros(plan.padded_rows, device=d) if fp8 else None,
                    comb=torch.empty(T * topk, H, dtype=torch.bfloat16, device=d),
                    out=torch.empty(T, H, dtype=torch.bfloat16, device=d),
                )
            )
        # The row-wise path's home tokens, quantized once like the kernel's inputs.
        self.homes_rowwise = [
            rowwise(dequantize_rows(h.xq, h.xs)) if fp8 else None for h in problem.homes
        ]
        # combine moves: for home r and expert rank q, rows of q's output whose home is r
        self.combine = [
            [
                (
                    q,
                    torch.as_tensor(np.flatnonzero(rk.plan.home == r), device=self.devices[q]),
                    torch.as_tensor(rk.plan.slot[rk.plan.home == r], device=self.devices[r]),
                )
                for q, rk in enumerate(self.ranks)
                if np.any(rk.plan.home == r)
            ]
            for r in range(len(self.devices))
        ]

    # ---- weights ------------------------------------------------------------------------

    def weights(self, gemm: str, q: int):
        """Rank q's (w1, s1, w2, s2) for a GEMM path, made once per shape and precision."""
        key = (gemm, q)
        if key not in self.cache:
            self.cache[key] = self._make_weights(gemm, self.prob.experts[q])
        return self.cache[key]

    def _make_weights(self, gemm: str, ex):
        torch = self.torch
        if self.precision == "bf16":
            return ex.w1, None, ex.w2, None
        if gemm == "fp8_grouped_rowwise":
            return (*self._rowwise_weight(ex.w1, ex.s1), *self._rowwise_weight(ex.w2, ex.s2))
        if gemm == "fp8_per_expert":
            if self.precision == "w8a8":
                return ex.w1, ex.s1, ex.w2, ex.s2

            def fp8(packed):  # expert by expert: unpacking all at once would double the peak
                out = torch.empty(
                    (*packed.shape[:2], 2 * packed.shape[2]),
                    dtype=torch.float8_e4m3fn,
                    device=packed.device,
                )
                for e in range(packed.shape[0]):
                    out[e] = unpack_int4(packed[e]).to(torch.float16).to(torch.float8_e4m3fn)
                return out

            return fp8(ex.w1), ex.s1, fp8(ex.w2), ex.s2

        def bf16(w, s):
            out = torch.empty(
                (w.shape[0], w.shape[1], s.shape[2] * SCALE_BLOCK),
                dtype=torch.bfloat16,
                device=w.device,
            )
            for e in range(w.shape[0]):
                out[e] = dequantize_weight(w[e], s[e], self.precision)
            return out

        return bf16(ex.w1, ex.s1), None, bf16(ex.w2, ex.s2), None

    def _rowwise_weight(self, w, s):
        """(E, N, K) fp8 and (E, N) per-channel scales from the dequantized masters,
        expert by expert (all at once would double the peak)."""
        torch = self.torch
        n, k = w.shape[1], s.shape[2] * SCALE_BLOCK
        values = torch.empty(w.shape[0], n, k, dtype=torch.float8_e4m3fn, device=w.device)
        scales = torch.empty(w.shape[0], n, dtype=torch.float32, device=w.device)
        for e in range(w.shape[0]):
            values[e], scales[e] = rowwise(dequantize_weight(w[e], s[e], self.precision))
        return values, scales

    # ---- the pipeline ---------------------------------------------------------------

    def _gemm(self, gemm: str, q: int, x, xs, w, ws):
        """bf16 (rows, N) = x @ w^T per expert of rank q (x fp8 with scales xs, or bf16)."""
        torch = self.torch
        rk = self.ranks[q]
        if gemm == "fp8_grouped_rowwise":
            _check_rowwise_gemm(torch, x.device)
            return torch._scaled_grouped_mm(
                x, w.transpose(-2, -1), xs, ws, offs=rk.offs, out_dtype=torch.bfloat16
            )
        if gemm == "bf16_grouped":
            a = x if xs is None else dequantize_rows(x, xs).to(torch.bfloat16)
            return torch._grouped_mm(a, w.transpose(-2, -1), offs=rk.offs, out_dtype=torch.bfloat16)
        layout = _blockwise_layout(torch, x.device)
        out = torch.zeros(x.shape[0], w.shape[1], dtype=torch.bfloat16, device=x.device)
        for e, s, t in rk.experts:
            a_s, w_s = layout(xs[s:t], ws[e])
            out[s:t] = torch._scaled_mm(
                x[s:t], w[e].t(), scale_a=a_s, scale_b=w_s, out_dtype=torch.bfloat16
            )
        return out

    def forward(self, gemm: str) -> None:
        """Enqueue one MoE layer on every rank (see the module doc)."""
        torch = self.torch
        fp8 = self.precision != "bf16"
        row_scaled = gemm == "fp8_grouped_rowwise"
        I = self.point["I"]  # noqa: E741
        ys = []
        for q, rk in enumerate(self.ranks):
            d = self.devices[q]
            recv_x, recv_xs = _received(rk, row_scaled)
            with torch.cuda.device(d):
                for r, move in enumerate(rk.dispatch):
                    if move is None:
                        continue
                    tokens, positions = move
                    home = self.prob.homes[r]
                    xq, xs = self.homes_rowwise[r] if row_scaled else (home.xq, home.xs)
                    src = xq.view(torch.uint8) if fp8 else xq
                    recv_x.index_copy_(0, positions, src.index_select(0, tokens).to(d))
                    if fp8:
                        recv_xs.index_copy_(0, positions, xs.index_select(0, tokens).to(d))
        for q, rk in enumerate(self.ranks):
            with torch.cuda.device(self.devices[q]):
                w1, s1, w2, s2 = self.weights(gemm, q)
                recv_x, recv_xs = _received(rk, row_scaled)
                x = recv_x.view(torch.float8_e4m3fn) if fp8 else recv_x
                gate_up = self._gemm(gemm, q, x, recv_xs, w1, s1)
                h = torch.nn.functional.silu(gate_up[:, :I].float()) * gate_up[:, I:].float()
                if fp8:
                    hq, hs = rowwise(h) if row_scaled else quantize_rows(h)
                    ys.append(self._gemm(gemm, q, hq, hs, w2, s2))
                else:
                    ys.append(self._gemm(gemm, q, h.to(torch.bfloat16), None, w2, None))
        T, topk, H = self.point["tokens_per_rank"], self.point["topk"], self.point["H"]
        for r, d in enumerate(self.devices):
            with torch.cuda.device(d):
                home = self.ranks[r]
                for q, positions, slots in self.combine[r]:
                    home.comb.index_copy_(0, slots, ys[q].index_select(0, positions).to(d))
                torch.bmm(
                    self.prob.ranks[r].combine_weights,
                    home.comb.view(T, topk, H),
                    out=home.out.view(T, 1, H),
                )

    def poison(self) -> None:
        for rk in self.ranks:
            rk.comb.fill_(float("nan"))
            rk.out.fill_(float("nan"))

    def outputs(self) -> list:
        return [rk.out for rk in self.ranks]


def exchange_bytes(plans: list[routing.RankRows], H: int, precision: str) -> list[int]:
    """Bytes each rank sends to its peers when dispatch and combine are separate steps:
    the rows it dispatches to other ranks (values and their scales) and the output rows it
    returns to their home ranks (bf16)."""
    row_in = H + 4 * (H // SCALE_BLOCK) if precision != "bf16" else 2 * H
    return [
        sum(int(np.count_nonzero(p.home == q)) for p in plans if p.rank != q) * row_in
        + plans[q].remote_rows() * 2 * H
        for q in range(len(plans))
    ]
