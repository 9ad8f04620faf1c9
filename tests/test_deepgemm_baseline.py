"""DeepGEMM's SM90 MegaMoE baseline on the CPU: the layouts our inputs are handed over in,
the intermediate its Linear-1 epilogue stores (what the reference must be told), what it
printed about its schedule, and the record of a run that fails: it names the failing step.

numpy only, except the torch version of the intermediate (skipped without torch).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

from xstage_bench.measurement.timing import TimingPolicy
from xstage_bench.megamoe import reference, schedule
from xstage_bench.megamoe.baselines import deepgemm
from xstage_bench.megamoe.baselines.measure import DeepGemmBaseline
from xstage_bench.megamoe.quant import e4m3_round

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch not installed"
)

# What the source build (AichenF/DeepGEMM bc4f33a, heuristics/sm90_mega_moe.hpp) prints
# with DG_PRINT_CONFIGS=1: one line per heuristic key, its two phases' configs.
_PHASE = (
    "MegaMoESM90Config(block_m=64, block_n=256, block_k=128, num_max_pool_tokens=7424, "
    "num_padded_sf_pool_tokens=7552, sf_pool_stride_tokens=7552, num_experts_per_wave={w}, "
    "num_sms=132, num_stages=4, smem_size=210000, num_dispatch_threads=64, "
    "num_non_epilogue_threads=64, num_epilogue_threads=256, direct_l2_scatter=0, "
    "nmajor_schedule=0, one_warp_cleanup=0, swap_ab=0)"
)
SPLIT_LINE = (
    "Sm90MoeLaunchConfig(num_ranks=1, num_experts=256, hidden=4096, intermediate_hidden=2048, "
    "num_max_tokens_per_rank=1024, num_tokens=1024, num_topk=6): profile=1, shape_family=1, "
    f"l1={_PHASE.format(w=32)}, l2={_PHASE.format(w=32)}, bf16_scaled_accum=1"
)


# ---- layouts --------------------------------------------------------------------------


def test_linear1_rows_are_handed_over_interleaved_by_eight():
    two_i, h = 32, 3
    w1 = np.arange(two_i)[:, None].repeat(h, axis=1)  # row r holds r
    mixed = deepgemm.interleave_gate_up_np(w1)
    gate, up = list(range(16)), list(range(16, 32))
    assert mixed[:, 0].tolist() == gate[:8] + up[:8] + gate[8:] + up[8:]
    assert (mixed == mixed[:, :1]).all()  # whole rows move, columns stay
    experts = np.stack([w1, w1 + 100])  # (E, 2I, H): each expert on its own
    both = deepgemm.interleave_gate_up_np(experts)
    assert np.array_equal(both[1], mixed + 100)
    fp8_bytes = np.arange(64 * 4, dtype=np.uint8).reshape(64, 4)  # any dtype: bytes move
    assert deepgemm.interleave_gate_up_np(fp8_bytes).dtype == np.uint8
    with pytest.raises(ValueError, match="whole 8-row groups"):
        deepgemm.interleave_gate_up_np(np.zeros((24, 2)))


def test_routing_is_handed_over_as_int64_ids_and_fp32_weights():
    ids = np.array([[3, 0], [1, 2]], dtype=np.int32)
    weights = np.array([[0.25, 0.75], [0.5, 0.5]], dtype=np.float64)
    got_ids, got_w = deepgemm.routing_for_deepgemm(ids, weights, num_experts=4)
    assert got_ids.dtype == np.int64 and got_w.dtype == np.float32
    assert got_ids.flags.c_contiguous and got_w.flags.c_contiguous
    assert np.array_equal(got_ids, ids) and np.array_equal(got_w, weights)
    with pytest.raises(ValueError, match=r"expert ids must lie in \[0, 4\)"):
        deepgemm.routing_for_deepgemm(ids + 1, weights, num_experts=4)
    with pytest.raises(ValueError, match="one \\(T, topk\\)"):
        deepgemm.routing_for_deepgemm(ids, weights[:, :1], num_experts=4)


# ---- the intermediate it stores ---------------------------------------------------------


def test_intermediate_scales_are_amax_over_448_rounded_up_to_a_power_of_two():
    amax = np.array([448.0, 449.0, 447.0, 1.0, 896.0, 0.0, 3.5e-3], dtype=np.float32)
    scales = deepgemm.pow2_scales_np(amax)
    assert scales.tolist()[:3] == [1.0, 2.0, 1.0]  # 448 / 448 is 1 exactly: not rounded up
    assert scales[3] == 2.0**-8 and scales[4] == 2.0 and scales[5] == 0.0
    positive = amax > 0
    mantissa, _ = np.frexp(scales[positive])
    assert (mantissa == 0.5).all()  # powers of two
    ratio = amax[positive] / scales[positive]
    assert (ratio <= 448.0).all() and (ratio > 224.0).all()


def test_intermediate_is_stored_per_64_channels_on_the_e4m3_grid():
    rng = np.random.default_rng(0)
    h = rng.standard_normal((6, 256)).astype(np.float32)
    h[1] = 0.0  # an empty row stays zero
    h[2, :64] *= 1e-3  # blocks of a row scale on their own
    stored = deepgemm.stored_intermediate_np(h)
    assert stored.shape == h.shape and stored.dtype == np.float32
    assert (stored[1] == 0).all()
    blocks = h.reshape(6, 4, 64)
    scales = deepgemm.pow2_scales_np(np.abs(blocks).max(axis=-1))
    values = stored.reshape(6, 4, 64) / np.where(scales > 0, scales, 1.0)[..., None]
    assert np.array_equal(values, e4m3_round(values))  # every value an e4m3 number
    rel = np.linalg.norm(stored - h) / np.linalg.norm(h)
    assert 0.005 < rel < 0.05
    with pytest.raises(ValueError, match="whole 64-blocks"):
        deepgemm.stored_intermediate_np(h[:, :100])


def test_a_reference_told_exact_scales_would_fail_a_correct_deepgemm():
    """Why the reference is told the power-of-two scales: the two roundings of one
    intermediate differ by more than the check's tolerance after Linear-2."""
    rng = np.random.default_rng(1)
    h = (rng.standard_normal((128, 1024)) * np.exp(rng.standard_normal((128, 1)))).astype(
        np.float32
    )
    groups = h.reshape(128, -1, 64)
    exact_scales = np.abs(groups).max(axis=-1) / np.float32(448.0)
    exact = (e4m3_round(groups / exact_scales[..., None]) * exact_scales[..., None]).reshape(
        h.shape
    )
    w2 = rng.standard_normal((1024, 512)).astype(np.float32)
    ours, theirs = exact @ w2, deepgemm.stored_intermediate_np(h) @ w2
    assert np.linalg.norm(theirs - ours) / np.linalg.norm(ours) > reference.TOLERANCE


@needs_torch
def test_torch_intermediate_agrees_with_the_numpy_specification():
    import torch

    rng = np.random.default_rng(2)
    h = (rng.standard_normal((16, 512)) * np.exp(3 * rng.standard_normal((16, 1)))).astype(
        np.float32
    )
    h[0] = 0.0
    h[1, :64] = 448.0 * 2.0**-5  # amax / 448 a power of two: not rounded up
    h[2, 64:128] = 1e-7 * rng.standard_normal(64)  # small values: e4m3 subnormals
    got = deepgemm.stored_intermediate(torch.from_numpy(h)).numpy()
    assert np.array_equal(got, deepgemm.stored_intermediate_np(h))


# ---- what it printed --------------------------------------------------------------------


def test_the_source_builds_two_launches_are_its_wave_schedule():
    assert deepgemm._CONFIG_LINE.findall(f"noise\n{SPLIT_LINE}\nmore") == [SPLIT_LINE]
    assert deepgemm.schedule_of(SPLIT_LINE) == schedule.WAVE
    reason = deepgemm.other_schedule_reason(SPLIT_LINE, schedule.INTERLEAVED)
    assert "two kernel launches" in reason and "no L2-lag schedule" in reason
    assert reason.endswith(SPLIT_LINE)
    # sgl-deep-gemm 0.2.5's line keeps its meaning
    lag = "MegaMoESM90Config(block_m=128, num_experts_per_wave=4, l2_lag_units=4017, x=0)"
    assert deepgemm.schedule_of(lag) == schedule.INTERLEAVED
    assert "chose its L2-lag schedule" in deepgemm.other_schedule_reason(lag, schedule.WAVE)
    assert deepgemm.schedule_of("Sm90MoeLaunchConfig(num_ranks=1): profile=1") is None


def test_the_record_says_which_build_ran(tmp_path):
    (tmp_path / "XSTAGE_SOURCE.txt").write_text(
        "DeepGEMM SM90 FP8 MegaMoE source, packed by envs/deepgemm-source.sh\n"
        "deepgemm megamoe_sm90_fp8_dev bc4f33a1 Add SM90 FP8 MegaMoE support\n"
        "cutlass f3fde583 Update pyproject.toml (include/cute, include/cutlass)\n"
        "left out: .github/\n"
    )
    (tmp_path / "XSTAGE_BUILD.txt").write_text(
        "built by envs/deepgemm-sm90.sh on 2026-12-02\ntorch 2.11.0 (CUDA 13.0)\nnvcc 13.0\n"
    )
    text = deepgemm.describe_build(str(tmp_path), "2.5.0+local", None)
    assert text.startswith("2.5.0+local built from source (deepgemm megamoe_sm90_fp8_dev bc4f33a1")
    assert "torch 2.11.0 (CUDA 13.0)" in text and "left out" not in text
    assert deepgemm.describe_build(str(tmp_path / "x"), "2.5.0", "0.2.5") == (
        "2.5.0 (sgl-deep-gemm 0.2.5)"
    )
    assert "no manifest" in deepgemm.describe_build(str(tmp_path / "x"), "2.5.0", None)


# ---- failing steps ------------------------------------------------------------------------


def test_a_failing_step_keeps_its_error_type_and_names_itself(capsys):
    with pytest.raises(ModuleNotFoundError, match="^step 'import deep_gemm' failed: No module"):
        with deepgemm.step("import deep_gemm"):
            raise ModuleNotFoundError("No module named 'deep_gemm'")
    with pytest.raises(RuntimeError, match="^step 'x' failed: UnicodeDecodeError: "):
        with deepgemm.step("x"):
            b"\xff".decode("utf-8")
    with pytest.raises(RuntimeError, match="^step 'y' failed: KeyError: 'k'"):
        with deepgemm.step("y"):  # its message would not read back as given
            {}["k"]
    assert capsys.readouterr().err == ""
    with deepgemm.step("time it", announce=True):  # a step that may hang says it started
        pass
    assert capsys.readouterr().err == "DeepGEMM worker: step 'time it'\n"


def test_a_site_of_deep_gemm_alone_is_put_first(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv(deepgemm.SITE_ENV, str(tmp_path))
    (tmp_path / "deep_gemm").mkdir()
    assert deepgemm.prefer_site() == str(tmp_path) and sys.path[0] == str(tmp_path)


class _InlineWorkers:
    """A worker pair of one rank run in this process, as worker_pair.serve runs a job."""

    def __init__(self):
        self.jobs = []

    def run(self, job, timeout_s=None):
        self.jobs.append(job)
        task = deepgemm.TASK
        try:
            result = task.run_job({**job, "tokens": job["tokens"][0]}, 0, None)
        except Exception as e:
            result = task.result_type(error=f"{type(e).__name__}: {str(e).strip()[:1500]}")
        return [result]

    def close(self):
        pass


POINT = {
    "id": "deepseek-v4-flash/w8a8/balanced/T=1024/P=1/path=host/f=0/deepgemm/expert_wave",
    "variant": "deepgemm",
    "schedule": schedule.WAVE,
    "precision": "w8a8",
    "shape": "deepseek-v4-flash",
    "H": 4096,
    "I": 2048,
    "E": 256,
    "topk": 6,
    "tokens_per_rank": 1024,
    "world_size": 1,
}


def _no_problem_before_the_workers(point):
    # the workers' job is built from worker_inputs: the problem's weights would hold the
    # GPU memory the workers need (FlashInfer's DeepSeek-V4-Pro ran out beside them)
    raise AssertionError("the measurer's problem was built before the workers ran")


def _record(monkeypatch, point=POINT) -> dict:
    """The record DeepGemmBaseline makes of `point` with the inline workers."""
    measurer = SimpleNamespace(
        devices=[None],
        sampler=None,
        seed=0,
        tokens=[np.arange(4)],
        policy=TimingPolicy(0, 1, 1, 0.1, 1.0, False),
        worker_inputs=lambda p: (p, [np.arange(4)]),
        problem=_no_problem_before_the_workers,
    )
    baseline = DeepGemmBaseline(measurer)
    baseline.workers = _InlineWorkers()
    return baseline.measure(point)


@pytest.fixture
def fake_torch(monkeypatch):
    """torch as far as the worker's first steps need it, so that they fail where each test
    wants whether or not torch is installed."""
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+cu130"
    torch.distributed = types.ModuleType("torch.distributed")
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", torch.distributed)
    monkeypatch.setattr(deepgemm, "_SITE_ERROR", [])
    return torch


def test_a_missing_build_is_unsupported_and_its_record_names_the_step(monkeypatch, fake_torch):
    def missing():
        raise ModuleNotFoundError("No module named 'deep_gemm'")

    monkeypatch.setattr(deepgemm, "_import_deep_gemm", missing)
    record = _record(monkeypatch)
    assert record["status"] == "unsupported"
    error = record["error"]
    assert error.startswith("every rank: ModuleNotFoundError: step 'import deep_gemm' failed: ")
    assert "No module named 'deep_gemm'" in error and "torch 2.11.0+cu130" in error
    assert deepgemm.RECIPE in error and deepgemm.SITE_ENV in error
    assert "time_us" not in record and "samples" not in record  # no number


def test_a_build_without_the_sm90_api_fails_naming_the_step(monkeypatch, fake_torch):
    old = types.ModuleType("deep_gemm")
    old.__file__ = "/site/deep_gemm/__init__.py"
    old.fp8_mega_moe = object()
    monkeypatch.setattr(deepgemm, "_import_deep_gemm", lambda: old)
    record = _record(monkeypatch)
    assert record["status"] == "failed"
    assert record["error"] == (
        "every rank: AttributeError: step 'find its SM90 MegaMoE API' failed: deep_gemm "
        "(/site/deep_gemm/__init__.py) has no get_symm_buffer_for_sm90_mega_moe, "
        "transform_weights_for_mega_moe_sm90"
    )


def test_a_bad_site_reaches_the_record_instead_of_killing_the_worker(
    tmp_path, monkeypatch, fake_torch
):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv(deepgemm.SITE_ENV, str(tmp_path))
    deepgemm.TASK.prepare()  # as the worker does before it imports torch
    record = _record(monkeypatch)
    assert record["status"] == "failed"
    assert record["error"].startswith(
        f"every rank: FileNotFoundError: step '{deepgemm.SITE_ENV}' failed: "
        f"{deepgemm.SITE_ENV}={tmp_path} holds no torch package and no deep_gemm package"
    )


def test_w4a8_is_unsupported_without_starting_a_worker(monkeypatch):
    record = _record(monkeypatch, {**POINT, "precision": "w4a8"})
    assert record["status"] == "unsupported" and "FP8 x FP8 only" in record["error"]


@needs_torch
def test_the_reference_stores_the_intermediate_as_it_is_told():
    import torch

    from xstage_bench.megamoe.quant import quantize_rows

    g = torch.Generator().manual_seed(0)
    T, H, I = 4, 128, 128  # noqa: E741
    xq, xs = quantize_rows(torch.randn(T, H, generator=g))
    home = reference.HomeTokens(xq, xs, np.array([[0], [1], [0], [1]]), np.full((T, 1), 0.5))
    w1 = torch.randn(2, 2 * I, H, generator=g).to(torch.float8_e4m3fn)
    w2 = torch.randn(2, H, I, generator=g).to(torch.float8_e4m3fn)
    s1, s2 = torch.full((2, 2, 1), 0.1), torch.full((2, 1, 1), 0.1)
    ex = reference.ExpertWeights(w1, s1, w2, s2)
    fmt = reference.Intermediate(block=64, weighted=True)

    def outputs(stored):
        return reference.reference_outputs(
            [home], [ex], [np.arange(T)], "w8a8", fmt, stored_intermediate=stored
        )[0]

    assert (outputs(torch.zeros_like) == 0).all()
    told = outputs(deepgemm.stored_intermediate)
    exact = reference.reference_outputs([home], [ex], [np.arange(T)], "w8a8", fmt)[0]
    assert not torch.equal(told, exact)  # the other rounding reached the outputs
    assert float((told - exact).norm() / exact.norm()) < 0.1


def test_a_worker_that_crashes_names_the_step_it_crashed_in(tmp_path, monkeypatch):
    """A segfault leaves no exception (DeepGEMM's SM90 fork crashed so on one H200): the
    worker notes each step it starts, and the record names the one it died in."""
    from xstage_bench.megamoe.baselines import worker_pair

    monkeypatch.setenv(worker_pair.STEPS_ENV, str(tmp_path))
    worker_pair.announce_step("first call (JIT compile and run, output poisoned)")
    import os

    assert worker_pair.last_step(str(tmp_path), os.getpid()) == (
        "first call (JIT compile and run, output poisoned)"
    )
    assert worker_pair.last_step(str(tmp_path), os.getpid() + 1) is None
    assert worker_pair.last_step(str(tmp_path), None) is None


def test_a_run_that_accumulates_in_bf16_is_held_to_its_own_bound():
    fp32_line = SPLIT_LINE.replace("bf16_scaled_accum=1", "bf16_scaled_accum=0")
    assert deepgemm.accumulation_of(SPLIT_LINE) == "bf16"
    assert deepgemm.accumulation_of(fp32_line) == "fp32"
    assert deepgemm.accumulation_of("") == "fp32"
    assert deepgemm.tolerance(fp32_line, 0.02) == 0.02
    assert deepgemm.tolerance(SPLIT_LINE, 0.02) == deepgemm.BF16_ACCUM_TOLERANCE == 0.05
    assert deepgemm.tolerance(SPLIT_LINE, 0.1) == 0.1  # never tighter than the base bound
