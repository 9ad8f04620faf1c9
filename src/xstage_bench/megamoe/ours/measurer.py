"""Our fused kernel measured from one process that drives every GPU: the check and the
paired timed runs of one configuration's arms, and the instrumented (traced) runs.

`MoEMeasurer(point) -> record` is what sweep.run_sweep calls. It keeps the current
configuration's problem (a configuration's arms and baselines run back to back on the
same inputs) and its shape's weights, and hands the baselines' points to
baselines/measure.py.

Our kernel's arms of one configuration (points.arm_sets: expert waves, interleaved at the
main lead, the lead map's leads) are measured together when the sweep asks for the first
of them (paired.measure_arms: one clock sample around the set, each arm checked, the
arms that passed timed in paired rounds by timing.measure_paired); the other arms'
records are handed out from a cache as the sweep asks for them. The runner drops a
partly recorded set before resuming (runner.drop_unpaired), so arms are never paired
across runs.

The check of an arm: the outputs (and host combine buffers) are poisoned (NaN), one layer
runs, and verdict.py judges it (error flags, unwritten rows: host rows first, sampled
tokens of every home rank against the torch reference, an interleaved output bitwise
equal to expert-wave's). Timing goes through the timing module (CUDA events on GPU 0,
whose stream waits for every rank's kernel and combine); compilation happens in the
check, so it is never timed.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from xstage_bench.data import storepath
from xstage_bench.data.grid import layer_from
from xstage_bench.measurement import log, timing
from xstage_bench.measurement.clocks import ClockSampler
from xstage_bench.measurement.protocol import Measured, PointFailed, measure_point, wrong
from xstage_bench.megamoe import ceiling, reference, schedule
from xstage_bench.megamoe.baselines.measure import (
    DeepGemmBaseline,
    FlashInferBaseline,
    GemmCeiling,
    UnfusedBaseline,
)
from xstage_bench.megamoe.ours import verdict
from xstage_bench.megamoe.ours.paired import compared_ratios, measure_arms
from xstage_bench.megamoe.ours.summary import linear2_waits, trace_summary
from xstage_bench.megamoe.points import (
    CHECK_TOKENS,
    CPU_PROGRAMS,
    LOCAL_CONTROL,
    config_id,
    lead_failure,
    sampled_tokens,
)

# What a worker baseline's process may hold at its peak, in copies of one rank's stored
# weights: FlashInfer's DeepSeek-V4-Pro worker on one H200 held its bf16 weights (2x), asked
# for one more bf16 FC1 block while it converted them, and keeps an FP8 copy of its own.
WORKER_WEIGHT_COPIES = 5
WORKER_HEADROOM_BYTES = 16 << 30  # its tokens, buffers, NVSHMEM heap and CUDA context
TRACE_NEEDS_GPU = "the traced build reads %globaltimer, which the Triton interpreter cannot run"

# Expert waves' arm key when the device decides: its output is compared bitwise like the list's.
WAVE_ON_DEVICE = schedule.WAVE + schedule.DEVICE_SUFFIX
_log = log.get(__name__)


def worker_need_bytes(point: dict) -> int:
    """The GPU memory a worker baseline's process may need for a point (see
    WORKER_WEIGHT_COPIES): one rank's experts' weights as stored, times the copies, plus
    the headroom."""
    return int(WORKER_WEIGHT_COPIES * ceiling.weight_bytes(point)) + WORKER_HEADROOM_BYTES


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
        arm_sets: dict[str, list[dict]] | None = None,
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
        self._reference: tuple | None = None  # (the intermediate's format, the outputs)
        self.tokens: list[np.ndarray] = []  # the sampled tokens of every home rank
        self._outputs: dict[str, list] = {}
        self.arm_sets = arm_sets or {}  # config id -> our arms, measured together
        self._set_records: dict[str, dict[str, dict]] = {}  # the arms not yet handed out
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
        from xstage_bench.megamoe.layer.inputs import make_expert_weights
        from xstage_bench.megamoe.layer.problem import MoEProblem

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
        self.tokens = self._sampled_tokens(point)
        return self._problem

    def _sampled_tokens(self, point: dict) -> list[np.ndarray]:
        """The tokens of each rank whose outputs every check compares."""
        return sampled_tokens(
            point["tokens_per_rank"], self.check_tokens, len(self.devices), self.seed
        )

    def worker_inputs(self, point: dict) -> tuple[dict, list[np.ndarray]]:
        """What a worker baseline is told to rebuild the configuration's inputs from (the
        point as the problem reads it, the sampled tokens of each rank), without building
        the problem here: its weights would hold the GPU memory the workers need."""
        from xstage_bench.megamoe.layer.problem import problem_point

        return problem_point(point, self.moe), self._sampled_tokens(point)

    def reference(self) -> list:
        """The reference outputs of the sampled tokens, for the kernel build in force (an
        A/B's arms can differ in what they round: kernel_ab)."""
        prob = self._problem
        fmt = reference.ours_for(prob.precision, prob.homes[0].xq)
        if self._reference is None or self._reference[0] != fmt:
            outputs = reference.reference_outputs(
                prob.homes, prob.experts, self.tokens, prob.precision, intermediate_format=fmt
            )
            self._reference = (fmt, outputs)
        return self._reference[1]

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
        """(error or None, facts) for one poisoned run of the point's arm."""
        prob = self.problem(point)
        torch = self.torch
        local = point.get("variant") == LOCAL_CONTROL
        key = prob.arm(point, graphed=trace is None and not local)  # before the poison
        prob.poison(local=local)
        prob.forward(key, local=local, trace=trace)
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
        error = (
            verdict.flagged(flags)
            or verdict.unwritten(prob.host_unwritten(), rows="host combine rows")
            or prob.realized_order_error(key, point)
        )
        if error:
            return error, facts
        outs = prob.checked_outputs()
        nan = [q for q, o in enumerate(outs) if torch.isnan(o).any()]
        error = verdict.wrong(flags=flags, nan=nan)
        if error:
            return error, facts
        errors = self.errors(outs)
        facts["rel_error"] = errors
        facts["checked_tokens_per_rank"] = len(self.tokens[0])
        if prob.host_homed is not None:
            facts["checked_host_tokens_per_rank"] = [
                int(np.isin(t, h).sum()) for t, h in zip(self.tokens, prob.host_tokens, strict=True)
            ]
        error = verdict.wrong(errors=errors, tolerance=self.tolerance)
        if error is None and trace is None:
            self._outputs[key] = [o.clone() for o in outs]
            waves = (schedule.WAVE, WAVE_ON_DEVICE)  # an expert-wave output, not this arm's
            first = next((self._outputs[k] for k in waves if k != key and k in self._outputs), None)
            if first is not None:
                same = all(torch.equal(a, b) for a, b in zip(first, outs, strict=True))
                facts["bitwise_equal_to_expert_wave"] = same
                error = verdict.wrong(bitwise_equal=same)
        return error, facts

    def checked(self, point: dict, *, trace: list | None = None) -> dict:
        """The check's facts; PointFailed ("wrong") when it failed, ("failed") when its lead
        could not be chosen."""
        failure = lead_failure(point)
        if failure is not None:
            raise failure
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
            self._room_for_workers(point)
            return self.deepgemm.measure(point)
        if variant == "flashinfer":
            self._room_for_workers(point)
            return self.flashinfer.measure(point)
        if variant == "gemm_ceiling":
            return self.ceiling.measure(point)
        return self._ours(point)

    def _room_for_workers(self, point: dict) -> None:
        """Drop what this process holds of the configuration when GPU 0 has less memory
        free than the worker baseline may need (worker_need_bytes): it builds its own copy
        of the weights in another process. On
        one H200, DeepSeek-V4-Pro's DeepGEMM workers ran out of memory beside the unfused
        pipeline's weights, and FlashInfer's (bf16 weights in, its FP8 copy beside them)
        beside our layer's. Whatever is dropped is rebuilt when a point asks for it."""
        if not self.cuda:
            return
        free, _ = self.torch.cuda.mem_get_info(self.devices[0])
        if free < worker_need_bytes(point):
            self.unfused.forget()  # its pipeline holds the weights too
            self.unfused.forget_weights()
            self.forget_configuration()

    def forget_configuration(self) -> None:
        """Drop our layer's problem, reference, kept outputs and weights (problem()
        rebuilds them)."""
        self._problem_id = self._problem = self._reference = None
        self._outputs = {}
        self._weights, self._weights_key = [], None
        if self.cuda:
            self.torch.cuda.empty_cache()

    def _ours(self, point: dict) -> dict:
        """The point's record from its configuration's paired set, measured when the first
        arm of the set is asked for (see module doc)."""
        cid = config_id(point)
        cached = self._set_records.get(cid, {})
        if point["id"] in cached:
            return cached.pop(point["id"])
        arms = self.arm_sets.get(cid) or [point]
        if point["id"] not in {a["id"] for a in arms}:
            arms = [point]
        records = measure_arms(arms, self.checked, self._timed_arms, sampler=self.sampler)
        record = records.pop(point["id"])
        self._set_records = {cid: records}  # an earlier set's leftovers are never asked for
        return record

    def _timed_arms(self, arms: list[dict], facts: dict[str, dict]) -> dict[str, Measured]:
        """Time the checked arms of one configuration together (timing.measure_paired):
        per arm time_us and kernel_us of every round, and the record's facts."""
        prob = self.problem(arms[0])
        events: dict[str, list] = {a["id"]: [] for a in arms}
        dispatches: dict[str, list] = {a["id"]: [] for a in arms}  # layer from home tokens
        keys = {a["id"]: prob.arm(a) for a in arms}
        leads = {a["id"]: timing.host_lead(self.policy) for a in arms}

        def timer(arm_id: str):
            def fn():
                prob.forward(
                    keys[arm_id],
                    kernel_events=events[arm_id],
                    flushers=self.flushers,
                    dispatch_events=dispatches[arm_id],
                )

            if self.cuda:
                return timing.cuda_event_timer(
                    fn,
                    device=self.devices[0].index,
                    flush_l2=self.policy.flush_l2,
                    lead=leads[arm_id],
                )
            return timing.host_timer(fn)

        ids = [a["id"] for a in arms]
        times = timing.measure_paired(
            {i: timer(i) for i in ids}, self.policy, ratios=compared_ratios(arms)
        )
        flops = prob.useful_flops() / len(self.devices)
        nvlink, host = prob.nvlink_bytes(), prob.host_bytes()
        remote = prob.remote_bytes()
        out = {}
        for arm in arms:
            i = arm["id"]
            t = times[i]
            kernel_us = timing.slowest_rank_us(events[i], len(t))
            median = statistics.median(t)
            extra = {
                **facts[i],
                "tflops": flops / (median * 1e6),
                "tflops_kernel": flops / (statistics.median(kernel_us) * 1e6),
                "paired": timing.paired_extra(ids, i, t),
                "remote_bytes": int(sum(remote)),
                "remote_bytes_per_rank": remote,
                "nvlink_bytes": int(sum(nvlink)),
                "nvlink_bytes_per_rank": nvlink,
                "padded_rows_per_rank": prob.padded_rows(),
                "tiles_per_rank": [int(rb.claimed(keys[i]).shape[0]) for rb in prob.ranks],
                "stop_reason": t.stop_reason,
                "launch": prob.launch_mode(),
                "layer_from": layer_from(self.moe),  # what time_us covers
                **timing.lead_facts(leads[i]),
            }
            if prob.path == storepath.HOST:
                extra["host_bytes"] = int(sum(host))
                extra["host_bytes_per_rank"] = host
                extra["host_tokens_per_rank"] = [len(h) for h in prob.host_tokens]
            line = (
                f"  {i}: time_us={median:.1f} kernel_us={statistics.median(kernel_us):.1f} "
                f"tflops={extra['tflops']:.0f} err={max(facts[i]['rel_error']):.2e}"
            )
            samples = {"time_us": list(t), "kernel_us": kernel_us}
            if dispatches[i]:  # the same rounds' dispatches
                samples["dispatch_us"] = timing.slowest_rank_us(dispatches[i], len(t))
            out[i] = Measured(samples, extra, correct=True, line=line)
        return out

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
            key = prob.arm(point)
            bufs[:] = prob.trace_buffers(key)
            return self.checked(point, trace=bufs)  # also the warm-up (and the compile)

        def measure(facts: dict) -> Measured:
            prob = self.problem(point)
            for b in bufs:
                b.zero_()
            local = point.get("variant") == LOCAL_CONTROL
            key = prob.arm(point)
            prob.forward(key, local=local, trace=bufs)
            prob.synchronize()
            stamps, tiles = prob.traced(key, bufs)
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
