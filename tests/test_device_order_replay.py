"""kernels/ab/device_order_replay.py's trace summary: the gap from a program's tile's last
store to its next tile taken, per program, over a traced run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "kernels" / "ab"))
replay = pytest.importorskip("device_order_replay")


def _stamps(rows: list[tuple[int, int, int]]) -> np.ndarray:
    """(program, taken, store_end) in ns as the six trace columns."""
    return np.array([[p, t, t, e, e, e] for p, t, e in rows], dtype=np.int64)


def test_gaps_run_from_a_tiles_last_store_to_the_programs_next_tile():
    # program 0: tiles [0, 1000] then [1500, 3000]; program 1 (listed out of order): [4000,
    # 5000] after [200, 1200]: gaps 500 and 2800 ns
    got = replay.claim_gaps(
        _stamps([(0, 0, 1000), (1, 4000, 5000), (0, 1500, 3000), (1, 200, 1200)])
    )
    assert got["tiles"] == 4 and got["span_us"] == pytest.approx(5.0)
    assert got["gap_us_sum"] == pytest.approx(3.3)
    assert got["gap_us_median"] == pytest.approx(1.65)
    assert got["gap_us_p90"] == pytest.approx(0.5 + 0.9 * 2.3)


def test_a_program_with_one_tile_has_no_gap():
    got = replay.claim_gaps(_stamps([(0, 0, 1000), (1, 100, 900)]))
    assert got["gap_us_sum"] == 0.0 and got["gap_us_median"] == 0.0 and got["tiles"] == 2
