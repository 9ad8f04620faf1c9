"""The fused MoE on the CPU: formats, routing, dispatch layout, schedules, trace decoding,
and the Triton kernel itself under the interpreter.

The format, routing, schedule and trace tests need only numpy. The torch-side formats and
the kernel need torch and triton (skipped otherwise, as in CI). Under TRITON_INTERPRET=1
the kernel runs its programs one after another, so the spin-waits never spin; the GPU
run checks those. The interpreter's float -> FP8 conversion loses the carry when the
mantissa rounds up into the next power of two (126.7 becomes 64, not 128) and flushes
FP8 subnormals, which alone costs ~5% relative error on the intermediate; the kernel
test therefore holds the interpreter to a looser tolerance than the GPU check
(reference.TOLERANCE), still far below the ~100% of a wrong row, expert or scale.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import fixtures
import numpy as np
import pytest

from xstage_bench.megamoe import quant, reference, routing, schedule
from xstage_bench.megamoe.baselines import deepgemm, flashinfer, unfused
from xstage_bench.megamoe.ours.summary import linear2_waits, print_summary, trace_summary
from xstage_bench.megamoe.points import (
    config_id,
    expand_points,
    expand_schedules,
    select,
    trace_points,
)

interpreted_kernel = fixtures.interpreted_kernel  # the fixture, taken by name

HAVE_TORCH_TRITON = all(importlib.util.find_spec(m) for m in ("torch", "triton"))
needs_torch = pytest.mark.skipif(not HAVE_TORCH_TRITON, reason="torch and triton not installed")
INTERPRETER_TOLERANCE = reference.INTERPRETER_TOLERANCE


def _point(**kw) -> dict:
    p = {
        "shape": "tiny",
        "H": 256,
        "I": 256,
        "E": 8,
        "topk": 2,
        "precision": "w8a8",
        "routing": "balanced",
        "tokens_per_rank": 64,
        "world_size": 2,
    }
    p.update(kw)
    return p


# ---- formats -----------------------------------------------------------------------


def test_e4m3_rounding_grid_saturation_subnormals_and_ties():
    x = np.array([1.0, 1.0625, 1.1875, 126.7, 447.0, 500.0, -3e4, 3 * 2.0**-9, 2.0**-10, 0.0])
    got = quant.e4m3_round(x)
    # 1.0625 is a tie between 1.0 and 1.125 (even mantissa: 1.0); 1.1875 ties up to 1.25;
    # 126.7 rounds up into the next binade; past 448 saturates; 2^-10 is half a subnormal step.
    want = [1.0, 1.0, 1.25, 128.0, 448.0, 448.0, -448.0, 3 * 2.0**-9, 0.0, 0.0]
    np.testing.assert_array_equal(got, np.array(want, dtype=np.float32))


def test_bf16_rounding_keeps_8_significant_bits():
    x = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.14159], dtype=np.float32)
    np.testing.assert_array_equal(
        quant.bf16_round(x), np.array([1.0, 1.0 + 2.0**-6, 3.140625], dtype=np.float32)
    )


def test_row_quantization_round_trip_is_within_half_an_fp8_step():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 384)).astype(np.float32) * np.logspace(-3, 3, 16)[:, None]
    values, scales = quant.quantize_rows_np(x)
    assert scales.shape == (16, 3)
    assert np.abs(values).max() <= quant.FP8_MAX
    assert np.all(np.abs(values).reshape(16, 3, 128).max(-1) == quant.FP8_MAX)  # amax maps to 448
    err = np.abs(quant.dequantize_rows_np(values, scales) - x)
    # half a step of e4m3 (3 mantissa bits) relative, or half a subnormal step of the scale
    bound = np.maximum(np.abs(x) / 16, np.repeat(scales, 128, axis=1) * 2.0**-10)
    assert np.all(err <= bound * 1.0001)


def test_int4_word_split_packing_layout_and_round_trip():
    rng = np.random.default_rng(2)
    w = rng.integers(-7, 8, size=(3, 256))
    packed = quant.pack_int4_np(w)
    assert packed.shape == (3, 128) and packed.dtype == np.uint8

    # word w of block b: channel i of half h has its magnitude at bit 16 h + 4 i, its sign
    # at bit 8 i + 7 - 4 h
    for b, word in ((0, 0), (1, 5), (1, 15)):
        value = int.from_bytes(
            packed[0, 64 * b + 4 * word : 64 * b + 4 * word + 4].tobytes(), "little"
        )
        for h in range(2):
            for i in range(4):
                magnitude = value >> (16 * h + 4 * i) & 7
                negative = value >> (8 * i + 7 - 4 * h) & 1
                expected = w[0, 128 * b + 64 * h + 4 * word + i]
                assert (-magnitude if negative else magnitude) == expected
    np.testing.assert_array_equal(quant.unpack_int4_np(packed), w)
    for out_of_range in (8, -8):
        with pytest.raises(ValueError, match=r"int4 weights must lie in \[-7, 7\]"):
            quant.pack_int4_np(np.full((1, 128), out_of_range))


@needs_torch
def test_torch_formats_agree_with_the_numpy_specification():
    import torch

    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 256)).astype(np.float32) * 7
    values, scales = quant.quantize_rows(torch.from_numpy(x))
    v_np, s_np = quant.quantize_rows_np(x)
    np.testing.assert_allclose(scales.numpy(), s_np, rtol=1e-7)
    np.testing.assert_array_equal(values.float().numpy(), v_np)
    w = rng.integers(-7, 8, size=(2, 128, 256))
    packed = quant.pack_int4(torch.from_numpy(w).to(torch.int8))
    np.testing.assert_array_equal(packed[1].numpy(), quant.pack_int4_np(w[1]))
    np.testing.assert_array_equal(quant.unpack_int4(packed).numpy(), w)
    s = torch.rand(1, 2) + 0.5
    deq = quant.dequantize_weight(packed[0], s, "w4a8")
    np.testing.assert_allclose(deq.numpy(), w[0] * quant.block_scales_expand_np(s.numpy()))


# ---- routing and dispatch -------------------------------------------------------------


def test_balanced_routing_spreads_rows_evenly_with_distinct_experts():
    p = _point(E=16, topk=4, tokens_per_rank=100)
    ids = [routing.route(p, 1.2, r)[0] for r in range(2)]
    for i in ids:
        assert all(len(set(row)) == 4 for row in i.tolist())
        counts = np.bincount(i.ravel(), minlength=16)
        assert counts.max() - counts.min() <= 1
    assert np.bincount(np.concatenate([i.ravel() for i in ids]), minlength=16).sum() == 800


def test_skewed_routing_is_seeded_heavy_tailed_and_precision_independent():
    p = _point(E=64, topk=4, tokens_per_rank=2000, routing="skewed")
    ids_a, w_a = routing.route(p, 1.2, 0)
    ids_b, w_b = routing.route({**p, "precision": "w4a8"}, 1.2, 0)
    np.testing.assert_array_equal(ids_a, ids_b)
    np.testing.assert_array_equal(w_a, w_b)
    assert not np.array_equal(ids_a, routing.route(p, 1.2, 0, seed=1)[0])
    assert all(len(set(row)) == 4 for row in ids_a.tolist())
    counts = np.sort(np.bincount(ids_a.ravel(), minlength=64))[::-1]
    assert counts[0] > 4 * counts.mean()  # Zipf(1.2): a few hot experts
    assert counts[0] <= 2000  # each token picks an expert at most once
    # the same experts are hot on every home rank
    other = np.bincount(routing.route(p, 1.2, 1)[0].ravel(), minlength=64)
    assert np.argmax(other) == np.argmax(np.bincount(ids_a.ravel(), minlength=64))
    np.testing.assert_allclose(w_a.sum(axis=1), 1.0, atol=2e-2)
    np.testing.assert_array_equal(quant.bf16_round(w_a), w_a)


def test_dispatch_plan_places_every_row_once_in_padded_expert_blocks():
    p = _point(E=8, topk=3, tokens_per_rank=90, routing="skewed")
    ids = [routing.route(p, 1.2, r)[0] for r in range(2)]
    plans = routing.dispatch_plan(ids, 8, block_m=16)
    seen = set()
    for q, plan in enumerate(plans):
        assert plan.padded_rows % 16 == 0 and plan.padded_rows == 16 * plan.blocks
        assert plan.rows == int(plan.block_rows.sum()) == int((plan.home >= 0).sum())
        for row in np.flatnonzero(plan.home >= 0):
            home, t, slot = int(plan.home[row]), int(plan.token[row]), int(plan.slot[row])
            k = slot - t * 3
            g = int(ids[home][t, k])
            assert g // 4 == q and g % 4 == plan.block_expert[row // 16]
            seen.add((home, t, k))
        assert plan.remote_rows() == int(((plan.home >= 0) & (plan.home != q)).sum())
    assert len(seen) == 2 * 90 * 3


# ---- schedules ------------------------------------------------------------------------


def _grid(rows_per_expert, l1=4, l2=6, block_m=128) -> schedule.TileGrid:
    blocks = [
        (e, min(block_m, r - s))
        for e, r in enumerate(rows_per_expert)
        for s in range(0, r, block_m)
    ]
    return schedule.TileGrid(
        np.array([b[0] for b in blocks]), np.array([b[1] for b in blocks]), l1, l2
    )


@pytest.mark.parametrize("name", sorted(schedule.SCHEDULES))
@pytest.mark.parametrize("seed", range(4))
def test_every_schedule_lists_each_tile_once_after_its_dependencies(name, seed):
    rng = np.random.default_rng(seed)
    g = _grid(rng.integers(0, 700, size=rng.integers(1, 12)).tolist() + [5])
    tiles = schedule.build(name, g, int(rng.integers(1, 40)), {"lead_rows": 256})
    assert len(tiles) == g.tiles and tiles.dtype == np.int32
    schedule.check_dependencies(tiles, g)  # build checked it; check the checker holds too


def test_schedules_are_registered_once_with_their_own_knobs():
    """The config schema names exactly the registered schedules, and every knob is a key of
    the config's megamoe section; a schedule takes only its own knobs."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    config = json.loads((root / "src/xstage_bench/data/schemas/config.schema.json").read_text())
    moe = config["properties"]["megamoe"]
    assert moe["properties"]["schedules"]["items"]["enum"] == list(schedule.SCHEDULES)
    for s in schedule.SCHEDULES.values():
        assert set(s.knobs) <= set(moe["required"]) & set(moe["properties"]), s.name
    assert set(schedule.COMPARED) <= set(schedule.SCHEDULES)
    assert schedule.knobs("expert_wave", {"lead_rows": 256, "block_m": 128}) == {}
    assert schedule.knobs("interleaved", {"lead_rows": 256, "block_m": 128}) == {"lead_rows": 256}
    assert schedule.knobs("interleaved") == {"lead_rows": 0}
    with pytest.raises(ValueError, match="lead_rows must be >= 0"):
        schedule.build("interleaved", _grid([100]), 8, {"lead_rows": -1})


def test_dependency_check_rejects_an_early_linear2_tile_and_a_duplicate():
    g = _grid([100])  # one row block
    tiles = schedule.build("expert_wave", g, 8)
    first_l2 = int(np.flatnonzero(tiles[:, 0] == schedule.L2)[0])
    swapped = tiles.copy()
    swapped[[first_l2 - 1, first_l2]] = swapped[[first_l2, first_l2 - 1]]
    with pytest.raises(schedule.ScheduleError, match="before its Linear-1"):
        schedule.check_dependencies(swapped, g)
    with pytest.raises(schedule.ScheduleError, match="twice"):
        schedule.check_dependencies(np.vstack([tiles, tiles[:1]]), g)


def test_expert_waves_fill_every_program_before_their_linear2_tiles():
    g = _grid([128] * 12, l1=4, l2=6)  # one block per expert: 4 L1 tiles per expert
    tiles = schedule.expert_wave(g, num_programs=10)
    kinds = tiles[:, 0].tolist()
    # a wave is the smallest number of experts with >= 10 L1 tiles: 3 experts, 12 tiles
    assert kinds[:12] == [schedule.L1] * 12 and kinds[12:30] == [schedule.L2] * 18
    assert set(tiles[:30, 1].tolist()) == {0, 1, 2}


def test_interleaving_mixes_the_gemms_and_keeps_its_row_lead():
    g = _grid([640] * 8, l1=4, l2=6)  # 40 blocks
    lead, programs = 384, 16
    tiles = schedule.interleaved(g, num_programs=programs, lead_rows=lead)
    kinds = tiles[:, 0]
    last_l1 = int(np.flatnonzero(kinds == schedule.L1)[-1])
    assert int(np.flatnonzero(kinds == schedule.L2)[0]) < last_l1 // 2  # not one wave per GEMM
    row_end = g.row_end()
    l1_rows = 0
    for i, (kind, _, block, n) in enumerate(tiles.tolist()):
        if kind == schedule.L1 and n == g.l1_per_block - 1:
            l1_rows = int(row_end[block])  # rows whose Linear-1 tiles are all listed
        if kind == schedule.L2 and n == 0 and i < last_l1:
            assert l1_rows - row_end[block] >= lead
    _, wait = schedule.play(tiles, g, programs)
    assert not wait[:last_l1].any()  # no Linear-2 tile waits on its inputs before the tail
    wave = schedule.expert_wave(g, programs)
    assert sorted(map(tuple, wave.tolist())) == sorted(map(tuple, tiles.tolist()))


@pytest.mark.parametrize("H,I", [(4096, 2048), (4096, 1024), (1408, 5632)])
def test_interleaving_never_waits_on_itself_when_tile_lengths_differ(H, I):  # noqa: E741
    """DeepSeek-V4-Flash (an L1 tile lasts 4 L2 tiles), Qwen3.5 (8) and DiT-MoE (0.5): 768
    row blocks on 132 programs, the kernel's sizes. Playing the list with compute only,
    interleaving must not wait before its tail and must finish within 2% of expert waves;
    counting list entries ("a round of programs earlier") waited on the first two."""
    g = _grid([128 * 24] * 32, l1=I // 128, l2=H // 128)
    programs = 132
    inter = schedule.build("interleaved", g, programs, {"lead_rows": 256})
    wave = schedule.build("expert_wave", g, programs, {"lead_rows": 256})
    l1_cost, l2_cost = schedule.tile_costs(g)
    assert l1_cost / l2_cost == pytest.approx(2 * H / I)

    def makespan(tiles):
        start, wait = schedule.play(tiles, g, programs)
        cost = np.where(tiles[:, 0] == schedule.L1, l1_cost, l2_cost)
        return (start + cost).max(), wait

    inter_end, inter_wait = makespan(inter)
    wave_end, _ = makespan(wave)
    last_l1 = int(np.flatnonzero(inter[:, 0] == schedule.L1)[-1])
    assert not inter_wait[:last_l1].any()
    assert inter_end <= 1.02 * wave_end


# ---- runner pieces ----------------------------------------------------------------------


def test_points_expand_per_schedule_and_trace_picks_skewed_w8a8_fewest_tokens():
    configs = [
        {
            "id": f"s/{pr}/{r}/T={t}/P=2",
            "shape": "s",
            "precision": pr,
            "routing": r,
            "tokens_per_rank": t,
        }
        for pr in ("w4a8", "w8a8")
        for r in ("balanced", "skewed")
        for t in (1024, 4096)
    ]
    pts = expand_schedules(configs, ["expert_wave", "interleaved"])
    assert len(pts) == 16 and pts[1]["id"] == "s/w4a8/balanced/T=1024/P=2/interleaved"
    traced = trace_points(configs)
    assert [p["variant"] for p in traced] == ["expert_wave", "interleaved", "local_control"]
    assert {p["id"].rsplit("/", 1)[0] for p in traced} == {"s/w8a8/skewed/T=1024/P=2"}
    assert traced[2]["schedule"] == "expert_wave"


def test_select_restricts_the_grid_and_names_an_unknown_shape():
    moe = {
        "shapes": [{"name": "a"}, {"name": "b"}],
        "precisions": ["w8a8"],
        "routings": ["skewed"],
        "tokens_per_rank": [1024],
    }
    got = select(moe, shapes=["b"], precisions=["bf16"], tokens=["16"])
    assert got["shapes"] == [{"name": "b"}] and got["precisions"] == ["bf16"]
    assert got["tokens_per_rank"] == [16] and moe["precisions"] == ["w8a8"]
    with pytest.raises(ValueError, match="'c'"):
        select(moe, shapes=["c"])


def test_variants_expand_per_configuration_with_stable_ids():
    configs = [{"id": f"s/w8a8/skewed/T={t}/P=2", "precision": "w8a8"} for t in (1024, 4096)]
    moe = {"schedules": ["expert_wave", "interleaved"]}  # no variants key: all three
    pts = expand_points(configs, moe)
    ids = [p["id"] for p in pts[:5]]
    assert ids == [
        "s/w8a8/skewed/T=1024/P=2/expert_wave",  # ours: ids unchanged, no variant key
        "s/w8a8/skewed/T=1024/P=2/interleaved",
        "s/w8a8/skewed/T=1024/P=2/unfused",
        "s/w8a8/skewed/T=1024/P=2/deepgemm/expert_wave",
        "s/w8a8/skewed/T=1024/P=2/deepgemm/interleaved",
    ]
    assert "variant" not in pts[0] and pts[2]["variant"] == "unfused"
    assert {config_id(p) for p in pts[:5]} == {"s/w8a8/skewed/T=1024/P=2"}
    only = expand_points(configs, {**moe, "variants": ["deepgemm"]})
    assert [p["schedule"] for p in only] == ["expert_wave", "interleaved"] * 2
    with pytest.raises(ValueError, match="'cutlass'"):
        expand_points(configs, {**moe, "variants": ["ours", "cutlass"]})
    assert select({"shapes": []}, variants=["ours"])["variants"] == ["ours"]


def test_flashinfer_runs_once_per_configuration_at_natural_routing_only():
    configs = [
        {"id": "s/w8a8/balanced/T=1024/P=2", "precision": "w8a8"},
        {"id": "s/w8a8/balanced/T=1024/P=2/f=0.875", "precision": "w8a8", "remote_fraction": 0.875},
    ]
    moe = {"schedules": ["expert_wave", "interleaved"], "variants": ["ours", "flashinfer"]}
    pts = expand_points(configs, moe)
    fi = [p for p in pts if p.get("variant") == "flashinfer"]
    assert [p["id"] for p in fi] == ["s/w8a8/balanced/T=1024/P=2/flashinfer"]
    assert fi[0]["schedule"] == "flashinfer"
    assert config_id(fi[0]) == "s/w8a8/balanced/T=1024/P=2"
    assert len(pts) == 2 * 2 + 1  # ours' schedules at both fractions


def _flashinfer_baseline(cuda: bool):
    from types import SimpleNamespace

    from xstage_bench.megamoe.baselines.measure import FlashInferBaseline

    measurer = SimpleNamespace(cuda=cuda, devices=["gpu0", "gpu1"], sampler=None)
    return FlashInferBaseline(measurer)


def _fi_point(**kw) -> dict:
    return {**_point(**kw), "variant": "flashinfer", "schedule": "flashinfer", "id": "c/flashinfer"}


def test_flashinfer_without_a_gpu_is_unsupported_at_once_and_starts_no_worker():
    import time

    baseline = _flashinfer_baseline(cuda=False)
    start = time.monotonic()
    record = baseline.measure(_fi_point())
    assert time.monotonic() - start < 5
    assert record["status"] == "unsupported" and record["error"] == flashinfer.NEEDS_GPU
    assert baseline.workers.procs == []
    w4a8 = baseline.measure(_fi_point(precision="w4a8"))
    assert w4a8["status"] == "unsupported" and "FP8 x FP8 only" in w4a8["error"]
    baseline.close()


def test_flashinfer_names_the_missing_packages_and_its_site_variable(tmp_path, monkeypatch):
    import sys

    (tmp_path / "flashinfer" / "moe_ep").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [])
    monkeypatch.setenv(flashinfer.SITE_ENV, str(tmp_path))
    record = _flashinfer_baseline(cuda=True).measure(_fi_point())
    assert record["status"] == "unsupported"
    assert "not importable: nvshmem4py-cu13, cuda-core, nvidia-cutlass-dsl." in record["error"]
    assert "pip install flashinfer-python nvshmem4py-cu13 cuda-core" in record["error"]
    assert flashinfer.SITE_ENV in record["error"]
    for module in ("nvshmem/core", "cuda/core", "cutlass"):
        (tmp_path / module).mkdir(parents=True)
    assert flashinfer.missing_packages() is None
    monkeypatch.setenv(flashinfer.SITE_ENV, str(tmp_path / "nowhere"))
    record = _flashinfer_baseline(cuda=True).measure(_fi_point())
    assert record["status"] == "unsupported" and "nowhere is not a directory" in record["error"]


def test_flashinfer_workers_put_their_site_directories_first(tmp_path, monkeypatch):
    import os
    import sys

    monkeypatch.setattr(sys, "path", ["/usr/lib/python"])
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv(flashinfer.SITE_ENV, os.pathsep.join([str(tmp_path), str(tmp_path)]))
    assert flashinfer.prefer_sites() == [str(tmp_path)] * 2
    assert sys.path[0] == str(tmp_path) and sys.path[-1] == "/usr/lib/python"
    assert os.environ["PYTHONPATH"].split(os.pathsep)[-1] == "/elsewhere"


@needs_torch
def test_flashinfer_gets_our_fp8_activations_back_but_requantizes_the_weights():
    import torch

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(16, 512, generator=gen) * torch.logspace(-3, 3, 16)[:, None]
    values, scales = quant.quantize_rows(x)
    # what FlashInfer stages from the bf16 values we give it: our FP8 bytes, our scales
    again, again_scales = quant.quantize_rows(quant.dequantize_rows(values, scales).bfloat16())
    assert torch.equal(again.view(torch.uint8), values.view(torch.uint8))
    assert torch.allclose(again_scales, scales, rtol=2**-8)
    # our weights: normal FP8 draws (block amax far below 448), gate and up blocks scaled
    # apart; FlashInfer's blocks hold 64 gate and 64 up rows of two of ours
    I, H = 256, 256  # noqa: E741
    w1 = torch.randn(2 * I, H, generator=gen).to(torch.float8_e4m3fn).float()
    w1[:I] *= 0.01
    w2 = torch.randn(H, I, generator=gen).to(torch.float8_e4m3fn).float()
    s1, s2 = flashinfer.stored_weights(w1, w2)
    assert not torch.equal(s1, w1) and not torch.equal(s2, w2)
    assert ((s1 - w1).norm() / w1.norm()) < 0.05 and ((s2 - w2).norm() / w2.norm()) < 0.05
    # what FlashInfer stores it stores again unchanged: the blocks are its own
    t1, t2 = flashinfer.stored_weights(s1, s2)
    assert torch.equal(t1, s1) and torch.equal(t2, s2)
    rows = torch.arange(2 * I, dtype=torch.float32)[:, None].expand(2 * I, 4)
    mixed = flashinfer.interleave_gate_up(rows)
    assert mixed[:16, 0].tolist() == [*range(8), *range(I, I + 8)]
    assert torch.equal(flashinfer.deinterleave_gate_up(mixed), rows)


def test_deepgemm_workers_can_take_torch_from_their_own_site(tmp_path, monkeypatch):
    import sys

    monkeypatch.delenv(deepgemm.SITE_ENV, raising=False)
    assert deepgemm.prefer_site() is None
    monkeypatch.setenv(deepgemm.SITE_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"{deepgemm.SITE_ENV}=.* holds no torch"):
        deepgemm.prefer_site()
    (tmp_path / "torch").mkdir()
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert deepgemm.prefer_site() == str(tmp_path)
    assert sys.path[0] == str(tmp_path)


def test_deepgemm_schedule_is_read_from_its_printed_config_and_fp8_only():
    line = "MegaMoESM90Config(block_m=128, num_experts_per_wave=4, l2_lag_units=4017, x=0)"
    assert deepgemm.schedule_of(line) == "interleaved"  # lag 17 units, group 4 (encoded)
    assert deepgemm.schedule_of("MegaMoESM90Config(l2_lag_units=0)") == "expert_wave"
    assert deepgemm.schedule_of("no config printed") is None
    assert deepgemm.unsupported_reason({"precision": "w8a8"}) is None
    assert "FP8 x FP8 only" in deepgemm.unsupported_reason({"precision": "w4a8"})


def test_exchange_bytes_count_dispatched_rows_with_scales_and_returned_outputs():
    # 2 ranks, 4 experts (2 per rank), top-1: home 0's tokens go to experts 0 and 2
    ids = [np.array([[0], [2], [2]]), np.array([[1], [3]])]
    plans = routing.dispatch_plan(ids, 4, 16)
    H = 256
    fp8_row, out_row = H + 4 * (H // 128), 2 * H
    # rank 0 sends home 0's two rows for expert 2 and returns home 1's row of expert 1
    assert unfused.exchange_bytes(plans, H, "w8a8") == [
        2 * fp8_row + out_row,
        fp8_row + 2 * out_row,
    ]
    assert unfused.exchange_bytes(plans, H, "bf16")[1] == 2 * H + 2 * out_row


def test_summary_prints_baselines_beside_ours_and_their_geomeans(tmp_path, capsys):
    from fixtures import write_megamoe

    from xstage_bench.data import layout

    write_megamoe(tmp_path, [1.25, 0.8] * 4, baselines=True)
    print_summary(tmp_path / layout.MEGAMOE_RAW)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("glm-5.2/w8a8/skewed"))
    assert row.split()[1:6] == ["100.0", "125.0", "200.0", "120.0", "100.0"]
    assert "our best time / unfused best time over 8 configs: geomean 0.447" in out
    assert "our best time / deepgemm best time over 4 configs" in out


def test_trace_summary_turns_stamps_into_spans_and_a_timeline():
    tiles = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 1]], dtype=np.int32)
    # program, taken, ready, mma_done, store_start, store_end (ns)
    s = np.array(
        [
            [0, 1000, 1000, 3000, 3100, 3500],
            [1, 1200, 3600, 5000, 5100, 9100],
            [0, 3600, 3600, 6000, 6000, 7000],
        ],
        dtype=np.int64,
    )
    spans, extra = trace_summary([s, s[:0]], [tiles, tiles[:0]], keep_timeline=True)
    assert spans == [4.0, 1.0]
    assert extra["time_us"] == pytest.approx(8.1)
    assert extra["timeline"][0] == [0, "L1", 0.0, 2.5, None, None]
    assert extra["timeline"][1] == [1, "L2", 0.2, 8.1, 4.1, 8.1]
    assert extra["wait_us_median"][0] == pytest.approx(1.2)  # (2.4 + 0) / 2
    assert linear2_waits([s, s[:0]], [tiles, tiles[:0]]) == pytest.approx([2.4, 0.0])


# ---- the kernel under the interpreter ------------------------------------------------


# Not bf16: the Triton 3.6 interpreter computes tl.dot of bf16 operands wrongly (a 16x16 bf16
# dot is off by about 1e10 while the loads are exact), so the bf16 path is checked on GPUs only.
@pytest.mark.parametrize("precision,routing_", [("w8a8", "skewed"), ("w4a8", "balanced")])
def test_kernel_matches_the_reference_and_both_schedules_agree_bitwise(
    interpreted_kernel, precision, routing_
):
    import torch
    from fixtures import TINY_MOE

    from xstage_bench.megamoe import reference
    from xstage_bench.megamoe.layer.inputs import make_expert_weights
    from xstage_bench.megamoe.layer.problem import MoEProblem

    moe = dict(TINY_MOE)
    p = _point(E=4, topk=2, tokens_per_rank=48, precision=precision, routing=routing_)
    devices = [torch.device("cpu")] * 2
    weights = [make_expert_weights(p, precision, q, d) for q, d in enumerate(devices)]
    prob = MoEProblem(p, moe, devices, weights, num_programs=3)
    outs = {}
    for name in moe["schedules"]:
        prob.poison()
        fixtures.interpreted_forward(prob, name)
        assert prob.error_flags() == [0, 0]
        outs[name] = [o.clone() for o in prob.outputs()]
    tokens = [np.arange(48)] * 2
    ref = reference.reference_outputs(prob.homes, prob.experts, tokens, precision)
    for o, r in zip(outs["expert_wave"], ref, strict=True):
        assert reference.relative_error(o, r) < INTERPRETER_TOLERANCE
    for a, b in zip(outs["expert_wave"], outs["interleaved"], strict=True):
        assert torch.equal(a, b)
    prob.poison(local=True)
    prob.forward("expert_wave", local=True)
    for rb in prob.ranks:  # the control writes exactly this rank's rows, locally
        written = ~torch.isnan(rb.sink).any(dim=1)
        assert int(written.sum()) == rb.plan.rows


# ---- one process per rank (gloo, shared-memory windows, the interpreter) ---------------


def test_per_gpu_verdict_names_the_first_failure_in_runner_order():
    from xstage_bench.megamoe.ours.verdict import of_ranks

    good = {"flag": 0, "nan": False, "rel_error": 0.01, "checked_tokens": 32}
    assert of_ranks([good, good]) == (
        None,
        {"rel_error": [0.01, 0.01], "checked_tokens_per_rank": 32},
    )
    error, extra = of_ranks([good, {**good, "bitwise_equal": False}])
    assert error == "output differs bitwise from the expert-wave schedule"
    assert extra["bitwise_equal_to_expert_wave"] is False
    assert "error flags [0, 1]" in of_ranks([good, {**good, "flag": 1, "nan": True}])[0]
    assert "NaN (unwritten) on ranks [1]" in of_ranks([good, {**good, "nan": True}])[0]
    error, _ = of_ranks([good, {**good, "rel_error": 0.5}])
    assert "0.5 > 0.02" in error
    assert of_ranks([good, {**good, "rel_error": 0.05}], tolerance=0.1)[0] is None
    assert of_ranks([good, {**good, "rel_error": 0.02}])[0] is None  # at the tolerance: kept
    # Every rank compared: one rank's output differing is the point's error.
    error, extra = of_ranks([{**good, "bitwise_equal": True}, {**good, "bitwise_equal": False}])
    assert error == "output differs bitwise from the expert-wave schedule"
    assert extra["bitwise_equal_to_expert_wave"] is False


def test_the_local_control_names_the_ranks_it_left_unwritten():
    from xstage_bench.megamoe.ours.verdict import local_unwritten

    assert local_unwritten([]) is None
    assert local_unwritten([0, 2]) == "local control left rows unwritten on ranks [0, 2]"


@needs_torch
def test_per_gpu_processes_reproduce_the_single_process_outputs_bitwise(
    interpreted_kernel, tmp_path, monkeypatch
):
    """Two gloo ranks run the sweep with a wrong variant, a hang and a crash injected: the
    wrong point is recorded wrong, the hung one timed out, the one whose process died
    failed; the sweep resumes after each and finishes, and every checked output equals the
    single-process path's bit for bit."""
    import torch

    from xstage_bench.data import grid
    from xstage_bench.data.config import load_config
    from xstage_bench.data.results import read_raw
    from xstage_bench.megamoe import distributed
    from xstage_bench.megamoe.layer.inputs import make_expert_weights
    from xstage_bench.megamoe.layer.problem import MoEProblem
    from xstage_bench.megamoe.points import CPU_PROGRAMS

    cfg = load_config(Path(__file__).resolve().parents[1] / "config.yaml")
    cfg["timing"].update({"warmup": 0, "min_reps": 1, "max_reps": 2, "flush_l2": False})
    moe = {
        **cfg["megamoe"],
        "shapes": [{"name": "tiny", "H": 256, "I": 256, "E": 4, "topk": 2}],
        "precisions": ["w8a8"],
        "routings": ["balanced", "skewed"],
        "tokens_per_rank": [48, 32],
        "lead_rows": 0,
        "schedules": list(schedule.COMPARED),  # the faults below name these two
    }
    monkeypatch.setenv(
        "XSTAGE_INJECT_FAULT",
        "wrong:balanced/T=48/P=2/interleaved;hang:skewed/T=48/P=2/expert_wave;"
        "crash:skewed/T=48/P=2/interleaved",
    )
    out, dump = tmp_path / "megamoe.json", tmp_path / "outputs"
    distributed.launch(
        cfg,
        "cpu-test",
        out,
        world_size=2,
        megamoe=moe,
        device_type="cpu",
        tolerance=INTERPRETER_TOLERANCE,
        dump_dir=dump,
        # the injected hang's only bound: a sound point under the interpreter took 3-5 s
        # alone but over 10 s on a loaded 2-core CI machine (recorded timeout there)
        point_timeout_s=40,
        # the peer's bound on every wait, the injected hang's 40 s included: on the loaded CI
        # machine (the measuring-rule tests beside it) 60 s ended a worker outside any point
        wait_timeout_s=120,
        max_restarts=2,
    )
    doc = read_raw(out)
    status = {r["id"]: (r["status"], r.get("error") or "") for r in doc["records"]}
    assert status["tiny/w8a8/balanced/T=48/P=2/expert_wave"][0] == "ok"
    assert status["tiny/w8a8/balanced/T=48/P=2/interleaved"][0] == "wrong"
    assert "NaN (unwritten)" in status["tiny/w8a8/balanced/T=48/P=2/interleaved"][1]
    assert status["tiny/w8a8/skewed/T=48/P=2/expert_wave"][0] == "timeout"
    crashed = status["tiny/w8a8/skewed/T=48/P=2/interleaved"]
    assert crashed == ("failed", "a worker process died (exit code 70) during this point")
    assert doc["environment"]["process_model"].startswith("one process per GPU")
    assert "one per GPU" in doc["config"]["processes"]

    devices = [torch.device("cpu")] * 2
    compared = 0
    for point in grid.megamoe_points(moe, 2):
        weights = [make_expert_weights(point, "w8a8", q, d) for q, d in enumerate(devices)]
        prob = MoEProblem(point, moe, devices, weights, num_programs=CPU_PROGRAMS)
        for name in moe["schedules"]:
            pid = f"{point['id']}/{name}"
            if status[pid][0] != "ok":
                continue
            prob.poison()
            prob.forward(name)
            for q, expected in enumerate(prob.outputs()):
                got = torch.load(dump / f"{pid.replace('/', '__')}.rank{q}.pt")
                assert torch.equal(got, expected), f"{pid} rank {q}"
                compared += 1
    assert compared == 2 * 5  # 8 points, 3 of them not ok, 2 ranks each


@needs_torch
def test_rowwise_quantization_keeps_each_row_within_an_e4m3_step():
    import torch

    x = (
        torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
        * torch.logspace(-2, 2, 64)[:, None]
    )
    values, scales = unfused.rowwise(x)
    assert values.dtype == torch.float8_e4m3fn and scales.shape == (64,)
    back = values.float() * scales[:, None]
    # e4m3 keeps 3 mantissa bits: every value within half a step (1/16) of its row's scale
    assert torch.all((back - x).abs() <= x.abs() / 16 + scales[:, None] * 2.0**-9)
    assert unfused.tolerance("fp8_grouped_rowwise", 2e-2) == unfused.ROWWISE_TOLERANCE
    assert unfused.tolerance("bf16_grouped", 2e-2) == 2e-2
    assert unfused.gemm_paths("bf16") == ("bf16_grouped",)
    assert set(unfused.gemm_paths("w8a8")) == set(unfused.GEMM_FORMAT)


def test_a_failure_every_rank_shares_is_said_once():
    from xstage_bench.megamoe.baselines.measure import _per_rank

    assert _per_rank(["no deep_gemm", "no deep_gemm"]) == "every rank: no deep_gemm"
    assert _per_rank(["hang", None]) == "rank 0: hang"
    assert _per_rank(["a", "b"]) == "rank 0: a; rank 1: b"
    assert _per_rank([None, None]) == ""


# ---- the host store path, the lead map, paired arms ----------------------------------


def test_host_share_picks_exactly_round_f_t_seeded_nested_tokens_per_home_rank():
    p = _point(tokens_per_rank=50, world_size=1)
    assert len(routing.host_tokens(p, 0.0, 0)) == 0
    np.testing.assert_array_equal(routing.host_tokens(p, 1.0, 0), np.arange(50))
    quarter = routing.host_tokens(p, 0.25, 0)
    assert len(quarter) == round(0.25 * 50) == 12 and np.all(np.diff(quarter) > 0)
    np.testing.assert_array_equal(quarter, routing.host_tokens(p, 0.25, 0))  # seeded
    assert set(quarter) <= set(routing.host_tokens(p, 0.5, 0))  # a smaller share is nested
    other = routing.host_tokens(_point(tokens_per_rank=50, world_size=2), 0.25, 1)
    assert not np.array_equal(quarter, other)
    with pytest.raises(ValueError, match="host share"):
        routing.host_tokens(p, 1.5, 0)


def test_host_rows_get_int64_offsets_far_from_the_device_buffer():
    ids = [np.array([[0, 1], [2, 3], [1, 2]]), np.array([[4, 5], [6, 7], [5, 0]])]
    plans = routing.dispatch_plan(ids, 8, 4)
    H = 256
    homed = np.array([[False, True, False], [True, False, False]])  # (P, T) host-homed tokens
    host_offsets = np.array([-(2**40) + 8, 2**35], dtype=np.int64)  # beyond 2^31 either way
    comb_offsets = np.array([0, 2**33], dtype=np.int64)
    for plan in plans:
        dst = routing.row_destinations(plan, comb_offsets, H, host_offsets, homed, pad=PAD)
        assert dst.dtype == np.int64
        for i in range(plan.padded_rows):
            home, token, slot = plan.home[i], plan.token[i], plan.slot[i]
            if home < 0:
                assert dst[i] == PAD
            elif homed[home, token]:
                assert dst[i] == host_offsets[home] + slot * H
            else:
                assert dst[i] == comb_offsets[home] + slot * H
    # every row of a host-homed token goes to the host; the others stay on their path
    assert sum(int(routing.host_rows(p, homed).sum()) for p in plans) == 2 * 2  # 2 tokens x 2
    for p in plans:
        peer = routing.peer_rows(p, homed)
        assert not (peer & routing.host_rows(p, homed)).any()
        assert int(routing.peer_rows(p).sum()) == p.remote_rows()
        assert int(peer.sum()) == int(
            ((p.home >= 0) & (p.home != p.rank) & ~homed[np.maximum(p.home, 0), p.token]).sum()
        )


PAD = -(2**62)  # the kernels' PAD_DST (tests/test_megamoe_cpu.py keeps triton unimported here)


def test_grid_points_name_their_path_and_keep_the_peer_ids():
    from xstage_bench.data import grid

    moe = {
        "shapes": [{"name": "tiny", "H": 256, "I": 256, "E": 8, "topk": 2}],
        "precisions": ["w8a8"],
        "routings": ["balanced"],
        "tokens_per_rank": [32],
        "remote_fractions": ["natural", 0, 0.25],
    }
    peer = grid.megamoe_points(moe, 2)
    assert [p["id"] for p in peer] == [
        "tiny/w8a8/balanced/T=32/P=2",
        "tiny/w8a8/balanced/T=32/P=2/f=0",
        "tiny/w8a8/balanced/T=32/P=2/f=0.25",
    ]
    assert {p["path"] for p in peer} == {"peer"} and "remote_fraction" not in peer[0]
    host = grid.megamoe_points(moe, 1, ["host"])
    # 'natural' on the host path is the f = 0 control: counted once
    assert [p["id"] for p in host] == [
        "tiny/w8a8/balanced/T=32/P=1/path=host/f=0",
        "tiny/w8a8/balanced/T=32/P=1/path=host/f=0.25",
    ]
    assert [p["remote_fraction"] for p in host] == [0.0, 0.25]
    both = grid.megamoe_points(moe, 2, ["peer", "host"])
    assert len(both) == 5 and both[3]["id"].endswith("/P=2/path=host/f=0")


LEAD_MOE = {
    "shapes": [
        {"name": "a", "H": 256, "I": 256, "E": 8, "topk": 2},
        {"name": "b", "H": 512, "I": 256, "E": 8, "topk": 2},
    ],
    "precisions": ["w8a8"],
    "routings": ["balanced"],
    "tokens_per_rank": [32],
    "remote_fractions": [0.5],
    "schedules": ["expert_wave", "interleaved"],
    "lead_rows": 256,
    "variants": ["ours", "unfused"],
    "lead_sweep": {
        "shapes": ["a", "b"],
        "tokens_per_rank": [32],
        "remote_fractions": [0.5, 1],
        "lead_rows": [0, 1024, "auto"],
    },
}


def _model_file(tmp_path, *, path=None, per_path=None, R=50.0, Q=100_000.0):
    doc = {
        "params": {
            "R_GBps": {"value": R},
            "Q_bytes": {"value": Q},
            "t0_fixed_us": {"value": 0.5},
            "issue_rate_per_sm_GBps": {"value": 32.768},
        }
    }
    if path:
        doc["path"] = path
    if per_path:  # the fitter's shape: the top level's path first, the others apart
        doc["paths"] = [doc.get("path", "peer"), *per_path]
        doc["other_paths"] = per_path
    f = tmp_path / "burst_gap.json"
    f.write_text(__import__("json").dumps(doc))
    return f


# One GPU, host share 1: 32 row blocks of 4 L1 and 8 L2 tiles, 16 programs at 100 TFLOP/s,
# a drain of 10 GB/s behind 64 KiB: the stores of one wave of Linear-2 tiles outlast the
# Linear-1 work between them unless the lead spreads them out.
LEAD_POINT = {
    "shape": "t",
    "H": 1024,
    "I": 512,
    "E": 8,
    "topk": 2,
    "precision": "w8a8",
    "routing": "balanced",
    "tokens_per_rank": 2048,
    "world_size": 1,
    "path": "host",
    "remote_fraction": 1.0,
}
LEAD_CANDIDATES = (0, 128, 256, 512, 1024, 2048, 4096)


def _slow_drain():
    from xstage_bench.megamoe.drain import PathParams

    return PathParams(t0_fixed_us=0.2, issue_rate=20_000.0, drain=10_000.0, capacity=65536.0)


def test_lead_auto_is_the_candidate_the_playback_finds_fastest():
    from xstage_bench.megamoe import playback, schedule
    from xstage_bench.megamoe.ours import lead

    far = _slow_drain()
    got = lead.choose(
        LEAD_POINT, {}, far, tflops=100.0, num_programs=16, candidates=LEAD_CANDIDATES, blocks=None
    )
    # each candidate's own list, played with the hold on: the rule saw exactly these
    rates = playback.Rates.at(LEAD_POINT, 128, 128, 100.0, 16)
    (work,) = playback.rank_works(LEAD_POINT, {})
    for rows, seen in got.predicted_us.items():
        tiles = schedule.build("interleaved", work.grid, 16, {"lead_rows": rows})
        assert seen == pytest.approx(playback.play(tiles, work, rates, far).time_us)
    # neither extreme: no lead stalls on the drain, the longest bunches Linear-2 at the end
    assert got.rows == min(got.predicted_us, key=got.predicted_us.get) == 512
    assert min(got.predicted_us[0], got.predicted_us[4096]) > 1.1 * got.predicted_us[512]


def test_lead_auto_ties_go_to_the_longest_lead_and_a_prefix_is_played():
    from xstage_bench.megamoe import playback
    from xstage_bench.megamoe.ours import lead

    local = {**LEAD_POINT, "remote_fraction": 0.0}  # nothing crosses the path
    got = lead.choose(
        local, {}, _slow_drain(), tflops=100.0, num_programs=16, candidates=LEAD_CANDIDATES
    )
    fastest = min(got.predicted_us.values())
    tied = [r for r, t in got.predicted_us.items() if t <= fastest * (1 + lead.TIE)]
    assert len(tied) > 1 and got.rows == max(tied) == 4096
    # the busiest rank's first blocks only: 8 of 32 row blocks take a quarter of the time
    short = lead.choose(
        local, {}, _slow_drain(), tflops=100.0, num_programs=16, candidates=(0,), blocks=8
    )
    (work,) = playback.rank_works(local, {})
    assert work.prefix(8).grid.blocks == 8 and work.grid.blocks == 32
    assert short.predicted_us[0] == pytest.approx(got.predicted_us[0] / 4, rel=0.05)


def test_lead_choices_are_kept_per_configuration_and_share(tmp_path, monkeypatch):
    from xstage_bench.megamoe.ours import lead

    calls = []
    real = lead.choose
    monkeypatch.setattr(lead, "choose", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    leads = lead.LeadChooser.of({"lead_auto_tflops": 100.0}, _model_file(tmp_path, path="host"))
    w8a8 = leads.resolve("auto", LEAD_POINT)
    assert leads.resolve("auto", {**LEAD_POINT, "precision": "w4a8"}) == w8a8
    leads.resolve("auto", {**LEAD_POINT, "remote_fraction": 0.5})
    assert len(calls) == 2  # the precisions share one choice; another share is another
    assert leads.describe()["paths"]["host"]["S_bytes"] == 100_000.0


def test_the_capacity_law_is_read_where_the_fit_has_it(tmp_path):
    from xstage_bench.megamoe.ours import lead

    params = {
        "R_GBps": {"value": 52.0},
        "Q_bytes": {"value": 3.0e6},
        "t0_fixed_us": {"value": 0.3},
        "issue_rate_per_sm_GBps": {"value": 75.0},
    }
    law = {**params, "S_bytes": {"value": 1.0e6}, "q_bytes": {"value": 15360.0}}
    drain = lead.read_drain(_model_file(tmp_path, per_path={"host": {"params": law}}), "host")
    assert (drain.S_bytes, drain.q_bytes) == (1.0e6, 15360.0)
    assert drain.capacity_bytes(132) == pytest.approx(1.0e6 + 132 * 15360.0)
    path = drain.path_params()
    assert (path.capacity, path.capacity_per_issuer, path.drain) == (1.0e6, 15360.0, 52_000.0)
    old = lead.read_drain(_model_file(tmp_path, per_path={"host": {"params": params}}), "host")
    assert (old.S_bytes, old.q_bytes) == (3.0e6, 0.0)  # one shared capacity
    half = {**params, "S_bytes": {"value": 1.0e6}}
    with pytest.raises(lead.LeadModelError, match="no usable 'q_bytes'"):
        lead.read_drain(_model_file(tmp_path, per_path={"host": {"params": half}}), "host")
    alone = {k: v for k, v in law.items() if k != "Q_bytes"}  # a fit of the law alone
    only = lead.read_drain(_model_file(tmp_path, per_path={"host": {"params": alone}}), "host")
    assert only.Q_bytes is None and only.capacity_bytes(1) == 1.0e6 + 15360.0
    # the drain's lag: read where the fit has it (none in files written before it), and
    # not played (lead.PLAYS_DRAIN_LAG): the path is today's drain, R and Q(K) as fitted
    assert (drain.lag_fraction, drain.lag_rate_ratio) == (0.0, 1.0)
    lag = {"drain_lag_fraction": {"value": 0.3}, "drain_lag_rate_ratio": {"value": 0.4}}
    lagged = lead.read_drain(
        _model_file(tmp_path, per_path={"host": {"params": {**law, **lag}}}), "host"
    )
    assert (lagged.lag_fraction, lagged.lag_rate_ratio) == (0.3, 0.4)
    assert not lead.PLAYS_DRAIN_LAG and lagged.path_params() == drain.path_params()
    assert lagged.describe()["lag_fraction"] == 0.3 and not lagged.describe()["lag_played"]


def test_the_fitted_drain_lag_is_played_only_when_switched_on(tmp_path, monkeypatch):
    from xstage_bench.megamoe.ours import lead

    params = {
        "R_GBps": {"value": 52.0},
        "t0_fixed_us": {"value": 0.3},
        "issue_rate_per_sm_GBps": {"value": 75.0},
        "S_bytes": {"value": 1.0e6},
        "q_bytes": {"value": 15360.0},
        "drain_lag_fraction": {"value": 0.3},
        "drain_lag_rate_ratio": {"value": 0.4},
    }
    lagged = lead.read_drain(_model_file(tmp_path, per_path={"host": {"params": params}}), "host")
    monkeypatch.setattr(lead, "PLAYS_DRAIN_LAG", True)
    path = lagged.path_params()
    assert (path.lag_fraction, path.lag_rate_ratio) == (0.3, 0.4)
    assert (path.capacity, path.capacity_per_issuer, path.drain) == (1.0e6, 15360.0, 52_000.0)


def test_lead_model_is_read_per_path_and_a_missing_path_names_the_file(tmp_path):
    from xstage_bench.megamoe.ours import lead

    peer_only = _model_file(tmp_path)  # today's file: top-level params, the peer path's
    assert lead.read_drain(peer_only, "peer").R_GBps == 50.0
    with pytest.raises(lead.LeadModelError, match=r"json: .*no fit for store path 'host'"):
        lead.read_drain(peer_only, "host")
    params = {
        "R_GBps": {"value": 52.0},
        "Q_bytes": {"value": 1.0e5},
        "t0_fixed_us": {"value": 0.3},
        "issue_rate_per_sm_GBps": {"value": 10.0},
    }
    both = _model_file(tmp_path, per_path={"host": {"params": params}})
    host = lead.read_drain(both, "host")
    assert host.R_GBps == 52.0 and "other_paths.host" in host.source
    assert lead.read_drain(both, "peer").R_GBps == 50.0  # the top level, the peer path's
    bad = _model_file(tmp_path, per_path={"host": {"params": {**params, "Q_bytes": {}}}})
    with pytest.raises(lead.LeadModelError, match="Q_bytes"):
        lead.read_drain(bad, "host")
    with pytest.raises(lead.LeadModelError, match="no model file was given"):
        lead.LeadChooser(None).resolve("auto", _point(world_size=1, path="host"))
    assert lead.LeadChooser(None).resolve(512, _point()) == 512
    with pytest.raises(ValueError, match="megamoe.lead_rows"):
        lead.LeadChooser(None).resolve(-1, _point())


def test_lead_sweep_adds_interleaved_arms_per_lead_with_their_expert_wave_counterpart(tmp_path):
    from xstage_bench.data import grid
    from xstage_bench.megamoe.ours import lead
    from xstage_bench.megamoe.points import arm_sets, lead_sweep_configs

    model = _model_file(tmp_path, per_path={"host": {"params": {}}})  # host fit missing
    leads = lead.LeadChooser(model, 600.0)
    paths = ["peer", "host"]
    configs = grid.megamoe_points(LEAD_MOE, 2, paths)
    sweep = lead_sweep_configs(LEAD_MOE, 2, paths)
    pts = expand_points(configs, LEAD_MOE, leads, sweep)
    ids = [p["id"] for p in pts]
    c = "a/w8a8/balanced/T=32/P=2/f=0.5"
    assert ids[:6] == [
        f"{c}/expert_wave",
        f"{c}/interleaved",
        f"{c}/interleaved/lead=0",
        f"{c}/interleaved/lead=1024",
        f"{c}/interleaved/lead=auto",
        f"{c}/unfused",  # the baselines after our arms, on the peer path only
    ]
    by_id = {p["id"]: p for p in pts}
    main = by_id[f"{c}/interleaved"]
    assert main["lead_rows"] == 256 and main["lead_rows_requested"] == 256
    assert "lead_sweep" not in main and "lead_rows" not in by_id[f"{c}/expert_wave"]
    auto = by_id[f"{c}/interleaved/lead=auto"]
    assert auto["lead_sweep"] is True and auto["lead_rows_requested"] == "auto"
    assert auto["lead_rows"] % 128 == 0 and "lead_error" not in auto
    # f = 1 is only in the lead map: its own expert-wave point, marked as the map's
    only = "a/w8a8/balanced/T=32/P=2/f=1"
    assert by_id[f"{only}/expert_wave"]["lead_sweep"] is True
    assert f"{only}/interleaved" not in by_id and f"{only}/interleaved/lead=0" in by_id
    # the host path's auto lead cannot be chosen: recorded failed later, not a crash
    host_auto = by_id["a/w8a8/balanced/T=32/P=2/path=host/f=0.5/interleaved/lead=auto"]
    assert "lead_rows" not in host_auto and "t0_fixed_us" in host_auto["lead_error"]
    assert not any(
        i.startswith("a/w8a8/balanced/T=32/P=2/path=host") and "unfused" in i for i in ids
    )
    sets = arm_sets(pts)
    assert [a["id"] for a in sets[c]] == ids[:5]
    assert (
        config_id(auto) == c
        and config_id({"id": f"{c}/deepgemm/interleaved", "variant": "deepgemm"}) == c
    )
    assert len(pts) == len(set(ids))


def test_baselines_run_at_the_host_control_when_no_peer_path_is_measured():
    from xstage_bench.data import grid

    moe = {**LEAD_MOE, "remote_fractions": ["natural", 0.5], "variants": ["ours", "gemm_ceiling"]}
    moe.pop("lead_sweep")
    pts = expand_points(grid.megamoe_points(moe, 1, ["host"]), moe)
    ceiling = [p["id"] for p in pts if p.get("variant") == "gemm_ceiling"]
    assert ceiling == [
        "a/w8a8/balanced/T=32/P=1/path=host/f=0/gemm_ceiling",
        "b/w8a8/balanced/T=32/P=1/path=host/f=0/gemm_ceiling",
    ]


def test_traces_on_the_host_path_take_its_largest_share_against_the_local_control():
    from xstage_bench.data import grid

    moe = {**LEAD_MOE, "remote_fractions": ["natural", 0.25, 1]}
    traced = trace_points(grid.megamoe_points(moe, 1, ["host"]), megamoe=moe)
    assert [p["id"] for p in traced[:3]] == [
        "a/w8a8/balanced/T=32/P=1/path=host/f=1/expert_wave",
        "a/w8a8/balanced/T=32/P=1/path=host/f=1/interleaved",
        "a/w8a8/balanced/T=32/P=1/path=host/f=1/local_control",
    ]
    assert traced[1]["lead_rows"] == 256 and traced[2]["schedule"] == "expert_wave"


def test_paired_arms_are_checked_alone_then_timed_together_one_record_each():
    from xstage_bench.measurement.protocol import Measured, wrong
    from xstage_bench.megamoe.ours.paired import measure_arms

    arms = [{"id": f"c/{n}"} for n in ("expert_wave", "interleaved", "interleaved/lead=0")]
    timed = []

    def check(p):
        if p["id"] == "c/interleaved":
            raise wrong("output differs bitwise from the expert-wave schedule")
        return {"checked": p["id"]}

    def measure(passed, facts):
        timed.append([p["id"] for p in passed])
        return {
            p["id"]: Measured({"time_us": [1.0, 2.0]}, facts[p["id"]], correct=True) for p in passed
        }

    class Sampler:  # the clocks, sampled once before the set and once after it
        def __init__(self):
            self.samples = iter([{"available": False, "reason": r} for r in ("before", "after")])

        def sample(self):
            return next(self.samples)

    records = measure_arms(arms, check, measure, sampler=Sampler())
    assert list(records) == [a["id"] for a in arms]
    assert timed == [["c/expert_wave", "c/interleaved/lead=0"]]  # once, the passed arms
    for arm in ("c/expert_wave", "c/interleaved/lead=0"):  # every timed arm: the same clocks
        clocks = records[arm]["clocks"]
        assert (clocks["before"]["reason"], clocks["after"]["reason"]) == ("before", "after")
        assert records[arm]["throttled"] is None  # unreadable clocks: unknown, never False
    assert records["c/interleaved"]["status"] == "wrong"
    assert records["c/interleaved/lead=0"]["extra"] == {"checked": "c/interleaved/lead=0"}


def test_a_timing_that_fails_fails_every_arm_it_timed_and_the_wrong_one_stays_wrong():
    from xstage_bench.measurement.protocol import PointFailed, wrong
    from xstage_bench.megamoe.ours.paired import measure_arms

    arms = [{"id": f"c/{n}"} for n in ("expert_wave", "interleaved", "interleaved/lead=0")]

    def check(p):
        if p["id"] == "c/interleaved":
            raise wrong("output differs bitwise from the expert-wave schedule")
        return {}

    def measure(passed, facts):
        raise PointFailed("a timing hung", status="timeout")

    records = measure_arms(arms, check, measure)
    assert [records[a["id"]]["status"] for a in arms] == ["timeout", "wrong", "timeout"]
    assert records["c/expert_wave"]["error"] == "a timing hung"


def test_the_ratios_of_a_set_are_the_wave_arms_time_over_each_other_arm():
    from xstage_bench.megamoe.ours.paired import compared_ratios

    arms = [
        {"id": "c/interleaved", "schedule": "interleaved"},
        {"id": "c/expert_wave", "schedule": "expert_wave"},
        {"id": "c/lead=0", "schedule": "interleaved"},
    ]
    assert compared_ratios(arms) == [
        ("c/expert_wave", "c/interleaved"),
        ("c/expert_wave", "c/lead=0"),
    ]
    assert compared_ratios([a for a in arms if a["schedule"] != "expert_wave"]) == []


def test_an_interrupted_set_of_arms_is_measured_again_whole(tmp_path):
    import json

    from xstage_bench.measurement.sweep import partial_path
    from xstage_bench.megamoe.runner import drop_unpaired

    out = tmp_path / "megamoe.json"
    sets = {
        "c1": [{"id": "c1/expert_wave"}, {"id": "c1/interleaved"}],
        "c2": [{"id": "c2/expert_wave"}, {"id": "c2/interleaved"}],
    }
    ids = ["c1/expert_wave", "c1/interleaved", "c2/expert_wave", "c2/unfused"]
    partial_path(out).write_text(json.dumps({"records": [{"id": i} for i in ids]}))
    assert drop_unpaired(out, sets) == 1
    kept = [r["id"] for r in json.loads(partial_path(out).read_text())["records"]]
    assert kept == ["c1/expert_wave", "c1/interleaved", "c2/unfused"]
    assert drop_unpaired(out, sets) == 0


def test_emulated_points_on_the_host_path_carry_it_in_id_and_point(tmp_path, monkeypatch):
    from xstage_bench.megamoe.emulated import emulated_points
    from xstage_bench.megamoe.ours import lead

    rates = []
    real = lead.choose
    monkeypatch.setattr(lead, "choose", lambda *a, **k: rates.append(k["tflops"]) or real(*a, **k))

    moe = {
        **LEAD_MOE,
        "lead_rows": "auto",
        "emulated": {
            "shapes": ["a"],
            "tflops": [1000, 3000],
            "remote_fractions": [0, "natural", 1],
            "tokens_per_rank": 32,
        },
    }
    model = _model_file(tmp_path, path="host", R=5.0)
    leads = lead.LeadChooser.of(moe, model)
    pts = emulated_points(moe, 1, ["host"], leads)
    ids = [p["id"] for p in pts]
    assert ids[:2] == [
        "a/T=32/P=1/path=host/X=1000/f=0/expert_wave",
        "a/T=32/P=1/path=host/X=1000/f=0/interleaved",
    ]
    assert len(pts) == 2 * 2 * 2  # natural is f = 0 on the host path
    assert {p["path"] for p in pts} == {"host"}
    inter = {p["id"]: p for p in pts if p["schedule"] == "interleaved"}
    # auto played at each emulated rate X (tiles last their FLOPs at X), per share
    assert sorted(rates) == [1000.0, 1000.0, 3000.0, 3000.0]
    assert all(p["lead_rows"] in lead.CANDIDATES for p in inter.values())


def test_a_worker_baseline_is_given_room_for_its_weight_copies():
    from xstage_bench.megamoe.ours.measurer import worker_need_bytes

    pro = {"E": 384, "H": 7168, "I": 3072, "world_size": 1, "precision": "w8a8"}
    # FlashInfer's worker for it on one H200 held 78.8 GiB and asked for 31.5 more
    assert worker_need_bytes(pro) > (78.8 + 31.5) * 2**30
    assert worker_need_bytes({**pro, "world_size": 2}) < worker_need_bytes(pro)
    assert worker_need_bytes({**pro, "precision": "w4a8"}) < worker_need_bytes(pro)
    flash = {"E": 256, "H": 4096, "I": 2048, "world_size": 1, "precision": "w8a8"}
    assert worker_need_bytes(flash) < 64 * 2**30  # a small layer leaves ours in place


@needs_torch
def test_forgetting_the_configuration_drops_our_weights_and_rebuilds_the_same_problem(
    interpreted_kernel,  # a problem imports the kernel: Triton, under the interpreter
):
    # before a worker baseline on a full GPU, the measurer drops what it holds of the
    # configuration; the next point of it gets the same weights back from the seed
    import torch
    from fixtures import tiny_cpu_measurer

    m = tiny_cpu_measurer(1)
    point = {**_point(world_size=1), "schedule": "expert_wave", "id": "tiny/forget"}
    first = m.problem(point)
    w1 = m._weights[0].w1.clone()
    m.forget_configuration()
    assert m._weights == [] and m._problem is None and m._outputs == {}
    again = m.problem(point)
    assert again is not first
    assert torch.equal(m._weights[0].w1, w1)


@pytest.mark.parametrize("world", [1, 2])
def test_host_path_rows_land_in_host_memory_and_the_check_catches_an_unwritten_one(
    interpreted_kernel, world
):
    import torch
    from fixtures import tiny_cpu_measurer

    m = tiny_cpu_measurer(world)
    base = _point(E=4, tokens_per_rank=24, world_size=world, path="host", remote_fraction=0.5)
    points = [
        {**base, "schedule": s, "id": f"tiny/h/P={world}/path=host/f=0.5/{s}"}
        for s in ("expert_wave", "interleaved")
    ]
    for p in points:
        try:
            error, facts = m.check(p)
        except Exception as e:  # triton.runtime.errors.InterpreterError
            if "0-dimensional" in str(e):
                pytest.skip(f"the Triton interpreter cannot run with this numpy: {e}")
            raise
        assert error is None, error
        assert max(facts["rel_error"]) < INTERPRETER_TOLERANCE
    assert facts["bitwise_equal_to_expert_wave"] is True
    assert facts["checked_host_tokens_per_rank"] == [12] * world  # every sampled token
    prob = m.problem(points[0])
    T, topk, H = 24, 2, 256
    for r in range(world):
        host = prob.host_comb[r].view(T, topk, H)
        dev = prob.ranks[r].comb.view(T, topk, H)
        homed = prob.host_tokens[r]
        assert len(homed) == 12
        assert not torch.isnan(host[torch.as_tensor(homed)]).any()  # stored into host memory
        assert torch.isnan(dev[torch.as_tensor(homed)]).all()  # never into the GPU's buffer
    assert sum(prob.host_bytes()) == world * 12 * topk * H * 2
    assert prob.remote_bytes() == prob.host_bytes()
    # one host row the kernel never stores: the point is wrong, named as such
    rb = prob.ranks[0]
    row = int(np.flatnonzero(routing.host_rows(rb.plan, prob.host_homed))[0])
    assert interpreted_kernel.PAD_DST == PAD
    rb.row_dst[row] = PAD
    error, _ = m.check(points[0])
    assert error is not None and "host combine rows left NaN" in error


def test_one_gpu_sweep_pairs_every_arm_of_a_configuration_on_the_host_path(
    interpreted_kernel, tmp_path, capsys
):
    """run_megamoe at world size 1 on the CPU: the host path only, every configuration's
    arms (expert waves, interleaved, the lead map's leads with 'auto' from the model) timed
    in the same rounds, one record per arm in the record format the tables read."""
    from xstage_bench.data.results import read_raw
    from xstage_bench.megamoe.runner import run_megamoe

    moe = {
        "shapes": [{"name": "tiny", "H": 256, "I": 256, "E": 2, "topk": 2}],
        "precisions": ["w8a8"],
        "routings": ["balanced"],
        "tokens_per_rank": [24],
        "remote_fractions": [0.5],
        "schedules": ["expert_wave", "interleaved"],
        "lead_rows": 0,
        "variants": ["ours"],
        "skew_zipf": 1.2,
        "block_m": 128,
        "block_n": 128,
        "lead_sweep": {
            "shapes": ["tiny"],
            "tokens_per_rank": [24],
            "remote_fractions": [0.5],
            "lead_rows": [128, "auto"],
        },
    }
    config = {
        "timing": {
            "warmup": 0,
            "min_reps": 2,
            "max_reps": 2,
            "target_rel_iqr": 1.0,
            "budget_s": 0.1,
            "flush_l2": False,
        }
    }
    # a small capacity: a model without one is refused (lead.LeadModelError)
    model = _model_file(tmp_path, path="host", R=1.0, Q=4096.0)
    out = tmp_path / "megamoe.json"
    try:
        run_megamoe(
            config, "cpu-test", out, None, 1, megamoe=moe, device_type="cpu", model_file=model
        )
    except Exception as e:  # triton.runtime.errors.InterpreterError
        if "0-dimensional" in str(e):
            pytest.skip(f"the Triton interpreter cannot run with this numpy: {e}")
        raise
    doc = read_raw(out)
    recs = {r["id"]: r for r in doc["records"]}
    c = "tiny/w8a8/balanced/T=24/P=1/path=host/f=0.5"
    arms = [f"{c}/expert_wave", f"{c}/interleaved", f"{c}/interleaved/lead=128"]
    arms.append(f"{c}/interleaved/lead=auto")
    assert list(recs) == arms
    assert {r["status"] for r in recs.values()} == {"ok"}
    for i, arm in enumerate(arms):
        r = recs[arm]
        point, extra = r["point"], r["extra"]
        assert point["path"] == "host" and point["remote_fraction"] == 0.5
        assert extra["paired"]["arms"] == arms and extra["paired"]["arm"] == arm
        assert extra["paired"]["rounds"] == 2 == len(r["samples"]["time_us"])
        assert len(r["samples"]["kernel_us"]) == 2
        assert extra["paired"]["position"] == [i, len(arms) - 1 - i]  # A B .., then reversed
        # the ratios the report takes (expert waves over each other arm) were checked for
        # noise; this config gives no budget to measure a noisy one again
        remeasure = extra["paired"]["remeasure"]
        compared = [(r["numerator"], r["denominator"]) for r in remeasure["ratios"]]
        assert compared == [(arms[0], a) for a in arms[1:]]
        assert remeasure["rounds_added"] == 0
        assert extra["remote_bytes"] == extra["host_bytes"] == 12 * 2 * 256 * 2
        assert extra["nvlink_bytes"] == 0 and extra["tflops_kernel"] > 0
        assert r["clocks"] == recs[arms[0]]["clocks"]  # one clock sample around the set
        assert extra["launch"] == "eager"  # CUDA graphs on a GPU only
        assert "host_enqueue_us" not in extra  # host clocks: no GPU to keep busy
    auto = recs[f"{c}/interleaved/lead=auto"]["point"]
    assert auto["lead_rows_requested"] == "auto" and auto["lead_sweep"] is True
    assert auto["lead_rows"] > 0 and auto["lead_rows"] % 128 == 0
    assert recs[f"{c}/interleaved"]["point"]["lead_rows"] == 0
    assert "lead_sweep" not in recs[f"{c}/interleaved"]["point"]
    cfg = doc["config"]
    assert cfg["kernel"]["launch"].startswith("eager")
    assert cfg["store_paths"] == ["host"] and "round(f T)" in cfg["host_share"]
    assert (
        set(cfg["definitions"]) == {"host"} and "far end" in cfg["definitions"]["host"]["time_us"]
    )
    assert cfg["lead_auto"]["paths"]["host"]["R_GBps"] == 1.0
    assert cfg["lead_auto"]["tflops"] == 600.0
    # Issue 26: each unfused GEMM path's bound is in the raw config, as the check applies it
    bounds = cfg["baselines"]["unfused"]["tolerance_rel_l2"]
    assert bounds["fp8_grouped_rowwise"] == 0.1
    assert bounds["bf16_grouped"] == cfg["check"]["tolerance_rel_l2"]
    print_summary(out)
    printed = capsys.readouterr().out
    lead_line = next(line for line in printed.splitlines() if line.startswith("lead map"))
    assert (
        f"lead map {c}: lead=128 " in lead_line and f"lead=auto({auto['lead_rows']})" in lead_line
    )
    main_row = next(line for line in printed.splitlines() if line.startswith(c))
    assert len(main_row.split()) > 3  # the main grid's row: its own two schedules


@needs_torch
def test_the_per_gpu_process_model_on_one_gpu_is_recorded_unsupported_with_why(tmp_path):
    from xstage_bench.data.config import load_config
    from xstage_bench.data.results import read_raw
    from xstage_bench.megamoe.distributed import ONE_GPU, run_per_gpu

    config = load_config(Path(__file__).resolve().parents[1] / "config" / "ci-measure.yaml")
    out = tmp_path / "megamoe_per_gpu.json"
    run_per_gpu(config, "cpu-test", out, 1, device_type="cpu")
    records = read_raw(out)["records"]
    assert records and {r["status"] for r in records} == {"unsupported"}
    assert {r["error"] for r in records} == {ONE_GPU}


@needs_torch
def test_the_per_gpu_process_model_without_the_peer_path_is_recorded_unsupported(tmp_path):
    """Four GPUs without peer access (PCIe cards: the workflow resolves `store_paths: auto`
    to the host path alone): the per-GPU run, whose combine is a peer window, records its
    points unsupported instead of failing the job."""
    from xstage_bench.data.config import load_config
    from xstage_bench.data.results import read_raw
    from xstage_bench.megamoe.distributed import run_per_gpu

    config = load_config(Path(__file__).resolve().parents[1] / "config" / "ci-measure.yaml")
    config = {**config, "world_size": 4, "store_paths": ["host"]}
    out = tmp_path / "megamoe_per_gpu.json"
    run_per_gpu(config, "cpu-test", out, 4, device_type="cpu")
    records = read_raw(out)["records"]
    assert records and {r["status"] for r in records} == {"unsupported"}
    assert {r["point"]["world_size"] for r in records} == {4}
    assert all("peer window" in r["error"] for r in records)


def test_the_megamoe_policy_takes_host_lead_from_the_megamoe_section():
    from xstage_bench.megamoe.options import megamoe_policy

    block = dict(warmup=1, min_reps=3, max_reps=5, target_rel_iqr=0.1, budget_s=1.0, flush_l2=True)
    assert megamoe_policy({"timing": block}, {"host_lead": True}).host_lead is True
    assert megamoe_policy({"timing": block}, {}).host_lead is False
    assert megamoe_policy({"timing": block}, {"host_lead": True}).flush_l2 is True


@needs_torch
def test_captured_launches_are_keyed_by_what_they_baked_in(interpreted_kernel, monkeypatch):
    from xstage_bench.megamoe.layer import graphs
    from xstage_kernels import megamoe_ws

    wave = graphs.graph_key("expert_wave")
    assert graphs.graph_key("interleaved") != wave
    monkeypatch.setattr(megamoe_ws, "SKIP_PADDING_HALVES", not megamoe_ws.SKIP_PADDING_HALVES)
    assert graphs.graph_key("expert_wave") != wave  # kernel_ab flips it between launches
    monkeypatch.setattr(megamoe_ws, "SKIP_PADDING_HALVES", not megamoe_ws.SKIP_PADDING_HALVES)
    assert graphs.graph_key("expert_wave") == wave
    monkeypatch.setenv("XSTAGE_MOE_FP8_KERNEL", "tl")
    assert graphs.graph_key("expert_wave") != wave


def test_a_capture_runs_the_launches_once_eagerly_then_records_them(monkeypatch):
    import contextlib
    import types

    from xstage_bench.megamoe.layer import graphs

    log = []

    @contextlib.contextmanager
    def where(name):
        log.append(f"enter {name}")
        yield
        log.append(f"leave {name}")

    stream = types.SimpleNamespace(wait_stream=lambda other: log.append("wait"))
    cuda = types.SimpleNamespace(
        device=lambda d: contextlib.nullcontext(),
        current_stream=lambda d=None: stream,
        Stream=lambda d=None: stream,
        stream=lambda s: where("side stream"),
        synchronize=lambda d=None: log.append("sync"),
        CUDAGraph=lambda: "graph",
        graph=lambda g: where(f"capture into {g}"),
    )
    captured = graphs.capture(types.SimpleNamespace(cuda=cuda), "cuda:0", lambda: log.append("go"))
    assert captured == "graph"
    assert log == [
        *("wait", "enter side stream", "go", "leave side stream", "wait", "sync"),
        *("enter capture into graph", "go", "leave capture into graph"),
    ]


@needs_torch
def test_the_reference_rounds_gate_where_our_build_does_and_follows_the_build_in_force(
    interpreted_kernel, monkeypatch
):
    """Our W4A8 build rounds gate (not up) to bf16 before SwiGLU (megamoe_ws.GATE_BF16): the
    reference does the same for it, so the check's tolerance still measures the kernel.
    The measurer's reference follows the build in force (kernel_ab's arms differ in it);
    on the CPU (the tl kernel) nothing is rounded."""
    import torch
    from fixtures import tiny_cpu_measurer

    from xstage_bench.megamoe import reference
    from xstage_kernels import megamoe as kernel

    m = tiny_cpu_measurer(1)
    point = {**_point(world_size=1), "schedule": "expert_wave", "id": "tiny/gate"}
    prob = m.problem(point)
    assert not kernel.rounds_gate_bf16("w4a8", prob.homes[0].xq)  # a CPU tensor: tl
    plain = [r.clone() for r in m.reference()]
    monkeypatch.setattr(kernel, "rounds_gate_bf16", lambda precision, x: True)
    held = m.reference()
    assert not torch.equal(held[0], plain[0])  # some FP8 intermediate rounding flipped
    assert float((held[0] - plain[0]).norm() / plain[0].norm()) < 0.05
    both = reference.Intermediate(linear1_bf16=True)
    every = reference.reference_outputs(prob.homes, prob.experts, m.tokens, prob.precision, both)
    assert not torch.equal(held[0], every[0])  # up is not rounded
    monkeypatch.setattr(kernel, "rounds_gate_bf16", lambda precision, x: False)
    assert torch.equal(m.reference()[0], plain[0])
