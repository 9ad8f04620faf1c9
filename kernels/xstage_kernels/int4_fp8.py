"""int4 -> FP8 e4m3 by table lookup (PTX `prmt`), for W4A8 weights converted in shared memory.

Why a lookup: the plain route (sign-extend, int -> fp16 -> fp8) costs three conversion
instructions per weight, and conversions issue at a quarter of the integer rate on Hopper;
a W4A8 tile converts 16K weights per K step, more than its MMA takes. Every int4 value has
an exact e4m3 code, so `prmt` (a byte select from a pair of 32-bit registers) reads them
from constant tables: 11 integer instructions per 8 weights, 6 of them `prmt` (which issues
at half the rate of the logic instructions: 64 per clock and SM on an H200, measured).

One call converts one 32-bit word of packed weights (quant.py's word-split packing: the
low 16 bits hold four consecutive channels of a block's first 64-channel half, the high 16
bits the same four of its second half) into two registers: the four first-half channels'
codes and the four second-half channels' codes, in channel order.

`prmt`'s selector nibbles index 8 bytes and treat their top bit as a sign-replicate flag,
so each nibble's low 3 bits (idx) index two 8-entry tables, one for the non-negative values
0..7 and one for -8..-1, and a third `prmt` picks per byte by the nibble's sign (selector
i or 4 + i: the sign bit shifted right by one lands on the "+4" bit). The packing puts a
half's four nibbles where a selector reads them (bits 0-15), so nothing is shuffled after.
(The half-split packing this replaced, byte j = channels j and j + 64, needed two more
`prmt` per word to gather the halves: 14 instructions.)
"""

from __future__ import annotations

INT4_VALUES = range(-8, 8)


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


def lookup_tables() -> tuple[int, int, int, int]:
    """(non-negative low, high, negative low, high) words: entry k of the non-negative table
    is e4m3(k), of the negative one e4m3(k - 8), for the nibble 8 + k."""
    positive = [e4m3_code(k) for k in range(8)]
    negative = [e4m3_code(k - 8) for k in range(8)]
    return _word(positive[:4]), _word(positive[4:]), _word(negative[:4]), _word(negative[4:])


def ptx() -> str:
    """The inline assembly: $2 a packed word in, $0 its first-half codes, $1 its second-half."""
    p0, p1, n0, n1 = lookup_tables()
    return f"""{{
.reg .b32 p0, p1, n0, n1, idx, sel, t, pa, na, pb, nb;
mov.b32 p0, {p0:#010x};
mov.b32 p1, {p1:#010x};
mov.b32 n0, {n0:#010x};
mov.b32 n1, {n1:#010x};
and.b32 idx, $2, 0x77777777;
shr.u32 t, $2, 1;
and.b32 t, t, 0x44444444;
or.b32 sel, t, 0x32103210;
prmt.b32 pa, p0, p1, idx;
prmt.b32 na, n0, n1, idx;
prmt.b32 $0, pa, na, sel;
shr.u32 idx, idx, 16;
shr.u32 sel, sel, 16;
prmt.b32 pb, p0, p1, idx;
prmt.b32 nb, n0, n1, idx;
prmt.b32 $1, pb, nb, sel;
}}"""
