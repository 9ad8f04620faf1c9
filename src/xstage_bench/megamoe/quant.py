"""Block-scaled FP8 and packed INT4 formats of the MegaMoE kernel, in numpy and torch.

The formats follow DeepGEMM's: activations in FP8 e4m3 with one fp32 scale per token and
128 channels, weights in FP8 e4m3 with one fp32 scale per 128x128 block. W4A8 keeps the
weight blocks and their scales but stores 4-bit integers in [-8, 7], two per byte; the
kernel expands them to FP8 (exactly: every such integer is an e4m3 value) before the FP8
MMA, since Hopper has no 4-bit Tensor Cores.

INT4 packing is "word-split" within each 128-channel block: the block's 64 bytes are 16
little-endian 32-bit words, and word w holds channels 4w..4w+3 of the block's first half
in its low 16 bits (nibble i: channel 4w + i) and channels 64 + 4w..64 + 4w + 3 of its
second half in its high 16 bits (nibble 4 + i). Why: the fused kernel converts a word's
halves by two table lookups whose outputs are already four consecutive channels of the
first and of the second 64-channel half (kernels/xstage_kernels/int4_fp8.py), so it
multiplies them by the block's two 64-channel activation halves with no shuffle of bytes.

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


# A block's channels as (half, word, byte of the half-word, nibble): byte 2 half + b of
# word w holds channels 64 half + 4w + 2b (low nibble) and + 1 (high nibble).
_WORD_SPLIT = (2, 16, 2, 2)


def pack_int4_np(w: np.ndarray) -> np.ndarray:
    """(N, K) integers in [-8, 7] -> (N, K/2) uint8, word-split within 128-channel blocks."""
    n, k = _blocks_of(w, SCALE_BLOCK)
    if w.min() < INT4_MIN or w.max() > INT4_MAX:
        raise ValueError(f"int4 weights must lie in [{INT4_MIN}, {INT4_MAX}]")
    nibbles = w.astype(np.int64).reshape(n, k // SCALE_BLOCK, *_WORD_SPLIT) & 0xF
    half_bytes = nibbles[..., 0] | (nibbles[..., 1] << 4)  # (n, blocks, half, word, byte)
    return half_bytes.transpose(0, 1, 3, 2, 4).reshape(n, k // 2).astype(np.uint8)


def unpack_int4_np(packed: np.ndarray) -> np.ndarray:
    """Inverse of pack_int4_np: (N, K/2) uint8 -> (N, K) int8."""
    n, half = packed.shape
    if half % (SCALE_BLOCK // 2):
        raise ValueError(f"packed rows must hold whole 128-channel blocks, got {half} bytes")
    b = packed.astype(np.int16).reshape(n, half // 64, 16, 2, 2).transpose(0, 1, 3, 2, 4)
    lo = ((b & 0xF) ^ 8) - 8  # sign-extend a nibble
    hi = ((b >> 4) ^ 8) - 8
    return np.stack([lo, hi], axis=-1).reshape(n, 2 * half).astype(np.int8)


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
    """torch: (..., N, K) int8 in [-8, 7] -> (..., N, K/2) uint8, word-split (see above)."""
    import torch

    *lead, n, k = w.shape
    nibbles = (w.to(torch.int16) & 0xF).reshape(*lead, n, k // SCALE_BLOCK, *_WORD_SPLIT)
    half_bytes = nibbles[..., 0] | (nibbles[..., 1] << 4)
    return half_bytes.transpose(-3, -2).reshape(*lead, n, k // 2).to(torch.uint8)


def unpack_int4(packed):
    """torch: inverse of pack_int4 -> int8."""
    import torch

    *lead, n, half = packed.shape
    b = packed.to(torch.int16).reshape(*lead, n, half // 64, 16, 2, 2).transpose(-3, -2)
    lo = ((b & 0xF) ^ 8) - 8
    hi = ((b >> 4) ^ 8) - 8
    return torch.stack([lo, hi], dim=-1).reshape(*lead, n, 2 * half).to(torch.int8)


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
