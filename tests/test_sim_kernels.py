"""MegaMoE and Ulysses simulators: tile costs, schedules, and the X-Stage effects."""

from pathlib import Path

import numpy as np
import pytest

from xstage_bench.data import grid
from xstage_bench.data.config import ConfigError
from xstage_bench.data.hardware import HardwareProfile, load_profile
from xstage_bench.data.results import read_raw
from xstage_bench.megamoe import drain, playback, routing, schedule
from xstage_bench.sim import emulated, megamoe, run, ulysses, xstage


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


def kernel_grid(point: dict, rank: int = 0) -> schedule.TileGrid:
    """The rank's grid exactly as the kernel's problem builds it (rank.rank_buffers)."""
    P = point["world_size"]
    ids = [routing.route(point, MOE["skew_zipf"], r)[0] for r in range(P)]
    plan = routing.dispatch_plan(ids, point["E"], MOE["block_m"])[rank]
    return schedule.TileGrid(
        plan.block_expert, plan.block_rows, point["I"] // 128, point["H"] // 128
    )


@pytest.mark.parametrize("name", ["expert_wave", "interleaved"])
@pytest.mark.parametrize("routing_name", ["balanced", "skewed"])
def test_simulator_plays_the_kernels_tile_list(name, routing_name):
    pt, prof = moe_point(routing_name), toy_profile()
    r = megamoe.simulate(pt, MOE, prof, name, keep_timeline=True)
    expected = schedule.build(name, kernel_grid(pt, r.rank), prof.sm_count, MOE)
    np.testing.assert_array_equal(r.tiles, expected)
    # The timeline is the list in order: taken through one counter, so never earlier than
    # the entry before it, and every Linear-2 tile starts after its block's Linear-1 tiles.
    kinds = ["L1" if k == schedule.L1 else "L2" for k in expected[:, 0]]
    assert [row[1] for row in r.timeline] == kinds
    taken = np.array([row[2] for row in r.timeline])
    assert np.all(np.diff(taken) >= 0)
    l2 = expected[:, 0] == schedule.L2
    starts = taken[l2] + np.array(r.waits_us)
    for block in np.unique(expected[:, 2]):
        l1_ends = [
            row[3]
            for row, (k, _, b, _) in zip(r.timeline, expected, strict=True)
            if k == schedule.L1 and b == block
        ]
        assert starts[expected[l2, 2] == block].min() >= max(l1_ends) - 1e-9


def free_stores_profile() -> HardwareProfile:
    """Stores that cost next to nothing: the kernel's time is its tiles'."""
    return HardwareProfile(
        name="free",
        sm_count=16,
        t0_fixed_us=0.0,
        issue_rate_per_sm_GBps=1e5,  # a tile's 32 KiB in 0.3 ns
        drain_rate_GBps=1e7,
        capacity_bytes=1e12,
        nvlink_line_rate_GBps=1e7,
        matrix_tflops={"fp8": 400.0},
    )


@pytest.mark.parametrize("name", ["expert_wave", "interleaved"])
def test_with_free_stores_the_timing_is_the_lists_own_clock(name):
    # schedule.play times a list with tile costs only; the simulator must agree there,
    # waits included.
    pt, prof = moe_point("skewed"), free_stores_profile()
    r = megamoe.simulate(pt, MOE, prof, name, keep_timeline=True)
    start, wait = schedule.play(r.tiles, kernel_grid(pt, r.rank), prof.sm_count)
    unit = 2 * 128 * 128 * 128 / (400e6 / 16)  # tile_costs' unit (2 BM BN BN FLOPs) in us
    l2 = r.tiles[:, 0] == schedule.L2
    tol = 0.01  # us: the stores' 0.3 ns each, summed over a program's tiles
    np.testing.assert_allclose(np.array(r.waits_us), wait[l2] * unit, atol=tol)
    taken = np.array([row[2] for row in r.timeline])
    np.testing.assert_allclose(taken, (start - wait) * unit, atol=tol)
    if name == "interleaved":  # no wait while Linear-1 work is left to take instead
        last_l1 = np.flatnonzero(~l2).max()
        assert np.array(r.waits_us)[np.flatnonzero(l2) < last_l1].max() < tol
    else:
        assert max(r.waits_us) > 1.0  # a wave's Linear-2 tiles wait for its Linear-1 tail


def test_a_path_too_fast_for_the_clock_fails_instead_of_hanging():
    prof = HardwareProfile(**{**free_stores_profile().as_dict(), "issue_rate_per_sm_GBps": 1e9})
    with pytest.raises(RuntimeError, match="stalled"):
        megamoe.simulate(moe_point("skewed"), MOE, prof, "interleaved")


def test_a_list_that_would_hang_the_kernel_fails():
    # One program takes a Linear-2 tile before its block's Linear-1 tiles: nobody else
    # can compute them (schedule.build refuses such lists; the player must not hang).
    grid = schedule.TileGrid(np.array([0]), np.array([128]), 1, 1)
    work = playback.RankWork(0, grid, np.zeros(1), np.full(1, 128 * 256.0))
    tiles = np.array([[schedule.L2, 0, 0, 0], [schedule.L1, 0, 0, 0]], dtype=np.int32)
    rates = playback.Rates(programs=1, l1_us=1.0, l2_us=1.0)
    paths = [xstage.path_params(toy_profile(), dest) for dest in ("peer", "local")]
    with pytest.raises(RuntimeError, match="deadlock"):
        playback.play(tiles, work, rates, *paths)


def test_tile_times_and_accounting():
    pt, prof = moe_point(), toy_profile()
    r = megamoe.simulate(pt, MOE, prof, "expert_wave", keep_timeline=True)
    l1 = [row[3] - row[2] for row in r.timeline if row[1] == "L1"]
    np.testing.assert_allclose(l1, 4 * 128 * 128 * 1024 / 2.5e7)  # 4 BM BN H at 2.5e7 FLOP/us
    # 8 experts x 4 blocks of 128 rows per rank; 4 L1 and 8 L2 tiles per block.
    assert len(l1) == 32 * 4 and len(r.store_spans_us) == len(r.waits_us) == 32 * 8
    for prog in range(prof.sm_count):  # a program runs one tile at a time
        rows = sorted((row for row in r.timeline if row[0] == prog), key=lambda row: row[2])
        assert all(nxt[2] >= row[3] - 1e-9 for row, nxt in zip(rows, rows[1:], strict=False))
    work = 32 * (4 * 4 * 128 * 128 * 1024 + 8 * 2 * 128 * 128 * 512) / 2.5e7
    assert r.time_us >= work / prof.sm_count
    assert r.nvlink_bytes == 2 * 4096 * 1024 * 2 // 2  # all ranks: half of rows x H x bf16
    assert r.nvlink_bytes_per_rank == [4096 * 1024] * 2
    assert r.tflops == pytest.approx(6 * 1024 * 512 * 4096 / r.time_us / 1e6)


def test_remote_share_follows_the_plans_rows():
    prof = toy_profile()
    rows_bytes = 4096 * 1024 * 2  # a rank's rows x H x bf16
    for fraction, share in ((0.0, 0.0), (0.25, 0.25), (1.0, 1.0)):
        pt = {**moe_point(), "remote_fraction": fraction}
        r = megamoe.simulate(pt, MOE, prof, "expert_wave")
        assert r.nvlink_bytes_per_rank == [round(share * rows_bytes)] * 2


def test_remote_fraction_zero_never_stalls():
    # A path that cannot hold one tile's stores: any remote row would stall its program.
    prof = toy_profile(capacity=1024)
    floor = 0.1 + 128 * 128 * 2 / 50_000  # t0_fixed + the tile's bytes at the issue rate
    for name in ("expert_wave", "interleaved"):
        local = megamoe.simulate({**moe_point(), "remote_fraction": 0.0}, MOE, prof, name)
        np.testing.assert_allclose(local.store_spans_us, floor)
        assert local.nvlink_bytes == 0
        remote = megamoe.simulate({**moe_point(), "remote_fraction": 1.0}, MOE, prof, name)
        assert np.median(remote.store_spans_us) > 2 * floor


def test_without_backpressure_remote_spans_equal_the_local_control():
    prof = toy_profile(capacity=1e12)
    floor = 0.1 + 128 * 128 * 2 / 50_000
    for local in (False, True):
        r = megamoe.simulate(moe_point(), MOE, prof, "expert_wave", local_control=local)
        np.testing.assert_allclose(r.store_spans_us, floor)


def test_waves_backpressure_and_interleaving_hides_it():
    # Natural routing on 2 ranks: half the blocks' rows go home over the peer path. A
    # wave's Linear-2 tiles push 16 x 32 KiB at once into a 256 KiB path; interleaved,
    # Linear-1 tiles sit between them and the path drains in time.
    prof = toy_profile()
    pt = moe_point()
    wave = megamoe.simulate(pt, MOE, prof, "expert_wave")
    inter = megamoe.simulate(pt, MOE, prof, "interleaved")
    local = megamoe.simulate(pt, MOE, prof, "interleaved", local_control=True)
    assert np.median(wave.store_spans_us) > 1.3 * np.median(local.store_spans_us)
    assert np.median(inter.store_spans_us) == pytest.approx(np.median(local.store_spans_us))
    assert inter.time_us < wave.time_us


def test_the_kernel_time_is_the_slowest_ranks():
    pt, prof = moe_point("skewed"), toy_profile()
    r = megamoe.simulate(pt, MOE, prof, "interleaved")
    rates = playback.Rates.at(pt, 128, 128, 400.0, prof.sm_count)
    paths = [xstage.path_params(prof, dest) for dest in ("peer", "local")]
    per_rank = []
    for rows in playback.dispatch(pt, MOE):
        work = playback.rank_work(rows, pt, 128, local_control=False)
        tiles = schedule.build("interleaved", work.grid, prof.sm_count, MOE)
        per_rank.append(playback.play(tiles, work, rates, *paths, hold=False).time_us)
    assert r.time_us == max(per_rank) and r.rank == int(np.argmax(per_rank))
    # "busiest" plays one rank only: here the one the skew loads with more blocks.
    busiest = megamoe.simulate(pt, MOE, prof, "interleaved", ranks="busiest")
    blocks = [len(rows.block_rows) for rows in playback.dispatch(pt, MOE)]
    assert blocks[busiest.rank] == max(blocks) > min(blocks)
    assert busiest.time_us == per_rank[busiest.rank]


def test_simulation_is_reproducible():
    prof = toy_profile()
    a = megamoe.simulate(moe_point("skewed"), MOE, prof, "interleaved", keep_timeline=True)
    megamoe.simulate(moe_point("balanced"), MOE, prof, "interleaved")  # another routing between
    b = megamoe.simulate(moe_point("skewed"), MOE, prof, "interleaved", keep_timeline=True)
    assert (a.time_us, a.store_spans_us, a.waits_us, a.timeline) == (
        b.time_us,
        b.store_spans_us,
        b.waits_us,
        b.timeline,
    )


def emulated_point(fraction, X: float = 400.0) -> dict:
    p = {k: v for k, v in moe_point().items() if k not in ("id", "precision")}
    return {**p, "emulated_tflops": X, "remote_fraction": fraction}


def test_predict_emulated_local_control_is_natural_routing_stored_locally():
    prof = toy_profile(capacity=1024)  # any remote row would stall
    local = emulated.predict_emulated(emulated_point(0.0), prof, 400.0, 16, megamoe_config=MOE)
    for name, t in local.items():
        expected = megamoe.simulate_at_rate(
            moe_point(), MOE, prof, name, tflops=400.0, num_programs=16, local_control=True
        )
        assert t == expected.time_us
    # Compute only: twice the emulated rate, half the time.
    free = free_stores_profile()
    slow = emulated.predict_emulated(emulated_point(0.0), free, 200.0, 16, megamoe_config=MOE)
    fast = emulated.predict_emulated(emulated_point(0.0), free, 400.0, 16, megamoe_config=MOE)
    for name in emulated.SCHEDULES:
        assert slow[name] == pytest.approx(2 * fast[name], rel=1e-3)


def emulated_record(point: dict, schedule_name: str, time_us: float, **kw) -> dict:
    return {
        "status": "ok",
        "point": {**point, "schedule": schedule_name},
        "samples": {"time_us": [time_us * 0.99, time_us, time_us * 1.5], **kw},
        "extra": {"num_programs": 16},
    }


def test_compare_emulated_on_synthetic_records():
    prof = toy_profile()
    points = [emulated_point(f, X) for f in (0.0, 1.0) for X in (200.0, 400.0)]
    predicted = [
        emulated.predict_emulated(p, prof, p["emulated_tflops"], 16, megamoe_config=MOE)
        for p in points
    ]
    records = []
    for p, pred, off in zip(points, predicted, (1.0, 1.1, 0.8, 1.25), strict=True):
        # Measured: the prediction, with interleaved `off` times slower than predicted.
        records.append(emulated_record(p, "expert_wave", pred["expert_wave"]))
        records.append(emulated_record(p, "interleaved", pred["interleaved"] * off))
    # Left out: a failed record, and a point with one schedule only.
    records.append({"status": "failed", "point": {**points[0], "schedule": "interleaved"}})
    records.append(emulated_record(emulated_point(0.5), "expert_wave", 10.0))
    table = emulated.compare_emulated(records, prof, megamoe_config=MOE)
    assert list(table.columns) == [
        "shape",
        "routing",
        "tokens_per_rank",
        "world_size",
        "emulated_tflops",
        "remote_fraction",
        "measured_speedup",
        "predicted_speedup",
        "error",
    ]
    assert table["remote_fraction"].tolist() == [0.0, 0.0, 1.0, 1.0]
    model = [pred["expert_wave"] / pred["interleaved"] for pred in predicted]
    np.testing.assert_allclose(table["predicted_speedup"], model)
    np.testing.assert_allclose(table["measured_speedup"], np.divide(model, [1.0, 1.1, 0.8, 1.25]))
    np.testing.assert_allclose(table["error"], [0.0, 0.1, -0.2, 0.25])


def test_compare_emulated_times_the_kernel_where_recorded():
    prof, p = toy_profile(), emulated_point(1.0)
    records = [
        emulated_record(p, "expert_wave", 100.0, kernel_us=[60.0]),
        emulated_record(p, "interleaved", 50.0, kernel_us=[40.0]),
    ]
    table = emulated.compare_emulated(records, prof, megamoe_config=MOE)
    assert table["measured_speedup"].tolist() == [1.5]


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


@pytest.mark.parametrize("mode", ulysses.MODES)
def test_ulysses_at_an_emulated_world_size_is_a_rank_of_that_node(mode):
    """Two GPUs playing ranks of an 8-GPU node carry that node's per-rank load (H/8 heads,
    7/8 of the rows remote), not a 2-GPU rank's; the simulator says what they measure."""
    prof = toy_profile(capacity=1e12)
    point = {**attention_point(mode, 2048), "heads": 8}
    emulated = ulysses.simulate({**point, "emulated_world_size": 8}, prof)
    assert emulated == ulysses.simulate({**point, "world_size": 8}, prof)
    assert emulated != ulysses.simulate(point, prof)


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


def test_a_simulated_run_resolves_auto_leads_through_the_profiles_path(tmp_path, profile_file):
    from xstage_bench.megamoe.ours import lead

    config = tiny_config()
    config["megamoe"] = {**config["megamoe"], "lead_rows": "auto"}
    out = tmp_path / "megamoe.json"
    run.simulate_megamoe(config, profile_file, "sim-toy", str(out))
    prof = load_profile(profile_file)
    far = xstage.path_params(prof, "peer")
    inter = [
        r["point"] for r in read_raw(out)["records"] if r["point"]["schedule"] == "interleaved"
    ]
    assert len(inter) == 2 * 2 * 2
    for p in inter:  # the rule at the profile's fp8 rate through its peer path, recorded
        want = lead.choose(p, config["megamoe"], far, tflops=400.0, num_programs=16).rows
        assert (p["lead_rows"], p["lead_rows_requested"]) == (want, "auto")
    assert len({p["lead_rows"] for p in inter}) > 1  # chosen per configuration


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


@pytest.mark.parametrize(
    ("capacity", "window", "problem"),
    [
        ("0", "4096", None),  # a capacity of windows alone: S = 0
        ("262144", "-1", "'capacity_per_producer_bytes' must be a finite number >= 0"),
        ("262144", ".nan", "'capacity_per_producer_bytes' must be a finite number >= 0"),
        ("0", "0", "'capacity_bytes' must be a positive finite"),
    ],
)
def test_a_profile_capacity_follows_the_law_with_a_window_per_producer(
    tmp_path, profile_file, capacity, window, problem
):
    text = Path(profile_file).read_text().replace("capacity_bytes: 262144", "")
    path = tmp_path / "law.yaml"
    path.write_text(text + f"capacity_bytes: {capacity}\ncapacity_per_producer_bytes: {window}\n")
    if problem is None:
        law = load_profile(path)
        assert (law.capacity_bytes, law.capacity_per_producer_bytes) == (0, 4096)
        return
    with pytest.raises(ConfigError, match=rf"law\.yaml: key {problem}"):
        load_profile(path)


@pytest.mark.parametrize(
    ("ceiling", "problem"),
    [
        ("null", None),  # no ceiling, as an absent key
        ("1048576", None),
        ("0", "'capacity_ceiling_bytes' must be a positive finite number or null"),
        (".inf", "'capacity_ceiling_bytes' must be a positive finite number or null"),
    ],
)
def test_a_profile_capacity_may_stop_at_a_ceiling(tmp_path, profile_file, ceiling, problem):
    path = tmp_path / "law.yaml"
    path.write_text(Path(profile_file).read_text() + f"capacity_ceiling_bytes: {ceiling}\n")
    if problem is None:
        expected = None if ceiling == "null" else float(ceiling)
        assert load_profile(path).capacity_ceiling_bytes == expected
        return
    with pytest.raises(ConfigError, match=rf"law\.yaml: key {problem}"):
        load_profile(path)


def test_the_kernel_simulators_bound_their_event_loops(profile_file, monkeypatch):
    monkeypatch.setattr(drain, "STEPS_PER_WORK", 0)
    monkeypatch.setattr(drain, "MIN_STEPS", 10)  # a bound of 10 steps: too few
    prof = load_profile(profile_file)
    with pytest.raises(drain.SimulationError, match="attention: .* ran past 10 steps"):
        ulysses.simulate(attention_point("fused", 131072), prof)
    point = grid.megamoe_points(tiny_config()["megamoe"], 2)[0]
    with pytest.raises(drain.SimulationError, match="megamoe: .* ran past 10 steps"):
        megamoe.simulate(point, MOE, prof, "interleaved")


def test_a_tile_pushes_its_remote_rows_then_its_local_rows():
    # No backpressure: a tile's span is T0 plus all of its block's valid rows x BN x bf16
    # at one SM's issue rate, however the rows split between the peer and the local path.
    # At f = 0.3 some blocks hold both kinds of rows.
    prof = toy_profile(capacity=1e12)
    pt = {**moe_point(), "remote_fraction": 0.3}
    plans = playback.dispatch(pt, MOE)
    for rows in plans:
        work = playback.rank_work(rows, pt, 128, False)
        assert ((work.remote_bytes > 0) & (work.local_bytes > 0)).any()
    r = megamoe.simulate(pt, MOE, prof, "expert_wave")
    blocks = r.tiles[r.tiles[:, 0] == schedule.L2, 2]
    rows = plans[r.rank].block_rows[blocks]
    np.testing.assert_allclose(r.store_spans_us, 0.1 + rows * 128 * 2 / 50_000)


def test_padding_rows_are_neither_remote_nor_local():
    # Rank 0, one block of 4 rows: two homed on rank 1, one on rank 0, one padding row.
    rows = routing.RankRows(
        rank=0,
        block_m=4,
        expert_rows=np.array([3]),
        home=np.array([1, 0, 1, -1]),
        token=np.array([0, 0, 1, -1]),
        slot=np.array([0, 1, 2, -1]),
        block_expert=np.array([0]),
        block_rows=np.array([3]),
    )
    work = playback.rank_work(rows, {"I": 128, "H": 256}, 128, local_control=False)
    row_bytes = 128 * playback.OUTPUT_BYTES
    assert work.remote_bytes.tolist() == [2 * row_bytes]
    assert work.local_bytes.tolist() == [1 * row_bytes]


def one_block(remote_bytes: float, l1: int = 1, l2: int = 1):
    grid = schedule.TileGrid(np.array([0]), np.array([128]), l1, l2)
    return playback.RankWork(0, grid, np.array([remote_bytes]), np.zeros(1))


def test_the_kernel_ends_when_its_last_store_has_drained_and_a_held_program_waits_for_it():
    # One L1 tile (0-1 us), one L2 tile (1-2 us), then 10 kB into a path that admits 1e6
    # bytes/us and drains 1e4 from 2 us: admitted by 2.01 us, issued once T0 = 0.1 + 0.01 us
    # is over (2.11 us), drained at 2 + 1 us. Held, the program is free only then.
    path = drain.PathParams(t0_fixed_us=0.1, issue_rate=1e6, drain=1e4, capacity=1e9)
    tiles = np.array([[schedule.L1, 0, 0, 0], [schedule.L2, 0, 0, 0]], dtype=np.int32)
    rates = playback.Rates(1, 1.0, 1.0)
    free = playback.play(tiles, one_block(10_000.0), rates, path, path, hold=False)
    assert free.end.tolist() == [pytest.approx(1.0), pytest.approx(2.11)]
    assert free.time_us == pytest.approx(3.0)
    held = playback.play(tiles, one_block(10_000.0), rates, path, path)
    assert held.end.tolist() == [pytest.approx(1.0), pytest.approx(3.0)]
    assert held.time_us == pytest.approx(3.0)


def test_the_lower_bound_is_the_compute_or_the_remote_bytes_at_the_drain():
    # 2 L1 + 3 L2 tiles of 1 us on one program: 5 us; each L2 tile pushes 1000 bytes.
    work, rates = one_block(1000.0, l1=2, l2=3), playback.Rates(1, 1.0, 1.0)
    assert rates.lower_bound_us(work, drain=100.0) == pytest.approx(30.0)
    assert rates.lower_bound_us(work, drain=1000.0) == pytest.approx(5.0)
