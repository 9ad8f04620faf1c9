"""Our FlashAttention forward in Triton, whose epilogue stores each output row at its owner.

The kernel is the standard FlashAttention-2 forward (online softmax over K/V blocks, fp32
accumulator, exp2 with the scale folded into one FMA). What each program owns: one BLOCK_M
block of query tokens of one (batch, local head); it streams every K/V block of that head.
Where the sequence is a multiple of both blocks and q, k, v are contiguous, the blocks
arrive by TMA (descriptors over (B*S, H*D) views, so a head is a column range); otherwise
by pointer loads with masks.

The epilogue is the fused post-attention All-to-All of Ulysses. Every destination buffer
is named by its base address in `dest_ptrs`; row `m` of the tile goes to destination
`m // rows_per_dest`, at row `m % rows_per_dest` and head `head_offset + h` of a buffer
with strides (stride_ob, stride_os, stride_oh, 1). With one destination (the local
output) this is a plain store; with P destinations, whose addresses are peer memory mapped
into this process, each tile's stores go straight over NVLink into the rank that owns its
tokens, and the program moves on to its next work while they drain (the X-Stage). The same
code path serves both, so "alone" and "fused" differ only in where the stores land.

On a GPU, where S is a multiple of 128 and q, k, v are contiguous (the TMA path), the same
contract runs flash_ws.py instead: a producer warp and two math warpgroups (warp
specialization, Gluon), which `tl` cannot express. XSTAGE_ATTENTION_KERNEL=tl keeps this
kernel there too (A/B comparisons); `launch_config` says which kernel a call runs.
"""

from __future__ import annotations

import math
import os

import triton
import triton.language as tl

from xstage_kernels.tma import available as tma_available
from xstage_kernels.tma import warpgroup_mma

# Block shape and pipelining for head_dim 128, bf16, non-causal on one H200 (2026-11-30,
# S = 8K-32K, 12-20 heads). With TMA loads (S a multiple of both blocks, q/k/v contiguous):
# 128x128, 8 warps, 3 stages 499-571 TFLOP/s (128x64: 442-528; 2 stages: 375-413). The
# pointer path (any S): 128x64, 8 warps, 3 stages 384-488 (128x128 with 2 stages 386-416).
DEFAULT_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}
POINTER_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
LOG2E = 1.4426950408889634
KERNEL_ENV = "XSTAGE_ATTENTION_KERNEL"
KERNELS = ("ws", "tl")


@triton.jit
def _flash_fwd_routed(
    Q,
    K,
    V,
    q_desc,  # TMA descriptors over (B*S, H*D) views of q, k, v when TMA, else unused
    k_desc,
    v_desc,
    dest_ptrs,
    qk_scale,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_os,
    stride_oh,
    seq_len,
    local_heads,
    rows_per_dest,
    head_offset,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_SEQ: tl.constexpr,
    TMA: tl.constexpr,
):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // local_heads).to(tl.int64)  # batch offsets may pass 2^31 elements
    h = bh % local_heads

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < seq_len

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :]
    k_ptrs = K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :]
    v_ptrs = V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :]
    row0 = (b * seq_len).to(tl.int32)  # this batch item's first row in the (B*S, H*D) views
    col = (h * HEAD_DIM).to(tl.int32)
    if TMA:
        q = q_desc.load([row0 + start_m * BLOCK_M, col])
    elif EVEN_SEQ:
        q = tl.load(q_ptrs)
    else:
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        if TMA:
            k = k_desc.load([row0 + start_n, col])
            v = v_desc.load([row0 + start_n, col])
        elif EVEN_SEQ:
            k = tl.load(k_ptrs + start_n * stride_ks)
            v = tl.load(v_ptrs + start_n * stride_vs)
        else:
            col_ok = (start_n + offs_n) < seq_len
            k = tl.load(k_ptrs + start_n * stride_ks, mask=col_ok[:, None], other=0.0)
            v = tl.load(v_ptrs + start_n * stride_vs, mask=col_ok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k))
        if not EVEN_SEQ:
            qk = tl.where(col_ok[None, :], qk, float("-inf"))
        # log2 domain: the scale (softmax scale times log2(e)) folds into one FMA below
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    acc = acc / l_i[:, None]

    # Epilogue: route each row to the buffer that owns its token (see module doc).
    dest = offs_m // rows_per_dest
    row = offs_m - dest * rows_per_dest
    base = tl.load(dest_ptrs + dest, mask=row_ok, other=0).to(tl.pointer_type(Q.dtype.element_ty))
    o_ptrs = (
        base[:, None]
        + b * stride_ob
        + row[:, None] * stride_os
        + (head_offset + h) * stride_oh
        + offs_d[None, :]
    )
    tl.store(o_ptrs, acc.to(Q.dtype.element_ty), mask=row_ok[:, None])


def _check_inputs(q, k, v) -> None:
    if q.shape != k.shape or q.shape != v.shape:
        raise ValueError(
            f"q, k, v must have one shape (B, S, H, D); got {q.shape}, {k.shape}, {v.shape}"
        )
    if q.dim() != 4:
        raise ValueError(f"q must be (B, S, H, D), got {q.dim()} dimensions")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim, strides {t.stride()}")
    d = q.shape[-1]
    if d & (d - 1) or d < 16:
        raise ValueError(f"head_dim must be a power of two >= 16, got {d}")
    if q[0].numel() >= 2**31:
        raise ValueError(
            f"one batch item of q has {q[0].numel()} elements; the kernel's "
            "in-batch offsets are 32-bit"
        )


def flash_attention_routed(
    q,
    k,
    v,
    dest_ptrs,
    *,
    dest_strides: tuple[int, int, int],
    rows_per_dest: int,
    head_offset: int = 0,
    sm_scale: float | None = None,
    config: dict | None = None,
) -> None:
    """Attention of q, k, v (B, S, H, D) with each output row stored at its destination.

    `dest_ptrs` is an int64 tensor on q's device holding each destination buffer's base
    address (elements of q's dtype, strides `dest_strides` = (batch, token, head) with the
    head_dim contiguous); row m goes to destination m // rows_per_dest.
    """
    _check_inputs(q, k, v)
    batch, seq_len, local_heads, head_dim = q.shape
    if rows_per_dest < 1 or -(-seq_len // rows_per_dest) > dest_ptrs.numel():
        raise ValueError(
            f"rows_per_dest={rows_per_dest} needs {-(-seq_len // max(rows_per_dest, 1))} "
            f"destinations for seq_len={seq_len}, dest_ptrs has {dest_ptrs.numel()}"
        )
    scale = (sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)) * LOG2E
    cfg = launch_config(q, k, v, config, dest_strides)
    if cfg["kernel"] == "ws":
        from xstage_kernels import flash_ws

        flash_ws.launch(
            q,
            k,
            v,
            dest_ptrs,
            dest_strides=dest_strides,
            rows_per_dest=rows_per_dest,
            head_offset=head_offset,
            qk_scale=scale,
        )
        return
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    descs = _descriptors(q, k, v, block_m, block_n) if cfg["tma"] else (q, k, v)
    grid = (triton.cdiv(seq_len, block_m), batch * local_heads)
    _flash_fwd_routed[grid](
        q,
        k,
        v,
        *descs,
        dest_ptrs,
        scale,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *dest_strides,
        seq_len,
        local_heads,
        rows_per_dest,
        head_offset,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        EVEN_SEQ=seq_len % block_m == 0 and seq_len % block_n == 0,
        TMA=cfg["tma"],
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def launch_config(q, k, v, config: dict | None = None, dest_strides=(8, 8, 8)) -> dict:
    """The kernel (ws: flash_ws.py; tl: this file's), block shape, pipelining and load path
    (tma) a call with these inputs uses. A `config` (block sizes) asks for the tl kernel."""
    tma = _use_tma(q, k, v, {**DEFAULT_CONFIG, **(config or {})})
    if tma and not config and warpgroup_mma(q.device) and attention_kernel() == "ws":
        # (imported only here: a Gluon kernel must not be defined under the interpreter)
        from xstage_kernels import flash_ws

        if flash_ws.supports(q, k, v, dest_strides, q.shape[-1]):
            block = {"BLOCK_M": flash_ws.BLOCK_M, "BLOCK_N": flash_ws.BLOCK_N}
            return {"kernel": "ws", **block, "tma": True}
    cfg = {**(DEFAULT_CONFIG if tma else POINTER_CONFIG), **(config or {}), "tma": tma}
    return {"kernel": "tl", **cfg}


def attention_kernel() -> str:
    """'ws' (flash_ws.py where it applies, the default) or 'tl', from the environment."""
    choice = os.environ.get(KERNEL_ENV, "ws")
    if choice not in KERNELS:
        raise ValueError(f"{KERNEL_ENV}={choice!r}: expected one of {', '.join(KERNELS)}")
    return choice


def _use_tma(q, k, v, cfg: dict) -> bool:
    """TMA loads need whole blocks (S a multiple of both block sizes: a block must not run
    into the next batch item) and contiguous (B, S, H, D) inputs, on a GPU that has TMA
    (the interpreter runs them too)."""
    seq_len = q.shape[1]
    if seq_len % cfg["BLOCK_M"] or seq_len % cfg["BLOCK_N"]:
        return False
    return all(t.is_contiguous() for t in (q, k, v)) and tma_available(q)


def _descriptors(q, k, v, block_m: int, block_n: int):
    from triton.tools.tensor_descriptor import TensorDescriptor

    b, s, h, d = q.shape
    shape, strides = [b * s, h * d], [h * d, 1]
    return (
        TensorDescriptor(q, shape, strides, [block_m, d]),
        TensorDescriptor(k, shape, strides, [block_n, d]),
        TensorDescriptor(v, shape, strides, [block_n, d]),
    )


def flash_attention(
    q, k, v, out, *, sm_scale: float | None = None, config: dict | None = None
) -> None:
    """Plain attention into `out` (B, S, H, D): the routed kernel with one destination."""
    import torch

    if out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(
            f"out must match q's shape and dtype with contiguous head_dim; got "
            f"{tuple(out.shape)} {out.dtype} strides {out.stride()}"
        )
    ptrs = torch.tensor([out.data_ptr()], dtype=torch.int64, device=q.device)
    flash_attention_routed(
        q,
        k,
        v,
        ptrs,
        dest_strides=out.stride()[:3],
        rows_per_dest=q.shape[1],
        sm_scale=sm_scale,
        config=config,
    )
