"""kernels/ab/tile_phases.py: the per-tile phases of a traced run add up to the CTAs'
time, and the tiles that waited least give a step's own time."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "kernels" / "ab"))
tile_phases = pytest.importorskip("tile_phases")

L1, L2 = 0, 1
H, I = 256, 384  # noqa: E741  (L1 tiles: 4 steps, L2 tiles: 3)


def _run(per_step: float, waits: list[float], epilogue: float):
    """CTAs of an L1 tile then L2 tiles, each tile's MMA phase its wait (one per tile, in
    order) plus per_step * steps, then the epilogue (ns). Returns (stamps, tile list)."""
    rows, kinds, left = [], [], list(waits)
    for program in range(len(waits) // 4):
        clock = 0.0
        for kind, steps in ((L1, 4), (L2, 3), (L2, 3), (L2, 3)):
            taken = clock
            mma_done = clock + left.pop(0) + per_step * steps
            clock = mma_done + epilogue
            rows.append([program, taken, taken, mma_done, mma_done, clock])
            kinds.append([kind, 0, 0, 0])
    return np.array(rows, dtype=np.int64), np.array(kinds)


def test_phases_add_up_to_the_ctas_time():
    stamps, tiles = _run(per_step=300.0, waits=[0.0] * 8 + [500.0] * 4, epilogue=50.0)
    got = tile_phases.phases(stamps, tiles, H, I)
    assert got["programs"] == 3
    assert sum(got["shares"].values()) == pytest.approx(1.0)
    assert got["L2"]["tiles"] == 9 and got["L1"]["steps_per_tile"] == 4
    assert got["L1"]["epilogue_us_median"] == pytest.approx(0.05)
    # the third CTA's tiles each waited 500 ns: per-tile overhead, and the others' tail
    assert got["shares"]["tail"] > 0 and got["shares"]["L2 per-tile MMA overhead"] > 0


def test_the_tiles_that_waited_least_give_a_steps_own_time():
    waits = [0.0, 0.0, 0.0, 0.0] * 5 + [900.0, 600.0, 600.0, 600.0] * 5
    stamps, tiles = _run(per_step=200.0, waits=waits, epilogue=0.0)
    got = tile_phases.phases(stamps, tiles, H, I)
    assert got["L1"]["us_per_step"] == pytest.approx(0.2)
    assert got["L2"]["us_per_step"] == pytest.approx(0.2)
    # overhead: exactly the waits, over the CTAs' summed time (10 CTAs to the last end)
    end = stamps[:, 5].max()
    assert got["shares"]["L2 per-tile MMA overhead"] == pytest.approx(5 * 1800 / (10 * end))
