"""The device-side schedule (issue 53): each claimed list position's tile decided on the GPU.

A claim is the list's fetch-add; interleaved is decided once per unit (all L1 or all L2
tiles of a row block) by the program that claims its first position, and published in a
unit table; expert_wave's and deepgemm_interleaved's positions follow from the layout, and
so do interleaved counted's (COUNTED: each block's L2 tiles before the first block lead_rows
on). The Python reference (schedule.next_unit played by schedule.claim_order,
schedule.wave_tile_at and schedule.counted_tile_at) realizes every schedule's host list
exactly, and interleaved counted the host list with every block released in time (numpy
only). The tl
kernel's resolution under the interpreter: on a prepared unit table (walks past a window,
opens a unit by the rule, times out on an unpublished one), and in a whole device-mode
launch, which computes what list mode and the reference compute and writes the order it
realized. The Gluon kernel's device mode compiles for sm_90 with the list's one fetch-add
as its claim (no GPU). Which orders the GPU realizes, and how fast, a GPU run must show.
"""

from __future__ import annotations

import importlib.util

import fixtures
import numpy as np
import pytest
import sm90

from xstage_bench.megamoe import reference, routing, schedule

interpreted_kernel = fixtures.interpreted_kernel  # the fixture, taken by name

HAVE_TORCH_TRITON = all(importlib.util.find_spec(m) for m in ("torch", "triton"))
needs_triton = pytest.mark.skipif(not HAVE_TORCH_TRITON, reason="torch and triton not installed")
EXACT = (schedule.WAVE, schedule.DEEPGEMM_INTERLEAVED)  # rules that read no time


def _routed_grids(seed: int, l1: int | None = None) -> list[schedule.TileGrid]:
    """Every rank's grid of a random routing (balanced or skewed) through dispatch_plan,
    with random L1 and L2 tiles a block (l1: this many L1 tiles a block instead)."""
    point, ids = fixtures.random_routing(seed, "random", 8)
    rng = np.random.default_rng([seed, 1])
    n1, n2 = l1 or int(rng.integers(1, 24)), int(rng.integers(1, 24))
    plans = routing.dispatch_plan(ids, point["E"], 128)
    return [schedule.TileGrid(p.block_expert, p.block_rows, n1, n2) for p in plans]


def _lead_holds(tiles: np.ndarray, grid: schedule.TileGrid, lead_rows: int) -> None:
    """Every L2 tile claimed while L1 tiles were left came after every L1 tile of its block,
    with the L1 cursor's block starting lead_rows or more after its block's last row."""
    row_end = grid.row_end()
    row_start = row_end - grid.block_rows
    l1_total = grid.blocks * grid.l1_per_block
    c1 = 0
    for kind, _, block, _ in tiles.tolist():
        if kind == schedule.L1:
            c1 += 1
        elif c1 < l1_total:
            assert c1 >= (block + 1) * grid.l1_per_block
            assert row_start[c1 // grid.l1_per_block] - row_end[block] >= lead_rows


def test_the_layout_holds_the_rules_inputs_per_block():
    g = _routed_grids(0, l1=3)[0]
    layout = schedule.device_layout(schedule.INTERLEAVED, g, 7, {"lead_rows": 256})
    assert layout.dtype == np.int32
    assert layout.size == len(schedule.LAYOUT_HEADER) + len(schedule.LAYOUT_ROWS) * g.blocks
    header, rows = schedule.layout_fields(layout)
    assert header["rule"] == schedule.RULE_INTERLEAVED and header["lead_rows"] == 256
    assert header["blocks"] == g.blocks
    np.testing.assert_array_equal(rows["expert"], g.block_expert)
    np.testing.assert_array_equal(rows["row_end"] - rows["row_start"], g.block_rows)
    # A block's wave_end: the L1 units before its L2 unit in expert_wave's list.
    wave = schedule.expert_wave(g, 7)
    first_l2 = np.flatnonzero((wave[:, 0] == schedule.L2) & (wave[:, 3] == 0))
    l1_units = np.cumsum(wave[:, 0] == schedule.L1)[first_l2] // g.l1_per_block
    np.testing.assert_array_equal(rows["wave_end"][wave[first_l2, 2]], l1_units)
    # A block's l2_start: where interleaved counted lists its first L2 tile, and in
    # deepgemm_interleaved's layout where that list does.
    counted = schedule.claim_order(schedule.INTERLEAVED, g, 7, lead_rows=256, counted=True)
    first_l2 = np.flatnonzero((counted[:, 0] == schedule.L2) & (counted[:, 3] == 0))
    np.testing.assert_array_equal(rows["l2_start"][counted[first_l2, 2]], first_l2)
    deepgemm = schedule.deepgemm_interleaved(g, 7)
    first_l2 = np.flatnonzero((deepgemm[:, 0] == schedule.L2) & (deepgemm[:, 3] == 0))
    _, deepgemm_rows = schedule.layout_fields(
        schedule.device_layout(schedule.DEEPGEMM_INTERLEAVED, g, 7)
    )
    np.testing.assert_array_equal(deepgemm_rows["l2_start"][deepgemm[first_l2, 2]], first_l2)
    with pytest.raises(ValueError, match="lead_rows must be >= 0"):
        schedule.device_layout(schedule.INTERLEAVED, g, 7, {"lead_rows": -1})
    # A block's wave_start: the first block of the wave that lists its L2 tiles.
    first_in_wave = np.searchsorted(rows["wave_end"], rows["wave_end"], side="left")
    np.testing.assert_array_equal(rows["wave_start"], first_in_wave)
    for name in schedule.WAVE, schedule.DEEPGEMM_INTERLEAVED:
        counted = schedule.device_layout(name, g, 7)
        with pytest.raises(ValueError, match="reads no clock"):
            schedule.next_unit(counted, (0, 0), lambda b: True)


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("seed", range(12))
def test_the_device_rules_realize_expert_waves_and_deepgemms_lists_exactly(name, seed):
    rng = np.random.default_rng(100 + seed)
    for g in _routed_grids(seed):
        for programs in (1, int(rng.integers(2, 40)), int(rng.integers(40, 300))):
            got = schedule.claim_order(name, g, programs)
            np.testing.assert_array_equal(got, schedule.build(name, g, programs))


@pytest.mark.parametrize("seed", range(12))
def test_interleaved_units_are_the_host_list_and_keep_its_lead(seed):
    """The host list decides per row block when a block's first tile is taken, on the
    clock of num_programs programs taking entries in turn; a unit is a whole block and is
    opened when its first position is claimed, on the same clock: the same list."""
    rng = np.random.default_rng(200 + seed)
    for g in _routed_grids(seed):
        programs, lead = int(rng.integers(1, 200)), int(rng.choice([0, 128, 512, 2048]))
        tiles = schedule.claim_order(schedule.INTERLEAVED, g, programs, lead_rows=lead)
        np.testing.assert_array_equal(tiles, schedule.interleaved(g, programs, lead))
        schedule.check_dependencies(tiles, g)
        _lead_holds(tiles, g, lead)


def _every_block_released_in_time(g: schedule.TileGrid, programs: int, lead: int) -> np.ndarray:
    """interleaved's host list played as if every block were released when its L2 tiles
    come: the lead alone decides."""
    row_end = g.row_end()
    row_start = row_end - g.block_rows

    def due(l1_block: int, l2_block: int, released: bool) -> bool:
        return row_start[l1_block] - row_end[l2_block] >= lead

    return schedule._play_units(g, programs, due, schedule.tile_costs(g))


@pytest.mark.parametrize("seed", range(12))
def test_interleaved_counted_is_the_host_list_with_every_block_released_in_time(seed):
    """Counted, the positions read no clock: each block's L2 tiles come right before the
    first L1 block that starts lead_rows after it ends, the lead rule's order where every
    block is released when its L2 tiles come; positions far apart resolve on their own."""
    rng = np.random.default_rng(300 + seed)
    for g in _routed_grids(seed):
        programs, lead = int(rng.integers(1, 200)), int(rng.choice([0, 128, 512, 2048]))
        tiles = schedule.claim_order(
            schedule.INTERLEAVED, g, programs, lead_rows=lead, counted=True
        )
        np.testing.assert_array_equal(tiles, _every_block_released_in_time(g, programs, lead))
        schedule.check_dependencies(tiles, g)
        _lead_holds(tiles, g, lead)


def test_counted_lists_a_blocks_l2_tiles_before_the_first_block_a_lead_on():
    """Blocks of 100 rows (so row_start 0, 100, 200, ...), 2 L1 and 1 L2 tile each: at a
    lead of 150, block 0 (rows 0-99) is due before block 3 (the first starting 150 rows
    after row 100); after the last L1 block, the L2 tiles left follow in turn."""
    g = schedule.TileGrid(np.zeros(5, dtype=np.int64), np.full(5, 100), 2, 1)
    claims = schedule.claim_order(schedule.INTERLEAVED, g, 4, lead_rows=150, counted=True)
    assert _kinds_and_blocks(claims) == (
        ["L1.0"] * 2 + ["L1.1"] * 2 + ["L1.2"] * 2 + ["L2.0"] + ["L1.3"] * 2 + ["L2.1"]
    ) + ["L1.4"] * 2 + ["L2.2", "L2.3", "L2.4"]


def _kinds_and_blocks(tiles: np.ndarray) -> list[str]:
    return [f"L{kind + 1}.{block}" for kind, _, block, _ in tiles.tolist()]


def test_a_released_blocks_l2_unit_waits_for_the_next_unit_boundary():
    """Equal blocks of 4 L1 and 2 L2 tiles, 3 programs (an L1 tile lasts 4, an L2 tile 4):
    block 0's last L1 tile ends at 8, half way through block 1's L1 unit, whose tiles are
    already positioned; its L2 unit opens after them, as in the host list."""
    g = schedule.TileGrid(np.zeros(8, dtype=np.int64), np.full(8, 128), 4, 2)
    claims = _kinds_and_blocks(schedule.claim_order(schedule.INTERLEAVED, g, 3))
    assert claims[:10] == ["L1.0"] * 4 + ["L1.1"] * 4 + ["L2.0"] * 2


# ---- the tl kernel under the interpreter -------------------------------------------------


def test_every_schedule_has_the_kernels_device_rule(interpreted_kernel):
    """The kernel cannot import schedule.py (the kernels import nothing of the harness):
    its rule ids and layout sizes are checked against the registry here."""
    rules = sorted(s.device_rule for s in schedule.SCHEDULES.values())
    assert rules == list(range(len(schedule.SCHEDULES)))
    for name, s in schedule.SCHEDULES.items():
        assert interpreted_kernel.CLAIM_RULES[s.device_rule] == name
    assert interpreted_kernel.LAYOUT_HEADER == len(schedule.LAYOUT_HEADER)
    assert interpreted_kernel.LAYOUT_ROWS == len(schedule.LAYOUT_ROWS)


def test_a_device_launch_refuses_buffers_that_disagree_with_its_layout(interpreted_kernel):
    """The unit table (2 * blocks entries) sits after the row-block counters, in one buffer
    that one zeroing readies; the launch checks the buffers against the layout's blocks."""
    import torch

    kernel = interpreted_kernel
    for blocks in range(6):
        assert kernel.unit_table_at(blocks) == kernel.SYNC_HEADER + blocks
        assert kernel.sync_size(blocks) == kernel.SYNC_HEADER + 3 * blocks
    g = schedule.TileGrid(np.array([0, 0, 1]), np.array([128, 5, 9]), 2, 3)
    layout = torch.as_tensor(schedule.device_layout(schedule.WAVE, g, 4))
    tiles = torch.zeros(g.tiles, 4, dtype=torch.int32)
    sync = torch.zeros(kernel.sync_size(g.blocks), dtype=torch.int32)
    kernel.check_device_mode(layout, tiles, sync, H=384, I=256)
    with pytest.raises(ValueError, match="rows for 3 blocks"):
        kernel.check_device_mode(layout, tiles[1:], sync, H=384, I=256)
    with pytest.raises(ValueError, match=f"sync buffer of {kernel.sync_size(g.blocks)} int32"):
        kernel.check_device_mode(layout, tiles, sync[:-1], H=384, I=256)
    with pytest.raises(ValueError, match="blocks int32"):
        kernel.check_device_mode(layout[:-1], tiles, sync, H=384, I=256)


def _unit_entries(kernel, tiles: np.ndarray, grid: schedule.TileGrid) -> list[int]:
    """The unit table that a launch realizing `tiles` (whole-block units) publishes."""
    entries, at, l1_units = [], 0, 0
    while at < len(tiles):
        kind = int(tiles[at, 0])
        l1_units += kind == schedule.L1
        entries.append(kernel.unit_entry(kind, l1_units))
        at += grid.l1_per_block if kind == schedule.L1 else grid.l2_per_block
    return entries


def _resolve(kernel, layout: np.ndarray, sync, grid, positions, max_spin=1000, counted=False):
    """decided_tile under the interpreter: one program finding the tiles at `positions`
    (increasing) on the sync buffer as prepared (counted: interleaved counted, COUNTED);
    (position or n_tiles, kind, expert, block, n block) for each."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def resolve(
        positions,
        count,
        out,
        sync,
        layout,
        n_tiles,
        n1,
        n2,
        max_spin,
        decided_tile: tl.constexpr,
        W: tl.constexpr,
        COUNTED: tl.constexpr,
    ):
        lanes = tl.arange(0, W)
        walk = (0, 0)
        for i in range(count):
            p = tl.load(positions + i)
            kind, e, blk, nb, walk = decided_tile(
                p, sync, layout, n_tiles, n1, n2, n1, walk, lanes, COUNTED
            )
            tl.store(out + 5 * i, p)
            tl.store(out + 5 * i + 1, kind)
            tl.store(out + 5 * i + 2, e)
            tl.store(out + 5 * i + 3, blk)
            tl.store(out + 5 * i + 4, nb)

    out = torch.full((len(positions), 5), -1, dtype=torch.int32)
    n1, n2 = grid.l1_per_block, grid.l2_per_block
    args = (torch.as_tensor(positions, dtype=torch.int32), len(positions), out, sync)
    args += (torch.as_tensor(layout), grid.tiles, n1, n2, max_spin)
    resolve[(1,)](*args, decided_tile=kernel.decided_tile, W=kernel.UNIT_WINDOW, COUNTED=counted)
    return out.numpy()


def _unit_table(kernel, sync, grid):
    return sync[kernel.unit_table_at(grid.blocks) :]


def _many_units() -> schedule.TileGrid:
    """40 row blocks of 1 L1 and 2 L2 tiles over 8 experts: 80 units, past two windows."""
    return schedule.TileGrid(np.repeat(np.arange(8), 5), np.full(40, 128), 1, 2)


def test_a_program_walks_a_published_unit_table_to_its_tiles(interpreted_kernel):
    """Positions far apart (many units, past a window) and close (the same unit)."""
    import torch

    name = schedule.INTERLEAVED
    g = _many_units()
    listed = schedule.build(name, g, 8)
    sync = torch.zeros(interpreted_kernel.sync_size(g.blocks), dtype=torch.int32)
    entries = torch.as_tensor(_unit_entries(interpreted_kernel, listed, g), dtype=torch.int32)
    _unit_table(interpreted_kernel, sync, g)[:] = entries
    rng = np.random.default_rng(7)
    positions = np.sort(rng.choice(g.tiles, 30, replace=False))
    layout = schedule.device_layout(name, g, 8)
    got = _resolve(interpreted_kernel, layout, sync, g, positions)
    np.testing.assert_array_equal(got[:, 0], positions)
    np.testing.assert_array_equal(got[:, 1:], listed[positions])
    assert torch.equal(_unit_table(interpreted_kernel, sync, g), entries)  # nothing opened


def test_the_opener_publishes_the_unit_its_rule_decides(interpreted_kernel):
    """Unit 0 (block 0's L1 tiles) published; the program at unit 1's first position opens
    it: interleaved's L2 unit of block 0 when block 0's counter says released and the lead
    holds, else block 1's L1 unit."""
    import torch

    kernel = interpreted_kernel
    g = schedule.TileGrid(np.array([0, 0, 1, 1]), np.full(4, 128), 2, 3)
    cases = [  # (schedule, lead_rows, block 0's counter, the unit opened)
        (schedule.INTERLEAVED, 0, 0, (schedule.L1, 1)),
        (schedule.INTERLEAVED, 0, 2, (schedule.L2, 0)),
        (schedule.INTERLEAVED, 256, 2, (schedule.L1, 1)),
    ]
    for name, lead, counter, (kind, block) in cases:
        sync = torch.zeros(kernel.sync_size(g.blocks), dtype=torch.int32)
        sync[kernel.SYNC_HEADER] = counter
        _unit_table(kernel, sync, g)[0] = kernel.unit_entry(schedule.L1, 1)
        layout = schedule.device_layout(name, g, 2, {"lead_rows": lead})
        got = _resolve(kernel, layout, sync, g, [g.l1_per_block])
        assert got.tolist() == [[g.l1_per_block, kind, 0, block, 0]], (name, lead, counter)
        l1_units = 1 + (kind == schedule.L1)
        assert int(_unit_table(kernel, sync, g)[1]) == kernel.unit_entry(kind, l1_units)
        assert int(sync[1]) == 0


def _units_by_rule(kernel, layout: np.ndarray, grid: schedule.TileGrid):
    """Every unit's entry and first position as the rule opens them with every block
    released (schedule.next_unit, the kernel's _open_unit mirrored)."""
    entries, starts, opened, at = [], [], [0, 0], 0
    while at < grid.tiles:
        kind = schedule.next_unit(layout, tuple(opened), lambda b: True)
        opened[kind == schedule.L2] += 1
        entries.append(kernel.unit_entry(kind, opened[0]))
        starts.append(at)
        at += grid.l1_per_block if kind == schedule.L1 else grid.l2_per_block
    return entries, starts


def test_a_program_past_unpublished_units_opens_them_itself(interpreted_kernel):
    """Only unit 0 published, and the position lies 45 units on (past a window): positions
    are claimed in order, so every unit before it is due; the program opens each by the
    rule itself, without waiting for their first positions' holders, and none past its
    own. Every block released: the rule opens what next_unit says then."""
    import torch

    kernel = interpreted_kernel
    g = _many_units()
    layout = schedule.device_layout(schedule.INTERLEAVED, g, 8, {"lead_rows": 0})
    entries, starts = _units_by_rule(kernel, layout, g)
    sync = torch.zeros(kernel.sync_size(g.blocks), dtype=torch.int32)
    sync[kernel.SYNC_HEADER : kernel.SYNC_HEADER + g.blocks] = g.l1_per_block  # released
    _unit_table(kernel, sync, g)[0] = entries[0]
    unit = 45
    got = _resolve(kernel, layout, sync, g, [starts[unit]])
    kind, blk, _ = kernel_unit(kernel, entries[unit], unit, g)
    assert got.tolist() == [[starts[unit], kind, int(g.block_expert[blk]), blk, 0]]
    table = _unit_table(kernel, sync, g).tolist()
    assert table[: unit + 1] == entries[: unit + 1] and not any(table[unit + 1 :])
    assert int(sync[1]) == 0


def kernel_unit(kernel, entry: int, unit: int, grid: schedule.TileGrid) -> tuple[int, int, int]:
    """(kind, block, first position) of unit `unit` from its table entry."""
    kind, l1_units = (entry - 1) & 1, (entry - 1) >> 1
    n1, n2 = grid.l1_per_block, grid.l2_per_block
    end = l1_units * n1 + (unit + 1 - l1_units) * n2
    block = l1_units - 1 if kind == schedule.L1 else unit - l1_units
    return kind, block, end - (n1 if kind == schedule.L1 else n2)


def test_a_unit_another_program_published_first_stands(interpreted_kernel):
    """Units 0 and 2 published, the position (7) in unit 3. The program sees unit 1 as the
    first unpublished and opens it (block 0 not released: block 1's L1 tiles), goes on to
    unit 2 without reading the table, and finds it taken in the compare-and-swap: the other
    program's decision (block 0's L2 unit, where this program's rule says block 2's L1
    unit) stands. It then opens unit 3 after it (block 2's L1 unit), its position's."""
    import torch

    kernel = interpreted_kernel
    g = schedule.TileGrid(np.array([0, 0, 1, 1]), np.full(4, 128), 2, 3)
    sync = torch.zeros(kernel.sync_size(g.blocks), dtype=torch.int32)
    units = _unit_table(kernel, sync, g)
    units[0] = kernel.unit_entry(schedule.L1, 1)  # block 0's L1 tiles: positions 0-1
    units[2] = kernel.unit_entry(schedule.L2, 2)  # block 0's L2 tiles: positions 4-6
    layout = schedule.device_layout(schedule.INTERLEAVED, g, 2, {"lead_rows": 0})
    got = _resolve(kernel, layout, sync, g, [7])
    assert got.tolist() == [[7, schedule.L1, 1, 2, 0]]
    assert units.tolist()[:4] == [
        kernel.unit_entry(schedule.L1, 1),
        kernel.unit_entry(schedule.L1, 2),  # opened here: block 1's L1 tiles, positions 2-3
        kernel.unit_entry(schedule.L2, 2),  # as published before
        kernel.unit_entry(schedule.L1, 3),  # opened here: block 2's L1 tiles, positions 7-8
    ]
    assert not units[4:].any() and int(sync[1]) == 0


@pytest.mark.parametrize("name", [*EXACT, "interleaved counted"])
def test_the_count_rules_positions_follow_from_the_layout(interpreted_kernel, name):
    """Every position, and positions far apart (past a window of blocks), with no table:
    expert waves of uneven experts (one or two experts, 1 to 9 blocks a wave), deepgemm's
    single tiles, interleaved counted's blocks of L2 tiles (uneven rows, lead 300)."""
    import torch

    experts = np.repeat(np.arange(10), np.tile([7, 2, 3, 9, 1], 2))
    rows = np.where(np.arange(len(experts)) % 3 == 0, 57, 128)
    g = schedule.TileGrid(experts, rows, 2, 3)
    counted = name == "interleaved counted"
    rule = schedule.INTERLEAVED if counted else name
    layout = schedule.device_layout(rule, g, 8, {"lead_rows": 300} if counted else None)
    if counted:
        listed = schedule.claim_order(rule, g, 8, lead_rows=300, counted=True)
    else:
        listed = schedule.build(name, g, 8)
    rng = np.random.default_rng(3)
    for positions in (np.arange(g.tiles), np.sort(rng.choice(g.tiles, 20, replace=False))):
        sync = torch.zeros(interpreted_kernel.sync_size(g.blocks), dtype=torch.int32)
        got = _resolve(interpreted_kernel, layout, sync, g, positions, counted=counted)
        np.testing.assert_array_equal(got[:, 1:], listed[positions])
        assert not sync.any()


def _launch_in_device_mode(
    monkeypatch, kernel, prob, name: str, knobs: dict, counted: bool = False
) -> dict:
    """Make prob.forward launch every rank's kernel in device mode for schedule `name`
    (counted: interleaved counted): each rank's sync buffer grows to the kernel's
    sync_size and its tile list gives way to a poisoned buffer that the kernel fills;
    returns those buffers by rank (after the run, the orders the kernel realized)."""
    import torch

    launch = kernel.launch
    realized = {}
    for rb in prob.ranks:
        rb.sync = torch.zeros(kernel.sync_size(rb.grid.blocks), dtype=torch.int32)

    def device_launch(*, tiles, sync, layout=None, **kw):  # a list arm's launch: no layout
        (q,) = [q for q, rb in enumerate(prob.ranks) if rb.sync is sync]
        grid = prob.ranks[q].grid
        layout = schedule.device_layout(name, grid, prob.num_programs, knobs)
        realized[q] = torch.full_like(tiles, -1)
        launch(tiles=realized[q], sync=sync, layout=torch.as_tensor(layout), counted=counted, **kw)

    monkeypatch.setattr(kernel, "launch", device_launch)
    return realized


# Not bf16 (the interpreter's bf16 dot is wrong, see test_megamoe_cpu.py); W4A8 differs from
# W8A8 only in its GEMMs, which list mode's tests cover.
def test_device_mode_computes_what_list_mode_and_the_reference_do(interpreted_kernel, monkeypatch):
    """Each schedule once from its host list and once decided in the kernel, outputs
    poisoned before each: the same outputs bit for bit, within the interpreter's tolerance
    of the reference, no error flag, and the realized order on every rank a valid list:
    expert_wave's and deepgemm_interleaved's exactly the host's, interleaved's the unit
    rule's with one program (the interpreter runs program 0 to the end before the next
    starts: it opens every unit, each block released once its L1 unit has run)."""
    import torch
    from fixtures import TINY_MOE

    from xstage_bench.megamoe.layer.inputs import make_expert_weights
    from xstage_bench.megamoe.layer.problem import MoEProblem

    moe = {**TINY_MOE, "schedules": list(schedule.SCHEDULES), "lead_rows": 128}
    point = {
        **fixtures.TINY_POINT,
        "routing": "skewed",
        "tokens_per_rank": 48,
        "world_size": 2,
    }
    devices = [torch.device("cpu")] * 2
    weights = [make_expert_weights(point, "w8a8", q, d) for q, d in enumerate(devices)]
    prob = MoEProblem(point, moe, devices, weights, num_programs=3)
    ref = reference.reference_outputs(prob.homes, prob.experts, [np.arange(48)] * 2, "w8a8")
    for name in schedule.SCHEDULES:
        prob.poison()
        fixtures.interpreted_forward(prob, name)
        listed = [o.clone() for o in prob.outputs()]
        with monkeypatch.context() as patched:
            realized = _launch_in_device_mode(patched, interpreted_kernel, prob, name, moe)
            prob.poison()
            fixtures.interpreted_forward(prob, name)
        assert prob.error_flags() == [0, 0]
        for got, want, r in zip(prob.outputs(), listed, ref, strict=True):
            assert torch.equal(got, want)
            assert reference.relative_error(got, r) < reference.INTERPRETER_TOLERANCE
        for q, rb in enumerate(prob.ranks):
            order = realized[q].numpy()
            schedule.check_dependencies(order, rb.grid)
            if name in EXACT:
                want = schedule.build(name, rb.grid, prob.num_programs, moe)
            else:
                want = schedule.claim_order(name, rb.grid, 1, lead_rows=moe["lead_rows"])
            np.testing.assert_array_equal(order, want)


def test_counted_a_launch_computes_what_the_list_does(interpreted_kernel, monkeypatch):
    """interleaved counted (COUNTED) in a whole launch: the list's outputs bit for bit, no
    error flag, the counted order realized (positions read no clock), and the unit table
    left empty."""
    import torch
    from fixtures import TINY_MOE

    from xstage_bench.megamoe.layer.inputs import make_expert_weights
    from xstage_bench.megamoe.layer.problem import MoEProblem

    moe = {**TINY_MOE, "schedules": [schedule.INTERLEAVED], "lead_rows": 128}
    point = {**fixtures.TINY_POINT, "routing": "skewed", "tokens_per_rank": 48, "world_size": 1}
    devices = [torch.device("cpu")]
    weights = [make_expert_weights(point, "w8a8", 0, devices[0])]
    prob = MoEProblem(point, moe, devices, weights, num_programs=3)
    prob.poison()
    fixtures.interpreted_forward(prob, schedule.INTERLEAVED)
    listed = [o.clone() for o in prob.outputs()]
    with monkeypatch.context() as patched:
        realized = _launch_in_device_mode(
            patched, interpreted_kernel, prob, schedule.INTERLEAVED, moe, counted=True
        )
        prob.poison()
        fixtures.interpreted_forward(prob, schedule.INTERLEAVED)
    assert prob.error_flags() == [0]
    assert all(got.equal(want) for got, want in zip(prob.outputs(), listed, strict=True))
    grid = prob.ranks[0].grid
    want = schedule.claim_order(
        schedule.INTERLEAVED, grid, 3, lead_rows=moe["lead_rows"], counted=True
    )
    np.testing.assert_array_equal(realized[0].numpy(), want)
    assert not _unit_table(interpreted_kernel, prob.ranks[0].sync, grid).any()


# ---- the Gluon kernel, compiled for sm_90 ------------------------------------------------

GLUON_PATTERNS = {
    "cas": r"atom\.global(?:\.\w+)*\.cas\.",
    "claims": r"atom\.global\.gpu\.acq_rel\.add",  # the position counter (CLAIM_RELAXED off)
    "unit_polls": r"ld\.volatile\.global",  # the unit table (a warp's window), a row counter
    "publications": r"atom\.global\.relaxed\.gpu\.cas",  # an opener's unit-table entry
    "wgmma": r"wgmma\.mma_async",
    "tma_loads": r"cp\.async\.bulk\.tensor",
    "release_add": r"atom\.global\.gpu\.release\.add",
    "acquire_polls": r"ld\.global\.gpu\.acquire",
    "global_loads": r"ld\.global",
}


@needs_triton
@pytest.mark.parametrize("precision", ["w8a8", "w4a8"])
@pytest.mark.parametrize("trace", [False, True])
def test_the_gluon_device_mode_claims_with_the_lists_one_fetch_add(precision, trace):
    """Device mode claims a position with list mode's one atomic add; it reads the unit
    table (one volatile load of a warp's window per try) and the opener's row-block counter
    with volatile loads, and publishes a unit with one relaxed compare-and-swap, its only
    one. The operand loads, MMAs, row-block releases and polls stay as they
    were, and so does shared memory (the window's reductions are a warp's shuffles)."""
    call = "kernels.compile_for_sm90(precision={!r}, trace={}, device={})"
    listed, decided = (
        sm90.compiled("megamoe_ws", call.format(precision, trace, device), GLUON_PATTERNS)
        for device in (False, True)
    )
    assert listed["claims"] == decided["claims"] == 1
    assert listed["cas"] == 0 and decided["cas"] == 1
    assert listed["unit_polls"] == listed["publications"] == 0
    assert decided["unit_polls"] == 2 and decided["publications"] == 1
    for name in ("wgmma", "tma_loads", "release_add", "acquire_polls"):
        assert decided[name] == listed[name] > 0, name
    assert decided["shared"] == listed["shared"]


@needs_triton
def test_the_counted_build_claims_with_the_fetch_add_alone():
    """CLAIM_COUNTED: every rule's tile follows from the layout, so the device build has no
    unit table to poll or publish into (no compare-and-swap, no volatile load); its claim
    is list mode's one fetch-add, and the operand loads, MMAs, row-block releases and polls
    and the shared memory are the units' build's."""
    call = "kernels.compile_for_sm90(precision='w8a8', device=True, counted={})"
    units, counted = (
        sm90.compiled("megamoe_ws", call.format(on), GLUON_PATTERNS) for on in (False, True)
    )
    assert counted["claims"] == units["claims"] == 1
    assert (units["cas"], counted["cas"]) == (1, 0)
    assert (units["unit_polls"], counted["unit_polls"]) == (2, 0)
    for name in ("wgmma", "tma_loads", "release_add", "acquire_polls"):
        assert counted[name] == units[name] > 0, name
    assert counted["shared"] == units["shared"]


@needs_triton
def test_in_device_mode_the_math_and_converters_take_the_tile_from_the_producer():
    """Without prefetch_tile, list mode's math and converter warpgroups read each tile from
    the list again (more global loads); in device mode `tiles` is the producer's output, so
    they take the record either way: the same loads with or without it (W4A8: converters
    too; skip_padding off, whose row check also follows prefetch_tile)."""
    call = "kernels.compile_for_sm90(precision='w4a8', skip_padding=False, prefetch_tile={}, "
    call += "device={})"
    loads = {
        (prefetch, device): sm90.compiled(
            "megamoe_ws", call.format(prefetch, device), GLUON_PATTERNS
        )["global_loads"]
        for prefetch in (False, True)
        for device in (False, True)
    }
    assert loads[False, False] > loads[True, False]
    assert loads[False, True] == loads[True, True]


@needs_triton
@pytest.mark.parametrize("precision", ["w8a8", "w4a8"])
def test_the_launched_device_builds_keep_their_mmas_asynchronous(precision):
    report = sm90.ptxas_report("megamoe_ws", f"kernels.launched_build({precision!r}, device=True)")
    assert "_fused_moe_ws" in report and not sm90.serialized(report)
