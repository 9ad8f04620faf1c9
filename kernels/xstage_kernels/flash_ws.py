"""Our FlashAttention forward, warp-specialized (Gluon, sm_90): flash_ulysses.py's routed
kernel (same arguments, same epilogue that stores each row at its owner) built the way the
MoE kernel (megamoe_ws.py) keeps its tensor cores busy.

Why: the `tl` kernel's eight warps all load K/V and meet at a CTA barrier every block, so
the two warpgroups' softmax and MMAs serialize (70-79% of FA3's TFLOP/s on an H200). Here
each CTA (128 query rows of one batch item and head) has three partitions:

- a producer warp loads the Q tile once and streams K and V blocks by TMA into a ring of
  STAGES slots, each with its own K and V "ready" barriers (S = Q K^T starts before V is in)
  and K and V "empty" barriers both math warpgroups arrive on;
- two math warpgroups, each owning 64 query rows: S = Q K^T (wgmma from shared memory),
  online softmax in registers (exp2, the scale folded into one FMA), P as bf16 registers
  for O += P V (wgmma with A from registers). They never meet at a CTA barrier, so one's
  softmax runs under the other's MMAs. With OVERLAP (the default), FA3's intra-warpgroup
  overlap as well: block j's Q K^T and block j-1's P V are issued together, and block j's
  softmax runs while that P V is in flight. K and V slots are released apart (K once both
  Q K^T are done), so the next K can land while P V still reads V.

The epilogue divides by the row sums, re-lays the rows out through the warpgroup's own Q
tile (no layout-conversion scratch, so a third K/V slot would fit: STAGES = 3 tied with 2)
and stores each row with 16-byte stores at q_ptr + (its destination's base - q's address)
+ its offset there: one address computation for the local output and for peer buffers
mapped into this process (the fused All-to-All).

Measured (one H200, attention alone, batch 1, head_dim 128, S = 8K-32K, 3-20 heads,
2026-12-03, kernels/ab/2026-12-03-attention-*.json, FA3 in the same rounds): OVERLAP takes
0.80-0.90x the time of the loop without it (95% CI half-widths 0.005-0.037), 82-98% of
FA3's TFLOP/s (74-81% without); 3 heads at S = 8K (192 CTAs, 1.5 waves) is furthest from
FA3. Not done (FA3 does it): a persistent tile scheduler.

Used for S a multiple of 128 with contiguous q, k, v on a GPU (flash_ulysses.launch_config
says which ran); the tl kernel serves every other case and the interpreter. Gluon has no
interpreter: the CPU tests compile this for sm_90; on a GPU every attention point is checked
against torch's SDPA (poisoned output, fresh inputs) before it is timed.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.language.core import _aggregate as aggregate

BLOCK_M = 128  # query rows per CTA
BLOCK_N = 128  # keys per K/V block
HALF = BLOCK_M // 2  # query rows per math warpgroup
STAGES = 2  # K/V slots: 2 x 64 KiB with the 32 KiB Q tile (3 fit: 224 KiB)
# Launch options (kernels/ab/flash_ab.py pairs their values): OVERLAP issues block j's
# Q K^T and block j-1's P V together and runs block j's softmax under the P V.
OVERLAP = 1
LAUNCH_OPTIONS = ("OVERLAP", "STAGES")
MATH_REGS = 232
PRODUCER_REGS = 40
MAX_REGS = 168  # at launch: 12 warps (9 padded to 12) x 32 x 168 fits 64K
NUM_WARPS = 4  # the default partition: math warpgroup 0
WORKER_WARPS = (4, 1)  # math warpgroup 1, the producer
HEAD_DIMS = (64, 128)

_BLOCK_M = gl.constexpr(BLOCK_M)
_BLOCK_N = gl.constexpr(BLOCK_N)
_HALF = gl.constexpr(HALF)
_WORKER_WARPS = gl.constexpr(WORKER_WARPS)
_REGS = gl.constexpr([MATH_REGS, PRODUCER_REGS])


@aggregate
class Shared:
    """What every partition sees: descriptors, buffers and barriers, routing, sizes."""

    q_desc: tma.tensor_descriptor
    k_desc: tma.tensor_descriptor
    v_desc: tma.tensor_descriptor
    q_smem: gl.shared_memory_descriptor
    k_bufs: gl.shared_memory_descriptor
    v_bufs: gl.shared_memory_descriptor
    q_ready: gl.shared_memory_descriptor
    k_ready: gl.shared_memory_descriptor
    v_ready: gl.shared_memory_descriptor
    k_empty: gl.shared_memory_descriptor
    v_empty: gl.shared_memory_descriptor
    q_ptr: gl.tensor
    dest_ptrs: gl.tensor
    q_addr: gl.tensor
    qk_scale: gl.tensor
    stride_ob: gl.tensor
    stride_os: gl.tensor
    stride_oh: gl.tensor
    seq_len: gl.tensor
    local_heads: gl.tensor
    rows_per_dest: gl.tensor
    head_offset: gl.tensor
    STAGES: gl.constexpr
    OVERLAP: gl.constexpr

    @gluon.constexpr_function
    def __init__(self, descs, buffers, barriers, routing, sizes, STAGES, OVERLAP):
        self.q_desc, self.k_desc, self.v_desc = descs
        self.q_smem, self.k_bufs, self.v_bufs = buffers
        self.q_ready, self.k_ready, self.v_ready, self.k_empty, self.v_empty = barriers
        (
            self.q_ptr,
            self.dest_ptrs,
            self.q_addr,
            self.qk_scale,
            self.stride_ob,
            self.stride_os,
            self.stride_oh,
        ) = routing
        self.seq_len, self.local_heads, self.rows_per_dest, self.head_offset = sizes
        self.STAGES = gl.constexpr(STAGES)
        self.OVERLAP = gl.constexpr(OVERLAP)


@gluon.jit
def _tile(p):
    """(first row of this batch item in the (B*S, H*D) views, its batch index, head)."""
    bh = gl.program_id(1)
    b = bh // p.local_heads
    return b * p.seq_len, b, bh % p.local_heads


@gluon.jit
def _producer(p):
    D: gl.constexpr = p.q_desc.block_shape[1]
    nbytes: gl.constexpr = _BLOCK_N * D * p.q_desc.dtype.primitive_bitwidth // 8
    row0, b, h = _tile(p)
    col = h * D
    mbarrier.expect(p.q_ready, _BLOCK_M * D * p.q_desc.dtype.primitive_bitwidth // 8)
    tma.async_copy_global_to_shared(
        p.q_desc, [row0 + gl.program_id(0) * _BLOCK_M, col], p.q_ready, p.q_smem
    )
    for j in range(p.seq_len // _BLOCK_N):
        s = j % p.STAGES
        free = ((j // p.STAGES) & 1) ^ 1
        # K and V have their own release: K's slot frees once both S = Q K^T are done.
        mbarrier.wait(p.k_empty.index(s), free)
        mbarrier.expect(p.k_ready.index(s), nbytes)
        tma.async_copy_global_to_shared(
            p.k_desc, [row0 + j * _BLOCK_N, col], p.k_ready.index(s), p.k_bufs.index(s)
        )
        mbarrier.wait(p.v_empty.index(s), free)
        mbarrier.expect(p.v_ready.index(s), nbytes)
        tma.async_copy_global_to_shared(
            p.v_desc, [row0 + j * _BLOCK_N, col], p.v_ready.index(s), p.v_bufs.index(s)
        )


@gluon.jit
def _scores(p, q, s, phase, zero_s):
    """Issue S = Q K^T of the block in slot s (async)."""
    mbarrier.wait(p.k_ready.index(s), phase)
    return warpgroup_mma(q, p.k_bufs.index(s).permute((1, 0)), zero_s, use_acc=False, is_async=True)


@gluon.jit
def _add_pv(p, pb, s, phase, acc):
    """Issue O += P V of the block in slot s (async; P from registers)."""
    mbarrier.wait(p.v_ready.index(s), phase)
    return warpgroup_mma(pb, p.v_bufs.index(s), acc, is_async=True)


@gluon.jit
def _softmax_step(qk, m_i, qk_scale):
    """(new row max, P, rescale of the old O): log2 domain, the scale folded into one FMA."""
    m_new = gl.maximum(m_i, gl.max(qk, axis=1) * qk_scale)
    return m_new, gl.exp2(qk * qk_scale - m_new[:, None]), gl.exp2(m_i - m_new)


@gluon.jit
def _overlapped_blocks(p, q, zero_s, acc, m_i, l_i, p_layout: gl.constexpr, row_of_o: gl.constexpr):
    """FA3's intra-warpgroup overlap: block j's Q K^T and block j-1's P V are issued together,
    and block j's softmax runs while that P V is in flight. Returns (O unnormalized, l)."""
    dtype: gl.constexpr = p.q_desc.dtype
    qk = warpgroup_mma_wait(num_outstanding=0, deps=(_scores(p, q, 0, 0, zero_s),))
    mbarrier.arrive(p.k_empty.index(0), count=1)
    m_i, pr, alpha = _softmax_step(qk, m_i, p.qk_scale)
    l_i = gl.sum(pr, axis=1)
    pb = gl.convert_layout(pr.to(dtype), p_layout)
    for j in range(1, p.seq_len // _BLOCK_N):
        s = j % p.STAGES
        prev = (j - 1) % p.STAGES
        qk = _scores(p, q, s, (j // p.STAGES) & 1, zero_s)
        acc = _add_pv(p, pb, prev, ((j - 1) // p.STAGES) & 1, acc)
        qk = warpgroup_mma_wait(num_outstanding=1, deps=(qk,))  # S done, P V may run on
        mbarrier.arrive(p.k_empty.index(s), count=1)
        m_i, pr, alpha = _softmax_step(qk, m_i, p.qk_scale)
        l_i = l_i * alpha + gl.sum(pr, axis=1)
        pb_next = gl.convert_layout(pr.to(dtype), p_layout)
        acc, pb = warpgroup_mma_wait(num_outstanding=0, deps=(acc, pb))  # P stays alive
        mbarrier.arrive(p.v_empty.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, row_of_o)[:, None]
        pb = pb_next
    last = (p.seq_len // _BLOCK_N - 1) % p.STAGES
    acc = _add_pv(p, pb, last, ((p.seq_len // _BLOCK_N - 1) // p.STAGES) & 1, acc)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(p.v_empty.index(last), count=1)
    return acc, l_i


@gluon.jit
def _math(p, WG: gl.constexpr):
    D: gl.constexpr = p.q_desc.block_shape[1]
    dtype: gl.constexpr = p.q_desc.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, _BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]
    )
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    # Row-major for the epilogue: 8 elements (16 bytes) per thread along a row.
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 * 8 // D, D // 8], [4, 1], [1, 0])
    row_of_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_of_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    m_i = gl.full([_HALF], float("-inf"), gl.float32, row_of_s)
    l_i = gl.zeros([_HALF], gl.float32, row_of_s)
    acc = gl.zeros([_HALF, D], gl.float32, o_layout)
    zero_s = gl.zeros([_HALF, _BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(p.q_ready, 0)
    q = p.q_smem.slice(WG * _HALF, _HALF)
    if p.OVERLAP:
        acc, l_i = _overlapped_blocks(p, q, zero_s, acc, m_i, l_i, p_layout, row_of_o)
    else:
        for j in range(p.seq_len // _BLOCK_N):
            s = j % p.STAGES
            phase = (j // p.STAGES) & 1
            qk = _scores(p, q, s, phase, zero_s)
            qk = warpgroup_mma_wait(num_outstanding=0, deps=(qk,))
            mbarrier.arrive(p.k_empty.index(s), count=1)
            m_new, pr, alpha = _softmax_step(qk, m_i, p.qk_scale)
            l_i = l_i * alpha + gl.sum(pr, axis=1)
            acc = acc * gl.convert_layout(alpha, row_of_o)[:, None]
            pb = gl.convert_layout(pr.to(dtype), p_layout)
            acc = _add_pv(p, pb, s, phase, acc)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(p.v_empty.index(s), count=1)
            m_i = m_new

    # Epilogue: route each row to the buffer that owns its token (see module doc).
    o = acc * gl.convert_layout(1.0 / l_i, row_of_o)[:, None]
    # Re-laid out through this warpgroup's own Q rows, read by its last Q K^T long ago: a
    # layout conversion would take 16 KiB of scratch more, which a third K/V slot needs.
    q.store(o.to(dtype))
    gl.thread_barrier()  # this partition's warps only
    y = q.load(out_layout)
    row0, b, h = _tile(p)
    rows = gl.program_id(0) * _BLOCK_M + WG * _HALF
    rows = rows + gl.arange(0, _HALF, layout=gl.SliceLayout(1, out_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, out_layout))
    dest = rows // p.rows_per_dest
    base = (gl.load(p.dest_ptrs + dest) - p.q_addr) // (dtype.primitive_bitwidth // 8)
    offset = (
        base
        + b.to(gl.int64) * p.stride_ob
        + (rows - dest * p.rows_per_dest).to(gl.int64) * p.stride_os
        + (p.head_offset + h).to(gl.int64) * p.stride_oh
    )
    offset = gl.multiple_of(offset, 8)  # 16-byte aligned rows (checked by launch)
    gl.store(p.q_ptr + offset[:, None] + cols[None, :], y)


@gluon.jit
def _flash_fwd_ws(
    q_ptr,
    q_desc,
    k_desc,
    v_desc,
    dest_ptrs,
    q_addr,
    qk_scale,
    stride_ob,
    stride_os,
    stride_oh,
    seq_len,
    local_heads,
    rows_per_dest,
    head_offset,
    STAGES: gl.constexpr,
    OVERLAP: gl.constexpr,
):
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_shape, v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)  # one arrival per math warpgroup
        mbarrier.init(v_empty.index(i), count=2)
    p = Shared(
        (q_desc, k_desc, v_desc),
        (q_smem, k_bufs, v_bufs),
        (q_ready, k_ready, v_ready, k_empty, v_empty),
        (q_ptr, dest_ptrs, q_addr, qk_scale, stride_ob, stride_os, stride_oh),
        (seq_len, local_heads, rows_per_dest, head_offset),
        STAGES,
        OVERLAP,
    )
    gl.warp_specialize(
        [(_math, (p, 0)), (_math, (p, 1)), (_producer, (p,))],
        _WORKER_WARPS,
        _REGS,
    )


def supports(q, k, v, dest_strides, head_dim: int) -> bool:
    """Whether this kernel can run these inputs (else flash_ulysses runs its tl kernel)."""
    seq_len = q.shape[1]
    return (
        q.device.type == "cuda"
        and head_dim in HEAD_DIMS
        and q.dtype == k.dtype == v.dtype
        and q.element_size() == 2
        and seq_len % BLOCK_M == 0
        and seq_len % BLOCK_N == 0
        and all(t.is_contiguous() for t in (q, k, v))
        and all(s % 8 == 0 for s in dest_strides)
        and q.data_ptr() % 16 == 0
    )


def descriptors(q, k, v):
    """TMA descriptors over the (B*S, H*D) views: Q tiles of 128 rows, K/V blocks of 128."""
    b, s, h, d = q.shape
    gdtype = gl.bfloat16 if str(q.dtype) == "torch.bfloat16" else gl.float16
    shape, strides = [b * s, h * d], [h * d, 1]
    q_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, d], gdtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_N, d], gdtype)
    return (
        TensorDescriptor(q, shape, strides, [BLOCK_M, d], q_layout),
        TensorDescriptor(k, shape, strides, [BLOCK_N, d], kv_layout),
        TensorDescriptor(v, shape, strides, [BLOCK_N, d], kv_layout),
    )


# The last launches' compiled kernels and arguments. The sweeps time one call at a time,
# so host work per call (building three TMA descriptors with their layouts, specializing 14
# arguments) that outlasts the L2 flush before it lands in a short kernel's time: S = 8K,
# 12 heads timed at 473 TFLOP/s without this, 559 with it (2x H200 reference; 550 back to
# back). A call with exactly the same arguments and options reuses both. A few entries,
# so that arms timed in alternation (an A/B of options) each keep theirs; their buffers
# stay referenced until CACHED newer calls push them out.
CACHED = 4
_launches: dict = {}


def launch_options() -> dict:
    """The launch options in force (LAUNCH_OPTIONS)."""
    return {name: globals()[name] for name in LAUNCH_OPTIONS}


def launch(q, k, v, dest_ptrs, *, dest_strides, rows_per_dest, head_offset, qk_scale) -> None:
    """Enqueue the kernel (flash_ulysses.flash_attention_routed checked the inputs). Every
    destination base in dest_ptrs must be 16-byte aligned (torch allocations are)."""
    key = (
        *(t.data_ptr() for t in (q, k, v, dest_ptrs)),
        tuple(q.shape),
        q.dtype,
        q.device,
        tuple(dest_strides),
        rows_per_dest,
        head_offset,
        qk_scale,
        STAGES,
        OVERLAP,
    )
    if key in _launches:
        kernel, grid, args = _launches[key]
        kernel[grid](*args)
        return
    batch, seq_len, local_heads, _ = q.shape
    grid = (seq_len // BLOCK_M, batch * local_heads, 1)  # a compiled kernel takes all three
    args = (
        q,
        *descriptors(q, k, v),
        dest_ptrs,
        q.data_ptr(),
        qk_scale,
        *dest_strides,
        seq_len,
        local_heads,
        rows_per_dest,
        head_offset,
    )
    kernel = _flash_fwd_ws[grid](
        *args, STAGES=STAGES, OVERLAP=OVERLAP, num_warps=NUM_WARPS, maxnreg=MAX_REGS
    )
    while len(_launches) >= CACHED:
        del _launches[next(iter(_launches))]  # the oldest
    # a compiled kernel takes its constexprs too, in their places
    _launches[key] = (kernel, grid, (*args, STAGES, OVERLAP))


def compile_for_sm90(head_dim: int = 128, stages: int | None = None, overlap: int | None = None):
    """Compile the kernel for sm_90 without a GPU (the CPU tests' check that it lowers); the
    launch options default to those in force."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    q = torch.empty(1, BLOCK_M, 2, head_dim, dtype=torch.bfloat16)
    values = (
        q,
        *descriptors(q, q, q),
        torch.empty(2, dtype=torch.int64),
        2**40,
        0.1,
        2 * BLOCK_M * 2 * head_dim,
        2 * head_dim,
        head_dim,
        BLOCK_M,
        2,
        BLOCK_M,
        0,
    )
    names = list(_flash_fwd_ws.arg_names)
    # The values stop before the trailing constexprs.
    signature = {name: mangle_type(v) for name, v in zip(names, values, strict=False)}
    constants = {
        (names.index("STAGES"),): STAGES if stages is None else stages,
        (names.index("OVERLAP"),): OVERLAP if overlap is None else overlap,
    }
    signature.update(STAGES="constexpr", OVERLAP="constexpr")
    signature["q_addr"] = "i64"
    signature["qk_scale"] = "fp32"
    for name in ("stride_ob", "stride_os", "stride_oh", "seq_len", "local_heads"):
        signature[name] = "i32"
    # What a launch specializes on: 16-byte aligned pointers, sizes divisible by 16.
    aligned = ("q_ptr", "dest_ptrs", "stride_ob", "stride_os", "stride_oh", "seq_len")
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    source = GluonASTSource(_flash_fwd_ws, signature, constants, attrs)
    return triton.compile(
        source,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": NUM_WARPS, "maxnreg": MAX_REGS},
    )
