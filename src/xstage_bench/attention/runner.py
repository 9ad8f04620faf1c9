"""Run the Ulysses attention sweep: one process per GPU, rank 0 drives, rank 0 writes.

    python -m xstage_bench.attention.runner --config config.yaml --out raw/attention.json \
        [--backends triton,fa3] [--seq-lens 8192,32768] [--heads 24]

The parent spawns one worker per GPU (torch.multiprocessing; one GPU is a world of one).
Each joins an NCCL group (the serial path's all_to_all_single) and a gloo group (control).
Rank 0 runs `sweep.run_sweep` over the points of every measured store path
(`config["store_paths"]`, storepath.resolve): the peer path (a P-GPU node, or two GPUs
emulating one) and the host path (GPU 0 plays rank 0 of a P-GPU node, host memory the
other owners: attention/host.py; on a machine with more GPUs the others idle meanwhile).

The points of one setting and shape (path, P, heads, S) are measured together, through
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
import contextlib
import copy
import json
import statistics
import sys
import uuid
from collections import Counter
from pathlib import Path

from xstage_bench.data import storepath
from xstage_bench.data.grid import attention_points
from xstage_bench.measurement import timing, workers
from xstage_bench.measurement.protocol import Measured, PointFailed, wrong
from xstage_bench.measurement.sweep import Refresh, records_refresh

DTYPE = "bfloat16"
CPU_TRITON_CONFIG = {"BLOCK_M": 16, "BLOCK_N": 16}  # small tiles: the interpreter is slow
TL_KERNEL = {"kernel": "tl", "source": "kernels/xstage_kernels/flash_ulysses.py"}


def kernels_that_ran(device_type: str) -> dict:
    """Which kernel ran our backend ('triton'); each record's extra.triton_config says it per
    point. A backend's entry changes only when its kernel does, so a finished sweep measures
    only that backend's points again (kernel_refresh)."""
    from xstage_kernels import flash_ulysses

    if device_type != "cuda" or flash_ulysses.attention_kernel() == "tl":
        return {"triton": TL_KERNEL}
    return {
        "triton": {
            "kernel": "ws",
            "source": "kernels/xstage_kernels/flash_ws.py (Gluon, warp-specialized: one TMA "
            "producer warp, two math warpgroups of 64 query rows)",
            "where": "S a multiple of 128, contiguous q/k/v, head_dim 64 or 128; "
            "else kernels/xstage_kernels/flash_ulysses.py",
            "launch": "a call with the last call's arguments reuses its compiled kernel and "
            "TMA descriptors",
        }
    }


def kernel_refresh(previous: dict, config: dict) -> Refresh | None:
    """sweep.run_sweep's refresh rule: when two raw configs differ only in the kernel that
    ran some backends, those backends' points are stale. Raw files written before `kernels`
    existed ran the tl kernel."""
    return records_refresh(
        previous,
        config,
        lambda cfg: (cfg, cfg.pop("kernels", {"triton": TL_KERNEL})),
        lambda point, changed: point["backend"] in changed,
    )


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
    timing.TimingPolicy.from_config(cfg["timing"])  # fail here, not in a worker
    return cfg


PATH_ORDER = {storepath.PEER: 0, storepath.HOST: 1}


def ordered_points(
    attention: dict, world_size: int, paths: tuple[str, ...] | list[str] = (storepath.PEER,)
) -> list[dict]:
    """The sweep's points, grouped by setting and shape (`pairing_group`) so each shape's
    buffers are built once and each group's arms are measured together."""
    points = attention_points(attention, world_size, paths)
    backends = {b: i for i, b in enumerate(attention["backends"])}
    modes = {m: i for i, m in enumerate(attention["modes"])}
    return sorted(
        points,
        key=lambda p: (
            PATH_ORDER[storepath.point_path(p)],
            p.get("emulated_world_size", 0),
            p["heads"],
            p["seq_len"],
            backends[p["backend"]],
            modes[p["mode"]],
        ),
    )


def pairing_group(point: dict) -> tuple:
    """The points timed together in paired rounds: every backend and mode of one store
    path, P and shape."""
    return (
        storepath.point_path(point),
        point.get("emulated_world_size", point["world_size"]),
        point["heads"],
        point["seq_len"],
        point["head_dim"],
        point["batch"],
    )


def arm_name(point: dict) -> str:
    """A point's arm in its pairing group: backend/mode."""
    return f"{point['backend']}/{point['mode']}"


def measured_paths(config: dict, world_size: int) -> list[str]:
    """The store paths this run measures: config["store_paths"] as the Snakefile resolved
    it, or `auto` resolved here (a runner started by hand)."""
    return storepath.resolve(config.get("store_paths", storepath.AUTO), world_size)


PAIRED_DEFINITION = (
    "the backends and modes of one (path, P, heads, S) are checked, then timed together in "
    "rounds (timing.measure_paired): sample i of each from round i; extra.paired.group is "
    "the same for the records of one timing and unique to it"
)


def raw_config(config: dict, device_type: str, paths: list[str]) -> dict:
    """What the raw file records as its config: the run's config with the store paths it
    measured, which kernel ran our backend, and what the pairing and (where measured) the
    host path's modes and clocks are (attention/host.py)."""
    from xstage_bench.attention.host import DEFINITIONS

    definitions = {"paired": PAIRED_DEFINITION}
    if storepath.HOST in paths:
        definitions.update(DEFINITIONS)
    return {
        **config,
        "store_paths": list(paths),
        "kernels": kernels_that_ran(device_type),
        "definitions": definitions,
    }


def point_seed(point_id: str, rank: int) -> int:
    """A stable seed per (point, rank): fresh inputs per point, reproducible per run."""
    import zlib

    return zlib.crc32(f"{point_id}/{rank}".encode())


class Rank(workers.Lockstep):
    """One worker's state: its fabric, cached backends and the current shapes' buffers
    (the peer path's, on every rank; the host path's, on rank 0 alone)."""

    def __init__(self, fabric, policy: timing.TimingPolicy, dtype, triton_config):
        super().__init__(fabric)
        self.policy, self.dtype = policy, dtype
        self.triton_config = triton_config
        self.backends: dict[str, object] = {}
        self.workspace = None  # the peer path's (every rank in lockstep)
        self.host_workspace = None  # the host path's (rank 0, working alone)
        self._solo_fabric = None
        self._timings = 0  # numbers each paired timing of this process
        self._session = uuid.uuid4().hex[:8]
        self.flush = None
        if fabric.device_type == "cuda" and policy.flush_l2:
            import torch

            self.flush = timing.l2_flusher(torch, fabric.rank)

    # -- one point, on every rank --
    def backend(self, name: str):
        from xstage_bench.attention.backends import BackendUnavailable, load_backend

        if name not in self.backends:
            try:
                self.backends[name] = load_backend(name, self.triton_config)
            except BackendUnavailable as e:
                self.backends[name] = e
        found = self.backends[name]
        if isinstance(found, Exception):
            raise found
        return found

    def shape(self, point: dict):
        """The workspace of the point's path and shape, built when it changes."""
        from xstage_bench.attention.emulation import EmulatedWorkspace
        from xstage_bench.attention.host import HostWorkspace
        from xstage_bench.attention.layout import UlyssesLayout
        from xstage_bench.attention.modes import Workspace

        emulated = point.get("emulated_world_size")
        layout = UlyssesLayout(
            point["batch"],
            point["seq_len"],
            point["heads"],
            point["head_dim"],
            emulated or self.fabric.world_size,
        )
        if storepath.point_path(point) == storepath.HOST:
            ws = self.host_workspace
            if ws is None or ws.layout != layout:
                fabric = self.solo_fabric()
                if ws is not None:
                    fabric.wait()  # no kernel still writes into the old range
                    self.host_workspace = None
                    ws.close()
                self.host_workspace = HostWorkspace(layout, fabric, self.dtype)
            return self.host_workspace
        kind = EmulatedWorkspace if emulated else Workspace
        if not isinstance(self.workspace, kind) or self.workspace.layout != layout:
            if self.workspace is not None:
                self.fabric.wait()
                self.fabric.host_barrier()  # no peer still writes into the old window
                self.workspace.close()
                self.workspace = None
            self.workspace = kind(layout, self.fabric, self.dtype)
        return self.workspace

    def solo_fabric(self):
        from xstage_bench.measurement.fabric import SoloFabric

        if self._solo_fabric is None:
            self._solo_fabric = SoloFabric(self.fabric)
        return self._solo_fabric

    def execute(self, message: dict) -> dict | None:
        """Rank 0's record of one point (`message` a point), or every record of a group by
        id (`message` = {"group": [points]}), checked, then timed in paired rounds. Every
        rank calls it in lockstep, except on the host path, where rank 0 works alone and
        the others wait; ranks > 0 return None."""
        if "group" not in message:
            records = self.execute_group([message])
            return None if records is None else records[message["id"]]
        return self.execute_group(message["group"])

    def execute_group(self, points: list[dict]) -> dict[str, dict] | None:
        found: dict[str, tuple] = {}
        host = storepath.point_path(points[0]) == storepath.HOST
        if host and self.fabric.rank != 0:
            self.wait_solo()
            return None
        with self.solo() if host else contextlib.nullcontext():
            return self.measure_group(
                points,
                lambda point: self._checked(point, found),
                lambda passed: self._time_group(passed, found),
            )

    def _checked(self, point: dict, found: dict) -> dict:
        """Every rank's check of the point; the record's check facts. Fills found[id]
        with the backend and the workspace it ran on."""
        from xstage_bench.attention.modes import check

        pid, mode = point["id"], point["mode"]
        backend, error = self._backend_or_reason(point)
        if error:
            raise PointFailed(error, status="unsupported")
        ws, error = self.agree(lambda: self.shape(point))
        if error:
            raise PointFailed(f"buffers: {error}")
        if mode == "fused" and backend.name != "triton" and ws.target.peer_out is None:
            needs = (
                "an out view over one device/host range"
                if storepath.point_path(point) == storepath.HOST
                else "a peer-backed out view"
            )
            reason = f"{backend.name} fused needs {needs}: "
            raise PointFailed(reason + ws.target.peer_out_reason, status="unsupported")
        seed = point_seed(pid, self.fabric.rank)
        verdict, error = self.agree(lambda: check(backend, mode, ws, seed))
        if error:
            status = "timeout" if "WaitTimeout" in error else "failed"
            raise PointFailed(f"check: {error}", status=status)
        verdicts = self.gather(verdict)
        extra = {
            "max_abs_err": max(v.max_abs_err for v in verdicts),
            "bitwise_equal_serial": (
                None if mode != "fused" else all(v.bitwise_equal_serial for v in verdicts)
            ),
        }
        if storepath.point_path(point) == storepath.HOST:
            extra["host_memory"] = ws.host_memory
            extra["host_bytes"] = ws.node.host_bytes(ws.dtype.itemsize) if mode != "alone" else 0
        wrong_ranks = [f"rank {r}: {v.detail}" for r, v in enumerate(verdicts) if not v.correct]
        if wrong_ranks:
            raise wrong("wrong result: " + "; ".join(wrong_ranks), extra)
        found[pid] = (backend, ws)
        return extra

    def _backend_or_reason(self, point: dict):
        from xstage_bench.attention.backends import BackendUnavailable

        try:
            backend, error = self.backend(point["backend"]), None
        except BackendUnavailable as e:
            backend, error = None, str(e)
        errors = [e for e in self.gather(error) if e]
        return backend, (errors[0] if errors else None)

    def _time_group(self, passed: list[tuple[dict, dict]], found: dict) -> dict | None:
        """Time the checked points of a group together in paired rounds; rank 0 gets
        {id: Measured or PointFailed}, the others None."""
        from xstage_bench.attention.modes import timed_rep

        arms = {arm_name(point): (point, facts) for point, facts in passed}
        reps = {}
        for arm, (point, _) in arms.items():
            backend, ws = found[point["id"]]
            reps[arm] = lambda b=backend, m=point["mode"], w=ws: timed_rep(b, m, w, self.flush)
        timed = self.timed_paired(reps, 2, self.policy)
        if timed is None:  # ranks > 0
            return None
        self._timings += 1
        ran = [arm for arm in arms if not isinstance(timed[arm], str)]
        token = f"{self._session}-{self._timings}"
        outcomes = {}
        for arm, (point, facts) in arms.items():
            got = timed[arm]
            if isinstance(got, str):
                status = "timeout" if "WaitTimeout" in got else "failed"
                outcomes[point["id"]] = PointFailed(
                    f"timing: {got}", status=status, correct=True, extra=facts
                )
                continue
            paired = {**timing.paired_extra(ran, arm, got.samples), "group": token}
            outcomes[point["id"]] = self._measured(point, facts, got, found, paired)
        return outcomes

    def _measured(self, point, facts, timed, found, paired) -> Measured:
        samples, (completion,) = timed.samples, timed.others
        _, ws = found[point["id"]]
        extra = {
            **facts,
            "tflops": ws.layout.attention_flops() / (statistics.median(samples) * 1e6),
            "stop_reason": samples.stop_reason,
            "warmup": samples.warmup,
            "paired": paired,
        }
        if point["backend"] == "triton":
            from xstage_kernels.flash_ulysses import launch_config

            extra["triton_config"] = launch_config(ws.q, ws.k, ws.v, self.triton_config)
        return Measured({"sender_us": list(samples), "completion_us": completion}, extra)

    def close(self) -> None:
        """Free this rank's buffers (call when no rank still writes into them)."""
        for ws in (self.workspace, self.host_workspace):
            if ws is not None:
                ws.close()
        self.workspace = self.host_workspace = None


def _worker(rank: int, job: dict) -> None:
    """One process per GPU (spawned): join the groups, then drive (rank 0) or follow."""
    import torch

    fabric = workers.join(rank, job)
    state = Rank(
        fabric,
        timing.TimingPolicy.from_config(job["config"]["timing"]),
        getattr(torch, job["dtype"]),
        job["triton_config"],
    )
    try:
        if rank == 0:
            points = ordered_points(job["config"]["attention"], job["world_size"], job["paths"])
            workers.drive(
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
        workers.leave(fabric, state.close)
    workers.exit_cleanly()


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
    workers.launch(
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
    """The DAG's entry: the config's full attention sweep on this machine's GPUs (or, with
    device_type="cpu", on gloo and the Triton interpreter: CI's test of the rule)."""
    if device_type == "cuda":
        workers.use_gpus(config)
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
