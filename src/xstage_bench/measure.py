"""`python -m xstage_bench.measure`: the one entry point of every measuring rule.

    python -m xstage_bench.measure attention --dataset h200x2 --config-json '{...}' \
        --out results/h200x2/raw/attention.json --log results/h200x2/logs/attention.log

The rules call this module instead of running a Snakemake `script:`, because the
experiments that start one process per GPU spawn their workers, and a spawned child
re-imports its parent's `__main__`: a generated rule script there dies without the
`snakemake` object it expects. Started with `-m`, the parent's `__main__` is this module,
which a child imports harmlessly.

Around the work it does what every measuring job does: tee stdout and stderr into the
rule's log, and hold the per-GPU locks (gpulock) so that another harness run cannot
measure on the same GPUs meanwhile. `--device cpu` runs the same code on gloo and the
Triton interpreter (CI's test of the rules; what it writes is labelled, never a
measurement).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

from xstage_bench.measurement.clocks import nvml_targets, visible_entries

EXPERIMENTS = ("microbench", "megamoe", "megamoe_per_gpu", "megamoe_emulated", "attention")


def experiment_config(config: dict, experiment: str) -> dict:
    """The part of a validated config that an experiment's measurement reads: a change
    anywhere else must not make Snakemake rerun it (the rules pass this as a param)."""
    section = {"megamoe_per_gpu": "megamoe", "megamoe_emulated": "megamoe"}.get(
        experiment, experiment
    )
    keys = ("world_size", "gpu_ids", "store_paths", "timing", section)
    return {k: config[k] for k in keys if k in config}


@functools.cache
def kernel_stamp(experiment: str) -> str:
    """What names the build of our kernels an experiment's raw config records (its launch
    options, stages, packing): a measuring rule's param, so that a kernel change reruns the
    job where Snakemake ran it before, and the sweep then measures again only the points
    whose kernel changed (its refresh rule). Empty where triton cannot be imported (nothing
    of ours runs there) and for experiments that name no build of ours."""
    try:
        if experiment in ("megamoe", "megamoe_per_gpu"):
            from xstage_bench.megamoe.runner import kernels_that_ran
            from xstage_kernels import megamoe

            named = kernels_that_ran(megamoe, "cuda")
        elif experiment == "attention":
            from xstage_bench.attention.raw_config import kernels_that_ran

            named = kernels_that_ran("cuda")
        else:
            return ""
    except ImportError:
        return ""
    return json.dumps(named, sort_keys=True)


def _run(experiment: str, config: dict, args: argparse.Namespace, gpu_ids: list[int]) -> None:
    world = len(gpu_ids)
    device = args.device
    if experiment == "microbench":
        from xstage_bench.microbench.runner import run_study

        run_study(
            config,
            args.study,
            args.dataset,
            args.out,
            args.cubin,
            gpu_ids=gpu_ids,
            device_type=device,
        )
    elif experiment == "megamoe":
        from xstage_bench.megamoe.runner import run_megamoe

        run_megamoe(
            config,
            args.dataset,
            args.out,
            args.trace_out,
            world,
            device_type=device,
            model_file=args.model,
        )
    elif experiment == "megamoe_per_gpu":
        from xstage_bench.megamoe.distributed import run_per_gpu

        run_per_gpu(
            config, args.dataset, args.out, world, device_type=device, model_file=args.model
        )
    elif experiment == "megamoe_emulated":
        from xstage_bench.megamoe.emulated import run_emulated

        run_emulated(
            config, args.dataset, args.out, world, device_type=device, model_file=args.model
        )
    else:
        from xstage_bench.attention.runner import run_attention

        run_attention(config, args.dataset, args.out, world_size=world, device_type=device)


def visible_devices(gpu_ids: list[int], visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for a job on gpu_ids, CUDA's numbers under `visible` (the
    variable as the job found it: a scheduler may have set it). The job then sees exactly
    its GPUs, as 0..n-1: every experiment measures on the GPUs the config names, not on the
    first n."""
    entries = visible_entries(visible)
    if entries is None:
        return ",".join(map(str, gpu_ids))
    beyond = [g for g in gpu_ids if g >= len(entries)]
    if beyond:
        raise ValueError(
            f"config key 'gpu_ids': GPU {beyond[0]} does not exist here: "
            f"CUDA_VISIBLE_DEVICES={visible!r} shows {len(entries)} GPU(s)"
        )
    return ",".join(entries[g] for g in gpu_ids)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m xstage_bench.measure", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("experiment", choices=EXPERIMENTS)
    ap.add_argument("--config-json", required=True, help="the experiment's config, as JSON")
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--out", required=True, help="raw JSON to write (resumes its .partial.json)")
    ap.add_argument("--trace-out", help="megamoe: the traced runs' raw JSON")
    ap.add_argument("--study", help="microbench: a key of microbench.studies")
    ap.add_argument("--cubin", help="microbench: the built burst.cubin")
    ap.add_argument(
        "--model",
        help="megamoe*: the dataset's fitted model/burst_gap.json, for a lead_rows of 'auto'",
    )
    ap.add_argument("--log", help="also write stdout and stderr here")
    ap.add_argument("--gpu-ids", default="0,1", help="comma-separated GPU ids (default 0,1)")
    ap.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: gloo and the Triton interpreter; a test of the harness, not a measurement",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    from xstage_bench.run.joblog import measuring_job

    args = build_parser().parse_args(argv)
    try:
        config = json.loads(args.config_json)
        gpu_ids = [int(g) for g in args.gpu_ids.split(",") if g]
    except ValueError as e:
        print(f"xstage measure: bad --config-json or --gpu-ids: {e}", file=sys.stderr)
        return 2
    if args.experiment == "microbench" and not args.study:
        print("xstage measure: microbench needs --study", file=sys.stderr)
        return 2
    if args.experiment == "megamoe" and not args.trace_out:
        print("xstage measure: megamoe needs --trace-out", file=sys.stderr)
        return 2
    job_gpus = list(range(len(gpu_ids)))  # the job's GPUs as it sees them: 0..n-1
    locked = gpu_ids  # a CPU test takes no lock
    if args.device == "cpu":
        # Triton reads this when it first decorates a kernel: before any experiment loads.
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        # Before anything initializes CUDA in this process or its workers.
        try:
            visible = visible_devices(gpu_ids, os.environ.get("CUDA_VISIBLE_DEVICES"))
        except ValueError as e:
            print(f"xstage measure: {e}", file=sys.stderr)
            return 2
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
        # Locked by the machine's numbers (or UUIDs): under a scheduler's own
        # CUDA_VISIBLE_DEVICES, gpu_ids number only the GPUs it left, and two runs given
        # different shares of one node would otherwise lock "GPU 0" for different GPUs.
        locked = nvml_targets(job_gpus)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with measuring_job(args.log, locked, lock=args.device == "cuda"):
        _run(args.experiment, config, args, job_gpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
