"""Measure the fused MoE kernel (and the baselines a user would pick instead) over the
configured grid and write its raw files.

    python -m xstage_bench.megamoe.runner --config config.yaml --dataset h200x2 \
        --out results/h200x2/raw/megamoe.json --trace-out results/h200x2/raw/megamoe_trace.json

One record per (configuration, arm) of our kernel, id '<config id>/<schedule>' (and
'<config id>/interleaved/lead=<n|auto>' for the lead map, points.py); the arms of one
configuration are timed together in paired rounds (measurer.py). Every path of
config["store_paths"] is measured ("auto" resolved with the GPU count, storepath.resolve):
on the host path a configuration's remote_fraction is its host share (inputs.py) and its
id says the path ('<...>/P=<P>/path=host/f=<f>'). With
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

The trace file holds, for a few configurations per path (on the host path at the grid's
largest host share), one instrumented run (TRACE build) of each schedule and of the
local-store control: per-tile %globaltimer stamps, the remote-store span of every
Linear-2 tile (all ranks), and, for the first configuration of each path, the
per-program timeline of rank 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from xstage_bench.data import grid, storepath
from xstage_bench.data.grid import EXPERT_ROWS, HOME_TOKENS, layer_from
from xstage_bench.data.results import atomic_write_text
from xstage_bench.measurement import log
from xstage_bench.measurement.environment import capture_measured
from xstage_bench.measurement.sweep import (
    Refresh,
    kept_until_done,
    partial_path,
    records_refresh,
    run_sweep,
)
from xstage_bench.megamoe import reference
from xstage_bench.megamoe.baselines import VARIANTS, flashinfer, unfused
from xstage_bench.megamoe.layer import graphs
from xstage_bench.megamoe.options import add_grid_arguments, megamoe_policy, selected_grid
from xstage_bench.megamoe.ours.lead import LeadChooser
from xstage_bench.megamoe.ours.measurer import MoEMeasurer
from xstage_bench.megamoe.ours.summary import print_summary
from xstage_bench.megamoe.points import (
    CHECK_TOKENS,
    POINT_TIMEOUT_S,
    arm_sets,
    config_id,
    expand_points,
    lead_sweep_configs,
    trace_first_configs,
    trace_points,
)
from xstage_bench.megamoe.refresh import first_refresh, lead_map_refresh
from xstage_kernels.formats import PRECISIONS

_log = log.get(__name__)


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
    W8A8 and W4A8 on a Hopper GPU). A precision's record changes only when its kernel does, so a
    finished sweep re-measures only that precision's points (kernel_refresh)."""
    from xstage_kernels import tma

    ran = {p: TL_KERNEL for p in PRECISIONS}
    if device_type != "cuda" or kernel.fp8_kernel() == "tl":
        return ran
    if not tma.first_gpu_runs_warpgroup_mma():  # not a Hopper GPU: megamoe.uses_ws_kernel
        return ran
    from xstage_kernels import megamoe_ws

    ran["w8a8"] = {
        "kernel": "ws",
        "source": WS_SOURCE,
        "stages": megamoe_ws.stages("w8a8"),
        "num_warps": megamoe_ws.warps("w8a8"),
        **megamoe_ws.launch_options("w8a8"),
    }
    ran["w4a8"] = {
        "kernel": "ws",
        "source": f"{WS_SOURCE}; converter warpgroups turn the packed weights into FP8 "
        "in shared memory",
        "stages": megamoe_ws.stages("w4a8"),
        "num_warps": megamoe_ws.warps("w4a8"),
        **megamoe_ws.launch_options("w4a8"),
        "converters": megamoe_ws.W4_CONVERTERS,
        "weight_packing": "word-split, sign and magnitude (quant.py)",
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
    ran some precisions, every point at those precisions is stale, the baselines' with our
    kernel's: a ratio of ours over a baseline then compares times of one run, not of runs
    days and kernel versions apart. The other precisions' points are kept."""
    return records_refresh(
        previous,
        config,
        _kernel_parts,
        lambda point, changed: point["precision"] in changed,
        prefix="our kernel, and the baselines beside it, at ",
    )


HOST_SHARE_RULE = (
    "on the host path, remote_fraction f is the host share: per home rank a seeded choice "
    "of exactly round(f T) of its T tokens (routing.host_tokens: seeded by shape, T, P, "
    "routing and home rank, not by f, so a smaller share's tokens are a subset of a "
    "larger one's) has all its top-k combine rows stored into that home rank's combine "
    "buffer in pinned host memory (the device combine buffer's slot layout), through the "
    "same epilogue stores; the other tokens' rows go to the home GPU's combine buffer. "
    "Routing stays natural ('natural' on the host path is f = 0: the local control, every "
    "row on the GPU)"
)


def definitions(paths: Sequence[str], combine: str, starts_from: str = EXPERT_ROWS) -> dict:
    """What every metric of our kernel's records means, per store path; `combine` names
    the top-k reduction that ran (reduction.py, the raw config's `combine`); `starts_from`
    where the timed layer starts (megamoe.layer_from: token_dispatch.py)."""
    around = "GPU 0 events around: "
    excluded = "dispatch excluded, done once"
    if starts_from == HOME_TOKENS:
        around += (
            "the dispatch on the GPU (each expert's rows counted, the schedule layout built, "
            "the FP8 rows, scales and destinations gathered into padded expert-major buffers: "
            "token_dispatch.py), "
        )
        excluded = "dispatch and layout included"
    common = (
        {}
        if starts_from != HOME_TOKENS
        else {
            "dispatch_us": "max over ranks of the dispatch alone (count, layout, gather: events on "
            "its stream, in the same timed calls as time_us)"
        }
    )
    common |= {
        "kernel_us": "max over ranks of the fused kernel alone (events on its stream; on the "
        "CPU test backend host clocks around each launch)",
        "tflops": "useful FLOPs (6 H I per routed row, no padding) per GPU / median time_us",
        "tflops_kernel": "the same FLOPs / median kernel_us",
        "paired": "the configuration's arms were timed together: round i ran every arm "
        "once (order alternating), sample i of every arm is from round i",
        "lead_rows": "interleaved: the minimum Linear-1 row lead its tile list was built "
        "with; lead_rows_requested: the config's value (an integer or 'auto', lead.py)",
        "launch": "how the timed layer was enqueued (the raw config's kernel.launch)",
        "host_enqueue_us": "median host time to enqueue one timed call (megamoe.host_lead: "
        "the GPU sleeps meanwhile, so time_us is GPU time, every variant alike)",
        "gpu_waited_for_host": "timed calls (of host_lead_calls, warm-up included) whose "
        "start event had passed before the host finished enqueueing: the GPU may have "
        "waited for the host inside time_us",
    }
    per_path = {
        storepath.PEER: {
            "time_us": f"{around}every rank's fused kernel, the cross-GPU "
            f"barrier and every home rank's top-k weighted reduction, by {combine} "
            f"(`combine`; {excluded})",
            "remote_fraction": "share of the combine rows that cross NVLink: absent at "
            "natural routing (about (P-1)/P), else rows re-homed (routing.py)",
            "remote_bytes": "bf16 output bytes the combine epilogues store into peers, all "
            "ranks (= nvlink_bytes)",
            "nvlink_bytes": "bf16 output bytes the combine epilogues store into peers, all ranks",
        },
        storepath.HOST: {
            "time_us": f"{around}every rank's fused kernel, the cross-GPU "
            f"barrier and every home rank's top-k weighted reduction, by {combine} (`combine`), "
            "over its whole device combine buffer (a fixed cost at every f); the host-homed "
            f"tokens' reduction belongs to the far end and is not timed ({excluded})",
            "remote_fraction": "the host share f (host_share)",
            "remote_bytes": "bf16 output bytes the combine epilogues store into host "
            "memory, all ranks (= host_bytes)",
            "host_bytes": "bf16 output bytes the combine epilogues store into host memory, "
            "all ranks",
            "nvlink_bytes": "bf16 output bytes still stored into peers (GPU-homed tokens "
            "whose expert is on another rank; 0 on one GPU)",
            "check": "GPU-homed tokens from the GPU's output; host-homed tokens reduced "
            "(untimed, the check only) from their rows in host memory; host rows left "
            "unwritten fail the point",
        },
    }
    return {path: {**per_path[path], **common} for path in paths}


def launch_description(device_type: str) -> str:
    """How the timed layer is enqueued (layer/graphs.py)."""
    if device_type != "cuda":
        return f"{graphs.EAGER}: every launch from Python, rank after rank"
    return (
        f"{graphs.CUDA_GRAPH}: per rank, the sync buffer's zero with the fused kernel, and "
        "the combine, each captured once per tile list (after one eager run) and replayed"
    )


def raw_config(
    config: dict,
    moe: dict,
    world_size: int,
    check_tokens: int,
    device_type: str = "cuda",
    *,
    paths: Sequence[str] = (storepath.PEER,),
    leads: LeadChooser | None = None,
) -> dict:
    from xstage_bench.megamoe.layer import reduction
    from xstage_kernels import megamoe as kernel

    combine = reduction.default_reduction(device_type)
    raw = {
        "megamoe": moe,
        "timing": config["timing"],
        "world_size": world_size,
        "store_paths": list(paths),
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
            "launch": launch_description(device_type),
        },
        "check": {
            "tokens_per_rank": check_tokens,
            "tolerance_rel_l2": reference.tolerance(device_type),
        },
        "combine": reduction.describe(combine),
        "definitions": definitions(paths, combine, layer_from(moe)),
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
                # each GEMM path's bound, where the check reads it (unfused.tolerance)
                "tolerance_rel_l2": {
                    gemm: unfused.tolerance(gemm, reference.tolerance(device_type))
                    for gemm in unfused.GEMMS
                },
                "tolerance_why": "fp8_grouped_rowwise requantizes weights, activations and "
                "the intermediate per row (three e4m3 roundings against the block-format "
                "reference: about 6%), so it is held to its own bound; its grouped GEMM's "
                "product is checked first at 1%",
            },
            "deepgemm": {
                "source": "deep_gemm.fp8_mega_moe, SM90: the fork AichenF/DeepGEMM "
                "megamoe_sm90_fp8_dev built by envs/deepgemm-sm90.sh (XSTAGE_DEEPGEMM_SITE), "
                "or sgl-deep-gemm (PyPI); src/xstage_bench/megamoe/baselines/deepgemm.py",
                "processes": "one torch.distributed (NCCL) process per GPU, symmetric memory",
                "schedule": "chosen by DeepGEMM's host heuristics, read from its printed "
                "MegaMoESM90Config (l2_lag_units > 0: L2-lag = interleaved, 0: wave; the fork "
                "runs Linear-1 and Linear-2 as two launches: recorded expert_wave)",
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
    if storepath.HOST in paths:
        raw["host_share"] = HOST_SHARE_RULE
    if leads is not None and leads.model_file is not None:
        raw["lead_auto"] = leads.describe()
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


def drop_unpaired(out: str | Path, sets: dict[str, list[dict]]) -> int:
    """Before a sweep resumes from its partial file: drop the records of every set of arms
    that the interrupted run recorded only in part, so that the set is measured again as a
    whole (arms are never paired across runs). Returns how many records were dropped."""
    partial = partial_path(Path(out))
    if not partial.exists():
        return 0
    doc = json.loads(partial.read_text())
    have = {r["id"] for r in doc.get("records", [])}
    drop: set[str] = set()
    for arms in sets.values():
        ids = {a["id"] for a in arms}
        if len(ids) > 1 and ids & have and not ids <= have:
            drop |= ids & have
    if drop:
        doc["records"] = [r for r in doc["records"] if r["id"] not in drop]
        atomic_write_text(partial, json.dumps(doc, indent=1) + "\n")
        _log.info(
            "[megamoe] %d record(s) of sets of arms measured in part dropped from %s: "
            "each set is measured again whole",
            len(drop),
            partial,
        )
    return len(drop)


def measured_paths(config: dict, world_size: int) -> list[str]:
    """The store paths this run measures: config["store_paths"] ("auto" resolved)."""
    return storepath.resolve(config.get("store_paths", storepath.AUTO), world_size)


def sweep_points(
    moe: dict, world_size: int, paths: Sequence[str], leads: LeadChooser
) -> tuple[list[dict], list[dict]]:
    """(the grid's configurations, every point of the sweep) for these paths."""
    configs = grid.megamoe_points(moe, world_size, paths)
    sweep = lead_sweep_configs(moe, world_size, paths)
    return configs, expand_points(configs, moe, leads, sweep)


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
    model_file: str | Path | None = None,
) -> None:
    """Measure every (configuration, variant, arm) on every store path and write
    raw/megamoe.json (`out`); with `trace_out`, the instrumented runs of the traced
    configurations too (ours only). `baseline_budget_s` bounds the wall time DeepGEMM may
    take in all, and FlashInfer's likewise (points past it are recorded failed, "not
    run"). `model_file`: the dataset's model/burst_gap.json, for leads that are 'auto'.
    device_type="cpu": every rank on the CPU under the Triton interpreter, our kernel
    only (CI's test of the rule; the traces are unsupported)."""
    from xstage_bench.megamoe.layer.problem import enable_peer_access

    moe = megamoe or config["megamoe"]
    devices = default_devices(config, world_size, device_type)
    paths = measured_paths(config, len(devices))
    if device_type == "cpu":  # (TRITON_INTERPRET=1 must be set before triton loads)
        moe = {**moe, "variants": ["ours"]}
    elif len(devices) > 1:
        enable_peer_access(devices)
    policy = megamoe_policy(config, moe)
    leads = LeadChooser.of(moe, model_file)
    configs, points = sweep_points(moe, len(devices), paths, leads)
    sets = arm_sets(points)
    measurer = MoEMeasurer(
        moe,
        policy,
        devices,
        check_tokens=check_tokens,
        baseline_budget_s=baseline_budget_s,
        arm_sets=sets,
    )
    env = capture_measured(device_type)
    traced = trace_points(configs, megamoe=moe, leads=leads) if trace_out is not None else []
    cfg = raw_config(config, moe, len(devices), check_tokens, device_type, paths=paths, leads=leads)
    drop_unpaired(out, sets)
    try:
        doc = run_sweep(
            points,
            measurer,
            Path(out),
            experiment="megamoe",
            backend="cuda",
            dataset=dataset,
            environment=env,
            config=cfg,
            point_timeout_s=POINT_TIMEOUT_S,
            refresh=first_refresh(kernel_refresh, lead_map_refresh),
        )
    finally:
        measurer.close()
    if trace_out is None:
        return
    first = trace_first_configs(traced)
    with kept_until_done(Path(out), doc):
        run_sweep(
            traced,
            lambda p: measurer.trace(p, keep_timeline=config_id(p) in first),
            Path(trace_out),
            experiment="megamoe_trace",
            backend="cuda",
            dataset=dataset,
            environment=capture_measured(device_type),
            config=cfg,
            point_timeout_s=POINT_TIMEOUT_S,
            refresh=first_refresh(kernel_refresh, lead_map_refresh),
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
    parser.add_argument(
        "--model", type=Path, help="the dataset's model/burst_gap.json (for lead_rows 'auto')"
    )
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
        model_file=args.model,
    )
    print_summary(args.out, args.trace_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
