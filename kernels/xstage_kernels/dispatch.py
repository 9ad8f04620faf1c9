"""A MoE layer's dispatch on the GPU, with no host sync: count rows per expert, then copy
every routed row into its expert's padded block.

Why on the device: so that the whole layer (dispatch, the layout kernel, the fused MoE
kernel, the top-k reduction) is one CUDA graph, captured once and replayed for any
routing, and so that the dispatch is inside the timed layer, as it is in the timed calls
of FlashInfer's and DeepGEMM's MoE layers. Until now the problem's builder dispatched once
on the host (layer/problem.py `_dispatch`, routing.dispatch_plan).

The layout is routing.dispatch_plan's: the rows (token t, choice k) of local expert e are
expert-major, each expert's rows padded to a multiple of BLOCK_M, so a row block belongs to
one expert; a padding row has destination PAD_DST, so whatever its activations and scales
hold is never stored: the GEMMs are row-local (row r of each product reads row r of its
input only), and the host plan's zeros there are not rewritten on every forward. At 1024
tokens over many experts the padding outnumbers the routed rows several times (Qwen3.5,
512 experts: about 20 rows an expert, 108 of padding a block); zeroing it took most of
the gather's time on an H100 (117 of 133 us of the whole dispatch).

count_rows, then the layout kernel (xstage_kernels.layout), then gather_rows, in stream
order:

count_rows   three launches, no atomics, so the same routing always gives the same rows,
             in the host plan's order (token, then choice, within an expert): the layer is
             checked row for row against the host's dispatch, and its timing does not
             depend on which atomic landed first. A program of BLOCK_COUNT pairs gives each
             pair its place among its expert's pairs in the program (a BLOCK_COUNT^2
             comparison in registers) and writes its per-expert counts (a histogram) as
             one row of a scratch matrix; a prefix sum down each expert's column turns the
             rows into the pairs of that expert in earlier programs, and the column's total
             into its count; a last pass adds that to each pair's place.
gather_rows  one launch, two kinds of program. A pair program copies BLOCK_P routed rows
             (activations, scales) from their home tokens to row expert_row0[e] + rank and
             writes their destinations; a padding program takes one BLOCK_M row block and
             writes PAD_DST as the destination of its rows past the block's valid count.
             The two write disjoint rows, so they need no order between them. Blocks at or
             past the layout's block count are left alone (nothing reads them).

Which rows of a block are padding: its valid row count is row_end - row_start of the
layout (schedule.device_layout: header rule, lead_rows, blocks, then the rows expert,
row_start, row_end, ... each `blocks` long), the same fields the fused kernel reads. The
per-expert counts alone would need a search over experts per block; the layout has it.

The copy is raw words: activations (fp8 or bf16) and scales are viewed as int32, a row of
H channels is H/4 (fp8) or H/2 (bf16) words, a multiple of 32 since H is a multiple of 128,
so a program's tile is BLOCK_P rows of a BLOCK_W-word chunk that divides the row (no mask
along the row) and moves as 16-byte vectors (Triton specializes on 16-byte aligned
pointers and a row stride divisible by 16). Row offsets are int64: T * topk * H passes
2^31. A token's topk rows are neighbouring pairs, so one program reads each home token
topk times in a row and all but the first hit L2: HBM sees about T * H bytes read and
pairs * H written (FP8).
"""

from __future__ import annotations

import triton
import triton.language as tl

from xstage_kernels.layout import capacity_blocks
from xstage_kernels.megamoe import BLOCK_M, LAYOUT_HEADER, LAYOUT_ROWS, PAD_DST
from xstage_kernels.tensor_args import check_tensor, same_device

BLOCK_COUNT = 128  # pairs per count_rows program (a BLOCK_COUNT^2 comparison, in registers)
SCAN_BLOCKS, SCAN_EXPERTS = 64, 32  # the prefix sum's tile: blocks down, experts across
TILE = 4096  # int32 words a gather program moves per step (16 KiB)
BLOCK_W_CHOICES = (512, 256, 128, 64, 32)  # words; every H % 128 == 0 row has one dividing it
NUM_WARPS = 4
LAYOUT_BLOCKS = 2  # the header field (schedule.LAYOUT_HEADER) holding the block count
ROW_START, ROW_END = 1, 2  # the layout rows (schedule.LAYOUT_ROWS) holding a block's rows

_BLOCK_M = tl.constexpr(BLOCK_M)
_LAYOUT_HEADER = tl.constexpr(LAYOUT_HEADER)
_LAYOUT_BLOCKS = tl.constexpr(LAYOUT_BLOCKS)
_ROW_START = tl.constexpr(ROW_START)
_ROW_END = tl.constexpr(ROW_END)

KERNELS = ("count", "scan", "place", "gather")  # compile_for_sm90's names
__all__ = ["PAD_DST", "capacity_rows", "count_rows", "gather_rows"]


@triton.jit
def _count_block(ids_ptr, rank_ptr, held_ptr, N, E, BLOCK: tl.constexpr, BINS: tl.constexpr):
    """One block of BLOCK pairs: each pair's place among its expert's pairs in the block
    (rank), and the block's pairs per expert (its row of `held`)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < N
    e = tl.load(ids_ptr + offs, mask=inside, other=-1).to(tl.int32)
    routed = (e >= 0) & (e < E)
    lane = tl.arange(0, BLOCK)
    # same[i, j]: pairs i and j go to the same expert.
    same = (e[:, None] == e[None, :]) & routed[:, None] & routed[None, :]
    before = tl.sum((same & (lane[None, :] < lane[:, None])).to(tl.int32), axis=1)
    tl.store(rank_ptr + offs, tl.where(routed, before, -1), mask=inside)
    held = tl.histogram(tl.where(routed, e, E), BINS)  # bin E: the pairs routed elsewhere
    bins = tl.arange(0, BINS)
    tl.store(held_ptr + pid.to(tl.int64) * E + bins, held, mask=bins < E)


@triton.jit
def _scan_blocks(held_ptr, counts_ptr, blocks, E, BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr):
    """Per expert, down the blocks: `held` becomes the pairs of that expert in the blocks
    before (an exclusive prefix sum), and counts its total."""
    experts = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    mine = experts < E
    carry = tl.zeros([BLOCK_E], dtype=tl.int32)
    for b0 in range(0, blocks, BLOCK_B):
        b = b0 + tl.arange(0, BLOCK_B)
        at = held_ptr + b.to(tl.int64)[:, None] * E + experts[None, :]
        on = (b < blocks)[:, None] & mine[None, :]
        held = tl.load(at, mask=on, other=0)
        tl.store(at, tl.cumsum(held, axis=0) - held + carry[None, :], mask=on)
        carry += tl.sum(held, axis=0)
    tl.store(counts_ptr + experts, carry, mask=mine)


@triton.jit
def _place_pairs(ids_ptr, rank_ptr, held_ptr, N, E, BLOCK: tl.constexpr):
    """Each pair's place among all its expert's pairs: its place in its block plus the
    pairs of its expert in the blocks before."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    e = tl.load(ids_ptr + offs, mask=offs < N, other=-1).to(tl.int32)
    routed = (e >= 0) & (e < E)
    before = tl.load(held_ptr + (offs // BLOCK) * E + e, mask=routed, other=0)
    tl.store(rank_ptr + offs, tl.load(rank_ptr + offs, mask=routed) + before, mask=routed)


@triton.jit
def _gather_rows(
    ids_ptr,  # (N,) int32/int64 local expert of pair i = t * TOPK + k, or -1
    rank_ptr,  # (N,) int32 pair i's row within its expert (count_rows)
    row0_ptr,  # (E,) int32 first padded row of each expert
    layout_ptr,  # int32 schedule layout: header, then rows over `blocks` blocks
    xh_ptr,  # (T, W) int32 words of the home tokens' activations
    xsh_ptr,  # (T, S) int32 words of their scales (HAS_XS)
    x_ptr,  # (rows, W) int32 words of the dispatched activations
    xs_ptr,  # (rows, S) int32 words of their scales (HAS_XS), at strides xs_row, xs_col
    dst_ptr,  # (rows,) int64 destination element offset of each row
    tdst_ptr,  # (T,) int64 base destination offset of each home token
    N,
    E,
    W,
    S,
    H,
    pair_programs,
    pad_dst,
    xs_row,  # xs's strides in words: S, 1 row-major; 1, rows step-major (formats.step_major)
    xs_col,
    TOPK: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HAS_XS: tl.constexpr,
):
    pid = tl.program_id(0)
    words = tl.arange(0, BLOCK_W)
    scales = tl.arange(0, BLOCK_S)
    if pid < pair_programs:
        pair = pid.to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
        e = tl.load(ids_ptr + pair, mask=pair < N, other=-1).to(tl.int32)
        routed = (e >= 0) & (e < E)
        row = tl.load(row0_ptr + e, mask=routed, other=0).to(tl.int64)
        row += tl.load(rank_ptr + pair, mask=routed, other=0).to(tl.int64)
        token = pair // TOPK
        on = routed[:, None]
        src = xh_ptr + token[:, None] * W + words[None, :]
        dst = x_ptr + row[:, None] * W + words[None, :]
        for w0 in range(0, W, BLOCK_W):  # BLOCK_W divides W: only rows are masked
            tl.store(dst + w0, tl.load(src + w0, mask=on), mask=on)
        if HAS_XS:
            on_s = on & (scales[None, :] < S)
            v = tl.load(xsh_ptr + token[:, None] * S + scales[None, :], mask=on_s)
            tl.store(xs_ptr + row[:, None] * xs_row + scales[None, :] * xs_col, v, mask=on_s)
        base = tl.load(tdst_ptr + token, mask=routed, other=0)
        tl.store(dst_ptr + row, base + pair * H, mask=routed)
    else:
        block = pid - pair_programs
        blocks = tl.load(layout_ptr + _LAYOUT_BLOCKS)
        if block < blocks:
            fields = layout_ptr + _LAYOUT_HEADER + block
            valid = tl.load(fields + _ROW_END * blocks) - tl.load(fields + _ROW_START * blocks)
            first = block.to(tl.int64) * _BLOCK_M
            lane = tl.arange(0, _BLOCK_M)
            pad = lane >= valid
            tl.store(dst_ptr + first + lane, tl.zeros([_BLOCK_M], tl.int64) + pad_dst, mask=pad)


def capacity_rows(pairs: int, experts: int) -> int:
    """Padded rows `pairs` routed rows over `experts` experts can need, at most: the layout's
    most row blocks (layout.capacity_blocks), each BLOCK_M rows."""
    return capacity_blocks(pairs, experts) * BLOCK_M


def count_scratch(pairs: int, experts: int) -> tuple[int, int]:
    """The shape of count_rows' int32 scratch: one row of per-expert counts a block."""
    return triton.cdiv(pairs, BLOCK_COUNT), experts


def count_rows(expert_ids, counts, rank, held) -> None:
    """Enqueue the per-expert row count and each pair's rank among its expert's rows.

    expert_ids: (N,) int32 or int64, pair i = t * topk + k's local expert, or -1 (not
    routed to this rank; an id >= E is dropped the same way). counts: (E,) int32, out:
    routed rows per expert. rank: (N,) int32, out: pair i's index among its expert's rows
    in pair order (the host plan's: token, then choice), -1 for a dropped pair. held:
    int32 scratch of count_scratch(N, E). Three launches, no atomics: the same routing
    always gives the same rows (see the module doc).
    """
    import torch

    check_tensor(expert_ids, "expert_ids", (torch.int32, torch.int64), ndim=1)
    check_tensor(counts, "counts", (torch.int32,), ndim=1)
    check_tensor(rank, "rank", (torch.int32,), shape=tuple(expert_ids.shape))
    N, E = expert_ids.numel(), counts.numel()
    check_tensor(held, "held", (torch.int32,), shape=count_scratch(N, E))
    same_device(expert_ids, counts=counts, rank=rank, held=held)
    blocks = held.shape[0]
    if N == 0 or E == 0:
        counts.zero_()
        return
    _count_block[(blocks,)](
        expert_ids,
        rank,
        held,
        N,
        E,
        BLOCK=BLOCK_COUNT,
        BINS=triton.next_power_of_2(E + 1),
        num_warps=NUM_WARPS,
    )
    _scan_blocks[(triton.cdiv(E, SCAN_EXPERTS),)](
        held, counts, blocks, E, BLOCK_B=SCAN_BLOCKS, BLOCK_E=SCAN_EXPERTS, num_warps=NUM_WARPS
    )
    _place_pairs[(blocks,)](expert_ids, rank, held, N, E, BLOCK=BLOCK_COUNT, num_warps=NUM_WARPS)


def tile(words: int) -> tuple[int, int]:
    """(BLOCK_P, BLOCK_W): rows and words of a gather step for rows of `words` int32."""
    for block_w in BLOCK_W_CHOICES:
        if words % block_w == 0:
            return TILE // block_w, block_w
    raise ValueError(f"a row of {words} int32 words has no 32-word chunk")


def gather_rows(
    expert_ids,
    rank,
    expert_row0,
    layout,
    x_home,
    xs_home,
    x,
    xs,
    row_dst,
    token_dst,
    *,
    topk: int,
    pad_dst: int,
) -> None:
    """Enqueue the dispatched rows' copy and the padding's destinations (module doc).

    For every routed pair i (e = expert_ids[i] in [0, E)): row r = expert_row0[e] + rank[i]
    gets x[r] = x_home[i // topk], xs[r] = xs_home[i // topk] and row_dst[r] =
    token_dst[i // topk] + i * H. Every padding row r < blocks * BLOCK_M (blocks from the
    layout's header on the device; a block's padding rows are those past its row_end -
    row_start valid rows) gets row_dst[r] = pad_dst; its x and xs are left as they are.
    Rows at or past blocks * BLOCK_M are not touched.

    x_home: (T, H) fp8 e4m3 or bf16, H % 128 == 0; xs_home: (T, H / 128) float32, or None
    (then xs is None too); x: (rows, H) x_home's dtype, rows >= capacity_rows(N, E); xs:
    (rows, H / 128) float32; row_dst: (rows,) int64; token_dst: (T,) int64; expert_row0:
    (E,) int32; layout: 1-D int32 in schedule.device_layout's format; N = T * topk.
    """
    import torch

    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    check_tensor(x_home, "x_home", (torch.float8_e4m3fn, torch.bfloat16), ndim=2)
    T, H = x_home.shape
    if H % 128:
        raise ValueError(f"x_home's H must be a multiple of 128, got {H}")
    N = T * topk
    check_tensor(expert_ids, "expert_ids", (torch.int32, torch.int64), shape=(N,))
    check_tensor(rank, "rank", (torch.int32,), shape=(N,))
    check_tensor(expert_row0, "expert_row0", (torch.int32,), ndim=1)
    check_tensor(layout, "layout", (torch.int32,), ndim=1)
    if layout.numel() < LAYOUT_HEADER or (layout.numel() - LAYOUT_HEADER) % LAYOUT_ROWS:
        raise ValueError(f"layout must hold {LAYOUT_HEADER} + {LAYOUT_ROWS} * blocks int32")
    E = expert_row0.numel()
    rows = capacity_rows(N, E)
    check_tensor(x, "x", (x_home.dtype,), ndim=2)
    if x.shape[1] != H or x.shape[0] < rows:
        raise ValueError(f"x must be (>= {rows}, {H}) for N={N}, E={E}, got {tuple(x.shape)}")
    check_tensor(row_dst, "row_dst", (torch.int64,), shape=(x.shape[0],))
    check_tensor(token_dst, "token_dst", (torch.int64,), shape=(T,))
    if (xs_home is None) != (xs is None):
        raise ValueError("xs_home and xs must both be tensors or both None")
    S = H // 128
    if xs is not None:
        check_tensor(xs_home, "xs_home", (torch.float32,), shape=(T, S))
        check_tensor(xs, "xs", (torch.float32,), shape=(x.shape[0], S), step_major=True)
    tensors = {"expert_ids": expert_ids, "rank": rank, "expert_row0": expert_row0}
    tensors.update(layout=layout, x=x, row_dst=row_dst, token_dst=token_dst)
    if xs is not None:
        tensors.update(xs_home=xs_home, xs=xs)
    same_device(x_home, **tensors)
    if rows == 0:
        return
    words = H * x_home.element_size() // 4
    block_p, block_w = tile(words)
    pair_programs = triton.cdiv(N, block_p)
    grid = (pair_programs + rows // BLOCK_M,)
    # Without scales, any int32 tensor stands in for their pointers (HAS_XS: never read).
    xs_home_words = x_home.view(torch.int32) if xs is None else xs_home.view(torch.int32)
    xs_words = x.view(torch.int32) if xs is None else xs.view(torch.int32)
    _gather_rows[grid](
        expert_ids,
        rank,
        expert_row0,
        layout,
        x_home.view(torch.int32),
        xs_home_words,
        x.view(torch.int32),
        xs_words,
        row_dst,
        token_dst,
        N,
        E,
        words,
        S,
        H,
        pair_programs,
        pad_dst,
        *(xs.stride() if xs is not None else (S, 1)),
        TOPK=topk,
        BLOCK_P=block_p,
        BLOCK_W=block_w,
        BLOCK_S=triton.next_power_of_2(S),
        HAS_XS=xs is not None,
        num_warps=NUM_WARPS,
    )


def compile_for_sm90(kernel: str = "gather", dtype: str = "fp8", H: int = 7168, topk: int = 8):
    """Compile `kernel` ('count' or 'gather', with fp8 or bf16 rows of H channels and
    scales for fp8) for sm_90 without a GPU (the CPU tests' check that it lowers)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    aligned = [["tt.divisibility", 16]]
    if kernel == "count":
        signature = {"ids_ptr": "*i32", "rank_ptr": "*i32", "held_ptr": "*i32"}
        signature.update({"N": "i32", "E": "i32", "BLOCK": "constexpr", "BINS": "constexpr"})
        constexprs = {(5,): BLOCK_COUNT, (6,): 512}
        attrs = {(i,): aligned for i in range(3)}
        source = ASTSource(_count_block, signature, constexprs, attrs)
    elif kernel == "scan":
        signature = {"held_ptr": "*i32", "counts_ptr": "*i32", "blocks": "i32", "E": "i32"}
        signature.update({"BLOCK_B": "constexpr", "BLOCK_E": "constexpr"})
        constexprs = {(4,): SCAN_BLOCKS, (5,): SCAN_EXPERTS}
        attrs = {(i,): aligned for i in range(2)}
        source = ASTSource(_scan_blocks, signature, constexprs, attrs)
    elif kernel == "place":
        signature = {"ids_ptr": "*i32", "rank_ptr": "*i32", "held_ptr": "*i32"}
        signature.update({"N": "i32", "E": "i32", "BLOCK": "constexpr"})
        constexprs = {(5,): BLOCK_COUNT}
        attrs = {(i,): aligned for i in range(3)}
        source = ASTSource(_place_pairs, signature, constexprs, attrs)
    elif kernel == "gather":
        words = H * (1 if dtype == "fp8" else 2) // 4
        block_p, block_w = tile(words)
        S = H // 128
        names = list(_gather_rows.arg_names)
        pointers = ["*i32", "*i32", "*i32", "*i32", "*i32", "*i32", "*i32", "*i32", "*i64", "*i64"]
        scalars = ["i32"] * 6 + ["i64", "i32", "i32"]
        signature = dict(zip(names, pointers + scalars + ["constexpr"] * 5, strict=True))
        values = (topk, block_p, block_w, triton.next_power_of_2(S), dtype == "fp8")
        constexprs = {(len(pointers) + len(scalars) + i,): v for i, v in enumerate(values)}
        # What a launch specializes on: 16-byte aligned pointers, W and H divisible by 16.
        attrs = {(i,): aligned for i in range(len(pointers))}
        attrs.update({(names.index(n),): aligned for n in ("W", "H")})
        source = ASTSource(_gather_rows, signature, constexprs, attrs)
    else:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    return triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS}
    )
