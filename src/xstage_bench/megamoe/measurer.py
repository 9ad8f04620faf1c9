"""Our fused kernel measured from one process that drives every GPU: the check and the
timed runs of one (configuration, schedule), and the instrumented (traced) runs.

`MoEMeasurer(point) -> record` is what sweep.run_sweep calls; every point goes through
protocol.measure_point (clocks, check, timing, record). It keeps the current
configuration's problem (a configuration's schedules and baselines run back to back on
the same inputs) and its shape's weights, and hands the baselines' points to
baselines/measure.py.

The check of ours: the outputs are poisoned (NaN), one layer runs, and verdict.py judges
it (error flags, unwritten rows, sampled tokens of every home rank against the torch
reference, the interleaved output bitwise equal to expert-wave's). Timing goes through
the timing module (CUDA events on GPU 0, whose stream waits for every rank's kernel and
combine); compilation happens in the check, so it is never timed.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from xstage_bench import log, timing
from xstage_bench.clocks import ClockSampler
from xstage_bench.megamoe import reference, schedule, verdict
from xstage_bench.megamoe.baselines.measure import (
    DeepGemmBaseline,
    FlashInferBaseline,
    GemmCeiling,
    UnfusedBaseline,
)
from xstage_bench.megamoe.points import (
    CHECK_TOKENS,
    CPU_PROGRAMS,
    LOCAL_CONTROL,
    config_id,
    sampled_tokens,
)
from xstage_bench.megamoe.summary import linear2_waits, trace_summary
from xstage_bench.protocol import Measured, PointFailed, measure_point, wrong

TRACE_NEEDS_GPU = "the traced build reads %globaltimer, which the Triton interpreter cannot run"

_log = log.get(__name__)


class MoEMeasurer:
    """`measure(point) -> record` for sweep.run_sweep; keeps the current configuration's
    problem (both schedules of a configuration run back to back) and its shape's weights."""

    def __init__(
        self,
        megamoe: dict,
        policy: timing.TimingPolicy,
        devices: list,
        *,
        check_tokens: int = CHECK_TOKENS,
        seed: int = 0,
        baseline_budget_s: float | None = None,
    ):
        import torch

        self.torch = torch
        self.moe = megamoe
        self.policy = policy
        self.devices = devices
        self.check_tokens = check_tokens
        self.seed = seed
        self.cuda = devices[0].type == "cuda"
        self.tolerance = reference.tolerance(devices[0].type)
        self.num_programs = (
            torch.cuda.get_device_properties(devices[0]).multi_processor_count
            if self.cuda
            else CPU_PROGRAMS
        )
        self.sampler = ClockSampler([d.index for d in devices] if self.cuda else [])
        self.flushers = self._flushers() if self.cuda and policy.flush_l2 else None
        self._weights_key = None
        self._weights: list = []
        self._problem_id = None
        self._problem = None  # problem.MoEProblem of the current configuration
        self._reference: list | None = None
        self.tokens: list[np.ndarray] = []  # the sampled tokens of every home rank
        self._outputs: dict[str, list] = {}
        self.unfused = UnfusedBaseline(self)
        self.deepgemm = DeepGemmBaseline(self, baseline_budget_s)
        self.flashinfer = FlashInferBaseline(self, baseline_budget_s)
        self.ceiling = GemmCeiling(self)

    def _flushers(self) -> dict:
        torch = self.torch
        flush = {}
        for q, d in enumerate(self.devices[1:], start=1):
            size = torch.cuda.get_device_properties(d).L2_cache_size
            flush[q] = torch.empty(size, dtype=torch.uint8, device=d).zero_
        return flush

    # ---- the problem of a configuration ---------------------------------------------

    def problem(self, point: dict):
        from xstage_bench.megamoe.problem import MoEProblem, make_expert_weights

        cid = config_id(point)
        if cid == self._problem_id:
            return self._problem
        torch = self.torch
        self._problem = self._reference = None
        self.unfused.forget()
        self._outputs = {}
        key = (point["shape"], point["precision"])
        if key != self._weights_key:
            self._weights = []
            self.unfused.forget_weights()
            torch.cuda.empty_cache()
            self._weights = [
                make_expert_weights(point, point["precision"], q, d, self.seed)
                for q, d in enumerate(self.devices)
            ]
            self._weights_key = key
        else:
            torch.cuda.empty_cache()
        self._problem = MoEProblem(
            point,
            self.moe,
            self.devices,
            self._weights,
            num_programs=self.num_programs,
            seed=self.seed,
        )
        self._problem_id = cid
        self.tokens = sampled_tokens(
            point["tokens_per_rank"], self.check_tokens, len(self.devices), self.seed
        )
        return self._problem

    def reference(self) -> list:
        if self._reference is None:
            prob = self._problem
            self._reference = reference.reference_outputs(
                prob.homes, prob.experts, self.tokens, prob.precision
            )
        return self._reference

    def errors(self, outputs: list, ref: list | None = None) -> list[float]:
        """Relative error of each rank's sampled output rows against the reference."""
        torch = self.torch
        ref = self.reference() if ref is None else ref
        return [
            reference.relative_error(o[torch.as_tensor(t, device=o.device)], r)
            for o, t, r in zip(outputs, self.tokens, ref, strict=True)
        ]

    # ---- the check ------------------------------------------------------------------

    def check(self, point: dict, *, trace: list | None = None) -> tuple[str | None, dict]:
        """(error or None, facts) for one poisoned run of the point's schedule."""
        prob = self.problem(point)
        torch = self.torch
        local = point.get("variant") == LOCAL_CONTROL
        prob.poison(local=local)
        prob.forward(point["schedule"], local=local, trace=trace)
        prob.synchronize()
        facts: dict = {}
        flags = prob.error_flags()
        if local:
            missing = [
                q
                for q, rb in enumerate(prob.ranks)
                if torch.isnan(rb.sink[valid_local_slots(rb, prob)]).any()
            ]
            return verdict.flagged(flags) or verdict.local_unwritten(missing), facts
        outs = prob.outputs()
        nan = [q for q, o in enumerate(outs) if torch.isnan(o).any()]
        error = verdict.wrong(flags=flags, nan=nan)
        if error:
            return error, facts
        errors = self.errors(outs)
        facts["rel_error"] = errors
        facts["checked_tokens_per_rank"] = len(self.tokens[0])
        error = verdict.wrong(errors=errors, tolerance=self.tolerance)
        if error is None and trace is None:
            self._outputs[point["schedule"]] = [o.clone() for o in outs]
            first = self._outputs.get(schedule.WAVE)
            if point["schedule"] != schedule.WAVE and first is not None:
                same = all(torch.equal(a, b) for a, b in zip(first, outs, strict=True))
                facts["bitwise_equal_to_expert_wave"] = same
                error = verdict.wrong(bitwise_equal=same)
        return error, facts

    def checked(self, point: dict, *, trace: list | None = None) -> dict:
        """The check's facts; PointFailed ("wrong") when it failed."""
        error, facts = self.check(point, trace=trace)
        if error:
            raise wrong(error, facts)
        return facts

    # ---- measure --------------------------------------------------------------------

    def __call__(self, point: dict) -> dict:
        variant = point.get("variant")
        if variant == "unfused":
            return self.unfused.measure(point)
        if variant == "deepgemm":
            return self.deepgemm.measure(point)
        if variant == "flashinfer":
            return self.flashinfer.measure(point)
        if variant == "gemm_ceiling":
            return self.ceiling.measure(point)
        return measure_point(
            point,
            lambda: self.checked(point),
            lambda facts: self._timed(point, facts),
            sampler=self.sampler,
        )

    def _timed(self, point: dict, facts: dict) -> Measured:
        prob = self.problem(point)
        events: list = []
        fn = lambda: prob.forward(  # noqa: E731
            point["schedule"], kernel_events=events, flushers=self.flushers
        )
        run_once = (
            timing.cuda_event_timer(fn, device=self.devices[0].index, flush_l2=self.policy.flush_l2)
            if self.cuda
            else timing.host_timer(fn)
        )
        times = timing.measure(run_once, self.policy)
        samples = {"time_us": list(times)}
        median = statistics.median(times)
        flops = prob.useful_flops() / len(self.devices)
        nvlink = prob.nvlink_bytes()
        extra = {**facts, "tflops": flops / (median * 1e6)}
        if events:  # CUDA: each rank's kernel alone, from the events around it
            samples["kernel_us"] = [
                max(start.elapsed_time(end) * 1000.0 for start, end in ranks)
                for ranks in events[-len(times) :]
            ]
            extra["tflops_kernel"] = flops / (statistics.median(samples["kernel_us"]) * 1e6)
        extra |= {
            "nvlink_bytes": int(sum(nvlink)),
            "nvlink_bytes_per_rank": nvlink,
            "padded_rows_per_rank": prob.padded_rows(),
            "tiles_per_rank": [int(rb.tiles[point["schedule"]].shape[0]) for rb in prob.ranks],
            "stop_reason": times.stop_reason,
        }
        line = (
            f"  time_us={median:.1f} tflops={extra['tflops']:.0f} err={max(facts['rel_error']):.2e}"
        )
        return Measured(samples, extra, line=line)

    def close(self) -> None:
        self.deepgemm.close()
        self.flashinfer.close()

    # ---- the traced runs --------------------------------------------------------------

    def trace(self, point: dict, keep_timeline: bool) -> dict:
        """One instrumented run (after one warm-up run) of a schedule or the control."""
        bufs: list = []

        def check() -> dict:
            if not self.cuda:
                raise PointFailed(TRACE_NEEDS_GPU, status="unsupported")
            prob = self.problem(point)
            bufs[:] = [
                self.torch.zeros(
                    rb.tiles[point["schedule"]].shape[0], 6, dtype=self.torch.int64, device=d
                )
                for rb, d in zip(prob.ranks, self.devices, strict=True)
            ]
            return self.checked(point, trace=bufs)  # also the warm-up (and the compile)

        def measure(facts: dict) -> Measured:
            prob = self.problem(point)
            for b in bufs:
                b.zero_()
            local = point.get("variant") == LOCAL_CONTROL
            prob.forward(point["schedule"], local=local, trace=bufs)
            prob.synchronize()
            stamps = [b.cpu().numpy() for b in bufs]
            tiles = [rb.tiles[point["schedule"]].cpu().numpy() for rb in prob.ranks]
            spans, extra = trace_summary(stamps, tiles, keep_timeline)
            waits = linear2_waits(stamps, tiles)
            line = (
                f"  store span median {np.median(spans) if spans else math.nan:.2f} us, "
                f"kernel {extra['time_us']:.1f} us"
            )
            return Measured(
                {"store_span_us": spans, "wait_us": waits},
                {**facts, **extra},
                correct=None if local else True,
                line=line,
            )

        return measure_point(point, check, measure, sampler=self.sampler)


def valid_local_slots(rb, prob) -> object:
    """Indices of the local-control sink rows this rank's kernel should have written."""
    T, topk = prob.point["tokens_per_rank"], prob.point["topk"]
    plan = rb.plan
    slots = plan.home[plan.home >= 0] * T * topk + plan.slot[plan.home >= 0]
    return prob.torch.as_tensor(slots, device=rb.sink.device)
