"""The tile schedules of the fused MoE kernel: the one swappable unit (pure Python).

A schedule is a tile list, an int32 array with one row (kind, local expert, row block,
n block) per tile. The kernel's persistent programs take list entries in order through
one atomic counter, so the list *is* the schedule: swapping expert waves for interleaving
changes nothing else in the kernel (DeepGEMM's habit of making the scheduler its own
piece with one knob).

A Linear-1 tile (kind L1) computes gate and up for block_n intermediate channels of one
row block and writes SwiGLU of them; a Linear-2 tile (kind L2) computes block_n output
channels of one row block and pushes them to the tokens' home ranks. An L2 tile needs all
L1 tiles of its row block. Every list keeps them earlier (checked by
`check_dependencies`), so a program that waits for an L2 tile's inputs waits only on
tiles already taken by running programs: the kernel cannot deadlock, whatever the number
of resident programs.

expert_wave  DeepGEMM's order: the smallest group of consecutive experts whose L1 tiles
             give every program one, all their L1 tiles, then all their L2 tiles, then
             the next group. A wave's L2 tiles, and so their remote stores, bunch together.
interleaved  the paper's order: an L1 cursor and an L2 cursor. The next tile is L2 when
             its row block is ready and the L1 cursor leads it by at least `lead_rows`
             rows (or has finished), else L1. "Ready" is decided when the list is built,
             by playing the list as the kernel will: num_programs programs each take the
             next entry when they finish their last, and a tile lasts its FLOPs
             (`tile_costs`: an L1 tile computes gate and up over H, an L2 tile one product
             over I, so an L1 tile lasts 2H/I L2 tiles). A block is ready when its last L1
             tile has ended by the time its first L2 tile would be taken, so no program
             waits on a block that the list itself made late. (Counting list entries
             instead, "one round of programs earlier", assumed tiles of equal length: with
             L1 tiles 4x longer than L2 tiles, as for DeepSeek-V4-Flash, Linear-2 tiles
             waited, measured with compute emulated and every store local.)
deepgemm_interleaved
             DeepGEMM's own interleaving (the scheduler of its SM100 MegaMoE), counted
             rather than timed: W waves of L1 tiles first (a wave is P = num_programs
             tiles), then one L2 tile and one L1 tile in turn, then the L2 tiles left.
             W is upstream's count, max(A, B) and at most all of L1, taken in our tiles
             (n1, n2: the L1 and L2 tiles of a row block; upstream's L2 task is 256
             channels wide): A = ceil(ceil(P / n2) n1 / P) waves hold every L1 tile of the row
             blocks that the first P L2 tiles touch, and B = ceil((n1 + (blocks - 1)
             max(n1 - n2, 0)) / P) + 1 waves keep L1 ahead of L2 down to the last block
             when a block has more L1 than L2 tiles (the + 1 covers a partial wave). An
             L2 tile comes when its block's L1 tiles are all listed, else an L1 tile;
             after B waves it always is. No knob: upstream has none.

The same orders decided on the GPU (the kernel's device mode): no list is read. A program
claims a list position with one fetch-add, as in list mode, and learns which tile sits there
from a per-block `device_layout`, reading no clock. expert_wave's position lies in the wave
of block position // (L1 + L2 tiles a block), and its place there follows from the wave's
first and end block (`wave_tile_at`); deepgemm_interleaved's and interleaved's tile
follows from where each block's first L2 tile sits (`counted_tile_at`). interleaved is
decided counted: a block's L2 tiles sit right before the first L1 block that starts
lead_rows after it ends, the order interleaved's list would have were every block released
when its L2 tiles come; a program that takes an L2 tile not yet released waits for it, as
in list mode. `claim_order` is the order each rule realizes.

Every schedule is registered once, in SCHEDULES, with its own knobs (keys of the config's
megamoe section, with their defaults): the config schema's schedule names, the simulator,
the figures and the tables take the names from here. A speedup is always the time under
WAVE over the time under another schedule; COMPARED is the pair the headlines compare,
(WAVE, INTERLEAVED).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

L1, L2 = 0, 1
COLUMNS = ("kind", "expert", "block", "n_block")


DEVICE_SUFFIX = "@device"  # an arm key whose programs decide their tiles (layer/rank.arm_key)


class ScheduleError(ValueError):
    """A tile list that the kernel must not run (a dependency out of order, a bad tile)."""


@dataclass(frozen=True)
class TileGrid:
    """The work of one rank: its row blocks and the tiles per block of each GEMM."""

    block_expert: np.ndarray  # (blocks,) local expert of each row block
    block_rows: np.ndarray  # (blocks,) valid rows of each row block
    l1_per_block: int  # intermediate width I / block_n
    l2_per_block: int  # hidden width H / block_n

    @property
    def blocks(self) -> int:
        return len(self.block_rows)

    @property
    def tiles(self) -> int:
        return self.blocks * (self.l1_per_block + self.l2_per_block)

    def row_end(self) -> np.ndarray:
        """Valid rows in all blocks up to and including each block."""
        return np.cumsum(self.block_rows)


def _l1_tiles(grid: TileGrid, block: int) -> list[tuple[int, int, int, int]]:
    e = int(grid.block_expert[block])
    return [(L1, e, block, n) for n in range(grid.l1_per_block)]


def _l2_tiles(grid: TileGrid, block: int) -> list[tuple[int, int, int, int]]:
    e = int(grid.block_expert[block])
    return [(L2, e, block, n) for n in range(grid.l2_per_block)]


def _waves(grid: TileGrid, num_programs: int) -> Iterator[list[int]]:
    """expert_wave's groups of row blocks: the fewest consecutive experts whose L1 tiles
    give every program one (the last group: whatever is left)."""
    wave: list[int] = []
    for b in range(grid.blocks):
        wave.append(b)
        last = b + 1 == grid.blocks
        closes_expert = last or grid.block_expert[b + 1] != grid.block_expert[b]
        if closes_expert and (last or len(wave) * grid.l1_per_block >= num_programs):
            yield wave
            wave = []


def expert_wave(grid: TileGrid, num_programs: int) -> np.ndarray:
    """Expert waves (see module doc); no knob."""
    tiles: list[tuple[int, int, int, int]] = []
    for wave in _waves(grid, num_programs):
        for w in wave:
            tiles += _l1_tiles(grid, w)
        for w in wave:
            tiles += _l2_tiles(grid, w)
    return _as_array(tiles)


def tile_costs(grid: TileGrid) -> tuple[float, float]:
    """Relative durations of an L1 and an L2 tile: their FLOPs (4 BM BN H for gate and up,
    2 BM BN I for the down product) in units of 2 BM BN block_n."""
    return 2.0 * grid.l2_per_block, float(grid.l1_per_block)


def emulated_tile_ns(
    H: int,
    I: int,  # noqa: E741
    tflops: float,
    num_programs: int,
    block_m: int = 128,
    block_n: int = 128,
) -> tuple[int, int]:
    """(Linear-1, Linear-2) tile times in ns at an emulated per-GPU rate of `tflops`: a
    tile's FLOPs (4 BM BN H for gate and up, 2 BM BN I for the down product) at one
    program's share of it (the compute-emulated kernel waits this long per tile)."""
    per_program = tflops * 1e12 / num_programs  # FLOP/s
    l1, l2 = 4 * block_m * block_n * H, 2 * block_m * block_n * I
    return round(l1 / per_program * 1e9), round(l2 / per_program * 1e9)


class ListClock:
    """The kernel's programs playing a tile list: each takes the next entry as soon as it
    is free (the atomic counter), so entry i starts when the earliest program frees up."""

    def __init__(self, num_programs: int):
        self.free = [0.0] * num_programs  # a heap of the times the programs free up

    def now(self) -> float:
        """When the next entry will be taken."""
        return self.free[0]

    def take(self, cost: float) -> float:
        """Give the next entry to the earliest free program; when that entry ends."""
        end = heapq.heappop(self.free) + cost
        heapq.heappush(self.free, end)
        return end


def interleaved(grid: TileGrid, num_programs: int, lead_rows: int) -> np.ndarray:
    """An L1 cursor and an L2 cursor with a minimum row lead; an L2 block is taken only
    once the list's own clock says its L1 tiles have ended (see module doc)."""
    row_end = grid.row_end()
    row_start = row_end - grid.block_rows
    l1_cost, l2_cost = tile_costs(grid)
    clock = ListClock(num_programs)
    l1_end = np.full(grid.blocks, np.inf)  # when each block's last L1 tile ends
    tiles: list[tuple[int, int, int, int]] = []
    l1_block = l2_block = 0
    while l1_block < grid.blocks or l2_block < grid.blocks:
        take_l2 = l2_block < grid.blocks and (
            l1_block == grid.blocks
            or (
                l1_end[l2_block] <= clock.now()
                and row_start[l1_block] - row_end[l2_block] >= lead_rows
            )
        )
        if take_l2:
            tiles += _l2_tiles(grid, l2_block)
            for _ in range(grid.l2_per_block):
                clock.take(l2_cost)
            l2_block += 1
        else:
            tiles += _l1_tiles(grid, l1_block)
            l1_end[l1_block] = max(clock.take(l1_cost) for _ in range(grid.l1_per_block))
            l1_block += 1
    return _as_array(tiles)


def deepgemm_warmup_waves(grid: TileGrid, num_programs: int) -> int:
    """DeepGEMM's count of Linear-1 warm-up waves, max(A, B), at most every L1 tile's
    waves (see module doc)."""
    n1, n2, p = grid.l1_per_block, grid.l2_per_block, num_programs
    first_l2_wave = _ceil_div(_ceil_div(p, n2) * n1, p)  # A
    l1_behind = (grid.blocks - 1) * max(n1 - n2, 0)  # L1 tiles the 1:1 turns leave behind
    keep_ahead = _ceil_div(n1 + l1_behind, p) + 1  # B
    return min(max(first_l2_wave, keep_ahead), _ceil_div(grid.blocks * n1, p))


def deepgemm_interleaved(grid: TileGrid, num_programs: int) -> np.ndarray:
    """DeepGEMM's warm-up of L1 waves, then L2 and L1 tiles in turn (see module doc); an
    L2 tile only once all L1 tiles of its block are listed, else an L1 tile."""
    l1 = [t for b in range(grid.blocks) for t in _l1_tiles(grid, b)]
    l2 = [t for b in range(grid.blocks) for t in _l2_tiles(grid, b)]
    listed = min(deepgemm_warmup_waves(grid, num_programs) * num_programs, len(l1))
    tiles, taken = l1[:listed], 0  # L1 tiles listed, L2 tiles listed
    while taken < len(l2):
        block = l2[taken][2]
        if listed < len(l1) and listed < (block + 1) * grid.l1_per_block:
            tiles.append(l1[listed])  # L1 is listed in block order: the block is not ready
            listed += 1
        else:
            tiles.append(l2[taken])
            taken += 1
        if listed < len(l1):
            tiles.append(l1[listed])
            listed += 1
    return _as_array(tiles)


def play(tiles: np.ndarray, grid: TileGrid, num_programs: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, wait) of every list entry when num_programs programs run the list with
    `tile_costs` durations and nothing else (no memory, no stores): an L2 tile starts when
    it is taken or, if later, when its block's last L1 tile ends; its wait is the gap."""
    l1_cost, l2_cost = tile_costs(grid)
    clock = ListClock(num_programs)
    l1_end = np.zeros(grid.blocks)
    start, wait = np.zeros(len(tiles)), np.zeros(len(tiles))
    for i, (kind, _, block, _) in enumerate(tiles.tolist()):
        taken = clock.now()
        if kind == L1:
            start[i] = taken
            l1_end[block] = max(l1_end[block], clock.take(l1_cost))
        else:
            start[i] = max(taken, l1_end[block])
            wait[i] = start[i] - taken
            clock.take(wait[i] + l2_cost)
    return start, wait


@dataclass(frozen=True)
class Schedule:
    """A registered schedule: its name (in configs and raw records), how figures and tables
    call it, the function that builds its tile list, and that function's knobs (keyword
    arguments, each a key of the config's megamoe section, an int >= 0) with defaults."""

    name: str
    label: str
    make: Callable[..., np.ndarray]  # (grid, num_programs, **knobs) -> tile list
    device_rule: int  # the kernel's claim rule for it (device mode): one of RULE_*
    knobs: Mapping[str, int] = field(default_factory=dict)


# The kernel's ids of the claim rules (xstage_kernels.megamoe.CLAIM_RULES holds the same).
RULE_WAVE, RULE_INTERLEAVED, RULE_DEEPGEMM = 0, 1, 2
WAVE, INTERLEAVED = "expert_wave", "interleaved"  # the baseline and the paper's order
DEEPGEMM_INTERLEAVED = "deepgemm_interleaved"  # DeepGEMM's own interleaving (SM100)
SCHEDULES = {
    s.name: s
    for s in (
        Schedule(WAVE, "expert waves", expert_wave, RULE_WAVE),
        Schedule(INTERLEAVED, "interleaved", interleaved, RULE_INTERLEAVED, {"lead_rows": 0}),
        Schedule(DEEPGEMM_INTERLEAVED, "DeepGEMM interleaved", deepgemm_interleaved, RULE_DEEPGEMM),
    )
}
COMPARED = (WAVE, INTERLEAVED)  # the headline pair: time under WAVE / time under INTERLEAVED


def knobs(name: str, config: Mapping[str, object] | None = None) -> dict[str, int]:
    """Schedule `name`'s knobs as set in `config` (the megamoe section), else defaults."""
    config = config or {}
    chosen = {}
    for k, default in SCHEDULES[name].knobs.items():
        value = config.get(k, default)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(
                f"{k} must be an integer to build a tile list, got {value!r} ('auto' is "
                "resolved per point from the Burst-Gap model: megamoe/ours/lead.py)"
            )
        chosen[k] = int(value)
    return chosen


def build(
    name: str, grid: TileGrid, num_programs: int, config: Mapping[str, object] | None = None
) -> np.ndarray:
    """The tile list of schedule `name` with its knobs from `config` (the megamoe section;
    other keys are ignored), checked before any kernel sees it."""
    chosen = _checked_knobs(name, num_programs, config)
    tiles = SCHEDULES[name].make(grid, num_programs, **chosen)
    check_dependencies(tiles, grid)
    return tiles


def _checked_knobs(
    name: str, num_programs: int, config: Mapping[str, object] | None
) -> dict[str, int]:
    """Schedule `name`'s knobs from `config`, with the name and every value checked."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
    if num_programs < 1:
        raise ValueError(f"num_programs must be >= 1, got {num_programs}")
    chosen = knobs(name, config)
    for knob, value in chosen.items():
        if value < 0:
            raise ValueError(f"{knob} must be >= 0, got {value}")
    return chosen


def check_dependencies(tiles: np.ndarray, grid: TileGrid) -> None:
    """Every tile of the grid exactly once, and every L2 tile after all L1 tiles of its
    row block; a ScheduleError names the first offending list position otherwise."""
    if tiles.ndim != 2 or tiles.shape[1] != len(COLUMNS):
        raise ScheduleError(f"a tile list is (n, {len(COLUMNS)}) {COLUMNS}, got {tiles.shape}")
    if _holds_every_dependency(tiles, grid):
        return
    # Something is wrong: the walk below names the first offending position.
    l1_seen = np.zeros(grid.blocks, dtype=np.int64)
    seen: set[tuple[int, int, int]] = set()
    for i, (kind, expert, block, n) in enumerate(tiles.tolist()):
        if not 0 <= block < grid.blocks or expert != grid.block_expert[block]:
            raise ScheduleError(f"tile {i}: block {block} / expert {expert} not in the grid")
        width = grid.l1_per_block if kind == L1 else grid.l2_per_block
        if kind not in (L1, L2) or not 0 <= n < width:
            raise ScheduleError(f"tile {i}: kind {kind} n_block {n} not in the grid")
        if (kind, block, n) in seen:
            raise ScheduleError(f"tile {i}: ({kind}, block {block}, n {n}) listed twice")
        seen.add((kind, block, n))
        if kind == L1:
            l1_seen[block] += 1
        elif l1_seen[block] < grid.l1_per_block:
            raise ScheduleError(
                f"tile {i}: Linear-2 tile of block {block} comes before its Linear-1 tiles "
                f"({l1_seen[block]}/{grid.l1_per_block} listed earlier)"
            )
    if len(seen) != grid.tiles:
        raise ScheduleError(f"the list has {len(seen)} distinct tiles, the grid {grid.tiles}")
    raise ScheduleError("the list breaks a dependency the walk did not name")  # never


def _holds_every_dependency(tiles: np.ndarray, grid: TileGrid) -> bool:
    """check_dependencies' conditions on whole arrays (a playback builds thousands of lists:
    the walk took a fifth of a render): each tile in the grid, once, every L2 tile of a
    block after its last L1 tile, and as many tiles as the grid."""
    if len(tiles) != grid.tiles:
        return False
    kind, expert, block, n = (tiles[:, i].astype(np.int64) for i in range(len(COLUMNS)))
    if not (np.isin(kind, (L1, L2)).all() and (block >= 0).all() and (block < grid.blocks).all()):
        return False
    width = np.where(kind == L1, grid.l1_per_block, grid.l2_per_block)
    if not ((n >= 0) & (n < width)).all() or not (expert == grid.block_expert[block]).all():
        return False
    widest = max(grid.l1_per_block, grid.l2_per_block)
    if len(np.unique((kind * grid.blocks + block) * widest + n)) != len(tiles):
        return False
    position = np.arange(len(tiles))
    last_l1 = np.full(grid.blocks, -1)
    np.maximum.at(last_l1, block[kind == L1], position[kind == L1])
    return bool((position[kind == L2] > last_l1[block[kind == L2]]).all())


# ---- the device-side rules (the kernel's device mode) -----------------------------------

# A layout (device_layout) is int32: these header fields, then each row over the blocks.
LAYOUT_HEADER = ("rule", "lead_rows", "blocks")
LAYOUT_ROWS = ("expert", "row_start", "row_end", "wave_end", "l2_start", "wave_start")
_INT32_MAX = 2**31 - 1


def device_layout(
    name: str, grid: TileGrid, num_programs: int, config: Mapping[str, object] | None = None
) -> np.ndarray:
    """What schedule `name`'s device rule reads, in O(blocks): its rule id, its lead
    (interleaved's, which its l2_start follows from), the block count, and per block its
    expert, first and last row (prefix sums of valid rows, which the GPU dispatch reads),
    the block count at which its expert wave ends, the list position of its first L2 tile
    (deepgemm_interleaved's, or interleaved's counted) and its expert wave's first block.
    Knobs from `config` as `build` takes them."""
    rule, lead_rows = layout_header(name, num_programs, config)
    wave_start = np.zeros(grid.blocks, dtype=np.int64)
    wave_end = np.zeros(grid.blocks, dtype=np.int64)
    for wave in _waves(grid, num_programs):
        wave_start[wave], wave_end[wave] = wave[0], wave[-1] + 1
    row_end = grid.row_end()
    header = [rule, lead_rows, grid.blocks]
    if rule == RULE_INTERLEAVED:
        l2_start = _counted_l2_starts(grid, lead_rows)
    else:
        l2_start = _deepgemm_l2_starts(grid, num_programs)
    rows = [
        grid.block_expert,
        row_end - grid.block_rows,
        row_end,
        wave_end,
        l2_start,
        wave_start,
    ]
    layout = np.concatenate([np.asarray(header, dtype=np.int64), *rows]).astype(np.int64)
    if layout.size and layout.max() > _INT32_MAX:
        raise ValueError(f"a device layout is int32; {name} on this grid needs {layout.max()}")
    return layout.astype(np.int32)


def layout_header(
    name: str, num_programs: int, config: Mapping[str, object] | None = None
) -> tuple[int, int]:
    """A device layout's first two header fields, its rule id and lead: what a layout built
    on the device (xstage_kernels.layout) is told; the block count it finds itself."""
    chosen = _checked_knobs(name, num_programs, config)
    return SCHEDULES[name].device_rule, chosen.get("lead_rows", 0)


def _deepgemm_l2_starts(grid: TileGrid, num_programs: int) -> np.ndarray:
    """Where deepgemm_interleaved lists each block's first L2 tile. Its L1 tiles listed by
    then: the warm-up, then two a turn while the block is not ready, then one after each L2
    tile, all of them at most."""
    n1, n2, l1_total = grid.l1_per_block, grid.l2_per_block, grid.blocks * grid.l1_per_block
    listed = min(deepgemm_warmup_waves(grid, num_programs) * num_programs, l1_total)
    starts = np.zeros(grid.blocks, dtype=np.int64)
    for b in range(grid.blocks):
        behind = (b + 1) * n1 - listed  # L1 tiles the block still needs
        if behind > 0:
            listed = min(listed + 2 * _ceil_div(behind, 2), l1_total)
        starts[b] = b * n2 + listed
        listed = min(listed + n2, l1_total)
    return starts


def _counted_l2_starts(grid: TileGrid, lead_rows: int) -> np.ndarray:
    """Where interleaved counted lists each block's first L2 tile: right before the L1 tiles
    of the first block that starts lead_rows or more after the block ends (after every L1
    tile where none does), every earlier block's L2 tiles before it."""
    row_end = grid.row_end()
    after = np.searchsorted(row_end - grid.block_rows, row_end + lead_rows, side="left")
    blocks = np.arange(grid.blocks, dtype=np.int64)
    return blocks * grid.l2_per_block + after.astype(np.int64) * grid.l1_per_block


def layout_fields(layout: np.ndarray) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """A device layout's header fields and its per-block rows, by name."""
    header = dict(zip(LAYOUT_HEADER, (int(v) for v in layout[: len(LAYOUT_HEADER)]), strict=True))
    rows = layout[len(LAYOUT_HEADER) :].reshape(len(LAYOUT_ROWS), header["blocks"])
    return header, dict(zip(LAYOUT_ROWS, rows, strict=True))


def wave_tile_at(
    layout: np.ndarray, position: int, tiles_per_block: tuple[int, int]
) -> tuple[int, int, int]:
    """(kind, block, n block) at `position` of expert_wave's list, from the layout alone
    (xstage_kernels.megamoe._wave_tile): a wave lists whole blocks, n1 + n2 tiles each, so
    block position // (n1 + n2) lies in the position's wave; in it, the wave's L1 tiles
    block by block, then its L2 tiles."""
    _, rows = layout_fields(layout)
    n1, n2 = tiles_per_block
    block = position // (n1 + n2)
    start, end = int(rows["wave_start"][block]), int(rows["wave_end"][block])
    into = position - start * (n1 + n2)
    if into < (end - start) * n1:
        return L1, start + into // n1, into % n1
    into -= (end - start) * n1
    return L2, start + into // n2, into % n2


def counted_tile_at(
    layout: np.ndarray, position: int, tiles_per_block: tuple[int, int]
) -> tuple[int, int, int]:
    """(kind, block, n block) at `position` of deepgemm_interleaved's list, or interleaved
    counted's (the layout's rule says which), from the layout alone
    (xstage_kernels.megamoe._counted_tile): the last block whose first L2 tile is at or
    before it, then its L2 tiles' places from there (`_l2_listed`); L1 tiles fill the rest
    in block order."""
    header, rows = layout_fields(layout)
    alternate = header["rule"] == RULE_DEEPGEMM
    (n1, n2), starts = tiles_per_block, rows["l2_start"]
    block = int(np.searchsorted(starts, position, side="right")) - 1
    if block < 0:
        return L1, position // n1, position % n1
    into = position - int(starts[block])
    l1_left = header["blocks"] * n1 - (int(starts[block]) - block * n2)
    l2_before = _l2_listed(into, l1_left, n2, alternate)
    if _l2_listed(into + 1, l1_left, n2, alternate) > l2_before:
        return L2, block, l2_before
    l1_before = position - (block * n2 + l2_before)
    return L1, l1_before // n1, l1_before % n1


def _l2_listed(into: int, l1_left: int, n2: int, alternate: bool) -> int:
    """A block's L2 tiles among the `into` positions from its first one, n2 at most:
    alternate (deepgemm_interleaved), every other position while L1 tiles are left (l1_left
    of them), then every position; else (interleaved counted) every position."""
    return min(n2, max((into + 1) // 2, into - l1_left) if alternate else into)


def claim_order(name: str, grid: TileGrid, num_programs: int, lead_rows: int = 0) -> np.ndarray:
    """The tile list the kernel realizes in device mode: each position's tile from the
    layout alone, expert_wave's by `wave_tile_at`, deepgemm_interleaved's and interleaved's
    (counted) by `counted_tile_at`. No rule reads time, so the order is `build`'s list for
    expert_wave and deepgemm_interleaved, and for interleaved the list with every block
    released when its L2 tiles come."""
    layout = device_layout(name, grid, num_programs, {"lead_rows": lead_rows})
    tiles_per_block = grid.l1_per_block, grid.l2_per_block
    tile_at = wave_tile_at if SCHEDULES[name].device_rule == RULE_WAVE else counted_tile_at
    at = (tile_at(layout, p, tiles_per_block) for p in range(grid.tiles))
    return _as_array([(k, int(grid.block_expert[b]), b, n) for k, b, n in at])


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _as_array(tiles: list[tuple[int, int, int, int]]) -> np.ndarray:
    return np.asarray(tiles, dtype=np.int32).reshape(-1, len(COLUMNS))
