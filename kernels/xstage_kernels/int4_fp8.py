"""int4 -> FP8 e4m3 by one byte-select (PTX `prmt`) per four weights, for W4A8 weights
converted in shared memory.

Why a lookup: the plain route (sign-extend, int -> fp16 -> fp8) costs three conversion
instructions per weight, and conversions issue at a quarter of the integer rate on Hopper;
a W4A8 tile converts 16K weights per K step, more than its MMA takes. Every integer in
[-7, 7] has an exact e4m3 code, and a negative one is its magnitude's code with the top bit
set, so the weights are stored as sign and magnitude (quant.py): `prmt` (a byte select from
a pair of 32-bit registers) reads four magnitudes' codes from one 8-entry table, and one
logic instruction ORs their four signs in, which the packing already put at each output
byte's top bit (first half) or 4 bits below it (second half, one shift). 7 integer
instructions per 8 weights, 2 of them `prmt`, which issues at half the rate of the logic
instructions (64 per clock and SM on an H200, measured).

The two's-complement nibbles this replaced needed 11 instructions, 6 of them `prmt`: a
magnitude table for each sign, and a third select by the sign bit, since `prmt`'s selector
nibbles read their top bit as a sign-replicate flag, not as an index.

One call converts one 32-bit word of packed weights (quant.py: channel i of half h keeps
its magnitude in bits 16 h + 4 i .. + 2 and its sign in bit 8 i + 7 - 4 h) into two
registers: the four first-half channels' codes and the four second-half channels' codes,
in channel order.
"""

from __future__ import annotations

INT4_VALUES = range(-7, 8)


def e4m3_code(value: int) -> int:
    """The e4m3 byte of a small integer (exact for |value| <= 8)."""
    if value == 0:
        return 0
    magnitude = abs(value)
    exponent = magnitude.bit_length() - 1
    mantissa = (magnitude - (1 << exponent)) << 3 >> exponent  # 3 fraction bits, exact here
    return (0x80 if value < 0 else 0) | (exponent + 7) << 3 | mantissa


def _word(codes) -> int:
    """Four bytes as a little-endian 32-bit constant (byte 0 = codes[0])."""
    return sum(code << (8 * i) for i, code in enumerate(codes))


def magnitude_table() -> tuple[int, int]:
    """The two words `prmt` selects from: byte m (0..7) is e4m3(m)."""
    codes = [e4m3_code(m) for m in range(8)]
    return _word(codes[:4]), _word(codes[4:])


def ptx() -> str:
    """The inline assembly: $2 a packed word in, $0 its first-half codes, $1 its second-half."""
    low, high = magnitude_table()
    return f"""{{
.reg .b32 t0, t1, idx, codes, signs;
mov.b32 t0, {low:#010x};
mov.b32 t1, {high:#010x};
and.b32 idx, $2, 0x77777777;
prmt.b32 codes, t0, t1, idx;
and.b32 signs, $2, 0x80808080;
or.b32 $0, codes, signs;
shr.u32 idx, idx, 16;
prmt.b32 codes, t0, t1, idx;
shl.b32 signs, $2, 4;
and.b32 signs, signs, 0x80808080;
or.b32 $1, codes, signs;
}}"""
