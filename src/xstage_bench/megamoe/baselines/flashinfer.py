"""FlashInfer's SM90 FP8 MegaMoE (PyPI flashinfer-python 0.7.4, `flashinfer.moe_ep`,
backend sm90_fp8_fp8_bf16_pull_cutedsl) on the same inputs as our kernel, run in its own
torch.distributed process pair.

The kernel (CuTe DSL, compiled at its first call) pulls each expert's tokens from their
home rank over NVLink, runs both GEMMs with SwiGLU between them and combines the outputs
back: dispatch and combine are inside its time. Its peers' buffers live on an NVSHMEM
symmetric heap, which needs one process per GPU, so it runs in a pair of worker processes
(worker_pair.py). Each worker holds one NVSHMEM runtime handle for its whole life: a
layer's destroy() then never finalizes NVSHMEM, which the next configuration's layer
could not initialize again in the same process.

Inputs: each worker rebuilds its rank's tokens, routing and FP8 weights with the
generators our problem uses and hands FlashInfer their bf16 dequantized values (FP8 value
times scale): FlashInfer quantizes them itself, blockwise (one fp32 scale per token and
128 channels, one per 128x128 weight block, amax / 448). The activations come back as our
FP8 values exactly (each of our 1x128 blocks holds a 448, and bf16's rounding is far
inside half an FP8 step). The weights do not: our weight blocks do not reach 448 (their
values are normal draws), and FlashInfer interleaves gate and up rows by 8 before it
blocks them, so one of its blocks holds 64 gate and 64 up rows of two of ours. So the
reference is told the weights as FlashInfer stores them (`stored_weights`, the same
recipe in torch), its intermediate format (FP8 per 64 channels, the top-k weight applied
before quantization) and checks the sampled rows with the usual tolerance.

Per configuration: the layer is built, the output poisoned (NaN) before each checked call:
`forward` (bf16 in; includes the JIT compile), then `compute_staged` on the inputs
`forward` staged (the FP8 kernel alone, what is timed), timed with the timing module's
event timer and fixed-count rule (a sample is the slowest rank's time), checked once more
after the timed launches (they reuse one staging), and `forward` timed once for
`forward_us` (quantize, stage, kernel, copy-out).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field

from xstage_bench.megamoe import reference
from xstage_bench.megamoe.baselines.worker_pair import Task, time_collective

BACKEND = "sm90_fp8_fp8_bf16_pull_cutedsl"
FORMAT = "FP8 e4m3, 1x128 activation and 128x128 weight block scales"
PRECISION = "w8a8"  # the only precision of this backend that matches one of ours
SITE_ENV = "XSTAGE_FLASHINFER_SITE"  # extra site directories, os.pathsep-separated
DEFAULT_JOB_TIMEOUT_S = 300.0  # the first call of a shape includes its CuTe DSL compile
GATE_UP_INTERLEAVE = 8  # its FC1 rows: 8 gate rows, then the matching 8 up rows
INTERMEDIATE = reference.Intermediate(block=64, weighted=True)  # Fp8Fc2ActivationScaleK
# NVSHMEM over NVLink inside one node, its bootstrap over loopback, and a symmetric heap
# with room for the largest grid shape; FlashInfer's built-in launch heuristics.
ENV_DEFAULTS = {
    "NVSHMEM_REMOTE_TRANSPORT": "none",
    "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME": "lo",
    "NVSHMEM_SYMMETRIC_SIZE": "8G",
    "FLASHINFER_MOE_EP_KNOB_CACHE": "off",
}
# module (as a path) -> the pip package that provides it
PACKAGES = {
    "flashinfer/moe_ep": "flashinfer-python",
    "nvshmem/core": "nvshmem4py-cu13",
    "cuda/core": "cuda-core",
    "cutlass": "nvidia-cutlass-dsl",  # the CuTe DSL the kernel is written in
}
NEEDS_GPU = (
    "FlashInfer's SM90 MegaMoE runs on Hopper GPUs (CUDA, one process per GPU); this run has none"
)


def unsupported_reason(point: dict) -> str | None:
    """Why FlashInfer's SM90 FP8 MegaMoE cannot run a configuration at all, or None."""
    if point["precision"] != PRECISION:
        return (
            f"FlashInfer's {BACKEND} takes FP8 x FP8 only; precision {point['precision']} "
            "has no SM90 path in it that matches ours"
        )
    return None


def site_dirs() -> list[str]:
    """The directories XSTAGE_FLASHINFER_SITE names (FileNotFoundError for one missing)."""
    dirs = [d for d in os.environ.get(SITE_ENV, "").split(os.pathsep) if d]
    for d in dirs:
        if not os.path.isdir(d):
            raise FileNotFoundError(f"{SITE_ENV}: {d} is not a directory")
    return dirs


def prefer_sites() -> list[str]:
    """Put XSTAGE_FLASHINFER_SITE's directories first on sys.path and PYTHONPATH (before
    torch is imported, and for anything the workers start)."""
    dirs = site_dirs()
    sys.path[:0] = dirs
    os.environ["PYTHONPATH"] = os.pathsep.join([*dirs, os.environ.get("PYTHONPATH", "")])
    return dirs


def missing_packages() -> str | None:
    """What to install (or point XSTAGE_FLASHINFER_SITE at) when a package the workers
    import is on neither path, or None; looked up as directories, so nothing is imported
    (flashinfer imports pull in torch and the CuTe DSL)."""
    search = [*site_dirs(), *sys.path]
    missing = [
        pip
        for module, pip in PACKAGES.items()
        if not any(os.path.isdir(os.path.join(d, module)) for d in search)
    ]
    if not missing:
        return None
    return (
        f"not importable: {', '.join(missing)}. pip install flashinfer-python "
        "nvshmem4py-cu13 cuda-core nvidia-cutlass-dsl (flashinfer-python 0.7.4 is the one "
        "checked on 2x H200), or point "
        f"{SITE_ENV} at the site directories that hold them (os.pathsep-separated, e.g. "
        "/tmp/site-fi:/tmp/site-fa:/tmp/site-fa/nvidia_cutlass_dsl/dsl_packages)"
    )


# ---- the weights as FlashInfer stores them (the reference's view; CPU-testable) -------


def interleave_gate_up(w1):
    """(2I, H) gate||up rows -> FlashInfer's FC1 order: 8 gate rows, their 8 up rows, ..."""
    import torch

    two_i, h = w1.shape
    gate, up = (half.reshape(-1, GATE_UP_INTERLEAVE, h) for half in w1.split(two_i // 2))
    return torch.stack([gate, up], dim=1).reshape(two_i, h)


def deinterleave_gate_up(w1):
    """Inverse of interleave_gate_up."""
    import torch

    h = w1.shape[1]
    pairs = w1.reshape(-1, 2, GATE_UP_INTERLEAVE, h)
    return torch.cat([pairs[:, 0].reshape(-1, h), pairs[:, 1].reshape(-1, h)])


def stored_weights(w1, w2):
    """One expert's fp32 weights (w1 (2I, H) gate||up, w2 (H, I)) as FlashInfer computes
    with them after it was given their bf16 values: bf16, FC1 rows interleaved, each
    128x128 block quantized to FP8 with its amax / 448, dequantized back, FC1 rows
    restored to gate||up."""
    import torch

    from xstage_bench.megamoe.quant import dequantize_weight, quantize_weight

    def requantized(w):
        return dequantize_weight(*quantize_weight(w.to(torch.bfloat16)), PRECISION)

    return deinterleave_gate_up(requantized(interleave_gate_up(w1))), requantized(w2)


# ---- the worker process ---------------------------------------------------------------


@dataclass
class RankResult:
    """What one worker reports for one configuration."""

    error: str | None
    first_call_s: float = 0.0  # the checked forward, including the CuTe DSL compile
    rows: dict = field(default_factory=dict)  # check -> float32 (len(tokens), H)
    nan_rows: dict = field(default_factory=dict)  # check -> rows left NaN
    times_us: list | None = None  # compute_staged
    host_lead: dict | None = None  # its lead facts (worker_pair.time_collective)
    forward_us: float = 0.0  # median of the timed forward calls (slowest rank)
    version: str = ""
    torch_version: str = ""


CHECKS = ("forward", "compute_staged", "after_timing")  # the poisoned calls, in order


def _import_moe_ep():
    """flashinfer.moe_ep (never bare flashinfer: its __init__ imports every kernel family
    and JIT-compiles on some paths), naming what to install when it fails."""
    try:
        import flashinfer.moe_ep as moe_ep
    except ImportError as e:
        raise ModuleNotFoundError(f"{e} [{missing_packages() or 'an import inside it'}]") from e
    return moe_ep


_RUNTIME: list = []  # this worker's NVSHMEM runtime handle, held until the process ends


def _hold_runtime(bootstrap) -> None:
    from flashinfer.moe_ep.core.runtime import (
        bootstrap_moe_ep_runtime,
        sm90_pull_fp8_runtime_requirements,
    )

    if not _RUNTIME:
        needs = sm90_pull_fp8_runtime_requirements(bootstrap)
        _RUNTIME.append(bootstrap_moe_ep_runtime(bootstrap, needs))


def _bf16_weights(point: dict, rank: int, device, seed: int):
    """This rank's experts' weights as bf16 (FP8 value x block scale), one expert at a
    time so that no fp32 copy of them all is ever made."""
    import torch

    from xstage_bench.megamoe.layer.inputs import make_expert_weights
    from xstage_bench.megamoe.quant import dequantize_weight

    ex = make_expert_weights(point, PRECISION, rank, device, seed)
    local, H, I = ex.w1.shape[0], point["H"], point["I"]  # noqa: E741
    w13 = torch.empty(local, 2 * I, H, dtype=torch.bfloat16, device=device)
    w2 = torch.empty(local, H, I, dtype=torch.bfloat16, device=device)
    for e in range(local):
        w13[e] = dequantize_weight(ex.w1[e], ex.s1[e], PRECISION)
        w2[e] = dequantize_weight(ex.w2[e], ex.s2[e], PRECISION)
    return w13, w2


def _run_job(job: dict, rank: int, group) -> RankResult:
    import importlib.metadata

    import torch
    import torch.distributed as dist

    from xstage_bench.megamoe.layer.inputs import make_home_tokens
    from xstage_bench.megamoe.quant import dequantize_rows

    moe_ep = _import_moe_ep()
    point, seed = job["point"], job["seed"]
    device = torch.device("cuda", rank)
    T, H, I = point["tokens_per_rank"], point["H"], point["I"]  # noqa: E741
    bootstrap = moe_ep.BootstrapConfig(world_size=dist.get_world_size(), rank=rank, device=rank)
    _hold_runtime(bootstrap)
    home = make_home_tokens(point, PRECISION, rank, device, seed)
    x = dequantize_rows(home.xq, home.xs).to(torch.bfloat16)
    ids = torch.as_tensor(home.ids, device=device).to(torch.int64)
    weights = torch.as_tensor(home.weights, device=device).to(torch.float32)
    w13, w2 = _bf16_weights(point, rank, device, seed)
    config = moe_ep.Sm90_Fp8_Fp8_Bf16_PullCutedsl_MegaMoeConfig(
        intermediate_size=I, top_k=point["topk"], fp8_scale_mode="blockwise", kind="fp8_e4m3"
    )
    layer = moe_ep.MoEEpLayer(
        bootstrap,
        moe_ep.FleetParams(num_experts=point["E"], max_tokens_per_rank=T, token_hidden_size=H),
        moe_ep.MoEWeightPack(w13, w2),
        backend=moe_ep.MegaConfig(megakernel=config),
    )
    del w13, w2  # the layer holds its own FP8 copy
    torch.cuda.empty_cache()
    try:
        y = torch.empty(T, H, dtype=torch.bfloat16, device=device)
        inputs = moe_ep.MoEEpTensors(hidden_states=x, topk_ids=ids, topk_weights=weights, output=y)
        rows = torch.as_tensor(job["tokens"], device=device)
        result = RankResult(
            error=None,
            version=importlib.metadata.version("flashinfer-python"),
            torch_version=torch.__version__,
        )

        def keep(check: str, out) -> None:
            result.rows[check] = out[rows].float().cpu().numpy()
            result.nan_rows[check] = int(torch.isnan(out[:T]).any(dim=1).sum())

        def poisoned(out, call):
            out.fill_(float("nan"))
            dist.barrier()
            fresh = call()
            torch.cuda.synchronize()
            return fresh

        start = time.perf_counter()
        poisoned(y, lambda: layer.forward(inputs))
        result.first_call_s = time.perf_counter() - start
        keep("forward", y)
        staged = layer.compute_staged(output=None)  # on the inputs forward staged
        staged = poisoned(staged, lambda: layer.compute_staged(output=None))
        keep("compute_staged", staged)
        result.times_us, result.host_lead = time_collective(
            lambda: layer.compute_staged(output=None), job["policy"], device
        )
        staged = poisoned(staged, lambda: layer.compute_staged(output=None))
        keep("after_timing", staged)
        forward, _ = time_collective(lambda: layer.forward(inputs), job["policy"], device)
        result.forward_us = statistics.median(forward)
        return result
    finally:
        dist.barrier()
        layer.destroy()


TASK = Task(
    name="FlashInfer",
    run_job=_run_job,
    result_type=RankResult,
    prepare=prefer_sites,
    env_defaults=ENV_DEFAULTS,
)
