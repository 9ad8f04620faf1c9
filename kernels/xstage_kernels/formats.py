"""The number formats and trace layout our kernels are built for, shared with the harness.

The kernels are the lowest layer: they take these from here, and the harness's format
specification (xstage_bench.megamoe.quant) and schedules (xstage_bench.megamoe.schedule)
take them from here too, so both sides agree by construction.
"""

SCALE_BLOCK = 128  # channels per activation scale; rows and channels per weight scale
FP8_MAX = 448.0  # largest finite e4m3fn value
# 4-bit weights are symmetric, sign and magnitude (quant.py): -8 has no code, as in a
# quantizer that scales by amax / 7.
INT4_MIN, INT4_MAX = -7, 7
# Floor of a scale's amax: an all-zero group (padding rows) gets a tiny scale, not 0/0.
AMAX_FLOOR = 1e-10
PRECISIONS = ("bf16", "w8a8", "w4a8")


def step_major(scales):
    """(rows, K / 128) scales as (K / 128, rows), a step's scales of consecutive rows
    consecutive: how the warp-specialized kernel's TMA reads activation scales."""
    return scales.t().contiguous()


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


# One traced tile: which program took it, when it was taken and ready, when its MMA was
# done, and its epilogue's store span (globaltimer ns).
TRACE_FIELDS = ("program", "taken", "ready", "mma_done", "store_start", "store_end")
