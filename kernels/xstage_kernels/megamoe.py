"""The fused MoE kernel in Triton: one persistent launch per rank, the combine pushed from
the Linear-2 epilogue.

What each program owns: nothing fixed. One program per SM takes tiles from the rank's
tile list (schedule.py) through an atomic counter, in list order, until the list is
exhausted. A Linear-1 tile computes gate and up for 128 intermediate channels of one row
block (128 rows of one expert), applies SwiGLU, quantizes the result (FP8 with a
per-row scale for these 128 channels, or plain bf16) into the intermediate buffer, and
bumps its row block's counter. A Linear-2 tile waits for that counter to reach I/128
(a bounded spin: on timeout it raises the error flag and goes on, so a bug fails the
point instead of hanging the GPU), computes 128 output channels of the row block, and
stores each row straight into its home rank's combine buffer: a per-row element offset
from this rank's output base, so one address computation covers local and peer buffers
(peer memory over NVLink, the X-Stage), with 16-byte vector stores.

Tiling: 128 x 128 output tiles, K steps of 128 channels (64 for bf16) over one weight
scale block each. FP8 products are "promoted" per K step as in DeepGEMM: each step's MMA
result is scaled by its activation and weight scales and added to an fp32 accumulator.
W4A8 weights arrive as 4-bit sign and magnitude (quant.py's packing); each weight's
magnitude and sign are read from their bytes and converted to FP8 in registers (gathered
loads: this kernel is W4A8's fallback, megamoe_ws.py its fast path). W8A8 operands arrive
by TMA (descriptors over the dispatched rows, the intermediate and the weights as 2-D
tensors); a Linear-1 tile fences its generic stores before releasing its row block, and a
Linear-2 tile fences after acquiring it, so that its TMA reads see them.

On a GPU, the FP8 precisions (W8A8, W4A8) run megamoe_ws.py instead: the same contract in
Gluon with a TMA producer warp and two math warpgroups (warp specialization), which `tl`
cannot express. This tl kernel stays for bf16, the EMULATE build, and the interpreter (CPU
tests). XSTAGE_MOE_FP8_KERNEL=tl runs this kernel for W8A8 and W4A8 on a GPU as well (A/B
comparisons); `fp8_kernel()` says which one a launch uses.

Compute emulation (EMULATE, a separate build): every tile's MMA is replaced by a wait on
%globaltimer for the tile's FLOPs at an emulated per-GPU rate (`l1_ns`, `l2_ns` per tile,
from `schedule.emulated_tile_ns`), and the tile stores zeros where it would store its product. The
tile lists, row-block counters and epilogue stores (real bytes into real peer buffers)
are unchanged, so the X-Stage is measured on the real interconnect at compute rates the
GEMMs cannot reach here.

Instrumentation is compiled in only when TRACE is set: per tile, %globaltimer stamps of
when the tile was taken, when its inputs were ready, when its MMA finished, and the start
and end of its epilogue stores (the end after a CTA barrier, so it marks the last warp's
last store issued). The sync buffer is [tile counter, error flag, one counter per row
block] and must be zeroed before every launch.

Device mode (a `layout` given: schedule.device_layout): no tile list is read. A program
claims a list position with the same fetch-add as list mode and finds the tile there from
the layout alone (`decided_tile`), which it writes at that position in `tiles` (the
realized order). No rule reads a clock, so a position's tile is fixed by the layout:
expert_wave's from the first and end block of the wave that holds block position //
(n1 + n2) (`_wave_tile`, two loads a claim, as a list's one); deepgemm_interleaved's and
interleaved's from where each block's first L2 tile sits, the layout's l2_start
(`_counted_tile`, one load of BLOCK_WINDOW blocks' starts a window, walked on from the
program's last claim). interleaved is counted (schedule.counted_tile_at): a block's L2
tiles sit right before the first L1 block that starts lead_rows after it ends, whether or
not the block is released by then, and a program that takes one waits for the release, as
in list mode. (interleaved used to be decided at run time, in units of a block's L1 or L2
tiles opened from the row-block counters into a table; counted took 0.996 of their time on
W8A8, 0.990 on W4A8, geomeans: kernels/ab/2026-12-08-claim-counted-*.) Both modes use the
same sync buffer (`sync_size`).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from xstage_kernels.formats import (
    AMAX_FLOOR,
    FP8_MAX,
    SCALE_BLOCK,
    TRACE_FIELDS,
    check_precision,
    step_major,
)
from xstage_kernels.tma import available as tma_available
from xstage_kernels.tma import warpgroup_mma

BLOCK_M = 128
BLOCK_N = 128
PRECISION_CODE = {"bf16": 0, "w8a8": 1, "w4a8": 2}
BLOCK_K = {"bf16": 64, "w8a8": 128, "w4a8": 128}
NUM_WARPS = 8
# Software-pipeline depth per precision (one H200, DeepSeek-V4 Flash/Pro shapes, 8192-16384
# tokens, 2026-11-30): W8A8 with TMA loads 4 stages (+7-15% over 3 stages of pointer loads);
# bf16 4 (+17%); W4A8, whose nibbles are converted in registers, gains nothing from a fourth.
NUM_STAGES = {"bf16": 4, "w8a8": 4, "w4a8": 3}
PAD_DST = -(2**62)  # row_dst of a padding row: nothing is stored
MAX_SPIN = 4_000_000  # polls of a row-block counter (about a microsecond each) before giving up
SYNC_HEADER = 2  # tile counter, error flag
# Device mode: the rules' ids (schedule.RULE_*, a Schedule's device_rule) and the layout
# they read (schedule.device_layout): a header, then LAYOUT_ROWS rows over the blocks.
CLAIM_RULES = ("expert_wave", "interleaved", "deepgemm_interleaved")
LAYOUT_HEADER = 3  # rule, lead_rows, blocks
LAYOUT_BLOCKS = 2  # the header's block count: the rows after it are that long
LAYOUT_ROWS = 6  # expert, row_start, row_end, wave_end, l2_start, wave_start
BLOCK_WINDOW = 32  # blocks' l2_start entries a program reads with one load (_counted_tile)
FP8_KERNEL_ENV = "XSTAGE_MOE_FP8_KERNEL"
FP8_KERNELS = ("ws", "tl")
FP8_PRECISIONS = ("w8a8", "w4a8")

_PAD_DST = tl.constexpr(PAD_DST)
_AMAX_FLOOR = tl.constexpr(AMAX_FLOOR)
_FP8_MAX = tl.constexpr(FP8_MAX)
_SCALE_BLOCK = tl.constexpr(SCALE_BLOCK)
_TRACE_WIDTH = tl.constexpr(len(TRACE_FIELDS))
_SYNC_HEADER = tl.constexpr(SYNC_HEADER)
_LAYOUT_HEADER = tl.constexpr(LAYOUT_HEADER)
_BLOCK_WINDOW = tl.constexpr(BLOCK_WINDOW)
_RULE_WAVE = tl.constexpr(CLAIM_RULES.index("expert_wave"))
_RULE_DEEPGEMM = tl.constexpr(CLAIM_RULES.index("deepgemm_interleaved"))
_RULE, _BLOCKS = tl.constexpr(0), tl.constexpr(LAYOUT_BLOCKS)
_WAVE_END, _L2_START, _WAVE_START = (tl.constexpr(i) for i in range(3, 6))  # LAYOUT_ROWS
_NO_START = tl.constexpr(2**31 - 1)  # past every list position


@triton.jit
def _now():
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _gemm_tile(
    a_rows,  # [BM, 1] pointers to the first channel of each A row
    a_scales,  # [BM] pointers to each A row's first scale (fp8 precisions)
    w_cols,  # [1, BN] pointers to the first (packed) channel of each weight row
    w_scales,  # scalar pointer to this n block's first weight-block scale
    K,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """fp32 [BM, BN] = A[rows, :K] @ W[cols, :K]^T, block scales applied per K step."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    offs_k = tl.arange(0, BLOCK_K)
    # W4A8 (quant.py): channel c of a block keeps its magnitude in one byte of the block's
    # 64 and its sign in another (channel i of word w, half h: bit 16 h + 4 i of the word
    # for the magnitude, bit 8 i + 7 - 4 h for the sign).
    quad = offs_k % (BLOCK_K // 2)
    half = offs_k // (BLOCK_K // 2)
    magnitude_byte = (quad // 4) * 4 + half * 2 + (quad % 4) // 2
    magnitude_shift = (quad % 2) * 4
    sign_byte = (quad // 4) * 4 + quad % 4
    sign_shift = 7 - 4 * half
    for kb in range(0, K // BLOCK_K):
        k0 = kb * BLOCK_K
        a = tl.load(a_rows + k0 + offs_k[None, :])
        if PRECISION == 0:
            w = tl.load(w_cols + k0 + offs_k[:, None])
            acc = tl.dot(a, w, acc)
        else:
            sa = tl.load(a_scales + kb)
            sw = tl.load(w_scales + kb)
            if PRECISION == 1:
                w = tl.load(w_cols + k0 + offs_k[:, None])
                step = tl.dot(a, w)
            else:
                packed = w_cols + kb * (BLOCK_K // 2)
                magnitude = tl.load(packed + magnitude_byte[:, None]).to(tl.int32)
                magnitude = (magnitude >> magnitude_shift[:, None]) & 7
                negative = tl.load(packed + sign_byte[:, None]).to(tl.int32)
                negative = (negative >> sign_shift[:, None]) & 1
                w = tl.where(negative != 0, -magnitude, magnitude).to(tl.float16)
                step = tl.dot(a, w.to(tl.float8e4nv))
            acc += step * (sa[:, None] * sw)
    return acc


@triton.jit
def _w8a8_tile_tma(
    a_desc,  # TMA descriptor over A (rows, K), 128 x 128 blocks
    a_row,  # first row of this row block
    a_scales,  # [BM] pointers to each A row's first scale
    w_desc,  # TMA descriptor over the weights as (experts * N, K), 128 x 128 blocks
    w_row,  # first weight row of this n block
    w_scales,  # scalar pointer to this n block's first weight-block scale
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """_gemm_tile for W8A8 with both operands loaded by TMA (same promotion per K step)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, K // BLOCK_K):
        a = a_desc.load([a_row, kb * BLOCK_K])
        w = w_desc.load([w_row, kb * BLOCK_K])
        sa = tl.load(a_scales + kb)
        sw = tl.load(w_scales + kb)
        acc += tl.dot(a, w.T) * (sa[:, None] * sw)
    return acc


@triton.jit
def _fence_proxy_async():
    """Order this thread's generic-proxy memory operations before its later TMA (async
    proxy) ones: Linear-2 reads by TMA an intermediate that Linear-1 tiles stored."""
    tl.inline_asm_elementwise(
        "fence.proxy.async.global; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _spin(ns):
    """Busy-wait `ns` nanoseconds of %globaltimer: an emulated MMA."""
    start = _now()
    now = start
    while now - start < ns:
        now = _now()


@triton.jit
def _stamp(trace_ptr, idx, pid, taken, ready, mma_done, store_start, store_end):
    base = trace_ptr + idx.to(tl.int64) * _TRACE_WIDTH
    tl.store(base + 0, pid.to(tl.int64))
    tl.store(base + 1, taken)
    tl.store(base + 2, ready)
    tl.store(base + 3, mma_done)
    tl.store(base + 4, store_start)
    tl.store(base + 5, store_end)


@triton.jit
def _l2_listed(into, l1_left, n2, alternate):
    """schedule._l2_listed: a block's L2 tiles among the `into` positions from its first,
    every other one while L1 tiles are left (alternate: deepgemm_interleaved) or all at
    once (interleaved counted)."""
    return tl.minimum(n2, tl.where(alternate, tl.maximum((into + 1) // 2, into - l1_left), into))


@triton.jit
def _counted_tile(p, layout_ptr, n_tiles, n1, n2, base, lanes, alternate):
    """The tile at position p of a rule that lists each block's L2 tiles from the layout's
    l2_start: deepgemm_interleaved's (alternate) or interleaved's (counted)
    (schedule.counted_tile_at, which this mirrors); (kind, block, n block, and the walk's
    `base` after: the last block whose first L2 tile is at or before p, a window of
    BLOCK_WINDOW blocks a load from the last one)."""
    blocks = tl.load(layout_ptr + _BLOCKS)
    starts_ptr = layout_ptr + _LAYOUT_HEADER + _L2_START * blocks
    at_or_before = _BLOCK_WINDOW
    while at_or_before == _BLOCK_WINDOW:
        block = base + lanes
        starts = tl.load(starts_ptr + block, mask=block < blocks, other=_NO_START)
        at_or_before = tl.sum((starts <= p).to(tl.int32))
        base += tl.where(at_or_before == _BLOCK_WINDOW, _BLOCK_WINDOW, 0)
    b = base + at_or_before - 1  # -1: before the first L2 tile
    start = tl.load(starts_ptr + b, mask=(b >= 0) & (p < n_tiles), other=0)
    into = p - start
    l1_left = blocks * n1 - (start - b * n2)
    l2_before = _l2_listed(into, l1_left, n2, alternate)
    l2 = (b >= 0) & (_l2_listed(into + 1, l1_left, n2, alternate) > l2_before)
    l1_before = p - tl.where(b >= 0, b * n2 + l2_before, 0)
    blk = tl.where(l2, b, l1_before // n1)
    nb = tl.where(l2, l2_before, l1_before % n1)
    return l2.to(tl.int32), blk, nb, tl.maximum(b, 0)


@triton.jit
def _wave_tile(p, layout_ptr, n_tiles, n1, n2):
    """expert_wave's tile at position p (schedule.wave_tile_at, which this mirrors): (kind,
    block, n block). A wave lists whole blocks, n1 + n2 tiles each, so block p // (n1 + n2)
    lies in p's wave: its wave's first and end block (two independent loads, where a list
    costs one) place p among the wave's L1 tiles, block by block, or its L2 tiles after
    them. Through a unit table (since removed) expert waves took 1.7-2.9% more kernel time
    than their list; this way 1.0-1.2% (one H100, one H200:
    kernels/ab/2026-12-07-*-wave-layout.json)."""
    rows = layout_ptr + _LAYOUT_HEADER
    blocks = tl.load(layout_ptr + _BLOCKS)
    inside = p < n_tiles
    b = p // (n1 + n2)
    start = tl.load(rows + _WAVE_START * blocks + b, mask=inside, other=0)
    end = tl.load(rows + _WAVE_END * blocks + b, mask=inside, other=0)
    into = p - start * (n1 + n2)
    l1_listed = (end - start) * n1
    l2 = into >= l1_listed
    into_kind = tl.where(l2, into - l1_listed, into)
    width = tl.where(l2, n2, n1)
    return l2.to(tl.int32), start + into_kind // width, into_kind % width


@triton.jit
def decided_tile(p, layout_ptr, n_tiles, n1, n2, walk, lanes):
    """Device mode: the tile at list position p, claimed with the list's fetch-add, from the
    layout alone; (kind, local expert, row block, n block, walk).
    n1, n2: L1 and L2 tiles a block; walk: the block where the program's last claim left its
    walk (_counted_tile), 0 at its first (its positions only grow); lanes:
    arange(0, BLOCK_WINDOW) in the caller's layout."""
    rule = tl.load(layout_ptr + _RULE)
    if rule == _RULE_DEEPGEMM:
        kind, blk, nb, walk = _counted_tile(p, layout_ptr, n_tiles, n1, n2, walk, lanes, True)
    elif rule == _RULE_WAVE:
        kind, blk, nb = _wave_tile(p, layout_ptr, n_tiles, n1, n2)
    else:  # interleaved, counted
        kind, blk, nb, walk = _counted_tile(p, layout_ptr, n_tiles, n1, n2, walk, lanes, False)
    e = tl.load(layout_ptr + _LAYOUT_HEADER + blk, mask=p < n_tiles, other=0)
    return kind, e, blk, nb, walk


@triton.jit
def _take_decided(idx, tiles_ptr, n_tiles, layout_ptr, n1, n2, walk, lanes):
    """Device mode: the tile at claimed position idx, written at that position, the
    realized order; (position, kind, expert as int64, block, n block, walk)."""
    kind, e, blk, nb, walk = decided_tile(idx, layout_ptr, n_tiles, n1, n2, walk, lanes)
    claimed = idx < n_tiles
    tl.store(tiles_ptr + idx * 4, kind, mask=claimed)
    tl.store(tiles_ptr + idx * 4 + 1, e, mask=claimed)
    tl.store(tiles_ptr + idx * 4 + 2, blk, mask=claimed)
    tl.store(tiles_ptr + idx * 4 + 3, nb, mask=claimed)
    return idx, kind, e.to(tl.int64), blk, nb, walk


@triton.jit(do_not_specialize=["n_tiles", "max_spin", "l1_ns", "l2_ns"])
def _fused_moe(
    tiles_ptr,  # int32 [n_tiles, 4]: kind, local expert, row block, n block (DEVICE: written)
    n_tiles,
    sync_ptr,  # int32 [2 + blocks] (sync_size(blocks)), zeroed before the launch
    x_ptr,  # dispatched activations [rows, H] (fp8 or bf16)
    xs_ptr,  # their scales [rows, H/128] (fp8 precisions)
    w1_ptr,  # [E_local, 2I, H] gate rows then up rows (fp8, bf16, or packed int4 [.., H/2])
    s1_ptr,  # [E_local, 2I/128, H/128]
    w2_ptr,  # [E_local, H, I] (or packed [.., I/2])
    s2_ptr,  # [E_local, H/128, I/128]
    h_ptr,  # intermediate [rows, I]
    hs_ptr,  # its scales [rows, I/128]
    out_ptr,  # this rank's output base (bf16); row_dst offsets are relative to it
    row_dst_ptr,  # int64 [rows]: element offset of each row's destination, or PAD_DST
    trace_ptr,  # int64 [n_tiles, len(TRACE_FIELDS)] when TRACE
    layout_ptr,  # int32 schedule.device_layout when DEVICE, else None
    x_desc,  # TMA descriptors (TMA only): x, w1 as (E_local * 2I, H), h, w2 as (E_local * H, I)
    w1_desc,
    h_desc,
    w2_desc,
    H,
    I,  # noqa: E741 (the paper's name for the expert width)
    max_spin,
    l1_ns,  # EMULATE: the wait that stands for a Linear-1 tile's MMA
    l2_ns,  # EMULATE: the same for a Linear-2 tile
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    TRACE: tl.constexpr,
    EMULATE: tl.constexpr,
    TMA: tl.constexpr,
    PROXY_FENCE: tl.constexpr,  # TMA on a GPU (the interpreter has no proxies to order)
    DEVICE: tl.constexpr,  # each claimed position's tile decided (decided_tile), no list read
):
    pid = tl.program_id(0)
    PACK: tl.constexpr = 2 if PRECISION == 2 else 1  # channels per stored weight element
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    if DEVICE:
        n1 = I // BLOCK_N  # L1 tiles a block
        n2 = H // BLOCK_N
        lanes = tl.arange(0, _BLOCK_WINDOW)
        walk = 0
        # The layout's block count, written on the device: one graph serves any routing.
        n_tiles = tl.load(layout_ptr + _BLOCKS) * (n1 + n2)
    idx = tl.atomic_add(sync_ptr, 1)
    if DEVICE:
        idx, kind, e, blk, nb, walk = _take_decided(
            idx, tiles_ptr, n_tiles, layout_ptr, n1, n2, walk, lanes
        )
    while idx < n_tiles:
        taken = _now() if TRACE else 0
        if not DEVICE:
            kind = tl.load(tiles_ptr + idx * 4)
            e = tl.load(tiles_ptr + idx * 4 + 1).to(tl.int64)
            blk = tl.load(tiles_ptr + idx * 4 + 2)
            nb = tl.load(tiles_ptr + idx * 4 + 3)
        rows = blk.to(tl.int64) * BLOCK_M + offs_m
        cols = nb * BLOCK_N + offs_n
        if kind == 0:
            # Linear-1: gate and up for intermediate channels [nb*BN, nb*BN + BN).
            a_rows = x_ptr + rows[:, None] * H
            a_scales = xs_ptr + rows * (H // _SCALE_BLOCK)
            w_rows = w1_ptr + e * (2 * I) * (H // PACK)
            s_rows = s1_ptr + e * (2 * I // _SCALE_BLOCK) * (H // _SCALE_BLOCK)
            if EMULATE:
                _spin(l1_ns)
                gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                up = gate
            elif TMA:
                row0 = (blk * BLOCK_M).to(tl.int32)
                w_row = (e * 2 * I + nb * BLOCK_N).to(tl.int32)
                gate = _w8a8_tile_tma(
                    x_desc,
                    row0,
                    a_scales,
                    w1_desc,
                    w_row,
                    s_rows + nb * (H // _SCALE_BLOCK),
                    H,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                )
                up = _w8a8_tile_tma(
                    x_desc,
                    row0,
                    a_scales,
                    w1_desc,
                    w_row + I,
                    s_rows + (I // _SCALE_BLOCK + nb) * (H // _SCALE_BLOCK),
                    H,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                )
            else:
                gate = _gemm_tile(
                    a_rows,
                    a_scales,
                    w_rows + cols[None, :].to(tl.int64) * (H // PACK),
                    s_rows + nb * (H // _SCALE_BLOCK),
                    H,
                    PRECISION,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                )
                up = _gemm_tile(
                    a_rows,
                    a_scales,
                    w_rows + (I + cols[None, :]).to(tl.int64) * (H // PACK),
                    s_rows + (I // _SCALE_BLOCK + nb) * (H // _SCALE_BLOCK),
                    H,
                    PRECISION,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                )
            mma_done = _now() if TRACE else 0
            h = gate * tl.sigmoid(gate) * up
            h_ptrs = h_ptr + rows[:, None] * I + cols[None, :]
            store_start = _now() if TRACE else 0
            if PRECISION == 0:
                tl.store(h_ptrs, h.to(tl.bfloat16))
            else:
                amax = tl.maximum(tl.max(tl.abs(h), axis=1), _AMAX_FLOOR)
                scale = amax / _FP8_MAX
                tl.store(h_ptrs, tl.math.div_rn(h, scale[:, None]).to(tl.float8e4nv))
                tl.store(hs_ptr + rows * (I // _SCALE_BLOCK) + nb, scale)
            if PROXY_FENCE:
                _fence_proxy_async()
            # Every warp's stores are issued before one thread releases the row block.
            tl.debug_barrier()
            tl.atomic_add(sync_ptr + 2 + blk, 1, sem="release")
            if TRACE:
                _stamp(trace_ptr, idx, pid, taken, taken, mma_done, store_start, _now())
        else:
            # Linear-2: wait until every Linear-1 tile of this row block has released it.
            need = I // BLOCK_N
            done = tl.atomic_add(sync_ptr + 2 + blk, 0, sem="acquire")
            spins = 0
            while (done < need) & (spins < max_spin):
                done = tl.atomic_add(sync_ptr + 2 + blk, 0, sem="acquire")
                spins += 1
            if done < need:
                tl.atomic_xchg(sync_ptr + 1, 1)
            ready = _now() if TRACE else 0
            if EMULATE:
                _spin(l2_ns)
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            elif TMA:
                if PROXY_FENCE:
                    _fence_proxy_async()
                acc = _w8a8_tile_tma(
                    h_desc,
                    (blk * BLOCK_M).to(tl.int32),
                    hs_ptr + rows * (I // _SCALE_BLOCK),
                    w2_desc,
                    (e * H + nb * BLOCK_N).to(tl.int32),
                    s2_ptr + (e * (H // _SCALE_BLOCK) + nb) * (I // _SCALE_BLOCK),
                    I,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                )
            else:
                acc = _gemm_tile(
                    h_ptr + rows[:, None] * I,
                    hs_ptr + rows * (I // _SCALE_BLOCK),
                    w2_ptr + e * H * (I // PACK) + cols[None, :].to(tl.int64) * (I // PACK),
                    s2_ptr + (e * (H // _SCALE_BLOCK) + nb) * (I // _SCALE_BLOCK),
                    I,
                    PRECISION,
                    BLOCK_M,
                    BLOCK_N,
                    BLOCK_K,
                )
            mma_done = _now() if TRACE else 0
            # Combine push: row r goes to out_ptr + row_dst[r] (its home rank's slot).
            dst = tl.load(row_dst_ptr + rows)
            valid = dst != _PAD_DST
            dst = tl.multiple_of(tl.where(valid, dst, 0), 8)  # 16-byte aligned rows
            y = acc.to(tl.bfloat16)
            store_start = _now() if TRACE else 0
            tl.store(out_ptr + dst[:, None] + cols[None, :], y, mask=valid[:, None])
            if TRACE:
                tl.debug_barrier()
                _stamp(trace_ptr, idx, pid, taken, ready, mma_done, store_start, _now())
        idx = tl.atomic_add(sync_ptr, 1)
        if DEVICE:
            idx, kind, e, blk, nb, walk = _take_decided(
                idx, tiles_ptr, n_tiles, layout_ptr, n1, n2, walk, lanes
            )


def launch(
    *,
    precision: str,
    tiles,
    sync,
    x,
    xs,
    w1,
    s1,
    w2,
    s2,
    h,
    hs,
    out,
    row_dst,
    H: int,
    I: int,  # noqa: E741
    num_programs: int,
    trace=None,
    max_spin: int = MAX_SPIN,
    emulate_ns: tuple[int, int] | None = None,
    xs_steps=None,
    layout=None,
) -> None:
    """Enqueue one fused launch on the current device and stream (tensors on that device,
    except the peer buffers that row_dst reaches). `sync` must be zeroed beforehand.
    emulate_ns: (Linear-1, Linear-2) waits per tile that replace the MMAs (EMULATE).
    xs_steps: xs step-major (formats.step_major), which the warp-specialized kernel
    reads; made here when not given (a copy each launch: callers that time keep one).
    layout: device mode (see the module doc): schedule.device_layout's int32 array on the
    device; `tiles` is then the (blocks (H + I) / 128, 4) int32 buffer the kernel writes
    the realized order into, and `sync` holds sync_size(blocks) int32 for the most blocks
    the layout holds."""
    check_precision(precision)
    if H % BLOCK_N or I % BLOCK_N:
        raise ValueError(f"H={H} and I={I} must be multiples of {BLOCK_N}")
    if tiles.ndim != 2 or tiles.shape[1] != 4:
        raise ValueError(f"tiles must be (n, 4) int32, got {tuple(tiles.shape)}")
    if layout is not None:
        check_device_mode(layout, tiles, sync, H, I)
    if out.element_size() != 2 or out.data_ptr() % 16:
        raise ValueError("out must be a 16-byte aligned bf16 buffer")
    on_gpu = x.device.type == "cuda"
    if uses_ws_kernel(precision, x) and emulate_ns is None:
        from xstage_kernels import megamoe_ws

        if xs_steps is None:
            xs_steps = step_major(xs)
        megamoe_ws.launch(
            precision=precision,
            num_programs=num_programs,
            trace=trace,
            tiles=tiles,
            sync=sync,
            xs=xs,
            s1=s1,
            s2=s2,
            h=h,
            hs=hs,
            out=out,
            row_dst=row_dst,
            descs=megamoe_ws.descriptors(x, w1, h, w2, H, I, precision, scales=(xs_steps, hs)),
            H=H,
            I=I,
            max_spin=max_spin,
            R=x.shape[0],
            layout=layout,
        )
        return
    tma = precision == "w8a8" and emulate_ns is None and tma_available(x)
    descs = _descriptors(x, w1, h, w2, H, I) if tma else (row_dst,) * 4
    _fused_moe[(num_programs,)](
        tiles,
        tiles.shape[0],
        sync,
        x,
        xs,
        w1,
        s1,
        w2,
        s2,
        h,
        hs,
        out,
        row_dst,
        trace if trace is not None else row_dst,
        layout,
        *descs,
        H,
        I,
        max_spin,
        *(emulate_ns or (0, 0)),
        PRECISION=PRECISION_CODE[precision],
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_K=BLOCK_K[precision],
        TRACE=trace is not None,
        EMULATE=emulate_ns is not None,
        TMA=tma,
        PROXY_FENCE=tma and on_gpu,
        DEVICE=layout is not None,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES[precision],
    )


def sync_size(blocks: int) -> int:
    """int32 words of a sync buffer for `blocks` row blocks, either mode: the header (tile
    counter, error flag) and one counter per row block."""
    return SYNC_HEADER + blocks


def check_device_mode(layout, tiles, sync, H: int, I: int) -> None:  # noqa: E741
    """A device-mode launch's buffers agree, for the most blocks the layout has room for
    (from its size, so no copy from the device): the tile buffer's rows and the sync
    buffer's size. The kernel reads the block count from the layout's header, which a
    layout built on the device (xstage_kernels.layout) fills in at run time."""
    if layout.ndim != 1 or layout.element_size() != 4 or layout.is_floating_point():
        raise ValueError(f"layout must be 1-D int32, got {layout.dtype} {tuple(layout.shape)}")
    capacity, rest = divmod(layout.numel() - LAYOUT_HEADER, LAYOUT_ROWS)
    if capacity < 0 or rest:
        raise ValueError(f"a layout holds {LAYOUT_HEADER} + {LAYOUT_ROWS} * blocks int32")
    if tiles.shape[0] < capacity * (H + I) // BLOCK_N:
        raise ValueError(
            f"tiles must have {capacity * (H + I) // BLOCK_N} rows for {capacity} blocks"
        )
    if sync.numel() < sync_size(capacity):
        raise ValueError(f"device mode needs a sync buffer of {sync_size(capacity)} int32")


def fp8_kernel() -> str:
    """'ws' (megamoe_ws.py, the default on a GPU) or 'tl' (this file), from the environment."""
    choice = os.environ.get(FP8_KERNEL_ENV, "ws")
    if choice not in FP8_KERNELS:
        raise ValueError(f"{FP8_KERNEL_ENV}={choice!r}: expected one of {', '.join(FP8_KERNELS)}")
    return choice


def uses_ws_kernel(precision: str, x) -> bool:
    """Whether a launch of this precision on x's device runs megamoe_ws.py (not EMULATE):
    W8A8 and W4A8 on a Hopper GPU; elsewhere this file's kernel."""
    return (
        precision in FP8_PRECISIONS
        and x.device.type == "cuda"
        and warpgroup_mma(x.device)
        and fp8_kernel() == "ws"
    )


def rounds_gate_bf16(precision: str, x) -> bool:
    """Whether a launch of this precision on x's device rounds gate to bf16 before SwiGLU
    (megamoe_ws.GATE_BF16, its W4A8 build): a rounding the reference applies too."""
    if not uses_ws_kernel(precision, x):
        return False
    from xstage_kernels import megamoe_ws

    return megamoe_ws.holds_gate_bf16(precision)


def _descriptors(x, w1, h, w2, H: int, I: int):  # noqa: E741
    """TMA descriptors of 128 x 128 blocks over the W8A8 operands, weights as 2-D."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    experts = w1.shape[0]
    block = [BLOCK_M, BLOCK_K["w8a8"]]
    return (
        TensorDescriptor(x, [x.shape[0], H], [H, 1], block),
        TensorDescriptor(w1, [experts * 2 * I, H], [H, 1], [BLOCK_N, BLOCK_K["w8a8"]]),
        TensorDescriptor(h, [h.shape[0], I], [I, 1], block),
        TensorDescriptor(w2, [experts * H, I], [I, 1], [BLOCK_N, BLOCK_K["w8a8"]]),
    )
