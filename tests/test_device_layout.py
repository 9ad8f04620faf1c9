"""The device layout built on the GPU from per-expert row counts (xstage_kernels.layout).

build_layout must write exactly schedule.device_layout's array for the grid that
routing.dispatch_plan makes of the counts, for every rule. A numpy mirror of the kernel's
steps (its searches, its pointer doubling of expert waves, its closed forms of
deepgemm_interleaved's and interleaved counted's first L2 positions) is checked against
device_layout on hundreds of
grids without the interpreter; the kernel itself, under the interpreter, on a few dozen,
with the layout poisoned so that a missed write shows; and it compiles for sm_90.
"""

from __future__ import annotations

import importlib
import importlib.util

import fixtures
import numpy as np
import pytest
import sm90

from xstage_bench.megamoe import routing, schedule

HAVE_TORCH_TRITON = all(importlib.util.find_spec(m) for m in ("torch", "triton"))
needs_triton = pytest.mark.skipif(not HAVE_TORCH_TRITON, reason="torch and triton not installed")
BLOCK_M = 128  # xstage_kernels.megamoe.BLOCK_M; the interpreted tests check it is
POISON = -7  # fills a layout before a launch: an entry the kernel missed keeps it
NAMES = {s.device_rule: name for name, s in schedule.SCHEDULES.items()}


@pytest.fixture
def interpreted_layout(monkeypatch):
    """xstage_kernels.layout decorated under TRITON_INTERPRET=1, restored afterwards."""
    for (module,) in fixtures.interpreted_modules(monkeypatch, "xstage_kernels.layout"):
        yield module


# ---- grids ----------------------------------------------------------------------------


def _grid(counts: np.ndarray, n1: int, n2: int) -> schedule.TileGrid:
    """The grid dispatch_plan makes of one rank's rows per local expert (topk 1)."""
    ids = np.repeat(np.arange(len(counts)), counts)[:, None]
    plan = routing.dispatch_plan([ids], len(counts), BLOCK_M)[0]
    return schedule.TileGrid(plan.block_expert, plan.block_rows, n1, n2)


def _random_counts(rng: np.random.Generator, max_experts: int = 64) -> np.ndarray:
    """Rows per expert: balanced, skewed, half the experts idle, or one expert with many
    blocks among idle ones."""
    E = int(rng.integers(1, max_experts + 1))
    kind = int(rng.integers(4))
    if kind == 0:
        return rng.integers(0, 700, E)
    if kind == 1:
        return np.minimum(rng.zipf(1.4, E) * int(rng.integers(1, 80)), 30 * BLOCK_M)
    if kind == 2:
        return rng.integers(0, 2, E) * rng.integers(1, 1500, E)
    counts = np.zeros(E, dtype=np.int64)
    counts[rng.integers(E)] = rng.integers(1, 60 * BLOCK_M)
    return counts


def _routed(seed: int) -> list[np.ndarray]:
    """Every rank's rows per local expert of a random routing (balanced or skewed)."""
    point, ids = fixtures.random_routing(seed, "layout", 16)
    return [p.expert_rows for p in routing.dispatch_plan(ids, point["E"], BLOCK_M)]


def _knobs(rng: np.random.Generator) -> dict:
    """A rule, its lead (device_layout writes one for interleaved only), the programs and
    the L1 and L2 tiles a block."""
    rule = int(rng.integers(len(NAMES)))
    lead = int(rng.choice([0, 128, 300, 2048])) if rule == schedule.RULE_INTERLEAVED else 0
    return {
        "rule": rule,
        "lead_rows": lead,
        "num_programs": int(rng.choice([1, rng.integers(2, 40), rng.integers(40, 201)])),
        "n1": int(rng.integers(1, 25)),
        "n2": int(rng.integers(1, 25)),
    }


def _expected(counts: np.ndarray, knobs: dict) -> np.ndarray:
    grid = _grid(counts, knobs["n1"], knobs["n2"])
    name = NAMES[knobs["rule"]]
    return schedule.device_layout(name, grid, knobs["num_programs"], knobs)


def _expert_row0(counts: np.ndarray) -> np.ndarray:
    padded = -(-counts // BLOCK_M) * BLOCK_M
    return np.cumsum(padded) - padded


# ---- the kernel's steps in numpy --------------------------------------------------------


def _count_below(sorted_values: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The kernel's _count_below: how many values are below each target, at most size - 1."""
    return np.minimum(np.searchsorted(sorted_values, targets, side="left"), len(sorted_values) - 1)


def _mirror(counts: np.ndarray, rule: int, lead_rows: int, num_programs: int, n1: int, n2: int):
    """The layout as the kernel computes it, step for step, over EXPERTS lanes."""
    E = len(counts)
    experts = 1 << E.bit_length()  # the power of two > E
    lane = np.arange(experts)
    rows = np.zeros(experts, dtype=np.int64)
    rows[:E] = counts
    nblocks = -(-rows // BLOCK_M)
    first_block = np.cumsum(nblocks) - nblocks
    first_row = np.cumsum(rows) - rows
    blocks = int(nblocks.sum())
    # expert_wave: next(s), then the chain of wave starts by doubling
    at_least = -(-num_programs // n1)
    jump = _count_below(first_block, first_block + at_least)
    chain = np.zeros(experts, dtype=np.int64)
    span = 1
    while span < experts:
        new = (lane >= span) & (lane < 2 * span)
        chain = np.where(new, jump[chain[np.maximum(lane - span, 0)]], chain)
        jump = jump[jump]
        span *= 2
    wave = _count_below(chain, lane + 1) - 1
    wave_start, wave_end = first_block[chain[wave]], first_block[chain[wave + 1]]
    # deepgemm_interleaved: the warm-up, then no block waits
    l1_total = blocks * n1
    first_l2_wave = -(-(-(-num_programs // n2) * n1) // num_programs)
    keep_ahead = -(-(n1 + max(blocks - 1, 0) * max(n1 - n2, 0)) // num_programs) + 1
    waves = min(max(first_l2_wave, keep_ahead), -(-l1_total // num_programs))
    warmup = min(waves * num_programs, l1_total)
    # per block
    block = np.arange(blocks)
    expert = _count_below(first_block + nblocks, block + 1)
    j = block - first_block[expert]
    row_end = first_row[expert] + np.minimum(rows[expert], (j + 1) * BLOCK_M)
    row_start = row_end - np.minimum(rows[expert] - j * BLOCK_M, BLOCK_M)
    l2_start = block * n2 + np.minimum(l1_total, warmup + block * n2)
    if rule == schedule.RULE_INTERLEAVED:  # counted: before the first block lead_rows on
        target = row_end + lead_rows
        holder = _count_below(first_row + rows, target + 1)
        into = np.maximum(target - first_row[holder], 0)
        place = np.minimum(-(-into // BLOCK_M), nblocks[holder])
        l2_start = block * n2 + (first_block[holder] + place) * n1
    header = [rule, lead_rows, blocks]
    body = [expert, row_start, row_end, wave_end[expert], l2_start, wave_start[expert]]
    return np.concatenate([header, *body]).astype(np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_the_kernels_steps_in_numpy_are_device_layout(seed):
    rng = np.random.default_rng(seed)
    routed = [c for s in range(seed * 8, seed * 8 + 8) for c in _routed(s)]
    for counts in routed + [_random_counts(rng) for _ in range(60)]:
        knobs = _knobs(rng)
        np.testing.assert_array_equal(_mirror(counts, **knobs), _expected(counts, knobs))


def test_waves_are_exact_at_their_edges():
    """m = 1 (every expert its own wave), m past every block (one wave), idle experts at
    both ends and between, no rows at all."""
    for counts in ([0, 300, 0, 0, 5, 129, 0], [0], [0, 0, 0], [1], [128, 129, 0, 1000]):
        counts = np.asarray(counts)
        for programs, n1 in ((1, 1), (1, 24), (3, 1), (200, 1), (200, 7), (5, 2)):
            knobs = {"rule": 0, "lead_rows": 0, "num_programs": programs, "n1": n1, "n2": 3}
            np.testing.assert_array_equal(_mirror(counts, **knobs), _expected(counts, knobs))


def test_deepgemms_warmup_leaves_no_block_waiting():
    """The closed form of l2_start holds because the warm-up (its B term) lists block b's L1
    tiles before its first L2 tile, for every b: _deepgemm_l2_starts' catch-up never runs."""
    rng = np.random.default_rng(11)
    for _ in range(400):
        counts = _random_counts(rng, max_experts=32)
        n1, n2, programs = (int(v) for v in rng.integers(1, [40, 40, 300]))
        grid = _grid(counts, n1, n2)
        l1_total = grid.blocks * n1
        warmup = min(schedule.deepgemm_warmup_waves(grid, programs) * programs, l1_total)
        b = np.arange(grid.blocks)
        assert (warmup + b * n2 >= np.minimum((b + 1) * n1, l1_total)).all()
        closed = b * n2 + np.minimum(l1_total, warmup + b * n2)
        np.testing.assert_array_equal(closed, schedule._deepgemm_l2_starts(grid, programs))


def test_the_capacity_bounds_every_routing_and_is_reached(interpreted_layout):
    layout = interpreted_layout
    assert layout.BLOCK_M == BLOCK_M
    assert layout.layout_size(7) == len(schedule.LAYOUT_HEADER) + 7 * len(schedule.LAYOUT_ROWS)
    rng = np.random.default_rng(5)
    for _ in range(300):
        E, pairs = int(rng.integers(1, 600)), int(rng.integers(0, 20_000))
        capacity = layout.capacity_blocks(pairs, E)
        assert capacity <= -(-pairs // BLOCK_M) + E
        counts = rng.multinomial(pairs, rng.dirichlet(np.full(E, rng.choice([0.05, 1.0]))))
        assert (-(-counts // BLOCK_M)).sum() <= capacity
        busy = min(E, pairs)  # busy - 1 experts with a row each, the rest on one
        worst = np.zeros(E, dtype=np.int64)
        worst[: busy - 1] = 1
        worst[busy - 1 :][:1] = pairs - (busy - 1)
        assert (-(-worst // BLOCK_M)).sum() == capacity
    with pytest.raises(ValueError, match=">= 0"):
        layout.capacity_blocks(-1, 4)


# ---- the kernel under the interpreter ---------------------------------------------------


def _build(layout_module, counts: np.ndarray, knobs: dict, capacity: int | None = None):
    """build_layout on poisoned CPU buffers: (layout, expert_row0) as numpy."""
    import torch

    if capacity is None:
        capacity = layout_module.capacity_blocks(int(counts.sum()), len(counts))
    out = torch.full((layout_module.layout_size(capacity),), POISON, dtype=torch.int32)
    row0 = torch.full((len(counts),), POISON, dtype=torch.int32)
    try:
        layout_module.build_layout(torch.as_tensor(counts, dtype=torch.int32), out, row0, **knobs)
    except Exception as e:  # triton.runtime.errors.InterpreterError
        if "0-dimensional" in str(e):
            pytest.skip(f"the Triton interpreter cannot run with this numpy: {e}")
        raise
    return out.numpy(), row0.numpy()


def _check(layout_module, counts: np.ndarray, knobs: dict) -> None:
    want = _expected(counts, knobs)
    got, row0 = _build(layout_module, counts, knobs)
    np.testing.assert_array_equal(got[: want.size], want)
    np.testing.assert_array_equal(row0, _expert_row0(counts))


def test_the_kernel_writes_device_layout_bit_for_bit(interpreted_layout, monkeypatch):
    """Routed and synthetic grids, every rule; a chunk of 16 blocks, so that most grids
    take several steps of the block loop."""
    monkeypatch.setattr(interpreted_layout, "CHUNK", 16)
    rng = np.random.default_rng(2026)
    grids = _routed(3) + _routed(8) + [_random_counts(rng) for _ in range(14)]
    grids += [np.array([0, 0, 40 * BLOCK_M + 1, 0]), np.zeros(5, dtype=np.int64)]
    for counts in grids:
        _check(interpreted_layout, counts, _knobs(rng))
    edges = np.array([0, 300, 0, 0, 5, 129, 0, 1])
    for programs, n1 in ((1, 1), (200, 1), (200, 7), (5, 2)):
        for rule in NAMES:
            knobs = {"rule": rule, "lead_rows": 0, "num_programs": programs, "n1": n1, "n2": 5}
            _check(interpreted_layout, edges, knobs)
    # interleaved counted: a lead that ends on a block's first row, inside one, past the end
    for lead in (0, 1, 171, 300, 434, 435):
        knobs = {"rule": schedule.RULE_INTERLEAVED, "lead_rows": lead, "num_programs": 5}
        _check(interpreted_layout, edges, {**knobs, "n1": 2, "n2": 5})


def test_the_kernel_covers_512_experts_and_blocks_past_a_chunk(interpreted_layout):
    rng = np.random.default_rng(9)
    skewed = np.minimum(rng.zipf(1.3, 512) * 40, 200 * BLOCK_M)
    assert (-(-skewed // BLOCK_M)).sum() > interpreted_layout.CHUNK
    knobs = {"rule": schedule.RULE_DEEPGEMM, "lead_rows": 0, "num_programs": 132}
    _check(interpreted_layout, skewed, {**knobs, "n1": 16, "n2": 48})


def test_counts_past_the_capacity_leave_blocks_minus_one_and_no_rows(interpreted_layout):
    counts = np.array([129, 0, 1, 256])  # 5 blocks
    knobs = {"rule": schedule.RULE_INTERLEAVED, "lead_rows": 64, "num_programs": 8}
    knobs |= {"n1": 2, "n2": 3}
    exact, row0 = _build(interpreted_layout, counts, knobs, capacity=5)
    np.testing.assert_array_equal(exact, _expected(counts, knobs))
    for capacity in (0, 4):
        got, row0 = _build(interpreted_layout, counts, knobs, capacity=capacity)
        assert got[:3].tolist() == [schedule.RULE_INTERLEAVED, 64, -1]
        assert (got[3:] == POISON).all()
        np.testing.assert_array_equal(row0, _expert_row0(counts))  # written either way


def test_the_host_refuses_what_the_kernel_cannot_check(interpreted_layout):
    import torch

    build = interpreted_layout.build_layout
    counts = torch.tensor([5, 300], dtype=torch.int32)
    row0 = torch.zeros(2, dtype=torch.int32)
    knobs = {"rule": 0, "lead_rows": 0, "num_programs": 4, "n1": 2, "n2": 2}
    with pytest.raises(ValueError, match="layout of 2 int32 cannot hold its 3-entry header"):
        build(counts, torch.zeros(2, dtype=torch.int32), row0, **knobs)
    layout = torch.zeros(interpreted_layout.layout_size(4), dtype=torch.int32)
    with pytest.raises(ValueError, match="layout must be torch.int32, got torch.int64"):
        build(counts, layout.long(), row0, **knobs)
    with pytest.raises(ValueError, match="expert_row0 holds 1 experts, counts 2"):
        build(counts, layout, row0[:1], **knobs)
    with pytest.raises(ValueError, match="rule must be one of"):
        build(counts, layout, row0, **{**knobs, "rule": 3})
    with pytest.raises(ValueError, match="n1, n2 >= 1"):
        build(counts, layout, row0, **{**knobs, "n2": 0})
    huge = torch.empty(interpreted_layout.layout_size(2**22), dtype=torch.int32)
    with pytest.raises(ValueError, match="holds 4194304 blocks.*past int32"):
        build(counts, huge, row0, **{**knobs, "n1": 300, "n2": 300})


@needs_triton
def test_the_kernel_compiles_for_sm90_without_spilling():
    """One program, every vector in registers: no local memory, shared memory for the
    gathers and scans only."""
    counts = sm90.compiled("layout", "kernels.compile_for_sm90(512)", {"local": r"\.local\."})
    assert counts["local"] == 0
    assert 0 < counts["shared"] <= sm90.SHARED_BYTES
