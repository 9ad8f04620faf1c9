"""What one layer of a configuration does, counted from its ranks' dispatch plans: the
useful FLOPs and the bytes its combine epilogues store across each path. The records'
rates (tflops, remote_bytes, nvlink_bytes, host_bytes) come from these, in both process
models (problem.py, distributed.py).
"""

from __future__ import annotations

import numpy as np

from xstage_bench.megamoe import routing


def useful_flops(point: dict, plans: list[routing.RankRows]) -> float:
    """6 H I FLOPs per routed row (Linear-1: 4 H I, Linear-2: 2 H I), all ranks."""
    return 6.0 * point["H"] * point["I"] * sum(plan.rows for plan in plans)


def nvlink_bytes(
    point: dict, plans: list[routing.RankRows], host_homed: np.ndarray | None = None
) -> list[int]:
    """Bytes each rank's combine epilogue stores into peers (routing.peer_rows)."""
    return [int(np.count_nonzero(routing.peer_rows(p, host_homed))) * point["H"] * 2 for p in plans]


def host_bytes(
    point: dict, plans: list[routing.RankRows], host_homed: np.ndarray | None
) -> list[int]:
    """Bytes each rank's combine epilogue stores into host memory (routing.host_rows)."""
    return [int(np.count_nonzero(routing.host_rows(p, host_homed))) * point["H"] * 2 for p in plans]
