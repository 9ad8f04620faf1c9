"""DeepGEMM's SM90 FP8 MegaMoE (PyPI sgl-deep-gemm 0.2.5, `deep_gemm.fp8_mega_moe`) on
the same inputs as our kernel, run in its own torch.distributed process pair.

DeepGEMM exchanges tokens through PyTorch symmetric memory, which needs one process per
GPU; our runner drives every GPU from one process. So it runs in a pair of worker
processes, one rank each (worker_pair.py: spawned once, one configuration at a time,
bounded waits; a hang or a crash fails the point and the next point starts a fresh pair).

Each worker rebuilds its rank's inputs with the generators our problem uses (the same
seeded tokens, routing and FP8 weights), converts them with DeepGEMM's own helpers
(`transform_weights_for_mega_moe_sm90` interleaves gate/up; activations and block scales
are already DeepGEMM's SM90 formats: FP8 e4m3 with one fp32 scale per token and 128
channels, 128x128 fp32 weight-block scales), fills the symmetric buffer, and runs the
kernel once with its output poisoned (NaN). The sampled tokens' rows go back to the runner,
which checks them against our reference told DeepGEMM's intermediate format (one scale per
row and `block` channels, read from the buffer's layout, and the top-k weight applied
before quantization, as its Linear-1 epilogue does). Only then is it timed: per repetition
the inputs are copied into the buffer (outside the timed region), L2 is flushed, the ranks
meet at a barrier, and CUDA events on each rank time the kernel (the timing module's
event timer and its fixed-count rule); a sample is the slowest rank's time. DeepGEMM's
time includes its dispatch (the kernel pulls the tokens over NVLink); our kernel's time
does not.

Which schedule: 0.2.5 picks it on the host (heuristics/sm90_mega_moe.hpp in its sources):
a symmetric buffer of at least 1024 tokens per rank gets the "L2-lag" interleaved schedule
(kL2LagUnits > 0: Linear-2 units issued a lag behind Linear-1 on a ring), a smaller one
(or a call bounded to at most 256 tokens) the wave schedule (kL2LagUnits = 0: all
Linear-1 blocks of a group of experts, then their Linear-2 blocks). Its Python API has no
knob for it. We run its default and read which schedule ran from the configuration it
prints (DG_PRINT_CONFIGS=1, `l2_lag_units=`); the other schedule of the configuration is
recorded "unsupported" with that line.

Seen on the 2x H200 image (torch 2.11.0+cu130): the wheel's prebuilt _C.so does not load,
"undefined symbol: _ZN3c104cuda19CUDAErrorLogCaptureC1Ev" (c10::cuda::CUDAErrorLogCapture,
from the C10_CUDA_CHECK of torch >= 2.12), and the wheel carries no sources to rebuild it
(every wheel from 0.2.2 to 0.2.5 needs that symbol; PyPI has no sdist); every W8A8 point is
then recorded "failed" with that loader message. The workers are processes of their own,
so they can import another torch than the runner: XSTAGE_DEEPGEMM_SITE names a directory
(a `pip install --target`) holding torch >= 2.12, put first on the workers' sys.path; the
record's extra says which torch the workers ran (`deepgemm_torch`).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass

from xstage_bench.megamoe import schedule
from xstage_bench.megamoe.baselines.worker_pair import Task, time_collective

SCHEDULE_NAMES = {schedule.WAVE: "wave", schedule.INTERLEAVED: "L2-lag"}
SITE_ENV = "XSTAGE_DEEPGEMM_SITE"  # a site directory with the torch DeepGEMM was built for
PRECISION = "w8a8"  # the only precision its SM90 MegaMoE takes (FP8 x FP8)
DEFAULT_JOB_TIMEOUT_S = 300.0  # first call of a shape includes its nvcc JIT compile
ENV = {"DG_PRINT_CONFIGS": "1"}  # DeepGEMM prints the config it chose
_CONFIG_LINE = re.compile(r"MegaMoESM90Config\([^\n]*\)")


def unsupported_reason(point: dict) -> str | None:
    """Why DeepGEMM's SM90 MegaMoE cannot run a configuration at all, or None."""
    if point["precision"] != PRECISION:
        return (
            f"DeepGEMM's SM90 MegaMoE (sgl-deep-gemm fp8_mega_moe) takes FP8 x FP8 only; "
            f"precision {point['precision']} has no SM90 path in it"
        )
    return None


def schedule_of(config_line: str) -> str | None:
    """'interleaved' (L2-lag), 'expert_wave' (wave) or None, from a printed config."""
    m = re.search(r"l2_lag_units=(\d+)", config_line or "")
    if m is None:
        return None
    return schedule.INTERLEAVED if int(m.group(1)) % 1000 > 0 else schedule.WAVE


@dataclass
class RankResult:
    """What one worker reports for one configuration."""

    error: str | None
    config_line: str = ""
    block: int = 0  # channels per intermediate scale
    first_call_s: float = 0.0  # the checked call, including the JIT compile
    rows: object = None  # float32 (len(tokens), H): the sampled tokens' outputs
    nan_rows: int = 0
    times_us: list | None = None
    version: str = ""
    torch_version: str = ""


# ---- the worker process ---------------------------------------------------------------


def prefer_site() -> str | None:
    """Put XSTAGE_DEEPGEMM_SITE first on sys.path (before torch is imported), or None."""
    import sys

    site = os.environ.get(SITE_ENV)
    if not site:
        return None
    if not os.path.isdir(os.path.join(site, "torch")):
        raise FileNotFoundError(f"{SITE_ENV}={site} holds no torch package")
    sys.path.insert(0, site)
    return site


def _captured_stdout(fn) -> tuple[object, str]:
    """Call fn with file descriptor 1 redirected (DeepGEMM prints its config from C++)."""
    import ctypes
    import sys

    sys.stdout.flush()
    libc = ctypes.CDLL(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            value = fn()
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    return value, text


def _import_deep_gemm():
    """deep_gemm, after loading the CUDA libraries its _C.so names without a search path
    (torch loads nvrtc only when it needs it): torch's own copies first, else CUDA_HOME's.
    A library that still fails to load is named with the loader's reason."""
    import ctypes
    import glob

    import torch

    roots = [
        os.path.join(os.path.dirname(torch.__file__), "..", "nvidia"),
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib64"),
    ]
    for lib in ("libcudart.so.13", "libnvrtc.so.13", "libcublasLt.so.13", "libcublas.so.13"):
        try:
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            continue
        except OSError:
            pass
        for root in roots:
            hits = sorted(glob.glob(os.path.join(root, "**", lib), recursive=True))
            if hits:
                ctypes.CDLL(hits[0], mode=ctypes.RTLD_GLOBAL)
                break
    try:
        import deep_gemm
    except OSError as e:
        raise OSError(f"{e} (loader: {e.__cause__})") from e
    return deep_gemm


def _what_to_install(torch_version: str) -> str:
    """What a reader can do about a DeepGEMM that does not import (seen on 2x H200 with
    torch 2.11.0, 2026-11-29/30)."""
    return (
        f"the workers run torch {torch_version}. sgl-deep-gemm 0.2.2-0.2.5 need torch >= 2.12 "
        "(their _C.so wants c10::cuda::CUDAErrorLogCapture): install one and point "
        f"{SITE_ENV} at a site directory holding torch >= 2.12 for the workers. 0.2.0 "
        "imports with torch 2.11, but its extension was compiled against other torch headers: "
        "fp8_mega_moe fails inside c10::TensorImpl ('tensor does not have a device'). Or "
        "build DeepGEMM from source against this torch"
    )


def _run_job(job: dict, rank: int, group) -> RankResult:
    import importlib.metadata

    import torch
    import torch.distributed as dist

    from xstage_bench.megamoe.inputs import make_expert_weights, make_home_tokens

    try:
        deep_gemm = _import_deep_gemm()
    except (OSError, ImportError) as e:
        raise type(e)(f"{e} [{_what_to_install(torch.__version__)}]") from e
    point, seed = job["point"], job["seed"]
    device = torch.device("cuda", rank)
    T, H, I = point["tokens_per_rank"], point["H"], point["I"]  # noqa: E741
    home = make_home_tokens(point, PRECISION, rank, device, seed)
    ex = make_expert_weights(point, PRECISION, rank, device, seed)
    l1, l2 = deep_gemm.transform_weights_for_mega_moe_sm90((ex.w1, ex.s1), (ex.w2, ex.s2))
    buf = deep_gemm.get_symm_buffer_for_sm90_mega_moe(group, point["E"], T, point["topk"], H, I)
    try:
        ids = torch.as_tensor(home.ids, device=device)
        weights = torch.as_tensor(home.weights, device=device)

        def fill() -> None:
            buf.x[:T].copy_(home.xq)
            buf.x_sf[:T].copy_(home.xs)
            buf.topk_idx[:T].copy_(ids)
            buf.topk_weights[:T].copy_(weights)

        y = torch.empty(T, H, dtype=torch.bfloat16, device=device)

        def call() -> None:
            deep_gemm.fp8_mega_moe(
                y, l1, l2, buf, recipe=(128, 128, 128), activation="swiglu", fast_math=True
            )

        fill()
        y.fill_(float("nan"))
        dist.barrier()
        start = time.perf_counter()
        _, printed = _captured_stdout(lambda: (call(), torch.cuda.synchronize()))
        first = time.perf_counter() - start
        lines = _CONFIG_LINE.findall(printed)
        rows = torch.as_tensor(job["tokens"], device=device)
        result = RankResult(
            error=None,
            config_line=lines[-1] if lines else printed.strip()[-800:],
            block=I // buf.l2_acts_sf.shape[-1],
            first_call_s=first,
            rows=y[rows].float().cpu().numpy(),
            nan_rows=int(torch.isnan(y).any(dim=1).sum()),
            version=importlib.metadata.version("sgl-deep-gemm"),
            torch_version=torch.__version__,
        )
        result.times_us = time_collective(call, job["policy"], device, refill=fill)
        return result
    finally:
        buf.destroy()
        dist.barrier()


TASK = Task(name="DeepGEMM", run_job=_run_job, result_type=RankResult, prepare=prefer_site, env=ENV)
