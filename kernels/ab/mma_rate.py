"""How fast the tensor cores run our kernel's MMA shape on their own: the FP8 64 x N x 128
step of each of two warpgroups (a 128-row tile), operands in shared memory, nothing else.

    PYTHONPATH=src:kernels python3 kernels/ab/mma_rate.py [--iters 4096]

Every CTA (one per SM) fills its A (128 x 128) and B (N x 128) blocks once (zeros, then
random values: the tensor cores draw more power, and the clock may drop, on real data), then
runs `iters` steps of 4 chained MMAs (K = 128) per warpgroup, in one of four ways:

- chained: each step accumulates into the same registers, one step left in flight at each
  wait (the tensor cores' own rate for the shape);
- promoted: each step's product is waited for and added to an fp32 accumulator with a scale,
  as our kernel promotes (its MMA-wait-promote turn, without its ring or its loads);
- split: each step as two MMAs of N / 2 columns issued at once, the first promoted while
  the second runs (in the registers of one N-column product);
- turns: promoted, the warpgroups issuing in turn (each waits at a named barrier until the
  one before it has issued its step: wait_turn, pass_turn below; the kernel tried this
  order and dropped it, kernels/ab/README.md).

Prints TFLOP/s (2 x 64 x N x 128 per warpgroup step) from the earliest start to the latest
end over all CTAs' globaltimer stamps, for N = 128 (our tile) in every mode, N = 64 and 256
chained (the split's MMA shape; 256 columns promoted would spill: 256 registers a thread),
and N = 128 with three math warpgroups (192 rows, 168 registers a thread). A development
record, not a dataset.
"""

import json
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from xstage_bench.data.results import atomic_write_text
from xstage_bench.measurement.environment import capture_measured
from xstage_kernels.megamoe_ws import _now

K = 128
_K = gl.constexpr(K)
MATH_REGS = {2: 232, 3: 168}  # per thread, by math warpgroups: what the register file holds

# Named barriers 8 + w: warpgroup w's turn ("turns" mode). Triton's own: 0 (the default
# partition), 1 (the whole CTA) and 2 + i (worker partition i).
TURN_BARRIER = 8


@gluon.constexpr_function
def _turn_asm(op, warpgroup):
    """PTX of `op` (bar.sync or bar.arrive) on math warpgroup `warpgroup`'s turn barrier:
    256 threads, the 128 that take the turn and the 128 that give it."""
    return f"{op} {TURN_BARRIER + warpgroup}, 256; mov.u32 $0, 0;"


@gluon.jit
def wait_turn(WG: gl.constexpr):
    """Block until the warpgroup before WG has issued its step."""
    gl.inline_asm_elementwise(
        _turn_asm("bar.sync", WG), "=r", [], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def pass_turn(WG: gl.constexpr, WARPGROUPS: gl.constexpr):
    """Give the turn to the warpgroup after WG; does not wait."""
    gl.inline_asm_elementwise(
        _turn_asm("bar.arrive", (WG + 1) % WARPGROUPS),
        "=r",
        [],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


@gluon.jit
def _warpgroup(
    a, b, out_ptr, iters, WG: gl.constexpr, N: gl.constexpr, MODE: gl.constexpr, WGS: gl.constexpr
):
    """One math warpgroup of WGS: its 64 rows of A times B, `iters` steps."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 32]
    )
    rows = a.slice(WG * 64, 64)
    at = out_ptr + (gl.program_id(0) * 4 + WG) * 3
    if MODE == 2:
        _split_steps(rows, b, at, iters, N)
    else:
        zero = gl.zeros([64, N], gl.float32, acc_layout)
        acc = zero
        turns: gl.constexpr = MODE == 3
        if turns and WG == WGS - 1:
            pass_turn(WG, WGS)  # the first turn is warpgroup 0's
        start = _now()
        for i in range(iters):
            if MODE == 1 or turns:
                if turns:
                    wait_turn(WG)
                raw = warpgroup_mma(rows, b.permute((1, 0)), zero, use_acc=False, is_async=True)
                if turns:
                    pass_turn(WG, WGS)
                raw = warpgroup_mma_wait(num_outstanding=0, deps=(raw,))
                acc += raw * (i + 1.0)
            else:
                acc = warpgroup_mma(rows, b.permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if turns and WG == 0:
            wait_turn(WG)  # the last warpgroup's last turn given: every arrival met
        _stamp(at, start, gl.sum(gl.sum(acc, axis=1), axis=0))


@gluon.jit
def _stamp(at, start, total):
    gl.store(at + 0, start)
    gl.store(at + 1, _now())
    gl.store(at + 2, total.to(gl.int64))  # keeps the MMAs


@gluon.jit
def _split_steps(rows, b, at, iters, N: gl.constexpr):
    """Each step as two N / 2-column MMAs, both issued at once: the first is promoted while
    the second runs. Nothing is in flight across the loop's back edge: ptxas cannot tell
    that a wait inside the loop retired an MMA issued before it, and would serialize every
    MMA (C7514)."""
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N // 2, 32]
    )
    lo = b.slice(0, N // 2).permute((1, 0))
    hi = b.slice(N // 2, N // 2).permute((1, 0))
    zero = gl.zeros([64, N // 2], gl.float32, layout)
    acc_lo = zero
    acc_hi = zero
    start = _now()
    for i in range(iters):
        raw_lo = warpgroup_mma(rows, lo, zero, use_acc=False, is_async=True)
        raw_hi = warpgroup_mma(rows, hi, zero, use_acc=False, is_async=True)
        raw_lo = warpgroup_mma_wait(num_outstanding=1, deps=(raw_lo,))
        acc_lo += raw_lo * (i + 1.0)
        # acc_lo an operand of the wait: its promotion stays above it (under the MMA)
        raw_hi, acc_lo = warpgroup_mma_wait(num_outstanding=0, deps=(raw_hi, acc_lo))
        acc_hi += raw_hi * (i + 1.0)
    total = gl.sum(gl.sum(acc_lo, axis=1), axis=0) + gl.sum(gl.sum(acc_hi, axis=1), axis=0)
    _stamp(at, start, total)


@gluon.jit
def _block(src_ptr, ROWS: gl.constexpr, layout: gl.constexpr):
    """ROWS x K FP8 values from src_ptr (row-major)."""
    r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, _K, layout=gl.SliceLayout(0, layout))
    return gl.load(src_ptr + r[:, None] * _K + c[None, :])


@gluon.jit
def _mma_rate(
    src_ptr,
    out_ptr,
    iters,
    N: gl.constexpr,
    MODE: gl.constexpr,
    WGS: gl.constexpr,
    REGS: gl.constexpr,
):
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([256, _K], gl.float8e4nv)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([N, _K], gl.float8e4nv)
    fill: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    a = gl.allocate_shared_memory(gl.float8e4nv, [256, _K], a_layout)
    b = gl.allocate_shared_memory(gl.float8e4nv, [N, _K], b_layout)
    a.store(_block(src_ptr, 256, fill))
    b.store(_block(src_ptr + 256 * _K, N, fill))
    fence_async_shared()
    gl.thread_barrier()
    if WGS == 2:
        gl.warp_specialize(
            [
                (_warpgroup, (a, b, out_ptr, iters, 0, N, MODE, WGS)),
                (_warpgroup, (a, b, out_ptr, iters, 1, N, MODE, WGS)),
            ],
            [4],
            [REGS],
        )
    else:
        gl.warp_specialize(
            [
                (_warpgroup, (a, b, out_ptr, iters, 0, N, MODE, WGS)),
                (_warpgroup, (a, b, out_ptr, iters, 1, N, MODE, WGS)),
                (_warpgroup, (a, b, out_ptr, iters, 2, N, MODE, WGS)),
            ],
            [4, 4],
            [REGS, REGS],
        )


def operands(n: int, random: bool):
    """A (256 rows) and B (n rows) of K FP8 values, one after the other: zeros, or values
    drawn as the layer's operands are (the tensor cores draw more power on them)."""
    if not random:
        return torch.zeros((256 + n) * K, dtype=torch.float8_e4m3fn, device="cuda")
    values = torch.randn((256 + n) * K, device="cuda") * 64
    return values.clamp(-448, 448).to(torch.float8_e4m3fn)


MODES = ("chained", "promoted", "split", "turns")


def rate(iters: int, n: int, mode: str, sms: int, src, wgs: int = 2) -> float:
    """TFLOP/s of `sms` CTAs of `wgs` math warpgroups, from the earliest start to the
    latest end."""
    stamps = torch.zeros(sms * 4, 3, dtype=torch.int64, device="cuda")
    regs = MATH_REGS[wgs]
    _mma_rate[(sms,)](
        src,
        stamps,
        iters,
        N=n,
        MODE=MODES.index(mode),
        WGS=wgs,
        REGS=regs,
        num_warps=4,
        maxnreg=regs,
    )
    torch.cuda.synchronize()
    used = stamps[stamps[:, 1] > 0]
    span_ns = int(used[:, 1].max() - used[:, 0].min())
    return sms * iters * 2 * 64 * wgs * n * K / span_ns / 1e3


def main(argv) -> None:
    iters = int(argv[argv.index("--iters") + 1]) if "--iters" in argv else 4096
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (math warpgroups, N, random operands, modes): ours, 256 columns, three warpgroups
    cases = [
        (2, 128, False, MODES),
        (2, 128, True, MODES),
        (2, 64, True, ("chained",)),  # the split steps' MMA shape
        (2, 256, True, ("chained",)),
        (3, 128, True, MODES),
    ]
    results = []
    for wgs, n, random, modes in cases:
        src = operands(n, random)
        for mode in modes:
            rate(64, n, mode, sms, src, wgs)  # compile and warm up
            tflops = max(rate(iters, n, mode, sms, src, wgs) for _ in range(3))
            result = {
                "N": n,
                "mode": mode,
                "operands": "random" if random else "zeros",
                "warpgroups": wgs,
                "tflops": tflops,
                "iters": iters,
            }
            print(" ".join(f"{k}={v}" for k, v in result.items()), flush=True)
            results.append(result)
    if "--out" in argv:
        record = {"what": __doc__.split("\n\n")[0], "results": results}
        record["environment"] = capture_measured()
        atomic_write_text(Path(argv[argv.index("--out") + 1]), json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
