"""Edits to the PTX Triton makes for our kernels, each applied while Triton compiles them
(its stage hook, knobs.runtime.add_stages_inspection_hook) to the builds whose PTX carries
its mark.

Dropping the wait barriers: in a warp-specialized partition, Triton's shared-memory barrier
analysis cannot tell the partition's mbarrier allocations apart (they reach it as the
partition's arguments), so after each slot release (an mbarrier arrive: a write) it syncs
the warpgroup again before the next slot wait (an mbarrier try_wait: a read, of another
barrier). The wait reads nothing another thread of the warpgroup wrote, and the release
keeps its own barrier (all of the warpgroup's reads of the slot before one thread arrives),
so the barrier before the wait orders nothing and only keeps the warpgroup's four warps in
step (one H200, W8A8: 0.953-0.979 of the time at 16384 tokens without it; W4A8, whose
converters wait the same way, was slower without it: kernels/ab/2026-12-04-wait-barriers-*;
its math warpgroups' alone, pending their paired A/B: the math-only mark).

A mark is part of the build (a constexpr of the kernel puts it in the PTX), so Triton's
cache keeps edited and unedited builds apart; a change to the edit needs a new mark.
"""

from __future__ import annotations

import re
from itertools import islice

DROP_WAIT_BARRIERS_MARK = "xstage:drop-wait-barriers-v1"
# The same in the math warpgroups only (W4A8: its converters keep theirs).
DROP_MATH_WAIT_BARRIERS_MARK = "xstage:drop-math-wait-barriers-v1"
# The math warpgroups' own barriers: Triton gives the default partition (math warpgroup 0)
# barrier 0 and worker partition i barrier i + 2 (math warpgroup 1 is worker 0).
MATH_BARRIERS = frozenset({0, 2})
_WARPGROUP_BARRIER = re.compile(r"^\s*bar\.sync\s+(\d+),\s*128;\s*$")


def _is_code(line: str) -> bool:
    """Not a blank, a comment or a .loc line."""
    text = line.strip()
    return bool(text) and not text.startswith(("//", ".loc"))


def _code_after(lines: list[str], i: int, count: int) -> list[str]:
    """The next `count` lines of code after line i."""
    return list(islice((line.strip() for line in lines[i + 1 :] if _is_code(line)), count))


def drop_wait_barriers(ptx: str, barriers: frozenset[int] | None = None) -> tuple[str, int]:
    """The PTX without each warpgroup (128-thread) barrier right before an mbarrier wait
    (of `barriers` only, when given), and how many were dropped."""
    lines = ptx.splitlines()
    kept, dropped = [], 0
    for i, line in enumerate(lines):
        barrier = _WARPGROUP_BARRIER.match(line)
        if (
            barrier
            and (barriers is None or int(barrier.group(1)) in barriers)
            and any("mbarrier.try_wait" in code for code in _code_after(lines, i, 4))
        ):
            dropped += 1
            continue
        kept.append(line)
    return "\n".join(kept) + "\n", dropped


def edited(ptx: str) -> str:
    """The PTX with the edits its marks ask for."""
    if DROP_WAIT_BARRIERS_MARK in ptx:
        ptx, _ = drop_wait_barriers(ptx)
    if DROP_MATH_WAIT_BARRIERS_MARK in ptx:
        ptx, _ = drop_wait_barriers(ptx, MATH_BARRIERS)
    return ptx


def _with_edits(previous):
    """A stage hook that wraps the PTX stage in `edited`, after any hook set before."""

    def hook(backend, stages, options, language, capability):
        if previous is not None:
            previous(backend, stages, options, language, capability)
        make_ptx = stages.get("ptx")
        if make_ptx is not None:
            stages["ptx"] = lambda src, metadata: edited(make_ptx(src, metadata))

    hook.xstage_ptx_edits = True
    return hook


def install() -> None:
    """Put the edits into Triton's compilation (once per process)."""
    from triton import knobs

    current = knobs.runtime.add_stages_inspection_hook
    if not getattr(current, "xstage_ptx_edits", False):
        knobs.runtime.add_stages_inspection_hook = _with_edits(current)
