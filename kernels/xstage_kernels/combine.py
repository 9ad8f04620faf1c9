"""The home rank's top-k weighted reduction of its combine buffer, in Triton.

After the fused MoE kernel (megamoe.py) has stored every routed row into its home rank's
combine buffer (slot t * topk + k: token t's k-th expert output, bf16), the home rank
reduces it:

    out[t, :] = sum_k w[t, k] * comb[t * topk + k, :]

in fp32, rounded once to bf16 (as torch.bmm of the (T, 1, topk) weights with the
(T, topk, H) buffer, which the harness keeps as the reference). It is pure streaming: the
combine buffer is read once (T topk H 2 bytes), the output written once (T H 2 bytes),
two FLOPs per element read, so its speed is HBM bandwidth; a batched GEMV of T tiny
batches (cuBLAS) runs it at a fraction of that.

What each program owns: one BLOCK_T x BLOCK_H tile of the output, grid
(cdiv(T, BLOCK_T), cdiv(H, BLOCK_H)). BLOCK_H is the widest of 1024, 512, 256, 128
channels that divides H (every configured shape's H is a multiple of 128; another H gets
512 or its power of two, the last block masked), BLOCK_T = TILE / BLOCK_H tokens with
TILE = 4096 elements, or 2 tokens for 1024-wide blocks (timed on one H200, L2 flushed:
2 x 1024 reads 5-11% faster than 4 x 1024 at H = 4096 and 7168 with 16384 tokens, and no
slower at Qwen3.5's shape; narrower blocks keep 4096, which DiT-MoE's H = 1408 needs: 16 x
128 took 3x the time of 32 x 128 there). Per k the program loads a BLOCK_T x BLOCK_H slab
of the buffer, 4-8 KiB, as 16-byte vectors (4 warps: 32 elements, two to four vectors per
thread; the row stride
H is a multiple of 8 wherever H is a multiple of 16, which Triton specializes on), and
BLOCK_T weights. The loop over k is unrolled (topk is a compile-time constant), so the
loads of every k are independent of the accumulation and a program can have up to
topk x 8 KiB in flight (48 KiB at topk 6), beside the other programs resident on its SM.
Row offsets are int64 (T topk H passes 2^31 at large shapes). The combine buffer is read
once, so its loads are marked evict-first.
"""

from __future__ import annotations

import triton
import triton.language as tl

TILE = 4096  # output elements per program
WIDE_BLOCK_T = 2  # tokens per program with 1024-wide blocks (see the module doc)
BLOCK_H_CHOICES = (1024, 512, 256, 128)
MAX_BLOCK_H = 512  # for an H that no choice divides (the last block masked)
NUM_WARPS = 4


@triton.jit
def _topk_combine(
    w_ptr,  # (T * TOPK,) weights, token-major: w[t * TOPK + k]
    comb_ptr,  # (T * TOPK, H) bf16, row t * TOPK + k
    out_ptr,  # (T, H) bf16
    T,
    H,
    TOPK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_t = offs_t < T
    mask = mask_t[:, None] & (offs_h < H)[None, :]
    rows = offs_t.to(tl.int64) * TOPK
    acc = tl.zeros((BLOCK_T, BLOCK_H), dtype=tl.float32)
    for k in tl.static_range(TOPK):
        w = tl.load(w_ptr + rows + k, mask=mask_t, other=0.0).to(tl.float32)
        ptrs = comb_ptr + (rows + k)[:, None] * H + offs_h[None, :]
        c = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
        acc += w[:, None] * c.to(tl.float32)
    out = out_ptr + offs_t.to(tl.int64)[:, None] * H + offs_h[None, :]
    tl.store(out, acc.to(tl.bfloat16), mask=mask)


def blocks(H: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_H) for rows of H channels (see the module doc)."""
    for block_h in BLOCK_H_CHOICES:
        if H % block_h == 0:
            return (WIDE_BLOCK_T if block_h == 1024 else TILE // block_h), block_h
    block_h = min(MAX_BLOCK_H, triton.next_power_of_2(H))
    return TILE // block_h, block_h


def combine(
    weights,
    comb,
    out,
    *,
    block_t: int | None = None,
    block_h: int | None = None,
    num_warps: int = NUM_WARPS,
) -> None:
    """Enqueue out = the top-k weighted sum of comb's rows, on the current device and
    stream (all three tensors on it).

    out: (T, H) bf16, contiguous. comb: (T * topk, H) bf16, contiguous, row t * topk + k.
    weights: T * topk contiguous elements, token-major (the harness's (T, 1, topk) bf16),
    any float type (converted to fp32). block_t, block_h, num_warps override the tile
    (powers of two; a micro-benchmark's knobs).
    """
    T, H = out.shape
    if T == 0:
        return
    topk = comb.shape[0] // T
    if comb.dim() != 2 or comb.shape != (T * topk, H) or topk < 1:
        raise ValueError(f"comb must be (T * topk, {H}) for T={T}, got {tuple(comb.shape)}")
    if weights.numel() != T * topk:
        raise ValueError(f"weights must hold T * topk = {T * topk} values, got {weights.numel()}")
    for name, t in (("weights", weights), ("comb", comb), ("out", out)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if t.device != out.device:
            raise ValueError(f"{name} is on {t.device}, out on {out.device}")
    import torch

    if comb.dtype != torch.bfloat16 or out.dtype != torch.bfloat16:
        raise ValueError(f"comb and out must be bf16, got {comb.dtype} and {out.dtype}")
    default_t, default_h = blocks(H)
    block_t, block_h = block_t or default_t, block_h or default_h
    grid = (triton.cdiv(T, block_t), triton.cdiv(H, block_h))
    _topk_combine[grid](
        weights,
        comb,
        out,
        T,
        H,
        TOPK=topk,
        BLOCK_T=block_t,
        BLOCK_H=block_h,
        num_warps=num_warps,
    )
