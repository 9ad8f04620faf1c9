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
from xstage_bench.config import load_config
from xstage_bench.results import read_raw

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

    # The interpreter turns scalar arguments into 1-element arrays, which numpy >= 2.4
    # refuses to convert to an int (a loop bound): say so instead of failing obscurely.
    try:
        q = torch.zeros(1, 16, 1, 16, dtype=torch.float32)
        triton_fa.flash_attention(q, q, q, torch.empty_like(q), config=TINY)
    except Exception as e:  # triton.runtime.errors.InterpreterError
        pytest.skip(f"the Triton interpreter cannot run here: {type(e).__name__}: {e}")
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

    from xstage_bench.attention import runner
    from xstage_bench.fabric import HostFabric
    from xstage_bench.timing import TimingPolicy
    from xstage_bench.workers import free_port

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
    rank = runner.Rank(fabric, policy, torch.float16, TINY)
    yield rank
    if rank.workspace is not None:
        rank.workspace.close()
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

    cfg = load_config(ROOT / "config.yaml")
    before = copy.deepcopy(cfg)
    small = runner.sweep_config(cfg, ["triton"], [8192], [24], {"min_reps": 3})
    assert small["attention"]["backends"] == ["triton"]
    assert small["attention"]["seq_lens"] == [8192]
    assert small["timing"]["min_reps"] == 3
    assert cfg == before  # the caller's config is not modified
    with pytest.raises(ValueError, match="unknown timing key 'reps'"):
        runner.sweep_config(cfg, timing_overrides={"reps": 3})
    points = runner.ordered_points(small["attention"] | {"modes": ["fused", "alone"]}, 2)
    assert [p["mode"] for p in points] == ["fused", "alone"]
    assert len({runner.point_seed(p["id"], 0) for p in points}) == 2


# ---- the whole runner: two processes on gloo and the interpreter ----------------------


def _launch_on_two_cpu_ranks(cfg: dict, out: Path) -> None:
    from xstage_bench.attention import runner

    runner.launch(
        cfg,
        "cpu-test",
        out,
        world_size=2,
        device_type="cpu",
        triton_config=TINY,
        point_timeout_s=120,
        wait_timeout_s=120,  # generous: the interpreter on a loaded 2-core CI machine
    )


@needs_torch
def test_runner_end_to_end_on_two_cpu_ranks(tmp_path):
    from xstage_bench import workers
    from xstage_bench.attention import runner

    cfg = runner.sweep_config(
        load_config(ROOT / "config.yaml"),
        ["triton", "fa4"],
        [64],
        [2],
        {"warmup": 0, "min_reps": 1, "max_reps": 2, "flush_l2": False},
    )
    cfg["attention"]["head_dim"] = 16
    out = tmp_path / "attention.json"
    _launch_on_two_cpu_ranks(cfg, out)
    doc = read_raw(out)
    status = {r["id"]: r["status"] for r in doc["records"]}
    assert status == {
        **{f"triton/{m}/H=2/S=64/P=2": "ok" for m in ("alone", "serial", "fused")},
        **{f"fa4/{m}/H=2/S=64/P=2": "unsupported" for m in ("alone", "serial", "fused")},
    }
    fused = next(r for r in doc["records"] if r["id"] == "triton/fused/H=2/S=64/P=2")
    assert fused["extra"]["bitwise_equal_serial"] is True
    assert doc["environment"]["device_type"] == "cpu"
    assert "not a measurement" in doc["environment"]["note"]
    assert not workers.running_marker(out).exists()
    json.dumps(doc)  # plain JSON all the way down


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
    from xstage_bench.grid import attention_points

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
    with pytest.raises(ValueError, match="exactly 2 GPUs"):
        attention_points(att, 4)
    ids = [p["id"] for p in attention_points(att, 2)]
    assert ids == ["triton/alone/H=8/S=64/P=2", "triton/alone/H=8/S=64/P=2/emulated-P=8"]
    with pytest.raises(ValueError, match="heads=6 do not divide over world_size=8"):
        attention_points({**att, "heads": [6]}, 2)


@needs_torch
def test_emulated_world_size_end_to_end_on_two_cpu_ranks(tmp_path):
    from xstage_bench.attention import runner

    cfg = runner.sweep_config(
        load_config(ROOT / "config.yaml"),
        ["triton"],
        [64],
        [4],
        {"warmup": 0, "min_reps": 1, "max_reps": 2, "flush_l2": False},
        modes=["serial", "fused"],
    )
    cfg["attention"]["head_dim"] = 16
    cfg["attention"]["emulated_world_sizes"] = [4]
    out = tmp_path / "attention.json"
    _launch_on_two_cpu_ranks(cfg, out)
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
