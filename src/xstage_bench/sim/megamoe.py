"""The fused MoE kernel (MegaMoE), simulated: the kernel's own tile lists and routing
against the X-Stage path.

Nothing here decides an order or a routing: the rows come from routing.route and
routing.dispatch_plan, the tile grid and list from schedule.build, exactly as the kernel
builds them (megamoe/layer/rank.py), so a simulated schedule is the measured one. The list
is then played event by event as the persistent kernel runs it: num_programs programs
take entries in list order (the atomic counter); a Linear-2 tile waits for every Linear-1
tile of its row block (the row-block counter); a tile lasts its FLOPs at one program's
share of the compute rate (an L1 tile 4 BM BN H, an L2 tile 2 BM BN I; a partial row
block costs a full tile, as on Tensor Cores). Each L2 tile ends with the combine push of
its block's valid rows x BN bf16: the rows whose home is another rank go through the
peer path (sim/xstage.py: fixed overhead T0, capacity Q, drain R, so a full path stalls
the program), then the rest through the local path. The remote share is the plan's own
count per row block, so a remote fraction (routing.py) changes it tile by tile.

The kernel ends when its slowest rank ends (the GPU runner times every rank), so by
default every rank is played and the slowest one reported. Ranks differ even under
balanced routing: a row more or less per expert moves block and wave boundaries, which
changed the slowest rank's time by up to 6% against the busiest rank's (8 GPUs, B200
profile). ranks="busiest" plays only the rank with the larger of its compute over the
programs and its remote bytes over R: cheaper (3x on 8 GPUs), within 1.2% on 2 GPUs.

Not modelled: dispatch (the rows are assumed present), caches (so expert-weight L2
locality is absent), clocks, launch cost, the receiver side of the combine.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from xstage_bench.data import grid
from xstage_bench.data.hardware import HardwareProfile
from xstage_bench.megamoe import routing, schedule
from xstage_bench.sim.xstage import EventBudget, PathParams, path_params

OUTPUT_BYTES = 2  # bf16 combine output
PRECISION_RATE = {"w4a8": "fp8", "w8a8": "fp8", "bf16": "bf16"}  # W4A8 expands to FP8 MMA


@lru_cache(maxsize=2)
def _dispatch(
    shape: str,
    E: int,
    topk: int,
    routing_name: str,
    tokens: int,
    world_size: int,
    fraction: float | str,
    skew_zipf: float,
    block_m: int,
    seed: int,
) -> tuple[routing.RankRows, ...]:
    point = {
        "shape": shape,
        "E": E,
        "topk": topk,
        "routing": routing_name,
        "tokens_per_rank": tokens,
        "world_size": world_size,
        "remote_fraction": fraction,
    }
    ids = [routing.route(point, skew_zipf, r, seed)[0] for r in range(world_size)]
    return tuple(routing.dispatch_plan(ids, E, block_m))


def dispatch(point: dict, megamoe: dict, seed: int = 0) -> tuple[routing.RankRows, ...]:
    """Every rank's rows, as the kernel's problem lays them out (cached: the precisions
    and schedules of a configuration share one routing)."""
    return _dispatch(
        point["shape"],
        point["E"],
        point["topk"],
        point["routing"],
        point["tokens_per_rank"],
        point["world_size"],
        point.get("remote_fraction", grid.NATURAL),
        megamoe.get("skew_zipf", 1.2),
        megamoe.get("block_m", 128),
        seed,
    )


@dataclass(frozen=True)
class RankWork:
    """One rank's kernel: its tile grid, and the bytes each Linear-2 tile of a row block
    pushes to other ranks (the peer path) and to its own (the local path)."""

    rank: int
    grid: schedule.TileGrid
    remote_bytes: np.ndarray  # (blocks,)
    local_bytes: np.ndarray  # (blocks,)


def rank_work(rows: routing.RankRows, point: dict, block_n: int, local_control: bool) -> RankWork:
    """The grid as rank.rank_buffers builds it; local_control keeps every row local."""
    widths = point["I"] // block_n, point["H"] // block_n
    grid = schedule.TileGrid(rows.block_expert, rows.block_rows, *widths)
    remote_row = ((rows.home >= 0) & (rows.home != rows.rank)).reshape(-1, rows.block_m)
    remote = remote_row.sum(axis=1) if not local_control else np.zeros(grid.blocks, dtype=int)
    row_bytes = block_n * OUTPUT_BYTES
    return RankWork(
        rows.rank,
        grid,
        remote_bytes=(remote * row_bytes).astype(float),
        local_bytes=((rows.block_rows - remote) * row_bytes).astype(float),
    )


@dataclass(frozen=True)
class Rates:
    """How long tiles last: one program's share of the compute rate."""

    programs: int
    l1_us: float
    l2_us: float

    @classmethod
    def at(cls, point: dict, block_m: int, block_n: int, tflops: float, programs: int) -> Rates:
        """Gate and up of an L1 tile: 4 BM BN H FLOPs; the down product of an L2 tile:
        2 BM BN I; each program computes at 1/programs of the GPU's rate."""
        per_program = tflops * 1e6 / programs  # TFLOP/s -> FLOP/us, one program
        return cls(
            programs,
            l1_us=4 * block_m * block_n * point["H"] / per_program,
            l2_us=2 * block_m * block_n * point["I"] / per_program,
        )

    def lower_bound_us(self, work: RankWork, drain: float) -> float:
        """No schedule beats the rank's compute spread over the programs, nor its remote
        bytes at the drain rate."""
        g = work.grid
        compute = g.blocks * (g.l1_per_block * self.l1_us + g.l2_per_block * self.l2_us)
        return max(compute / self.programs, float(work.remote_bytes.sum()) * g.l2_per_block / drain)


@dataclass
class MoEResult:
    time_us: float
    tflops: float  # useful FLOPs per GPU / time_us
    nvlink_bytes: int  # all ranks, as the GPU runner records it
    nvlink_bytes_per_rank: list[int]
    rank: int  # the rank simulated
    tiles: np.ndarray  # the tile list it played (schedule.build's)
    store_spans_us: list[float] = field(default_factory=list)  # one per Linear-2 tile
    waits_us: list[float] = field(default_factory=list)  # one per Linear-2 tile: start - taken
    # In list order: [program, "L1"|"L2", taken_us, end_us, store_start_us|None,
    # store_end_us|None], the GPU runner's trace rows (an L2 tile ends with its stores).
    timeline: list[list] = field(default_factory=list)


def simulate(
    point: dict,
    megamoe: dict,
    profile: HardwareProfile,
    schedule_name: str,
    *,
    local_control: bool = False,
    keep_timeline: bool = False,
    seed: int = 0,
    ranks: str = "all",
) -> MoEResult:
    """One configuration under one schedule, at the profile's matrix rate on every SM;
    local_control sends every store through the local path."""
    kind = PRECISION_RATE[point["precision"]]
    rate = profile.matrix_tflops.get(kind)
    if not rate:
        raise ValueError(f"profile '{profile.name}' has no matrix_tflops.{kind}")
    return simulate_at_rate(
        point,
        megamoe,
        profile,
        schedule_name,
        tflops=rate,
        num_programs=profile.sm_count,
        local_control=local_control,
        keep_timeline=keep_timeline,
        seed=seed,
        ranks=ranks,
    )


def simulate_at_rate(
    point: dict,
    megamoe: dict,
    profile: HardwareProfile,
    schedule_name: str,
    *,
    tflops: float,
    num_programs: int,
    local_control: bool = False,
    keep_timeline: bool = False,
    seed: int = 0,
    ranks: str = "all",
) -> MoEResult:
    """One configuration under one schedule with num_programs programs sharing a per-GPU
    compute rate of `tflops` (TFLOP/s); the store paths are the profile's."""
    block_m, block_n = megamoe.get("block_m", 128), megamoe.get("block_n", 128)
    H, I = point["H"], point["I"]  # noqa: E741 (the paper's name for the expert width)
    plans = dispatch(point, megamoe, seed)
    rates = Rates.at(point, block_m, block_n, tflops, num_programs)
    peer, local = path_params(profile, "peer"), path_params(profile, "local")
    works = [rank_work(rows, point, block_n, local_control) for rows in plans]
    if ranks == "busiest":
        works = [max(works, key=lambda w: rates.lower_bound_us(w, peer.drain))]
    elif ranks != "all":
        raise ValueError(f"ranks must be 'all' or 'busiest', got {ranks!r}")
    slowest = None
    for w in works:
        tiles = schedule.build(schedule_name, w.grid, num_programs, megamoe)
        played = play(tiles, w, rates, peer, local)
        if slowest is None or played.time_us > slowest[2].time_us:
            slowest = (w, tiles, played)
    work, tiles, played = slowest
    nvlink = [0 if local_control else rows.remote_rows() * H * OUTPUT_BYTES for rows in plans]
    useful_per_gpu = 6.0 * H * I * sum(rows.rows for rows in plans) / len(plans)
    l2 = tiles[:, 0] == schedule.L2
    return MoEResult(
        time_us=played.time_us,
        tflops=useful_per_gpu / played.time_us / 1e6,  # FLOP/us -> TFLOP/s
        nvlink_bytes=int(sum(nvlink)),
        nvlink_bytes_per_rank=nvlink,
        rank=work.rank,
        tiles=tiles,
        store_spans_us=(played.end - played.store_start)[l2].tolist(),
        waits_us=(played.start - played.taken)[l2].tolist(),
        timeline=played.timeline(tiles) if keep_timeline else [],
    )


@dataclass(frozen=True)
class Played:
    """Per list entry: its program, and when it was taken, started computing (an L2 tile
    after its rows are ready), began its stores (L2 only, else NaN) and ended."""

    program: np.ndarray
    taken: np.ndarray
    start: np.ndarray
    store_start: np.ndarray
    end: np.ndarray
    time_us: float  # the last tile's end, or the paths' last byte drained if later

    def timeline(self, tiles: np.ndarray) -> list[list]:
        rows = []
        for i, kind in enumerate(tiles[:, 0].tolist()):
            l2 = kind == schedule.L2
            end = float(self.end[i])
            store = [float(self.store_start[i]), end] if l2 else [None, None]
            rows.append(
                [int(self.program[i]), "L2" if l2 else "L1", float(self.taken[i]), end, *store]
            )
        return rows


def play(
    tiles: np.ndarray,
    work: RankWork,
    rates: Rates,
    peer_params: PathParams,
    local_params: PathParams,
) -> Played:
    """The event loop: programs taking list entries, row-block counters, two store paths.

    The heap holds (time, entry): an L1 entry's compute ends, or an L2 entry's fixed
    store overhead ends and its bytes reach the paths (one event per entry, so the entry
    breaks ties). The paths' own changes (an issuer done, the path full or empty) come
    from StorePath.next_time, asked only while someone issues: an idle path only drains,
    so it is brought up to date when it next receives bytes. Plain closures over lists,
    as this loop runs once per tile (about 40k tiles a configuration).
    """
    kind, block = tiles[:, 0].tolist(), tiles[:, 2].tolist()
    n, L1 = len(kind), schedule.L1
    remote, local_bytes = work.remote_bytes.tolist(), work.local_bytes.tolist()
    l1_us, l2_us, t0 = rates.l1_us, rates.l2_us, peer_params.t0_fixed_us
    l1_left = [work.grid.l1_per_block] * work.grid.blocks
    waiting: dict[int, list[int]] = {}  # row block -> L2 entries taken before it was ready
    program = [0] * n
    taken, start, end, store_start = [0.0] * n, [0.0] * n, [0.0] * n, [math.nan] * n
    events: list[tuple[float, int]] = []
    peer, local = peer_params.new_path(), local_params.new_path()
    push, pop = heapq.heappush, heapq.heappop
    next_entry = 0

    def take(prog: int, t: float) -> None:
        """A free program takes the next list entry (the kernel's atomic counter)."""
        nonlocal next_entry
        i = next_entry
        if i == n:
            return
        next_entry = i + 1
        program[i], taken[i] = prog, t
        if kind[i] == L1:
            start[i] = t
            push(events, (t + l1_us, i))
        elif l1_left[block[i]] == 0:
            begin_l2(i, t)
        else:
            waiting.setdefault(block[i], []).append(i)

    def begin_l2(i: int, t: float) -> None:
        start[i], store_start[i] = t, t + l2_us
        push(events, (t + l2_us + t0, i))

    def issue(path, i: int, nbytes: float, t: float) -> None:
        if not path.n:
            path.advance(t)
        path.add(i, nbytes)

    def issue_local(i: int, t: float) -> None:
        nbytes = local_bytes[block[i]]
        if nbytes > 0:
            issue(local, i, nbytes, t)
        else:
            end[i] = t
            take(program[i], t)

    for prog in range(rates.programs):
        take(prog, 0.0)
    now, stuck = 0.0, 0
    budget = EventBudget(n + rates.programs, f"megamoe: {n} tiles")
    while events or peer.n or local.n:
        budget.step()
        t = events[0][0] if events else math.inf
        if peer.n:
            t = min(t, peer.next_time())
        if local.n:
            t = min(t, local.next_time())
        peer_done = peer.advance(t) if peer.n else ()
        local_done = local.advance(t) if local.n else ()
        # A path whose rates dwarf the clock's resolution can stop time (its next change
        # rounds to now): fail instead of spinning.
        if t > now or peer_done or local_done or (events and events[0][0] <= t):
            now, stuck = t, 0
        elif (stuck := stuck + 1) > 16:
            raise RuntimeError(f"simulation stalled at t={t} us: store path rates too extreme")
        for i, _ in peer_done:  # the remote rows are issued: the local rows follow
            issue_local(i, t)
        for i, _ in local_done:  # the tile's stores are issued: the program moves on
            end[i] = t
            take(program[i], t)
        while events and events[0][0] <= t:
            i = pop(events)[1]
            b = block[i]
            if kind[i] == L1:
                end[i] = t
                l1_left[b] -= 1
                if l1_left[b] == 0:
                    for waiter in waiting.pop(b, ()):
                        begin_l2(waiter, t)
                take(program[i], t)
            elif remote[b] > 0:
                issue(peer, i, remote[b], t)
            else:
                issue_local(i, t)
    if waiting:  # every program waits on a block no one computes: the kernel would hang
        blocks = sorted(waiting)
        raise RuntimeError(f"deadlock: Linear-2 tiles wait on row blocks {blocks[:8]}")
    return Played(
        *(np.array(x) for x in (program, taken, start, store_start, end)),
        time_us=max(max(end), peer.empty_time(), local.empty_time()),
    )
