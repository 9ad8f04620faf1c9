"""Run the Ulysses attention sweep: one process per GPU, rank 0 drives, rank 0 writes.

    python -m xstage_bench.attention.runner --config config.yaml --out raw/attention.json \
        [--backends triton,fa3] [--seq-lens 8192,32768] [--heads 24]

The parent spawns one worker per GPU (torch.multiprocessing; one GPU is a world of one).
Each joins an NCCL group (the serial path's all_to_all_single) and a gloo group (control).
Rank 0 runs `sweep.run_sweep` over the points of every measured store path
(`config["store_paths"]`, storepath.resolve): the peer path (a P-GPU node, or two GPUs
emulating one) and the host path (GPU 0 plays rank 0 of a P-GPU node, host memory the
other owners: attention/host.py; on a machine with more GPUs the others idle meanwhile).

The points of one setting and shape (path, P, heads, S) are measured together
(points.py orders and groups them; rank.py is each worker's part), through
workers.drive's groups: every backend and mode of it is checked on fresh inputs first,
then all that passed are timed in paired rounds (timing.measure_paired: round i runs
every arm once, order alternating), rank 0 broadcasting each repetition's arm so every
rank runs exactly the repetitions rank 0's stopping rule asks for. Each record keeps its
arm's samples (sample i from round i) and `extra.paired` (the arms, the order, a group
token that is the same for the records of one timing and unique to it). Only rank 0
builds records and writes the raw file.

Failures stay bounded: a backend that cannot be imported is recorded "unsupported"; a
wrong result "wrong" (and is not timed); GPU waits and the device barrier time out into a
failed record; a hung or dead worker ends the attempt, the point it was on is recorded
(by the sweep watchdog, or here from the marker file), and the sweep resumes in fresh
processes.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

from xstage_bench.attention.points import measured_paths, ordered_points, pairing_group
from xstage_bench.attention.rank import Rank
from xstage_bench.attention.raw_config import kernel_refresh, raw_config
from xstage_bench.measurement import timing
from xstage_bench.measurement.workers import groups, launcher
from xstage_bench.measurement.workers.drive import drive

DTYPE = "bfloat16"
CPU_TRITON_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16}  # small tiles: the interpreter is slow


def sweep_config(
    config: dict,
    backends=None,
    seq_lens=None,
    heads=None,
    timing_overrides: dict | None = None,
    modes=None,
) -> dict:
    """The config this run records: `config` with the command line's reductions applied.

    The order of `modes` is the order they run in for each shape (the GPUs drift with
    power and heat, so a rerun in another order shows whether order biases the result).
    """
    cfg = copy.deepcopy(config)
    att = cfg["attention"]
    for key, value in (
        ("backends", backends),
        ("seq_lens", seq_lens),
        ("heads", heads),
        ("modes", modes),
    ):
        if value:
            att[key] = list(value)
    if timing_overrides:
        unknown = sorted(set(timing_overrides) - set(cfg["timing"]))
        if unknown:
            raise ValueError(f"unknown timing key '{unknown[0]}'; known: {sorted(cfg['timing'])}")
        cfg["timing"].update(timing_overrides)
    attention_policy(cfg)  # fail here, not in a worker
    return cfg


def attention_policy(config: dict) -> timing.TimingPolicy:
    """The timing block's policy with the attention section's host_lead (timed_rep)."""
    policy = timing.TimingPolicy.from_config(config["timing"])
    return dataclasses.replace(policy, host_lead=bool(config["attention"].get("host_lead")))


def _worker(rank: int, job: dict) -> None:
    """One process per GPU (spawned): join the groups, then drive (rank 0) or follow."""
    import torch

    fabric = groups.join(rank, job)
    state = Rank(
        fabric,
        attention_policy(job["config"]),
        getattr(torch, job["dtype"]),
        job["triton_config"],
    )
    try:
        if rank == 0:
            points = ordered_points(job["config"]["attention"], job["world_size"], job["paths"])
            drive(
                state,
                job,
                points,
                experiment="attention",
                config=job["raw_config"],
                refresh=kernel_refresh,
                group_of=pairing_group,
            )
        else:
            state.follow(state.execute)
    finally:
        if not state.broken and (state.workspace, state.host_workspace) != (None, None):
            fabric.wait()
        groups.leave(fabric, state.close)
    groups.exit_cleanly()


def launch(
    config: dict,
    dataset: str,
    out: str | Path,
    *,
    world_size: int,
    device_type: str = "cuda",
    triton_config: dict | None = None,
    point_timeout_s: float = 600.0,
    wait_timeout_s: float = 60.0,
    max_restarts: int = 5,
) -> None:
    """Run the sweep described by `config["attention"]` over `world_size` ranks into `out`.

    `device_type="cpu"` runs the same code on gloo and the Triton interpreter (tests only).
    `point_timeout_s` bounds one arm: the sweep's watchdog allows it once per arm of the
    largest pairing group.
    """
    paths = measured_paths(config, world_size)
    points = ordered_points(config["attention"], world_size, paths)  # bad config: fail here
    arms = max(Counter(pairing_group(p) for p in points).values(), default=1)
    job = {
        "config": config,
        "raw_config": raw_config(config, device_type, paths),
        "paths": paths,
        "dataset": dataset,
        "world_size": world_size,
        "dtype": DTYPE if device_type == "cuda" else "float16",
        "triton_config": triton_config,
        # the sweep's watchdog bounds each point it asks for: the first point of a group
        # carries every arm's check and their paired rounds
        "point_timeout_s": point_timeout_s * arms,
    }
    launcher.launch(
        _worker,
        job,
        out,
        tag="attention",
        device_type=device_type,
        wait_timeout_s=wait_timeout_s,
        max_restarts=max_restarts,
    )


def _world_size(config: dict, world_size: int | None) -> int:
    if world_size:
        return world_size
    if config.get("gpu_ids"):
        return len(config["gpu_ids"])
    if isinstance(config["world_size"], int):
        return config["world_size"]
    import torch

    return torch.cuda.device_count()


def run_attention(
    config: dict,
    dataset: str,
    out: str,
    world_size: int | None = None,
    device_type: str = "cuda",
) -> None:
    """The DAG's entry: the config's full attention sweep on the job's GPUs, those that
    measure.py left visible (or, with device_type="cpu", on gloo and the Triton
    interpreter: CI's test of the rule)."""
    launch(
        config,
        dataset,
        out,
        world_size=_world_size(config, world_size),
        device_type=device_type,
        triton_config=None if device_type == "cuda" else CPU_TRITON_CONFIG,
    )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _key_values(text: str) -> dict:
    pairs = dict(item.split("=", 1) for item in text.split(",") if item)
    return {k: json.loads(v) for k, v in pairs.items()}


def main(argv: list[str] | None = None) -> int:
    from xstage_bench.data.config import load_config

    ap = argparse.ArgumentParser(
        prog="python -m xstage_bench.attention.runner", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True, help="raw JSON to write (resumes its .partial.json)")
    ap.add_argument("--dataset", help="dataset name recorded in the file (default: from the GPUs)")
    ap.add_argument("--world-size", type=int)
    ap.add_argument("--backends", type=lambda s: s.split(","), help="e.g. triton,fa3")
    ap.add_argument("--seq-lens", type=_ints, help="e.g. 8192,32768")
    ap.add_argument("--heads", type=_ints, help="e.g. 24,40")
    ap.add_argument(
        "--modes", type=lambda s: s.split(","), help="e.g. fused,serial,alone (run order)"
    )
    ap.add_argument(
        "--timing",
        type=_key_values,
        default={},
        help="override timing keys, e.g. min_reps=5,budget_s=0.5",
    )
    ap.add_argument(
        "--triton-config",
        type=_key_values,
        default=None,
        help="e.g. BLOCK_M=128,BLOCK_N=64,num_warps=8,num_stages=3",
    )
    ap.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: the Triton interpreter on gloo; a test, not a measurement",
    )
    args = ap.parse_args(argv)
    config = sweep_config(
        load_config(args.config), args.backends, args.seq_lens, args.heads, args.timing, args.modes
    )
    dataset = args.dataset
    if dataset is None:
        from xstage_bench.measurement.machine import dataset_name, probe_gpus

        dataset = dataset_name(probe_gpus().names) if args.device == "cuda" else "cpu-test"
    world = args.world_size or (_world_size(config, None) if args.device == "cuda" else 2)
    launch(
        config,
        dataset,
        args.out,
        world_size=world,
        device_type=args.device,
        triton_config=args.triton_config,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
