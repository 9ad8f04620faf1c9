"""The device-side schedule (issue 53): each claimed list position's tile decided on the GPU.

A claim is the list's fetch-add, and a position's tile follows from the layout:
expert_wave's and deepgemm_interleaved's, and interleaved counted's (each block's L2 tiles
before the first block lead_rows on). The Python reference (schedule.claim_order by
schedule.wave_tile_at and schedule.counted_tile_at) realizes expert_wave's and
deepgemm_interleaved's host lists exactly, and interleaved's host list with every block
released in time (numpy only). The tl kernel's resolution under the interpreter: position
by position from a layout, and in a whole device-mode launch, which computes what list mode
and the reference compute and writes the order it realized. The Gluon kernel's device mode
compiles for sm_90 with the list's one fetch-add as its claim (no GPU). How fast the GPU
realizes them, a GPU run must show.
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
    # A block's wave_end: the blocks whose L1 tiles precede its L2 tiles in expert_wave's list.
    wave = schedule.expert_wave(g, 7)
    first_l2 = np.flatnonzero((wave[:, 0] == schedule.L2) & (wave[:, 3] == 0))
    l1_units = np.cumsum(wave[:, 0] == schedule.L1)[first_l2] // g.l1_per_block
    np.testing.assert_array_equal(rows["wave_end"][wave[first_l2, 2]], l1_units)
    # A block's l2_start: where interleaved counted lists its first L2 tile, and in
    # deepgemm_interleaved's layout where that list does.
    counted = schedule.claim_order(schedule.INTERLEAVED, g, 7, lead_rows=256)
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


@pytest.mark.parametrize("name", EXACT)
@pytest.mark.parametrize("seed", range(12))
def test_the_device_rules_realize_expert_waves_and_deepgemms_lists_exactly(name, seed):
    rng = np.random.default_rng(100 + seed)
    for g in _routed_grids(seed):
        for programs in (1, int(rng.integers(2, 40)), int(rng.integers(40, 300))):
            got = schedule.claim_order(name, g, programs)
            np.testing.assert_array_equal(got, schedule.build(name, g, programs))


@pytest.mark.parametrize("seed", range(12))
def test_interleaveds_host_list_keeps_its_lead(seed):
    """The reference the device rule is held to: the host list, decided per row block on
    the clock of num_programs programs taking entries in turn, keeps its lead."""
    rng = np.random.default_rng(200 + seed)
    for g in _routed_grids(seed):
        programs, lead = int(rng.integers(1, 200)), int(rng.choice([0, 128, 512, 2048]))
        tiles = schedule.interleaved(g, programs, lead)
        schedule.check_dependencies(tiles, g)
        _lead_holds(tiles, g, lead)


def _every_block_released_in_time(g: schedule.TileGrid, lead: int) -> np.ndarray:
    """interleaved's host list as if every block were released when its L2 tiles come: the
    lead alone decides, block by block, between the next L2 block and the next L1 block."""
    row_end = g.row_end()
    row_start = row_end - g.block_rows
    tiles, l1_block, l2_block = [], 0, 0
    while l2_block < g.blocks:
        if l1_block == g.blocks or row_start[l1_block] - row_end[l2_block] >= lead:
            kind, block, width = schedule.L2, l2_block, g.l2_per_block
            l2_block += 1
        else:
            kind, block, width = schedule.L1, l1_block, g.l1_per_block
            l1_block += 1
        tiles += [(kind, int(g.block_expert[block]), block, n) for n in range(width)]
    return np.asarray(tiles, dtype=np.int32).reshape(-1, len(schedule.COLUMNS))


@pytest.mark.parametrize("seed", range(12))
def test_interleaved_counted_is_the_host_list_with_every_block_released_in_time(seed):
    """Counted, the positions read no clock: each block's L2 tiles come right before the
    first L1 block that starts lead_rows after it ends, the lead rule's order where every
    block is released when its L2 tiles come; positions far apart resolve on their own."""
    rng = np.random.default_rng(300 + seed)
    for g in _routed_grids(seed):
        programs, lead = int(rng.integers(1, 200)), int(rng.choice([0, 128, 512, 2048]))
        tiles = schedule.claim_order(schedule.INTERLEAVED, g, programs, lead_rows=lead)
        np.testing.assert_array_equal(tiles, _every_block_released_in_time(g, lead))
        schedule.check_dependencies(tiles, g)
        _lead_holds(tiles, g, lead)


def test_counted_lists_a_blocks_l2_tiles_before_the_first_block_a_lead_on():
    """Blocks of 100 rows (so row_start 0, 100, 200, ...), 2 L1 and 1 L2 tile each: at a
    lead of 150, block 0 (rows 0-99) is due before block 3 (the first starting 150 rows
    after row 100); after the last L1 block, the L2 tiles left follow in turn."""
    g = schedule.TileGrid(np.zeros(5, dtype=np.int64), np.full(5, 100), 2, 1)
    claims = schedule.claim_order(schedule.INTERLEAVED, g, 4, lead_rows=150)
    assert _kinds_and_blocks(claims) == (
        ["L1.0"] * 2 + ["L1.1"] * 2 + ["L1.2"] * 2 + ["L2.0"] + ["L1.3"] * 2 + ["L2.1"]
    ) + ["L1.4"] * 2 + ["L2.2", "L2.3", "L2.4"]


def _kinds_and_blocks(tiles: np.ndarray) -> list[str]:
    return [f"L{kind + 1}.{block}" for kind, _, block, _ in tiles.tolist()]


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
    """The sync buffer is list mode's (the header, then a counter per row block); the launch
    checks the buffers against the layout's blocks."""
    import torch

    kernel = interpreted_kernel
    for blocks in range(6):
        assert kernel.sync_size(blocks) == kernel.SYNC_HEADER + blocks
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


def _resolve(kernel, layout: np.ndarray, grid, positions):
    """decided_tile under the interpreter: one program finding the tiles at `positions`
    (increasing) from the layout; (position or n_tiles, kind, expert, block, n block) for
    each."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def resolve(
        positions,
        count,
        out,
        layout,
        n_tiles,
        n1,
        n2,
        decided_tile: tl.constexpr,
        W: tl.constexpr,
    ):
        lanes = tl.arange(0, W)
        walk = 0
        for i in range(count):
            p = tl.load(positions + i)
            kind, e, blk, nb, walk = decided_tile(p, layout, n_tiles, n1, n2, walk, lanes)
            tl.store(out + 5 * i, p)
            tl.store(out + 5 * i + 1, kind)
            tl.store(out + 5 * i + 2, e)
            tl.store(out + 5 * i + 3, blk)
            tl.store(out + 5 * i + 4, nb)

    out = torch.full((len(positions), 5), -1, dtype=torch.int32)
    n1, n2 = grid.l1_per_block, grid.l2_per_block
    args = (torch.as_tensor(positions, dtype=torch.int32), len(positions), out)
    args += (torch.as_tensor(layout), grid.tiles, n1, n2)
    resolve[(1,)](*args, decided_tile=kernel.decided_tile, W=kernel.BLOCK_WINDOW)
    return out.numpy()


@pytest.mark.parametrize("name", [*EXACT, "interleaved counted"])
def test_the_count_rules_positions_follow_from_the_layout(interpreted_kernel, name):
    """Every position, and positions far apart (past a window of blocks): expert waves
    of uneven experts (one or two experts, 1 to 9 blocks a wave), deepgemm's single tiles,
    interleaved counted's blocks of L2 tiles (uneven rows, lead 300)."""
    experts = np.repeat(np.arange(10), np.tile([7, 2, 3, 9, 1], 2))
    rows = np.where(np.arange(len(experts)) % 3 == 0, 57, 128)
    g = schedule.TileGrid(experts, rows, 2, 3)
    counted = name == "interleaved counted"
    rule = schedule.INTERLEAVED if counted else name
    layout = schedule.device_layout(rule, g, 8, {"lead_rows": 300} if counted else None)
    if counted:
        listed = schedule.claim_order(rule, g, 8, lead_rows=300)
    else:
        listed = schedule.build(name, g, 8)
    rng = np.random.default_rng(3)
    for positions in (np.arange(g.tiles), np.sort(rng.choice(g.tiles, 20, replace=False))):
        got = _resolve(interpreted_kernel, layout, g, positions)
        np.testing.assert_array_equal(got[:, 0], positions)
        np.testing.assert_array_equal(got[:, 1:], listed[positions])


def _launch_in_device_mode(monkeypatch, kernel, prob, name: str, knobs: dict) -> dict:
    """Make prob.forward launch every rank's kernel in device mode for schedule `name`:
    each rank's tile list gives way to a poisoned buffer that the kernel fills; returns
    those buffers by rank (after the run, the orders the kernel realized)."""
    import torch

    launch = kernel.launch
    realized = {}

    def device_launch(*, tiles, sync, layout=None, **kw):  # a list arm's launch: no layout
        (q,) = [q for q, rb in enumerate(prob.ranks) if rb.sync is sync]
        grid = prob.ranks[q].grid
        layout = schedule.device_layout(name, grid, prob.num_programs, knobs)
        realized[q] = torch.full_like(tiles, -1)
        launch(tiles=realized[q], sync=sync, layout=torch.as_tensor(layout), **kw)

    monkeypatch.setattr(kernel, "launch", device_launch)
    return realized


# Not bf16 (the interpreter's bf16 dot is wrong, see test_megamoe_cpu.py); W4A8 differs from
# W8A8 only in its GEMMs, which list mode's tests cover.
def test_device_mode_computes_what_list_mode_and_the_reference_do(interpreted_kernel, monkeypatch):
    """Each schedule once from its host list and once decided in the kernel, outputs
    poisoned before each: the same outputs bit for bit, within the interpreter's tolerance
    of the reference, no error flag, and the realized order on every rank a valid list:
    expert_wave's and deepgemm_interleaved's exactly the host's, interleaved's the counted
    one (positions read no clock)."""
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
                want = schedule.claim_order(
                    name, rb.grid, prob.num_programs, lead_rows=moe["lead_rows"]
                )
            np.testing.assert_array_equal(order, want)


# ---- the Gluon kernel, compiled for sm_90 ------------------------------------------------

GLUON_PATTERNS = {
    "cas": r"atom\.global(?:\.\w+)*\.cas\.",
    "claims": r"atom\.global\.gpu\.acq_rel\.add",  # the position counter (CLAIM_RELAXED off)
    "volatile_loads": r"ld\.volatile\.global",
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
    """Device mode claims a position with list mode's one atomic add and finds its tile
    from the layout alone: nothing to poll or publish (no compare-and-swap, no volatile
    load). The operand loads, MMAs, row-block releases and polls stay as they were, and so
    does shared memory (a window's reductions are a warp's shuffles)."""
    call = "kernels.compile_for_sm90(precision={!r}, trace={}, device={})"
    listed, decided = (
        sm90.compiled("megamoe_ws", call.format(precision, trace, device), GLUON_PATTERNS)
        for device in (False, True)
    )
    assert listed["claims"] == decided["claims"] == 1
    assert listed["cas"] == decided["cas"] == 0
    assert listed["volatile_loads"] == decided["volatile_loads"] == 0
    for name in ("wgmma", "tma_loads", "release_add", "acquire_polls"):
        assert decided[name] == listed[name] > 0, name
    assert decided["shared"] == listed["shared"]


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
