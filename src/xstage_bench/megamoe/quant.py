"""Block-scaled FP8 and packed INT4 formats of the MegaMoE kernel, in numpy and torch.

The formats follow DeepGEMM's: activations in FP8 e4m3 with one fp32 scale per token and
128 channels, weights in FP8 e4m3 with one fp32 scale per 128x128 block. W4A8 keeps the
weight blocks and their scales but stores 4-bit integers in [-7, 7] as sign and
magnitude, two per byte; the kernel expands them to FP8 (exactly: every such integer is an
e4m3 value) before the FP8 MMA, since Hopper has no 4-bit Tensor Cores.

INT4 packing is "word-split, sign apart" within each 128-channel block: the block's 64
bytes are 16 little-endian 32-bit words, and word w holds channels 4w..4w+3 of the block's
first half and the same four of its second half. Channel i of half h (i < 4) keeps its
magnitude in bits 16 h + 4 i .. + 2 and its sign in bit 8 i + 7 - 4 h: the magnitudes sit
where one byte-select (`prmt`) reads four of them, and each half's signs sit at the top
bit of the output byte (first half) or 4 bits below it (second half), so the kernel
converts a word into the FP8 codes of both halves, already in channel order, in 7 integer
instructions (kernels/xstage_kernels/int4_fp8.py), and multiplies them by the block's two
64-channel activation halves with no shuffle of bytes.

The numpy functions are the specification (the CPU tests check them); the torch functions
are what the runner and the reference use on the GPU and must agree with them.
"""

from __future__ import annotations

import numpy as np

from xstage_kernels.formats import (
    AMAX_FLOOR,
    FP8_MAX,
    INT4_MAX,
    INT4_MIN,
    SCALE_BLOCK,
    check_precision,
)

# ---- numpy: the specification -----------------------------------------------------------


def e4m3_round(x: np.ndarray) -> np.ndarray:
    """Round float values to the nearest e4m3fn value (ties to even), saturating at +-448.

    e4m3fn: 3 mantissa bits, exponent bias 7, normals from 2^-6, subnormals in steps of
    2^-9, no infinities. Saturation is what the kernel's conversion does (satfinite).
    """
    x = np.asarray(x, dtype=np.float64)
    mag = np.abs(x)
    _, exp = np.frexp(mag)  # mag = m * 2^exp, m in [0.5, 1): floor(log2 mag) = exp - 1
    quantum = np.ldexp(1.0, np.maximum(exp - 1, -6) - 3)  # below 2^-6: the subnormal step
    rounded = np.minimum(np.round(mag / quantum) * quantum, FP8_MAX)
    return (np.sign(x) * rounded).astype(np.float32)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 value (ties to even), as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def quantize_rows_np(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row, per-128-channel FP8 quantization: (values on the e4m3 grid, scales).

    x is (rows, channels) with channels a multiple of 128; scales are (rows, channels/128)
    and x ~= values * scale (the scale repeated over its 128 channels).
    """
    rows, cols = _blocks_of(x, SCALE_BLOCK)
    groups = x.astype(np.float32).reshape(rows, cols // SCALE_BLOCK, SCALE_BLOCK)
    amax = np.maximum(np.abs(groups).max(axis=-1), np.float32(AMAX_FLOOR))
    scales = (amax / np.float32(FP8_MAX)).astype(np.float32)
    values = e4m3_round(groups / scales[..., None]).reshape(rows, cols)
    return values, scales


def dequantize_rows_np(values: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return (values * np.repeat(scales, SCALE_BLOCK, axis=-1)).astype(np.float32)


def block_scales_expand_np(scales: np.ndarray) -> np.ndarray:
    """(N/128, K/128) weight-block scales -> (N, K), one per element."""
    return np.repeat(np.repeat(scales, SCALE_BLOCK, axis=0), SCALE_BLOCK, axis=1)


# A block's channels as (half h, word w, channel i of the word's four): the bit of a word
# where channel i of half h keeps its magnitude (3 bits) and its sign.
_WORD_SPLIT = (2, 16, 4)
_MAGNITUDE_BIT = np.array([[16 * h + 4 * i for i in range(4)] for h in range(2)])
_SIGN_BIT = np.array([[8 * i + 7 - 4 * h for i in range(4)] for h in range(2)])


def _as_halves(shifts: np.ndarray) -> np.ndarray:
    """(2, 4) bit positions broadcast over (..., blocks, half, word, channel)."""
    return shifts[:, None, :]


def pack_int4_np(w: np.ndarray) -> np.ndarray:
    """(N, K) integers in [-7, 7] -> (N, K/2) uint8, word-split with signs apart."""
    n, k = _blocks_of(w, SCALE_BLOCK)
    if w.min() < INT4_MIN or w.max() > INT4_MAX:
        raise ValueError(f"int4 weights must lie in [{INT4_MIN}, {INT4_MAX}]")
    v = w.astype(np.int64).reshape(n, k // SCALE_BLOCK, *_WORD_SPLIT)
    fields = np.abs(v) << _as_halves(_MAGNITUDE_BIT) | (v < 0) << _as_halves(_SIGN_BIT)
    words = fields.sum(axis=(2, 4))  # the fields' bits are disjoint: sum = or
    return words.astype("<u4").view(np.uint8).reshape(n, k // 2)


def unpack_int4_np(packed: np.ndarray) -> np.ndarray:
    """Inverse of pack_int4_np: (N, K/2) uint8 -> (N, K) int8."""
    n, half = packed.shape
    if half % (SCALE_BLOCK // 2):
        raise ValueError(f"packed rows must hold whole 128-channel blocks, got {half} bytes")
    words = np.ascontiguousarray(packed).view("<u4").astype(np.int64).reshape(n, -1, 1, 16, 1)
    magnitude = words >> _as_halves(_MAGNITUDE_BIT) & 7
    negative = words >> _as_halves(_SIGN_BIT) & 1
    return np.where(negative == 1, -magnitude, magnitude).reshape(n, 2 * half).astype(np.int8)


def _blocks_of(x: np.ndarray, block: int) -> tuple[int, int]:
    if x.ndim != 2 or x.shape[-1] % block:
        raise ValueError(
            f"expected a 2-D array whose last dimension is a multiple of {block}, "
            f"got shape {x.shape}"
        )
    return x.shape


# ---- torch: what runs on the GPU --------------------------------------------------------


def quantize_rows(x, block: int = SCALE_BLOCK):
    """torch: per-row, per-`block`-channel FP8 e4m3 quantization -> (fp8 values, fp32 scales).

    The same arithmetic as the kernel's Linear-1 epilogue (amax, floor, divide, convert),
    so the reference can requantize the intermediate exactly as the kernel does. `block`
    other than 128 serves kernels with finer intermediate scales (DeepGEMM's SM90 MegaMoE).
    """
    import torch

    rows, cols = x.shape
    groups = x.float().reshape(rows, cols // block, block)
    amax = groups.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    scales = amax / FP8_MAX
    values = (groups / scales[..., None]).to(torch.float8_e4m3fn).reshape(rows, cols)
    return values, scales


def dequantize_rows(values, scales, block: int = SCALE_BLOCK):
    """torch: fp8 values (rows, C) and scales (rows, C/block) -> fp32."""
    rows, cols = values.shape
    groups = values.float().reshape(rows, cols // block, block)
    return (groups * scales[..., None]).reshape(rows, cols)


def quantize_weight(w):
    """torch: a weight (N, K) -> FP8 e4m3 values and one fp32 scale per 128x128 block
    (its amax / 448): what a library that quantizes bf16 weights itself stores
    (FlashInfer's blockwise recipe); dequantize_weight(..., "w8a8") reads it back."""
    import torch

    n, k = w.shape
    blocks = w.float().reshape(n // SCALE_BLOCK, SCALE_BLOCK, k // SCALE_BLOCK, SCALE_BLOCK)
    scales = blocks.abs().amax(dim=(1, 3)).clamp_min(AMAX_FLOOR) / FP8_MAX
    values = (blocks / scales[:, None, :, None]).to(torch.float8_e4m3fn).reshape(n, k)
    return values, scales


def pack_int4(w):
    """torch: (..., N, K) int8 in [-7, 7] -> (..., N, K/2) uint8, as pack_int4_np."""
    import torch

    *lead, n, k = w.shape
    v = w.to(torch.int64).reshape(*lead, n, k // SCALE_BLOCK, *_WORD_SPLIT)
    magnitude_bit, sign_bit = _torch_bits(w.device)
    fields = v.abs() << magnitude_bit | (v < 0).to(torch.int64) << sign_bit
    words = fields.sum(dim=(-3, -1))  # (..., n, blocks, word)
    shifts = torch.arange(0, 32, 8, device=w.device)
    return (words[..., None] >> shifts & 0xFF).reshape(*lead, n, k // 2).to(torch.uint8)


def unpack_int4(packed):
    """torch: inverse of pack_int4 -> int8."""
    import torch

    *lead, n, half = packed.shape
    b = packed.to(torch.int64).reshape(*lead, n, half // 64, 1, 16, 1, 4)
    words = (b << torch.arange(0, 32, 8, device=packed.device)).sum(dim=-1)
    magnitude_bit, sign_bit = _torch_bits(packed.device)
    magnitude = words >> magnitude_bit & 7
    negative = (words >> sign_bit & 1) == 1
    values = torch.where(negative, -magnitude, magnitude)
    return values.reshape(*lead, n, 2 * half).to(torch.int8)


def _torch_bits(device):
    import torch

    return (torch.from_numpy(_as_halves(bits)).to(device) for bits in (_MAGNITUDE_BIT, _SIGN_BIT))


def dequantize_weight(w, scales, precision: str):
    """torch: one expert's weight (N, K) as fp32 from its stored form and block scales.

    bf16: w itself. w8a8: fp8 (N, K) times its (N/128, K/128) scales. w4a8: packed uint8
    (N, K/2) unpacked to integers, times the same scales.
    """
    check_precision(precision)
    if precision == "bf16":
        return w.float()
    values = unpack_int4(w).float() if precision == "w4a8" else w.float()
    expanded = scales.repeat_interleave(SCALE_BLOCK, 0).repeat_interleave(SCALE_BLOCK, 1)
    return values * expanded
