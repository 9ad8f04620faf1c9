"""The fused MoE kernel's device layout, built on the GPU from per-expert row counts.

Device mode (megamoe.py) reads a layout: a header (rule, lead_rows, blocks) and, per row
block, its expert, first and last row, the block count at which its expert wave ends,
where deepgemm_interleaved (interleaved counted, for interleaved) lists its first L2 tile
and its expert wave's first block (schedule.device_layout builds it on the host).
Everything in it follows from how many rows each local expert receives, which the routing
decides at run time. Building it on the host needs those counts there, a sync per step;
built here, from the counts on the device, by one program in one launch, the whole layer
(dispatch, layout, fused kernel) is captured once as a CUDA graph and replayed for every
routing.

The caller sizes the layout for the most blocks the rank can receive (`capacity_blocks`);
the rows are packed at the actual block count (row i at LAYOUT_HEADER + i * blocks), so
the first LAYOUT_HEADER + LAYOUT_ROWS * blocks entries are schedule.device_layout's array.
If the counts need more blocks than the layout holds, the header says blocks = -1 and no
row is written: a consumer sees it, and nothing is written out of bounds.

How each row is computed without a walk over blocks (one program; every step a vector over
the experts or over a chunk of blocks):
  expert, row_start, row_end  an expert's blocks are cdiv(count, BLOCK_M) consecutive ones
      (routing.dispatch_plan pads each expert's rows to a multiple of BLOCK_M); a block
      finds its expert by a binary search of the experts' block prefix sums.
  wave_end  expert_wave's waves are greedy: a wave that starts at expert s ends after the
      first expert whose blocks, counted from s, reach m = cdiv(num_programs, n1) (or at the
      last block). next(s), the expert after that, is one search per expert; the chain of
      wave starts 0, next(0), next(next(0)), ... is found by pointer doubling (each round
      doubles both the jump and the known chain), and a block's wave is the last chain
      element at or before its expert; wave_start is that element's first block.
  l2_start  deepgemm_interleaved's warm-up already lists enough L1 tiles that every block's
      L1 tiles are listed by the time its first L2 tile comes (that is what its B term is
      for), so the "not ready" branch of schedule._deepgemm_l2_starts never runs: block b's
      first L2 tile sits at b n2 + min(n1 blocks, warm-up + b n2). interleaved counted's
      (schedule._counted_l2_starts) sits at b n2 + n1 u, u the first block that starts
      lead_rows or more after b ends: u's expert is the first whose rows end past that row,
      and u's place in it a ceiling division.
"""

from __future__ import annotations

import triton
import triton.language as tl

from xstage_kernels.megamoe import BLOCK_M, CLAIM_RULES, LAYOUT_HEADER, LAYOUT_ROWS
from xstage_kernels.tensor_args import check_tensor, same_device

CHUNK = 1024  # blocks written per step of the block loop
_RULE_INTERLEAVED = tl.constexpr(CLAIM_RULES.index("interleaved"))
NUM_WARPS = 8
_INT32_MAX = 2**31 - 1


@triton.jit
def _count_below(sorted_values, targets, SIZE: tl.constexpr):
    """How many of `sorted_values` (SIZE of them, non-decreasing, SIZE a power of two) are
    below each target, at most SIZE - 1: a binary search, one register gather a level."""
    count = tl.zeros(targets.shape, tl.int32)
    for level in tl.static_range(1, 32):
        if (SIZE >> level) > 0:
            probe = count + (SIZE >> level)
            below = tl.gather(sorted_values, probe - 1, 0) < targets
            count = tl.where(below, probe, count)
    return count


@triton.jit
def _build_layout(
    counts,  # (E,) rows routed to each local expert
    layout,  # LAYOUT_HEADER + LAYOUT_ROWS * capacity int32
    expert_row0,  # (E,) out: each expert's first padded row
    E,
    capacity,  # the most blocks the layout holds
    rule,
    lead_rows,
    num_programs,
    n1,  # L1 tiles per block
    n2,  # L2 tiles per block
    BLOCK_M: tl.constexpr,
    EXPERTS: tl.constexpr,  # a power of two > E: lane E onwards stands for "past the end"
    CHUNK: tl.constexpr,
    HEADER: tl.constexpr,
):
    lane = tl.arange(0, EXPERTS)
    rows = tl.load(counts + lane, mask=lane < E, other=0)
    nblocks = rows // BLOCK_M + (rows % BLOCK_M > 0).to(tl.int32)
    first_block = tl.cumsum(nblocks, 0) - nblocks  # lanes from E on: every block
    first_row = tl.cumsum(rows, 0) - rows
    blocks = tl.sum(nblocks, 0)
    tl.store(expert_row0 + lane, first_block * BLOCK_M, mask=lane < E)

    fits = blocks <= capacity
    tl.store(layout + 0, rule)
    tl.store(layout + 1, lead_rows)
    tl.store(layout + 2, tl.where(fits, blocks, -1))
    if fits:
        # expert_wave: next(s) = how many experts start before s's start + m blocks (E or
        # more: the wave runs to the end; every lane from E on stands for the end).
        at_least = (num_programs + n1 - 1) // n1
        jump = _count_below(first_block, first_block + at_least, EXPERTS)
        # chain[k] = the expert that starts wave k (E or more past the last): each round
        # extends the chain from 2^r to 2^(r+1) known entries with jump = next^(2^r).
        chain = tl.zeros([EXPERTS], tl.int32)
        for r in tl.static_range(0, 31):
            if (1 << r) < EXPERTS:
                earlier = tl.gather(chain, tl.maximum(lane - (1 << r), 0), 0)
                new = (lane >= (1 << r)) & (lane < (2 << r))
                chain = tl.where(new, tl.gather(jump, earlier, 0), chain)
                jump = tl.gather(jump, jump, 0)
        wave = _count_below(chain, lane + 1, EXPERTS) - 1  # the wave that holds expert e
        wave_start = tl.gather(first_block, tl.gather(chain, wave, 0), 0)
        wave_end = tl.gather(first_block, tl.gather(chain, wave + 1, 0), 0)

        # deepgemm_interleaved: its warm-up (schedule.deepgemm_warmup_waves) in L1 tiles.
        l1_total = blocks * n1
        first_l2_wave = ((num_programs + n2 - 1) // n2 * n1 + num_programs - 1) // num_programs
        behind = n1 + tl.maximum(blocks - 1, 0) * tl.maximum(n1 - n2, 0)
        keep_ahead = (behind + num_programs - 1) // num_programs + 1
        every_l1_wave = (l1_total + num_programs - 1) // num_programs
        warmup_waves = tl.minimum(tl.maximum(first_l2_wave, keep_ahead), every_l1_wave)
        warmup = tl.minimum(warmup_waves * num_programs, l1_total)

        for chunk in range(0, blocks, CHUNK):
            block = chunk + tl.arange(0, CHUNK)
            inside = block < blocks
            expert = _count_below(first_block + nblocks, block + 1, EXPERTS)
            j = block - tl.gather(first_block, expert, 0)  # the expert's j-th block
            expert_rows = tl.gather(rows, expert, 0)
            row_end = tl.gather(first_row, expert, 0) + tl.minimum(expert_rows, (j + 1) * BLOCK_M)
            row_start = row_end - tl.minimum(expert_rows - j * BLOCK_M, BLOCK_M)
            l2_listed = block * n2
            l2_start = l2_listed + tl.minimum(l1_total, warmup + l2_listed)
            if rule == _RULE_INTERLEAVED:  # counted: L2 before the first block lead_rows on
                target = row_end + lead_rows
                # Lanes from E on end at the last row: past it, u is the block count.
                holder = _count_below(first_row + rows, target + 1, EXPERTS)
                into = tl.maximum(target - tl.gather(first_row, holder, 0), 0)
                place = tl.minimum((into + BLOCK_M - 1) // BLOCK_M, tl.gather(nblocks, holder, 0))
                l2_start = l2_listed + (tl.gather(first_block, holder, 0) + place) * n1
            row = layout + HEADER + block
            tl.store(row, expert, mask=inside)
            tl.store(row + blocks, row_start, mask=inside)
            tl.store(row + 2 * blocks, row_end, mask=inside)
            tl.store(row + 3 * blocks, tl.gather(wave_end, expert, 0), mask=inside)
            tl.store(row + 4 * blocks, l2_start, mask=inside)
            tl.store(row + 5 * blocks, tl.gather(wave_start, expert, 0), mask=inside)


def capacity_blocks(pairs: int, experts: int) -> int:
    """The most row blocks `pairs` routed rows over `experts` experts can need: each expert
    with rows pads them up to a multiple of BLOCK_M, so k such experts need at most
    k + (pairs - k) // BLOCK_M blocks, most with k = min(experts, pairs). At most
    cdiv(pairs, BLOCK_M) + experts."""
    if pairs < 0 or experts < 0:
        raise ValueError(f"pairs and experts must be >= 0, got {pairs} and {experts}")
    busy = min(experts, pairs)
    return busy + (pairs - busy) // BLOCK_M


def layout_size(capacity: int) -> int:
    """int32 entries of a layout that holds up to `capacity` row blocks."""
    return LAYOUT_HEADER + LAYOUT_ROWS * capacity


def build_layout(
    counts,
    layout,
    expert_row0,
    *,
    rule: int,
    lead_rows: int,
    num_programs: int,
    n1: int,
    n2: int,
) -> None:
    """Write schedule.device_layout's array for the grid that `counts` (E,) int32 rows per
    local expert make, with L1 and L2 tiles per block n1 and n2, into `layout`, and each
    expert's first padded row into `expert_row0` (E,) int32; one launch, no sync.

    The host cannot read the counts without a sync, so `layout` is checked against nothing
    but its own size: the caller sizes it as layout_size(capacity_blocks(pairs, E)) for the
    most rows the rank can receive. Counts that need more blocks leave blocks = -1 in the
    header and no rows (expert_row0 is written either way). The counts must sum below
    2^31 (device_layout's values are int32 too)."""
    capacity = _checked(counts, layout, expert_row0, rule, lead_rows, num_programs, n1, n2)
    experts = counts.numel()
    _build_layout[(1,)](
        counts,
        layout,
        expert_row0,
        experts,
        capacity,
        rule,
        lead_rows,
        num_programs,
        n1,
        n2,
        BLOCK_M=BLOCK_M,
        EXPERTS=triton.next_power_of_2(experts + 1),
        CHUNK=CHUNK,
        HEADER=LAYOUT_HEADER,
        num_warps=NUM_WARPS,
    )


def _checked(counts, layout, expert_row0, rule, lead_rows, num_programs, n1, n2) -> int:
    """The layout's capacity in blocks, after checking every argument the kernel cannot."""
    import torch

    for name, t in (("counts", counts), ("layout", layout), ("expert_row0", expert_row0)):
        check_tensor(t, name, (torch.int32,), ndim=1)
    same_device(counts, layout=layout, expert_row0=expert_row0)
    if expert_row0.numel() != counts.numel():
        raise ValueError(
            f"expert_row0 holds {expert_row0.numel()} experts, counts {counts.numel()}"
        )
    if rule not in range(len(CLAIM_RULES)):
        raise ValueError(f"rule must be one of 0..{len(CLAIM_RULES) - 1} {CLAIM_RULES}, got {rule}")
    if lead_rows < 0 or num_programs < 1 or n1 < 1 or n2 < 1:
        raise ValueError(
            f"need lead_rows >= 0 and num_programs, n1, n2 >= 1; got {lead_rows}, "
            f"{num_programs}, {n1}, {n2}"
        )
    if layout.numel() < LAYOUT_HEADER:
        raise ValueError(
            f"a layout of {layout.numel()} int32 cannot hold its {LAYOUT_HEADER}-entry header "
            f"(layout_size(capacity) = {LAYOUT_HEADER} + {LAYOUT_ROWS} * capacity)"
        )
    capacity = (layout.numel() - LAYOUT_HEADER) // LAYOUT_ROWS
    # The largest values a layout of this capacity holds (its last row ends, list positions)
    # must be int32, as device_layout requires: no launch can then overflow.
    largest = max(capacity * BLOCK_M + lead_rows + 1, capacity * (n1 + n2) + num_programs)
    if largest > _INT32_MAX:
        raise ValueError(
            f"a layout of {layout.numel()} int32 holds {capacity} blocks, whose rows or tile "
            f"positions (n1={n1}, n2={n2}) can reach {largest}, past int32"
        )
    return capacity


def compile_for_sm90(experts: int = 512):
    """Compile the kernel for sm_90 without a GPU (the CPU tests' check that it lowers)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    pointers = ("counts", "layout", "expert_row0")
    signature = {n: "*i32" if n in pointers else "i32" for n in _build_layout.arg_names}
    constexprs = {
        "BLOCK_M": BLOCK_M,
        "EXPERTS": triton.next_power_of_2(experts + 1),
        "CHUNK": CHUNK,
        "HEADER": LAYOUT_HEADER,
    }
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    source = ASTSource(_build_layout, signature, constexprs)
    return triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS}
    )
