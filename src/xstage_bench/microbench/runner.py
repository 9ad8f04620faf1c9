"""Measure one microbenchmark study on this machine's GPUs and write its raw file.

    python -m xstage_bench.microbench.runner --config config.yaml --study gap_sweep \
        --out results/h200x2/raw/microbench/gap_sweep.json --cubin build/kernels/sm_90/burst.cubin

Every point is checked before it is timed: its destinations are poisoned, one launch runs
with a known pattern, and every byte it should write is compared on the host (a point that
fails is recorded "wrong", not timed). The store paths of the run (config `store_paths`,
resolved for its GPUs) decide the points: a study's `dest: remote` is one point per path,
`peer` (another GPU) and `host` (pinned host memory over the host link); one GPU measures
the host path and its local control. The drain probe's receiver is a kernel on the peer
GPU, so host-path probes are recorded unsupported with that reason.

After the check, `microbench.launches` launches are stamped in the kernel; steady bursts of
all launches are pooled, warm-up bursts reported apart. The ceilings are timed with CUDA
events through the timing module. Every point goes through protocol.measure_point (clocks,
check, timing, record); the sweep is resumable (sweep.run_sweep).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from xstage_bench.data import grid, storepath
from xstage_bench.data.config import load_config
from xstage_bench.data.results import failed_record
from xstage_bench.measurement import faults, log, timing
from xstage_bench.measurement.clocks import ClockSampler
from xstage_bench.measurement.environment import capture_measured
from xstage_bench.measurement.protocol import Measured, PointFailed, measure_point
from xstage_bench.measurement.sweep import run_sweep
from xstage_bench.microbench import gap_calibration, launch, planning, stamp_metrics
from xstage_bench.microbench.bench import BurstBench
from xstage_bench.microbench.errors import MicrobenchError, PointUnsupported, WrongResult

CHECK_TAG = 0x5EED  # pattern tag of the checked launch; timed launch L uses (L + 1) << 20
# Every in-kernel wait is bounded, so the watchdog is only a last resort.
POINT_TIMEOUT_S = float(os.environ.get("XSTAGE_POINT_TIMEOUT_S", 120.0))
# Per-CTA stamps of one launch are kept for these (study, gap) points only: enough to show
# how producers drift apart, small enough to keep the raw files light.
STAMPED_GAPS_US = {"gap_sweep": (0.0, 10.0), "gap_sweep_barrier": (0.0, 10.0)}
DESTINATION = {
    storepath.PEER: "the peer GPU's memory (CuPy buffer, peer access enabled)",
    storepath.HOST: (
        "pinned, mapped host memory (cudaHostAlloc portable|mapped, hostmem.PinnedHostBuffer), "
        "one buffer per destination index; the kernels store to its host pointer (UVA); "
        "poisoned and read back on the host"
    ),
    storepath.LOCAL: "the sender's own memory (CuPy buffer): the local control",
}
HOST_PROBE_UNSUPPORTED = (
    "the drain probe's receiver is a kernel on the peer GPU that acknowledges each burst; "
    "host memory has no such receiver here (a CPU thread polling from Python would time its "
    "own scheduling), so the host path's X-Stage is read from the isolated bursts instead"
)
HEADLINE = {  # the metric printed in a point's progress line
    "periodic": (
        "period_us",
        "issue_rate_GBps",
        "t_iss_slowest_us",
        "t_vis_slowest_us",
        "t_iss_window_us",
    ),
    "isolated": ("t_iss_slowest_us", "t_iss_window_us"),
    "drain_probe": ("visible_us", "fence_us", "t_iss_slowest_us"),
    "ceiling": ("bandwidth_GBps",),
}

NO_SAMPLES = defaultdict(
    lambda: "no launch gave a sample",
    issue_rate_GBps="no launch had a window where every producer was in its steady bursts "
    "(stamp_metrics.issue_rate_GBps)",
)

_log = log.get(__name__)


class PointMeasurer:
    """`measure(point) -> record` for sweep.run_sweep, for every microbenchmark kind."""

    def __init__(self, bench: BurstBench, microbench: dict, policy: timing.TimingPolicy):
        self.bench = bench
        self.mb = microbench
        self.policy = policy
        self.world_size = len(bench.gpu_ids)
        self.sampler = ClockSampler(bench.gpu_ids)

    def __call__(self, point: dict) -> dict:
        check, timed = {
            "periodic": (self._check_train, self._time_train),
            "isolated": (self._check_train, self._time_train),
            "drain_probe": (self._check_probe, self._time_probe),
            "ceiling": (self._check_ceiling, self._time_ceiling),
        }[point["kind"]]
        faults.apply_before_measure(point["id"])
        return measure_point(
            point,
            lambda: _failing(check, point),
            lambda run: self._measured(point, _failing(timed, point, run)),
            sampler=self.sampler,
        )

    @staticmethod
    def _measured(point: dict, timed: tuple[dict, dict]) -> Measured:
        samples, extra = timed
        # A metric no launch could give (issue_rate_GBps without a steady window) is left
        # out and said so, never recorded as an empty sample list.
        empty = sorted(name for name, values in samples.items() if not values)
        if empty:
            samples = {name: values for name, values in samples.items() if values}
            extra = {**extra, "metrics_without_samples": {name: NO_SAMPLES[name] for name in empty}}
        heads = [m for m in HEADLINE[point["kind"]] if samples.get(m)]
        line = "  " + "  ".join(f"{m}={np.median(samples[m]):.3f}" for m in heads)
        return Measured(samples, extra, correct=True, line=line)

    # Each kind: a check (plan, then one launch with a known pattern, every byte compared)
    # that returns what its timing needs, and the timing -> (samples, extra).

    def _check_train(self, point: dict) -> dict:
        bench = self.bench
        plan = planning.plan_train(
            point,
            bursts=self.mb["bursts"],
            warmup_bursts=self.mb["warmup_bursts"],
            world_size=self.world_size,
            buffer_bytes=bench.buffer_bytes,
        )
        limit = bench.require_coresident(
            "burst_train", plan.K, launch.STAMP_ROWS * plan.n_bursts * 8
        )
        extra = {
            "plan": plan.as_dict(),
            "threads": bench.threads,
            "launches": self.mb["launches"],
            "max_coresident_ctas": limit,
        }
        gap_iters = 0
        if plan.gap_mode == "compute" and plan.gap_us > 0:
            calibration = bench.gap_calibration(plan.K)
            gap_iters = gap_calibration.gap_iterations(calibration, plan.gap_us)
            extra.update(gap_calibration=calibration, gap_iters=gap_iters)
        # An injected 'wrong' fault launches a kernel that writes another pattern.
        kernel_tag = CHECK_TAG + 1 if faults.injected("wrong", point["id"]) else CHECK_TAG
        wrong = bench.check_train(
            plan, gap_iters=gap_iters, tag_base=CHECK_TAG, kernel_tag_base=kernel_tag
        )
        if wrong:
            raise WrongResult(wrong)
        return {"plan": plan, "gap_iters": gap_iters, "extra": extra}

    def _time_train(self, point: dict, run: dict) -> tuple[dict, dict]:
        bench, plan, gap_iters, extra = self.bench, run["plan"], run["gap_iters"], run["extra"]
        samples: dict[str, list[float]] = {}
        keep = point["gap_us"] in STAMPED_GAPS_US.get(point["study"], ())
        for n in range(self.mb["launches"]):
            stamps = bench.run_train(
                plan, tag_base=(n + 1) << 20, slot_base=n * plan.n_bursts, gap_iters=gap_iters
            )
            metrics = stamp_metrics.train_metrics(
                stamps.start, stamps.end, plan.warmup, plan.kind, plan.B, stamps.reach
            )
            stamp_metrics.pool(samples, metrics)
            if keep and n == 0:
                extra["stamps_ns"] = stamp_metrics.stamps_extra(*stamps)
        return samples, extra

    def _check_probe(self, point: dict) -> dict:
        bench = self.bench
        if point["dest"] == "host":
            raise PointUnsupported(HOST_PROBE_UNSUPPORTED)
        if point["dest"] != "peer" or point["peers"] != 1 or point["width"] != 16:
            raise PointUnsupported(
                "the drain probe measures one peer with 16-byte stores "
                f"(got dest={point['dest']}, peers={point['peers']}, width={point['width']})"
            )
        planning.require_peer_gpus(1, self.world_size)
        K, B = point["K"], point["B"]
        n_bursts = self.mb["bursts"]
        idle_us = planning.isolated_idle_us(K * B, "peer")
        limit = bench.require_coresident("drain_probe_send", K, 4 * n_bursts * 8)
        run = {"K": K, "n_bursts": n_bursts, "idle_us": idle_us}
        wrong = bench.check_probe(B=B, tag_base=CHECK_TAG, **run)
        if wrong:
            raise WrongResult(wrong)
        return {"run": run, "limit": limit}

    def _time_probe(self, point: dict, checked: dict) -> tuple[dict, dict]:
        bench, run, warmup = self.bench, checked["run"], self.mb["warmup_bursts"]
        samples: dict[str, list[float]] = {}
        for n in range(self.mb["launches"]):
            stamps = bench.run_probe(B=point["B"], tag_base=(n + 1) << 20, **run)
            stamp_metrics.pool(samples, stamp_metrics.probe_metrics(stamps, warmup))
        # The same protocol with no data: what the signal/ack round trip costs by itself.
        handshake: list[float] = []
        for _ in range(self.mb["launches"]):
            stamps = bench.run_probe(B=0, tag_base=0, **run)
            handshake += stamp_metrics.probe_metrics(stamps, warmup)["visible_us"]
        samples["handshake_us"] = handshake
        extra = {
            "threads": bench.threads,
            "launches": self.mb["launches"],
            "idle_us": run["idle_us"],
            "max_coresident_ctas": checked["limit"],
            "definition": (
                "visible_us: earliest producer start -> earliest sender-side observation of "
                "the receiver's ack; the receiver acks only after all K producers signalled, "
                "each after __threadfence_system() following its stores, so every byte was "
                "visible at the receiver before the ack. An upper bound by one signal and "
                "one ack latency, measured alone as handshake_us (same protocol, B = 0). "
                "fence_us: earliest start -> last producer's fence return. Sender clock only."
            ),
        }
        return samples, extra

    def _check_ceiling(self, point: dict) -> dict:
        bench = self.bench
        V, dest, method = int(point["V"]), point["dest"], point["method"]
        if dest not in planning.DESTS:
            raise PointUnsupported(f"dest must be one of {planning.DESTS}, got {dest!r}")
        if dest == "peer":
            planning.require_peer_gpus(1, self.world_size)
        tag = CHECK_TAG + 1
        if method == "sm_store":
            fn, info = bench.bulk_store_fn(dest, V, tag)
            info["what"] = "16-byte stores of a pattern from every SM, no loads"
        elif method == "copy_engine":
            fn, info = bench.copy_engine_fn(dest, V, tag)
            info["what"] = "copy-engine copy of V bytes from the sender (a local copy also reads V)"
        else:
            raise PointUnsupported(f"ceiling method must be sm_store or copy_engine: {method!r}")
        wrong = bench.check_ceiling(fn, dest, V, tag)
        if wrong:
            raise WrongResult(wrong)
        return {"fn": fn, "info": info}

    def _time_ceiling(self, point: dict, checked: dict) -> tuple[dict, dict]:
        V = int(point["V"])
        # V is far larger than L2, so an L2 flush would change nothing.
        run_once = timing.cuda_event_timer(checked["fn"], device=self.bench.sender, flush_l2=False)
        times = timing.measure(run_once, self.policy)
        samples = {"bandwidth_GBps": [V / (t * 1e3) for t in times], "time_us": list(times)}
        return samples, {**checked["info"], "stop_reason": times.stop_reason}


def _failing(step, *args):
    """`step(*args)`, a MicrobenchError turned into the protocol's PointFailed."""
    try:
        return step(*args)
    except MicrobenchError as e:
        correct = False if e.status == "wrong" else None
        raise PointFailed(str(e), status=e.status, correct=correct) from e


def default_gpu_ids(config: dict) -> list[int]:
    """The GPUs a study runs on: the config's world size (or every visible GPU), from 0.
    One GPU is enough: it measures the host path."""
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    size = count if config.get("world_size", "auto") == "auto" else int(config["world_size"])
    if size < 1:
        raise MicrobenchError("no GPU visible: the microbenchmarks need at least one")
    if size > count:
        raise MicrobenchError(f"config world_size={size}, but only {count} GPU(s) are visible")
    return list(range(size))


def run_paths(config: dict, world_size: int) -> list[str]:
    """The store paths this run measures: the Snakefile's resolved `store_paths`, or "auto"
    resolved here for a runner started by hand (storepath.resolve names the config key)."""
    return storepath.resolve(config.get("store_paths", storepath.AUTO), world_size)


def path_constants(paths: Sequence[str]) -> dict:
    """What the raw config records per measured path and for the local control."""
    return {
        dest: {
            "isolated_idle_rate_GBps": planning.ISOLATED_IDLE_RATE_GBps[dest],
            "isolated_idle_us": planning.isolated_idle_rule(dest),
            "destination": DESTINATION[dest],
            "drain_probe": "measured" if dest == storepath.PEER else HOST_PROBE_UNSUPPORTED,
        }
        for dest in (*paths, storepath.LOCAL)
    }


def raw_config(
    config: dict, cubin: str | Path | None, gpu_ids: Sequence[int], paths: Sequence[str]
) -> dict:
    """Everything that produced the file: the microbench and timing config, the measured
    store paths and our constants (per path where they differ)."""
    return {
        "microbench": config["microbench"],
        "timing": config["timing"],
        "world_size": len(gpu_ids),
        "gpu_ids": list(gpu_ids),
        "store_paths": list(paths),
        "kernel": {
            "cubin": str(cubin),
            "threads_per_cta": launch.THREADS,
            "destination_buffer_bytes": planning.ROTATE_BYTES,
            "timeout_ns": launch.TIMEOUT_NS,
            "ceiling_ctas_per_sm": launch.CEILING_GRID_PER_SM,
            "gap_calibration_iters": list(launch.GAP_CALIBRATION_ITERS),
            "gap_extrapolation": gap_calibration.GAP_EXTRAPOLATION,
            "paths": path_constants(paths),
        },
    }


def run_study(
    config: dict,
    study: str,
    dataset: str,
    out: str | Path,
    cubin: str | Path | None,
    gpu_ids: list[int] | None = None,
    device_type: str = "cuda",
) -> None:
    """Measure every point of `study` and write results/<dataset>/raw/microbench/<study>.json
    (or `out`) through the resumable sweep, over the run's store paths.

    device_type="cpu" (CI's test of the rule) plans the same points and tries to start the
    benchmark; with no GPU that fails, and every point is recorded failed with the reason.
    On CUDA a benchmark that cannot start raises instead, so that a rerun retries it."""
    if study not in config["microbench"]["studies"]:
        known = ", ".join(config["microbench"]["studies"])
        raise ValueError(f"unknown microbench study {study!r} (config has: {known})")
    env = capture_measured(device_type)
    bench = None
    if device_type == "cuda":
        gpu_ids = gpu_ids if gpu_ids is not None else default_gpu_ids(config)
        paths = run_paths(config, len(gpu_ids))
        bench = BurstBench(cubin, gpu_ids)
        measure = PointMeasurer(
            bench, config["microbench"], timing.TimingPolicy.from_config(config["timing"])
        )
    else:
        world_size = config.get("world_size", "auto")
        gpu_ids = gpu_ids or list(range(2 if world_size == "auto" else int(world_size)))
        paths = run_paths(config, len(gpu_ids))
        measure = _cpu_measurer(cubin, gpu_ids)
    points = grid.microbench_points(config["microbench"], study, paths)
    try:
        run_sweep(
            points,
            measure,
            Path(out),
            experiment="microbench",
            backend="cuda",
            dataset=dataset,
            environment=env,
            config=raw_config(config, cubin, gpu_ids, paths),
            study=study,
            point_timeout_s=POINT_TIMEOUT_S,
        )
    finally:
        if bench is not None:
            bench.close()


def _cpu_measurer(cubin: str | Path | None, gpu_ids: list[int]):
    """What a CPU test run can do: try to start the benchmark and, when it cannot, record
    every point failed with why."""
    try:
        BurstBench(cubin, gpu_ids)
    except Exception as e:
        reason = f"the burst benchmark cannot start here: {type(e).__name__}: {e}"
    else:
        reason = "a CPU test run measures nothing, although this machine could"
    _log.info("[microbench] %s", reason)
    return lambda point: failed_record(point["id"], point, reason)


def _dataset_for(out: Path, gpu_ids: Sequence[int]) -> str:
    """results/<dataset>/raw/microbench/<study>.json names its dataset; else the GPUs do."""
    if out.parent.name == "microbench" and out.parent.parent.name == "raw":
        return out.parents[2].name
    import cupy

    from xstage_bench.measurement.machine import dataset_name

    names = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in gpu_ids]
    return dataset_name(names)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="config.yaml")
    parser.add_argument("--study", required=True, help="a key of microbench.studies")
    parser.add_argument("--out", required=True, type=Path, help="raw JSON file to write")
    parser.add_argument("--cubin", required=True, type=Path, help="built burst.cubin")
    parser.add_argument("--dataset", help="dataset name (default: from --out, else the GPUs)")
    parser.add_argument("--gpus", help="comma-separated GPU ids, sender first (default: all)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    gpu_ids = [int(g) for g in args.gpus.split(",")] if args.gpus else default_gpu_ids(config)
    dataset = args.dataset or _dataset_for(args.out, gpu_ids)
    run_study(config, args.study, dataset, args.out, args.cubin, gpu_ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
