"""The fused MoE kernel with one process per GPU (torch.distributed): the same kernel,
schedules, inputs, checks and record ids as the single-process path (runner.py), so the two
can be compared point by point (`xstage compare`).

    python -m xstage_bench.megamoe.distributed --config config.yaml --dataset h200x2 \
        --out results/h200x2/raw/megamoe_per_gpu.json [--shapes ...] [--world-size 2]

This module is the process model's entry: the command, the DAG's `run_per_gpu`, the
per-GPU grid and raw config, and the spawned worker; what each rank builds and how it
checks and times a point are per_gpu_rank.py's (`MoERank`).

Only our kernel's schedules run here, on the peer path (its combine buffers are a peer
window; host-homed rows would need host memory mapped in every process); the baselines,
the traced runs, the host path, the lead map and the paired rounds stay in the
single-process path.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from xstage_bench.data import grid, storepath
from xstage_bench.measurement import timing
from xstage_bench.measurement.workers import groups, launcher
from xstage_bench.measurement.workers.drive import drive
from xstage_bench.megamoe import reference
from xstage_bench.megamoe.layer.per_gpu_rank import MoERank
from xstage_bench.megamoe.options import add_grid_arguments, selected_grid
from xstage_bench.megamoe.ours.lead import LeadChooser
from xstage_bench.megamoe.points import CHECK_TOKENS, POINT_TIMEOUT_S, expand_schedules, select
from xstage_bench.megamoe.runner import kernel_refresh, raw_config

# ---- processes ------------------------------------------------------------------------


def _worker(rank: int, job: dict) -> None:
    """One process per GPU (spawned): join the groups, then drive (rank 0) or follow."""
    fabric = groups.join(rank, job)
    state = MoERank(
        fabric,
        timing.TimingPolicy.from_config(job["config"]["timing"]),
        job["megamoe"],
        check_tokens=job["check_tokens"],
        tolerance=job["tolerance"],
        dump_dir=job["dump_dir"],
    )
    try:
        if rank == 0:
            moe = job["megamoe"]
            leads = LeadChooser.of(moe, job.get("model_file"))
            points = expand_schedules(
                grid.megamoe_points(moe, job["world_size"]), moe["schedules"], moe, leads
            )
            drive(
                state,
                job,
                points,
                experiment="megamoe",
                config=job["raw_config"],
                refresh=kernel_refresh,
            )
        else:
            state.follow(state.execute)
    finally:
        if not state.broken:
            state.release()
        groups.leave(fabric)
    groups.exit_cleanly()


def per_gpu_config(
    config: dict, moe: dict, world_size: int, check_tokens: int, device_type: str = "cuda"
) -> dict:
    """The config a per-GPU raw file records: runner.py's (peer path only), with this
    process model's definitions."""
    moe = {**moe, "variants": ["ours"]}
    cfg = raw_config(config, moe, world_size, check_tokens, device_type, paths=[storepath.PEER])
    cfg["processes"] = "one per GPU (torch.distributed); src/xstage_bench/megamoe/distributed.py"
    peer = cfg["definitions"][storepath.PEER]
    peer["time_us"] = (
        "slowest rank's events from after a cross-rank device barrier to after its top-k "
        "weighted reduction: its fused kernel, a device barrier (system-scope fence) and the "
        "reduction (dispatch excluded, done once through all_to_all)"
    )
    peer["kernel_us"] = "max over ranks of the fused kernel alone"
    del peer["paired"]  # one schedule at a time here
    return cfg


def launch(
    config: dict,
    dataset: str,
    out: str | Path,
    *,
    world_size: int,
    megamoe: dict | None = None,
    device_type: str = "cuda",
    check_tokens: int = CHECK_TOKENS,
    tolerance: float | None = None,
    dump_dir: str | Path | None = None,
    point_timeout_s: float = POINT_TIMEOUT_S,
    wait_timeout_s: float = 60.0,
    max_restarts: int = 5,
    model_file: str | Path | None = None,
) -> None:
    """Measure our kernel's schedules over `megamoe` (default: the config's) on
    `world_size` ranks into `out`. `device_type="cpu"`: gloo and the interpreter (tests).
    `dump_dir`: every rank saves its checked output of every point there (torch.save),
    to compare the process models' outputs bitwise. `tolerance` defaults to the device
    type's (reference.tolerance)."""
    moe = megamoe or config["megamoe"]
    if dump_dir is not None:
        Path(dump_dir).mkdir(parents=True, exist_ok=True)
    job = {
        "config": config,
        "megamoe": moe,
        "dataset": dataset,
        "world_size": world_size,
        "check_tokens": check_tokens,
        "tolerance": reference.tolerance(device_type) if tolerance is None else tolerance,
        "dump_dir": None if dump_dir is None else str(dump_dir),
        "point_timeout_s": point_timeout_s,
        "raw_config": per_gpu_config(config, moe, world_size, check_tokens, device_type),
        "model_file": None if model_file is None else str(model_file),
    }
    launcher.launch(
        _worker,
        job,
        out,
        tag="megamoe",
        device_type=device_type,
        wait_timeout_s=wait_timeout_s,
        max_restarts=max_restarts,
    )


def run_per_gpu(
    config: dict,
    dataset: str,
    out: str | Path,
    world_size: int,
    device_type: str = "cuda",
    model_file: str | Path | None = None,
) -> None:
    """The DAG's entry: the config's MegaMoE grid, our schedules, one process per GPU (the
    job's GPUs, those measure.py left visible; or, with device_type="cpu", gloo and the
    Triton interpreter: CI's test of the rule); `model_file` for a lead_rows of 'auto'.
    Where this run does not measure the peer path (one GPU, or GPUs without peer access:
    the workflow's resolved `store_paths`), every point is recorded unsupported."""
    if world_size < 2:
        record_unsupported(config, dataset, out, device_type, model_file, 1, ONE_GPU)
        return
    paths = config.get("store_paths", storepath.AUTO)
    if storepath.PEER not in storepath.resolve(paths, world_size):
        reason = NO_PEER_PATH.format(paths=paths)
        record_unsupported(config, dataset, out, device_type, model_file, world_size, reason)
        return
    launch(
        config,
        dataset,
        out,
        world_size=world_size,
        megamoe=per_gpu_grid(config["megamoe"]),
        device_type=device_type,
        model_file=model_file,
    )


ONE_GPU = (
    "one process per GPU is compared with one process for every GPU; on one GPU the two "
    "are the same process model, so there is nothing to compare (it measures the peer path, "
    "which needs 2 GPUs)"
)


NO_PEER_PATH = (
    "one process per GPU stores the combine rows into a peer window (the peer path), which "
    "this run does not measure (store_paths {paths}: its GPUs lack peer access, or the "
    "config leaves the path out)"
)


def record_unsupported(
    config: dict,
    dataset: str,
    out: str | Path,
    device_type: str,
    model_file,
    world_size: int,
    reason: str,
) -> None:
    """The per-GPU grid written with every point unsupported, saying why, so that a run
    that cannot measure it (one GPU, no peer path) finishes and says so."""
    from xstage_bench.data.results import failed_record
    from xstage_bench.measurement.environment import capture_measured
    from xstage_bench.measurement.sweep import run_sweep

    moe = per_gpu_grid(config["megamoe"])
    leads = LeadChooser.of(moe, model_file)
    points = expand_schedules(grid.megamoe_points(moe, world_size), moe["schedules"], moe, leads)
    run_sweep(
        points,
        lambda p: failed_record(p["id"], p, reason, status="unsupported"),
        Path(out),
        experiment="megamoe",
        backend="cuda",
        dataset=dataset,
        environment=capture_measured(device_type),
        config=per_gpu_config(config, moe, world_size, CHECK_TOKENS, device_type),
    )


def per_gpu_grid(megamoe: dict) -> dict:
    """The megamoe config restricted as `megamoe.per_gpu` says (the whole grid without it)."""
    only = megamoe.get("per_gpu") or {}
    moe = select(
        megamoe,
        only.get("shapes"),
        only.get("precisions"),
        only.get("routings"),
        only.get("tokens_per_rank"),
    )
    if "remote_fractions" in only:
        moe["remote_fractions"] = list(only["remote_fractions"])
    return moe


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m xstage_bench.megamoe.distributed", description=__doc__.split("\n\n")[0]
    )
    add_grid_arguments(parser)
    parser.add_argument("--out", required=True, type=Path, help="raw JSON to write")
    parser.add_argument("--world-size", type=int, help="GPUs (default: every visible GPU)")
    parser.add_argument("--dump-outputs", type=Path, help="save every rank's checked outputs here")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: the Triton interpreter on gloo; a test, not a measurement",
    )
    args = parser.parse_args(argv)
    try:
        config, moe = selected_grid(args)
    except ValueError as e:  # a bad config file or grid option, named
        parser.error(str(e))
    world = args.world_size
    if world is None:
        import torch

        world = torch.cuda.device_count() if args.device == "cuda" else 2
    launch(
        config,
        args.dataset,
        args.out,
        world_size=world,
        megamoe=moe,
        device_type=args.device,
        check_tokens=args.check_tokens,
        dump_dir=args.dump_outputs,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
