"""Measure the fused MoE kernel (and the baselines a user would pick instead) over the
configured grid and write its raw files.

    python -m xstage_bench.megamoe.runner --config config.yaml --dataset h200x2 \
        --out results/h200x2/raw/megamoe.json --trace-out results/h200x2/raw/megamoe_trace.json

One record per (configuration, schedule) of our kernel, id '<config id>/<schedule>'; with
`megamoe.variants` (default: ours, unfused, deepgemm) also one record per configuration of
the unfused torch pipeline ('<config id>/unfused', baselines/unfused.py) and one per
(configuration, schedule) of DeepGEMM's SM90 MegaMoE ('<config id>/deepgemm/<schedule>',
baselines/deepgemm.py) and, when asked for, one per configuration at natural routing of
FlashInfer's SM90 MegaMoE ('<config id>/flashinfer', baselines/flashinfer.py), each
measured right after our kernel on the same inputs and checked against the same
reference before it is timed. Every point goes through
protocol.measure_point: clocks, check, timing, record; a point whose check fails is
recorded "wrong" and not timed. Weights are made once per (shape, precision) and reused
by that shape's routings and sizes.

The pieces, by role: points.py (what is measured), measurer.py (our kernel's check,
timing and traced runs), verdict.py (the check's judgement, shared with the one-process-
per-GPU path), baselines/measure.py (the baselines), summary.py (traced-run facts and the
printed table), options.py (the grid's command-line options); this module writes the
raw files and is the command.

The trace file holds, for a few configurations, one instrumented run (TRACE build) of
each schedule and of the local-store control: per-tile %globaltimer stamps, the remote-
store span of every Linear-2 tile (all ranks), and, for the first configuration, the
per-program timeline of rank 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from xstage_bench import grid, timing
from xstage_bench.environment import capture_measured
from xstage_bench.megamoe import reference
from xstage_bench.megamoe.baselines import BASELINES, VARIANTS, flashinfer, unfused
from xstage_bench.megamoe.measurer import MoEMeasurer
from xstage_bench.megamoe.options import add_grid_arguments, selected_grid
from xstage_bench.megamoe.points import (
    CHECK_TOKENS,
    POINT_TIMEOUT_S,
    config_id,
    expand_points,
    trace_points,
)
from xstage_bench.megamoe.quant import PRECISIONS
from xstage_bench.megamoe.summary import print_summary
from xstage_bench.sweep import Refresh, records_refresh, run_sweep

# Variants that do not run our kernel (gemm_ceiling: cuBLAS on the same GEMMs).
BASELINE_VARIANTS = (*BASELINES, "gemm_ceiling")


def default_devices(config: dict, world_size: int | None = None, device_type: str = "cuda") -> list:
    import torch

    if device_type == "cpu":
        return [torch.device("cpu")] * (world_size or 2)
    count = torch.cuda.device_count()
    if world_size is None:
        world_size = (
            count if config.get("world_size", "auto") == "auto" else int(config["world_size"])
        )
    if world_size > count:
        raise RuntimeError(f"world_size={world_size}, but only {count} GPU(s) are visible")
    if world_size < 1:
        raise RuntimeError("the MoE sweep needs at least one GPU")
    return [torch.device("cuda", i) for i in range(world_size)]


TL_KERNEL = {"kernel": "tl", "source": "kernels/xstage_kernels/megamoe.py"}
WS_SOURCE = (
    "kernels/xstage_kernels/megamoe_ws.py (Gluon, warp-specialized: one TMA producer warp, "
    "two math warpgroups of 64 rows)"
)


def kernels_that_ran(kernel, device_type: str) -> dict:
    """Per precision, which kernel ran it (megamoe.launch picks the warp-specialized one for
    W8A8 and W4A8 on a GPU). A precision's record changes only when its kernel does, so a
    finished sweep re-measures only that precision's points (kernel_refresh)."""
    ran = {p: TL_KERNEL for p in PRECISIONS}
    if device_type != "cuda" or kernel.fp8_kernel() == "tl":
        return ran
    from xstage_kernels import megamoe_ws

    ran["w8a8"] = {
        "kernel": "ws",
        "source": WS_SOURCE,
        "stages": megamoe_ws.stages("w8a8"),
        "num_warps": megamoe_ws.warps("w8a8"),
    }
    ran["w4a8"] = {
        "kernel": "ws",
        "source": f"{WS_SOURCE}; converter warpgroups turn the packed weights into FP8 "
        "in shared memory",
        "stages": megamoe_ws.stages("w4a8"),
        "num_warps": megamoe_ws.warps("w4a8"),
        "converters": megamoe_ws.W4_CONVERTERS,
        "weight_packing": "word-split (quant.py)",
    }
    return ran


def _kernel_parts(config: dict) -> tuple[dict, dict]:
    """(the raw config less which kernel ran each precision, those records). Raw files
    written before `ran` existed name only W8A8's kernel (key w8a8); the others ran tl."""
    kernel = config.get("kernel", {})
    ran = kernel.pop("ran", None)
    if ran is None:
        ran = {p: TL_KERNEL for p in PRECISIONS} | {"w8a8": kernel.pop("w8a8", TL_KERNEL)}
    return config, ran


def kernel_refresh(previous: dict, config: dict) -> Refresh | None:
    """sweep.run_sweep's refresh rule: when two raw configs differ only in the kernel that
    ran some precisions, our kernel's points at those precisions are stale (the baselines'
    points and the other precisions' are kept)."""
    return records_refresh(
        previous,
        config,
        _kernel_parts,
        lambda point, changed: (
            point.get("variant") not in BASELINE_VARIANTS and point["precision"] in changed
        ),
        prefix="our kernel at ",
    )


def raw_config(
    config: dict, moe: dict, world_size: int, check_tokens: int, device_type: str = "cuda"
) -> dict:
    from xstage_kernels import megamoe as kernel

    raw = {
        "megamoe": moe,
        "timing": config["timing"],
        "world_size": world_size,
        "kernel": {
            "source": "kernels/xstage_kernels/megamoe.py (Triton, persistent)",
            "block_m": kernel.BLOCK_M,
            "block_n": kernel.BLOCK_N,
            "block_k": kernel.BLOCK_K,
            "num_warps": kernel.NUM_WARPS,
            "num_stages": kernel.NUM_STAGES,
            "tma_loads": ["w8a8"],
            "max_spin": kernel.MAX_SPIN,
            "ran": kernels_that_ran(kernel, device_type),
        },
        "check": {
            "tokens_per_rank": check_tokens,
            "tolerance_rel_l2": reference.tolerance(device_type),
        },
        "definitions": {
            "time_us": "GPU 0 events around: every rank's fused kernel, the cross-GPU barrier "
            "and every home rank's top-k weighted reduction (dispatch excluded, done once)",
            "kernel_us": "max over ranks of the fused kernel alone (events on its stream)",
            "tflops": "useful FLOPs (6 H I per routed row, no padding) per GPU / median time_us",
            "nvlink_bytes": "bf16 output bytes the combine epilogues store into peers, all ranks",
        },
        "variants": moe.get("variants", list(VARIANTS)),
        "baselines": {
            "unfused": {
                "source": "src/xstage_bench/megamoe/baselines/unfused.py",
                "dispatch_combine": "peer copies between the GPUs of one process (copy "
                "engines), the single-process equivalent of an NCCL all_to_all",
                "gemm": "per configuration the faster checked path of " + ", ".join(unfused.GEMMS),
                "time_us": "GPU 0 events around: dispatch copies, Linear-1, SwiGLU and "
                "requantization, Linear-2, combine copies and the top-k weighted sum on every "
                "rank (the dispatch is inside, unlike our kernel's time_us)",
                "nvlink_bytes": "dispatched rows (values + scales) and returned bf16 output "
                "rows that cross to another rank, all ranks",
            },
            "deepgemm": {
                "source": "sgl-deep-gemm (PyPI) deep_gemm.fp8_mega_moe, SM90, "
                "src/xstage_bench/megamoe/baselines/deepgemm.py",
                "processes": "one torch.distributed (NCCL) process per GPU, symmetric memory",
                "schedule": "chosen by DeepGEMM's host heuristics, read from its printed "
                "MegaMoESM90Config (l2_lag_units > 0: L2-lag = interleaved, 0: wave)",
                "time_us": "slowest rank's CUDA-event time of one fp8_mega_moe call, after a "
                "barrier, inputs already in its symmetric buffer (its in-kernel dispatch, "
                "expert GEMMs, combine and top-k sum are inside)",
                "check": "sampled rows vs our reference told its intermediate format "
                "(per-`intermediate_block` FP8 scales, top-k weight before quantization)",
            },
        },
    }
    if "flashinfer" in raw["variants"]:
        raw["baselines"]["flashinfer"] = flashinfer_description()
    return raw


def flashinfer_description() -> dict:
    """The raw config's baselines.flashinfer, written only by sweeps that measure it: a
    sweep without it keeps the config it had (and sweep.added_variants can grow one)."""
    return {
        "source": f"flashinfer-python (PyPI) flashinfer.moe_ep, backend {flashinfer.BACKEND}, "
        "src/xstage_bench/megamoe/baselines/flashinfer.py",
        "processes": "one torch.distributed (NCCL) process per GPU, NVSHMEM symmetric heap "
        "(peer memory over NVLink)",
        "format": f"{flashinfer.FORMAT}; given our FP8 values dequantized to bf16, quantized "
        "by FlashInfer (gate/up rows interleaved by 8 before its weight blocks)",
        "points": "one per configuration, natural routing only: it runs its own schedule and "
        "its own dispatch, so re-homed remote fractions do not apply",
        "time_us": "slowest rank's CUDA-event time of one compute_staged call, after a "
        "barrier, FP8 inputs staged once beforehand (its in-kernel dispatch, expert GEMMs, "
        "combine and top-k sum are inside)",
        "forward_us": "the same for forward with bf16 input (quantize, stage, kernel, "
        "copy-out), median",
        "check": "sampled rows of forward, compute_staged, and compute_staged after the timed "
        "launches vs our reference told its weights as it stores them and its intermediate "
        "format (FP8 per 64 channels, top-k weight before quantization)",
    }


def run_megamoe(
    config: dict,
    dataset: str,
    out: str | Path,
    trace_out: str | Path | None,
    world_size: int | None = None,
    *,
    megamoe: dict | None = None,
    check_tokens: int = CHECK_TOKENS,
    baseline_budget_s: float | None = None,
    device_type: str = "cuda",
) -> None:
    """Measure every (configuration, variant, schedule) and write raw/megamoe.json (`out`);
    with `trace_out`, the instrumented runs of the traced configurations too (ours only).
    `baseline_budget_s` bounds the wall time DeepGEMM may take in all, and FlashInfer's
    likewise (points past it are recorded failed, "not run"). device_type="cpu": every
    rank on the CPU under the Triton interpreter, our kernel only (CI's test of the rule;
    the traces are unsupported)."""
    from xstage_bench.megamoe.problem import enable_peer_access

    moe = megamoe or config["megamoe"]
    devices = default_devices(config, world_size, device_type)
    if device_type == "cpu":  # (TRITON_INTERPRET=1 must be set before triton loads)
        moe = {**moe, "variants": ["ours"]}
    elif len(devices) > 1:
        enable_peer_access(devices)
    policy = timing.TimingPolicy.from_config(config["timing"])
    measurer = MoEMeasurer(
        moe, policy, devices, check_tokens=check_tokens, baseline_budget_s=baseline_budget_s
    )
    configs = grid.megamoe_points(moe, len(devices))
    env = capture_measured(device_type)
    cfg = raw_config(config, moe, len(devices), check_tokens, device_type)
    try:
        run_sweep(
            expand_points(configs, moe),
            measurer,
            Path(out),
            experiment="megamoe",
            backend="cuda",
            dataset=dataset,
            environment=env,
            config=cfg,
            point_timeout_s=POINT_TIMEOUT_S,
            refresh=kernel_refresh,
        )
    finally:
        measurer.close()
    if trace_out is None:
        return
    points = trace_points(configs)
    first = points[0]["id"].rsplit("/", 1)[0] if points else None
    run_sweep(
        points,
        lambda p: measurer.trace(p, keep_timeline=config_id(p) == first),
        Path(trace_out),
        experiment="megamoe_trace",
        backend="cuda",
        dataset=dataset,
        environment=capture_measured(device_type),
        config=cfg,
        point_timeout_s=POINT_TIMEOUT_S,
        refresh=kernel_refresh,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_grid_arguments(parser)
    parser.add_argument("--out", required=True, type=Path, help="raw/megamoe.json to write")
    parser.add_argument("--trace-out", type=Path, help="raw/megamoe_trace.json to write")
    parser.add_argument(
        "--variants", help="comma-separated: ours, unfused, deepgemm, flashinfer, gemm_ceiling"
    )
    parser.add_argument(
        "--baseline-budget-s",
        type=float,
        help="wall-time bound on all DeepGEMM runs, and on all FlashInfer runs",
    )
    parser.add_argument("--world-size", type=int, help="GPUs to use (default: config)")
    args = parser.parse_args(argv)
    try:
        config, moe = selected_grid(args)
    except ValueError as e:  # a bad config file or grid option, named
        parser.error(str(e))
    run_megamoe(
        config,
        args.dataset,
        args.out,
        args.trace_out,
        args.world_size,
        megamoe=moe,
        check_tokens=args.check_tokens,
        baseline_budget_s=args.baseline_budget_s,
    )
    print_summary(args.out, args.trace_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
