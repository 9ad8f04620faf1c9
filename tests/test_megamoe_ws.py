"""The warp-specialized FP8 kernel (kernels/xstage_kernels/megamoe_ws.py) without a GPU.

Gluon has no interpreter, so its numbers are checked on a GPU only (every point's check,
before timing). Here: it compiles for sm_90 in every build (W8A8, W4A8, with and without
TRACE), and the compiled code has the structure the kernel's docstring promises
(partitions with their own register budgets, asynchronous FP8 wgmma, per-slot mbarriers,
16-byte epilogue stores, the proxy fence and the release that publish the intermediate;
for W4A8 the table-lookup conversion into shared memory, fenced for the tensor cores);
which kernel a launch picks; and the int4 -> FP8 lookup itself, run on every byte by a
small model of the PTX instructions it uses.
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import sm90

HAVE_TRITON = all(importlib.util.find_spec(m) for m in ("torch", "triton"))
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="torch and triton not installed")
PATTERNS = {
    "wgmma": r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3",
    "wgmma_wait": r"wgmma\.wait_group",
    "mbarrier_arrive": r"mbarrier\.arrive",
    "expect_tx": r"mbarrier\.arrive\.expect_tx",
    "tma_loads": r"cp\.async\.bulk\.tensor",
    "vector_stores": r"st\.global(\.v4\.b32|\.v4\.u32)",
    "proxy_fence": r"fence\.proxy\.async\.global",
    "shared_fence": r"fence\.proxy\.async\.shared::cta",
    "prmt": r"prmt\.b32",
    "shared_v4_loads": r"ld\.shared\.v4",
    "release_add": r"atom\.global\.gpu\.release\.add",
    "atomic_max": r"atom\.global\.gpu\.\w+\.max\.s64",
    "cta_barriers": r"(?<![\w.])bar\.sync\s+0;|barrier\.sync\s+0;",
    # The combine rows' destination offsets (int64 row_dst, padding masked to 0) stay 64-bit
    # into the address: a host buffer's offset from the device buffer is far beyond 2^31.
    "wide_destinations": r"selp\.b64\s+%rd\d+, %rd\d+, 0, %p\d+;",
    "narrow_destinations": r"selp\.b32\s+%r\d+, %r\d+, 0, %p\d+;",
}


GLOBAL_LOADS = {**PATTERNS, "global_loads": r"ld\.global"}


def _builds(option: str, patterns: dict) -> tuple[dict, dict]:
    """The W8A8 build's pattern counts with a compile_for_sm90 option off, then on."""
    call = f"kernels.compile_for_sm90(precision='w8a8', {option}={{}})"
    return tuple(sm90.compiled("megamoe_ws", call.format(on), patterns) for on in (False, True))


def _compiled(trace: bool, precision: str) -> dict:
    call = f"kernels.compile_for_sm90(trace={trace}, precision={precision!r})"
    return sm90.compiled("megamoe_ws", call, PATTERNS)


@needs_triton
@pytest.mark.parametrize("precision", ["w8a8", "w4a8"])
@pytest.mark.parametrize("trace", [False, True])
def test_compiles_for_sm90_with_warp_specialized_partitions(trace, precision):
    from xstage_kernels import megamoe_ws

    got = _compiled(trace, precision)
    assert got["shared"] <= sm90.SHARED_BYTES
    # The operand ring alone: per slot two 128 x 128 FP8 blocks (W8A8), or the activation
    # block, the packed weights and their converted FP8 block (W4A8).
    slot = (2 if precision == "w8a8" else 2.5) * megamoe_ws.BLOCK**2
    assert got["shared"] >= megamoe_ws.stages(precision) * slot
    w4 = precision == "w4a8"
    regs = megamoe_ws.W4_REGS if w4 else (megamoe_ws.MATH_REGS, megamoe_ws.PRODUCER_REGS)
    assert set(regs) <= set(got["setmaxnreg"])  # the worker partitions' setmaxnreg
    # Four K sub-steps of 32 per 128-channel step, in each math warpgroup's loop.
    assert got["wgmma"] > 0 and got["wgmma"] % 4 == 0
    assert got["wgmma_wait"] > 0
    assert got["expect_tx"] > 0 and got["tma_loads"] >= 2 * got["expect_tx"]
    assert got["mbarrier_arrive"] > got["expect_tx"]  # empty slots and the tile ring
    assert got["vector_stores"] > 0
    assert got["wide_destinations"] > 0 and got["narrow_destinations"] == 0
    assert got["proxy_fence"] > 0 and got["release_add"] > 0
    assert got["cta_barriers"] == 0  # partitions meet at mbarriers, never at a CTA barrier
    assert (got["atomic_max"] > 0) == trace
    if precision == "w4a8":
        # Converted by table lookup (no int -> float conversions), read as 16-byte chunks,
        # and fenced for the tensor cores before the slot's "converted" barrier.
        assert got["prmt"] >= 10 * got["shared_v4_loads"] > 0
        assert got["shared_fence"] > 0
    else:
        assert got["shared_fence"] == 0


@needs_triton
@pytest.mark.parametrize("precision", ["w8a8", "w4a8"])
@pytest.mark.parametrize("option", ["tile_major_weights", "prefetch_tile"])
def test_launch_options_compile_to_the_same_loads_and_mmas(precision, option):
    """Each launch option keeps the operand loads, MMAs and stores; handing the tile record
    over (prefetch_tile) takes global loads out of the math and converter warpgroups."""
    plain = sm90.compiled(
        "megamoe_ws", f"kernels.compile_for_sm90(precision={precision!r})", GLOBAL_LOADS
    )
    call = f"kernels.compile_for_sm90(precision={precision!r}, {option}=True)"
    changed = sm90.compiled("megamoe_ws", call, GLOBAL_LOADS)
    for name in ("wgmma", "expect_tx", "tma_loads", "vector_stores", "release_add"):
        assert changed[name] == plain[name] > 0, name
    assert changed["shared"] == plain["shared"]
    if option == "prefetch_tile":
        assert changed["global_loads"] < plain["global_loads"]
    else:
        assert changed["global_loads"] == plain["global_loads"]


@needs_triton
def test_w4a8_holding_gate_in_bf16_keeps_the_loads_and_mmas():
    """GATE_BF16: W4A8's Linear-1 rounds gate to bf16 between gate's and up's step loops
    and back after; operand loads, MMAs, stores and shared memory stay as they were."""
    patterns = {**PATTERNS, "to_bf16": r"cvt\.rn\.bf16\.f32", "to_f32": r"cvt\.f32\.bf16"}
    plain = sm90.compiled("megamoe_ws", "kernels.compile_for_sm90(precision='w4a8')", patterns)
    call = "kernels.compile_for_sm90(precision='w4a8', gate_bf16=True)"
    held = sm90.compiled("megamoe_ws", call, patterns)
    for name in ("wgmma", "expect_tx", "tma_loads", "vector_stores", "release_add", "prmt"):
        assert held[name] == plain[name] > 0, name
    assert held["shared"] == plain["shared"]
    # Gate's 64 values a thread, each way, in each of the two math warpgroups' code.
    assert plain["to_bf16"] == plain["to_f32"] == 0
    assert held["to_bf16"] == held["to_f32"] == 2 * 64


@needs_triton
def test_converted_halves_in_their_own_buffers_take_the_converters_barriers_out():
    """SPLIT_CONVERTED and CONVERT_ROWS: the converters' stores into one allocation each
    cost a barrier of their 4 warps (bar.sync 3 and 4, one per converter); one buffer per
    half drops the barrier between a part's two stores, 64-row parts half of the rest. The
    loads, MMAs, conversions and shared memory stay as they were."""
    patterns = {**PATTERNS, "converter_barriers": r"bar\.sync\s+[34], 128;"}

    def build(split, rows):
        call = (
            f"kernels.compile_for_sm90(precision='w4a8', split_converted={split}, "
            f"convert_rows={rows})"
        )
        return sm90.compiled("megamoe_ws", call, patterns)

    one, split, wide = build(False, 32), build(True, 32), build(True, 64)
    for name in ("wgmma", "expect_tx", "tma_loads", "prmt", "shared_v4_loads", "shared"):
        assert one[name] == split[name] == wide[name] > 0, name
    # per converter: 7 between its 8 stores of a step; 4 more publish a step and take a tile
    assert one["converter_barriers"] == 2 * (7 + 2 + 2)
    assert split["converter_barriers"] == 2 * (3 + 2 + 2)
    assert wide["converter_barriers"] == 2 * (1 + 2 + 2)


@needs_triton
def test_gate_in_bf16_is_w4a8s_alone_and_stales_only_its_points(monkeypatch):
    """GATE_BF16 changes W4A8's build only: its raw-config record names it, so turning it on
    re-measures our W4A8 points and keeps the W8A8 ones."""
    from xstage_bench.megamoe.runner import kernel_refresh, kernels_that_ran
    from xstage_kernels import megamoe, megamoe_ws

    monkeypatch.delenv(megamoe.FP8_KERNEL_ENV, raising=False)
    monkeypatch.setattr(megamoe_ws, "GATE_BF16", False)
    fp32 = {"kernel": {"ran": kernels_that_ran(megamoe, "cuda")}}
    monkeypatch.setattr(megamoe_ws, "GATE_BF16", True)
    assert megamoe_ws.holds_gate_bf16("w4a8") and not megamoe_ws.holds_gate_bf16("w8a8")
    held = {"kernel": {"ran": kernels_that_ran(megamoe, "cuda")}}
    assert held["kernel"]["ran"]["w4a8"]["gate_held"] == "bf16"
    assert "gate_held" not in held["kernel"]["ran"]["w8a8"]
    refresh = kernel_refresh(fp32, held)
    assert refresh.stale({"precision": "w4a8"}) and not refresh.stale({"precision": "w8a8"})
    # So do the converters' buffers and rows: named in W4A8's record alone.
    monkeypatch.setattr(megamoe_ws, "SPLIT_CONVERTED", True)
    monkeypatch.setattr(megamoe_ws, "CONVERT_ROWS", 64)
    split = megamoe_ws.launch_options("w4a8")
    assert split["converted_halves"] == "one buffer each"
    assert split["converted_rows_per_store"] == 64
    w8a8_only = {k: v for k, v in megamoe_ws.launch_options("w8a8").items() if k != "wait_barriers"}
    assert w8a8_only == {  # wait_barriers: each precision's own edit (drops_wait_barriers)
        k: v
        for k, v in split.items()
        if not k.startswith("converted") and k not in ("gate_held", "wait_barriers")
    }
    monkeypatch.setattr(megamoe_ws, "CONVERT_ROWS", 48)
    with pytest.raises(ValueError, match="CONVERT_ROWS=48: expected one of"):
        megamoe_ws.convert_rows()


@needs_triton
@pytest.mark.parametrize("precision", ["w8a8", "w4a8"])
def test_smaller_row_boxes_load_each_step_in_one_of_three_boxes(precision):
    """ROW_BOX_MIN 32: each of the three step loops (gate, up, Linear-2) loads A in a box of
    128, 64 or 32 rows, each box with its own expected bytes; the MMAs stay as they were."""
    from xstage_kernels import megamoe_ws

    plain = _compiled(False, precision)
    call = f"kernels.compile_for_sm90(precision={precision!r}, row_box_min=32)"
    boxes = sm90.compiled("megamoe_ws", call, PATTERNS)
    n = len(megamoe_ws.ROW_BOXES)
    assert boxes["expect_tx"] == n * plain["expect_tx"] > 0
    a_loads = 2 if precision == "w4a8" else 1  # W4A8 loads A as two halves
    per_step = plain["tma_loads"] // plain["expect_tx"]
    assert per_step == a_loads + 1
    assert boxes["tma_loads"] == plain["expect_tx"] * (n * a_loads + 1)  # B: one load a step
    assert boxes["wgmma"] == plain["wgmma"] and boxes["shared"] == plain["shared"]
    megamoe_ws.ROW_BOX_MIN, kept = 48, megamoe_ws.ROW_BOX_MIN
    try:
        with pytest.raises(ValueError, match="ROW_BOX_MIN=48: expected one of"):
            megamoe_ws.row_box_min()
    finally:
        megamoe_ws.ROW_BOX_MIN = kept


@needs_triton
@pytest.mark.parametrize(("k", "width"), [(384, 128), (192, 64)])
def test_a_tile_major_block_row_holds_one_weight_tile(k, width):
    """Block row (r / 128) * (K / width) + step of the tile-major copy holds rows r..r+127
    and the step's columns of the row-major weights, for every tile of every expert."""
    import torch

    from xstage_kernels import megamoe_ws

    block = megamoe_ws.BLOCK
    w = torch.randint(0, 255, (3, 2 * block, k), dtype=torch.uint8)
    tiles = megamoe_ws.tile_major(w, width)
    flat = w.reshape(-1, k)
    steps = k // width
    assert tiles.shape == (w.numel() // width, width) and tiles.is_contiguous()
    for r in range(0, flat.shape[0], block):
        for step in range(steps):
            at = (r // block * steps + step) * block
            want = flat[r : r + block, step * width : (step + 1) * width]
            assert torch.equal(tiles[at : at + block], want), (r, step)
    with pytest.raises(ValueError, match="not whole 128 x 128 tiles"):
        megamoe_ws.tile_major(w[:, :, : k - 1], 128)


@needs_triton
def test_a_tile_major_copy_is_made_once_and_dropped_with_its_weights(monkeypatch):
    import gc

    import torch

    from xstage_kernels import megamoe_ws

    made = []
    real = megamoe_ws.tile_major
    monkeypatch.setattr(megamoe_ws, "tile_major", lambda w, width: made.append(1) or real(w, width))
    w = torch.zeros(1, megamoe_ws.BLOCK, megamoe_ws.BLOCK, dtype=torch.uint8)
    first = megamoe_ws.tile_major_copy(w, megamoe_ws.BLOCK)
    assert megamoe_ws.tile_major_copy(w, megamoe_ws.BLOCK) is first and len(made) == 1
    key = id(w)
    del w, first
    gc.collect()
    assert key not in megamoe_ws._tile_major_copies


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte selector[i] & 7 of b:a, or
    that byte's sign replicated when selector[i] & 8."""
    pool = (b << 32 | a).to_bytes(8, "little")
    out = 0
    for i in range(4):
        nibble = selector >> (4 * i) & 0xF
        byte = pool[nibble & 7]
        if nibble & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def _run_ptx(program: str, packed: int) -> tuple[int, int]:
    """The lookup's PTX (mov, and, or, shr, prmt on 32-bit registers) on one packed word."""
    regs = {"$2": packed}
    ops = {
        "mov.b32": lambda a: a,
        "and.b32": lambda a, b: a & b,
        "or.b32": lambda a, b: a | b,
        "shr.u32": lambda a, b: a >> b,
        "shl.b32": lambda a, b: a << b,
        "prmt.b32": _prmt,
    }
    for line in program.splitlines():
        line = line.strip().rstrip(";")
        if not line or line[0] in "{}." or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        dst, *srcs = [s.strip() for s in rest.split(",")]
        values = [regs[s] if s in regs else int(s, 0) for s in srcs]
        regs[dst] = ops[op](*values) & 0xFFFFFFFF
    return regs["$0"], regs["$1"]


def _e4m3_value(code: int) -> float:
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = code >> 3 & 0xF, code & 7
    return 0.0 if code & 0x7F == 0 else sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def test_int4_lookup_gives_the_fp8_of_every_packed_weight_in_channel_order():
    import numpy as np

    from xstage_bench.megamoe import quant
    from xstage_kernels import int4_fp8

    # e4m3_code agrees with the reference rounding for every int4 value (decoded back).
    for v in int4_fp8.INT4_VALUES:
        assert _e4m3_value(int4_fp8.e4m3_code(v)) == v == quant.e4m3_round(np.float32(v))

    program = int4_fp8.ptx()
    rng = np.random.default_rng(7)
    # Words as quant.py packs them: word w of a block holds channels 4w..4w+3 of each half.
    weights = rng.integers(-7, 8, size=(40, 128))
    weights[0] = np.tile(np.arange(-7, 8), 9)[:128]  # every value in every position
    packed = quant.pack_int4_np(weights)
    for row in range(weights.shape[0]):
        for w in range(16):
            word = int.from_bytes(packed[row, 4 * w : 4 * w + 4].tobytes(), "little")
            first, second = _run_ptx(program, word)
            for i in range(4):
                assert _e4m3_value(first >> (8 * i) & 0xFF) == weights[row, 4 * w + i]
                assert _e4m3_value(second >> (8 * i) & 0xFF) == weights[row, 64 + 4 * w + i]
    # Any word at all: each byte is its magnitude's code with its sign bit on top.
    for word in (int(x) for x in rng.integers(0, 2**32, size=2000, dtype=np.uint64)):
        first, second = _run_ptx(program, word)
        for i in range(4):
            for out, h in ((first, 0), (second, 1)):
                magnitude = word >> (16 * h + 4 * i) & 7
                sign = word >> (8 * i + 7 - 4 * h) & 1
                assert out >> (8 * i) & 0xFF == int4_fp8.e4m3_code(magnitude) | sign << 7


@needs_triton
def test_the_fp8_kernel_is_chosen_by_environment_and_named_per_precision(monkeypatch):
    import torch

    from xstage_bench.megamoe.runner import TL_KERNEL, kernels_that_ran
    from xstage_kernels import megamoe

    monkeypatch.delenv(megamoe.FP8_KERNEL_ENV, raising=False)
    assert megamoe.fp8_kernel() == "ws"
    ran = kernels_that_ran(megamoe, "cuda")
    assert ran["bf16"] == TL_KERNEL
    assert ran["w8a8"]["kernel"] == ran["w4a8"]["kernel"] == "ws"
    assert (ran["w8a8"]["stages"], ran["w4a8"]["stages"]) == (6, 4)
    # the interpreter runs tl, and a CPU tensor never reaches the Gluon kernel
    assert all(r == TL_KERNEL for r in kernels_that_ran(megamoe, "cpu").values())
    assert not megamoe.uses_ws_kernel("w4a8", torch.empty(4, dtype=torch.float8_e4m3fn))
    monkeypatch.setenv(megamoe.FP8_KERNEL_ENV, "tl")
    assert all(r == TL_KERNEL for r in kernels_that_ran(megamoe, "cuda").values())
    monkeypatch.setenv(megamoe.FP8_KERNEL_ENV, "cutlass")
    with pytest.raises(ValueError, match="XSTAGE_MOE_FP8_KERNEL='cutlass'"):
        megamoe.fp8_kernel()
    with pytest.raises(ValueError, match="not 'bf16'"):
        from xstage_kernels import megamoe_ws

        megamoe_ws.stages("bf16")


@needs_triton
def test_a_kernel_change_at_one_precision_makes_only_its_points_stale(monkeypatch):
    """The committed reference sweep's config against the same with one precision's kernel
    changed, and against the format written before per-precision records (only W8A8's kernel
    named, under kernel.w8a8): only the points at the changed precision are stale, ours and
    the baselines' (timed again beside ours, so that ours over a baseline is one run's)."""
    from pathlib import Path

    from xstage_bench.megamoe.runner import TL_KERNEL, kernel_refresh, kernels_that_ran
    from xstage_kernels import megamoe

    monkeypatch.delenv(megamoe.FP8_KERNEL_ENV, raising=False)
    raw = Path(__file__).parents[1] / "results" / "ref-h200x2" / "raw" / "megamoe.json"
    config = json.loads(raw.read_text())["config"]
    config["kernel"]["ran"] = kernels_that_ran(megamoe, "cuda")
    changed = json.loads(json.dumps(config))
    changed["kernel"]["ran"]["w4a8"]["stages"] += 1
    older = json.loads(json.dumps(config))  # W4A8 ran tl then
    older["kernel"]["w8a8"] = older["kernel"].pop("ran")["w8a8"]
    point = {"precision": "w4a8", "shape": "s"}
    for previous in (changed, older):
        refresh = kernel_refresh(previous, config)
        assert refresh is not None and "w4a8" in refresh.reason and "w8a8" not in refresh.reason
        assert refresh.stale(point) and refresh.stale({**point, "variant": "interleaved"})
        assert not refresh.stale({**point, "precision": "w8a8"})
        for baseline in ("unfused", "deepgemm", "flashinfer", "gemm_ceiling"):
            assert refresh.stale({**point, "variant": baseline})
            assert not refresh.stale({**point, "variant": baseline, "precision": "w8a8"})
    older["kernel"]["w8a8"] = TL_KERNEL  # W8A8 on tl then as well: both stale
    assert "w4a8, w8a8" in kernel_refresh(older, config).reason
    # Nothing changed, or something besides the kernel: no refresh (a full rerun).
    assert kernel_refresh(config, config) is None
    assert kernel_refresh(changed, {**config, "world_size": 4}) is None


@needs_triton
@pytest.mark.parametrize("precision", ["w8a8", "w4a8"])
def test_a_warpgroup_of_padding_rows_releases_its_slots_without_an_mma(precision):
    """The padding skip adds a path with no MMA: the same wgmma instructions, and more slot
    waits and releases (the skip's own loop) than the build that computes every half."""
    call = "kernels.compile_for_sm90(precision={!r}, skip_padding={})"
    counts = {"try_wait": r"mbarrier\.try_wait", **PATTERNS}
    skip = sm90.compiled("megamoe_ws", call.format(precision, True), counts)
    full = sm90.compiled("megamoe_ws", call.format(precision, False), counts)
    assert skip["wgmma"] == full["wgmma"] > 0
    assert skip["mbarrier_arrive"] > full["mbarrier_arrive"]
    assert skip["try_wait"] > full["try_wait"]


@needs_triton
def test_the_padding_skip_is_named_in_the_raw_config_and_makes_our_points_stale(monkeypatch):
    """What a launch reads is what the raw config records (kernel.ran), so a rerun after the
    skip is turned on or off re-measures our kernel's points of both FP8 precisions."""
    from xstage_bench.megamoe.runner import kernel_refresh, kernels_that_ran
    from xstage_kernels import megamoe, megamoe_ws

    monkeypatch.delenv(megamoe.FP8_KERNEL_ENV, raising=False)
    monkeypatch.setattr(megamoe_ws, "TILE_MAJOR_WEIGHTS", False)
    monkeypatch.setattr(megamoe_ws, "PREFETCH_TILE", False)
    monkeypatch.setattr(megamoe_ws, "ROW_BOX_MIN", megamoe_ws.BLOCK)
    monkeypatch.setattr(megamoe_ws, "GATE_BF16", False)
    monkeypatch.setattr(megamoe_ws, "SPLIT_CONVERTED", False)
    monkeypatch.setattr(megamoe_ws, "CONVERT_ROWS", 32)
    monkeypatch.setattr(megamoe_ws, "CLAIM_RELAXED", False)
    monkeypatch.setattr(megamoe_ws, "SWIGLU_TANH", False)
    monkeypatch.setattr(megamoe_ws, "SCALES_TMA", False)
    monkeypatch.setattr(megamoe_ws, "DROP_WAIT_BARRIERS", False)
    device = {"device_interleaved": "counted from the layout"}  # named in every record
    assert megamoe_ws.launch_options("w8a8") == {"padding_halves": "skipped", **device}
    skipped = {"kernel": {"ran": kernels_that_ran(megamoe, "cuda")}}
    monkeypatch.setattr(megamoe_ws, "SKIP_PADDING_HALVES", False)
    assert megamoe_ws.launch_options("w4a8") == {"padding_halves": "computed", **device}
    computed = {"kernel": {"ran": kernels_that_ran(megamoe, "cuda")}}
    for precision in ("w8a8", "w4a8"):
        assert computed["kernel"]["ran"][precision]["padding_halves"] == "computed"
        assert skipped["kernel"]["ran"][precision]["padding_halves"] == "skipped"
    refresh = kernel_refresh(computed, skipped)
    assert refresh is not None and "w4a8, w8a8" in refresh.reason
    assert refresh.stale({"precision": "w8a8"}) and refresh.stale({"precision": "w4a8"})
    assert refresh.stale({"precision": "w8a8", "variant": "gemm_ceiling"})  # timed beside ours
    assert not refresh.stale({"precision": "bf16", "variant": "gemm_ceiling"})
    # Tile-major weights are named only when in force, so records before the option match.
    monkeypatch.setattr(megamoe_ws, "TILE_MAJOR_WEIGHTS", True)
    assert megamoe_ws.launch_options("w8a8")["weight_layout"] == "tile-major"
    tiles = {"kernel": {"ran": kernels_that_ran(megamoe, "cuda")}}
    assert kernel_refresh(computed, tiles).stale({"precision": "w8a8"})


@needs_triton
def test_the_measuring_rules_kernel_stamp_follows_the_launch_options(monkeypatch):
    """measure.kernel_stamp, the measuring jobs' `kernels` param, names what the raw config
    records of our kernels, so a launch option's change reruns the jobs that run them."""
    from xstage_bench.attention import raw_config
    from xstage_bench.measure import kernel_stamp
    from xstage_kernels import flash_ws, megamoe, megamoe_ws

    monkeypatch.delenv(megamoe.FP8_KERNEL_ENV, raising=False)
    kernel_stamp.cache_clear()
    before = {e: kernel_stamp(e) for e in ("megamoe", "attention", "microbench")}
    assert json.loads(before["megamoe"])["w4a8"]["weight_packing"].startswith("word-split")
    assert json.loads(before["attention"]) == raw_config.kernels_that_ran("cuda")
    assert json.loads(before["attention"])["triton"]["launch_options"] == flash_ws.launch_options()
    assert before["microbench"] == ""
    monkeypatch.setattr(megamoe_ws, "ROW_BOX_MIN", megamoe_ws.BLOCK)
    monkeypatch.setattr(flash_ws, "OVERLAP", 1 - flash_ws.OVERLAP)
    kernel_stamp.cache_clear()
    assert kernel_stamp("megamoe") != before["megamoe"]
    assert kernel_stamp("attention") != before["attention"]
    kernel_stamp.cache_clear()


@needs_triton
def test_a_relaxed_claim_changes_the_claims_atomic_alone(monkeypatch):
    """CLAIM_RELAXED: the producer's claim of its next tile is a relaxed atomic; the
    row-block poll keeps its acquire and the intermediate's release stays; both builds'
    records name the claim."""
    from xstage_kernels import megamoe_ws

    patterns = {
        **PATTERNS,
        "acq_rel_claim": r"atom\.global\.gpu\.acq_rel\.add",
        "relaxed_claim": r"atom\.global\.gpu\.relaxed\.add",
        "acquire_poll": r"ld\.global\.gpu\.acquire",
    }
    plain, relaxed = _builds("claim_relaxed", patterns)
    assert (plain["acq_rel_claim"], plain["relaxed_claim"]) == (1, 0)
    assert (relaxed["acq_rel_claim"], relaxed["relaxed_claim"]) == (0, 1)
    for name in ("acquire_poll", "release_add", "wgmma", "tma_loads", "shared"):
        assert relaxed[name] == plain[name] > 0, name
    monkeypatch.setattr(megamoe_ws, "CLAIM_RELAXED", True)
    for precision in megamoe_ws.PRECISIONS:
        assert megamoe_ws.launch_options(precision)["tile_claim"] == "relaxed"


@needs_triton
def test_swiglu_through_tanh_replaces_the_exp_and_the_division(monkeypatch):
    """SWIGLU_TANH: the Linear-1 epilogue's sigmoid is one tanh.approx a value, with no exp
    (ex2) and no division left in the kernel; the MMAs are those of the exact build."""
    from xstage_kernels import megamoe_ws

    patterns = {
        **PATTERNS,
        "tanh": r"tanh\.approx\.f32",
        "ex2": r"ex2\.approx",
        "division": r"div\.(full|rn|approx)\.f32",
    }
    exact, tanh = _builds("swiglu_tanh", patterns)
    assert exact["tanh"] == 0 and exact["ex2"] > 0 and exact["division"] > 0
    assert tanh["tanh"] > 0 and tanh["ex2"] == 0
    assert tanh["division"] < exact["division"]  # the row scales' divisions stay
    assert tanh["wgmma"] == exact["wgmma"] > 0
    monkeypatch.setattr(megamoe_ws, "SWIGLU_TANH", True)
    for precision in megamoe_ws.PRECISIONS:
        assert megamoe_ws.launch_options(precision)["swiglu_sigmoid"] == "tanh.approx"


@needs_triton
def test_scales_through_the_slots_leave_the_step_loops_one_global_load(monkeypatch):
    """SCALES_TMA: each step's activation scales come with the slot (one more TMA load a
    step, read from shared memory), so the math warpgroups' step loops load only the weight
    scale from global memory; the MMAs are those of the plain build."""
    from xstage_kernels import megamoe_ws

    patterns = {**GLOBAL_LOADS, "shared_loads": r"ld\.shared\.b32"}
    plain, slots = _builds("scales_tma", patterns)
    assert slots["tma_loads"] > plain["tma_loads"] > 0
    assert slots["global_loads"] < plain["global_loads"]
    assert slots["shared_loads"] > plain["shared_loads"]
    assert slots["wgmma"] == plain["wgmma"] > 0
    assert slots["shared"] - plain["shared"] == megamoe_ws.STAGES * 4 * megamoe_ws.BLOCK
    monkeypatch.setattr(megamoe_ws, "SCALES_TMA", True)
    for precision in megamoe_ws.PRECISIONS:
        assert "TMA" in megamoe_ws.launch_options(precision)["step_scales"]


@needs_triton
def test_the_scale_descriptors_read_a_steps_scales_of_a_row_block():
    """x's scales step-major (a step's 128 rows consecutive) and the intermediate's buffer
    read as [I / 128, rows], each in [1, 128] boxes."""
    import torch

    from xstage_kernels import megamoe_ws
    from xstage_kernels.formats import step_major

    rows, I = 256, 384  # noqa: E741
    xs = torch.arange(rows * 3, dtype=torch.float32).view(rows, 3)
    steps = step_major(xs)
    assert steps.shape == (3, rows) and steps.is_contiguous()
    assert torch.equal(steps[1, :5], xs[:5, 1])
    hs = torch.zeros(rows, I // megamoe_ws.BLOCK)
    x_desc, h_desc = megamoe_ws.scale_descriptors(steps, hs, I=I, rows=rows)
    assert list(x_desc.shape) == [3, rows] and list(x_desc.block_shape) == [1, 128]
    assert list(h_desc.shape) == [I // 128, rows] and list(h_desc.strides) == [rows, 1]
    assert h_desc.base.data_ptr() == hs.data_ptr()


def test_the_serialization_check_reads_ptxas_notes():
    """sm90.serialized finds ptxas's notes that it made a kernel's MMAs wait for each other
    (as ptxas 13.0 printed them for a build that carried an MMA across a loop's back edge),
    and nothing in its usual report."""
    notes = [
        "ptxas info    : (C7517) warpgroup.wait is injected in around line 3900 by compiler to "
        "allow use of registers defined by GMMA in function '_mma_rate'",
        "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
        "serialized due to non wgmma instructions reading accumulator registers of  a wgmma "
        "between start and end of the pipeline stage in the function '_mma_rate'",
    ]
    usual = [
        "ptxas info    : Compiling entry function '_fused_moe_ws' for 'sm_90a'",
        "ptxas info    : Used 168 registers, used 3 barriers",
    ]
    assert sm90.serialized("\n".join(usual + notes)) == notes
    assert sm90.serialized("\n".join(usual)) == []


@needs_triton
@pytest.mark.parametrize("precision", ["w8a8", "w4a8"])
def test_the_launched_builds_keep_their_mmas_asynchronous(precision):
    """ptxas serializes every MMA of a kernel when it cannot prove an accumulator free (an
    MMA left in flight across a loop's back edge, its registers read or copied before its
    wait): the builds a launch runs must not trip it."""
    report = sm90.ptxas_report("megamoe_ws", f"kernels.launched_build({precision!r})")
    assert "_fused_moe_ws" in report and re.search(r"Used \d+ registers", report), report
    assert sm90.serialized(report) == []


# A warpgroup barrier right before an mbarrier wait's poll loop (comment lines between).
BARRIER_BEFORE_WAIT = (
    r"bar\.sync\s+\d+,\s*128;(?:\s*//[^\n]*)*\s*\{\s*\.reg \.pred complete;\s*waitLoop:\s*"
    r"mbarrier\.try_wait"
)


@needs_triton
def test_w8a8_builds_drop_the_barriers_before_their_waits_and_w4a8_keeps_them(monkeypatch):
    """DROP_WAIT_BARRIERS: the W8A8 build's PTX carries the edit's mark and has no
    warpgroup barrier left before an mbarrier wait (Triton's build has one before each of
    its math warpgroups' waits), its MMAs and its other barriers as before; W4A8's build is
    not edited. Both builds' records say which."""
    from xstage_kernels import megamoe_ws
    from xstage_kernels.ptx_edits import DROP_WAIT_BARRIERS_MARK

    patterns = {
        **PATTERNS,
        "mark": re.escape(DROP_WAIT_BARRIERS_MARK),
        "barrier_before_wait": BARRIER_BEFORE_WAIT,
        "barriers": r"bar\.sync\s+\d+,\s*128;",
    }
    triton_s, dropped = _builds("drop_wait_barriers", patterns)
    assert (triton_s["mark"], dropped["mark"]) == (0, 1)
    assert triton_s["barrier_before_wait"] >= 12 and dropped["barrier_before_wait"] == 0
    assert dropped["barriers"] == triton_s["barriers"] - triton_s["barrier_before_wait"]
    for name in ("wgmma", "wgmma_wait", "mbarrier_arrive", "tma_loads", "shared"):
        assert dropped[name] == triton_s[name] > 0, name
    w4 = sm90.compiled("megamoe_ws", "kernels.launched_build('w4a8')", patterns)
    assert w4["mark"] == 0 and w4["barrier_before_wait"] > 0
    monkeypatch.setattr(megamoe_ws, "DROP_WAIT_BARRIERS", True)
    monkeypatch.setattr(megamoe_ws, "W4_DROP_WAIT_BARRIERS", False)  # W4A8's own edit
    assert "wait_barriers" in megamoe_ws.launch_options("w8a8")
    assert "wait_barriers" not in megamoe_ws.launch_options("w4a8")


# A warpgroup barrier right before an mbarrier wait, by its named barrier (group 1).
BARRIER_ID_BEFORE_WAIT = BARRIER_BEFORE_WAIT.replace(r"bar\.sync\s+\d+,", r"bar\.sync\s+(\d+),")


@needs_triton
def test_w4a8_drops_the_barriers_before_its_math_warpgroups_waits_only(monkeypatch):
    """W4_DROP_WAIT_BARRIERS (pending its A/B): the W4A8 build drops the barrier before each
    wait of its math warpgroups (Triton's named barriers 0 and 2) and keeps its converters'
    (the diagnostic that dropped those too was slower); its record says so."""
    from xstage_kernels import megamoe_ws
    from xstage_kernels.ptx_edits import DROP_MATH_WAIT_BARRIERS_MARK

    call = "kernels.compile_for_sm90(precision='w4a8', drop_wait_barriers={})"
    ptx = {on: sm90.compiled_ptx("megamoe_ws", call.format(on)) for on in (False, True)}
    before = {on: re.findall(BARRIER_ID_BEFORE_WAIT, ptx[on]) for on in (False, True)}
    assert sorted(set(before[False])) == ["0", "2", "3", "4"], before[False]
    assert sorted(set(before[True])) == ["3", "4"] and len(before[True]) == 4, before[True]
    assert (
        DROP_MATH_WAIT_BARRIERS_MARK in ptx[True] and DROP_MATH_WAIT_BARRIERS_MARK not in ptx[False]
    )
    for pattern in (PATTERNS["wgmma"], PATTERNS["prmt"], PATTERNS["tma_loads"]):
        assert len(re.findall(pattern, ptx[True])) == len(re.findall(pattern, ptx[False])) > 0
    monkeypatch.setattr(megamoe_ws, "W4_DROP_WAIT_BARRIERS", True)
    assert megamoe_ws.launch_options("w4a8")["wait_barriers"] == (
        "dropped from the PTX in the math warpgroups (ptx_edits)"
    )


@needs_triton
@pytest.mark.parametrize(("capability", "ws"), [((9, 0), True), ((10, 0), False), ((8, 0), False)])
def test_only_a_hopper_gpu_runs_the_warp_specialized_kernels(monkeypatch, capability, ws):
    """wgmma is Hopper's alone: on a B200 (sm_100) our FP8 MegaMoE and attention run the
    plain Triton kernels, and the raw files name those as the kernels that ran (a B200
    once got the Hopper kernels, which cannot run there)."""
    from types import SimpleNamespace

    import torch

    from xstage_bench.attention.raw_config import kernels_that_ran as attention_ran
    from xstage_bench.megamoe.runner import kernels_that_ran
    from xstage_kernels import megamoe

    monkeypatch.delenv(megamoe.FP8_KERNEL_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    on_gpu = SimpleNamespace(device=torch.device("cuda", 0))
    assert megamoe.uses_ws_kernel("w8a8", on_gpu) is ws
    ran = kernels_that_ran(megamoe, "cuda")
    assert (ran["w8a8"]["kernel"], ran["w4a8"]["kernel"]) == (("ws", "ws") if ws else ("tl", "tl"))
    assert attention_ran("cuda")["triton"]["kernel"] == ("ws" if ws else "tl")
