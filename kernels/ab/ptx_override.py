"""Diagnostic, timing only: our kernel's DIAG_OVERRIDE build with the PTX Triton made for
it, less the warpgroup barriers that Triton puts before each mbarrier wait of a partition.

    PYTHONPATH=src:kernels:kernels/ab python3 kernels/ab/ptx_override.py \
        [kernel_ab arguments] --option DIAG_OVERRIDE=0,1

runs xstage_bench.megamoe.kernel_ab with a compilation hook (Triton's
add_stages_inspection_hook) that edits the PTX of every build compiled while
megamoe_ws.DIAG_OVERRIDE is set: the A/B's second arm. Triton's shared-memory barrier
analysis cannot tell a partition's mbarrier allocations apart (they reach it as the
partition's arguments), so after each slot release (an arrive: a write) it syncs the
warpgroup before the next slot wait (a read of another barrier). A wait reads no data
another thread wrote, so dropping that barrier changes no result: the A/B's checks say so.
"""

import re
import sys

from triton import knobs

from xstage_bench.megamoe import kernel_ab
from xstage_kernels import megamoe_ws

KERNEL = "_fused_moe_ws"
_BARRIER = re.compile(r"^\s*bar\.sync\s+\d+,\s*128;\s*$")


def code_after(lines: list[str], i: int, count: int) -> list[str]:
    """The next `count` lines after line i that are code (no comments, .loc, blanks)."""
    out = []
    for line in lines[i + 1 :]:
        text = line.strip()
        if text and not text.startswith(("//", ".loc")):
            out.append(text)
            if len(out) == count:
                break
    return out


def drop_wait_barriers(ptx: str) -> tuple[str, int]:
    """The PTX without each 128-thread barrier right before an mbarrier wait, and how many."""
    lines = ptx.splitlines()
    kept, dropped = [], 0
    for i, line in enumerate(lines):
        if _BARRIER.match(line) and any("try_wait" in t for t in code_after(lines, i, 4)):
            dropped += 1
            continue
        kept.append(line)
    return "\n".join(kept) + "\n", dropped


def _edit_ptx(backend, stages, options, language, capability) -> None:
    make_ptx = stages["ptx"]

    def ptx_stage(src, metadata):
        ptx = make_ptx(src, metadata)
        if metadata.get("name") == KERNEL and megamoe_ws.DIAG_OVERRIDE:
            ptx, dropped = drop_wait_barriers(ptx)
            print(f"[ptx_override] {KERNEL}: {dropped} barriers before waits dropped", flush=True)
        return ptx

    stages["ptx"] = ptx_stage


def install() -> None:
    knobs.runtime.add_stages_inspection_hook = _edit_ptx


if __name__ == "__main__":
    install()
    sys.exit(kernel_ab.main(sys.argv[1:]))
