"""The microbenchmark kernels build, and the host side of launching them is right (no GPU)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from fixtures import MICROBENCH_DEFAULTS, environment

from xstage_bench.data import grid, results
from xstage_bench.data.config import load_config
from xstage_bench.measurement import sweep
from xstage_bench.microbench import (
    build,
    gap_calibration,
    launch,
    planning,
    runner,
    stamp_metrics,
    store_pattern,
)
from xstage_bench.microbench.errors import MicrobenchError, PointUnsupported

ENVIRONMENT = environment(simulated=False)

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "kernels" / "microbench" / "burst.cu"
C_TYPES = {
    "int": launch.I32,
    "unsigned int": launch.U32,
    "long long": launch.I64,
    "unsigned long long": launch.U64,
}


def kernel_signatures(text: str) -> dict[str, list[tuple[str, str]]]:
    """extern "C" kernels of a .cu file -> [(parameter name, launch type)]."""
    sigs = {}
    pattern = r'extern "C" __global__ void(?: __launch_bounds__\(\d+\))?\s+(\w+)\(([^)]*)\)'
    for name, params in re.findall(pattern, text):
        parsed = []
        for param in params.split(","):
            ctype, pname = " ".join(param.split()).rsplit(" ", 1)
            ctype = ctype.removeprefix("const ")
            parsed.append((pname, launch.PTR if ctype.endswith("*") else C_TYPES[ctype]))
        sigs[name] = parsed
    return sigs


# --- build ----------------------------------------------------------------------------


def c_defines(text: str, prefix: str) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in re.findall(rf"#define ({prefix}\w*) (\d+)", text)}


def test_next_operations_and_stamp_rows_match_the_kernel():
    text = SOURCE.read_text()
    defines = c_defines(text, "NEXT_")
    assert {f"NEXT_{op.upper()}": code for op, code in launch.NEXT_OPS.items()} == defines
    assert c_defines(text, "TMA_BYTES") == {"TMA_BYTES": launch.TMA_BYTES}
    assert "stamps: [3][n_bursts][K]" in text and launch.STAMP_ROWS == 3
    assert launch.scratch_bytes(132) == 132 * 64 + 1024


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH: cannot compile .cu")
def test_burst_cu_compiles_to_sm90_code_and_ptx_with_every_kernel(tmp_path):
    """Hopper machine code, and the PTX a later GPU (B200, sm_100) is compiled from when
    the module loads: sm_90 machine code alone does not run there."""
    cubin = build.build_cubin(SOURCE, tmp_path / "sub" / "burst.cubin")
    data = cubin.read_bytes()
    assert data[:4] == b"\x50\xed\x55\xba"  # a fatbin
    assert b"\x7fELF" in data and b".target sm_90" in data  # machine code and its PTX
    for name in launch.KERNEL_PARAMS:
        assert name.encode() in data, f"kernel {name} missing from the image"


def test_build_without_nvcc_names_the_problem(monkeypatch, tmp_path):
    monkeypatch.setattr(build.shutil, "which", lambda _: None)
    with pytest.raises(build.BuildError, match="nvcc is not on PATH"):
        build.build_cubin(SOURCE, tmp_path / "x.cubin")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH: cannot compile .cu")
def test_build_error_carries_the_compiler_message(tmp_path):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k() { undeclared_thing(); }\n')
    with pytest.raises(build.BuildError, match="undeclared_thing"):
        build.build_cubin(bad, tmp_path / "bad.cubin")


# --- arguments --------------------------------------------------------------------------


def test_argument_tables_match_the_kernel_signatures():
    sigs = kernel_signatures(SOURCE.read_text())
    assert set(sigs) == set(launch.KERNEL_PARAMS)
    for name, params in launch.KERNEL_PARAMS.items():
        assert sigs[name] == list(params), name


def test_pack_args_orders_and_types_the_values():
    names = [n for n, _ in launch.KERNEL_PARAMS["bulk_store"]]
    packed = launch.pack_args("bulk_store", {"tag": 7, "bytes": 1 << 33, "dst": 0xDEAD0000})
    assert names == ["dst", "bytes", "tag"]
    assert [type(v) for v in packed] == [np.uint64, np.uint64, np.uint32]
    assert [int(v) for v in packed] == [0xDEAD0000, 1 << 33, 7]


def test_pack_args_rejects_missing_unknown_and_overflowing_values():
    with pytest.raises(ValueError, match=r"missing arguments \['tag'\]"):
        launch.pack_args("bulk_store", {"dst": 1, "bytes": 2})
    with pytest.raises(ValueError, match=r"unknown arguments \['extra'\]"):
        launch.pack_args("bulk_store", {"dst": 1, "bytes": 2, "tag": 3, "extra": 4})
    with pytest.raises(ValueError, match="tag=4294967296 does not fit uint32"):
        launch.pack_args("bulk_store", {"dst": 1, "bytes": 2, "tag": 1 << 32})


def test_error_flags_are_described():
    assert "barrier" in launch.describe_error(1)
    text = launch.describe_error(2 | 64)
    assert "acknowledgement" in text and "0x40" in text


# --- plans ------------------------------------------------------------------------------


def point(**over) -> dict:
    p = {
        "id": "t/x",
        "kind": "periodic",
        "study": "t",
        "K": 132,
        "V": 4 << 20,
        "gap_us": 0.0,
        **MICROBENCH_DEFAULTS,
    }
    p.update(over)
    p["B"] = grid.producer_bytes(p["V"], p["K"])
    return p


def test_plan_same_pattern_uses_one_slot_and_whole_lines():
    p = planning.plan_train(point(), bursts=6, warmup_bursts=2, world_size=2)
    assert p.n_slots == 1 and p.n_dst == 1 and p.idle_us == 0
    assert p.slot_stride % 128 == 0 and p.slot_stride >= p.K * p.B


def test_plan_rotate_fills_the_buffer_with_slots():
    p = planning.plan_train(
        point(pattern="rotate"), bursts=6, warmup_bursts=2, world_size=2, buffer_bytes=64 << 20
    )
    assert p.n_slots == (64 << 20) // p.slot_stride >= 15


def test_plan_refuses_more_peers_than_the_machine_has():
    with pytest.raises(PointUnsupported, match="peers=2 needs 3 GPUs.*world_size=2"):
        planning.plan_train(point(peers=2), bursts=6, warmup_bursts=2, world_size=2)
    # The local control has no peers to run out of: it mimics them with local buffers.
    assert (
        planning.plan_train(
            point(peers=2, dest="local"), bursts=6, warmup_bursts=2, world_size=2
        ).n_dst
        == 2
    )


def test_plan_refuses_bad_axes_and_oversized_rotation():
    for over, msg in [
        ({"width": 2}, "store width"),
        ({"sync": "x"}, "sync"),
        ({"gap_mode": "x"}, "gap_mode"),
        ({"pattern": "x"}, "pattern"),
    ]:
        with pytest.raises(PointUnsupported, match=msg):
            planning.plan_train(point(**over), bursts=6, warmup_bursts=2, world_size=2)
    with pytest.raises(PointUnsupported, match="rotate"):
        planning.plan_train(
            point(pattern="rotate", V=16 << 20),
            bursts=6,
            warmup_bursts=2,
            world_size=2,
            buffer_bytes=24 << 20,
        )


def test_plan_carries_the_next_operation_and_refuses_it_with_the_barrier():
    assert planning.plan_train(point(), bursts=6, warmup_bursts=2, world_size=2).next_op == "none"
    plan = planning.plan_train(point(next_op="atomic"), bursts=6, warmup_bursts=2, world_size=2)
    assert plan.next_op == "atomic"
    with pytest.raises(PointUnsupported, match="next_op 'fence' needs sync 'free'"):
        planning.plan_train(
            point(next_op="fence", sync="barrier"), bursts=6, warmup_bursts=2, world_size=2
        )
    with pytest.raises(PointUnsupported, match="next_op must be one of"):
        planning.plan_train(point(next_op="store"), bursts=6, warmup_bursts=2, world_size=2)


def test_isolated_idle_drains_the_largest_burst():
    assert planning.isolated_idle_us(1 << 20) == planning.ISOLATED_MIN_IDLE_US
    assert planning.isolated_idle_us(32 << 20) == pytest.approx(3 * (32 << 20) / 300e3)
    p = planning.plan_train(
        point(kind="isolated", V=32 << 20), bursts=6, warmup_bursts=2, world_size=2
    )
    assert p.idle_us == pytest.approx(planning.isolated_idle_us(p.K * p.B))


def test_plan_host_has_one_buffer_per_destination_index_on_one_gpu():
    p = planning.plan_train(point(dest="host", peers=2), bursts=6, warmup_bursts=2, world_size=1)
    assert p.dest == "host" and p.n_dst == 2  # host memory is not limited by the GPU count
    assert p.producers_of(0) + p.producers_of(1) == p.K


def test_plan_refuses_the_peer_path_on_one_gpu_and_says_what_one_gpu_measures():
    with pytest.raises(PointUnsupported, match=r"world_size=1 \(no peer GPU\).*dest 'host'"):
        planning.plan_train(point(), bursts=6, warmup_bursts=2, world_size=1)
    with pytest.raises(PointUnsupported, match="dest must be one of"):
        planning.plan_train(point(dest="nvme"), bursts=6, warmup_bursts=2, world_size=2)


def test_isolated_idle_is_sized_from_the_path():
    V = 32 << 20
    host = planning.plan_train(
        point(kind="isolated", V=V, dest="host"), bursts=6, warmup_bursts=2, world_size=1
    )
    peer = planning.plan_train(point(kind="isolated", V=V), bursts=6, warmup_bursts=2, world_size=2)
    # 3 V at 40 GB/s on the host path (its SM stores drain at ~52), 300 GB/s on the peer path
    assert host.idle_us == pytest.approx(3 * host.K * host.B / 40e3)
    assert peer.idle_us == pytest.approx(3 * peer.K * peer.B / 300e3)
    assert (
        planning.ISOLATED_IDLE_RATE_GBps["host"] < 52.0 < planning.ISOLATED_IDLE_RATE_GBps["peer"]
    )
    assert planning.isolated_idle_rule("host") == "max(200, 3 V / 40 GB/s) us"


def test_destinations_of_a_one_gpu_bench():
    """Sender GPU 3 alone: host buffers (one per index) and local ones; no peer."""
    host = planning.destination_specs("host", 2, 3, [])
    assert [(s.on_host, s.role, s.index) for s in host] == [
        (True, "host_dest", 0),
        (True, "host_dest", 1),
    ]
    assert host[1].label("host", 1) == "host destination 1 (host memory)"
    local = planning.destination_specs("local", 2, 3, [])
    assert [(s.device, s.role, s.index) for s in local] == [(3, "local", 0), (3, "local", 1)]
    with pytest.raises(PointUnsupported, match="needs a peer GPU.*only the sender \\(GPU 3\\)"):
        planning.destination_specs("peer", 1, 3, [])
    peer = planning.destination_specs("peer", 2, 0, [1, 2])
    assert [(s.device, s.role) for s in peer] == [(1, "dest"), (2, "dest")]
    assert planning.ceiling_spec("host", 3, []) == planning.DestinationSpec(None, "ceiling_dst", 0)
    assert planning.ceiling_spec("peer", 0, [1]).device == 1
    assert planning.ceiling_spec("local", 0, [1]).device == 0


def test_pattern_mismatches_checks_a_large_buffer_chunk_by_chunk():
    words = np.arange(1000, dtype=np.uint32) ^ np.uint32(store_pattern.mix(9))
    assert store_pattern.pattern_mismatches(words, 9, chunk_words=64) == (0, None)
    words[[130, 131, 999]] = store_pattern.POISON_WORD
    assert store_pattern.pattern_mismatches(words, 9, chunk_words=64) == (3, 130)
    assert store_pattern.pattern_mismatches(words, 8, chunk_words=64)[0] == 1000  # another tag
    # a view that starts inside the buffer counts its words from there
    tail = np.arange(500, 600, dtype=np.uint32) ^ np.uint32(store_pattern.mix(9))
    assert store_pattern.pattern_mismatches(tail, 9, first_word=500, chunk_words=7) == (0, None)


# --- the pattern ------------------------------------------------------------------------


def simulate_launch(p: planning.TrainPlan, d: int, tag_base: int, slot_base: int, nbytes: int):
    """burst_train's stores into destination d, replayed burst by burst on the host."""
    buf = np.full(nbytes // 4, store_pattern.POISON_WORD, dtype=np.uint32)
    for n in range(p.n_bursts):
        m = (tag_base + n) * 0x9E3779B1 % 2**32
        for k in range(d, p.K, p.n_dst):
            off = ((slot_base + n) % p.n_slots) * p.slot_stride + (k // p.n_dst) * p.B
            w = np.arange(off // 4, (off + p.B) // 4, dtype=np.uint64)
            buf[off // 4 : (off + p.B) // 4] = (w ^ m).astype(np.uint32)
    return buf


@pytest.mark.parametrize(
    "over",
    [
        {"K": 5, "V": 5 * 96},
        {"K": 7, "V": 7 * 64, "peers": 3, "dest": "local"},
        {"K": 3, "V": 3 * 48, "pattern": "rotate"},
    ],
)
def test_expected_words_match_a_replay_of_the_stores(over):
    nbytes = 2048 if over.get("pattern") == "rotate" else 8192
    p = planning.plan_train(
        point(**over), bursts=5, warmup_bursts=1, world_size=4, buffer_bytes=nbytes
    )
    slot_base = 3
    last = store_pattern.last_burst_per_slot(p.n_bursts, p.n_slots, slot_base)
    for d in range(p.n_dst):
        want = store_pattern.expected_words(
            producers=p.producers_of(d),
            B=p.B,
            slot_stride=p.slot_stride,
            last_burst=last,
            tag_base=77,
            buffer_bytes=nbytes,
        )
        got = simulate_launch(p, d, 77, slot_base, nbytes)[: want.size]
        assert store_pattern.compare_words(got, want, "dest") is None
        written = (want != store_pattern.POISON_WORD).sum()
        assert written == len(last) * p.producers_of(d) * p.B // 4


def test_compare_words_names_the_first_wrong_word():
    want = store_pattern.expected_words(
        producers=2, B=64, slot_stride=128, last_burst={0: 4}, tag_base=1, buffer_bytes=1 << 20
    )
    assert want.size == (128 + store_pattern.GUARD_BYTES) // 4
    got = want.copy()
    got[5] = store_pattern.POISON_WORD
    got[40] = 0  # past the footprint: the guard band must keep its poison
    msg = store_pattern.compare_words(got, want, "peer destination 0")
    assert msg.startswith("peer destination 0: 2 of")
    assert "first at byte 20" in msg and "never written" in msg


# --- stamps -> samples ------------------------------------------------------------------


def synthetic_stamps(n_bursts=6, K=4, period=10_000, loop=2_000, skew=100):
    """Producer k starts burst n at n*period + k*skew and stores for loop + k*10 ns."""
    n = np.arange(n_bursts)[:, None]
    k = np.arange(K)[None, :]
    start = 1_000_000 + n * period + k * skew
    end = start + loop + k * 10
    return start.astype(np.uint64), end.astype(np.uint64)


def test_train_metrics_of_a_periodic_launch():
    start, end = synthetic_stamps()
    m = stamp_metrics.train_metrics(start, end, warmup=2, kind="periodic", producer_bytes=1000)
    assert m["t_iss_slowest_us"] == [2.03] * 4
    assert m["t_iss_window_us"] == pytest.approx([2.33] * 4)  # 3 skews + slowest loop
    assert m["start_skew_us"] == [0.3] * 4
    assert m["period_us"] == [10.0] * 3  # steady bursts with a successor: n = 2, 3, 4
    assert m["gap_measured_us"] == pytest.approx([(10_000 - 2_015) / 1e3] * 3)
    assert len(m["warmup_t_iss_slowest_us"]) == 2 and len(m["warmup_t_iss_window_us"]) == 2
    # 13 bursts of 1000 bytes end inside the all-producers-active window of 31.7 us.
    assert m["issue_rate_GBps"] == [pytest.approx(13 * 1000 / 31_700)]


def test_issue_rate_is_the_aggregate_rate_of_drifting_producers():
    """Producer k repeats every 10 (1 + k/5) us: the leader's period (the earliest start's
    spacing) would overstate the aggregate rate; the issue rate recovers sum_k B / period_k,
    and the per-producer median period stays close to it."""
    n_bursts, K, B = 60, 4, 4000
    periods = 10_000 * (1 + np.arange(K) / 5)
    start = (1_000_000 + np.arange(n_bursts)[:, None] * periods[None, :]).astype(np.uint64)
    end = start + 3_000
    m = stamp_metrics.train_metrics(start, end, warmup=4, kind="periodic", producer_bytes=B)
    true_rate = (B / periods).sum()
    assert m["issue_rate_GBps"][0] == pytest.approx(true_rate, rel=0.03)
    leader_rate = K * B / np.median(np.diff(start.min(axis=1).astype(float)))  # bytes/ns
    assert leader_rate > 1.2 * true_rate
    assert K * B / np.median(m["period_us"]) / 1e3 == pytest.approx(true_rate, rel=0.05)


def test_issue_rate_needs_a_window_where_every_producer_is_steady():
    start, end = synthetic_stamps(n_bursts=3, K=2, period=1_000, loop=500, skew=5_000)
    assert (
        stamp_metrics.issue_rate_GBps(start.astype(np.int64), end.astype(np.int64), 1, 64) is None
    )


def test_warmup_bursts_are_kept_apart():
    start, end = synthetic_stamps()
    end[0] += 50_000  # a slow first burst must not leak into the steady samples
    m = stamp_metrics.train_metrics(start, end, warmup=1, kind="periodic", producer_bytes=1000)
    assert max(m["t_iss_slowest_us"]) == pytest.approx(2.03)
    assert m["warmup_t_iss_slowest_us"][0] == pytest.approx(52.03)


def test_isolated_metrics_have_no_period_and_bad_warmup_is_refused():
    start, end = synthetic_stamps()
    m = stamp_metrics.train_metrics(start, end, warmup=0, kind="isolated", producer_bytes=1000)
    assert "period_us" not in m and len(m["t_iss_slowest_us"]) == 6
    with pytest.raises(ValueError, match="warmup"):
        stamp_metrics.train_metrics(start, end, warmup=6, kind="isolated", producer_bytes=1000)


def barrier_stamps(hold_ns=(0, 0, 0, 0, 0, 0), base=400, gap=3_000, loop=2_000, K=4, gap_spread=0):
    """An aligned train: producer k stores for loop + 10k ns, spends the gap (plus
    k * gap_spread ns: gaps spun in cycles differ between SMs), reaches the barrier; the
    barrier opens `base` ns after the last arrival, plus the drain's hold."""
    n_bursts = len(hold_ns)
    start = np.zeros((n_bursts, K), dtype=np.int64)
    end, reach = np.zeros_like(start), np.zeros_like(start)
    reach[0] = 1_000_000 + 50 * np.arange(K)  # launch skew: the first barrier has no stores
    for n in range(n_bursts):
        start[n] = reach[n].max() + base + (hold_ns[n - 1] if n else 0)
        end[n] = start[n] + loop + 10 * np.arange(K)
        if n + 1 < n_bursts:
            reach[n + 1] = end[n] + gap + gap_spread * np.arange(K)
    return start, end, reach


def test_barrier_metrics_move_the_hold_out_of_the_store_loop():
    """The stall that lands on the barrier's atomic is the sender-visible issue time's,
    not the store loop's: t_vis = store loop (slowest) + hold; the gap and base apart."""
    hold = (0, 0, 30_000, 30_000, 30_000, 0)
    start, end, reach = barrier_stamps(hold)
    m = stamp_metrics.train_metrics(start, end, 2, "periodic", 1000, reach)
    assert m["barrier_base_us"] == [0.4]
    assert m["gap_spent_us"] == pytest.approx([3.0] * 3)
    assert m["hold_us"] == pytest.approx([30.0, 30.0, 30.0])  # bursts 2, 3, 4 (a successor)
    # period = median start-to-start = slowest loop 2.03 + gap 3 + base 0.4 + hold
    assert m["period_us"] == pytest.approx([35.43] * 3)
    assert m["t_vis_slowest_us"] == pytest.approx([32.03] * 3)
    assert m["t_iss_slowest_us"] == pytest.approx([2.03] * 4)  # the store loop never saw it
    free = stamp_metrics.train_metrics(start, end, 2, "periodic", 1000)
    assert "t_vis_slowest_us" not in free and "hold_us" not in free


def test_a_spread_of_gaps_is_not_charged_to_the_issue_time():
    """Producers whose gaps differ (the last one's 1.5 us longer here) and no hold: the
    barrier opens on the longest gap, and the sender-visible time stays the store loop (it
    was period - median gap - base, which counted 0.75 us of that spread as issue time)."""
    start, end, reach = barrier_stamps(gap_spread=500)
    m = stamp_metrics.train_metrics(start, end, 2, "periodic", 1000, reach)
    assert m["hold_us"] == pytest.approx([0.0] * 3)
    assert m["t_vis_slowest_us"] == pytest.approx([2.03] * 3)
    period, gap, (base,) = m["period_us"][0], m["gap_spent_us"][0], m["barrier_base_us"]
    assert period - gap - base == pytest.approx(2.03 + 0.75, abs=0.02)  # the old reading


def test_a_hold_below_zero_is_the_timers_tick_not_a_shorter_issue_time():
    """A barrier that opens a tick sooner after the last arrival than the launch's first
    one gives a hold below 0; the sender-visible time never drops below the store loop."""
    start, end, reach = barrier_stamps()
    start[3:] -= 256  # bursts 3 on: their barrier opened 256 ns sooner than the first
    end[3:] -= 256
    reach[4:] -= 256
    m = stamp_metrics.train_metrics(start, end, 2, "periodic", 1000, reach)
    assert min(m["hold_us"]) == pytest.approx(-0.256)
    assert m["t_vis_slowest_us"] == pytest.approx([2.03] * 3)


def test_check_reach_catches_stamps_outside_their_gap():
    start, end, reach = barrier_stamps()
    stamp_metrics.check_reach(start, end, reach, "ok")
    late = reach.copy()
    late[3, 1] = start[3, 1] + 1
    with pytest.raises(MicrobenchError, match="outside its gap"):
        stamp_metrics.check_reach(start, end, late, "x")
    early = reach.copy()
    early[3, 1] = end[2, 1] - 1
    with pytest.raises(MicrobenchError, match="outside its gap"):
        stamp_metrics.check_reach(start, end, early, "x")
    unset = reach.copy()
    unset[2, 0] = 0
    with pytest.raises(MicrobenchError, match="never written"):
        stamp_metrics.check_reach(start, end, unset, "x")


def test_probe_metrics_use_the_earliest_ack_and_the_last_fence():
    start, end = synthetic_stamps(n_bursts=3)
    fence = end + 500
    ack = start.min(axis=1, keepdims=True) + np.array([[9_000, 8_000, 7_000, 9_500]])
    m = stamp_metrics.probe_metrics(np.stack([start, end, fence, ack]), warmup=1)
    assert m["visible_us"] == [7.0, 7.0]
    assert m["fence_us"] == pytest.approx([(300 + 2_030 + 500) / 1e3] * 2)


def test_check_stamps_catches_missing_and_reversed_stamps():
    start, end = synthetic_stamps()
    stamp_metrics.check_stamps(np.stack([start, end]), "ok")
    bad = np.stack([start, end])
    bad[1, 2, 1] = 0
    with pytest.raises(MicrobenchError, match="never written"):
        stamp_metrics.check_stamps(bad, "x")
    with pytest.raises(MicrobenchError, match="ends before"):
        stamp_metrics.check_stamps(np.stack([end, start]), "x")


def test_stamps_extra_is_relative_to_the_first_start():
    start, end = synthetic_stamps(n_bursts=2, K=2)
    extra = stamp_metrics.stamps_extra(start, end)
    assert extra["start"] == [[0, 100], [10_000, 10_100]]
    assert extra["end"][0] == [2_000, 2_110]
    assert "reach" not in extra
    assert stamp_metrics.stamps_extra(start, end, start - 7)["reach"][0] == [-7, 93]


def test_gap_calibration_fit_and_iterations():
    cal = gap_calibration.fit_gap_calibration([0, 1000, 4000], [500.0, 5500.0, 20500.0])
    assert cal["ns_per_iter"] == pytest.approx(5.0) and cal["fixed_ns"] == pytest.approx(500.0)
    assert gap_calibration.gap_iterations(cal, 0.0) == 0
    assert gap_calibration.gap_iterations(cal, 10.0) == 1900  # (10000 - 500) / 5
    assert gap_calibration.gap_iterations(cal, 0.1) == 0  # shorter than the fixed cost
    with pytest.raises(MicrobenchError, match="not increasing"):
        gap_calibration.fit_gap_calibration([0, 1000], [500.0, 400.0])


def test_gap_calibration_reaches_hundreds_of_us_and_refuses_to_extrapolate():
    # At H200's ~5 ns per FMA-loop iteration the calibration spans about 640 us, past the
    # longest configured gap and past V/R of a 16 MiB burst on the host path (~320 us).
    iters = launch.GAP_CALIBRATION_ITERS
    cal = gap_calibration.fit_gap_calibration(iters, [284.0 + 4.96 * i for i in iters])
    assert cal["longest_calibrated_us"] == pytest.approx(635, rel=0.01)
    config = load_config(ROOT / "config.yaml")["microbench"]
    longest_gap = max(max(s.get("gap_us", [0])) for s in config["studies"].values())
    assert 16 * (1 << 20) / 52e3 < longest_gap <= cal["longest_calibrated_us"]
    assert gap_calibration.gap_iterations(cal, longest_gap) == round(
        (longest_gap * 1e3 - 284) / 4.96
    )
    with pytest.raises(PointUnsupported, match="beyond the calibrated compute gaps"):
        gap_calibration.gap_iterations(cal, 2 * cal["longest_calibrated_us"])
    bent = [284.0 + 4.96 * i * (1.3 if i == max(iters) else 1.0) for i in iters]
    with pytest.raises(MicrobenchError, match="not linear"):
        gap_calibration.fit_gap_calibration(iters, bent)


# --- the runner, against a fake GPU -----------------------------------------------------


class FakeBench:
    """BurstBench's interface with synthetic stamps: how the runner pools and records."""

    threads = 512
    buffer_bytes = 256 << 20

    def __init__(self, wrong: str | None = None, gpu_ids=(0, 1)):
        self.wrong = wrong
        self.gpu_ids = list(gpu_ids)
        self.launches = []
        self.checked_dests = []

    def require_coresident(self, kernel, K, shared_bytes):
        return 264

    def gap_calibration(self, K):
        # 5 ns per iteration past 100 ns, calibrated up to 500 us
        cal = gap_calibration.fit_gap_calibration(
            [0, 20_000, 100_000], [100.0, 100_100.0, 500_100.0]
        )
        return {"K": K, "threads": 512, **cal}

    def check_train(self, plan, *, gap_iters, tag_base, kernel_tag_base=None):
        self.checked_dests.append(plan.dest)
        if kernel_tag_base not in (None, tag_base):
            return "dest 0: every word holds another launch's tag"
        return self.wrong

    def run_train(self, plan, *, tag_base, slot_base, gap_iters):
        self.launches.append((tag_base, slot_base, gap_iters))
        start, end = synthetic_stamps(n_bursts=plan.n_bursts, K=plan.K)
        reach = end + 1_000 if plan.sync == "barrier" else None
        if reach is not None:  # the first barrier opens the launch: before the first start
            reach[0] = start[0] - 500
        return stamp_metrics.TrainStamps(start, end, reach)


def microbench_config():
    return load_config(ROOT / "config.yaml")["microbench"]


def test_runner_pools_launches_and_keeps_stamps_for_the_chosen_gaps(capsys):
    mb = microbench_config()
    bench = FakeBench()
    measure = runner.PointMeasurer(bench, mb, policy=None)
    pts = {
        p["gap_us"]: p
        for p in grid.microbench_points(mb, "gap_sweep")
        if "/V=4194304/" in p["id"] and p["dest"] == "peer"
    }
    record = measure(pts[10.0])
    assert record["status"] == "ok" and record["correct"] is True
    steady = mb["bursts"] - mb["warmup_bursts"]
    assert record["summary"]["t_iss_slowest_us"]["n"] == steady * mb["launches"]
    assert record["summary"]["period_us"]["n"] == (steady - 1) * mb["launches"]
    assert record["summary"]["issue_rate_GBps"]["n"] == mb["launches"]
    assert record["summary"]["warmup_t_iss_window_us"]["n"] == mb["warmup_bursts"] * mb["launches"]
    assert len(record["extra"]["stamps_ns"]["start"]) == mb["bursts"]
    assert record["extra"]["gap_iters"] == 1980  # (10000 - 100) / 5
    assert [s for _, s, _ in bench.launches] == [n * mb["bursts"] for n in range(mb["launches"])]
    assert "stamps_ns" not in measure(pts[4.0])["extra"]
    doc = results.raw_document(
        experiment="microbench",
        backend="cuda",
        dataset="d",
        environment=dict(ENVIRONMENT),
        config={},
        records=[record],
        study="gap_sweep",
    )
    results.validate_raw(doc, "in-memory")
    assert "period_us=10.000" in capsys.readouterr().err


def test_runner_records_the_sender_visible_time_of_aligned_trains():
    mb = microbench_config()
    pts = [
        p
        for p in grid.microbench_points(mb, "gap_sweep_barrier")
        if p["gap_us"] == 10.0 and p["dest"] == "peer"
    ]
    record = runner.PointMeasurer(FakeBench(), mb, policy=None)(pts[0])
    assert record["status"] == "ok"
    steady = mb["bursts"] - mb["warmup_bursts"]
    for metric in ("t_vis_slowest_us", "hold_us", "gap_spent_us"):
        assert record["summary"][metric]["n"] == (steady - 1) * mb["launches"], metric
    assert record["summary"]["barrier_base_us"]["n"] == mb["launches"]
    assert len(record["extra"]["stamps_ns"]["reach"]) == mb["bursts"]


def test_next_op_points_carry_the_axis_and_other_studies_keep_their_ids():
    mb = microbench_config()
    ops = {p["next_op"] for p in grid.microbench_points(mb, "next_op")}
    assert ops == set(launch.NEXT_OPS)
    assert all("/next_op=" in p["id"] for p in grid.microbench_points(mb, "next_op"))
    # a committed record's id (before the axis existed) is still the point's id
    ids = {p["id"] for p in grid.microbench_points(mb, "gap_sweep_barrier")}
    assert (
        "gap_sweep_barrier/K=132/V=4194304/gap_us=0/width=16/dest=remote/pattern=same/peers=1/"
        "sync=barrier/gap_mode=compute"
    ).replace("dest=remote", "dest=peer") in ids
    assert not any("next_op" in p for p in grid.microbench_points(mb, "gap_sweep"))


def test_runner_records_wrong_and_unsupported_points():
    mb = microbench_config()
    p = grid.microbench_points(mb, "gap_sweep")[0]
    wrong = runner.PointMeasurer(FakeBench(wrong="dest 0: 3 words wrong"), mb, None)(p)
    assert wrong["status"] == "wrong" and wrong["correct"] is False
    assert "3 words wrong" in wrong["error"]
    unsupported = runner.PointMeasurer(FakeBench(), mb, None)({**p, "peers": 3})
    assert unsupported["status"] == "unsupported" and "peers=3" in unsupported["error"]


def test_injected_faults_become_wrong_and_failed_records(monkeypatch, tmp_path):
    """The GPU demonstration's logic on a fake bench: one point launches a wrong kernel,
    one raises; both are recorded with their reason and the sweep completes."""
    mb = microbench_config()
    points = grid.microbench_points(mb, "gap_sweep")[:4]
    monkeypatch.setenv("XSTAGE_INJECT_FAULT", f"wrong:{points[1]['id']};raise:{points[2]['id']}")
    doc = sweep.run_sweep(
        points,
        runner.PointMeasurer(FakeBench(), mb, None),
        tmp_path / "gap_sweep.json",
        experiment="microbench",
        backend="cuda",
        dataset="fake",
        environment=dict(ENVIRONMENT),
        config={},
        study="gap_sweep",
        progress=lambda line: None,
    )
    statuses = [r["status"] for r in doc["records"]]
    assert statuses == ["ok", "wrong", "failed", "ok"]
    assert "another launch's tag" in doc["records"][1]["error"]
    assert "injected fault" in doc["records"][2]["error"]


def one_gpu_points(study: str) -> list[dict]:
    mb = microbench_config()
    return grid.microbench_points(mb, study, runner.run_paths({"store_paths": "auto"}, 1))


def test_one_gpu_measures_host_and_local_points():
    mb = microbench_config()
    bench = FakeBench(gpu_ids=[0])
    measure = runner.PointMeasurer(bench, mb, policy=None)
    pts = one_gpu_points("gap_sweep")
    assert {p["dest"] for p in pts} == {"host", "local"}
    assert {p["path"] for p in pts} == {"host", "local"}
    host = next(p for p in pts if p["dest"] == "host" and p["gap_us"] == 200.0)
    record = measure(host)
    assert record["status"] == "ok" and record["correct"] is True
    assert record["extra"]["plan"]["dest"] == "host" and bench.checked_dests == ["host"]
    # A peer point (a config naming dest: peer) on one GPU: unsupported, saying why.
    peer = measure({**host, "dest": "peer", "path": "peer", "id": "peer-on-one-gpu"})
    assert peer["status"] == "unsupported" and "no peer GPU" in peer["error"]


def test_drain_probe_and_peer_ceiling_are_unsupported_on_the_host_path():
    mb = microbench_config()
    measure = runner.PointMeasurer(FakeBench(gpu_ids=[0]), mb, policy=None)
    probes = one_gpu_points("drain_probe")
    assert probes and {p["dest"] for p in probes} == {"host"}
    record = measure(probes[0])
    assert record["status"] == "unsupported"
    assert "receiver is a kernel on the peer GPU" in record["error"]
    ceiling = next(p for p in grid.microbench_points(mb, "ceilings") if p["dest"] == "peer")
    record = measure(ceiling)
    assert record["status"] == "unsupported" and "world_size=1" in record["error"]


def test_raw_config_records_the_paths_and_their_constants():
    config = load_config(ROOT / "config.yaml")
    raw = runner.raw_config(config, "burst.cubin", [0], ["host"])
    assert raw["store_paths"] == ["host"] and raw["world_size"] == 1
    paths = raw["kernel"]["paths"]
    assert sorted(paths) == ["host", "local"]
    assert paths["host"]["isolated_idle_rate_GBps"] == 40.0
    assert "pinned" in paths["host"]["destination"]
    assert "receiver is a kernel" in paths["host"]["drain_probe"]
    assert raw["kernel"]["gap_calibration_iters"] == list(launch.GAP_CALIBRATION_ITERS)
    both = runner.raw_config(config, "burst.cubin", [0, 1], ["peer", "host"])["kernel"]["paths"]
    assert both["peer"]["drain_probe"] == "measured"


def test_run_paths_resolve_auto_and_refuse_peer_on_one_gpu():
    assert runner.run_paths({}, 1) == ["host"]
    assert runner.run_paths({"store_paths": "auto"}, 2) == ["peer", "host"]
    assert runner.run_paths({"store_paths": ["host"]}, 2) == ["host"]
    with pytest.raises(ValueError, match="store_paths"):
        runner.run_paths({"store_paths": ["peer"]}, 1)


def test_cpu_run_plans_every_path_and_records_why_nothing_was_measured(tmp_path):
    config = load_config(ROOT / "config.yaml")
    config.update(world_size=1, store_paths=["host"])
    out = tmp_path / "drain.json"
    runner.run_study(config, "ceilings", "cpu-test", out, None, device_type="cpu")
    doc = results.read_raw(out)
    assert {r["point"]["dest"] for r in doc["records"]} == {"host", "local"}
    assert {r["status"] for r in doc["records"]} == {"failed"}
    assert all("burst benchmark cannot start" in r["error"] for r in doc["records"])
    assert doc["config"]["store_paths"] == ["host"]


# --- the bench's host destinations, on numpy memory standing in for pinned memory ------


class NumpyHostBuffer:
    """hostmem.PinnedHostBuffer's interface over numpy memory (the CPU tests)."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._memory = np.zeros(nbytes, dtype=np.uint8)
        self.ptr = self._memory.ctypes.data

    def array(self):
        return self._memory

    def fill(self, byte: int) -> None:
        self._memory[:] = byte

    def words(self, n: int):
        return self._memory[: 4 * n].view("<u4").copy()

    def close(self) -> None:
        self._memory = None


def one_gpu_bench(monkeypatch, buffer_bytes: int, replay):
    """A BurstBench of one GPU whose host buffers are numpy memory and whose launches are
    `replay(plan, dest index, tag_base, slot_base) -> words` written into them."""
    from xstage_bench.measurement import hostmem
    from xstage_bench.microbench.bench import BurstBench

    monkeypatch.setattr(hostmem, "PinnedHostBuffer", NumpyHostBuffer)
    bench = object.__new__(BurstBench)  # no CuPy: only the host-memory half is used
    bench.gpu_ids, bench.sender, bench.peers = [0], 0, []
    bench.buffer_bytes, bench._buffers = buffer_bytes, {}
    bench._sync_all = lambda: None

    def run_train(plan, *, tag_base, slot_base, gap_iters):
        for d, (_, dest) in enumerate(bench.destinations(plan.dest, plan.n_dst)):
            written = replay(plan, d, tag_base, slot_base)
            memory = dest.buf.array().view("<u4")
            touched = written != store_pattern.POISON_WORD
            memory[: written.size][touched] = written[touched]

    bench.run_train = run_train
    return bench


def test_check_train_on_host_destinations_poisons_and_reads_back_on_the_host(monkeypatch):
    nbytes = 1 << 20
    bench = one_gpu_bench(
        monkeypatch, nbytes, lambda p, d, tag, base: simulate_launch(p, d, tag, base, nbytes)
    )
    plan = planning.plan_train(
        point(dest="host", peers=2, K=6, V=6 * 4096), bursts=5, warmup_bursts=1, world_size=1
    )
    # stale data from an earlier point must not pass for this launch's stores
    for _, dest in bench.destinations("host", 2):
        dest.buf.fill(0x11)
    assert bench.check_train(plan, gap_iters=0, tag_base=7) is None
    dests = bench.destinations("host", 2)
    assert [type(dest).__name__ for _, dest in dests] == ["HostDestination"] * 2
    assert len({dest.ptr for _, dest in dests}) == 2  # one buffer per destination index
    # the guard band past the footprint was poisoned; beyond what the check reads, untouched
    memory = dests[0][1].buf.array()
    footprint = plan.producers_of(0) * plan.B
    assert (memory[footprint : footprint + store_pattern.GUARD_BYTES] == 0xFF).all()
    assert (memory[footprint + store_pattern.GUARD_BYTES :] == 0x11).all()


def test_check_train_names_the_host_destination_a_store_missed(monkeypatch):
    nbytes = 1 << 20

    def lossy(p, d, tag, base):
        words = simulate_launch(p, d, tag, base, nbytes)
        if d == 1:
            words[3] = store_pattern.POISON_WORD  # a store that never arrived
        return words

    bench = one_gpu_bench(monkeypatch, nbytes, lossy)
    plan = planning.plan_train(
        point(dest="host", peers=2, K=6, V=6 * 4096), bursts=5, warmup_bursts=1, world_size=1
    )
    wrong = bench.check_train(plan, gap_iters=0, tag_base=7)
    assert wrong.startswith("host destination 1 (host memory): 1 of")
    assert "never written" in wrong


def test_host_ceiling_destination_is_checked_on_the_host():
    from xstage_bench.microbench.bench import HostDestination

    dest = HostDestination(NumpyHostBuffer(1 << 16))
    dest.poison()
    assert dest.pattern_errors(1 << 16, tag=3) == (1 << 16) // 4
    words = np.arange((1 << 16) // 4, dtype=np.uint32) ^ np.uint32(store_pattern.mix(3))
    dest.buf.array()[:] = words.view(np.uint8)
    assert dest.pattern_errors(1 << 16, tag=3) == 0
    dest.buf.array()[100] ^= 1
    assert dest.pattern_errors(1 << 16, tag=3) == 1


def test_a_metric_no_launch_could_give_is_left_out_and_said_so():
    """Issue 26: a drain record of ref-h200x2 held `issue_rate_GBps: []` (no launch had a
    steady window): the record now leaves the metric out and says why in extra."""
    from xstage_bench.microbench import runner

    point = {"kind": "periodic", "id": "drain/K=33"}
    measured = runner.PointMeasurer._measured(
        point, ({"period_us": [1.0, 2.0], "issue_rate_GBps": []}, {"launches": 2})
    )
    assert measured.samples == {"period_us": [1.0, 2.0]}
    assert measured.extra["launches"] == 2
    assert "steady bursts" in measured.extra["metrics_without_samples"]["issue_rate_GBps"]
    kept = runner.PointMeasurer._measured(point, ({"period_us": [1.0]}, {}))
    assert "metrics_without_samples" not in kept.extra


def test_the_scratch_buffer_serves_every_K_a_study_may_name():
    """One scratch buffer is cached for the run: it is sized for the schema's largest K
    (a buffer sized by the first point's K refused every larger K, seen on one H100)."""
    import json

    schema = json.loads((ROOT / "src/xstage_bench/data/schemas/config.schema.json").read_text())
    largest = schema["$defs"]["study"]["properties"]["K"]["items"]["maximum"]
    assert launch.MAX_PRODUCERS == largest
    bench_source = (ROOT / "src/xstage_bench/microbench/bench.py").read_text()
    assert "scratch_bytes(MAX_PRODUCERS)" in bench_source


def test_a_hold_about_zero_may_be_a_tick_below_it_and_nothing_else_may():
    """hold_us is start - last arrival - the barrier's own cost: about 0 where the gap hid
    the drain, one timer tick either way; a negative time of any other metric is refused."""
    base = {"status": "ok", "correct": True, "summary": {}}
    assert results._bad_values({**base, "samples": {"hold_us": [-0.256, 0.0, 3.1]}}) is None
    bad = results._bad_values({**base, "samples": {"gap_spent_us": [-0.256, 1.0]}})
    assert "negative" in bad
    assert "<= 0" in results._bad_values({**base, "samples": {"t_vis_slowest_us": [0.0]}})
