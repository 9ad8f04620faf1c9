"""The pattern a launch must leave in a destination buffer, recomputed on the host, and
its comparison with what a destination holds after the checked launch.

This module exists because every point is checked before it is timed: its destinations
are poisoned, one launch writes a known pattern, and every byte it should write (and the
guard band past it, which must still hold the poison) is compared here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

POISON_WORD = 0xFFFFFFFF  # destinations are filled with 0xFF bytes before the checked launch
GUARD_BYTES = 64 << 10  # bytes past a launch's footprint that must still hold the poison
MIX = 0x9E3779B1  # burst.cu: mix(tag) = tag * MIX (mod 2^32)


def mix(tag: int) -> int:
    return (tag * MIX) & 0xFFFFFFFF


def last_burst_per_slot(n_bursts: int, n_slots: int, slot_base: int) -> dict[int, int]:
    """Rotation slot -> the last burst of the launch that wrote it (the one left visible)."""
    last: dict[int, int] = {}
    for n in range(n_bursts):
        last[(slot_base + n) % n_slots] = n
    return last


def expected_words(
    *,
    producers: int,
    B: int,
    slot_stride: int,
    last_burst: Mapping[int, int],
    tag_base: int,
    buffer_bytes: int,
) -> np.ndarray:
    """What one destination buffer must hold after a launch, as 32-bit words, up to the
    launch's footprint plus a guard band that must still hold the poison.

    `producers` slices of B bytes sit back to back at the start of every slot written;
    word w of a slot written by burst n holds mix(tag_base + n) ^ w (w counted from the
    buffer's start, as in burst.cu).
    """
    if not last_burst:
        raise ValueError("no burst wrote this destination")
    footprint = max(s * slot_stride for s in last_burst) + producers * B
    extent = min(buffer_bytes, footprint + GUARD_BYTES)
    image = np.full(extent // 4, POISON_WORD, dtype=np.uint32)
    for slot, n in last_burst.items():
        lo = slot * slot_stride // 4
        hi = lo + producers * B // 4
        image[lo:hi] = np.arange(lo, hi, dtype=np.uint32) ^ np.uint32(mix(tag_base + n))
    return image


def compare_words(got: np.ndarray, expected: np.ndarray, label: str) -> str | None:
    """None when equal; otherwise how many words differ and the first one, named."""
    if got.shape != expected.shape:
        return f"{label}: read {got.size} words, expected {expected.size}"
    bad = np.flatnonzero(got != expected)
    if bad.size == 0:
        return None
    i = int(bad[0])
    never = " (poison: never written)" if got[i] == POISON_WORD else ""
    return (
        f"{label}: {bad.size} of {expected.size} words wrong; first at byte {4 * i}: "
        f"got {int(got[i]):#010x}{never}, expected {int(expected[i]):#010x}"
    )


def pattern_mismatches(
    words: np.ndarray, tag: int, *, first_word: int = 0, chunk_words: int = 1 << 22
) -> tuple[int, int | None]:
    """(words that differ from mix(tag) ^ word_index, the first such index) over a uint32
    array whose element 0 is word `first_word` of the buffer.

    Checked chunk by chunk, so a 512 MiB host destination (the ceilings) costs 16 MiB of
    scratch memory, not a second 512 MiB image.
    """
    m = np.uint32(mix(tag))
    bad, first = 0, None
    for lo in range(0, words.size, chunk_words):
        chunk = words[lo : lo + chunk_words]
        want = np.arange(first_word + lo, first_word + lo + chunk.size, dtype=np.uint32) ^ m
        wrong = np.flatnonzero(chunk != want)
        if wrong.size and first is None:
            first = lo + int(wrong[0])
        bad += int(wrong.size)
    return bad, first
