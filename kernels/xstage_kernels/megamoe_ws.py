"""The FP8 fused MoE kernel (W8A8 and W4A8), warp-specialized (Gluon, sm_90): same contract as
megamoe.py's `_fused_moe` (tile lists, row-block counters, peer-store epilogue, trace
fields), built the way Hopper GEMMs keep their tensor cores busy.

Why a second kernel: in plain `tl` the per-K-step block-scale promotion (each step's MMA
result scaled and added to an fp32 accumulator) joins both warpgroups at a CTA barrier
every step, and the tensor cores idle while they promote (ncu on one H200: 36% busy, 44%
of stalls at CTA barriers). Here each CTA has three partitions (W4A8: five):

- a producer warp takes tiles from the rank's list (the same atomic counter, so the same
  list order), hands each tile's record (PREFETCH_TILE) to the math warpgroups through a
  small shared-memory ring, waits for a Linear-2 tile's row block, and streams the operands
  by TMA into a ring of STAGES slots (per-slot ready/empty mbarriers): the weights from
  their tile-major copy (TILE_MAJOR_WEIGHTS), the activations in boxes of the rows the
  block holds (ROW_BOX_MIN), and the step's activation scales of the block (SCALES_TMA);
- two math warpgroups, each owning 64 of the tile's 128 rows, issue the asynchronous MMA
  of a step, release the slot as soon as it completes, and promote while the other
  warpgroup's MMA runs: no CTA-wide barrier per step.

W4A8 (W4): the producer loads each step's activations as two 128 x 64 halves and the
weights as their packed bytes (128 rows x 64 bytes, quant.py's packing: 4-bit sign and
magnitude, each 32-bit word holding four channels of the step's first 64 and the same four
of its last 64).
Converter warpgroups (W4_CONVERTERS, taking the ring's steps in turn) turn each slot's
packed weights into two FP8 halves in shared memory (int4_fp8.py's table lookup, 16-byte
loads and stores), fence them for the tensor cores and arrive on the slot's "converted"
barrier, which the math warpgroups wait on instead of "ready"; a step's two halves are
two chained MMAs (first channels, then last). The converters run up to the ring's depth
ahead of the MMAs. Registers are re-balanced for the extra warpgroups (W4_REGS). What bounds
W4A8 is the conversion (16K table lookups per step, `prmt` at half the logic rate), not the
MMAs: one H200, 16384 tokens, taking the lookup out (wrong values, timing only) lifted one
converter from 607 to 826 TFLOP/s (W8A8: 977). Tried and measured there, 2026-11-30: the math
warpgroups converting their own halves one step ahead (575), one converter (607), two (646),
two with 5 slots (648), a single 128B-swizzled converted block and one MMA per step (605-633),
the half-split packing's extra byte gather (2 more `prmt` a word: 574 / 632). Then
(2026-12-03, kernels/ab/2026-12-03-w4a8-beside-w8a8-sign-magnitude.json) the weights moved
to sign and magnitude with the signs apart (int4_fp8.py: 7 instructions a word, 2 of them
`prmt`, against 11 and 6): in one run, W4A8 takes 1.22-1.43x W8A8's time at 16384 tokens
(geomean 1.325; 1.264-1.459, geomean 1.387, in the run before the change) and 1.16-1.26x
at 1024 (geomean 1.195). Then math warpgroup 0's spill left the step loops (GATE_BF16):
W4A8 0.906-0.963 of the time (ref-h200x1, both precisions in one run: W4A8 1.193x W8A8's
time, geomean over 42 configurations). Then the converters' stores lost most of the
barriers the compiler put between them (SPLIT_CONVERTED, CONVERT_ROWS: 0.93-0.965 of the
time): in ref-h200x1's run at that code, 1.114x (kernel time, geomean; expert waves with
every row on the GPU: 1.077 at 1024 tokens, 1.137 at 4096, 1.143 at 16384).

A Linear-1 tile runs gate's K steps then up's over the same rows, applies SwiGLU, quantizes
its rows (one FP8 scale per row for these 128 channels) into the intermediate, fences
generic stores against the TMA reads that Linear-2 will make, and each warpgroup bumps its
row block's counter once, so a row block is ready at 2 * I / 128 (not I / 128 as in the tl
kernel). A Linear-2 tile stores each row straight into its home rank's combine buffer
with 16-byte stores (peer memory over NVLink: the X-Stage).

Measured (2x H200 reference, 84 configurations, 2026-11-30): W8A8 median 601 TFLOP/s per GPU,
824 at 16384 tokens (the tl kernel: 461 and 597); W4A8 median 467, 620 at 16384 tokens (the
tl kernel: 197), 1.26x W8A8's time (geomean; medians 1.22x at 1024 tokens, 1.38x at 16384).
The SwiGLU/quantization epilogue is on the critical path (both warpgroups run it at once
while the tensor cores idle), hence one division per element there: taking the divisions
out of it alone gave +6% (DeepSeek-V4 Flash) to +14% (DiT-MoE) on one H200.

Where W8A8 time goes at 16384 tokens (one H200, DeepSeek-V4 Flash, 2026-12-03, ncu with its
source counters: kernels/ab/2026-12-03-ncu-*): the tensor pipe is busy 53% of the cycles;
of the math warps' samples, ~20% wait for their own MMA, ~12% for a slot (8% at a Linear-2
tile's first slot), ~11% for a loaded value (mostly at one copy a loop: ptxas hoists the
copy of the next step's scales into the loop-carried registers above the MMA wait), and the
rest issue: promotion FMAs, scale loads, descriptors, the epilogues. Four changes that went
after those waits lost their paired A/B there and were taken out (kernels/ab, commits
77763e7, 0cee4c3 and ca62fa0): two steps' MMAs in flight per warpgroup (gate and Linear-2:
1.03-1.07x the time), the producer claiming its next tile in the middle of the current one
(1.02-1.11x), the producer staging each step's scales into its slot by cp.async
(1.02-1.24x), and gate's and Linear-2's loops unrolled by two so that no copy waits for the
scale loads (1.01-1.05x, W4A8 1.00-1.06x). The first three added work or latency to the
one producer warp, whose slots are what the math warps wait for. Measured since
(kernels/ab/2026-12-03-ncu-memory-*, same shape, SM clock locked at 1.33 GHz): L2 59% of its
peak throughput (7.1 TB/s through L2, 6.1 TB/s L2 to SMs), DRAM 27%, hit rate 69%; so no
aggregate bandwidth is saturated either. What is left is latency, the slot waits and the
MMA's own wait of the stall profile above (separated on 2026-12-04: below). Tile by tile
(kernels/ab/*-tile-phases-*, the traced build, every shape at 16384 tokens): 0.80 of the
CTAs' time (median over shapes) goes to step loops at their steady pace, 0.08 to a tile's
first slots, 0.12 to epilogues; a steady step of both warpgroups takes 0.36-0.53 us against
~0.28 us at the tensor cores' peak. Without the loops' scale loads (a diagnostic build,
wrong outputs) the kernel took 0.91-0.93 of the time and a step still 0.34-0.45 us: each
warpgroup's serial MMA, wait, promotion and next issue bounds it. The activation scales then
moved into the slots, by TMA (SCALES_TMA: 0.914-0.966 of the time at 16384 tokens, a steady
step 0.35-0.47 us: kernels/ab/*-tile-phases-*-scales-tma).
Then (2026-12-04, one H200, W8A8 at 16384 tokens, every shape; diagnostic builds, taken
out again) a steady step was timed without parts of its work (kernels/ab/*-diag-steps-*):
without its operand loads (no TMA, no L2 traffic; the MMAs read what the slots held) a
Linear-1 step of the full-block shapes took 0.41-0.45 us, against 0.48-0.50 us with them
(qwen, hy3: 0.32 against 0.36); without its MMAs (the slots released once full) 0.24-0.32
us, and 0.17-0.20 us with half the CTAs idle. Nsight Compute (kernels/ab/*-ncu-smem-*):
tensor pipe 56% busy, 59% without loads; shared memory's data stage 47% of its peak, 90% of
it the MMAs' operand reads. So the loads cost about a tenth of a step and no memory level
is saturated. The MMA step on its own (kernels/ab/mma_rate.py, *-mma-rate.json: every SM,
two warpgroups, 64 x 128 x 128 each, operands in shared memory, random FP8 values) runs at
1827 TFLOP/s chained, and at 1370 TFLOP/s when each step is waited for and promoted as here:
0.40 us a step, what the kernel's steps take without their loads. That promotion, every 128
channels of K with 128 columns a warpgroup, is the bound: steps at that rate, with the rest
(tile starts and epilogues, a fifth of the CTAs' time) as it is, would put the median at
about 1000 TFLOP/s (878 in ref-h200x1): the target, with nothing else lost. Two steps' MMAs
in flight a warpgroup (PAIR_STEPS, below) did not lift it: without loads a Linear-2 step
went from 0.45 to 0.43 us. Three math warpgroups (192-row tiles, 168 registers a thread)
lift the promoted rate to 1505 TFLOP/s in the microbenchmark, but a Linear-1 tile's up loop
holds gate's result beside its accumulator and product (192 registers, 160 with gate in
bf16, before addresses); 256 columns a warpgroup need 256 registers (the microbenchmark
spills: 653 TFLOP/s). TMA multicast across a 2-CTA cluster would cut only the loads' tenth
(and Triton 3.6's Gluon has no multicast copy).
Also tried and lost (kernels/ab): warpgroup 1 lagging warpgroup 0 by 2-4 steps so that their
epilogues do not coincide (WG_LAG, 1.00-1.05x), and the producer claiming its next tile 1-4
loads before the current one's last (CLAIM_EARLY, 1.007-1.012x geomean), and a Linear-1 row
block's release (its fence waits for the tile's stores) deferred until the next Linear-1
tile's first MMA was issued (DEFER_RELEASE: 0.99-1.03x, geomean 1.003), and gate's and
Linear-2's steps in pairs, both MMAs issued before the first is waited for and its promotion
run under the second, the scales from the slots (PAIR_STEPS, no spill in the loops: W8A8
1.010-1.044x the time at every token count, kernels/ab/2026-12-04-pair-steps-w8a8.json;
its steady steps barely moved, kernels/ab/2026-12-04-tile-phases-*-pair-steps.json).
Later that day the promotion was taken out from under the tensor cores in two ways, and
neither lifted the kernel (one H200, kernels/ab/2026-12-04-{split-mma,pair-steps-ordered,
mma-rate-split,tile-phases-*,ncu-clocks}-*, options at ad6f545, taken out again). Each step
as two 64-column MMAs issued together, the first promoted while the second runs (SPLIT_MMA,
the same registers): 1662 TFLOP/s on its own (mma_rate.py's split mode; 1946 on zeros, the
chained rate), but 1.047-1.085x the time in the kernel at 16384 tokens (1.00-1.05x below),
steady steps 0.51-0.54 us against 0.47-0.50, shared memory's data pipe 56% busy against 47%
(each warpgroup reads its 64 rows twice). PAIR_STEPS again, its first promotion now kept
above the second wait (the first try had let the compiler move it below: no overlap at
all): 1.018-1.045x. Nsight Compute at the GPU's own clock (1.61 GHz under this load; 1.35
locked): the same SM cycles at both clocks (8.2 M, 8.0 M) with L2 at 1.7 GHz in both, so
the time is SM cycles, not L2 delivery (70% of its peak), tensor pipe 56%. One of the
warpgroup barriers Triton puts around each step (before the slot wait; the release keeps
its own) turned out to cost 2-4% of the time at 16384 tokens: DROP_WAIT_BARRIERS. Two
compiler facts any such change must respect: an MMA left in flight across a loop's back
edge makes ptxas serialize every MMA of the kernel (C7514, checked by the tests), and a
promotion that is not an operand of the next MMA wait may be moved below it.

Device mode (DEVICE, a `layout` given: megamoe.py's module doc): the producer claims a
position with the list's fetch-add, finds its tile from the layout alone
(megamoe.decided_tile; interleaved's and deepgemm_interleaved's from a warp's load of
BLOCK_WINDOW blocks' first L2 positions, one a lane) and writes it at that position in
`tiles`, still ahead of the math warpgroups (tile slots); these and the converters take
every field from the producer's record, never from `tiles`. A claim's loads depend on one
another, and after the producer's row-block poll (an acquire) each goes to L2. interleaved
used to be decided at run time, in units published in a table, whose claims cost it about
5% (the order it realized, replayed as a list, ran at 0.945-0.955 of its time:
kernels/ab/2026-12-07-device-order-replay-*); counted, it took 0.996 (W8A8) and 0.990
(W4A8) of the units' time (kernels/ab/2026-12-08-claim-counted-*).

Trace stamps (TRACE): the producer writes the tile's program, taken and ready times (ready:
after its row block was released); the math warpgroups write mma_done and store_end as the
later of the two (atomic max into a zeroed buffer) and store_start from warpgroup 0.

Gluon has no interpreter: the CPU tests run megamoe.py's tl kernel and compile this one
for sm_90 without a GPU; on a GPU each point's check (poisoned output, fresh inputs,
against the reference) runs this kernel before it is timed.
"""

import weakref

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.core import _aggregate as aggregate

from xstage_kernels import int4_fp8, ptx_edits
from xstage_kernels.formats import AMAX_FLOOR, FP8_MAX
from xstage_kernels.megamoe import BLOCK_WINDOW, LAYOUT_BLOCKS, decided_tile
from xstage_kernels.ptx_edits import DROP_MATH_WAIT_BARRIERS_MARK, DROP_WAIT_BARRIERS_MARK

BLOCK = 128  # rows, output channels and K channels of a tile step
HALF = BLOCK // 2  # rows per math warpgroup
# Operand ring depth (one H200, this kernel at 16384 tokens, DeepSeek-V4 Flash / DiT-MoE
# shapes, 2026-11-30: 4 stages 730 / 638 TFLOP/s, 5: 767 / 665, 6: 761 / 691); 6 x 32 KiB
# leaves room for the epilogue's layout conversions in the 227 KiB of shared memory.
STAGES = 6
# A W4A8 slot holds more (two 128 x 64 FP8 activation halves, 128 x 64 packed weight bytes
# and their two converted 128 x 64 FP8 halves: 40 KiB), so fewer of them (5 gained 0-3%).
W4_STAGES = 4
TILE_SLOTS = 2  # tile records in flight between the producer and the math warpgroups
RECORD = 8  # int32 per tile record: index, kind, expert, row block, column block, live rows
MATH_REGS = 232  # per thread, each math warpgroup (setmaxnreg)
PRODUCER_REGS = 40
MAX_REGS = 168  # at launch: 12 warps x 32 threads x 168 fits the SM's 64K registers
NUM_WARPS = 4  # the default partition: math warpgroup 0
WORKER_WARPS = (4, 1)  # the worker partitions: math warpgroup 1, the producer
WARPS = NUM_WARPS + sum(WORKER_WARPS)
# W4A8 adds two converter warpgroups. Partitions start on warpgroup boundaries, so the CTA
# has 20 warps (the producer's warpgroup is padded) and launches with 96 registers per
# thread; setmaxnreg gives the workers (math 1, converter 0, converter 1, producer) W4_REGS
# and the default partition, math warpgroup 0, what is left: 5 x 96 - 296 = 184, where it
# spilled inside up's step loop until gate was held in bf16 (GATE_BF16; ncu on one H200,
# DeepSeek-V4 Flash at 1024 tokens, before: 23.6M local-memory requests, L1TEX waits 43%
# of the stalls); it still spills once a tile, around that loop. Still, two converters beat one
# converter with no spill at all (one H200, 2026-12-02, kernel_ab W4_LAYOUT, paired: both
# math warpgroups at 224 with a 40-register converter took 1.03-1.14x the time over the 21
# balanced configurations, at 232 with 24 1.07-1.18x): the conversion, not the spill,
# bounds W4A8 (taking the table lookup out alone gave 826 TFLOP/s against 607, 2026-11-30).
W4_CONVERTERS = 2
# With gate in bf16 (GATE_BF16), 40 or 48 registers a converter thread (math warpgroup 1
# giving up the difference) lost at 16384 tokens: 1.009-1.024x / 1.012-1.037x the time
# (DiT-MoE and hy3 0.99-1.03), 48 won 1.3-1.5% at 1024 (paired A/B, one H200,
# kernels/ab/2026-12-03-converter-regs.json).
W4_REGS = (208, 32, 32, 24)
W4_MAX_REGS = 96
W4_WORKER_WARPS = (4, 4, 4, 1)
PAD_DST = -(2**62)  # as megamoe.PAD_DST
# A math warpgroup whose 64 rows of a tile are all padding skips its MMAs and epilogue
# (an expert with at most 64 rows fills half a block: at 1024 tokens, every shape but
# DiT-MoE). Read at each launch, so kernel_ab.py can time both builds in one run.
SKIP_PADDING_HALVES = True
# Weights read tile-major: each 128-row x 128-channel step of a weight matrix stored as one
# contiguous block (tile_major), so a TMA load reads 16 contiguous KiB (W4A8: 8 KiB of packed
# bytes) instead of 128 rows of 128 bytes a row length apart, as weight-shuffling MoE kernels
# store theirs. The copy is made at the first launch over a weight tensor (tile_major_copy).
# Paired A/B, one H200, 2026-12-02 (kernels/ab/*-tile-major-*): W8A8 0.975 of the time at
# DeepSeek-V4-Pro 4096 tokens and 0.98-0.99 at 1024/4096 elsewhere, W4A8 0.96-0.985 at 1024;
# 0.99-1.006 at 16384 (compute-bound).
TILE_MAJOR_WEIGHTS = True
# The producer hands each tile's whole record through the tile ring (index, kind, expert,
# row block, column block and whether each 64-row half holds a row), so a math warpgroup
# starts a tile without the two dependent global loads that read them again, and loads its
# first scales (and a Linear-2 tile's destinations) before it waits for the first slot: at
# a tile's start and end both warpgroups wait at once, and the tensor cores with them.
# Paired A/B, W8A8 (kernels/ab/*-prefetch-tile-*): 0.980-1.002 of the time, 0.98 at
# DeepSeek-V4-Flash 16384 tokens.
PREFETCH_TILE = True
# The fewest activation rows (of x, or of the intermediate) a step loads: a row block whose
# rows from 64 (or 32) on are all padding loads only its first 64 (32) rows. Each step of a
# tile re-reads its activations from L2 (every column block of an expert reads them again),
# so at small token counts, where most of a block is padding, the padding rows were most of
# the L2 traffic (ncu, one H200, DeepSeek-V4-Flash W8A8 at 1024 tokens: L2 94% busy, DRAM
# 84%). The rows past the box keep what the slot held before: they are padding, and a
# padding row's output is never stored. 128: every row of a block, as before the option.
# Paired A/B (kernels/ab/*-row-box-*), 32 against 128: 0.93-0.96 of the time at 1024 tokens
# (W8A8 and W4A8), 0.955-0.972 skewed at 4096, DeepSeek-V4-Pro 4096 0.970, 0.98-1.00 at 16384;
# 64 gains less (0.947-0.97 at 1024).
ROW_BOX_MIN = 32
ROW_BOXES = (128, 64, 32)
# W4A8: a Linear-1 tile holds gate's 64 x 128 result through up's steps; with up's
# accumulator and the MMA's that is 192 registers a thread, over the 184 of W4A8's math
# warpgroup 0, which reloaded accumulators from local memory in every step of up's loop
# (SASS: 34 local loads and stores a step). Held as bf16 (a rounding of 2^-9, far below the
# FP8 rounding of the intermediate it feeds), gate spills once a tile and no step loop
# spills. Paired A/B, one H200 (kernels/ab/2026-12-03-gate-bf16.json): W4A8 0.906-0.932 of
# the time at 16384 tokens (DiT-MoE 0.991), 0.944-0.963 at 1024. W8A8, which does not spill,
# lost (1.017-1.048 at 16384), so its build keeps gate in fp32.
GATE_BF16 = True
# W4A8's converted halves: one allocation for both (2 slots a stage), or one each
# (SPLIT_CONVERTED), and the rows a converter converts per load and store (CONVERT_ROWS of
# the step's 128). Triton's shared-memory barrier analysis cannot tell two stores into one
# allocation apart (the slot index is dynamic), so it puts a barrier of the converter's 4
# warps between every two of them: 7 a step at 32 rows into one buffer, 3 with a buffer per
# half, 1 with 64-row parts (still no spill at the converters' 32 registers). Paired A/B,
# one H200, W4A8, 1024/4096/16384 tokens, every shape (kernels/ab/2026-12-03-split-*,
# *-convert-rows-*): a buffer per half 0.990-1.000 of the time, then 64 rows 0.931-0.965.
SPLIT_CONVERTED = True
CONVERT_ROWS = 64
CONVERT_ROW_CHOICES = (32, 64)
# The producer claims its next tile with a relaxed atomic (CLAIM_RELAXED) instead of an
# acquire-release one: the tile list and the row destinations were written before the
# launch, and a Linear-2 tile's inputs are acquired by the row-block poll, so the claim
# orders nothing, and the claim is on the path from one tile's loads to the next's.
# Paired A/B, one H200, every shape, balanced, 1024/4096/16384 tokens
# (kernels/ab/2026-12-03-claim-relaxed-*): W8A8 0.971-0.999 of the time (geomean 0.991),
# W4A8 0.979-1.000 (0.991).
CLAIM_RELAXED = True
# SwiGLU's sigmoid through one tanh.approx a value (sigmoid(g) = (1 + tanh(g / 2)) / 2)
# instead of an exp and a division, each with its range checks: the Linear-1 epilogue, which
# both math warpgroups run at once while the tensor cores idle, went from 2 MUFU operations
# and ~13 instructions a value to 1 and 4 (SASS). tanh.approx is good to ~2^-11, far below
# the FP8 rounding of the intermediate it feeds (checks: largest error 0.0048, against
# 0.0046 exact). Paired A/B, one H200, every shape, balanced, 1024/4096/16384 tokens
# (kernels/ab/2026-12-03-swiglu-tanh-*): W8A8 0.968-1.001 of the time (geomean 0.990;
# DiT-MoE 0.968-0.979), W4A8 0.948-0.988 (0.978).
SWIGLU_TANH = True
# Each step's activation scales arrive with its slot (SCALES_TMA): the producer's TMA loads
# the step's scales of the row block's 128 rows (the received rows' scales and the
# intermediate's are stored step-major for this, see descriptors) into the slot, and the
# math warpgroups read them from shared memory after the slot's wait, instead of loading
# them from global memory each step (ptxas moves the copy of those loaded values above the
# MMA's wait, so each step waited for them). The weight scale, one float a step that the
# whole warpgroup reads, is still loaded a step ahead. (Its own TMA, a 32-float box of the
# flat weight scales, was an illegal instruction on one H200, 2-D or 1-D: not pursued.)
# Paired A/B, one H200, every shape, balanced (kernels/ab/2026-12-03-scales-tma-*): W8A8
# 0.914-0.966 of the time at 16384 tokens (geomean 0.938), 0.957-0.992 at 4096, 0.976-1.003
# at 1024; W4A8 0.950-0.988 at 16384, 0.971-0.997 at 4096; outputs as before.
SCALES_TMA = True
# W8A8: the warpgroup barrier Triton puts before each mbarrier wait of a partition is
# dropped from the PTX (ptx_edits.drop_wait_barriers says why it orders nothing). Paired
# A/B, one H200, every shape, balanced: the PTX edited in a diagnostic build
# (kernels/ab/2026-12-04-wait-barriers-*) W8A8 0.953-0.979 of the time at 16384 tokens
# (geomean 0.972), 0.980-0.992 at 4096, 0.990-0.996 at 1024, W4A8 1.005-1.016 (its
# converters' waits too): not for W4A8; this build (*-drop-wait-barriers-w8a8.json)
# 0.958-0.986 at 16384 (geomean 0.973), 0.975-0.996 at 4096, 0.983-0.997 at 1024.
DROP_WAIT_BARRIERS = True
# W4A8: the same in its math warpgroups only (the diagnostic above dropped its converters'
# too): 0.994 of the time at 16384 tokens (kernels/ab/*-drop-wait-barriers-w4a8.json).
W4_DROP_WAIT_BARRIERS = True
# Tried in paired A/Bs and rejected, their code since taken out (kernels/ab/README.md keeps
# the rows): W8A8 slots released by lane 0 of each math warp (ARRIVE_PER_WARP: 1.038x the
# time at 16384 tokens, kernels/ab/*-arrive-per-warp-w8a8.json), and the math warpgroups
# issuing their MMAs in turn (MMA_TURNS: tied, 0.996 / 1.003, kernels/ab/*-mma-turns-*.json).
LAUNCH_OPTIONS = (
    "SKIP_PADDING_HALVES",
    "TILE_MAJOR_WEIGHTS",
    "PREFETCH_TILE",
    "ROW_BOX_MIN",
    "GATE_BF16",
    "SPLIT_CONVERTED",
    "CONVERT_ROWS",
    "CLAIM_RELAXED",
    "SWIGLU_TANH",
    "SCALES_TMA",
    "DROP_WAIT_BARRIERS",
    "W4_DROP_WAIT_BARRIERS",
)
PRECISIONS = ("w8a8", "w4a8")

_AMAX_FLOOR = gl.constexpr(AMAX_FLOOR)
_FP8_MAX = gl.constexpr(FP8_MAX)
_PAD_DST = gl.constexpr(PAD_DST)
_BLOCK = gl.constexpr(BLOCK)
_STAGES = gl.constexpr(STAGES)
_W4_STAGES = gl.constexpr(W4_STAGES)
_HALF = gl.constexpr(HALF)
_QUARTER = gl.constexpr(BLOCK // 4)
_TILE_SLOTS = gl.constexpr(TILE_SLOTS)
_RECORD = gl.constexpr(RECORD)
_BLOCK_WINDOW = gl.constexpr(BLOCK_WINDOW)  # one block a lane of the producer warp
_LAYOUT_BLOCKS = gl.constexpr(LAYOUT_BLOCKS)  # the header's block count
_MATH_REGS = gl.constexpr(MATH_REGS)
_PRODUCER_REGS = gl.constexpr(PRODUCER_REGS)
_WORKER_WARPS = gl.constexpr(WORKER_WARPS)
_W4_REGS = gl.constexpr(W4_REGS)
_W4_CONVERTERS = gl.constexpr(W4_CONVERTERS)
_W4_WORKER_WARPS = gl.constexpr(W4_WORKER_WARPS)
_INT4_TO_FP8 = gl.constexpr(int4_fp8.ptx())
_DROP_WAIT_BARRIERS_ASM = gl.constexpr(f"mov.u32 $0, $1; // {DROP_WAIT_BARRIERS_MARK}")
_DROP_MATH_WAIT_BARRIERS_ASM = gl.constexpr(f"mov.u32 $0, $1; // {DROP_MATH_WAIT_BARRIERS_MARK}")
# Our builds' PTX edits run inside Triton's compilation (ptx_edits).
ptx_edits.install()


@aggregate
class Shared:
    """What every partition sees: descriptors, rings and barriers, pointers, sizes."""

    x_desc: tma.tensor_descriptor
    w1_desc: tma.tensor_descriptor
    h_desc: tma.tensor_descriptor
    w2_desc: tma.tensor_descriptor
    x64_desc: tma.tensor_descriptor  # x and h in boxes of 64 and 32 rows (ROW_BOX_MIN)
    x32_desc: tma.tensor_descriptor
    h64_desc: tma.tensor_descriptor
    h32_desc: tma.tensor_descriptor
    xs_desc: tma.tensor_descriptor  # SCALES_TMA: x's and h's scales, step-major
    hs_desc: tma.tensor_descriptor
    a_bufs: gl.shared_memory_descriptor  # W4: two halves per slot (index 2 s, 2 s + 1)
    b_bufs: gl.shared_memory_descriptor  # W4: packed weight bytes
    c_bufs: gl.shared_memory_descriptor  # W4: converted weight halves (W8A8: b_bufs)
    c_hi_bufs: gl.shared_memory_descriptor  # W4 with SPLIT_CONVERTED: the last channels'
    ready: gl.shared_memory_descriptor
    empty: gl.shared_memory_descriptor
    converted: gl.shared_memory_descriptor  # W4 (W8A8: ready)
    sa_bufs: gl.shared_memory_descriptor  # SCALES_TMA: a slot's activation scales
    tile_ids: gl.shared_memory_descriptor  # tile records (_tile_record)
    tile_ready: gl.shared_memory_descriptor
    tile_empty: gl.shared_memory_descriptor
    tiles_ptr: gl.tensor
    sync_ptr: gl.tensor
    xs_ptr: gl.tensor
    s1_ptr: gl.tensor
    s2_ptr: gl.tensor
    h_ptr: gl.tensor
    hs_ptr: gl.tensor
    out_ptr: gl.tensor
    row_dst_ptr: gl.tensor
    trace_ptr: gl.tensor
    layout_ptr: gl.tensor | gl.constexpr  # DEVICE: schedule.device_layout; else None
    n_tiles: gl.tensor
    H: gl.tensor
    I: gl.tensor  # noqa: E741
    max_spin: gl.tensor
    TRACE: gl.constexpr
    W4: gl.constexpr
    STAGES: gl.constexpr
    SKIP_PADDING: gl.constexpr
    TILE_MAJOR: gl.constexpr
    PREFETCH: gl.constexpr
    ROW_BOX_MIN: gl.constexpr
    GATE_BF16: gl.constexpr
    SPLIT: gl.constexpr
    CONVERT_ROWS: gl.constexpr
    CLAIM_RELAXED: gl.constexpr
    SWIGLU_TANH: gl.constexpr
    SCALES_TMA: gl.constexpr
    DEVICE: gl.constexpr
    TILE_FROM_RECORD: gl.constexpr  # math and converters read the tile from the record
    R: gl.tensor  # rows of x and h (the intermediate's scales are step-major: [I/128, R])

    @gluon.constexpr_function
    def __init__(self, descs, rings, tile_ring, ptrs, layout, sizes, TRACE, W4, STAGES, options):
        self.x_desc, self.w1_desc, self.h_desc, self.w2_desc = descs[:4]
        self.x64_desc, self.x32_desc, self.h64_desc, self.h32_desc = descs[4:8]
        self.xs_desc, self.hs_desc = descs[8:]
        self.a_bufs, self.b_bufs, self.c_bufs, self.c_hi_bufs = rings[:4]
        self.ready, self.empty, self.converted, self.sa_bufs = rings[4:]
        self.tile_ids, self.tile_ready, self.tile_empty = tile_ring
        (
            self.tiles_ptr,
            self.sync_ptr,
            self.xs_ptr,
            self.s1_ptr,
            self.s2_ptr,
            self.h_ptr,
            self.hs_ptr,
            self.out_ptr,
            self.row_dst_ptr,
            self.trace_ptr,
        ) = ptrs
        self.layout_ptr = gl.constexpr(None) if layout is None else layout
        self.n_tiles, self.H, self.I, self.max_spin, self.R = sizes
        self.TRACE = gl.constexpr(TRACE)
        self.W4 = gl.constexpr(W4)
        self.STAGES = gl.constexpr(STAGES)
        (
            SKIP_PADDING,
            TILE_MAJOR,
            PREFETCH,
            ROW_BOX_MIN,
            GATE_BF16,
            SPLIT,
            CONVERT_ROWS,
            CLAIM,
            TANH,
            SCALES_TMA,
            DEVICE,
        ) = options
        self.DEVICE = gl.constexpr(DEVICE)
        # In device mode `tiles` is what the producer writes, so only its record holds a tile.
        self.TILE_FROM_RECORD = gl.constexpr(bool(PREFETCH) or bool(DEVICE))
        self.SCALES_TMA = gl.constexpr(SCALES_TMA)
        self.CLAIM_RELAXED = gl.constexpr(CLAIM)
        self.SWIGLU_TANH = gl.constexpr(TANH)
        self.ROW_BOX_MIN = gl.constexpr(ROW_BOX_MIN)
        self.SKIP_PADDING = gl.constexpr(SKIP_PADDING)
        self.TILE_MAJOR = gl.constexpr(TILE_MAJOR)
        self.PREFETCH = gl.constexpr(PREFETCH)
        self.GATE_BF16 = gl.constexpr(GATE_BF16)
        self.SPLIT = gl.constexpr(SPLIT)
        self.CONVERT_ROWS = gl.constexpr(CONVERT_ROWS)


@gluon.jit
def _now():
    return gl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1
    )


@gluon.jit
def _fence_proxy_async():
    gl.inline_asm_elementwise(
        "fence.proxy.async.global; mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _load_steps(p, it, IS_X: gl.constexpr, a_row, box, b_desc, b_row, k_steps):
    """Stream k_steps (A, B) steps of 128 channels into the ring; returns the ring counter.
    A is x (IS_X) or the intermediate, `box` (128, 64 or 32) of its rows from a_row. W4: A
    as two 128-row x 64 halves, B as 128 rows of 64 packed bytes. b_row is a multiple of
    128; tile-major weights hold its step k at block row (b_row / 128) * k_steps + k."""
    for k in range(k_steps):
        if p.TILE_MAJOR:
            b_at = [((b_row // _BLOCK) * k_steps + k) * _BLOCK, 0]
        else:
            b_at = [b_row, k * (_HALF if p.W4 else _BLOCK)]
        s = it % p.STAGES
        mbarrier.wait(p.empty.index(s), ((it // p.STAGES) & 1) ^ 1)
        if box == _BLOCK:
            _load_a(p, s, k, a_row, IS_X, _BLOCK)
        elif box == _HALF:
            _load_a(p, s, k, a_row, IS_X, _HALF)
        else:
            _load_a(p, s, k, a_row, IS_X, _QUARTER)
        tma.async_copy_global_to_shared(b_desc, b_at, p.ready.index(s), p.b_bufs.index(s))
        if p.SCALES_TMA:  # the step's activation scales of the block's 128 rows
            s_desc = p.xs_desc if IS_X else p.hs_desc
            sa_at = [k, a_row]
            tma.async_copy_global_to_shared(s_desc, sa_at, p.ready.index(s), p.sa_bufs.index(s))
        it += 1
    return it


@gluon.jit
def _load_a(p, s, k, a_row, IS_X: gl.constexpr, ROWS: gl.constexpr):
    """Slot s's A rows a_row..a_row+ROWS of step k into the slot's first ROWS rows, and the
    bytes the slot then waits for (with its B)."""
    b_bytes: gl.constexpr = _BLOCK * (_HALF if p.W4 else _BLOCK)
    scale_bytes: gl.constexpr = 4 * _BLOCK if p.SCALES_TMA else 0
    mbarrier.expect(p.ready.index(s), ROWS * _BLOCK + b_bytes + scale_bytes)
    if ROWS == _BLOCK:
        desc = p.x_desc if IS_X else p.h_desc
    elif ROWS == _HALF:
        desc = p.x64_desc if IS_X else p.h64_desc
    else:
        desc = p.x32_desc if IS_X else p.h32_desc
    if p.W4:
        for half in gl.static_range(2):
            dst = p.a_bufs.index(2 * s + half).slice(0, ROWS)
            at = [a_row, k * _BLOCK + half * _HALF]
            tma.async_copy_global_to_shared(desc, at, p.ready.index(s), dst)
    else:
        dst = p.a_bufs.index(s).slice(0, ROWS)
        tma.async_copy_global_to_shared(desc, [a_row, k * _BLOCK], p.ready.index(s), dst)


@gluon.jit
def _field(rec, i: gl.constexpr, layout: gl.constexpr):
    """Field i of a tile record held in `layout`, as a scalar (every field is >= 0)."""
    pos = gl.arange(0, _RECORD, layout=layout)
    return gl.max(gl.where(pos == i, rec, -1), axis=0)


@gluon.jit
def _tile_record(p, idx, running, layout: gl.constexpr):
    """Tile idx's record: [idx, kind, expert, row block, column block, whether rows 0, 64
    and 32 of the block hold a row] (zeros past the last tile), its tile read from the list."""
    pos = gl.arange(0, _RECORD, layout=layout)
    in_list = running & (pos >= 1) & (pos <= 4)
    fields = gl.load(p.tiles_ptr + idx * 4 + pos - 1, mask=in_list, other=0)
    return _with_rows(p, idx, fields, running, layout)


@gluon.jit
def _claimed_record(p, idx, kind, e, blk, nb, running, layout: gl.constexpr):
    """Device mode: _tile_record of the tile just claimed, which is also written at its
    list position in `tiles` (the realized order)."""
    pos = gl.arange(0, _RECORD, layout=layout)
    in_list = running & (pos >= 1) & (pos <= 4)
    tile = gl.where(pos == 1, kind, gl.where(pos == 2, e, gl.where(pos == 3, blk, nb)))
    fields = gl.where(in_list, tile, 0)
    gl.store(p.tiles_ptr + idx * 4 + pos - 1, fields, mask=in_list)
    return _with_rows(p, idx, fields, running, layout)


@gluon.jit
def _with_rows(p, idx, fields, running, layout: gl.constexpr):
    """A record's fields 1-4 (`fields`, zeros elsewhere) with its index and row flags. An
    expert's rows fill its blocks from the start (routing.dispatch_plan), so row r holds
    one when r rows do."""
    pos = gl.arange(0, _RECORD, layout=layout)
    blk = _field(fields, 3, layout)
    rows = running & (pos >= 5)
    row = gl.where(pos == 7, _QUARTER, (pos - 5) * _HALF)
    dst = gl.load(p.row_dst_ptr + blk.to(gl.int64) * _BLOCK + row, mask=rows, other=_PAD_DST)
    live = (dst != _PAD_DST).to(gl.int32)
    return gl.where(pos == 0, idx, gl.where(rows, live, fields))


@gluon.jit
def _row_box(p, rec, layout: gl.constexpr):
    """Rows of the tile's row block to load (128, 64 or 32): the fewest that cover its rows,
    and no fewer than ROW_BOX_MIN."""
    box = gl.where(
        _field(rec, 6, layout) != 0, _BLOCK, gl.where(_field(rec, 7, layout) != 0, _HALF, _QUARTER)
    )
    return gl.maximum(box, p.ROW_BOX_MIN)


@gluon.jit
def _producer(p, WG: gl.constexpr):
    one_warp: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    pid = gl.program_id(0)
    it = 0
    j = 0
    if p.DEVICE:
        lanes = gl.arange(0, _BLOCK_WINDOW, layout=one_warp)
        n1 = p.I // _BLOCK
        walk = 0
    running = True
    while running:
        if p.CLAIM_RELAXED:
            idx = gl.atomic_add(p.sync_ptr, 1, sem="relaxed")
        else:
            idx = gl.atomic_add(p.sync_ptr, 1)
        if p.DEVICE:
            kind, e, blk, nb, walk = decided_tile(
                idx, p.layout_ptr, p.n_tiles, n1, p.H // _BLOCK, walk, lanes
            )
        taken = _now() if p.TRACE else 0
        running = idx < p.n_tiles
        if p.DEVICE:
            rec = _claimed_record(p, idx, kind, e, blk, nb, running, one_warp)
        else:
            rec = _tile_record(p, idx, running, one_warp)
        slot = j % _TILE_SLOTS
        mbarrier.wait(p.tile_empty.index(slot), ((j // _TILE_SLOTS) & 1) ^ 1)
        p.tile_ids.index(slot).store(rec)
        mbarrier.arrive(p.tile_ready.index(slot), count=1)
        j += 1
        if running:
            kind = _field(rec, 1, one_warp)
            e = _field(rec, 2, one_warp)
            blk = _field(rec, 3, one_warp)
            nb = _field(rec, 4, one_warp)
            box = _row_box(p, rec, one_warp)
            ready = taken
            if kind == 0:
                w_row = e * 2 * p.I + nb * _BLOCK
                steps = p.H // _BLOCK
                it = _load_steps(p, it, True, blk * _BLOCK, box, p.w1_desc, w_row, steps)
                it = _load_steps(p, it, True, blk * _BLOCK, box, p.w1_desc, w_row + p.I, steps)
            else:
                # Wait until both warpgroups of every Linear-1 tile of this row block released it.
                need = 2 * (p.I // _BLOCK)
                done = gl.atomic_add(p.sync_ptr + 2 + blk, 0, sem="acquire")
                spins = 0
                while (done < need) & (spins < p.max_spin):
                    done = gl.atomic_add(p.sync_ptr + 2 + blk, 0, sem="acquire")
                    spins += 1
                if done < need:
                    gl.atomic_xchg(p.sync_ptr + 1, 1)
                _fence_proxy_async()
                if p.TRACE:
                    ready = _now()
                w_row = e * p.H + nb * _BLOCK
                it = _load_steps(p, it, False, blk * _BLOCK, box, p.w2_desc, w_row, p.I // _BLOCK)
            if p.TRACE:
                base = p.trace_ptr + idx.to(gl.int64) * 6
                gl.store(base + 0, pid.to(gl.int64))
                gl.store(base + 1, taken)
                gl.store(base + 2, ready)


@gluon.jit
def _mma_steps(
    p,
    it,
    a_scales,
    w_scales,
    k_steps,
    WG: gl.constexpr,
    acc_layout: gl.constexpr,
    A_WRITTEN: gl.constexpr,
):
    """fp32 [64, 128] = this warpgroup's rows of A @ B^T over k_steps ring slots, each
    step's product promoted by its activation (per row) and weight (per block) scales. A
    slot is waited for on "converted" (W4A8: its weights converted; W8A8: that is "ready").
    A_WRITTEN: the activation scales were written before the launch (Linear-1's)."""
    zero = gl.zeros([_HALF, _BLOCK], gl.float32, acc_layout)
    acc = zero
    if p.SCALES_TMA:
        sw = gl.load(w_scales)
        for k in range(k_steps):
            s = it % p.STAGES
            mbarrier.wait(p.converted.index(s), (it // p.STAGES) & 1)
            raw = _issue_mma(p, s, zero, WG)
            sa = _slot_scales(p, s, WG, acc_layout)
            sw_next = gl.load(w_scales + gl.minimum(k + 1, k_steps - 1))
            raw = warpgroup_mma_wait(num_outstanding=0, deps=(raw,))
            mbarrier.arrive(p.empty.index(s), count=1)
            acc += raw * (sa * sw)[:, None]
            sw = sw_next
            it += 1
        return acc, it
    # Scales written before the launch load before the first slot is waited for (PREFETCH);
    # Linear-2's activation scales only once it is full: that is after the producer saw the
    # row block released, so the intermediate's scales are written.
    early_w: gl.constexpr = p.PREFETCH
    early_a: gl.constexpr = p.PREFETCH and A_WRITTEN
    if early_w:
        sw = gl.load(w_scales)
    if early_a:
        sa = gl.load(a_scales)
    mbarrier.wait(p.converted.index(it % p.STAGES), (it // p.STAGES) & 1)
    if not early_a:
        sa = gl.load(a_scales)
    if not early_w:
        sw = gl.load(w_scales)
    for k in range(k_steps):
        s = it % p.STAGES
        mbarrier.wait(p.converted.index(s), (it // p.STAGES) & 1)
        raw = _issue_mma(p, s, zero, WG)
        nxt = gl.minimum(k + 1, k_steps - 1)  # next step's scales load under this MMA
        sa_next = gl.load(a_scales + nxt)
        sw_next = gl.load(w_scales + nxt)
        raw = warpgroup_mma_wait(num_outstanding=0, deps=(raw,))
        mbarrier.arrive(p.empty.index(s), count=1)
        acc += raw * (sa * sw)[:, None]
        sa = sa_next
        sw = sw_next
        it += 1
    return acc, it


@gluon.jit
def _slot_scales(p, s, WG: gl.constexpr, acc_layout: gl.constexpr):
    """Slot s's activation scale of each of this warpgroup's rows."""
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    rows = p.sa_bufs.index(s)._reinterpret(gl.float32, [_BLOCK], flat).slice(WG * _HALF, _HALF)
    return rows.load(gl.SliceLayout(1, acc_layout))


@gluon.jit
def _skip_steps(p, it, k_steps, WG: gl.constexpr):
    """Release k_steps ring slots without an MMA: this warpgroup's rows are all padding.
    Each slot is waited for first, so the release counts toward that slot's current fill
    (running ahead would release a later fill before the other warpgroup read this one)."""
    for _ in range(k_steps):
        s = it % p.STAGES
        mbarrier.wait(p.converted.index(s), (it // p.STAGES) & 1)
        mbarrier.arrive(p.empty.index(s), count=1)
        it += 1
    return it


@gluon.jit
def _converted(p, s, half: gl.constexpr):
    """W4: slot s's converted FP8 weights of the step's first (half 0) or last 64 channels."""
    if p.SPLIT:
        if half == 0:
            buf = p.c_bufs.index(s)
        else:
            buf = p.c_hi_bufs.index(s)
    else:
        buf = p.c_bufs.index(2 * s + half)
    return buf


@gluon.jit
def _issue_mma(p, s, zero, WG: gl.constexpr):
    """Slot s's asynchronous MMA for this warpgroup's rows (W4A8: the two halves, chained)."""
    if p.W4:
        a_lo = p.a_bufs.index(2 * s).slice(WG * _HALF, _HALF)
        a_hi = p.a_bufs.index(2 * s + 1).slice(WG * _HALF, _HALF)
        raw = warpgroup_mma(
            a_lo, _converted(p, s, 0).permute((1, 0)), zero, use_acc=False, is_async=True
        )
        raw = warpgroup_mma(a_hi, _converted(p, s, 1).permute((1, 0)), raw, is_async=True)
    else:
        a = p.a_bufs.index(s).slice(WG * _HALF, _HALF)
        b = p.b_bufs.index(s).permute((1, 0))
        raw = warpgroup_mma(a, b, zero, use_acc=False, is_async=True)
    return raw


@gluon.jit
def _take_tile(p, j, layout: gl.constexpr):
    """The producer's j-th tile record (_tile_record; index n_tiles or more: no more tiles),
    read from the tile ring into `layout` by a 4-warp partition (math or converter)."""
    slot = j % _TILE_SLOTS
    mbarrier.wait(p.tile_ready.index(slot), (j // _TILE_SLOTS) & 1)
    rec = p.tile_ids.index(slot).load(layout)
    mbarrier.arrive(p.tile_empty.index(slot), count=1)
    return rec


@gluon.jit
def _converter(p, C: gl.constexpr):
    """W4: converter C of W4_CONVERTERS turns every W4_CONVERTERS-th slot's packed weights
    into its two FP8 halves, in ring order (the tile list's steps), each published to the
    tensor cores through the slot's "converted" barrier."""
    # CONVERT_ROWS rows x 64 bytes at a time, 16-byte chunks (one per 32 rows) per thread:
    # few live registers.
    rows: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])
    one_wg: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    it = 0
    j = 0
    running = True
    while running:
        rec = _take_tile(p, j, one_wg)
        idx = _field(rec, 0, one_wg)
        j += 1
        running = idx < p.n_tiles
        if running:
            if p.TILE_FROM_RECORD:
                kind = _field(rec, 1, one_wg)
            else:
                kind = gl.load(p.tiles_ptr + idx * 4)
            k_steps = gl.where(kind == 0, 2 * (p.H // _BLOCK), p.I // _BLOCK)
            # This converter's steps: the ring counter's residue C (the tile starts at `it`).
            first = (C - it % _W4_CONVERTERS + _W4_CONVERTERS) % _W4_CONVERTERS
            it0 = it
            for k in range(first, k_steps, _W4_CONVERTERS):
                it = it0 + k
                s = it % p.STAGES
                mbarrier.wait(p.ready.index(s), (it // p.STAGES) & 1)
                n_rows: gl.constexpr = p.CONVERT_ROWS
                for part in gl.static_range(_BLOCK // n_rows):
                    packed = p.b_bufs.index(s).slice(part * n_rows, n_rows).load(rows)
                    lo, hi = gl.inline_asm_elementwise(
                        _INT4_TO_FP8,
                        "=r,=r,r",
                        [packed],
                        dtype=(gl.int8, gl.int8),
                        is_pure=True,
                        pack=4,
                    )
                    lo_dst = _converted(p, s, 0).slice(part * n_rows, n_rows)
                    lo_dst.store(lo.to(gl.float8e4nv, bitcast=True))
                    hi_dst = _converted(p, s, 1).slice(part * n_rows, n_rows)
                    hi_dst.store(hi.to(gl.float8e4nv, bitcast=True))
                fence_async_shared()
                # Every warp stored its rows before one thread arrives.
                gl.thread_barrier()
                mbarrier.arrive(p.converted.index(s), count=1)
            it = it0 + k_steps


@gluon.jit
def _math(p, WG: gl.constexpr):
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _BLOCK, 32]
    )
    # Row-major layouts for the epilogue: 16-byte stores of FP8 (h) and bf16 (out) rows.
    h_store: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    out_store: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    one_wg: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    it = 0
    j = 0
    running = True
    while running:
        rec = _take_tile(p, j, one_wg)
        idx = _field(rec, 0, one_wg)
        j += 1
        running = idx < p.n_tiles
        if running:
            if p.TILE_FROM_RECORD:
                kind = _field(rec, 1, one_wg)
                e = _field(rec, 2, one_wg).to(gl.int64)
                blk = _field(rec, 3, one_wg)
                nb = _field(rec, 4, one_wg)
            else:
                kind = gl.load(p.tiles_ptr + idx * 4)
                e = gl.load(p.tiles_ptr + idx * 4 + 1).to(gl.int64)
                blk = gl.load(p.tiles_ptr + idx * 4 + 2)
                nb = gl.load(p.tiles_ptr + idx * 4 + 3)
            row0 = blk.to(gl.int64) * _BLOCK + WG * _HALF
            base = p.trace_ptr + idx.to(gl.int64) * 6
            # An expert's rows fill its blocks from the start (routing.dispatch_plan), so a
            # half whose first row is padding holds no row at all: its warpgroup releases
            # the slots without an MMA (one H200: see SKIP_PADDING_HALVES).
            live = True
            if p.SKIP_PADDING:
                if p.PREFETCH:
                    live = _field(rec, 5 + WG, one_wg) != 0
                else:
                    live = gl.load(p.row_dst_ptr + row0) != _PAD_DST
            if kind == 0:
                if live:
                    it = _linear1_rows(p, it, e, nb, row0, base, WG, acc_layout, h_store)
                else:
                    it = _skip_steps(p, it, 2 * (p.H // _BLOCK), WG)
                _fence_proxy_async()
                # Every warp of this warpgroup stored its rows before one thread releases them.
                gl.thread_barrier()
                gl.atomic_add(p.sync_ptr + 2 + blk, 1, sem="release")
            else:
                if live:
                    it = _linear2_rows(p, it, e, nb, row0, base, WG, acc_layout, out_store)
                else:
                    it = _skip_steps(p, it, p.I // _BLOCK, WG)
                if p.TRACE:
                    gl.thread_barrier()
            if p.TRACE:
                gl.atomic_max(base + 5, _now())


@gluon.jit
def _linear1_rows(
    p, it, e, nb, row0, base, WG: gl.constexpr, acc_layout: gl.constexpr, h_store: gl.constexpr
):
    """This warpgroup's 64 rows of a Linear-1 tile: gate and up over the ring, SwiGLU, and
    the rows quantized into the intermediate (one FP8 scale per row and 128 channels)."""
    H = p.H
    I = p.I  # noqa: E741
    rows_acc = gl.arange(0, _HALF, layout=gl.SliceLayout(1, acc_layout))
    rows_h = gl.arange(0, _HALF, layout=gl.SliceLayout(1, h_store))
    cols_h = gl.arange(0, _BLOCK, layout=gl.SliceLayout(0, h_store))
    s_rows = p.s1_ptr + e * (2 * I // _BLOCK) * (H // _BLOCK)
    a_scales = p.xs_ptr + (row0 + rows_acc) * (H // _BLOCK)
    steps = H // _BLOCK
    gate, it = _mma_steps(p, it, a_scales, s_rows + nb * steps, steps, WG, acc_layout, True)
    if p.GATE_BF16:
        gate = gate.to(gl.bfloat16)
    up_scales = s_rows + (I // _BLOCK + nb) * steps
    up, it = _mma_steps(p, it, a_scales, up_scales, steps, WG, acc_layout, True)
    gate = gate.to(gl.float32)
    if p.TRACE:
        gl.atomic_max(base + 3, _now())
    # SwiGLU and the row's FP8 scale, with one tanh (or division) per element and one
    # division per row (the tensor cores idle while both warpgroups run this epilogue).
    if p.SWIGLU_TANH:
        half_gate = gate * 0.5
        t = gl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=f,f", [half_gate], dtype=gl.float32, is_pure=True, pack=1
        )
        half_h = half_gate * up  # g u sigmoid(g) = (g / 2) u (1 + tanh(g / 2))
        h = half_h * t + half_h
    else:
        h = gl.fdiv(gate * up, 1.0 + gl.exp(-gate))
    amax = gl.maximum(gl.max(gl.abs(h), axis=1), _AMAX_FLOOR)
    scale = amax / _FP8_MAX
    q = gl.convert_layout((h * (_FP8_MAX / amax)[:, None]).to(gl.float8e4nv), h_store)
    if p.TRACE and WG == 0:
        gl.store(base + 4, _now())
    rows = row0 + rows_h
    gl.store(p.h_ptr + rows[:, None] * I + (nb * _BLOCK + cols_h)[None, :], q)
    if p.SCALES_TMA:  # step-major: [I / 128, R]
        gl.store(p.hs_ptr + nb.to(gl.int64) * p.R + row0 + rows_acc, scale)
    else:
        gl.store(p.hs_ptr + (row0 + rows_acc) * (I // _BLOCK) + nb, scale)
    return it


@gluon.jit
def _linear2_rows(
    p, it, e, nb, row0, base, WG: gl.constexpr, acc_layout: gl.constexpr, out_store: gl.constexpr
):
    """This warpgroup's 64 rows of a Linear-2 tile, each stored straight into its home
    rank's combine buffer (out_ptr + row_dst[r]: the combine push)."""
    H = p.H
    I = p.I  # noqa: E741
    rows_acc = gl.arange(0, _HALF, layout=gl.SliceLayout(1, acc_layout))
    rows_o = gl.arange(0, _HALF, layout=gl.SliceLayout(1, out_store))
    cols_o = gl.arange(0, _BLOCK, layout=gl.SliceLayout(0, out_store))
    if p.PREFETCH:  # the destinations load under the MMAs
        dst = gl.load(p.row_dst_ptr + row0 + rows_o)
    acc, it = _mma_steps(
        p,
        it,
        p.hs_ptr + (row0 + rows_acc) * (I // _BLOCK),
        p.s2_ptr + (e * (H // _BLOCK) + nb) * (I // _BLOCK),
        I // _BLOCK,
        WG,
        acc_layout,
        False,
    )
    if p.TRACE:
        gl.atomic_max(base + 3, _now())
    y = gl.convert_layout(acc.to(gl.bfloat16), out_store)
    if not p.PREFETCH:
        dst = gl.load(p.row_dst_ptr + row0 + rows_o)
    valid = dst != _PAD_DST
    dst = gl.multiple_of(gl.where(valid, dst, 0), 8)  # 16-byte aligned rows
    if p.TRACE and WG == 0:
        gl.store(base + 4, _now())
    gl.store(p.out_ptr + dst[:, None] + (nb * _BLOCK + cols_o)[None, :], y, mask=valid[:, None])
    return it


@gluon.jit
def _marked(value, asm: gl.constexpr):
    """value, through a move whose PTX comment is `asm`'s mark (ptx_edits)."""
    return gl.inline_asm_elementwise(asm, "=r,r", [value], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _fused_moe_ws(
    tiles_ptr,
    n_tiles,
    sync_ptr,
    xs_ptr,
    s1_ptr,
    s2_ptr,
    h_ptr,
    hs_ptr,
    out_ptr,
    row_dst_ptr,
    trace_ptr,
    layout_ptr,
    x_desc,
    w1_desc,
    h_desc,
    w2_desc,
    x64_desc,
    x32_desc,
    h64_desc,
    h32_desc,
    xs_desc,
    hs_desc,
    H,
    I,  # noqa: E741
    max_spin,
    R,
    TRACE: gl.constexpr,
    W4: gl.constexpr,
    SKIP_PADDING: gl.constexpr,
    TILE_MAJOR: gl.constexpr,
    PREFETCH: gl.constexpr,
    ROW_BOX_MIN: gl.constexpr,
    GATE_BF16: gl.constexpr,
    SPLIT: gl.constexpr,
    CONVERT_ROWS: gl.constexpr,
    CLAIM_RELAXED: gl.constexpr,
    SWIGLU_TANH: gl.constexpr,
    SCALES_TMA: gl.constexpr,
    DROP_WAIT_BARRIERS: gl.constexpr,
    DEVICE: gl.constexpr,
):
    if DEVICE:  # the layout's block count, written on the device: one graph, any routing
        n_tiles = gl.load(layout_ptr + _LAYOUT_BLOCKS) * ((H + I) // _BLOCK)
    # The marks that ask ptx_edits to edit this build's PTX.
    if DROP_WAIT_BARRIERS and W4:  # its converters keep theirs
        n_tiles = _marked(n_tiles, _DROP_MATH_WAIT_BARRIERS_ASM)
    elif DROP_WAIT_BARRIERS:
        n_tiles = _marked(n_tiles, _DROP_WAIT_BARRIERS_ASM)
    STAGES: gl.constexpr = _W4_STAGES if W4 else _STAGES
    a_block: gl.constexpr = x_desc.block_type.shape
    b_block: gl.constexpr = w1_desc.block_type.shape
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    if W4:
        a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [2 * STAGES] + a_block, x_desc.layout)
        b_bufs = gl.allocate_shared_memory(gl.uint8, [STAGES] + b_block, w1_desc.layout)
        if SPLIT:
            c_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES] + a_block, x_desc.layout)
            c_hi_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES] + a_block, x_desc.layout)
        else:
            c_bufs = gl.allocate_shared_memory(gl.float8e4nv, [2 * STAGES] + a_block, x_desc.layout)
            c_hi_bufs = c_bufs
        converted = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(converted.index(i), count=1)  # the converter's
    else:
        a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES] + a_block, x_desc.layout)
        b_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES] + b_block, w1_desc.layout)
        c_bufs = b_bufs
        c_hi_bufs = b_bufs
        converted = ready
    scale_slots: gl.constexpr = STAGES if SCALES_TMA else 1  # unused without SCALES_TMA
    sa_block: gl.constexpr = xs_desc.block_type.shape
    sa_bufs = gl.allocate_shared_memory(gl.float32, [scale_slots] + sa_block, xs_desc.layout)
    tile_ids = gl.allocate_shared_memory(
        gl.int32, [_TILE_SLOTS, _RECORD], gl.SwizzledSharedLayout(1, 1, 1, [0])
    )
    tile_ready = gl.allocate_shared_memory(gl.int64, [_TILE_SLOTS, 1], mbarrier.MBarrierLayout())
    tile_empty = gl.allocate_shared_memory(gl.int64, [_TILE_SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # from both math warpgroups
    for i in gl.static_range(_TILE_SLOTS):
        mbarrier.init(tile_ready.index(i), count=1)
        # read by both math warpgroups (and W4's converter) before the producer reuses it
        mbarrier.init(tile_empty.index(i), count=2 + _W4_CONVERTERS if W4 else 2)
    p = Shared(
        (
            x_desc,
            w1_desc,
            h_desc,
            w2_desc,
            x64_desc,
            x32_desc,
            h64_desc,
            h32_desc,
            xs_desc,
            hs_desc,
        ),
        (a_bufs, b_bufs, c_bufs, c_hi_bufs, ready, empty, converted, sa_bufs),
        (tile_ids, tile_ready, tile_empty),
        (
            tiles_ptr,
            sync_ptr,
            xs_ptr,
            s1_ptr,
            s2_ptr,
            h_ptr,
            hs_ptr,
            out_ptr,
            row_dst_ptr,
            trace_ptr,
        ),
        layout_ptr,
        (n_tiles, H, I, max_spin, R),
        TRACE,
        W4,
        STAGES,
        (
            SKIP_PADDING,
            TILE_MAJOR,
            PREFETCH,
            ROW_BOX_MIN,
            GATE_BF16,
            SPLIT,
            CONVERT_ROWS,
            CLAIM_RELAXED,
            SWIGLU_TANH,
            SCALES_TMA,
            DEVICE,
        ),
    )
    if W4:
        gl.warp_specialize(
            [
                (_math, (p, 0)),
                (_math, (p, 1)),
                (_converter, (p, 0)),
                (_converter, (p, 1)),
                (_producer, (p, 0)),
            ],
            _W4_WORKER_WARPS,
            _W4_REGS,
        )
    else:
        gl.warp_specialize(
            [(_math, (p, 0)), (_math, (p, 1)), (_producer, (p, 0))],
            _WORKER_WARPS,
            [_MATH_REGS, _PRODUCER_REGS],
        )


def descriptors(x, w1, h, w2, H: int, I: int, precision: str = "w8a8", *, scales):  # noqa: E741
    """Gluon TMA descriptors, weights as 2-D (experts * rows, K or K/2 packed bytes): W8A8
    128 x 128 FP8 blocks; W4A8 128 x 64 (activation halves, packed weight bytes). With
    TILE_MAJOR_WEIGHTS the weights' descriptors are over their tile-major copies.
    scales: (xs_steps, hs), whose descriptors SCALES_TMA reads: x's scales step-major
    (step_major) and the intermediate's buffer as step-major [I / 128, rows] (its layout is
    this kernel's own)."""
    w4 = _is_w4(precision)
    width = HALF if w4 else BLOCK
    fp8 = gl.NVMMASharedLayout.get_default_for([BLOCK, width], gl.float8e4nv)
    packed = gl.NVMMASharedLayout.get_default_for([BLOCK, width], gl.uint8) if w4 else fp8

    def weights(w):
        if TILE_MAJOR_WEIGHTS:
            w = tile_major_copy(w, width)
        w = w.reshape(-1, w.shape[-1])
        return TensorDescriptor(w, list(w.shape), [w.shape[1], 1], [BLOCK, width], packed)

    def rows(a, k, box):
        return TensorDescriptor(a, [a.shape[0], k], [k, 1], [box, width], fp8)

    return (
        rows(x, H, BLOCK),
        weights(w1),
        rows(h, I, BLOCK),
        weights(w2),
        *(rows(x, H, box) for box in ROW_BOXES[1:]),
        *(rows(h, I, box) for box in ROW_BOXES[1:]),
        *scale_descriptors(*scales, I=I, rows=x.shape[0]),
    )


def scale_descriptors(xs_steps, hs, *, I: int, rows: int):  # noqa: E741
    """SCALES_TMA's descriptors: a step's scales of 128 rows ([1, 128] boxes) of x's
    step-major scales and of the intermediate's (its buffer read as [I / 128, rows])."""
    layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    hs_steps = hs.view(-1)[: (I // BLOCK) * rows].view(I // BLOCK, rows)

    def steps(a):
        return TensorDescriptor(a, list(a.shape), [a.shape[1], 1], [1, BLOCK], layout)

    return steps(xs_steps), steps(hs_steps)


def _one_of(name: str, choices: tuple[int, ...]) -> int:
    """The launch constant `name` as it is now, checked: one of `choices`."""
    value = globals()[name]
    if value not in choices:
        raise ValueError(f"{name}={value}: expected one of {choices}")
    return value


def row_box_min() -> int:
    """ROW_BOX_MIN, checked: one of ROW_BOXES."""
    return _one_of("ROW_BOX_MIN", ROW_BOXES)


def tile_major(w, width: int):
    """(E, R, K) weights as (E R K / width, width) rows in which each 128-row x width-column
    step is 128 consecutive rows, in the order (row block, step): block row
    (r / 128) * (K / width) + k holds rows r..r+127, columns k width..(k+1) width."""
    experts, rows, k = w.shape
    if rows % BLOCK or k % width:
        raise ValueError(f"weights {tuple(w.shape)} are not whole {BLOCK} x {width} tiles")
    tiles = w.reshape(experts * rows // BLOCK, BLOCK, k // width, width).transpose(1, 2)
    out = w.new_empty((w.numel() // width, width))  # never a view: it must not keep w alive
    out.view(tiles.shape).copy_(tiles)
    return out


# id(weights) -> (a weak reference to them, their tile-major copy): a copy lives as long as
# the weights it was made from, so a layer keeps one copy and a freed layer none.
_tile_major_copies: dict = {}


def tile_major_copy(w, width: int):
    """The tile-major copy of weight tensor w (tile_major), made at its first use."""
    entry = _tile_major_copies.get(id(w))
    if entry is not None and entry[0]() is w:
        return entry[1]
    key = id(w)
    copy = tile_major(w, width)
    _tile_major_copies[key] = (weakref.ref(w, lambda _: _tile_major_copies.pop(key, None)), copy)
    return copy


def _is_w4(precision: str) -> bool:
    if precision not in PRECISIONS:
        raise ValueError(
            f"the warp-specialized kernel runs {' and '.join(PRECISIONS)}, not {precision!r}"
        )
    return precision == "w4a8"


def args(*, tiles, sync, xs, s1, s2, h, hs, out, row_dst, trace, descs, H, I, max_spin, R, layout):  # noqa: E741
    """The kernel's positional arguments, in its signature's order (layout None: list
    mode, where it is a constexpr and no argument of the compiled kernel)."""
    return (
        tiles,
        tiles.shape[0],
        sync,
        xs,
        s1,
        s2,
        h,
        hs,
        out,
        row_dst,
        trace,
        layout,
        *descs,
        H,
        I,
        max_spin,
        R,
    )


def launch(*, precision: str = "w8a8", num_programs: int, trace=None, layout=None, **kw) -> None:
    """Enqueue one launch (megamoe.launch checks the inputs and picks this kernel); a
    `trace` buffer builds the TRACE variant, a `layout` the device mode (megamoe.launch)."""
    _fused_moe_ws[(num_programs,)](
        *args(trace=trace if trace is not None else kw["row_dst"], layout=layout, **kw),
        **launch_constexprs(precision, trace=trace is not None, device=layout is not None),
        num_warps=NUM_WARPS,
        maxnreg=max_regs(precision),
    )


def launch_constexprs(precision: str, trace: bool = False, device: bool = False) -> dict:
    """The kernel's constexpr arguments as a launch passes them now (the launch constants
    in force); device: the device mode's build."""
    return {
        "TRACE": trace,
        "W4": _is_w4(precision),
        "SKIP_PADDING": SKIP_PADDING_HALVES,
        "TILE_MAJOR": TILE_MAJOR_WEIGHTS,
        "PREFETCH": PREFETCH_TILE,
        "ROW_BOX_MIN": row_box_min(),
        "GATE_BF16": holds_gate_bf16(precision),
        "SPLIT": bool(SPLIT_CONVERTED),
        "CONVERT_ROWS": convert_rows(),
        "CLAIM_RELAXED": bool(CLAIM_RELAXED),
        "SWIGLU_TANH": bool(SWIGLU_TANH),
        "SCALES_TMA": bool(SCALES_TMA),
        "DROP_WAIT_BARRIERS": drops_wait_barriers(precision),
        "DEVICE": device,
    }


def drops_wait_barriers(precision: str) -> bool:
    """Whether a precision's build drops the barriers before its mbarrier waits
    (DROP_WAIT_BARRIERS; W4A8's math warpgroups' with W4_DROP_WAIT_BARRIERS)."""
    return bool(DROP_WAIT_BARRIERS) and (not _is_w4(precision) or bool(W4_DROP_WAIT_BARRIERS))


def holds_gate_bf16(precision: str) -> bool:
    """Whether a precision's build holds gate in bf16 (GATE_BF16: W4A8's only)."""
    return GATE_BF16 and _is_w4(precision)


def convert_rows() -> int:
    """CONVERT_ROWS, checked: one of CONVERT_ROW_CHOICES."""
    return _one_of("CONVERT_ROWS", CONVERT_ROW_CHOICES)


def launch_options(precision: str) -> dict:
    """The launch constants in force for a precision's build (LAUNCH_OPTIONS), as a raw
    file's kernel record names them: what ran, and what changes our kernel's records when
    it changes."""
    options = {"padding_halves": "skipped" if SKIP_PADDING_HALVES else "computed"}
    if TILE_MAJOR_WEIGHTS:  # absent: row-major, as every record before the option
        options["weight_layout"] = "tile-major"
    if PREFETCH_TILE:  # absent: each warpgroup reads the tile list, as every record before
        options["tile_record"] = "handed over"
    if row_box_min() < BLOCK:  # absent: every row of a block loaded, as every record before
        options["activation_rows"] = (
            f"the fewest of {list(ROW_BOXES)} covering a block's rows, at least {ROW_BOX_MIN}"
        )
    if holds_gate_bf16(precision):  # absent: gate held in fp32, as every record before the option
        options["gate_held"] = "bf16"
    if _is_w4(precision) and SPLIT_CONVERTED:  # absent: one buffer, as every record before
        options["converted_halves"] = "one buffer each"
    if _is_w4(precision) and convert_rows() != 32:  # absent: 32, as every record before
        options["converted_rows_per_store"] = convert_rows()
    if CLAIM_RELAXED:  # absent: an acquire-release claim, as every record before the option
        options["tile_claim"] = "relaxed"
    if SWIGLU_TANH:  # absent: an exp and a division, as every record before the option
        options["swiglu_sigmoid"] = "tanh.approx"
    if SCALES_TMA:  # absent: each step's scales loaded by the math warpgroups
        options["step_scales"] = "with the slot, by TMA (scales step-major)"
    if drops_wait_barriers(precision):  # absent: Triton's barriers, as every record before
        where = " in the math warpgroups" if _is_w4(precision) else ""
        options["wait_barriers"] = f"dropped from the PTX{where} (ptx_edits)"
    # Device mode's interleaved; absent: decided in units, as every record before 2026-12-08.
    options["device_interleaved"] = "counted from the layout"
    return options


def max_regs(precision: str) -> int:
    """Registers per thread at launch (setmaxnreg re-balances them per partition)."""
    return W4_MAX_REGS if _is_w4(precision) else MAX_REGS


def warps(precision: str) -> int:
    """Warps per CTA that run code, every partition (W4A8's CTA is padded to 16)."""
    return NUM_WARPS + sum(W4_WORKER_WARPS if _is_w4(precision) else WORKER_WARPS)


def stages(precision: str) -> int:
    """Operand ring slots of a precision's build."""
    return W4_STAGES if _is_w4(precision) else STAGES


def launched_build(precision: str, device: bool = False):
    """The build a launch runs now (launch_constexprs), compiled for sm_90 without a GPU."""
    return _compile_sm90(precision, launch_constexprs(precision, device=device))


def compile_for_sm90(
    trace: bool = False,
    precision: str = "w8a8",
    skip_padding: bool = True,
    tile_major_weights: bool = False,
    prefetch_tile: bool = False,
    row_box_min: int = BLOCK,
    gate_bf16: bool = False,
    split_converted: bool = False,
    convert_rows: int = 32,
    claim_relaxed: bool = False,
    swiglu_tanh: bool = False,
    scales_tma: bool = False,
    drop_wait_barriers: bool = False,
    device: bool = False,
):
    """Compile the kernel for sm_90 without a GPU (the CPU tests' check that it lowers)."""
    w4 = _is_w4(precision)
    constexprs = {
        "TRACE": trace,
        "W4": w4,
        "SKIP_PADDING": skip_padding,
        "TILE_MAJOR": tile_major_weights,
        "PREFETCH": prefetch_tile,
        "ROW_BOX_MIN": row_box_min,
        "GATE_BF16": gate_bf16 and w4,
        "SPLIT": split_converted,
        "CONVERT_ROWS": convert_rows,
        "CLAIM_RELAXED": claim_relaxed,
        "SWIGLU_TANH": swiglu_tanh,
        "SCALES_TMA": scales_tma,
        "DROP_WAIT_BARRIERS": drop_wait_barriers,
        "DEVICE": device,
    }
    return _compile_sm90(precision, constexprs)


def _compile_sm90(precision: str, constexprs: dict):
    """The kernel with these constexpr arguments, compiled for sm_90."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    w4 = _is_w4(precision)
    fp8 = torch.empty(BLOCK, BLOCK, dtype=torch.float8_e4m3fn)
    weight_dtype = torch.uint8 if w4 else fp8.dtype
    weight_k = BLOCK // 2 if w4 else BLOCK
    w1 = torch.empty(1, 2 * BLOCK, weight_k, dtype=weight_dtype)
    w2 = torch.empty(1, BLOCK, weight_k, dtype=weight_dtype)
    i32 = torch.empty(4, dtype=torch.int32)
    f32 = torch.empty(4, dtype=torch.float32)
    i64 = torch.empty(4, dtype=torch.int64)
    scales = (  # one row block, one step: x's scales step-major, the intermediate's
        torch.empty(1, BLOCK, dtype=torch.float32),
        torch.empty(BLOCK, 1, dtype=torch.float32),
    )
    values = args(
        tiles=i32.view(1, 4),
        sync=i32,
        xs=f32,
        s1=f32,
        s2=f32,
        h=fp8,
        hs=scales[1],
        out=torch.empty(4, dtype=torch.bfloat16),
        row_dst=i64,
        trace=i64,
        descs=descriptors(fp8, w1, fp8, w2, BLOCK, BLOCK, precision, scales=scales),
        H=BLOCK,
        I=BLOCK,
        max_spin=2,
        R=BLOCK,
        layout=i32 if constexprs["DEVICE"] else None,
    )
    names = list(_fused_moe_ws.arg_names)
    # The values stop before the trailing constexprs.
    signature = {name: mangle_type(v) for name, v in zip(names, values, strict=False)}
    constants = {(i,): None for i, v in enumerate(values) if v is None}  # list mode's layout
    constants.update({(names.index(name),): value for name, value in constexprs.items()})
    for name in constexprs:
        signature[name] = "constexpr"
    # What a launch specializes on: 16-byte aligned pointers and sizes divisible by 16.
    aligned = [
        i
        for i, v in enumerate(values)
        if isinstance(v, torch.Tensor) or names[i] in ("H", "I", "R")
    ]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    source = GluonASTSource(_fused_moe_ws, signature, constants, attrs)
    return triton.compile(
        source,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": NUM_WARPS, "maxnreg": max_regs(precision)},
    )
