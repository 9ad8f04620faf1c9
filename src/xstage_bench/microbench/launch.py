"""The host's side of the interface of the remote-store kernels in kernels/microbench/burst.cu.

What a launch is given: the launch configuration (threads per CTA, the ceiling's grid,
the in-kernel timeout, the gap calibration's iterations), the codes of the gap and sync
modes, and the arguments, packed from a table that mirrors the kernels' C signatures; and
what its error flag means. This module exists so that everything that must agree with
burst.cu sits in one place (a test parses the .cu and compares). The GPU half that
launches the kernels is bench.BurstBench; what a launch plans, writes and stamps is
decided in planning.py, store_pattern.py and stamp_metrics.py, all without a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

THREADS = 512  # threads per producer CTA: 16 warps keep an SM's store pipe busy
CEILING_GRID_PER_SM = 2  # bulk_store CTAs per SM for the SM-store ceiling
TIMEOUT_NS = 1_000_000_000  # every in-kernel wait gives up after 1 s and sets the error flag
# FMA-loop iterations the gap is calibrated at: up to ~640 us on H200 at K <= 132 (about
# 5 ns per iteration), past the longest configured gap (500 us, beyond V/R of a 16 MiB burst
# on the host path), so gaps are interpolated, not extrapolated.
GAP_CALIBRATION_ITERS = (0, 2000, 8000, 32000, 128000)
GAP_CALIBRATION_BURSTS = 8

# burst.cu error bits (ERR_*); any of them fails the point with status "timeout".
ERROR_BITS = {
    1: "grid barrier timed out (producers not all resident?)",
    2: "drain probe: the receiver's acknowledgement never arrived",
    4: "drain probe: the receiver never saw every producer's signal",
    8: "kernel rejected a launch argument",
}
GAP_MODES = {"compute": 0, "timer": 1}
SYNC_MODES = {"free": 0, "barrier": 1}
# burst.cu NEXT_*: the operation thread 0 of each producer performs right after its burst.
NEXT_OPS = {"none": 0, "load": 1, "volatile_load": 2, "atomic": 3, "fence": 4, "tma_load": 5}
SCRATCH_WORD_BYTES = 64  # each producer's scratch word sits on its own line
TMA_BYTES = 1024  # burst.cu TMA_BYTES: the bulk copy's size, read after the words


def scratch_bytes(K: int) -> int:
    """The scratch buffer a burst train of K producers needs for its next operation."""
    return K * SCRATCH_WORD_BYTES + TMA_BYTES


MAX_PRODUCERS = 4096  # the most producers a study may name (config schema: K <= 4096)
STAMP_ROWS = 3  # burst_train stamps: start, end, reach (the grid barrier, sync = barrier)

# --- kernel arguments -------------------------------------------------------------------
# Each table mirrors one extern "C" signature in burst.cu, in order (a test parses the .cu
# and compares). "ptr" is a device address passed as a 64-bit integer, so peer addresses
# and local arrays travel the same way.

PTR, I32, U32, I64, U64 = "ptr", "int32", "uint32", "int64", "uint64"
KERNEL_PARAMS: dict[str, tuple[tuple[str, str], ...]] = {
    "burst_train": (
        ("dsts", PTR),
        ("n_dst", I32),
        ("bytes_per_producer", U32),
        ("slot_stride", U64),
        ("n_slots", I32),
        ("slot_base", I32),
        ("width", I32),
        ("n_bursts", I32),
        ("tag_base", U32),
        ("gap_mode", I32),
        ("gap_iters", I64),
        ("gap_ns", I64),
        ("idle_ns", I64),
        ("sync", I32),
        ("barrier_counter", PTR),
        ("timeout_ns", I64),
        ("stamps", PTR),
        ("err", PTR),
        ("sink", PTR),
        ("next_op", I32),
        ("scratch", PTR),
    ),
    "drain_probe_send": (
        ("dst", U64),
        ("bytes_per_producer", U32),
        ("n_bursts", I32),
        ("tag_base", U32),
        ("idle_ns", I64),
        ("barrier_counter", PTR),
        ("peer_signal", U64),
        ("ack", PTR),
        ("timeout_ns", I64),
        ("stamps", PTR),
        ("err", PTR),
    ),
    "drain_probe_recv": (
        ("signal", PTR),
        ("remote_ack", U64),
        ("n_bursts", I32),
        ("producers", I32),
        ("timeout_ns", I64),
        ("recv_ns", PTR),
        ("err", PTR),
    ),
    "bulk_store": (("dst", U64), ("bytes", U64), ("tag", U32)),
}


def pack_args(kernel: str, values: Mapping[str, int]) -> tuple:
    """The kernel's arguments as numpy scalars of the C types, in signature order.

    Raises ValueError naming the kernel and parameter for a missing or unknown name, or a
    value that does not fit its C type.
    """
    params = KERNEL_PARAMS[kernel]
    names = [n for n, _ in params]
    missing = [n for n in names if n not in values]
    unknown = sorted(set(values) - set(names))
    if missing or unknown:
        raise ValueError(f"{kernel}: missing arguments {missing}, unknown arguments {unknown}")
    packed = []
    for name, ctype in params:
        dtype = np.dtype(np.uint64 if ctype == PTR else ctype)
        value = int(values[name])
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise ValueError(f"{kernel}: argument {name}={value} does not fit {dtype}")
        packed.append(dtype.type(value))
    return tuple(packed)


def describe_error(flags: int) -> str:
    known = [text for bit, text in ERROR_BITS.items() if flags & bit]
    rest = flags & ~sum(ERROR_BITS)
    if rest:
        known.append(f"unknown error bits {rest:#x}")
    return "; ".join(known)
