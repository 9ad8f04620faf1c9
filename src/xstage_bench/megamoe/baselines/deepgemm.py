"""DeepGEMM's SM90 FP8 MegaMoE (`deep_gemm.fp8_mega_moe`) on the same inputs as our
kernel, run in its own torch.distributed worker processes (one per GPU, world size 1 too).

Which DeepGEMM. Two builds expose the same Python API (`get_symm_buffer_for_sm90_mega_moe`,
`transform_weights_for_mega_moe_sm90`, `fp8_mega_moe`):

- built from source: the fork AichenF/DeepGEMM, branch megamoe_sm90_fp8_dev (bc4f33a, "Add
  SM90 FP8 MegaMoE support"), compiled against the image's own torch by
  envs/deepgemm-sm90.sh from the tarball envs/deepgemm-source.sh packs (the fork's tree with
  the CUTLASS and fmt headers its submodules pin). The recipe installs `deep_gemm` alone into
  a site directory; XSTAGE_DEEPGEMM_SITE names it and the workers put it first on sys.path.
  The package then holds XSTAGE_SOURCE.txt and XSTAGE_BUILD.txt, which the record's
  `deepgemm_version` quotes (commits, torch and nvcc it was built with);
- the PyPI wheel sgl-deep-gemm (0.2.x). Seen on the 2x H200 image (torch 2.11.0+cu130): the
  prebuilt _C.so of 0.2.2-0.2.5 does not load ("undefined symbol:
  _ZN3c104cuda19CUDAErrorLogCaptureC1Ev", from the C10_CUDA_CHECK of torch >= 2.12) and 0.2.0
  fails inside c10::TensorImpl ("tensor does not have a device"); PyPI has no sdist. Its
  workers can take another torch: XSTAGE_DEEPGEMM_SITE may instead name a `pip install
  --target` directory holding torch >= 2.12 with it. The record's `deepgemm_torch` says
  which torch the workers ran.

Each worker rebuilds its rank's inputs with the generators our problem uses (the same
seeded tokens, routing and FP8 weights) and hands them over in DeepGEMM's layouts, once
per configuration, outside every timed region:

- activations: ours already are its SM90 format (FP8 e4m3, one fp32 scale per token and
  128 channels, K-major): copied into its buffer as they are;
- weights: FP8 e4m3 with one fp32 scale per 128x128 block, (E/P, N/128, K/128) with K
  innermost, as ours; its own `transform_weights_for_mega_moe_sm90` reorders the Linear-1
  rows from gate||up into gate and up interleaved by 8 (`interleave_gate_up_np` is that
  order; the worker checks its result against it on expert 0) and leaves the scales as
  they are (its kernel looks up each row's block scale by the row's original position);
- routing: expert ids as int64 and combine weights as fp32, (T, topk) (`routing_for_deepgemm`;
  ours never masks a slot, so no id is -1).

The output is poisoned (NaN) and the kernel run once; the sampled tokens' rows go back to
the runner, which checks them against our reference told DeepGEMM's intermediate: one
scale per row and `block` channels (read from its buffer's layout: 64), the top-k weight
applied before quantization, and each scale rounded up to a power of two (its Linear-1
epilogue: 2^ceil(log2(amax / 448)), in the fork's bc4f33a and in sgl-project/DeepGEMM's
SM90 kernel alike; `stored_intermediate`). Told exact scales instead, a correct kernel
sits near 3.6% relative error on normal data, past the 2% tolerance.
Only then is it timed: per repetition the inputs are copied into the buffer (outside the
timed region), L2 is flushed, the ranks meet at a barrier, and CUDA events on each rank
time one `fp8_mega_moe` call (the timing module's event timer and fixed-count rule); a
sample is the slowest rank's time. That time includes its dispatch (the kernel pulls the
tokens, over NVLink between GPUs), its combine, and the host work of the call that the GPU
waits for (heuristic, tensor maps, JIT cache lookup); our kernel's time holds none of them.

Which schedule (printed with DG_PRINT_CONFIGS=1, read by `schedule_of`):
- the source build (bc4f33a) runs Linear-1 and Linear-2 as two kernel launches (every
  Linear-1 block of every local expert, then every Linear-2 block): no Linear-2 work
  overlaps Linear-1, so it is recorded under expert_wave and its interleaved point is
  unsupported (`other_schedule_reason`);
- sgl-deep-gemm 0.2.5 picks it on the host: a symmetric buffer of at least 1024 tokens per
  rank gets the "L2-lag" interleaved schedule (l2_lag_units > 0), a smaller one the wave
  schedule; its Python API has no knob for it, so the other schedule is unsupported.

A step that fails names itself in the record: "<error type>: step '<step>' failed: ...".
A missing `deep_gemm` (ModuleNotFoundError) and its host checks (DG_HOST_ASSERT, e.g. its
SM90 kernel's intermediate_hidden / 64 <= 64) are recorded unsupported, anything else
failed.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from xstage_bench.megamoe import schedule
from xstage_bench.megamoe.baselines.worker_pair import Task, announce_step, time_collective

SCHEDULE_NAMES = {schedule.WAVE: "wave", schedule.INTERLEAVED: "L2-lag"}
SITE_ENV = "XSTAGE_DEEPGEMM_SITE"  # a site directory with deep_gemm, or with its torch
PRECISION = "w8a8"  # the only precision its SM90 MegaMoE takes (FP8 x FP8)
DEFAULT_JOB_TIMEOUT_S = 300.0  # first call of a shape includes its nvcc JIT compile
ENV = {"DG_PRINT_CONFIGS": "1"}  # DeepGEMM prints the config it chose
GATE_UP_INTERLEAVE = 8  # its Linear-1 rows: 8 gate rows, then the matching 8 up rows
INTERMEDIATE_BLOCK = 64  # channels per scale of its intermediate (l2_acts_sf)
FP8_MAX = 448.0
TIME_INCLUDES = (
    "its dispatch (the kernel pulls the tokens, over NVLink between GPUs), its combine, and "
    "the host work of its call that the GPU waits for (heuristic, tensor maps, JIT cache lookup)"
)
RECIPE = "envs/deepgemm-sm90.sh"  # builds it from source against the image's torch
MANIFESTS = ("XSTAGE_SOURCE.txt", "XSTAGE_BUILD.txt")  # what the recipe leaves in deep_gemm/
_MANIFEST_KEYS = ("deepgemm ", "cutlass ", "fmt ", "torch ", "nvcc ")  # their lines quoted
# One printed config per line: the source build's "Sm90MoeLaunchConfig(<key>): ...,
# l1=MegaMoESM90Config(...), l2=MegaMoESM90Config(...), ...", or 0.2.5's
# "MegaMoESM90Config(... l2_lag_units=...)".
_CONFIG_LINE = re.compile(r"(?:Sm90MoeLaunchConfig|MegaMoESM90Config)\([^\n]*")
_SPLIT_PHASES = re.compile(r"Sm90MoeLaunchConfig\(.*l1=MegaMoESM90Config\(.*l2=MegaMoESM90Config\(")


def unsupported_reason(point: dict) -> str | None:
    """Why DeepGEMM's SM90 MegaMoE cannot run a configuration at all, or None."""
    if point["precision"] != PRECISION:
        return (
            f"DeepGEMM's SM90 MegaMoE (deep_gemm.fp8_mega_moe) takes FP8 x FP8 only; "
            f"precision {point['precision']} has no SM90 path in it"
        )
    return None


def schedule_of(config_line: str) -> str | None:
    """'interleaved' (L2-lag) or 'expert_wave' (wave, or Linear-1 then Linear-2 in two
    launches), or None, from a printed config."""
    line = config_line or ""
    m = re.search(r"l2_lag_units=(\d+)", line)
    if m is not None:
        return schedule.INTERLEAVED if int(m.group(1)) % 1000 > 0 else schedule.WAVE
    if _SPLIT_PHASES.search(line):
        return schedule.WAVE
    return None


# Its heuristics may accumulate the scaled partial sum of each 128-deep K block in bf16
# (printed bf16_scaled_accum=1; on one H200 it picked it for 10 of the 18 shape and token counts
# of our grid it runs, and no knob turns it off). bf16 rounds each of the K/128 additions to 2^-8
# relative: up to 56 in Linear-1 (H = 7168) and 24 in Linear-2, about 0.4% sqrt(n) = 3% on
# top of the FP8 formats' own error, past the 2% that fp32 promotion meets. Such a run is
# held to its own bound, as the unfused pipeline's requantizing GEMM is; the record says
# which accumulation ran and the bound it met.
BF16_ACCUM_TOLERANCE = 0.05


def accumulation_of(config_line: str) -> str:
    """'bf16' when its printed config says bf16_scaled_accum=1, else 'fp32'."""
    return "bf16" if re.search(r"bf16_scaled_accum=1\b", config_line or "") else "fp32"


def tolerance(config_line: str, base: float) -> float:
    """The relative-L2 bound a run of this config is checked against."""
    return max(base, BF16_ACCUM_TOLERANCE) if accumulation_of(config_line) == "bf16" else base


def other_schedule_reason(config_line: str, wanted: str) -> str:
    """Why the point of schedule `wanted` cannot be measured when the build ran the other
    one for its configuration (`config_line`: what it printed)."""
    if _SPLIT_PHASES.search(config_line or ""):
        return (
            "this DeepGEMM build runs Linear-1 and Linear-2 as two kernel launches (every "
            "Linear-1 block, then every Linear-2 block: recorded under expert_wave) and has "
            f"no {SCHEDULE_NAMES.get(wanted, wanted)} schedule; it ran: {config_line}"
        )
    ran = schedule_of(config_line)
    return (
        f"DeepGEMM chose its {SCHEDULE_NAMES.get(ran, 'unknown')} schedule for this "
        f"configuration and has no knob for its {SCHEDULE_NAMES.get(wanted, wanted)} schedule "
        f"(buffers of >= 1024 tokens per rank run L2-lag); it ran: {config_line}"
    )


# ---- layouts and formats (numpy: the specification; CPU-testable) -------------------------


def interleave_gate_up_np(w1: np.ndarray, gran: int = GATE_UP_INTERLEAVE) -> np.ndarray:
    """(..., 2I, K) gate||up rows -> DeepGEMM's SM90 Linear-1 order: gate rows 0..gran-1,
    up rows 0..gran-1, gate rows gran..2 gran-1, ... (any dtype: rows are only moved)."""
    *lead, n, k = w1.shape
    if n % (2 * gran):
        raise ValueError(f"Linear-1 rows must be gate||up halves of whole {gran}-row groups: {n}")
    half = n // 2
    gate = w1[..., :half, :].reshape(*lead, half // gran, gran, k)
    up = w1[..., half:, :].reshape(*lead, half // gran, gran, k)
    return np.stack([gate, up], axis=-3).reshape(*lead, n, k)


def routing_for_deepgemm(
    ids: np.ndarray, weights: np.ndarray, num_experts: int
) -> tuple[np.ndarray, np.ndarray]:
    """Our routing (T, topk) as DeepGEMM's buffer holds it: int64 global expert ids (-1
    would mean an empty slot; ours has none) and fp32 combine weights, C-contiguous."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    weights = np.ascontiguousarray(weights, dtype=np.float32)
    if ids.ndim != 2 or ids.shape != weights.shape:
        raise ValueError(f"ids {ids.shape} and weights {weights.shape} must be one (T, topk)")
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        raise ValueError(f"expert ids must lie in [0, {num_experts}): {ids.min()}..{ids.max()}")
    return ids, weights


def pow2_scales_np(amax: np.ndarray) -> np.ndarray:
    """DeepGEMM's SM90 intermediate scale of each group's amax: amax * (1/448) in fp32, its
    exponent rounded up unless its mantissa is zero (math::fast_log2_ceil), the scale that
    power of two (fast_pow2); 0 for amax 0."""
    scaled = np.ascontiguousarray(amax, dtype=np.float32) * np.float32(1.0 / FP8_MAX)
    return _pow2(_log2_ceil(scaled.view(np.uint32).astype(np.int64)))


def stored_intermediate_np(h: np.ndarray, block: int = INTERMEDIATE_BLOCK) -> np.ndarray:
    """The intermediate (rows, I) as DeepGEMM's SM90 Linear-1 epilogue stores it and
    Linear-2 reads it back: per row and `block` channels, values times 2^-e rounded to
    e4m3 (saturating), times the scale 2^e of `pow2_scales_np`."""
    from xstage_bench.megamoe.quant import e4m3_round

    rows, cols = h.shape
    if cols % block:
        raise ValueError(f"the intermediate's {cols} channels are not whole {block}-blocks")
    groups = np.asarray(h, dtype=np.float32).reshape(rows, cols // block, block)
    scaled = np.abs(groups).max(axis=-1) * np.float32(1.0 / FP8_MAX)
    exp = _log2_ceil(scaled.view(np.uint32).astype(np.int64))
    values = e4m3_round(groups * _pow2(-exp)[..., None])
    return (values * _pow2(exp)[..., None]).reshape(rows, cols).astype(np.float32)


def _log2_ceil(bits):
    """math::fast_log2_ceil on fp32 bit patterns (numpy or torch integers)."""
    return (bits >> 23) - 127 + ((bits & 0x7FFFFF) != 0)


def _pow2(exp: np.ndarray) -> np.ndarray:
    """math::fast_pow2: the fp32 with exponent field exp + 127 (0.0 for exp -127)."""
    return ((exp + 127) << 23).astype(np.uint32).view(np.float32)


def stored_intermediate(h, block: int = INTERMEDIATE_BLOCK):
    """torch: `stored_intermediate_np` on the device (for the reference; must agree)."""
    import torch

    rows, cols = h.shape
    groups = h.float().reshape(rows, cols // block, block)
    inv_max = torch.tensor(np.float32(1.0 / FP8_MAX), device=h.device)
    scaled = groups.abs().amax(dim=-1) * inv_max
    exp = _log2_ceil(scaled.view(torch.int32)).to(torch.int32)
    scale = ((exp + 127) << 23).view(torch.float32)
    inv = ((127 - exp) << 23).view(torch.float32)
    # torch's e4m3fn conversion turns values past 448 into NaN; the kernel saturates
    values = (groups * inv[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (values.float() * scale[..., None]).reshape(rows, cols)


# ---- the worker process ---------------------------------------------------------------


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
    host_lead: dict | None = None  # worker_pair.time_collective's lead facts
    version: str = ""
    torch_version: str = ""


@contextmanager
def step(name: str, announce: bool = False):
    """Run a step of a worker's job; an exception leaves it as the same type (where it
    can be rebuilt from a message) saying "step '<name>' failed: <message>". `announce`
    says on stderr that the step starts (a step that may hang, which the runner then
    reports only as a timeout)."""
    if announce:
        import sys

        print(f"DeepGEMM worker: step '{name}'", file=sys.stderr, flush=True)
        announce_step(name)  # a crash in it names the step (worker_pair)
    try:
        yield
    except Exception as e:
        raise _named(e, name) from e


def _named(e: Exception, name: str) -> Exception:
    text = f"step '{name}' failed: {e}"
    try:
        named = type(e)(text)
    except Exception:  # an exception type that takes other arguments
        named = None
    if named is not None and str(named) == text:
        return named
    return RuntimeError(f"step '{name}' failed: {type(e).__name__}: {e}")


def prefer_site() -> str | None:
    """Put XSTAGE_DEEPGEMM_SITE first on sys.path (before torch is imported), or None. It
    holds deep_gemm (the recipe's build, for the workers' own torch) or a torch."""
    import sys

    site = os.environ.get(SITE_ENV)
    if not site:
        return None
    if not any(os.path.isdir(os.path.join(site, p)) for p in ("torch", "deep_gemm")):
        raise FileNotFoundError(
            f"{SITE_ENV}={site} holds no torch package and no deep_gemm package "
            f"(build deep_gemm into it with {RECIPE})"
        )
    sys.path.insert(0, site)
    return site


_SITE_ERROR: list = []  # why prefer_site failed in this worker, raised by its first job


def _prepare_worker() -> None:
    """prefer_site in a worker: its error is kept for the job to report (a worker that
    raised here would die before it could say why)."""
    try:
        prefer_site()
    except FileNotFoundError as e:
        _SITE_ERROR.append(e)


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
    """What a reader can do about a DeepGEMM that does not import."""
    return (
        f"the workers run torch {torch_version}. Build DeepGEMM's SM90 MegaMoE from source "
        f"against it ({RECIPE} .carry/deepgemm-src.tar.gz SITE, the tarball from "
        f"envs/deepgemm-source.sh) and set {SITE_ENV}=SITE. The PyPI wheels do not run with "
        "torch 2.11: sgl-deep-gemm 0.2.2-0.2.5 need torch >= 2.12 (their _C.so wants "
        "c10::cuda::CUDAErrorLogCapture; a site directory holding torch >= 2.12 beside one "
        f"can be {SITE_ENV}), 0.2.0 fails inside c10::TensorImpl"
    )


def describe_build(package_dir: str, version: str, dist_version: str | None) -> str:
    """The record's deepgemm_version: the package's version and where it came from (the
    recipe's manifests in the package directory, else the pip distribution)."""
    lines = []
    for name in MANIFESTS:
        try:
            with open(os.path.join(package_dir, name)) as f:
                lines += [line.strip() for line in f if line.startswith(_MANIFEST_KEYS)]
        except OSError:
            continue
    if lines:
        return f"{version} built from source ({'; '.join(lines)})"
    if dist_version:
        return f"{version} (sgl-deep-gemm {dist_version})"
    return f"{version} ({package_dir}, no manifest and no pip distribution)"


def _dist_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("sgl-deep-gemm")
    except importlib.metadata.PackageNotFoundError:
        return None


_PRINTED: dict = {}  # this worker's configs as printed: DeepGEMM prints each key once


def _run_job(job: dict, rank: int, group) -> RankResult:
    with step(SITE_ENV):
        if _SITE_ERROR:
            raise _SITE_ERROR[0]
    with step("import torch"):
        import torch
        import torch.distributed as dist
    with step("import deep_gemm"):
        try:
            deep_gemm = _import_deep_gemm()
        except (OSError, ImportError) as e:
            raise type(e)(f"{e} [{_what_to_install(torch.__version__)}]") from e
    with step("find its SM90 MegaMoE API"):
        api = ("get_symm_buffer_for_sm90_mega_moe", "transform_weights_for_mega_moe_sm90")
        missing = [n for n in (*api, "fp8_mega_moe") if not hasattr(deep_gemm, n)]
        if missing:
            raise AttributeError(f"deep_gemm ({deep_gemm.__file__}) has no {', '.join(missing)}")
        version = describe_build(
            os.path.dirname(deep_gemm.__file__),
            str(getattr(deep_gemm, "__version__", "?")),
            _dist_version(),
        )
    point, seed = job["point"], job["seed"]
    T, H, I = point["tokens_per_rank"], point["H"], point["I"]  # noqa: E741
    with step("build our inputs"):
        from xstage_bench.megamoe.layer.inputs import make_expert_weights, make_home_tokens

        device = torch.device("cuda", rank)
        home = make_home_tokens(point, PRECISION, rank, device, seed)
        ex = make_expert_weights(point, PRECISION, rank, device, seed)
    with step("convert to DeepGEMM's layouts"):
        ids, weights = routing_for_deepgemm(home.ids, home.weights, point["E"])
        ids, weights = torch.from_numpy(ids).to(device), torch.from_numpy(weights).to(device)
        expert0 = interleave_gate_up_np(ex.w1[0].view(torch.uint8).cpu().numpy())
        l1, l2 = deep_gemm.transform_weights_for_mega_moe_sm90((ex.w1, ex.s1), (ex.w2, ex.s2))
        if not np.array_equal(l1[0][0].view(torch.uint8).cpu().numpy(), expert0):
            raise ValueError(
                "transform_weights_for_mega_moe_sm90 did not interleave gate and up rows by "
                f"{GATE_UP_INTERLEAVE} (expert 0 differs from interleave_gate_up_np)"
            )
        del ex, expert0  # its Linear-1 copy replaces ours
    with step("allocate its symmetric buffer"):
        buf = deep_gemm.get_symm_buffer_for_sm90_mega_moe(group, point["E"], T, point["topk"], H, I)
    try:
        return _check_and_time(job, deep_gemm, buf, (home, ids, weights), (l1, l2), version)
    finally:
        buf.destroy()
        dist.barrier()


def _check_and_time(job, deep_gemm, buf, inputs, weights_l12, version) -> RankResult:
    import torch
    import torch.distributed as dist

    point = job["point"]
    home, ids, weights = inputs
    l1, l2 = weights_l12
    T, H = point["tokens_per_rank"], point["H"]
    device = ids.device
    y = torch.empty(T, H, dtype=torch.bfloat16, device=device)

    def fill() -> None:
        buf.x[:T].copy_(home.xq)
        buf.x_sf[:T].copy_(home.xs)
        buf.topk_idx[:T].copy_(ids)
        buf.topk_weights[:T].copy_(weights)

    def call() -> None:
        deep_gemm.fp8_mega_moe(
            y, l1, l2, buf, recipe=(128, 128, 128), activation="swiglu", fast_math=True
        )

    with step("fill its buffer"):
        fill()
        y.fill_(float("nan"))
        dist.barrier()
    with step("first call (JIT compile and run, output poisoned)", announce=True):
        start = time.perf_counter()
        _, printed = _captured_stdout(lambda: (call(), torch.cuda.synchronize()))
        first = time.perf_counter() - start
    key = (dist.get_world_size(), point["E"], H, point["I"], T, point["topk"])
    lines = _CONFIG_LINE.findall(printed)
    if lines:
        _PRINTED[key] = lines[-1]
    with step("read its output rows"):
        rows = torch.as_tensor(job["tokens"], device=device)
        result = RankResult(
            error=None,
            config_line=_PRINTED.get(key) or printed.strip()[-800:],
            block=point["I"] // buf.l2_acts_sf.shape[-1],
            first_call_s=first,
            rows=y[rows].float().cpu().numpy(),
            nan_rows=int(torch.isnan(y).any(dim=1).sum()),
            version=version,
            torch_version=torch.__version__,
        )
    with step("time it", announce=True):
        result.times_us, result.host_lead = time_collective(
            call, job["policy"], device, refill=fill
        )
    return result


TASK = Task(
    name="DeepGEMM", run_job=_run_job, result_type=RankResult, prepare=_prepare_worker, env=ENV
)
