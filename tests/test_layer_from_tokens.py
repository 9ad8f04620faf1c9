"""The layer from its home tokens (megamoe.layer_from 'home_tokens', issue 53 item 2): the
dispatch and the layout on the device inside every forward, under the Triton interpreter.

One CPU rank on the host path (a quarter of its tokens host-homed): with the rows, scales,
destinations and layout poisoned before each forward, the layer gives the same outputs,
bit for bit, as the layer whose rows the host dispatched once, for every schedule decided
on the device and from a host list (an oracle arm), and the rows the device gathered are
the host's, byte for byte. The buffers are sized for any routing: a second routing's ids
copied into the same buffers give that routing's rows. A point on two GPUs is recorded
unsupported. How long the dispatch takes on a GPU, a GPU run must show.
"""

from __future__ import annotations

import importlib
import importlib.util

import fixtures
import numpy as np
import pytest

from xstage_bench.measurement.protocol import PointFailed
from xstage_bench.megamoe import reference, routing, schedule
from xstage_bench.megamoe.layer import token_dispatch

HAVE_TORCH_TRITON = all(importlib.util.find_spec(m) for m in ("torch", "triton"))
# xstage_kernels.megamoe.PAD_DST: imported here, Triton would load before the interpreter
PAD_DST = -(2**62)
KERNELS = ("xstage_kernels.megamoe", "xstage_kernels.dispatch", "xstage_kernels.layout")
POINT = {
    **fixtures.TINY_POINT,
    "routing": "skewed",
    "tokens_per_rank": 80,
    "world_size": 1,
    "path": "host",
    "remote_fraction": 0.25,
}


@pytest.fixture
def interpreted(monkeypatch):
    """The fused kernel's, the dispatch's and the layout's modules decorated under
    TRITON_INTERPRET=1, restored afterwards."""
    yield from fixtures.interpreted_modules(monkeypatch, *KERNELS)


def _problem(layer_from: str, point: dict = POINT):
    import torch
    from fixtures import TINY_MOE

    from xstage_bench.megamoe.layer.inputs import make_expert_weights
    from xstage_bench.megamoe.layer.problem import MoEProblem

    moe = {
        **TINY_MOE,
        "schedules": list(schedule.SCHEDULES),
        "lead_rows": 128,
        "layer_from": layer_from,
    }
    devices = [torch.device("cpu")] * point["world_size"]
    weights = [make_expert_weights(point, "w8a8", q, d) for q, d in enumerate(devices)]
    return MoEProblem(point, moe, devices, weights, num_programs=3), moe


def _outputs(prob, key: str) -> list:
    prob.poison()
    fixtures.interpreted_forward(prob, key)
    assert prob.error_flags() == [0]
    assert not prob.host_unwritten() and not prob.combine_unwritten()
    return [o.clone() for o in prob.checked_outputs()]


def test_the_layer_from_tokens_computes_what_the_hosts_dispatch_gives(interpreted):
    import torch

    once, moe = _problem(token_dispatch.EXPERT_ROWS)
    timed, _ = _problem(token_dispatch.HOME_TOKENS)
    (rb,) = timed.ranks
    assert rb.dispatch is not None and rb.x.shape[0] > rb.plan.padded_rows  # any routing
    tokens = [np.arange(POINT["tokens_per_rank"])]
    ref = reference.reference_outputs(timed.homes, timed.experts, tokens, "w8a8")
    for name in schedule.SCHEDULES:
        for decided in ("device", "list"):
            arm = {"schedule": name, "decided_on": decided}
            want = _outputs(once, once.arm(arm))
            got = _outputs(timed, timed.arm(arm))
            assert torch.equal(got[0], want[0]), (name, decided)
            assert reference.relative_error(got[0], ref[0]) < reference.INTERPRETER_TOLERANCE
            assert timed.realized_order_error(timed.arm(arm), arm) is None
    # a realized order the dependencies allow but the rule does not give is named: two L1
    # tiles of the first block swapped (interleaved is counted, so its order is exact)
    arm = {"schedule": schedule.INTERLEAVED, "decided_on": "device"}
    claimed = rb.claimed(timed.arm(arm))
    first, second = claimed[0].clone(), claimed[1].clone()
    assert first[0] == second[0] == schedule.L1 and first[2] == second[2]  # kind, block
    claimed[0], claimed[1] = second, first
    error = timed.realized_order_error(timed.arm(arm), arm)
    assert error == "rank 0: the order the device claimed differs from the interleaved rule's at 0"
    # the rows the device gathered are the host's, byte for byte; padding rows (left as
    # the poison made them, NaN) were never stored, or the outputs above would hold NaN
    (host,) = once.ranks
    rows = rb.plan.padded_rows
    routed = torch.as_tensor(rb.plan.home >= 0)
    assert torch.equal(rb.x[:rows][routed].view(torch.uint8), host.x[routed].view(torch.uint8))
    assert torch.equal(rb.xs[:rows][routed], host.xs[routed])
    assert torch.isnan(rb.xs[:rows][~routed]).all()
    host_offset = (timed.host_comb[0].data_ptr() - rb.comb.data_ptr()) // 2
    want = routing.row_destinations(
        rb.plan, np.zeros(1), POINT["H"], np.array([host_offset]), timed.host_homed, pad=PAD_DST
    )
    assert timed.host_homed.any() and torch.equal(rb.row_dst[:rows], torch.as_tensor(want))


def test_one_set_of_buffers_serves_another_routing(interpreted):
    """New ids copied into the same buffers: the next dispatch lays out their plan."""
    import torch

    timed, _ = _problem(token_dispatch.HOME_TOKENS)
    (rb,) = timed.ranks
    d = rb.dispatch
    from xstage_bench.megamoe.layer.inputs import routing_point

    ids, _ = routing.route(routing_point({**POINT, "routing": "balanced"}), 1.2, 0)
    plan = routing.dispatch_plan([ids], POINT["E"], 128)[0]
    assert plan.blocks != rb.plan.blocks or not np.array_equal(plan.token, rb.plan.token)
    d.expert_ids.copy_(torch.as_tensor(ids.reshape(-1).astype(np.int32)))
    d.poison(torch)
    d.enqueue()
    np.testing.assert_array_equal(d.counts.numpy(), plan.expert_rows)
    assert int(d.scratch_layout[2]) == plan.blocks
    routed = np.flatnonzero(plan.home >= 0)
    home = timed.homes[0].xq.view(torch.uint8)
    assert torch.equal(d.x.view(torch.uint8)[routed], home[torch.as_tensor(plan.token[routed])])
    slots = torch.as_tensor(plan.slot[routed]) * POINT["H"]
    dst = d.row_dst[routed] - d.token_dst[torch.as_tensor(plan.token[routed])]
    assert torch.equal(dst, slots)


def test_a_record_times_the_dispatch_in_the_same_calls(interpreted):
    """Measured as the sweep measures (host clocks on the CPU, never a GPU number): the
    record says where its layer starts, and holds the dispatch's time per timed call."""
    from fixtures import tiny_cpu_measurer

    m = tiny_cpu_measurer(1)
    m.moe = {**m.moe, "layer_from": "home_tokens", "schedule_on": "device"}
    point = {**POINT, "tokens_per_rank": 32, "schedule": "expert_wave", "decided_on": "device"}
    point["id"] = "tiny/w8a8/skewed/T=32/P=1/path=host/f=0.25/expert_wave"
    record = m(point)
    assert record["status"] == "ok", record.get("error")
    assert record["extra"]["layer_from"] == "home_tokens"
    samples = record["samples"]
    assert len(samples["dispatch_us"]) == len(samples["time_us"]) == len(samples["kernel_us"])
    assert all(d > 0 for d in samples["dispatch_us"])


def test_a_point_on_two_gpus_is_unsupported_not_faked():
    with pytest.raises(PointFailed, match="one GPU") as failed:
        token_dispatch.check_supported({**POINT, "world_size": 2}, {"layer_from": "home_tokens"})
    assert failed.value.status == "unsupported"
    token_dispatch.check_supported({**POINT, "world_size": 2}, {})  # rows dispatched once


# ---- on a GPU (skipped elsewhere): the layer as timed, replayed from its graphs ------------

GPU_POINT = {**POINT, "H": 2048, "I": 1024, "E": 16, "topk": 4, "tokens_per_rank": 1024}


def _cuda_problem(layer_from: str, point: dict):
    import torch
    from fixtures import TINY_MOE

    from xstage_bench.megamoe.layer.inputs import make_expert_weights
    from xstage_bench.megamoe.layer.problem import MoEProblem

    moe = {**TINY_MOE, "lead_rows": 256, "layer_from": layer_from}
    device = torch.device("cuda:0")
    weights = [make_expert_weights(point, "w8a8", 0, device)]
    programs = torch.cuda.get_device_properties(device).multi_processor_count
    return MoEProblem(point, moe, [device], weights, num_programs=programs)


def _gpu_outputs(prob, arm: dict):
    key = prob.arm(arm, graphed=True)  # the forward below replays the captured graphs
    prob.poison()
    prob.forward(key)
    prob.synchronize()
    assert prob.error_flags() == [0] and not prob.combine_unwritten()
    assert not prob.host_unwritten()
    return prob.checked_outputs()[0].clone(), key


@pytest.mark.skipif(
    not HAVE_TORCH_TRITON or not __import__("torch").cuda.is_available(), reason="needs a GPU"
)
def test_on_a_gpu_one_graph_serves_every_routing():
    """Every schedule, device-decided and from the list, replayed from its graphs with the
    dispatch inside: the outputs of the layer whose rows the host dispatched, bit for bit;
    then another routing's ids and combine weights copied into the same buffers and the
    same graphs replayed give that routing's outputs."""
    import torch

    timed = _cuda_problem(token_dispatch.HOME_TOKENS, GPU_POINT)
    once = _cuda_problem(token_dispatch.EXPERT_ROWS, GPU_POINT)
    other = {**GPU_POINT, "routing": "balanced"}
    once_other = _cuda_problem(token_dispatch.EXPERT_ROWS, other)
    for name in schedule.SCHEDULES:
        for decided in ("device", "list"):
            arm = {"schedule": name, "decided_on": decided}
            want, _ = _gpu_outputs(once, arm)
            got, key = _gpu_outputs(timed, arm)
            assert torch.equal(got, want), (name, decided)
            assert timed.realized_order_error(key, arm) is None, (name, decided)
    # A routing is its ids and its combine weights: both are the layer's inputs.
    (rb,) = timed.ranks
    ids = torch.as_tensor(once_other.homes[0].ids.reshape(-1).astype(np.int32), device="cuda")
    rb.dispatch.expert_ids.copy_(ids)
    rb.combine_weights.copy_(once_other.ranks[0].combine_weights)
    for name in schedule.SCHEDULES:
        arm = {"schedule": name, "decided_on": "device"}
        want, _ = _gpu_outputs(once_other, arm)
        got, _ = _gpu_outputs(timed, arm)  # the graphs captured for the first routing
        assert torch.equal(got, want), name


def test_a_config_that_names_more_gpus_is_refused_before_anything_runs():
    import copy
    from pathlib import Path

    import yaml

    from xstage_bench.data.config import ConfigError, validate_config

    root = Path(__file__).resolve().parents[1]
    config = copy.deepcopy(yaml.safe_load((root / "config.yaml").read_text()))
    config["megamoe"]["layer_from"] = "home_tokens"
    validate_config({**config, "world_size": 1})
    validate_config(config)  # 'auto': a point on more GPUs is recorded unsupported
    with pytest.raises(ConfigError, match="'megamoe.layer_from': 'home_tokens' runs on one GPU"):
        validate_config({**config, "world_size": 2})


@pytest.mark.skipif(not HAVE_TORCH_TRITON, reason="needs torch and triton (.venv-kernels)")
def test_a_trace_reads_the_claimed_tiles_of_buffers_sized_for_any_routing():
    """A traced arm's buffers have a row for every tile any routing can make; what a trace
    reads back is this routing's claimed tiles and their stamps, row for row."""
    import torch

    timed, _ = _problem(token_dispatch.HOME_TOKENS)
    key = timed.arm({"schedule": "interleaved", "decided_on": "device"})
    (rb,) = timed.ranks
    (buf,) = timed.trace_buffers(key)
    assert buf.dtype == torch.int64 and buf.shape == (rb.tiles[key].shape[0], 6)
    assert buf.shape[0] > rb.grid.tiles and not buf.any()
    buf[:, 0] = torch.arange(buf.shape[0])
    rb.tiles[key][:, 0] = torch.arange(rb.tiles[key].shape[0], dtype=torch.int32)
    (stamps,), (tiles,) = timed.traced(key, [buf])
    assert len(stamps) == len(tiles) == rb.grid.tiles
    np.testing.assert_array_equal(stamps[:, 0], tiles[:, 0])
