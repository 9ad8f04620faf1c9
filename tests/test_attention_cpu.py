"""Ulysses attention on the CPU: the index math, our Triton kernel under the interpreter,
the record building, and the whole multi-process runner on gloo.

The layout tests need only numpy. The rest needs torch and triton (skipped otherwise, as
in CI); the kernel runs under TRITON_INTERPRET=1 in fp16/fp32 (the interpreter's bf16
matmul is wrong, so bf16 is checked on the GPU, where every point is checked anyway).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

from xstage_bench.attention.layout import UlyssesLayout
from xstage_bench.data.config import load_config
from xstage_bench.data.results import read_raw

ROOT = Path(__file__).resolve().parents[1]
HAVE_TORCH_TRITON = all(importlib.util.find_spec(m) for m in ("torch", "triton"))
needs_torch = pytest.mark.skipif(not HAVE_TORCH_TRITON, reason="torch and triton not installed")


# ---- the index math, against a numpy model of the yunchang All-to-All ----------------


def numpy_ulysses_all_to_all(outputs: list[np.ndarray]) -> list[np.ndarray]:
    """yunchang all_to_all_4D (scatter_idx=1, gather_idx=2) for P ranks, in numpy.

    outputs[r]: rank r's (B, S, H/P, D) attention output. all_to_all_single sends chunk j
    of rank r's packed buffer to rank j, where it becomes chunk r.
    """
    p = len(outputs)
    b, s, hl, d = outputs[0].shape
    shard = s // p
    packed = [  # (B, P, S/P, H/P, D) -> (P, H/P, S/P, B, D)
        np.ascontiguousarray(o.reshape(b, p, shard, hl, d).transpose(1, 3, 2, 0, 4))
        for o in outputs
    ]
    finals = []
    for j in range(p):
        received = np.stack([packed[r][j] for r in range(p)])  # (P, H/P, S/P, B, D)
        finals.append(received.reshape(p * hl, shard, b, d).transpose(2, 1, 0, 3))
    return finals


@pytest.mark.parametrize("world_size,heads,seq_len,batch", [(2, 4, 8, 1), (4, 8, 12, 2)])
def test_destination_matches_the_all_to_all(world_size, heads, seq_len, batch):
    lay = UlyssesLayout(batch, seq_len, heads, 3, world_size)
    rng = np.random.default_rng(0)
    outputs = [rng.standard_normal(lay.local_shape) for _ in range(world_size)]
    finals = numpy_ulysses_all_to_all(outputs)
    assert all(f.shape == lay.final_shape for f in finals)
    for src in range(world_size):
        for token in range(seq_len):
            for h in range(lay.local_heads):
                dest, row, head = lay.destination(src, token, h)
                assert dest == lay.owner(token)
                for b in range(batch):
                    np.testing.assert_array_equal(
                        finals[dest][b, row, head], outputs[src][b, token, h]
                    )


def test_layout_rejects_shapes_that_do_not_divide():
    with pytest.raises(ValueError, match="heads=5 do not divide over world_size=2"):
        UlyssesLayout(1, 8, 5, 4, 2)
    with pytest.raises(ValueError, match="seq_len=9 does not divide"):
        UlyssesLayout(1, 9, 4, 4, 2)
    lay = UlyssesLayout(1, 8, 4, 4, 2)
    with pytest.raises(ValueError, match="token=8 outside"):
        lay.owner(8)
    with pytest.raises(ValueError, match="local_head=2 outside"):
        lay.destination(0, 0, 2)
    assert lay.attention_flops() == 4 * 8 * 8 * 2 * 4


# ---- torch: the serial path's reshapes ------------------------------------------------


@needs_torch
def test_pack_unpack_equal_the_numpy_model():
    import torch

    from xstage_bench.attention.layout import pack_for_all_to_all, unpack_after_all_to_all

    p, lay = 4, UlyssesLayout(2, 8, 8, 3, 4)
    outputs = [torch.randn(lay.local_shape, dtype=torch.float64) for _ in range(p)]
    packed = [pack_for_all_to_all(o, p) for o in outputs]
    finals = [
        unpack_after_all_to_all(torch.stack([packed[r][j] for r in range(p)]), p) for j in range(p)
    ]
    expected = numpy_ulysses_all_to_all([o.numpy() for o in outputs])
    for got, want in zip(finals, expected, strict=True):
        np.testing.assert_array_equal(got.numpy(), want)


# ---- our Triton kernel under the interpreter -----------------------------------------


@pytest.fixture
def interpreter(monkeypatch):
    if not HAVE_TORCH_TRITON:
        pytest.skip("torch and triton not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import torch

    from xstage_kernels import flash_ulysses as triton_fa

    # Triton 3.6's interpreter turns scalar arguments into 1-element arrays, which numpy
    # >= 2.4 refuses to convert to an int (a loop bound): such an environment cannot run
    # the kernel at all (envs/kernels-cpu.txt pins numpy below it). Anything else that goes
    # wrong is the kernel's fault and fails the tests that use it.
    if tuple(int(x) for x in np.__version__.split(".")[:2]) >= (2, 4):
        pytest.skip(f"Triton's interpreter needs numpy < 2.4, found {np.__version__}")
    return torch, triton_fa


TINY = {"BLOCK_M": 16, "BLOCK_N": 16}


@pytest.mark.parametrize("dtype_name,seq_len", [("float16", 48), ("float32", 40)])
def test_triton_kernel_matches_sdpa(interpreter, dtype_name, seq_len):
    torch, triton_fa = interpreter
    from xstage_bench.attention.backends import sdpa_reference

    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, seq_len, 3, 32, generator=g).to(dtype) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    triton_fa.flash_attention(q, k, v, out, config=TINY)  # 40 is not a multiple of 16: masks
    ref = sdpa_reference(q.float(), k.float(), v.float())
    tol = 2e-3 if dtype == torch.float16 else 1e-5
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def test_triton_epilogue_routes_rows_to_their_owners(interpreter):
    """One source rank's kernel writing into P destination buffers: every row at the
    (rank, row, head) the layout names, nothing else touched."""
    torch, triton_fa = interpreter
    from xstage_bench.attention.backends import sdpa_reference

    lay, src = UlyssesLayout(2, 60, 6, 16, 3), 1  # 20-row shards straddle tiles
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(lay.local_shape, generator=g).to(torch.float16) for _ in range(3))
    finals = [torch.full(lay.final_shape, float("nan"), dtype=torch.float16) for _ in range(3)]
    ptrs = torch.tensor([f.data_ptr() for f in finals], dtype=torch.int64)
    triton_fa.flash_attention_routed(
        q,
        k,
        v,
        ptrs,
        dest_strides=finals[0].stride()[:3],
        rows_per_dest=lay.shard_len,
        head_offset=lay.head_offset(src),
        config=TINY,
    )
    ref = sdpa_reference(q.float(), k.float(), v.float())
    written = [torch.zeros(lay.final_shape, dtype=torch.bool) for _ in range(3)]
    for token in range(lay.seq_len):
        for h in range(lay.local_heads):
            dest, row, head = lay.destination(src, token, h)
            torch.testing.assert_close(
                finals[dest][:, row, head].float(), ref[:, token, h], atol=2e-3, rtol=2e-3
            )
            written[dest][:, row, head] = True
    for final, mask in zip(finals, written, strict=True):
        assert torch.isnan(final[~mask]).all()  # other ranks' heads untouched


def test_triton_kernel_rejects_bad_inputs(interpreter):
    torch, triton_fa = interpreter
    q = torch.zeros(1, 16, 1, 24)
    with pytest.raises(ValueError, match="head_dim must be a power of two"):
        triton_fa.flash_attention(q, q, q, torch.empty_like(q))
    q = torch.zeros(1, 16, 1, 16)
    ptrs = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="needs 2 destinations"):
        triton_fa.flash_attention_routed(q, q, q, ptrs, dest_strides=(0, 0, 0), rows_per_dest=8)


# ---- one rank in this process: correctness verdicts and records -----------------------


@pytest.fixture
def one_rank(interpreter, monkeypatch):
    """A world of one gloo rank in this process, with the host fabric."""
    torch, _ = interpreter
    import torch.distributed as dist

    from xstage_bench.attention.rank import Rank
    from xstage_bench.measurement.fabric import HostFabric
    from xstage_bench.measurement.timing import TimingPolicy
    from xstage_bench.measurement.workers.launcher import free_port

    dist.init_process_group(
        "gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}"
    )
    fabric = HostFabric(
        rank=0,
        world_size=1,
        run_id=f"t{os.getpid()}",
        ctrl=dist.group.WORLD,
        group=dist.group.WORLD,
        wait_timeout_s=10,
    )
    policy = TimingPolicy(
        warmup=0, min_reps=2, max_reps=2, target_rel_iqr=0.5, budget_s=5, flush_l2=False
    )
    rank = Rank(fabric, policy, torch.float16, TINY)
    yield rank
    rank.close()
    dist.destroy_process_group()


def _point(backend: str, mode: str) -> dict:
    p = {
        "backend": backend,
        "mode": mode,
        "heads": 2,
        "seq_len": 32,
        "head_dim": 16,
        "batch": 1,
        "world_size": 1,
    }
    p["id"] = f"{backend}/{mode}/H=2/S=32/P=1"
    return p


class _ShiftedRows:
    """A broken backend: correct values, stored one token late."""

    name = "broken"

    def __init__(self, inner):
        self.inner = inner

    def local(self, q, k, v, out):
        self.inner.local(q, k, v, out)
        out.copy_(out.roll(1, dims=1))

    def fused(self, q, k, v, target):
        raise AssertionError("not used")


def test_ok_record_has_both_clocks_and_tflops(one_rank):
    record = one_rank.execute(_point("triton", "fused"))
    assert record["status"] == "ok", record.get("error")
    assert set(record["samples"]) == {"sender_us", "completion_us"}
    assert len(record["samples"]["sender_us"]) == 2
    assert all(
        c >= s
        for s, c in zip(
            record["samples"]["sender_us"], record["samples"]["completion_us"], strict=True
        )
    )
    assert record["extra"]["bitwise_equal_serial"] is True
    assert record["extra"]["tflops"] > 0
    assert record["correct"] is True


def test_a_wrong_kernel_is_recorded_wrong_and_not_timed(one_rank):
    from xstage_bench.attention.backends import load_backend

    one_rank.backends["triton"] = _ShiftedRows(load_backend("triton", TINY))
    record = one_rank.execute(_point("triton", "alone"))
    assert record["status"] == "wrong"
    assert "max |error|" in record["error"]
    assert "samples" not in record


def test_missing_backend_is_recorded_unsupported_with_the_import_error(one_rank):
    if importlib.util.find_spec("flash_attn_interface"):
        pytest.skip("FA3 is installed here")
    record = one_rank.execute(_point("fa3", "alone"))
    assert record["status"] == "unsupported"
    assert "No module named 'flash_attn_interface'" in record["error"]


def test_sweep_config_applies_reductions_and_names_bad_keys():
    from xstage_bench.attention import runner
    from xstage_bench.attention.points import ordered_points
    from xstage_bench.attention.rank import point_seed

    cfg = load_config(ROOT / "config.yaml")
    before = copy.deepcopy(cfg)
    small = runner.sweep_config(cfg, ["triton"], [8192], [24], {"min_reps": 3})
    assert small["attention"]["backends"] == ["triton"]
    assert small["attention"]["seq_lens"] == [8192]
    assert small["timing"]["min_reps"] == 3
    assert cfg == before  # the caller's config is not modified
    with pytest.raises(ValueError, match="unknown timing key 'reps'"):
        runner.sweep_config(cfg, timing_overrides={"reps": 3})
    points = ordered_points(small["attention"] | {"modes": ["fused", "alone"]}, 2)
    assert [p["mode"] for p in points] == ["fused", "alone"]
    assert len({point_seed(p["id"], 0) for p in points}) == 2


@needs_torch
def test_the_host_lead_sleeps_before_the_start_barrier_and_checks_each_enqueue():
    """With a lead, the GPU sleep is enqueued before the ranks' barrier (so they still
    leave it together), and the call's enqueue is handed to the lead with the start stamp;
    the config's attention.host_lead turns it on, and a CPU fabric never gets one."""
    from types import SimpleNamespace

    from xstage_bench.attention import runner
    from xstage_bench.attention.modes import timed_rep
    from xstage_bench.attention.raw_config import raw_config

    order = []

    class Fabric:
        def barrier(self):
            order.append("barrier")

        def stamp(self):
            order.append("stamp")
            return len(order)

        def wait(self, event=None):
            pass

        def elapsed_us(self, a, b):
            return float(b - a)

    class Lead:
        def before_start(self, torch):
            order.append("sleep")

        def after_enqueue(self, start, enqueue_us):
            order.append(("enqueued", start, enqueue_us >= 0))

    backend = SimpleNamespace(local=lambda q, k, v, out: order.append("call"))
    ws = SimpleNamespace(fabric=Fabric(), q=None, k=None, v=None, out=None)
    timed_rep(backend, "alone", ws, flush=lambda: order.append("flush"), lead=Lead())
    start = order.index("stamp") + 1  # the stamp's value: its position, counted from 1
    assert order[:6] == ["flush", "sleep", "barrier", "stamp", "call", ("enqueued", start, True)]
    order.clear()
    timed_rep(backend, "alone", ws)
    assert order[:3] == ["barrier", "stamp", "call"]

    cfg = load_config(ROOT / "config.yaml")
    assert cfg["attention"]["host_lead"] is True
    assert runner.attention_policy(cfg).host_lead
    off = copy.deepcopy(cfg)
    del off["attention"]["host_lead"]
    assert not runner.attention_policy(off).host_lead
    assert "host lead" in raw_config(cfg, "cpu", ["host"])["definitions"]
    assert "host lead" not in raw_config(off, "cpu", ["host"])["definitions"]
    from xstage_bench.attention.rank import Rank

    policy = runner.attention_policy(cfg)
    on_cpu = SimpleNamespace(fabric=SimpleNamespace(device_type="cpu"), policy=policy)
    assert Rank._lead(on_cpu) is None  # CPU clocks are host clocks: nothing to lead


# ---- the whole runner: two processes on gloo and the interpreter ----------------------


def _launch_on_cpu_ranks(cfg: dict, out: Path, world_size: int = 2) -> None:
    from xstage_bench.attention import runner

    runner.launch(
        cfg,
        "cpu-test",
        out,
        world_size=world_size,
        device_type="cpu",
        triton_config=TINY,
        point_timeout_s=120,
        wait_timeout_s=120,  # generous: the interpreter on a loaded 2-core CI machine
    )


def _small_config(backends, heads, modes=None, **attention) -> dict:
    from xstage_bench.attention import runner

    cfg = runner.sweep_config(
        load_config(ROOT / "config.yaml"),
        backends,
        [64],
        [heads],
        {"warmup": 0, "min_reps": 2, "max_reps": 2, "flush_l2": False},
        modes=modes,
    )
    cfg["attention"].update(head_dim=16, **attention)
    return cfg


def _assert_paired(records: list[dict]) -> None:
    """The ok records of one group: timed together, sample i of each from round i."""
    tokens = {r["extra"]["paired"]["group"] for r in records}
    assert len(tokens) == 1, tokens
    arms = records[0]["extra"]["paired"]["arms"]
    assert sorted(arms) == sorted(f"{r['point']['backend']}/{r['point']['mode']}" for r in records)
    for r in records:
        paired = r["extra"]["paired"]
        assert paired["arms"] == arms
        assert paired["arm"] == f"{r['point']['backend']}/{r['point']['mode']}"
        assert (
            paired["rounds"] == len(r["samples"]["sender_us"]) == len(r["samples"]["completion_us"])
        )
        # round 0 runs the arms as listed, round 1 reversed
        first = arms.index(paired["arm"])
        assert paired["position"][:2] == [first, len(arms) - 1 - first]
        # each backend's serial over fused time was checked for noise (timing.NoisyRemeasure)
        backends = {a.split("/")[0] for a in arms}
        both = [b for b in backends if {f"{b}/serial", f"{b}/fused"} <= set(arms)]
        ratios = paired.get("remeasure", {}).get("ratios", [])
        compared = {(r["numerator"], r["denominator"]) for r in ratios}
        assert compared == {(f"{b}/serial", f"{b}/fused") for b in both}


@needs_torch
def test_runner_end_to_end_on_two_cpu_ranks(tmp_path):
    """Both paths on a world of two: the peer path in lockstep, then the host path with
    rank 0 alone (rank 1 waiting), each group's arms paired."""
    from xstage_bench.measurement.workers.drive import running_marker

    cfg = _small_config(["triton", "fa4"], 2, host_world_sizes=[2])
    out = tmp_path / "attention.json"
    _launch_on_cpu_ranks(cfg, out)
    doc = read_raw(out)
    status = {r["id"]: r["status"] for r in doc["records"]}
    assert status == {
        f"{b}/{m}/H=2/S=64/P=2{path}": "ok" if b == "triton" else "unsupported"
        for b in ("triton", "fa4")
        for m in ("alone", "serial", "fused")
        for path in ("", "/path=host")
    }
    records = {r["id"]: r for r in doc["records"]}
    fused = records["triton/fused/H=2/S=64/P=2"]
    assert fused["extra"]["bitwise_equal_serial"] is True
    assert fused["point"]["path"] == "peer"
    host = records["triton/fused/H=2/S=64/P=2/path=host"]
    assert host["point"]["path"] == "host" and "emulated_world_size" not in host["point"]
    assert host["extra"]["bitwise_equal_serial"] is True
    assert host["extra"]["host_memory"].startswith("CPU stand-in")
    for path in ("", "/path=host"):
        _assert_paired([records[f"triton/{m}/H=2/S=64/P=2{path}"] for m in MODES])
    peer_token = fused["extra"]["paired"]["group"]
    assert host["extra"]["paired"]["group"] != peer_token  # pairs never span groups
    assert "host path completion" in doc["config"]["definitions"]
    assert doc["environment"]["device_type"] == "cpu"
    assert "not a measurement" in doc["environment"]["note"]
    assert not running_marker(out).exists()
    json.dumps(doc)  # plain JSON all the way down


MODES = ("alone", "serial", "fused")


# ---- an emulated world size: two ranks play ranks 0 and P-1 of a P-GPU node ----------


@pytest.mark.parametrize("size", [3, 4, 8])
def test_emulated_node_keeps_one_owner_and_sends_the_rest(size):
    from xstage_bench.attention.emulation import EmulatedNode

    node = EmulatedNode(UlyssesLayout(1, 8 * size, size, 16, size))
    assert (node.plays(0), node.plays(1)) == (0, size - 1)
    for rank in (0, 1):
        positions = [node.position(rank, v) for v in range(size)]
        assert positions == list(range(positions[0], positions[0] + size))  # one strided range
        assert max(positions) < 2 * size
        assert node.owners_on(rank, rank) == [node.plays(rank)]  # 1/P stays
        assert len(node.owners_on(rank, 1 - rank)) == size - 1  # (P-1)/P crosses
    # A chunk both senders write is shared by owners of different virtual ranks, whose
    # heads differ: no element is written twice.
    shared = {node.position(0, v) for v in range(size)} & {node.position(1, v) for v in range(size)}
    assert shared and node.plays(0) != node.plays(1)
    assert node.remote_fraction() == (size - 1) / size


def test_emulated_world_size_is_refused_where_it_cannot_be_played():
    from xstage_bench.attention.emulation import EmulatedNode
    from xstage_bench.data.grid import attention_points

    with pytest.raises(ValueError, match="must exceed"):
        EmulatedNode(UlyssesLayout(1, 8, 2, 16, 2))
    att = {
        "backends": ["triton"],
        "modes": ["alone"],
        "heads": [8],
        "seq_lens": [64],
        "head_dim": 16,
        "batch": 1,
        "emulated_world_sizes": [8],
    }
    ids = [p["id"] for p in attention_points(att, 2)]
    assert ids == ["triton/alone/H=8/S=64/P=2", "triton/alone/H=8/S=64/P=2/emulated-P=8"]
    with pytest.raises(ValueError, match="heads=6 do not divide over world_size=8"):
        attention_points({**att, "heads": [6]}, 2)
    with pytest.raises(ValueError, match="8 is below the 16 GPUs here"):
        attention_points({**att, "heads": [16], "seq_lens": [256]}, 16)


def test_a_config_with_an_emulated_world_size_plans_on_four_and_eight_gpus():
    """config/gpu-smoke.yaml (emulated_world_sizes: [8]) on a 4- or 8-GPU node: four GPUs
    keep the emulated points (the run records them unsupported: only two GPUs play an
    emulated node); on eight, P = 8 is the physical run itself."""
    from xstage_bench.attention.emulation import unsupported_on
    from xstage_bench.data.grid import attention_points

    att = load_config(ROOT / "config" / "gpu-smoke.yaml")["attention"]
    four = {p["id"].split("/", 4)[-1] for p in attention_points(att, 4, ["peer"])}
    assert four == {"P=4", "P=4/emulated-P=8"}
    eight = {p["id"].split("/", 4)[-1] for p in attention_points(att, 8, ["peer", "host"])}
    assert eight == {"P=8", "P=8/path=host/emulated-P=2", "P=8/path=host"}
    assert unsupported_on(2) is None
    assert "exactly 2 GPUs" in unsupported_on(4)


@needs_torch
def test_emulated_world_size_end_to_end_on_two_cpu_ranks(tmp_path):
    cfg = _small_config(["triton"], 4, ["serial", "fused"], emulated_world_sizes=[4])
    cfg["store_paths"] = ["peer"]
    out = tmp_path / "attention.json"
    _launch_on_cpu_ranks(cfg, out)
    records = {r["id"]: r for r in read_raw(out)["records"]}
    assert {i: r["status"] for i, r in records.items()} == {
        f"triton/{m}/H=4/S=64/P=2{e}": "ok"
        for m in ("serial", "fused")
        for e in ("", "/emulated-P=4")
    }
    fused = records["triton/fused/H=4/S=64/P=2/emulated-P=4"]
    assert fused["point"]["emulated_world_size"] == 4
    assert fused["extra"]["bitwise_equal_serial"] is True
    # A quarter of the heads per rank: a quarter of the P=2 point's FLOPs per rank.
    assert fused["point"]["heads"] == 4


@needs_torch
def test_an_emulated_world_size_on_four_cpu_ranks_is_recorded_unsupported(tmp_path):
    """Four ranks measure P = 4 and record the emulated P = 8 points unsupported, with
    the reason, instead of failing the whole sweep."""
    cfg = _small_config(["triton"], 8, ["serial"], emulated_world_sizes=[8])
    cfg["store_paths"] = ["peer"]
    out = tmp_path / "attention.json"
    _launch_on_cpu_ranks(cfg, out, world_size=4)
    records = {r["id"]: r for r in read_raw(out)["records"]}
    assert {i: r["status"] for i, r in records.items()} == {
        "triton/serial/H=8/S=64/P=4": "ok",
        "triton/serial/H=8/S=64/P=4/emulated-P=8": "unsupported",
    }
    assert "exactly 2 GPUs" in records["triton/serial/H=8/S=64/P=4/emulated-P=8"]["error"]


# ---- the host path: one GPU plays rank 0 of a P-GPU node, host memory the rest -------


@pytest.mark.parametrize("size", [2, 4, 8])
def test_host_node_keeps_rank_0s_rows_and_sends_the_rest_to_host_memory(size):
    from xstage_bench.attention.host import HostNode

    lay = UlyssesLayout(2, 16 * size, 2 * size, 16, size)
    node = HostNode(lay)
    assert [node.on_host(v) for v in range(size)] == [False] + [True] * (size - 1)
    assert node.host_tokens() == range(16, 16 * size)  # every token but rank 0's S/P
    assert {lay.owner(t) for t in node.host_tokens()} == set(range(1, size))
    assert node.host_fraction() == (size - 1) / size
    # (P-1)/P of rank 0's (B, S, H/P, D) output, in bytes
    assert (
        node.host_bytes(2)
        == 2 * lay.batch * lay.seq_len * lay.local_heads * 16 * (size - 1) // size
    )
    with pytest.raises(ValueError, match=f"owner={size} outside"):
        node.on_host(size)


def test_host_node_needs_someone_to_send_to():
    from xstage_bench.attention.host import HostNode

    with pytest.raises(ValueError, match="P >= 2"):
        HostNode(UlyssesLayout(1, 8, 2, 16, 1))


def _host_point(backend: str, mode: str, size: int, heads: int = 4) -> dict:
    p = {**_point(backend, mode), "heads": heads, "path": "host", "emulated_world_size": size}
    p["id"] = f"{backend}/{mode}/H={heads}/S=32/P=1/path=host/emulated-P={size}"
    return p


class _OutView:
    """An unmodified kernel that takes `out` (as FA3/FA4 do), played by ours with one
    destination: fused = the out view over the mixed device/host range."""

    def __init__(self, inner, name: str = "fa3"):
        self.inner, self.name = inner, name

    def local(self, q, k, v, out):
        self.inner.local(q, k, v, out)

    def fused(self, q, k, v, target):
        from xstage_bench.attention.backends import _PeerOutBackend

        _PeerOutBackend.fused(self, q, k, v, target)


class _KeepsRowsOnTheGpu:
    """A broken fused epilogue: every row goes to rank 0's own chunk, none to host memory."""

    name = "triton"

    def __init__(self, inner):
        self.inner = inner

    def local(self, q, k, v, out):
        self.inner.local(q, k, v, out)

    def fused(self, q, k, v, target):
        import dataclasses

        own = target.dest_ptrs[:1].expand_as(target.dest_ptrs).contiguous()
        self.inner.fused(q, k, v, dataclasses.replace(target, dest_ptrs=own))


@pytest.mark.parametrize("size", [2, 4])
def test_host_workspace_puts_each_owners_rows_in_its_chunk(one_rank, size):
    """Our fused epilogue at P = size: owner v's rows (tokens v*S/P ...) at rank 0's heads
    in chunk v, chunk 0 on the device side of the window, the others on the host side;
    the other ranks' heads untouched."""
    import torch

    from xstage_bench.attention.backends import load_backend, sdpa_reference
    from xstage_bench.attention.modes import run_fused

    ws = one_rank.shape(_host_point("triton", "fused", size))
    lay = ws.layout
    assert [ws.window.on_host(v) for v in range(size)] == [False] + [True] * (size - 1)
    ws.fill(3)
    ws.poison()
    run_fused(load_backend("triton", TINY), ws)
    ref = sdpa_reference(ws.q.float(), ws.k.float(), ws.v.float())
    for v, chunk in enumerate(ws.chunks):
        rows = slice(v * lay.shard_len, (v + 1) * lay.shard_len)
        torch.testing.assert_close(
            chunk[:, :, : lay.local_heads].float(), ref[:, rows], atol=2e-3, rtol=2e-3
        )
        assert torch.isnan(chunk[:, :, lay.local_heads :]).all()


def test_host_path_checks_and_times_all_three_modes_in_process(one_rank):
    group = [_host_point("triton", m, 4) for m in MODES]
    records = one_rank.execute({"group": group})
    assert {i: r["status"] for i, r in records.items()} == {p["id"]: "ok" for p in group}
    _assert_paired([records[p["id"]] for p in group])
    fused = records[group[2]["id"]]
    assert fused["extra"]["bitwise_equal_serial"] is True
    assert fused["extra"]["host_bytes"] == 32 * 1 * 16 * 2 * 3 // 4  # S x H/P x D x 2 B x 3/4
    assert records[group[0]["id"]]["extra"]["host_bytes"] == 0  # alone sends nothing


def test_a_fused_row_that_stays_on_the_gpu_fails_the_check(one_rank):
    from xstage_bench.attention.backends import load_backend

    one_rank.backends["triton"] = _KeepsRowsOnTheGpu(load_backend("triton", TINY))
    record = one_rank.execute(_host_point("triton", "fused", 4))
    assert record["status"] == "wrong"
    assert "still NaN (poison not overwritten)" in record["error"]
    assert "samples" not in record


def test_an_out_view_over_the_mixed_range_lands_every_row(one_rank):
    """What FA3/FA4 get on the host path: one (1, S, H, D) out view whose token rows lie
    in the owners' chunks; a kernel writing plain `out` through it passes the check."""
    from xstage_bench.attention.backends import load_backend

    one_rank.backends["fa3"] = _OutView(load_backend("triton", TINY))
    record = one_rank.execute(_host_point("fa3", "fused", 4))
    assert record["status"] == "ok", record.get("error")
    assert record["extra"]["bitwise_equal_serial"] is True


def test_host_memory_refused_by_the_driver(one_rank, monkeypatch):
    """Where host-located VMM is refused: FA3/FA4 fused are unsupported with the driver's
    message; our kernel stores into pinned host chunks through its pointers."""
    from xstage_bench.attention.backends import load_backend
    from xstage_bench.measurement import hostmem

    def refuse(*args, **kwargs):
        raise hostmem.HostMemoryUnsupported("cuMemCreate failed: CUDA_ERROR_NOT_SUPPORTED")

    monkeypatch.setattr(hostmem, "host_window", refuse)
    one_rank.backends["fa3"] = _OutView(load_backend("triton", TINY))
    record = one_rank.execute(_host_point("fa3", "fused", 2))
    assert record["status"] == "unsupported"
    assert "out view over one device/host range" in record["error"]
    assert "CUDA_ERROR_NOT_SUPPORTED" in record["error"]
    ours = one_rank.execute({"group": [_host_point("triton", m, 2) for m in MODES]})
    assert {r["status"] for r in ours.values()} == {"ok"}
    fused = ours[_host_point("triton", "fused", 2)["id"]]
    assert fused["extra"]["host_memory"].startswith("pinned host chunks")
    assert "CUDA_ERROR_NOT_SUPPORTED" in fused["extra"]["host_memory"]


@needs_torch
def test_host_path_end_to_end_on_one_cpu_rank(tmp_path):
    """One GPU through the workers (a world of one): the host path at P = 2 and 4, every
    mode checked and timed, each P's arms paired; no peer path, no P = 1 points."""
    cfg = _small_config(["triton", "fa4"], 4, host_world_sizes=[2, 4])
    out = tmp_path / "attention.json"
    _launch_on_cpu_ranks(cfg, out, world_size=1)
    doc = read_raw(out)
    records = {r["id"]: r for r in doc["records"]}
    assert {i: r["status"] for i, r in records.items()} == {
        f"{b}/{m}/H=4/S=64/P=1/path=host/emulated-P={size}": (
            "ok" if b == "triton" else "unsupported"
        )
        for size in (2, 4)
        for b in ("triton", "fa4")
        for m in MODES
    }
    for size in (2, 4):
        group = [records[f"triton/{m}/H=4/S=64/P=1/path=host/emulated-P={size}"] for m in MODES]
        _assert_paired(group)
        assert group[2]["point"]["emulated_world_size"] == size
        assert group[2]["extra"]["bitwise_equal_serial"] is True
    assert doc["config"]["store_paths"] == ["host"]  # resolved: one GPU has no peer path
    assert "receivers' unpack" in doc["config"]["definitions"]["host path serial"]


def test_points_on_each_path():
    from xstage_bench.attention.points import measured_paths, ordered_points, pairing_group
    from xstage_bench.data.grid import attention_points

    att = {
        "backends": ["fa3"],
        "modes": ["alone", "fused"],
        "heads": [8],
        "seq_lens": [64],
        "head_dim": 16,
        "batch": 1,
        "host_world_sizes": [2, 8],
    }
    one_gpu = [p["id"] for p in attention_points(att, 1, ["host"])]
    assert one_gpu == [
        f"fa3/{m}/H=8/S=64/P=1/path=host/emulated-P={size}"
        for size in (2, 8)
        for m in ("alone", "fused")
    ]
    two = attention_points({**att, "emulated_world_sizes": [8]}, 2, ["peer", "host"])
    by_id = {p["id"]: p for p in two}
    assert set(by_id) == {
        "fa3/alone/H=8/S=64/P=2",  # peer-path ids as before paths
        "fa3/fused/H=8/S=64/P=2",
        "fa3/alone/H=8/S=64/P=2/emulated-P=8",
        "fa3/fused/H=8/S=64/P=2/emulated-P=8",
        "fa3/alone/H=8/S=64/P=2/path=host",  # P = the GPU count: not emulated
        "fa3/fused/H=8/S=64/P=2/path=host",
        "fa3/alone/H=8/S=64/P=2/path=host/emulated-P=8",
        "fa3/fused/H=8/S=64/P=2/path=host/emulated-P=8",
    }
    assert {p["path"] for p in two} == {"peer", "host"}
    assert "emulated_world_size" not in by_id["fa3/fused/H=8/S=64/P=2/path=host"]
    # one pairing group per (path, P, shape), the peer path first
    ordered = ordered_points({**att, "emulated_world_sizes": [8]}, 2, ["peer", "host"])
    groups = [pairing_group(p) for p in ordered]
    assert len(set(groups)) == 4 and groups == sorted(groups, key=groups.index)
    assert [p["path"] for p in ordered] == ["peer"] * 4 + ["host"] * 4
    with pytest.raises(ValueError, match=r"heads=8 do not divide .*attention.host_world_sizes"):
        attention_points({**att, "host_world_sizes": [3]}, 1, ["host"])
    with pytest.raises(ValueError, match="P must be >= 2"):
        attention_points({**att, "host_world_sizes": [1]}, 1, ["host"])
    with pytest.raises(ValueError, match="peer path of attention needs 2 or more GPUs"):
        attention_points(att, 1, ["peer"])
    assert measured_paths({}, 1) == ["host"]
    assert measured_paths({"store_paths": "auto"}, 2) == ["peer", "host"]


@needs_torch
def test_paired_timing_drops_a_failing_arm_and_times_the_rest_again(one_rank):
    """workers.Lockstep.timed_paired: rounds of every arm (order alternating); an arm that
    fails is recorded with its error and the others are timed again from round 0."""
    from xstage_bench.measurement.timing import TimingPolicy

    ran: list[str] = []
    calls = {"b": 0}

    def rep(arm, value):
        def run():
            ran.append(arm)
            if arm == "b":
                calls["b"] += 1
                if calls["b"] == 2:
                    raise RuntimeError("b broke")
            return (value, value + 1.0)

        return run

    policy = TimingPolicy(
        warmup=1, min_reps=3, max_reps=3, target_rel_iqr=0.5, budget_s=5, flush_l2=False
    )
    out = one_rank.timed_paired(
        {"a": rep("a", 1.0), "b": rep("b", 2.0), "c": rep("c", 3.0)}, 2, policy
    )
    assert "b broke" in out["b"]
    assert list(out["a"].samples) == [1.0] * 3 and out["a"].others == [[2.0] * 3]
    assert out["c"].samples.rounds == [0, 1, 2]
    # warm-up round a b c, then round 0 a b(fails); again without b: warm-up a c, rounds
    # a c, c a, a c
    assert ran == ["a", "b", "c", "a", "b", "a", "c", "a", "c", "c", "a", "a", "c"]


def test_a_groups_records_carry_the_clocks_around_the_whole_group(one_rank):
    """Lockstep.measure_group samples the clocks once before the group's checks and once
    after its paired rounds: every record of the group carries those two samples."""

    class Sampler:
        def __init__(self):
            self.taken = 0

        def sample(self):
            self.taken += 1
            return {"available": False, "reason": f"sample {self.taken}"}

    one_rank.sampler = Sampler()
    group = [_host_point("triton", m, 2) for m in MODES]
    records = one_rank.execute({"group": group})
    assert one_rank.sampler.taken == 2
    for record in records.values():
        clocks = record["clocks"]
        assert (clocks["before"]["reason"], clocks["after"]["reason"]) == ("sample 1", "sample 2")
        assert record["throttled"] is None  # unknown, never False, without NVML
