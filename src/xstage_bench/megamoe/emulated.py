"""The fused MoE kernel with its compute emulated: the X-Stage at compute rates the GEMMs
cannot reach here.

Our kernel runs at a fraction of the H200's FP8 rate, and at that speed the Linear-2
stores never outrun NVLink, so the schedules cannot show what the paper claims. This
experiment keeps everything of the kernel but the matrix math: the same tile lists
(schedule.py), row-block counters, epilogue stores of real bytes into real peer buffers,
combine and barrier, with each tile's MMA replaced by a %globaltimer wait for its FLOPs
at an emulated per-GPU rate X (kernel.EMULATE). Sweeping X and the remote fraction f (the
share of combine rows that cross NVLink; 0 is the local-store control, every row stored
on its own GPU) shows at which compute rate, on this interconnect, interleaving starts to
pay. Every record says `emulated`: it is a measurement of the interconnect and the
schedules, never of a GEMM.

One record per (shape, path, X, f, schedule), id '<shape>/T=<T>/P=<P>/X=<X>/f=<f>/<schedule>'
on the peer path and '<shape>/T=<T>/P=<P>/path=host/X=<X>/f=<f>/<schedule>' on the host
path, where f is the host share (problem.py: a seeded round(f T) of each home rank's tokens
have their combine rows stored into host memory; routing natural) and f = 0 the local
control. The interleaved schedule's `lead_rows: auto` assumes the emulated rate X.
Checked before it is timed: outputs poisoned, one emulated layer, every rank's error flag
clear, and every row the kernel should store written (no NaN left). Timed like the real
kernel (time_us: every rank's kernel, the barrier and the combine; kernel_us: the slowest
rank's kernel). Then one traced run gives every Linear-2 tile's wait for its inputs
(ready - taken) and its store span.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

import numpy as np

from xstage_bench.data import grid, storepath
from xstage_bench.data.results import failed_record
from xstage_bench.measurement import timing
from xstage_bench.measurement.clocks import ClockSampler
from xstage_bench.measurement.environment import capture_measured
from xstage_bench.measurement.protocol import Measured, measure_point, wrong
from xstage_bench.measurement.sweep import run_sweep
from xstage_bench.megamoe import schedule
from xstage_bench.megamoe.ours import verdict
from xstage_bench.megamoe.ours.lead import LeadChooser
from xstage_bench.megamoe.ours.measurer import valid_local_slots
from xstage_bench.megamoe.ours.summary import linear2_waits, trace_summary
from xstage_bench.megamoe.points import POINT_TIMEOUT_S, lead_failure, shapes_named, with_lead
from xstage_bench.megamoe.reference import ExpertWeights
from xstage_bench.megamoe.runner import HOST_SHARE_RULE, default_devices, measured_paths

PRECISION = "w8a8"  # the Linear-1 epilogue stores an FP8 intermediate, as the real kernel's
NEEDS_GPU = "the emulated build waits on %globaltimer, which the Triton interpreter cannot run"


def emulated_points(
    megamoe: dict,
    world_size: int,
    paths: tuple[str, ...] | list[str] = (storepath.PEER,),
    leads: LeadChooser | None = None,
) -> list[dict]:
    """Per shape, path and remote fraction (they share a problem), every rate and schedule;
    on the host path 'natural' is f = 0 (the local control)."""
    spec = megamoe["emulated"]
    shapes = shapes_named(megamoe, "emulated")
    T = spec["tokens_per_rank"]
    routed_by = spec.get("routing", "balanced")
    fractions = {
        storepath.PEER: list(spec["remote_fractions"]),
        storepath.HOST: list(
            dict.fromkeys(0.0 if f == grid.NATURAL else float(f) for f in spec["remote_fractions"])
        ),
    }
    points = []
    for name, path in itertools.product(spec["shapes"], paths):
        for fraction, rate, sched in itertools.product(
            fractions[path], spec["tflops"], megamoe["schedules"]
        ):
            shape = {k: v for k, v in shapes[name].items() if k != "name"}
            label = grid.fraction_label(fraction)
            point = {"shape": name, **shape, "precision": PRECISION, "routing": routed_by}
            where = "" if path == storepath.PEER else f"/path={path}"
            point.update(
                tokens_per_rank=T,
                world_size=world_size,
                path=path,
                emulated_tflops=float(rate),
                remote_fraction=fraction if fraction == "natural" else float(fraction),
                schedule=sched,
                id=f"{name}/T={T}/P={world_size}{where}/X={float(rate):g}/f={label}/{sched}",
            )
            points.append(with_lead(point, megamoe.get("lead_rows", 0), leads, tflops=float(rate)))
    return points


class EmulatedMeasurer:
    """`measure(point) -> record` for sweep.run_sweep; keeps the current (shape, f) problem."""

    def __init__(self, megamoe: dict, policy: timing.TimingPolicy, devices: list):
        import torch

        self.torch, self.moe, self.policy, self.devices = torch, megamoe, policy, devices
        self.num_programs = torch.cuda.get_device_properties(devices[0]).multi_processor_count
        self.sampler = ClockSampler([d.index for d in devices])
        self._key, self._problem = None, None
        # The emulated build reads no weights: one element each stands in for them.
        self.experts = [
            ExpertWeights(*(torch.zeros(1, dtype=dtype, device=d) for dtype in self._dtypes()))
            for d in devices
        ]

    def _dtypes(self):
        torch = self.torch
        return (torch.float8_e4m3fn, torch.float32, torch.float8_e4m3fn, torch.float32)

    def problem(self, point: dict):
        from xstage_bench.megamoe.layer.problem import MoEProblem

        # The local control keeps natural routing and redirects the stores (as the trace's).
        local = grid.is_local_control(point["remote_fraction"])
        host = storepath.point_path(point) == storepath.HOST
        routed = {**point, "remote_fraction": 0.0 if host else grid.NATURAL} if local else point
        key = (point["shape"], storepath.point_path(point), point["remote_fraction"])
        if key != self._key:
            self._problem = None
            self.torch.cuda.empty_cache()
            self._problem = MoEProblem(
                routed, self.moe, self.devices, self.experts, num_programs=self.num_programs
            )
            self._key = key
        return self._problem

    def _unwritten(self, prob, local: bool) -> str | None:
        torch = self.torch
        if local:
            return verdict.local_unwritten(
                [
                    q
                    for q, rb in enumerate(prob.ranks)
                    if torch.isnan(rb.sink[valid_local_slots(rb, prob)]).any()
                ]
            )
        return verdict.unwritten(prob.host_unwritten(), rows="host combine rows") or (
            verdict.unwritten(prob.combine_unwritten(), rows="combine rows")
        )

    def __call__(self, point: dict) -> dict:
        local = grid.is_local_control(point["remote_fraction"])
        ns = schedule.emulated_tile_ns(
            point["H"], point["I"], point["emulated_tflops"], self.num_programs
        )

        def check() -> None:
            failure = lead_failure(point)
            if failure is not None:
                raise failure
            prob = self.problem(point)
            sched = prob.arm(point)
            prob.poison(local=local)
            prob.forward(sched, local=local, emulate_ns=ns)
            prob.synchronize()
            error = verdict.flagged(prob.error_flags()) or self._unwritten(prob, local)
            if error:
                raise wrong(error)

        def measure(_) -> Measured:
            prob = self.problem(point)
            sched = prob.arm(point)
            events: list = []
            run_once = timing.cuda_event_timer(
                lambda: prob.forward(sched, local=local, emulate_ns=ns, kernel_events=events),
                device=self.devices[0].index,
                flush_l2=False,  # the emulated tiles read no weights: nothing to flush
            )
            times = timing.measure(run_once, self.policy)
            kernel_us = timing.slowest_rank_us(events, len(times))
            waits, spans = self._traced(prob, sched, local, ns)
            remote_bytes = 0 if local else int(sum(prob.remote_bytes()))
            rows = sum(rb.plan.rows for rb in prob.ranks)
            median = statistics.median(times)
            flops = prob.useful_flops() / len(self.devices)
            programs = len(prob.ranks) * self.num_programs
            extra = {
                "emulated": True,
                "tile_ns": {"l1": ns[0], "l2": ns[1]},
                "num_programs": self.num_programs,
                "local_control": local,
                "remote_rows_share": remote_bytes / (rows * point["H"] * 2),
                "remote_bytes": remote_bytes,
                "equivalent_tflops": flops / (median * 1e6),
                "wait_us_median": float(np.median(waits)) if waits else 0.0,
                "wait_us_p90": float(np.percentile(waits, 90)) if waits else 0.0,
                "wait_us_sum_per_program": float(np.sum(waits)) / programs,
                "store_span_us_median": float(np.median(spans)) if spans else 0.0,
                "store_span_us_p90": float(np.percentile(spans, 90)) if spans else 0.0,
                "stop_reason": times.stop_reason,
            }
            if prob.path == storepath.HOST:
                extra["host_bytes"] = remote_bytes
            else:
                extra["nvlink_bytes"] = remote_bytes
            line = (
                f"  time_us={median:.1f} kernel_us={statistics.median(kernel_us):.1f} "
                f"wait p90={extra['wait_us_p90']:.2f} us "
                f"span={extra['store_span_us_median']:.2f} us"
            )
            return Measured(
                {"time_us": list(times), "kernel_us": kernel_us}, extra, correct=True, line=line
            )

        return measure_point(point, check, measure, sampler=self.sampler)

    def _traced(self, prob, sched: str, local: bool, ns) -> tuple[list[float], list[float]]:
        """Waits (ready - taken) and store spans of every Linear-2 tile, all ranks, us."""
        bufs = prob.trace_buffers(sched)
        prob.forward(sched, local=local, emulate_ns=ns, trace=bufs)
        prob.synchronize()
        stamps, tiles = prob.traced(sched, bufs)
        spans, _ = trace_summary(stamps, tiles, keep_timeline=False)
        return linear2_waits(stamps, tiles), spans


def raw_config(
    config: dict, devices: list, paths=(storepath.PEER,), leads: LeadChooser | None = None
) -> dict:
    from xstage_bench.megamoe.layer import reduction
    from xstage_kernels import megamoe as kernel

    common = {
        "emulated_tflops": "the per-GPU compute rate the tile waits stand for: an L1 "
        "tile waits 4 BM BN H / (X / programs), an L2 tile 2 BM BN I / (X / programs)",
        "wait_us": "per Linear-2 tile, %globaltimer from taken to its row block ready",
        "kernel_us": "max over ranks of the emulated kernel alone (events on its stream)",
        "lead_rows": "interleaved: the minimum Linear-1 row lead of its tile list ('auto' "
        "in lead_rows_requested: lead.py at the emulated rate X)",
    }
    per_path = {
        storepath.PEER: {
            "remote_fraction": "share of combine rows stored into another GPU: 'natural' "
            "(routing's own), a number (rows re-homed by routing.py), 0 (the local-store "
            "control: natural routing, every row stored on its own GPU)",
            "time_us": "GPU 0 events around every rank's emulated kernel, the cross-GPU "
            "barrier and the top-k combine",
            "remote_bytes": "bytes stored into peers (= nvlink_bytes)",
        },
        storepath.HOST: {
            "remote_fraction": "the host share f: a seeded round(f T) of each home rank's "
            "tokens have their combine rows stored into host memory (routing natural); 0 "
            "is the local-store control (every row stored on its own GPU)",
            "time_us": "GPU 0 events around every rank's emulated kernel, the cross-GPU "
            "barrier and the top-k combine over the device combine buffer (the host-homed "
            "tokens' reduction belongs to the far end, untimed)",
            "remote_bytes": "bytes stored into host memory (= host_bytes)",
        },
    }
    raw = {
        "megamoe": config["megamoe"],
        "timing": config["timing"],
        "world_size": len(devices),
        "store_paths": list(paths),
        "kernel": {
            "source": "kernels/xstage_kernels/megamoe.py (Triton, persistent, EMULATE build)",
            "block_m": kernel.BLOCK_M,
            "block_n": kernel.BLOCK_N,
            "precision": PRECISION,
        },
        "combine": reduction.describe(reduction.default_reduction(devices[0].type)),
        "definitions": {path: {**per_path[path], **common} for path in paths},
    }
    if storepath.HOST in paths:
        raw["host_share"] = HOST_SHARE_RULE
    if leads is not None and leads.model_file is not None:
        raw["lead_auto"] = {
            **leads.describe(),
            "tflops": "the point's emulated rate X (emulated_tflops)",
        }
    return raw


def run_emulated(
    config: dict,
    dataset: str,
    out: str | Path,
    world_size: int,
    device_type: str = "cuda",
    model_file: str | Path | None = None,
) -> None:
    """The DAG's entry: the megamoe.emulated sweep into raw/megamoe_emulated.json, on every
    store path of config["store_paths"]; `model_file` for leads that are 'auto'."""
    moe = config["megamoe"]
    devices = default_devices(config, world_size, device_type)
    paths = measured_paths(config, len(devices))
    leads = LeadChooser.of(moe, model_file)
    points = emulated_points(moe, len(devices), paths, leads)
    if device_type == "cuda":
        from xstage_bench.megamoe.layer.problem import enable_peer_access

        if len(devices) > 1:
            enable_peer_access(devices)
        measure = EmulatedMeasurer(moe, timing.TimingPolicy.from_config(config["timing"]), devices)
    else:
        measure = lambda p: failed_record(p["id"], p, NEEDS_GPU, status="unsupported")  # noqa: E731
    run_sweep(
        points,
        measure,
        Path(out),
        experiment="megamoe_emulated",
        backend="cuda",
        dataset=dataset,
        environment=capture_measured(device_type),
        config=raw_config(config, devices, paths, leads),
        point_timeout_s=POINT_TIMEOUT_S,
    )
