"""The fused kernel's tile list played through a store path (issue 52, item 4).

Nothing here decides an order or a routing: the rows come from routing.route and
routing.dispatch_plan, the tile grid and list from schedule.build, exactly as the kernel
builds them (layer/rank.py), so a played schedule is the measured one; an interleaved arm
decided on the device plays the order the kernel's rule realizes (schedule.claim_order:
counted, the list with every block released in time). The list is then played event by
event as the persistent kernel runs it: num_programs programs take
entries in list order (the atomic counter); a Linear-2 tile waits for every Linear-1 tile
of its row block (the row-block counter); a tile lasts its `Rates` cost. Each L2 tile
then stores its block's valid rows x block_n bf16: the rows whose home is far (another
rank on the peer path, host memory on the host path: `far_rows`) enter the far path
(drain.py: issue time T0 = t0_fixed + B / issue rate, capacity Q(K) = min(S + K q, C) at the K
programs issuing, drain R, after its slow start where a lag is played), then the rest the
near path, or, with no near path given, nothing: their cost is in the tile's (a tile cost
calibrated where every row is near).

The hold: a program that stored is held at its next memory operation, the atomic that
claims its next tile, until its own far stores have drained (issue 52, finding 1: an
atomic waits for the drain, so the gap does not hide it). The path drains first in first
out at R, so a program whose last byte was admitted at t with q bytes in the path is
released at t + q / R (later by what is left of the drain's slow start where a lag is
played: StorePath.empty_time; the dataset playback plays none, lead.PLAYS_DRAIN_LAG).
`hold=False` moves on as soon as the stores are issued.

The kernel ends when its slowest rank ends, so every rank is played and the slowest one
reported (ranks="busiest": only the rank with the larger of its compute over the
programs and its far bytes over R; cheaper, within 1.2% on 2 GPUs).
Not modelled: dispatch (the rows are present), caches, clocks, launch cost, the receiver.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from xstage_bench.data import grid, storepath
from xstage_bench.megamoe import routing, schedule
from xstage_bench.megamoe.drain import EventBudget, PathParams
from xstage_bench.megamoe.layer.inputs import host_share, routing_point

OUTPUT_BYTES = 2  # bf16 combine output


def _routing_key(point: dict, megamoe: dict) -> tuple:
    """What fixes a configuration's rows on the ranks: its routing point and the layout."""
    routed = routing_point(point)
    return (
        point["shape"],
        point["E"],
        point["topk"],
        point["routing"],
        point["tokens_per_rank"],
        point["world_size"],
        routed.get("remote_fraction", grid.NATURAL),
        megamoe.get("skew_zipf", 1.2),
        megamoe.get("block_m", 128),
    )


@lru_cache(maxsize=4)
def _dispatch(key: tuple, seed: int) -> tuple[routing.RankRows, ...]:
    shape, E, topk, routing_name, tokens, world_size, fraction, skew_zipf, block_m = key
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
    """Every rank's rows, as the kernel's problem lays them out (cached: the precisions,
    schedules and host shares of a configuration share one routing)."""
    return _dispatch(_routing_key(point, megamoe), seed)


def config_key(point: dict, megamoe: dict) -> tuple:
    """What fixes a configuration's tile grids (not its precision, schedule or host share)."""
    widths = (point["H"], point["I"], megamoe.get("block_n", 128))
    return (*_routing_key(point, megamoe), *widths)


def far_rows(rows: routing.RankRows, point: dict, seed: int = 0) -> np.ndarray:
    """Which of a rank's rows cross the point's path: on the host path those of host-homed
    tokens (routing.host_tokens, as layer/problem.py picks them), else those whose home is
    another rank."""
    if storepath.point_path(point) != storepath.HOST:
        return routing.peer_rows(rows)
    share = host_share(point)
    if share == 0:
        return np.zeros(len(rows.home), dtype=bool)
    homed = np.zeros((point["world_size"], point["tokens_per_rank"]), dtype=bool)
    for r in range(point["world_size"]):
        homed[r, routing.host_tokens(point, share, r, seed)] = True
    return routing.host_rows(rows, homed)


@dataclass(frozen=True)
class RankWork:
    """One rank's kernel: its tile grid, and the bytes each Linear-2 tile of a row block
    pushes over the far path and to the near one."""

    rank: int
    grid: schedule.TileGrid
    remote_bytes: np.ndarray  # (blocks,) over the far path
    local_bytes: np.ndarray  # (blocks,)

    def prefix(self, blocks: int) -> RankWork:
        """The work of its first `blocks` row blocks alone (all of it if it has fewer)."""
        g, k = self.grid, max(int(blocks), 1)
        kept = schedule.TileGrid(
            g.block_expert[:k], g.block_rows[:k], g.l1_per_block, g.l2_per_block
        )
        return RankWork(self.rank, kept, self.remote_bytes[:k], self.local_bytes[:k])


def rank_work(
    rows: routing.RankRows, point: dict, block_n: int, local_control: bool, seed: int = 0
) -> RankWork:
    """The grid as rank.rank_buffers builds it; local_control keeps every row near."""
    widths = point["I"] // block_n, point["H"] // block_n
    tiles = schedule.TileGrid(rows.block_expert, rows.block_rows, *widths)
    if local_control:
        remote = np.zeros(tiles.blocks, dtype=int)
    else:
        remote = far_rows(rows, point, seed).reshape(-1, rows.block_m).sum(axis=1)
    row_bytes = block_n * OUTPUT_BYTES
    return RankWork(
        rows.rank,
        tiles,
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
        if not tflops > 0 or programs < 1:
            raise ValueError(f"tile costs need a rate > 0 and programs >= 1: {tflops}, {programs}")
        per_program = tflops * 1e6 / programs  # TFLOP/s -> FLOP/us, one program
        return cls(
            programs,
            l1_us=4 * block_m * block_n * point["H"] / per_program,
            l2_us=2 * block_m * block_n * point["I"] / per_program,
        )

    def scaled(self, factor: float) -> Rates:
        """Every tile `factor` times as long (a calibration of the compute rate)."""
        return Rates(self.programs, self.l1_us * factor, self.l2_us * factor)

    def lower_bound_us(self, work: RankWork, drain: float) -> float:
        """No schedule beats the rank's compute spread over the programs, nor its far
        bytes at the drain rate."""
        g = work.grid
        compute = g.blocks * (g.l1_per_block * self.l1_us + g.l2_per_block * self.l2_us)
        return max(compute / self.programs, float(work.remote_bytes.sum()) * g.l2_per_block / drain)


@dataclass(frozen=True)
class Played:
    """Per list entry: its program, and when it was taken, started computing (an L2 tile
    after its rows are ready), began its stores (L2 only, else NaN) and ended (for an L2
    tile: its program was free to claim the next, after the stores and any hold)."""

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


def store_issue_us(work: RankWork, far: PathParams, near: PathParams | None) -> list[float]:
    """Per row block, an L2 tile's backpressure-free store time T0: the fixed overhead and
    its far bytes at the far issue rate, then its near bytes at the near one; nothing for
    a tile with neither (no far bytes, and its near stores in its cost)."""
    t0 = work.remote_bytes / far.issue_rate
    if near is not None:
        t0 = t0 + work.local_bytes / near.issue_rate
    stores = (work.remote_bytes > 0) | (near is not None)
    return np.where(stores, far.t0_fixed_us + t0, 0.0).tolist()


# What an entry's next event means: its compute ends, its stores' T0 ends (every byte was
# admitted earlier), or its program is released (stores issued, and drained if held).
_COMPUTED, _ISSUED, _RELEASED = 0, 1, 2


def play(
    tiles: np.ndarray,
    work: RankWork,
    rates: Rates,
    far: PathParams,
    near: PathParams | None = None,
    *,
    hold: bool = True,
) -> Played:
    """The event loop: programs taking list entries, row-block counters, the store paths.

    The heap holds (time, entry): one event per entry at a time, its stage in `stage`. The
    paths' own changes (an issuer done, the path full or empty) come from
    StorePath.next_time, asked only while someone issues: an idle path only drains, so it
    is brought up to date when it next receives bytes. Plain closures over lists, as this
    loop runs once per tile (about 40k tiles a configuration).
    """
    kind, block = tiles[:, 0].tolist(), tiles[:, 2].tolist()
    n, L1 = len(kind), schedule.L1
    remote, local_bytes = work.remote_bytes.tolist(), work.local_bytes.tolist()
    l1_us, l2_us = rates.l1_us, rates.l2_us
    l1_left = [work.grid.l1_per_block] * work.grid.blocks
    waiting: dict[int, list[int]] = {}  # row block -> L2 entries taken before it was ready
    program, stage = [0] * n, [_COMPUTED] * n
    taken, start, end, store_start = [0.0] * n, [0.0] * n, [0.0] * n, [math.nan] * n
    held = [0.0] * n  # when the entry's far stores have drained
    t0_us = store_issue_us(work, far, near)
    events: list[tuple[float, int]] = []
    far_path = far.new_path()
    near_path = near.new_path() if near is not None else None
    paths = [p for p in (far_path, near_path) if p is not None]
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
        push(events, (t + l2_us, i))

    def issue(path, i: int, nbytes: float, t: float) -> None:
        if not path.n:
            path.advance(t)
        path.add(i, nbytes)

    def issue_near(i: int, t: float) -> None:
        nbytes = local_bytes[block[i]]
        if near_path is not None and nbytes > 0:
            issue(near_path, i, nbytes, t)
        else:
            issued(i, t)

    def issued(i: int, t: float) -> None:
        """Every byte admitted; the stores are issued once their T0 is over too."""
        if t < store_start[i] + t0_us[block[i]]:
            stage[i] = _ISSUED
            push(events, (store_start[i] + t0_us[block[i]], i))
        else:
            release(i, t)

    def release(i: int, t: float) -> None:
        """Stores issued: the program claims its next tile, after its hold if held."""
        if hold and held[i] > t:
            stage[i] = _RELEASED
            push(events, (held[i], i))
            return
        end[i] = t
        take(program[i], t)

    for prog in range(rates.programs):
        take(prog, 0.0)
    now, stuck = 0.0, 0
    budget = EventBudget(3 * n + rates.programs, f"megamoe: {n} tiles")
    while events or any(p.n for p in paths):
        budget.step()
        t = events[0][0] if events else math.inf
        for p in paths:
            if p.n:
                t = min(t, p.next_time())
        far_done = far_path.advance(t) if far_path.n else ()
        near_done = near_path.advance(t) if near_path is not None and near_path.n else ()
        # A path whose rates dwarf the clock's resolution can stop time (its next change
        # rounds to now): fail instead of spinning.
        if t > now or far_done or near_done or (events and events[0][0] <= t):
            now, stuck = t, 0
        elif (stuck := stuck + 1) > 16:
            raise RuntimeError(f"simulation stalled at t={t} us: store path rates too extreme")
        for i, _ in far_done:  # admitted: its last byte drains at t + q / R (first in, first out)
            held[i] = far_path.empty_time()
            issue_near(i, t)
        for i, _ in near_done:
            issued(i, t)
        while events and events[0][0] <= t:
            i = pop(events)[1]
            if stage[i] == _RELEASED:
                end[i] = t
                take(program[i], t)
            elif stage[i] == _ISSUED:
                release(i, t)
            elif kind[i] == L1:
                b = block[i]
                end[i] = t
                l1_left[b] -= 1
                if l1_left[b] == 0:
                    for waiter in waiting.pop(b, ()):
                        begin_l2(waiter, t)
                take(program[i], t)
            elif remote[block[i]] > 0:
                issue(far_path, i, remote[block[i]], t)
            else:
                issue_near(i, t)
    if waiting:  # every program waits on a block no one computes: the kernel would hang
        blocks = sorted(waiting)
        raise RuntimeError(f"deadlock: Linear-2 tiles wait on row blocks {blocks[:8]}")
    return Played(
        *(np.array(x) for x in (program, taken, start, store_start, end)),
        time_us=max(max(end), *(p.empty_time() for p in paths)),
    )


@dataclass(frozen=True)
class KernelPlay:
    """One configuration under one schedule: its slowest rank's work, list and play."""

    work: RankWork
    tiles: np.ndarray
    played: Played

    @property
    def time_us(self) -> float:
        return self.played.time_us


def rank_works(
    point: dict, megamoe: dict, *, local_control: bool = False, seed: int = 0
) -> list[RankWork]:
    """Every rank's work for a point (its rows cached per configuration)."""
    block_n = megamoe.get("block_n", 128)
    return [
        rank_work(rows, point, block_n, local_control, seed)
        for rows in dispatch(point, megamoe, seed)
    ]


def play_kernel(
    point: dict,
    megamoe: dict,
    schedule_name: str,
    rates: Rates,
    far: PathParams,
    near: PathParams | None = None,
    *,
    hold: bool = True,
    local_control: bool = False,
    seed: int = 0,
    ranks: str = "all",
    tile_lists: dict | None = None,
) -> KernelPlay:
    """Every rank (or the busiest) of one configuration under one schedule, with the knobs
    of `megamoe` (and the point's lead_rows); the slowest rank's play. `tile_lists`: a
    dict that keeps the lists built (keyed by configuration, rank, schedule and knobs), for
    a caller that plays a configuration many times (shares, leads, calibrations)."""
    configuration = (config_key(point, megamoe), seed, rates.programs)
    works = rank_works(point, megamoe, local_control=local_control, seed=seed)
    if ranks == "busiest":
        works = [max(works, key=lambda w: rates.lower_bound_us(w, far.drain))]
    elif ranks != "all":
        raise ValueError(f"ranks must be 'all' or 'busiest', got {ranks!r}")
    knobs = {**megamoe, **{k: point[k] for k in ("lead_rows",) if k in point}}
    chosen = tuple(sorted(schedule.knobs(schedule_name, knobs).items()))
    # Decided on the device, every rule's order is its list (schedule.claim_order): the
    # kernel decides interleaved counted, which reads no time.
    counted = grid.decided_on(point) == grid.DEVICE and schedule_name == schedule.INTERLEAVED
    slowest = None
    for w in works:
        key = (configuration, w.rank, schedule_name, chosen, counted)
        tiles = None if tile_lists is None else tile_lists.get(key)
        if tiles is None:
            if counted:
                lead = int(knobs.get("lead_rows", 0))
                tiles = schedule.claim_order(schedule_name, w.grid, rates.programs, lead)
            else:
                tiles = schedule.build(schedule_name, w.grid, rates.programs, knobs)
            if tile_lists is not None:
                tile_lists[key] = tiles
        played = play(tiles, w, rates, far, near, hold=hold)
        if slowest is None or played.time_us > slowest.time_us:
            slowest = KernelPlay(w, tiles, played)
    return slowest
