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

One record per (shape, X, f, schedule), id '<shape>/T=<T>/P=<P>/X=<X>/f=<f>/<schedule>'.
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

from xstage_bench import timing
from xstage_bench.clocks import ClockSampler
from xstage_bench.environment import capture_measured
from xstage_bench.megamoe import routing, schedule, verdict
from xstage_bench.megamoe.measurer import valid_local_slots
from xstage_bench.megamoe.points import POINT_TIMEOUT_S
from xstage_bench.megamoe.reference import ExpertWeights
from xstage_bench.megamoe.runner import default_devices
from xstage_bench.megamoe.summary import linear2_waits, trace_summary
from xstage_bench.protocol import Measured, measure_point, wrong
from xstage_bench.results import failed_record
from xstage_bench.sweep import run_sweep

PRECISION = "w8a8"  # the Linear-1 epilogue stores an FP8 intermediate, as the real kernel's
NEEDS_GPU = "the emulated build waits on %globaltimer, which the Triton interpreter cannot run"


def emulated_points(megamoe: dict, world_size: int) -> list[dict]:
    """Per shape and remote fraction (they share a problem), every rate and schedule."""
    spec = megamoe["emulated"]
    shapes = {s["name"]: s for s in megamoe["shapes"]}
    unknown = sorted(set(spec["shapes"]) - set(shapes))
    if unknown:
        raise ValueError(
            f"config key 'megamoe.emulated.shapes': unknown shape(s) {unknown}; "
            f"megamoe.shapes has {sorted(shapes)}"
        )
    T = spec["tokens_per_rank"]
    routed_by = spec.get("routing", "balanced")
    points = []
    for name, fraction, rate, sched in itertools.product(
        spec["shapes"], spec["remote_fractions"], spec["tflops"], megamoe["schedules"]
    ):
        shape = {k: v for k, v in shapes[name].items() if k != "name"}
        label = routing.fraction_label(fraction)
        point = {"shape": name, **shape, "precision": PRECISION, "routing": routed_by}
        point.update(
            tokens_per_rank=T,
            world_size=world_size,
            emulated_tflops=float(rate),
            remote_fraction=fraction if fraction == "natural" else float(fraction),
            schedule=sched,
            id=f"{name}/T={T}/P={world_size}/X={float(rate):g}/f={label}/{sched}",
        )
        points.append(point)
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
        from xstage_bench.megamoe.problem import MoEProblem

        # The local control keeps natural routing and redirects the stores (as the trace's).
        local = routing.is_local_control(point["remote_fraction"])
        routed = {**point, "remote_fraction": routing.NATURAL} if local else point
        key = (point["shape"], point["remote_fraction"])
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
        nan = [q for q, rb in enumerate(prob.ranks) if torch.isnan(rb.comb).any()]
        return verdict.unwritten(nan, rows="combine rows")

    def __call__(self, point: dict) -> dict:
        local = routing.is_local_control(point["remote_fraction"])
        ns = schedule.emulated_tile_ns(
            point["H"], point["I"], point["emulated_tflops"], self.num_programs
        )
        sched = point["schedule"]

        def check() -> None:
            prob = self.problem(point)
            prob.poison(local=local)
            prob.forward(sched, local=local, emulate_ns=ns)
            prob.synchronize()
            error = verdict.flagged(prob.error_flags()) or self._unwritten(prob, local)
            if error:
                raise wrong(error)

        def measure(_) -> Measured:
            prob = self.problem(point)
            events: list = []
            run_once = timing.cuda_event_timer(
                lambda: prob.forward(sched, local=local, emulate_ns=ns, kernel_events=events),
                device=self.devices[0].index,
                flush_l2=False,  # the emulated tiles read no weights: nothing to flush
            )
            times = timing.measure(run_once, self.policy)
            kernel_us = [
                max(a.elapsed_time(b) * 1000.0 for a, b in ranks) for ranks in events[-len(times) :]
            ]
            waits, spans = self._traced(prob, sched, local, ns)
            remote = sum(rb.plan.remote_rows() for rb in prob.ranks)
            rows = sum(rb.plan.rows for rb in prob.ranks)
            median = statistics.median(times)
            flops = prob.useful_flops() / len(self.devices)
            programs = len(prob.ranks) * self.num_programs
            extra = {
                "emulated": True,
                "tile_ns": {"l1": ns[0], "l2": ns[1]},
                "num_programs": self.num_programs,
                "local_control": local,
                "remote_rows_share": 0.0 if local else remote / rows,
                "equivalent_tflops": flops / (median * 1e6),
                "wait_us_median": float(np.median(waits)) if waits else 0.0,
                "wait_us_p90": float(np.percentile(waits, 90)) if waits else 0.0,
                "wait_us_sum_per_program": float(np.sum(waits)) / programs,
                "store_span_us_median": float(np.median(spans)) if spans else 0.0,
                "store_span_us_p90": float(np.percentile(spans, 90)) if spans else 0.0,
                "stop_reason": times.stop_reason,
            }
            line = (
                f"  time_us={median:.1f} kernel_us={statistics.median(kernel_us):.1f} "
                f"wait p90={extra['wait_us_p90']:.2f} us "
                f"span={extra['store_span_us_median']:.2f} us"
            )
            return Measured({"time_us": list(times), "kernel_us": kernel_us}, extra, line=line)

        return measure_point(point, check, measure, sampler=self.sampler)

    def _traced(self, prob, sched: str, local: bool, ns) -> tuple[list[float], list[float]]:
        """Waits (ready - taken) and store spans of every Linear-2 tile, all ranks, us."""
        torch = self.torch
        bufs = [
            torch.zeros(rb.tiles[sched].shape[0], 6, dtype=torch.int64, device=d)
            for rb, d in zip(prob.ranks, self.devices, strict=True)
        ]
        prob.forward(sched, local=local, emulate_ns=ns, trace=bufs)
        prob.synchronize()
        stamps = [b.cpu().numpy() for b in bufs]
        tiles = [rb.tiles[sched].cpu().numpy() for rb in prob.ranks]
        spans, _ = trace_summary(stamps, tiles, keep_timeline=False)
        return linear2_waits(stamps, tiles), spans


def raw_config(config: dict, devices: list) -> dict:
    from xstage_kernels import megamoe as kernel

    return {
        "megamoe": config["megamoe"],
        "timing": config["timing"],
        "world_size": len(devices),
        "kernel": {
            "source": "kernels/xstage_kernels/megamoe.py (Triton, persistent, EMULATE build)",
            "block_m": kernel.BLOCK_M,
            "block_n": kernel.BLOCK_N,
            "precision": PRECISION,
        },
        "definitions": {
            "emulated_tflops": "the per-GPU compute rate the tile waits stand for: an L1 "
            "tile waits 4 BM BN H / (X / programs), an L2 tile 2 BM BN I / (X / programs)",
            "remote_fraction": "share of combine rows stored into another GPU: 'natural' "
            "(routing's own), a number (rows re-homed by routing.py), 0 (the local-store "
            "control: natural routing, every row stored on its own GPU)",
            "time_us": "GPU 0 events around every rank's emulated kernel, the cross-GPU "
            "barrier and the top-k combine",
            "wait_us": "per Linear-2 tile, %globaltimer from taken to its row block ready",
        },
    }


def run_emulated(
    config: dict, dataset: str, out: str | Path, world_size: int, device_type: str = "cuda"
) -> None:
    """The DAG's entry: the megamoe.emulated sweep into raw/megamoe_emulated.json."""
    moe = config["megamoe"]
    devices = default_devices(config, world_size, device_type)
    points = emulated_points(moe, len(devices))
    if device_type == "cuda":
        from xstage_bench.megamoe.problem import enable_peer_access

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
        config=raw_config(config, devices),
        point_timeout_s=POINT_TIMEOUT_S,
    )
