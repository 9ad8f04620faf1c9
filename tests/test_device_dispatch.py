"""The dispatch on the device (xstage_kernels.dispatch) under the Triton interpreter, against
the host plan (routing.dispatch_plan, routing.row_destinations), and compiled for sm_90.

count_rows, then the layout and expert_row0 computed here from its counts (the layout
kernel's job on the GPU), then gather_rows, on poisoned outputs, for random routings: the
rows, their scales and destinations equal the host plan's, row for row (count_rows keeps
the plan's order), the scales written row-major or step-major (what the warp-specialized
kernel reads). How fast the dispatch is on a GPU, a GPU run must show.
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
MODULE = "xstage_kernels.dispatch"
BLOCK_M = 128
HOST_OFFSET = -(2**40)  # a host-homed token's destination base: far below the device buffer
POISON_BYTE = 0x7F
POISON_DST = 777  # no destination: real ones are multiples of H


@pytest.fixture
def dispatch(monkeypatch):
    """xstage_kernels.dispatch decorated under TRITON_INTERPRET=1, restored afterwards."""
    for (module,) in fixtures.interpreted_modules(monkeypatch, "xstage_kernels.dispatch"):
        yield module


def _layout_size(blocks: int) -> int:
    return len(schedule.LAYOUT_HEADER) + len(schedule.LAYOUT_ROWS) * blocks


def _layout(counts: np.ndarray, capacity_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """(expert_row0, layout) from per-expert counts, as the layout kernel makes them: the
    schedule layout's header and its expert, row_start and row_end rows (the rest zero),
    in a buffer sized for the most blocks, its tail poisoned."""
    blocks_per = -(-counts // BLOCK_M)
    padded = blocks_per * BLOCK_M
    row0 = np.concatenate([[0], np.cumsum(padded)[:-1]]).astype(np.int32)
    rows = np.concatenate(
        [
            np.minimum(BLOCK_M, c - BLOCK_M * np.arange(b))
            for c, b in zip(counts, blocks_per, strict=True)
        ]
    ).astype(np.int64)
    blocks = len(rows)
    row_end = np.cumsum(rows)
    fields = [np.repeat(np.arange(len(counts)), blocks_per), row_end - rows, row_end]
    rest = np.zeros((len(schedule.LAYOUT_ROWS) - len(fields)) * blocks)
    layout = np.concatenate([[0, 0, blocks], *fields, rest]).astype(np.int32)
    tail = np.full(_layout_size(capacity_blocks) - layout.size, -5, dtype=np.int32)
    return row0, np.concatenate([layout, tail])


def _case(seed: int, routing_name: str, ranks: int, T: int, topk: int, E: int):
    """A home rank's routing (world_size ranks, this rank's experts the first E / ranks),
    this rank's plan of its rows, the local ids (-1 where the expert is elsewhere), and the
    host-homed tokens."""
    point = {
        "shape": f"dispatch-{seed}",
        "E": E,
        "topk": topk,
        "tokens_per_rank": T,
        "world_size": ranks,
        "routing": routing_name,
    }
    ids = routing.route(point, 1.2, 0, seed=seed)[0]
    others = [np.zeros((0, topk), dtype=np.int64)] * (ranks - 1)  # their homes send nothing
    plan = routing.dispatch_plan([ids, *others], E, BLOCK_M)[0]
    local = E // ranks
    local_ids = np.where(ids < local, ids, -1).ravel()
    return point, plan, local_ids, routing.host_tokens(point, 0.25, 0, seed)


CASES = [  # seed, routing, ranks, T, topk, E, activations, id dtype, scales step-major
    (1, "balanced", 1, 300, 4, 4, "fp8", "int32", False),  # 300 rows an expert: 3 blocks
    (2, "skewed", 1, 120, 3, 8, "fp8", "int64", True),  # across count programs
    (3, "skewed", 2, 90, 2, 8, "bf16", "int32", False),  # pairs on the other rank: -1
    (4, "skewed", 1, 12, 2, 16, "fp8", "int32", True),  # experts with no rows
]


@pytest.mark.parametrize(
    ("seed", "name", "ranks", "T", "topk", "E", "act", "id_dtype", "step_major"), CASES
)
def test_the_device_dispatch_lays_out_the_host_plans_rows(
    dispatch, seed, name, ranks, T, topk, E, act, id_dtype, step_major
):
    import torch

    H = 256
    point, plan, ids, host = _case(seed, name, ranks, T, topk, E)
    local = E // ranks
    N = T * topk
    gen = torch.Generator().manual_seed(seed)
    width = H * (1 if act == "fp8" else 2)  # bytes a row
    x_home = torch.randint(0, 256, (T, width), generator=gen).to(torch.uint8)
    x_home = x_home.view(torch.float8_e4m3fn if act == "fp8" else torch.bfloat16)
    xs_home = torch.rand(T, H // 128, generator=gen) if act == "fp8" else None
    token_dst = torch.zeros(T, dtype=torch.int64)
    token_dst[torch.as_tensor(host)] = HOST_OFFSET

    expert_ids = torch.as_tensor(ids).to(getattr(torch, id_dtype))
    counts = torch.full((local,), -7, dtype=torch.int32)
    rank = torch.full((N,), -7, dtype=torch.int32)
    held = torch.full(dispatch.count_scratch(N, local), -7, dtype=torch.int32)
    dispatch.count_rows(expert_ids, counts, rank, held)
    np.testing.assert_array_equal(counts.numpy(), plan.expert_rows)
    assert (plan.expert_rows == 0).any() == (seed == 4)
    for e in range(local):  # in pair order: token, then choice
        np.testing.assert_array_equal(rank.numpy()[ids == e], np.arange(counts[e]))
    assert (rank.numpy()[ids < 0] == -1).all()

    rows = dispatch.capacity_rows(N, local)
    row0, layout = _layout(counts.numpy(), rows // BLOCK_M)
    grid = schedule.TileGrid(plan.block_expert, plan.block_rows, 1, 1)
    host_layout = schedule.device_layout(schedule.WAVE, grid, 1)
    assert layout[2] == plan.blocks and plan.padded_rows <= rows
    np.testing.assert_array_equal(
        layout[: 3 + 3 * plan.blocks][2:], host_layout[2 : 3 + 3 * plan.blocks]
    )
    x = torch.full((rows, width), POISON_BYTE, dtype=torch.uint8).view(x_home.dtype)
    xs = None if xs_home is None else torch.full((rows, H // 128), float("nan"))
    if step_major and xs is not None:  # (H/128, rows) in memory
        xs = torch.full((H // 128, rows), float("nan")).t()
    row_dst = torch.full((rows,), POISON_DST, dtype=torch.int64)
    dispatch.gather_rows(
        expert_ids,
        rank,
        torch.as_tensor(row0),
        torch.as_tensor(layout),
        x_home,
        xs_home,
        x,
        xs,
        row_dst,
        token_dst,
        topk=topk,
        pad_dst=dispatch.PAD_DST,
    )

    raw, home_raw = x.view(torch.uint8).numpy(), x_home.view(torch.uint8).numpy()
    dst = row_dst.numpy()
    # The interface: pair i's row is expert_row0[e] + rank[i].
    pairs = np.flatnonzero(ids >= 0)
    at = row0[ids[pairs]] + rank.numpy()[pairs]
    np.testing.assert_array_equal(raw[at], home_raw[pairs // topk])
    np.testing.assert_array_equal(dst[at], token_dst.numpy()[pairs // topk] + pairs * H)
    if xs is not None:
        assert torch.equal(xs[torch.as_tensor(at)], xs_home[torch.as_tensor(pairs // topk)])
    # The plan, row for row: destinations, and each routed row its token's bytes.
    homed = np.zeros((ranks, T), dtype=bool)
    homed[0, host] = True
    want = routing.row_destinations(
        plan, np.zeros(ranks), H, np.full(ranks, HOST_OFFSET), homed, pad=dispatch.PAD_DST
    )
    assert host.size and (want < 0).any() and (want > 0).any()
    blocks_end = plan.blocks * BLOCK_M
    np.testing.assert_array_equal(dst[:blocks_end], want)
    routed = np.flatnonzero(plan.home >= 0)
    np.testing.assert_array_equal(raw[routed], home_raw[plan.token[routed]])
    # Padding rows store nothing and keep what they held (the poison here): the GEMMs are
    # row-local, so no copy is spent on them. Rows past the blocks are untouched.
    pad = plan.home < 0
    assert pad.any() and (dst[:blocks_end][pad] == dispatch.PAD_DST).all()
    assert (raw[:blocks_end][pad] == POISON_BYTE).all()
    assert (raw[blocks_end:] == POISON_BYTE).all() and (dst[blocks_end:] == POISON_DST).all()
    if xs is not None:
        assert torch.isnan(xs[:blocks_end][torch.as_tensor(pad)]).all()
        assert torch.isnan(xs[blocks_end:]).all()
        assert not torch.isnan(xs[:blocks_end][torch.as_tensor(routed)]).any()


def test_the_layout_rows_and_capacity(dispatch):
    """The kernel reads a block's rows from the schedule layout's fields (it imports no
    harness code); capacity_rows bounds every routing's padded rows."""
    assert dispatch.ROW_START == schedule.LAYOUT_ROWS.index("row_start")
    assert dispatch.ROW_END == schedule.LAYOUT_ROWS.index("row_end")
    assert dispatch.LAYOUT_HEADER == len(schedule.LAYOUT_HEADER)
    assert dispatch.LAYOUT_BLOCKS == schedule.LAYOUT_HEADER.index("blocks")
    rng = np.random.default_rng(0)
    for _ in range(200):
        E = int(rng.integers(1, 40))
        counts = rng.multinomial(int(rng.integers(0, 3000)), rng.dirichlet(np.ones(E) * 0.3))
        padded = int((-(-counts // BLOCK_M) * BLOCK_M).sum())
        cap = dispatch.capacity_rows(int(counts.sum()), E)
        assert padded <= cap and cap % BLOCK_M == 0


def test_bad_arguments_are_named(dispatch):
    import torch

    T, topk, E, H = 4, 2, 3, 256
    rows = dispatch.capacity_rows(T * topk, E)
    i32, i64 = torch.int32, torch.int64
    good = {
        "expert_ids": torch.zeros(T * topk, dtype=i32),
        "rank": torch.zeros(T * topk, dtype=i32),
        "expert_row0": torch.zeros(E, dtype=i32),
        "layout": torch.zeros(_layout_size(rows // BLOCK_M), dtype=i32),
        "x_home": torch.zeros(T, H, dtype=torch.float8_e4m3fn),
        "xs_home": torch.zeros(T, H // 128),
        "x": torch.zeros(rows, H, dtype=torch.float8_e4m3fn),
        "xs": torch.zeros(rows, H // 128),
        "row_dst": torch.zeros(rows, dtype=i64),
        "token_dst": torch.zeros(T, dtype=i64),
    }
    bad = [
        ("x_home", torch.zeros(T, 192, dtype=torch.float8_e4m3fn), "multiple of 128"),
        ("x_home", torch.zeros(T, H, dtype=torch.float16), "x_home must be"),
        ("x", torch.zeros(rows - BLOCK_M, H, dtype=torch.float8_e4m3fn), "x must be"),
        ("x", torch.zeros(rows, H, dtype=torch.bfloat16), "x must be"),
        ("xs", None, "both"),
        ("xs", torch.zeros(rows, H // 128, dtype=torch.float16), "xs must be"),
        ("rank", torch.zeros(T * topk, dtype=i64), "rank must be"),
        ("expert_ids", torch.zeros(T * topk + 1, dtype=i32), "expert_ids must be"),
        ("row_dst", torch.zeros(rows, dtype=i32), "row_dst must be"),
        ("token_dst", torch.zeros(T + 1, dtype=i64), "token_dst must be"),
        ("layout", torch.zeros(4, dtype=i32), "layout must hold"),
        ("expert_row0", torch.zeros(E, dtype=i64), "expert_row0 must be"),
    ]
    for name, value, message in bad:
        with pytest.raises(ValueError, match=message):
            dispatch.gather_rows(**{**good, name: value}, topk=topk, pad_dst=dispatch.PAD_DST)
    held = torch.zeros(dispatch.count_scratch(T * topk, E), dtype=i32)
    with pytest.raises(ValueError, match="counts must be"):
        dispatch.count_rows(good["expert_ids"], torch.zeros(E, dtype=i64), good["rank"], held)
    with pytest.raises(ValueError, match="rank must be"):
        dispatch.count_rows(good["expert_ids"], good["expert_row0"], good["rank"][1:], held)
    with pytest.raises(ValueError, match="held must be"):
        dispatch.count_rows(good["expert_ids"], good["expert_row0"], good["rank"], held[:, 1:])
    with pytest.raises(ValueError, match="xs must be contiguous or the transpose"):
        xs = torch.zeros(2 * rows, H // 128)[::2]
        dispatch.gather_rows(**{**good, "xs": xs}, topk=topk, pad_dst=dispatch.PAD_DST)


# ---- compiled for sm_90 --------------------------------------------------------------------

PATTERNS = {
    "loads_v4": r"ld\.global(?:\.\w+)*\.v4\.b32",
    "stores_v4": r"st\.global(?:\.\w+)*\.v4\.b32",
    "atomics": r"atom\.global",
}


@needs_triton
def test_both_kernels_compile_for_sm90_with_16_byte_row_copies():
    """The gather moves rows as 16-byte vectors (a 16 KiB step: 8 vectors a thread, loads
    and stores); the count's three kernels lower with
    no atomic (its order is the same every run)."""
    for dtype in ("fp8", "bf16"):
        got = sm90.compiled("dispatch", f"kernels.compile_for_sm90('gather', {dtype!r})", PATTERNS)
        assert got["loads_v4"] == 8 and got["stores_v4"] == 8 and got["atomics"] == 0, dtype
    for name in ("count", "scan", "place"):  # the same routing, the same rows: no atomics
        got = sm90.compiled("dispatch", f"kernels.compile_for_sm90({name!r})", PATTERNS)
        assert got["atomics"] == 0, name
