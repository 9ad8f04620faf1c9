"""kernels/ab/ncu_stalls.py, the summary of an Nsight Compute source page: the committed
summary is what the script prints from the committed page, and a small page is classified
by what its samples wait for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

AB = Path(__file__).parents[1] / "kernels" / "ab"
SCRIPT = AB / "ncu_stalls.py"
REASONS = ["stall_barrier", "stall_long_sb", "stall_wait"]


def _summary(path: Path) -> str:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, check=True
    )
    return run.stdout


def test_the_committed_summary_is_generated_from_the_committed_page():
    page = AB / "2026-12-03-ncu-source-deepseek-v4-flash-w8a8-16384.csv.gz"
    committed = (AB / "2026-12-03-ncu-stalls-deepseek-v4-flash-w8a8-16384.txt").read_text()
    assert _summary(page) == committed


def _row(address: str, source: str, executed: int, **stalls: int) -> str:
    counts = [stalls.get(r, 0) for r in REASONS]
    cells = [address, source, sum(counts), executed, *counts]
    return ",".join(f'"{c}"' for c in cells)


def test_samples_are_classed_by_what_they_wait_for(tmp_path):
    header = ",".join(
        f'"{h}"'
        for h in ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
        + REASONS
    )
    page = tmp_path / "page.csv"
    page.write_text(
        "\n".join(
            [
                "==PROF== Connected",
                '"Kernel Name","k",',
                header,
                _row("0x0", "WARPGROUP.DEPBAR.LE gsb0, 0x0", 4096, stall_barrier=50),
                _row("0x10", "@!P1  BRA 0x80", 4096, stall_long_sb=30),
                _row("0x20", "MOV R1, R2", 4096, stall_long_sb=15, stall_wait=1),
                _row("0x30", "NOP", 132, stall_barrier=4),
            ]
        )
        + "\n"
    )
    out = _summary(page)
    assert "4 SASS instructions, 100 samples" in out
    for kind, n in [
        ("wgmma wait", 50),
        ("mbarrier wait (try_wait loop)", 30),
        ("first use of a loaded value", 16),
        ("idle warps (padding, exit)", 4),
    ]:
        assert any(
            line.split()[:-2] == kind.split() and line.split()[-2] == str(n)
            for line in out.splitlines()
        ), (kind, out)
