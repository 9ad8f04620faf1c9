"""A fused MoE kernel (MegaMoE) on one rank: tile schedules against the X-Stage path.

One persistent program per SM takes tiles from a schedule. A Linear-1 tile is block_m
rows x block_n columns of the 2I gate/up output (reduction over H); a Linear-2 tile is
block_m x block_n of the H output (reduction over I) and needs every Linear-1 tile of its
rows (SwiGLU joins gate and up). Tile time is its FLOPs at one SM's share of the matrix
throughput; a partial row block costs a full tile, as on Tensor Cores. Each Linear-2 tile
ends with the combine push of its bf16 output: the remote (P-1)/P share goes through the
peer path (capacity Q, drain R: backpressure stalls that program), the local share
through the local path. Ranks are symmetric, so one rank stands for all.

Not modelled: dispatch (the rows are assumed present), caches (so the expert-weight L2
locality that costs interleaving on balanced routing is absent), clocks and launch cost.
"""

from __future__ import annotations

import heapq
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from xstage_bench.hardware import HardwareProfile
from xstage_bench.sim.xstage import EventBudget, PathParams, path_params

OUTPUT_BYTES = 2  # bf16 combine output
PRECISION_RATE = {"w4a8": "fp8", "w8a8": "fp8", "bf16": "bf16"}  # W4A8 expands to FP8 MMA


def expert_rows(point: dict, skew_zipf: float, seed: int = 0) -> np.ndarray:
    """Rows routed to each of this rank's E/P experts (T*topk rows in all).

    balanced: as even as integers allow. skewed: a multinomial draw over Zipf(skew_zipf)
    weights in a seeded random expert order, seeded by shape, tokens and world size, so
    both schedules and both precisions of a shape see the same routing.
    """
    local_experts = point["E"] // point["world_size"]
    rows = point["tokens_per_rank"] * point["topk"]
    if point["routing"] == "balanced":
        counts = np.full(local_experts, rows // local_experts)
        counts[: rows % local_experts] += 1
        return counts
    if point["routing"] != "skewed":
        raise ValueError(f"routing must be 'balanced' or 'skewed', got {point['routing']!r}")
    key = f"{point['shape']}/T={point['tokens_per_rank']}/P={point['world_size']}"
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    weights = np.arange(1, local_experts + 1, dtype=float) ** -skew_zipf
    return rng.multinomial(rows, rng.permutation(weights / weights.sum()))


@dataclass(frozen=True)
class MoEPlan:
    """The rank's work: row blocks (in expert order) and the cost of their tiles."""

    block_expert: np.ndarray  # expert of each row block
    block_rows: np.ndarray  # rows in each block (<= block_m)
    block_row_end: np.ndarray  # rows of all blocks up to and including this one
    l1_tiles_per_block: int
    l2_tiles_per_block: int
    l1_tile_us: float
    l2_tile_us: float
    block_n: int
    useful_flops: float

    @property
    def blocks(self) -> int:
        return len(self.block_rows)


def plan(point: dict, megamoe: dict, profile: HardwareProfile, seed: int = 0) -> MoEPlan:
    block_m, block_n = megamoe.get("block_m", 128), megamoe.get("block_n", 128)
    H, I = point["H"], point["I"]  # noqa: E741 (the paper's name for the expert width)
    rows = expert_rows(point, megamoe.get("skew_zipf", 1.2), seed)
    per_block = [min(block_m, r - s) for r in rows for s in range(0, r, block_m)]
    experts = [e for e, r in enumerate(rows) for _ in range(0, r, block_m)]
    rate = profile.matrix_tflops.get(PRECISION_RATE[point["precision"]])
    if not rate:
        raise ValueError(
            f"profile '{profile.name}' has no matrix_tflops.{PRECISION_RATE[point['precision']]}"
        )
    flops_per_us_per_sm = rate * 1e6 / profile.sm_count  # TFLOP/s -> FLOP/us, one SM
    return MoEPlan(
        block_expert=np.array(experts, dtype=int),
        block_rows=np.array(per_block, dtype=int),
        block_row_end=np.cumsum(per_block),
        l1_tiles_per_block=math.ceil(2 * I / block_n),
        l2_tiles_per_block=math.ceil(H / block_n),
        l1_tile_us=2 * block_m * block_n * H / flops_per_us_per_sm,
        l2_tile_us=2 * block_m * block_n * I / flops_per_us_per_sm,
        block_n=block_n,
        useful_flops=6.0 * H * I * float(rows.sum()),  # 4rHI (Linear-1) + 2rHI (Linear-2)
    )


Tile = tuple[str, int]  # ("L1" | "L2", row block)


class TileSchedule(Protocol):
    """The swappable unit: which tile a free program takes next (None: no work left).

    A returned Linear-2 tile whose rows are not ready makes the program wait for them.
    """

    def next_tile(self, ready: Callable[[int], bool]) -> Tile | None: ...


class ExpertWave:
    """The smallest group of experts whose Linear-1 tiles fill every SM, then their
    Linear-2 tiles, then the next group: a wave's Linear-2 stores end close together."""

    def __init__(self, p: MoEPlan, sm_count: int, lead_rows: int = 0):
        order: list[Tile] = []
        wave: list[int] = []
        for j in range(p.blocks):
            wave.append(j)
            closes_expert = j + 1 == p.blocks or p.block_expert[j + 1] != p.block_expert[j]
            if closes_expert and (
                len(wave) * p.l1_tiles_per_block >= sm_count or j + 1 == p.blocks
            ):
                order += [("L1", b) for b in wave for _ in range(p.l1_tiles_per_block)]
                order += [("L2", b) for b in wave for _ in range(p.l2_tiles_per_block)]
                wave = []
        self._order = order
        self._next = 0

    def next_tile(self, ready: Callable[[int], bool]) -> Tile | None:
        if self._next == len(self._order):
            return None
        self._next += 1
        return self._order[self._next - 1]


class Interleaved:
    """A Linear-1 cursor and a Linear-2 cursor: take Linear-2 work when its rows are ready
    and Linear-1 leads it by at least lead_rows rows (or has finished), else Linear-1 work,
    so computation sits between the remote-store bursts."""

    def __init__(self, p: MoEPlan, sm_count: int, lead_rows: int):
        self._p = p
        self._lead = lead_rows
        self._l1 = 0  # Linear-1 tiles handed out, in block order
        self._l2 = 0
        self._l1_total = p.blocks * p.l1_tiles_per_block
        self._l2_total = p.blocks * p.l2_tiles_per_block

    def _l1_row(self) -> int:
        """First row of the block the Linear-1 cursor is in."""
        block = self._l1 // self._p.l1_tiles_per_block
        return int(self._p.block_row_end[block] - self._p.block_rows[block])

    def next_tile(self, ready: Callable[[int], bool]) -> Tile | None:
        p = self._p
        if self._l2 < self._l2_total:
            block = self._l2 // p.l2_tiles_per_block
            l1_done = self._l1 == self._l1_total
            if ready(block) and (l1_done or self._l1_row() - p.block_row_end[block] >= self._lead):
                self._l2 += 1
                return ("L2", block)
        if self._l1 < self._l1_total:
            self._l1 += 1
            return ("L1", (self._l1 - 1) // p.l1_tiles_per_block)
        if self._l2 < self._l2_total:
            self._l2 += 1
            return ("L2", (self._l2 - 1) // p.l2_tiles_per_block)
        return None


SCHEDULES: dict[str, type] = {"expert_wave": ExpertWave, "interleaved": Interleaved}


@dataclass
class MoEResult:
    time_us: float
    tflops: float
    nvlink_bytes: int
    store_spans_us: list[float] = field(default_factory=list)  # one per Linear-2 tile
    # [program, "L1"|"L2", start_us, end_us, store_start_us|None, store_end_us|None]
    timeline: list[list] = field(default_factory=list)


def simulate(
    point: dict,
    megamoe: dict,
    profile: HardwareProfile,
    schedule: str,
    *,
    local_control: bool = False,
    keep_timeline: bool = False,
    seed: int = 0,
) -> MoEResult:
    """Run one configuration under one schedule; local_control sends every store locally."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    p = plan(point, megamoe, profile, seed)
    sched: TileSchedule = SCHEDULES[schedule](p, profile.sm_count, megamoe.get("lead_rows", 0))
    P = point["world_size"]
    peer_params, local_params = path_params(profile, "peer"), path_params(profile, "local")
    return _Run(
        p, sched, profile.sm_count, peer_params, local_params, P, local_control, keep_timeline
    ).result()


class _Run:
    """The event loop: programs, the row blocks' readiness, and the two store paths."""

    def __init__(
        self,
        p: MoEPlan,
        sched: TileSchedule,
        programs: int,
        peer: PathParams,
        local: PathParams,
        P: int,
        local_control: bool,
        keep_timeline: bool,
    ):
        self.p, self.sched = p, sched
        self.peer, self.local = peer.new_path(), local.new_path()
        self.remote_share = 0.0 if local_control else (P - 1) / P
        self.keep = keep_timeline
        self.l1_left = np.full(p.blocks, p.l1_tiles_per_block)
        self.waiting: dict[int, list[int]] = {}  # row block -> programs waiting for it
        self.events: list[tuple[float, int, str, int, int]] = []
        self.seq = 0
        self.tile: dict[int, list] = {}  # program -> its current timeline row
        self.store_bytes: dict[int, float] = {}  # program -> bytes of its combine push
        self.params = peer  # the issue rate and fixed overhead are the SM's, on either path
        tiles = p.blocks * (p.l1_tiles_per_block + p.l2_tiles_per_block)
        self.budget = EventBudget(tiles + programs, f"megamoe: {tiles} tiles")
        self.spans: list[float] = []
        self.timeline: list[list] = []
        self.nvlink_bytes = 0.0
        self.end = 0.0
        for prog in range(programs):
            self.dispatch(prog, 0.0)
        self.loop()

    def push(self, t: float, what: str, prog: int, block: int) -> None:
        heapq.heappush(self.events, (t, self.seq, what, prog, block))
        self.seq += 1

    def ready(self, block: int) -> bool:
        return self.l1_left[block] == 0

    def dispatch(self, prog: int, t: float) -> None:
        tile = self.sched.next_tile(self.ready)
        if tile is None:
            self.end = max(self.end, t)
            return
        kind, block = tile
        if kind == "L1":
            self.start_compute(prog, t, "L1", block, self.p.l1_tile_us)
        elif self.ready(block):
            self.start_compute(prog, t, "L2", block, self.p.l2_tile_us)
        else:
            self.waiting.setdefault(block, []).append(prog)

    def start_compute(self, prog: int, t: float, kind: str, block: int, dur: float) -> None:
        self.tile[prog] = [prog, kind, t, t + dur, None, None]
        self.push(t + dur, kind, prog, block)

    def loop(self) -> None:
        p = self.p
        while self.events or self.peer.n or self.local.n:
            self.budget.step()
            t = min(
                self.events[0][0] if self.events else math.inf,
                self.peer.next_time(),
                self.local.next_time(),
            )
            remote_done, local_done = self.peer.advance(t), self.local.advance(t)
            for prog, _ in remote_done:
                self.issue_local(prog, t)
            for prog, _ in local_done:
                self.stored(prog, t)
            while self.events and self.events[0][0] <= t:
                _, _, what, prog, block = heapq.heappop(self.events)
                if what == "L1":
                    self.finish_tile(prog)
                    self.l1_left[block] -= 1
                    if self.l1_left[block] == 0:
                        for waiter in self.waiting.pop(block, []):
                            self.start_compute(waiter, t, "L2", block, p.l2_tile_us)
                    self.dispatch(prog, t)
                elif what == "L2":  # the combine push begins: the remote share goes first
                    self.tile[prog][4] = t
                    self.store_bytes[prog] = float(p.block_rows[block] * p.block_n * OUTPUT_BYTES)
                    remote = self.store_bytes[prog] * self.remote_share
                    self.nvlink_bytes += remote
                    if remote > 0:
                        self.peer.add(prog, remote)
                    else:
                        self.issue_local(prog, t)
                else:  # "stored"
                    self.store_done(prog, t)

    def issue_local(self, prog: int, t: float) -> None:
        local = self.store_bytes[prog] * (1.0 - self.remote_share)
        if local > 0:
            self.local.add(prog, local)
        else:
            self.stored(prog, t)

    def stored(self, prog: int, t: float) -> None:
        """Every byte admitted: the push ends as PathParams.issue_end says."""
        began = self.tile[prog][4]
        self.push(self.params.issue_end(began, self.store_bytes[prog], t), "stored", prog, -1)

    def store_done(self, prog: int, t: float) -> None:
        del self.store_bytes[prog]
        row = self.tile[prog]
        row[5] = t
        self.spans.append(t - row[4])
        self.finish_tile(prog)
        self.dispatch(prog, t)

    def finish_tile(self, prog: int) -> None:
        row = self.tile.pop(prog)
        if self.keep:
            self.timeline.append(row)

    def result(self) -> MoEResult:
        end = max(self.end, self.peer.empty_time(), self.local.empty_time())
        return MoEResult(
            time_us=end,
            tflops=self.p.useful_flops / end / 1e6,  # FLOP/us -> TFLOP/s
            nvlink_bytes=int(round(self.nvlink_bytes)),
            store_spans_us=self.spans,
            timeline=self.timeline,
        )
