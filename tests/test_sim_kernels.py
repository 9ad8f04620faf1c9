"""MegaMoE and Ulysses simulators: tile costs, schedules, and the X-Stage effects."""

from pathlib import Path

import numpy as np
import pytest

from xstage_bench import grid
from xstage_bench.config import ConfigError
from xstage_bench.hardware import HardwareProfile, load_profile
from xstage_bench.results import read_raw
from xstage_bench.sim import megamoe, run, ulysses, xstage


def toy_profile(capacity: float = 256 * 1024) -> HardwareProfile:
    # Per SM: fp8 400e6/16 = 2.5e7 FLOP/us; issue 50000 bytes/us; drain 100000 bytes/us.
    return HardwareProfile(
        name="toy",
        sm_count=16,
        t0_fixed_us=0.1,
        issue_rate_per_sm_GBps=50.0,
        drain_rate_GBps=100.0,
        capacity_bytes=capacity,
        nvlink_line_rate_GBps=120.0,
        matrix_tflops={"bf16": 200.0, "fp8": 400.0},
    )


MOE = {"block_m": 128, "block_n": 128, "lead_rows": 256, "skew_zipf": 1.2}


def moe_point(routing: str = "balanced", tokens: int = 1024, precision: str = "w8a8") -> dict:
    p = {
        "shape": "toy",
        "H": 1024,
        "I": 512,
        "E": 16,
        "topk": 4,
        "precision": precision,
        "routing": routing,
        "tokens_per_rank": tokens,
        "world_size": 2,
    }
    p["id"] = f"toy/{precision}/{routing}/T={tokens}/P=2"
    return p


def test_routing_balanced_and_skewed():
    balanced = megamoe.expert_rows(moe_point("balanced"), 1.2)
    skewed = megamoe.expert_rows(moe_point("skewed"), 1.2)
    assert balanced.sum() == skewed.sum() == 1024 * 4
    assert len(balanced) == 8 and balanced.max() - balanced.min() <= 1
    assert skewed.max() > 2 * skewed.mean()
    # Both precisions of a shape see the same routing.
    np.testing.assert_array_equal(
        skewed, megamoe.expert_rows(moe_point("skewed", precision="w4a8"), 1.2)
    )


def test_plan_tile_costs():
    p = megamoe.plan(moe_point(), MOE, toy_profile())
    assert p.blocks == 8 * 4  # 512 rows per expert, 128-row blocks
    assert p.l1_tiles_per_block == 2 * 512 // 128 and p.l2_tiles_per_block == 1024 // 128
    assert p.l1_tile_us == pytest.approx(2 * 128 * 128 * 1024 / 2.5e7)
    assert p.l2_tile_us == pytest.approx(2 * 128 * 128 * 512 / 2.5e7)
    assert p.useful_flops == pytest.approx(6 * 1024 * 512 * 4096)


def drain(schedule, ready=lambda b: True) -> list:
    order = []
    while (tile := schedule.next_tile(ready)) is not None:
        order.append(tile)
    return order


def small_plan(sm_count: int) -> megamoe.MoEPlan:
    # 2 experts x 2 blocks of 128 rows; 2 Linear-1 and 2 Linear-2 tiles per block.
    pt = {
        "shape": "s",
        "H": 256,
        "I": 128,
        "E": 4,
        "topk": 1,
        "precision": "bf16",
        "routing": "balanced",
        "tokens_per_rank": 512,
        "world_size": 2,
        "id": "s",
    }
    prof = HardwareProfile(
        name="s",
        sm_count=sm_count,
        t0_fixed_us=0.1,
        issue_rate_per_sm_GBps=1.0,
        drain_rate_GBps=1.0,
        capacity_bytes=1.0,
        nvlink_line_rate_GBps=1.0,
        matrix_tflops={"bf16": 1.0},
    )
    return megamoe.plan(pt, MOE, prof)


def test_expert_wave_is_the_smallest_group_that_fills_the_sms():
    order = drain(megamoe.ExpertWave(small_plan(4), sm_count=4))
    L1, L2 = "L1", "L2"
    assert order == [
        (L1, 0),
        (L1, 0),
        (L1, 1),
        (L1, 1),
        (L2, 0),
        (L2, 0),
        (L2, 1),
        (L2, 1),
        (L1, 2),
        (L1, 2),
        (L1, 3),
        (L1, 3),
        (L2, 2),
        (L2, 2),
        (L2, 3),
        (L2, 3),
    ]
    # With more SMs, both experts form one wave.
    wide = drain(megamoe.ExpertWave(small_plan(8), sm_count=8))
    assert [k for k, _ in wide] == ["L1"] * 8 + ["L2"] * 8


def test_interleaved_keeps_the_row_lead():
    p = small_plan(4)
    order = drain(megamoe.Interleaved(p, 4, lead_rows=256))
    L1, L2 = "L1", "L2"
    # Linear-2 of block 0 (rows 0-127) waits until Linear-1 reaches row 384 (block 3).
    assert order == [
        (L1, 0),
        (L1, 0),
        (L1, 1),
        (L1, 1),
        (L1, 2),
        (L1, 2),
        (L2, 0),
        (L2, 0),
        (L1, 3),
        (L1, 3),
        (L2, 1),
        (L2, 1),
        (L2, 2),
        (L2, 2),
        (L2, 3),
        (L2, 3),
    ]
    # Rows never ready: all Linear-1 first, then Linear-2 (the program waits for its rows).
    blocked = drain(megamoe.Interleaved(p, 4, lead_rows=0), ready=lambda b: False)
    assert [k for k, _ in blocked] == ["L1"] * 8 + ["L2"] * 8


@pytest.mark.parametrize("schedule", ["expert_wave", "interleaved"])
def test_simulated_kernel_accounts_for_every_tile(schedule):
    pt, prof = moe_point(), toy_profile()
    r = megamoe.simulate(pt, MOE, prof, schedule, keep_timeline=True)
    p = megamoe.plan(pt, MOE, prof)
    kinds = [row[1] for row in r.timeline]
    assert kinds.count("L1") == p.blocks * p.l1_tiles_per_block
    assert kinds.count("L2") == len(r.store_spans_us) == p.blocks * p.l2_tiles_per_block
    for prog in range(prof.sm_count):  # a program runs one tile at a time
        rows = sorted((row for row in r.timeline if row[0] == prog), key=lambda row: row[2])
        ends = [row[5] if row[1] == "L2" else row[3] for row in rows]
        assert all(nxt[2] >= end - 1e-9 for nxt, end in zip(rows[1:], ends, strict=False))
    work = p.blocks * (p.l1_tiles_per_block * p.l1_tile_us + p.l2_tiles_per_block * p.l2_tile_us)
    assert r.time_us >= work / prof.sm_count
    assert r.nvlink_bytes == 4096 * 1024 * 2 // 2  # rows x H x bf16, half of it remote
    assert r.tflops == pytest.approx(p.useful_flops / r.time_us / 1e6)


def test_without_backpressure_remote_spans_equal_the_local_control():
    prof = toy_profile(capacity=1e12)
    remote = megamoe.simulate(moe_point(), MOE, prof, "expert_wave")
    local = megamoe.simulate(moe_point(), MOE, prof, "expert_wave", local_control=True)
    floor = 0.1 + 128 * 128 * 2 / 50_000  # t0_fixed + the tile's bytes at the issue rate
    np.testing.assert_allclose(remote.store_spans_us, floor)
    np.testing.assert_allclose(local.store_spans_us, floor)


def test_waves_backpressure_and_interleaving_hides_it():
    prof = toy_profile()
    wave = megamoe.simulate(moe_point(), MOE, prof, "expert_wave")
    inter = megamoe.simulate(moe_point(), MOE, prof, "interleaved")
    local = megamoe.simulate(moe_point(), MOE, prof, "interleaved", local_control=True)
    assert np.median(wave.store_spans_us) > 1.3 * np.median(local.store_spans_us)
    assert np.median(inter.store_spans_us) == pytest.approx(np.median(local.store_spans_us))
    assert inter.time_us < wave.time_us


def attention_point(mode: str, S: int) -> dict:
    return {"mode": mode, "world_size": 2, "heads": 4, "seq_len": S, "head_dim": 128, "batch": 1}


def test_ulysses_modes_hand_computed():
    prof = toy_profile(capacity=1e12)
    S = 2048  # 2 local heads x 16 Q tiles = 32 tiles: 2 waves on 16 SMs
    tile = 4 * 128 * S * 128 / (200e6 * ulysses.ATTENTION_EFFICIENCY / 16)
    epilogue = 0.1 + 128 * 128 * 2 / 50_000
    alone = ulysses.simulate(attention_point("alone", S), prof)
    assert alone.sender_us == pytest.approx(2 * (tile + epilogue))
    assert alone.completion_us == pytest.approx(alone.sender_us)
    serial = ulysses.simulate(attention_point("serial", S), prof)
    remote = 32 * 128 * 128 * 2 / 2
    # The All-to-All's bytes drain from its start (the fixed overhead overlaps them).
    assert serial.sender_us == pytest.approx(alone.sender_us + remote / 100_000)
    fused = ulysses.simulate(attention_point("fused", S), prof)
    assert fused.sender_us == pytest.approx(alone.sender_us)  # no backpressure: hidden
    assert fused.sender_us < fused.completion_us <= fused.sender_us + 16 * 16384 / 100_000
    assert alone.tflops == pytest.approx(4 * 2 * S * S * 128 / alone.sender_us / 1e6)


def fused_and_serial_overhead(capacity: float, S: int) -> tuple[float, float]:
    prof = toy_profile(capacity)
    t = {m: ulysses.simulate(attention_point(m, S), prof).sender_us for m in ulysses.MODES}
    return t["serial"] - t["alone"], t["fused"] - t["alone"]


def test_ulysses_fused_overhead_stays_flat_while_serial_grows():
    # A wave of 16 programs pushes 16 x 16 KiB = 256 KiB; with Q = 512 KiB it fits, and
    # the longer Q loop at longer S only gives the X-Stage more time to drain.
    serial_4k, fused_4k = fused_and_serial_overhead(512 * 1024, 4096)
    serial_16k, fused_16k = fused_and_serial_overhead(512 * 1024, 16384)
    assert serial_16k == pytest.approx(4 * serial_4k, rel=0.05)  # linear in S
    assert fused_4k == pytest.approx(0.0, abs=1e-9) and fused_16k == pytest.approx(0.0, abs=1e-9)


def test_ulysses_wave_beyond_Q_pays_the_isolated_stall_every_wave():
    # Q = 64 KiB < 256 KiB per wave: each wave's remote push stalls (V - Q)/R instead of
    # issuing in B/a, so the overhead grows with the number of waves (4 at S=4K, 16 at 16K).
    # The fixed overhead (0.1 us) overlaps the stall, as in the isolated law.
    per_wave = (16 * 16384 - 65536) / 100_000 - 16384 / 50_000 - 0.1
    for S, waves in ((4096, 4), (16384, 16)):
        serial, fused = fused_and_serial_overhead(64 * 1024, S)
        assert fused == pytest.approx(waves * per_wave)
        assert fused < serial


def tiny_config() -> dict:
    return {
        "world_size": 2,
        "megamoe": {
            "shapes": [
                {"name": "toy", "H": 1024, "I": 512, "E": 16, "topk": 4},
                {"name": "toy2", "H": 512, "I": 256, "E": 8, "topk": 2},
            ],
            "precisions": ["w8a8"],
            "routings": ["balanced", "skewed"],
            "tokens_per_rank": [1024, 512],
            "schedules": ["expert_wave", "interleaved"],
            **MOE,
        },
        "attention": {
            "seq_lens": [1024, 2048],
            "heads": [4],
            "head_dim": 128,
            "batch": 1,
            "backends": ["fa3", "fa4"],
            "modes": ["alone", "serial", "fused"],
        },
    }


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "toy.yaml"
    path.write_text(
        "name: toy\nsm_count: 16\nt0_fixed_us: 0.1\nissue_rate_per_sm_GBps: 50\n"
        "drain_rate_GBps: 100\ncapacity_bytes: 262144\nnvlink_line_rate_GBps: 120\n"
        "matrix_tflops: {bf16: 200, fp8: 400}\nworld_size: 4\n"
    )
    return str(path)


def test_run_megamoe_and_trace(tmp_path, profile_file):
    out = tmp_path / "megamoe.json"
    run.simulate_megamoe(tiny_config(), profile_file, "sim-toy", str(out))
    doc = read_raw(out)
    assert doc["experiment"] == "megamoe" and doc["backend"] == "sim"
    assert len(doc["records"]) == 2 * 2 * 2 * 2  # shapes x routings x tokens x schedules
    r = doc["records"][0]
    assert r["id"] == r["point"]["id"] + "/" + r["point"]["schedule"]
    assert r["point"]["world_size"] == 2 and len(r["samples"]["time_us"]) == 5
    assert r["extra"]["tflops"] > 0 and r["extra"]["nvlink_bytes"] > 0
    # Both schedules of a configuration share their noise: the speedup is the model's.
    wave, inter = doc["records"][0], doc["records"][1]
    assert inter["point"]["schedule"] == "interleaved"
    exact = megamoe.simulate(wave["point"], MOE, load_profile(profile_file), "expert_wave")
    exact_i = megamoe.simulate(inter["point"], MOE, load_profile(profile_file), "interleaved")
    ratios = np.divide(wave["samples"]["time_us"], inter["samples"]["time_us"])
    np.testing.assert_allclose(ratios, exact.time_us / exact_i.time_us)
    assert len(set(wave["samples"]["time_us"])) == 5  # yet the samples do spread

    trace = tmp_path / "trace.json"
    run.simulate_megamoe_trace(tiny_config(), profile_file, "sim-toy", str(trace))
    doc = read_raw(trace)
    assert [r["point"]["variant"] for r in doc["records"]] == [
        "expert_wave",
        "interleaved",
        "local_control",
    ]
    point = doc["records"][0]["point"]
    assert (point["shape"], point["precision"], point["routing"], point["tokens_per_rank"]) == (
        "toy",
        "w8a8",
        "skewed",
        512,
    )
    for r in doc["records"]:
        l2 = [row for row in r["extra"]["timeline"] if row[1] == "L2"]
        assert len(l2) == len(r["samples"]["store_span_us"]) > 0
        assert all(row[4] is not None and row[5] >= row[4] for row in l2)


def test_run_attention_uses_the_profile_world_size_when_auto(tmp_path, profile_file):
    cfg = {**tiny_config(), "world_size": "auto"}
    out = tmp_path / "attention.json"
    run.simulate_attention(cfg, profile_file, "sim-toy", str(out))
    doc = read_raw(out)
    assert {r["point"]["backend"] for r in doc["records"]} == {"sim"}
    assert {r["point"]["world_size"] for r in doc["records"]} == {4}
    assert len(doc["records"]) == 3 * 2  # modes x seq_lens
    for r in doc["records"]:
        assert all(
            c >= s
            for s, c in zip(r["samples"]["sender_us"], r["samples"]["completion_us"], strict=True)
        )


@pytest.mark.parametrize("value", [".nan", ".inf", "0", "-3"])
def test_a_profile_rate_must_be_positive_and_finite(tmp_path, profile_file, value):
    text = (
        Path(profile_file).read_text().replace("drain_rate_GBps: 100", f"drain_rate_GBps: {value}")
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(
        ConfigError, match=r"bad\.yaml: key 'drain_rate_GBps' must be a positive finite"
    ):
        load_profile(bad)


def test_the_kernel_simulators_bound_their_event_loops(profile_file, monkeypatch):
    monkeypatch.setattr(xstage, "STEPS_PER_WORK", 0)
    monkeypatch.setattr(xstage, "MIN_STEPS", 10)  # a bound of 10 steps: too few
    prof = load_profile(profile_file)
    with pytest.raises(xstage.SimulationError, match="attention: .* ran past 10 steps"):
        ulysses.simulate(attention_point("fused", 131072), prof)
    point = grid.megamoe_points(tiny_config()["megamoe"], 2)[0]
    with pytest.raises(xstage.SimulationError, match="megamoe: .* ran past 10 steps"):
        megamoe.simulate(point, MOE, prof, "interleaved")
