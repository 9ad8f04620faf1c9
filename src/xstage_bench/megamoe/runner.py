"""Measure the fused MoE kernel (and the baselines a user would pick instead) over the
configured grid and write its raw files.

    python -m xstage_bench.megamoe.runner --config config.yaml --dataset h200x2 \
        --out results/h200x2/raw/megamoe.json --trace-out results/h200x2/raw/megamoe_trace.json

One record per (configuration, schedule) of our kernel, id '<config id>/<schedule>'; with
`megamoe.variants` (default: ours, unfused, deepgemm) also one record per configuration of
the unfused torch pipeline ('<config id>/unfused', baselines/unfused.py) and one per
(configuration, schedule) of DeepGEMM's SM90 MegaMoE ('<config id>/deepgemm/<schedule>',
baselines/deepgemm.py), each measured right after our kernel on the same inputs and
checked against the same reference before it is timed. Every record of ours is checked: the
outputs are poisoned (NaN), one layer runs, the error flag of every rank must be clear,
no output may be NaN, sampled tokens of every home rank must match the torch reference
(reference.py) within its tolerance, and the interleaved output must be bitwise equal to
the expert-wave output of the same configuration. A point that fails is recorded
"wrong" and not timed. Timing goes through the timing module (CUDA events on GPU 0, whose
stream waits for every rank's kernel and combine); compilation happens in the check, so it
is never timed. Weights are made once per (shape, precision) and reused by that shape's
routings and sizes.

The trace file holds, for a few configurations, one instrumented run (TRACE build) of
each schedule and of the local-store control: per-tile %globaltimer stamps, the remote-
store span of every Linear-2 tile (all ranks), and, for the first configuration, the
per-program timeline of rank 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from xstage_bench import grid, timing
from xstage_bench.clocks import ClockSampler, record_fields
from xstage_bench.config import load_config
from xstage_bench.environment import capture_measured
from xstage_bench.megamoe import reference, schedule
from xstage_bench.megamoe.baselines import VARIANTS, deepgemm, unfused
from xstage_bench.results import failed_record, ok_record
from xstage_bench.stats import geomean
from xstage_bench.sweep import run_sweep

CPU_PROGRAMS = 3  # persistent programs per rank under the Triton interpreter
TRACE_NEEDS_GPU = "the traced build reads %globaltimer, which the Triton interpreter cannot run"
POINT_TIMEOUT_S = 600.0  # spins are bounded in the kernel; this is only a last resort
CHECK_TOKENS = 32  # tokens of every home rank compared with the reference
LOCAL_CONTROL = "local_control"
NS_PER_US = 1000.0


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def expand_schedules(points: list[dict], schedules: Sequence[str]) -> list[dict]:
    """One point per (configuration, schedule); id '<config id>/<schedule>'."""
    return [{**p, "schedule": s, "id": f"{p['id']}/{s}"} for p in points for s in schedules]


def expand_points(points: list[dict], megamoe: dict) -> list[dict]:
    """Per configuration, in this order so that they share its inputs: our kernel's
    schedules, the unfused pipeline, DeepGEMM's schedules (as `megamoe.variants` asks)."""
    variants = megamoe.get("variants", list(VARIANTS))
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown megamoe variant(s) {unknown}; known: {list(VARIANTS)}")
    out = []
    for p in points:
        if "ours" in variants:
            out += expand_schedules([p], megamoe["schedules"])
        if "unfused" in variants:
            out.append(
                {**p, "variant": "unfused", "schedule": "unfused", "id": f"{p['id']}/unfused"}
            )
        if "deepgemm" in variants:
            out += [
                {**p, "variant": "deepgemm", "schedule": s, "id": f"{p['id']}/deepgemm/{s}"}
                for s in megamoe["schedules"]
            ]
    return out


def trace_points(points: list[dict], tokens: int | None = None) -> list[dict]:
    """The traced configurations: per shape, W8A8 (else the first precision), skewed
    routing (else the first), the fewest tokens (or `tokens`); each under expert waves,
    interleaved and the local-store control (expert waves, every store local)."""
    if not points:
        return []
    want = tokens if tokens is not None else min(p["tokens_per_rank"] for p in points)

    def preference(p: dict) -> tuple[bool, bool]:
        return (p["precision"] != "w8a8", p["routing"] != "skewed")

    chosen: dict[str, dict] = {}
    for p in points:
        if p["tokens_per_rank"] == want and (
            p["shape"] not in chosen or preference(p) < preference(chosen[p["shape"]])
        ):
            chosen[p["shape"]] = p
    out = []
    for p in chosen.values():
        for variant in ("expert_wave", "interleaved", LOCAL_CONTROL):
            sched = "expert_wave" if variant == LOCAL_CONTROL else variant
            out.append({**p, "schedule": sched, "variant": variant, "id": f"{p['id']}/{variant}"})
    return out


def sampled_tokens(T: int, check_tokens: int, world_size: int, seed: int) -> list[np.ndarray]:
    """The home tokens of every rank whose outputs are checked against the reference."""
    rng = np.random.default_rng(seed)
    n = min(T, check_tokens)
    return [np.sort(rng.choice(T, n, replace=False)) for _ in range(world_size)]


def config_id(point: dict) -> str:
    """The grid id of a point's configuration (its id less the variant and schedule)."""
    return point["id"].rsplit("/", 2 if point.get("variant") == "deepgemm" else 1)[0]


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
        self._unfused_reference: list | None = None
        self._tokens: list[np.ndarray] = []
        self._outputs: dict[str, list] = {}
        self._unfused = None  # unfused.UnfusedMoE of the current configuration
        self._unfused_weights: dict = {}  # its weights, per shape and precision
        self.deepgemm = deepgemm.DeepGemmWorkers(len(devices))
        self._deepgemm: tuple | None = None  # (config id, worker results or the failure)
        self.baseline_budget_s = baseline_budget_s  # what is left of DeepGEMM's wall time

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
        self._problem = self._reference = self._unfused = self._unfused_reference = None
        self._outputs = {}
        key = (point["shape"], point["precision"])
        if key != self._weights_key:
            self._weights = []
            self._unfused_weights = {}
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
        self._tokens = sampled_tokens(
            point["tokens_per_rank"], self.check_tokens, len(self.devices), self.seed
        )
        return self._problem

    def reference(self) -> list:
        if self._reference is None:
            prob = self._problem
            self._reference = reference.reference_outputs(
                prob.homes, prob.experts, self._tokens, prob.precision
            )
        return self._reference

    def errors(self, outputs: list, ref: list | None = None) -> list[float]:
        """Relative error of each rank's sampled output rows against the reference."""
        torch = self.torch
        ref = self.reference() if ref is None else ref
        return [
            reference.relative_error(o[torch.as_tensor(t, device=o.device)], r)
            for o, t, r in zip(outputs, self._tokens, ref, strict=True)
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
        if any(flags):
            return f"a Linear-2 tile timed out waiting for its rows (error flags {flags})", facts
        if local:
            sinks = [rb.sink for rb in prob.ranks]
            missing = [
                q
                for q, (rb, s) in enumerate(zip(prob.ranks, sinks, strict=True))
                if torch.isnan(s[valid_local_slots(rb, prob)]).any()
            ]
            if missing:
                return f"local control left rows unwritten on ranks {missing}", facts
            return None, facts
        outs = prob.outputs()
        nan = [q for q, o in enumerate(outs) if torch.isnan(o).any()]
        if nan:
            return f"output rows left NaN (unwritten) on ranks {nan}", facts
        errors = [
            reference.relative_error(o[torch.as_tensor(t, device=o.device)], ref)
            for o, t, ref in zip(outs, self._tokens, self.reference(), strict=True)
        ]
        facts["rel_error"] = errors
        facts["checked_tokens_per_rank"] = len(self._tokens[0])
        if max(errors) > self.tolerance:
            return (
                f"relative error vs the torch reference {max(errors):.3g} > "
                f"{self.tolerance:g} (per rank {[f'{e:.3g}' for e in errors]})",
                facts,
            )
        if trace is None:
            self._outputs[point["schedule"]] = [o.clone() for o in outs]
            first = self._outputs.get("expert_wave")
            if point["schedule"] != "expert_wave" and first is not None:
                same = all(torch.equal(a, b) for a, b in zip(first, outs, strict=True))
                facts["bitwise_equal_to_expert_wave"] = same
                if not same:
                    return "output differs bitwise from the expert-wave schedule", facts
        return None, facts

    # ---- measure --------------------------------------------------------------------

    def __call__(self, point: dict) -> dict:
        variant = point.get("variant")
        if variant == "unfused":
            return self.measure_unfused(point)
        if variant == "deepgemm":
            return self.measure_deepgemm(point)
        before = self.sampler.sample()
        prob = self.problem(point)
        error, facts = self.check(point)
        if error:
            _say(f"  {point['id']}: wrong: {error}")
            return failed_record(
                point["id"], point, error, status="wrong", correct=False, extra=facts
            )
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
        fields = record_fields(before, self.sampler.sample())
        _say(
            f"  time_us={median:.1f} tflops={extra['tflops']:.0f} err={max(facts['rel_error']):.2e}"
        )
        return ok_record(
            point["id"],
            point,
            samples,
            correct=True,
            extra=extra,
            **fields,
        )

    # ---- the baselines ----------------------------------------------------------------

    def _join_ranks(self) -> None:
        """GPU 0's stream waits for every other rank's work; their L2s are then flushed
        (GPU 0's is flushed by the timer, before its start event)."""
        torch = self.torch
        s0 = torch.cuda.current_stream(self.devices[0])
        for q, d in enumerate(self.devices[1:], start=1):
            with torch.cuda.device(d):
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(d))
                s0.wait_event(done)
                if self.flushers:
                    self.flushers[q]()

    def measure_unfused(self, point: dict) -> dict:
        """Check every GEMM path of the unfused pipeline, time the faster one fully."""
        before = self.sampler.sample()
        prob = self.problem(point)
        if self._unfused is None:
            self._unfused = unfused.UnfusedMoE(prob, self._unfused_weights)
        pipe = self._unfused
        device = self.devices[0].index
        path_errors: dict[str, str] = {}
        quick: dict[str, float] = {}
        rel: dict[str, list[float]] = {}
        for gemm in unfused.gemm_paths(prob.precision):
            try:
                pipe.poison()
                pipe.forward(gemm)
                prob.synchronize()
                if self._unfused_reference is None:
                    self._unfused_reference = reference.reference_outputs(
                        prob.homes,
                        prob.experts,
                        self._tokens,
                        prob.precision,
                        intermediate_format=unfused.FORMAT,
                    )
                errors = self.errors(pipe.outputs(), self._unfused_reference)
            except Exception as e:  # a GEMM this torch cannot run: try the other path
                path_errors[gemm] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                continue
            rel[gemm] = errors
            bound = unfused.tolerance(gemm, self.tolerance)
            if max(errors) > bound:
                path_errors[gemm] = f"relative error {max(errors):.3g} > {bound:g}"
                continue
            once = timing.cuda_event_timer(
                lambda g=gemm: (pipe.forward(g), self._join_ranks()), device=device, flush_l2=False
            )
            quick[gemm] = statistics.median(once() for _ in range(3))
        facts = {"gemm_errors": path_errors, "rel_error_by_gemm": rel}
        if not quick:
            wrong = any("relative error" in e for e in path_errors.values())
            text = "; ".join(f"{g}: {e}" for g, e in path_errors.items())
            _say(f"  {point['id']}: {text}")
            return failed_record(
                point["id"], point, text, status="wrong" if wrong else "failed", extra=facts
            )
        gemm = min(quick, key=quick.get)
        run_once = timing.cuda_event_timer(
            lambda: (pipe.forward(gemm), self._join_ranks()),
            device=device,
            flush_l2=self.policy.flush_l2,
        )
        times = timing.measure(run_once, self.policy)
        median = statistics.median(times)
        flops = prob.useful_flops() / len(self.devices)
        nvlink = unfused.exchange_bytes([rb.plan for rb in prob.ranks], point["H"], prob.precision)
        extra = {
            **facts,
            "gemm": gemm,
            "gemm_quick_us": quick,
            "rel_error": rel[gemm],
            "checked_tokens_per_rank": len(self._tokens[0]),
            "tflops": flops / (median * 1e6),
            "nvlink_bytes": int(sum(nvlink)),
            "nvlink_bytes_per_rank": nvlink,
            "stop_reason": times.stop_reason,
        }
        _say(f"  unfused ({gemm}) time_us={median:.1f} err={max(rel[gemm]):.2e} quick={quick}")
        return ok_record(
            point["id"],
            point,
            {"time_us": list(times)},
            correct=True,
            extra=extra,
            **record_fields(before, self.sampler.sample()),
        )

    def _deepgemm_results(self, point: dict) -> tuple[list | None, str | None]:
        """The worker results of the point's configuration (run once for both schedules),
        or why there are none."""
        cid = config_id(point)
        if self._deepgemm is not None and self._deepgemm[0] == cid:
            return self._deepgemm[1], self._deepgemm[2]
        timeout = deepgemm.DEFAULT_JOB_TIMEOUT_S
        if self.baseline_budget_s is not None:
            timeout = min(timeout, self.baseline_budget_s)
        if timeout <= 0:
            results, failure = None, "not run: this run's DeepGEMM time budget was spent"
        else:
            prob = self.problem(point)
            job = {
                "point": prob.point,
                "seed": self.seed,
                "tokens": [t.tolist() for t in self._tokens],
                "policy": dataclasses.asdict(self.policy),
            }
            start = time.monotonic()
            try:
                results, failure = self.deepgemm.run(job, timeout), None
            except (TimeoutError, RuntimeError) as e:
                results, failure = None, str(e)
            if self.baseline_budget_s is not None:
                self.baseline_budget_s -= time.monotonic() - start
        self._deepgemm = (cid, results, failure)
        return results, failure

    def measure_deepgemm(self, point: dict) -> dict:
        reason = deepgemm.unsupported_reason(point)
        if reason:
            return failed_record(point["id"], point, reason, status="unsupported")
        before = self.sampler.sample()
        results, failure = self._deepgemm_results(point)
        if failure is not None:
            status = "timeout" if "no answer" in failure else "failed"
            return failed_record(point["id"], point, failure, status=status)
        errors = [f"rank {q}: {r.error}" for q, r in enumerate(results) if r.error]
        if errors:
            # its host-side checks (DG_HOST_ASSERT) reject a shape on every rank alike
            # (a missing sgl-deep-gemm is unsupported here too, as a missing FA3 is)
            rejected = all(
                "assert" in r.error.lower() or r.error.startswith("ModuleNotFoundError")
                for r in results
            )
            return failed_record(
                point["id"],
                point,
                "; ".join(errors),
                status="unsupported" if rejected else "failed",
            )
        first = results[0]
        ran = deepgemm.schedule_of(first.config_line)
        facts = {
            "deepgemm_version": first.version,
            "deepgemm_torch": first.torch_version,
            "deepgemm_config": first.config_line,
            "deepgemm_schedule": deepgemm.SCHEDULE_NAMES.get(ran, "unknown"),
            "first_call_s": [r.first_call_s for r in results],
        }
        if ran is None:
            return failed_record(
                point["id"],
                point,
                "DeepGEMM printed no MegaMoESM90Config (DG_PRINT_CONFIGS): which schedule ran "
                f"is unknown; printed: {first.config_line!r}",
                status="failed",
                extra=facts,
            )
        if ran != point["schedule"]:
            return failed_record(
                point["id"],
                point,
                f"sgl-deep-gemm {first.version} chose its {deepgemm.SCHEDULE_NAMES[ran]} "
                f"schedule for this configuration and has no knob for its "
                f"{deepgemm.SCHEDULE_NAMES[point['schedule']]} schedule (buffers of >= 1024 "
                f"tokens per rank run L2-lag); it ran: {first.config_line}",
                status="unsupported",
                extra=facts,
            )
        prob = self.problem(point)
        fmt = reference.Intermediate(block=first.block, weighted=True)
        ref = reference.reference_outputs(
            prob.homes, prob.experts, self._tokens, prob.precision, intermediate_format=fmt
        )
        outs = [
            self.torch.as_tensor(r.rows, device=d)
            for r, d in zip(results, self.devices, strict=True)
        ]
        rel = [reference.relative_error(o, f) for o, f in zip(outs, ref, strict=True)]
        facts.update(
            rel_error=rel,
            rel_error_vs_our_format=[
                reference.relative_error(o, f) for o, f in zip(outs, self.reference(), strict=True)
            ],
            checked_tokens_per_rank=len(self._tokens[0]),
            intermediate_block=first.block,
        )
        nan = [q for q, r in enumerate(results) if r.nan_rows]
        if nan or max(rel) > self.tolerance:
            text = (
                f"output rows left NaN on ranks {nan}"
                if nan
                else f"relative error vs the torch reference {max(rel):.3g} > "
                f"{self.tolerance:g} (per rank {[f'{e:.3g}' for e in rel]})"
            )
            return failed_record(
                point["id"], point, text, status="wrong", correct=False, extra=facts
            )
        times = first.times_us
        median = statistics.median(times)
        flops = prob.useful_flops() / len(self.devices)
        nvlink = unfused.exchange_bytes([rb.plan for rb in prob.ranks], point["H"], prob.precision)
        facts.update(
            tflops=flops / (median * 1e6),
            nvlink_bytes=int(sum(nvlink)),
            nvlink_bytes_per_rank=nvlink,
        )
        _say(
            f"  deepgemm ({facts['deepgemm_schedule']}) time_us={median:.1f} "
            f"err={max(rel):.2e} first call {max(facts['first_call_s']):.1f} s"
        )
        return ok_record(
            point["id"],
            point,
            {"time_us": times},
            correct=True,
            extra=facts,
            **record_fields(before, self.sampler.sample()),
        )

    def close(self) -> None:
        self.deepgemm.close()

    def trace(self, point: dict, keep_timeline: bool) -> dict:
        """One instrumented run (after one warm-up run) of a schedule or the control."""
        if not self.cuda:
            return failed_record(point["id"], point, TRACE_NEEDS_GPU, status="unsupported")
        torch = self.torch
        before = self.sampler.sample()
        prob = self.problem(point)
        bufs = [
            torch.zeros(rb.tiles[point["schedule"]].shape[0], 6, dtype=torch.int64, device=d)
            for rb, d in zip(prob.ranks, self.devices, strict=True)
        ]
        error, facts = self.check(point, trace=bufs)  # also the warm-up (and the compile)
        if error:
            return failed_record(
                point["id"], point, error, status="wrong", correct=False, extra=facts
            )
        for b in bufs:
            b.zero_()
        prob.forward(point["schedule"], local=point.get("variant") == LOCAL_CONTROL, trace=bufs)
        prob.synchronize()
        stamps = [b.cpu().numpy() for b in bufs]
        tiles = [rb.tiles[point["schedule"]].cpu().numpy() for rb in prob.ranks]
        spans, extra = trace_summary(stamps, tiles, keep_timeline)
        waits = linear2_waits(stamps, tiles)
        fields = record_fields(before, self.sampler.sample())
        _say(
            f"  store span median {np.median(spans) if spans else math.nan:.2f} us, "
            f"kernel {extra['time_us']:.1f} us"
        )
        correct = None if point.get("variant") == LOCAL_CONTROL else True
        return ok_record(
            point["id"],
            point,
            {"store_span_us": spans, "wait_us": waits},
            correct=correct,
            extra={**facts, **extra},
            **fields,
        )


def valid_local_slots(rb, prob) -> object:
    """Indices of the local-control sink rows this rank's kernel should have written."""
    T, topk = prob.point["tokens_per_rank"], prob.point["topk"]
    plan = rb.plan
    slots = plan.home[plan.home >= 0] * T * topk + plan.slot[plan.home >= 0]
    return prob.torch.as_tensor(slots, device=rb.sink.device)


def linear2_waits(stamps: list[np.ndarray], tiles: list[np.ndarray]) -> list[float]:
    """Every Linear-2 tile's wait for its row block (ready - taken), all ranks, us."""
    waits: list[float] = []
    for s, t in zip(stamps, tiles, strict=True):
        l2 = t[:, 0] == schedule.L2
        waits += ((s[l2, 2] - s[l2, 1]) / NS_PER_US).tolist()
    return waits


def trace_summary(
    stamps: list[np.ndarray], tiles: list[np.ndarray], keep_timeline: bool
) -> tuple[list[float], dict]:
    """Store spans of every Linear-2 tile (all ranks, us) and the run's facts; with
    keep_timeline, rank 0's [program, L1|L2, start, end, store_start, store_end] rows in
    us from its first tile (store stamps only for Linear-2 tiles)."""
    spans: list[float] = []
    kernel_us = []
    for s, t in zip(stamps, tiles, strict=True):
        if len(s) == 0:
            continue
        l2 = t[:, 0] == schedule.L2
        spans += ((s[l2, 5] - s[l2, 4]) / NS_PER_US).tolist()
        kernel_us.append((s[:, 5].max() - s[:, 1].min()) / NS_PER_US)
    extra: dict = {
        "time_us": float(max(kernel_us)) if kernel_us else 0.0,
        "stamp_fields": list(schedule.TRACE_FIELDS),
        "wait_us_median": [
            float(
                np.median((s[t[:, 0] == schedule.L2, 2] - s[t[:, 0] == schedule.L2, 1]) / NS_PER_US)
            )
            if (t[:, 0] == schedule.L2).any()
            else 0.0
            for s, t in zip(stamps, tiles, strict=True)
        ],
    }
    if keep_timeline and len(stamps[0]):
        s, t = stamps[0], tiles[0]
        t0 = s[:, 1].min()

        def us(v):
            return round(float(v - t0) / NS_PER_US, 4)

        extra["timeline"] = [
            [
                int(row[0]),
                "L1" if kind == schedule.L1 else "L2",
                us(row[1]),
                us(row[5]),
                us(row[4]) if kind == schedule.L2 else None,
                us(row[5]) if kind == schedule.L2 else None,
            ]
            for row, kind in zip(s.tolist(), t[:, 0].tolist(), strict=True)
        ]
    return spans, extra


def select(
    megamoe: dict, shapes=None, precisions=None, routings=None, tokens=None, variants=None
) -> dict:
    """The megamoe config restricted to the named shapes, precisions, routings, tokens and
    variants (ours, unfused, deepgemm)."""
    moe = dict(megamoe)
    if variants:
        moe["variants"] = list(variants)
    if shapes:
        known = {s["name"] for s in megamoe["shapes"]}
        unknown = sorted(set(shapes) - known)
        if unknown:
            raise ValueError(f"unknown megamoe shape(s) {unknown}; config has {sorted(known)}")
        moe["shapes"] = [s for s in megamoe["shapes"] if s["name"] in shapes]
    if precisions:
        moe["precisions"] = list(precisions)
    if routings:
        moe["routings"] = list(routings)
    if tokens:
        moe["tokens_per_rank"] = [int(t) for t in tokens]
    return moe


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


def raw_config(
    config: dict, moe: dict, world_size: int, check_tokens: int, device_type: str = "cuda"
) -> dict:
    from xstage_kernels import megamoe as kernel

    return {
        "megamoe": moe,
        "timing": config["timing"],
        "world_size": world_size,
        "kernel": {
            "source": "kernels/xstage_kernels/megamoe.py (Triton, persistent)",
            "block_m": kernel.BLOCK_M,
            "block_n": kernel.BLOCK_N,
            "block_k": kernel.BLOCK_K,
            "num_warps": kernel.NUM_WARPS,
            "num_stages": kernel.NUM_STAGES,
            "max_spin": kernel.MAX_SPIN,
        },
        "check": {
            "tokens_per_rank": check_tokens,
            "tolerance_rel_l2": reference.tolerance(device_type),
        },
        "definitions": {
            "time_us": "GPU 0 events around: every rank's fused kernel, the cross-GPU barrier "
            "and every home rank's top-k weighted reduction (dispatch excluded, done once)",
            "kernel_us": "max over ranks of the fused kernel alone (events on its stream)",
            "tflops": "useful FLOPs (6 H I per routed row, no padding) per GPU / median time_us",
            "nvlink_bytes": "bf16 output bytes the combine epilogues store into peers, all ranks",
        },
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
            },
            "deepgemm": {
                "source": "sgl-deep-gemm (PyPI) deep_gemm.fp8_mega_moe, SM90, "
                "src/xstage_bench/megamoe/baselines/deepgemm.py",
                "processes": "one torch.distributed (NCCL) process per GPU, symmetric memory",
                "schedule": "chosen by DeepGEMM's host heuristics, read from its printed "
                "MegaMoESM90Config (l2_lag_units > 0: L2-lag = interleaved, 0: wave)",
                "time_us": "slowest rank's CUDA-event time of one fp8_mega_moe call, after a "
                "barrier, inputs already in its symmetric buffer (its in-kernel dispatch, "
                "expert GEMMs, combine and top-k sum are inside)",
                "check": "sampled rows vs our reference told its intermediate format "
                "(per-`intermediate_block` FP8 scales, top-k weight before quantization)",
            },
        },
    }


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
) -> None:
    """Measure every (configuration, variant, schedule) and write raw/megamoe.json (`out`);
    with `trace_out`, the instrumented runs of the traced configurations too (ours only).
    `baseline_budget_s` bounds the wall time DeepGEMM may take in all (points past it are
    recorded failed, "not run"). device_type="cpu": every rank on the CPU under the Triton
    interpreter, our kernel only (CI's test of the rule; the traces are unsupported)."""
    from xstage_bench.megamoe.problem import enable_peer_access

    moe = megamoe or config["megamoe"]
    devices = default_devices(config, world_size, device_type)
    if device_type == "cpu":  # (TRITON_INTERPRET=1 must be set before triton loads)
        moe = {**moe, "variants": ["ours"]}
    elif len(devices) > 1:
        enable_peer_access(devices)
    policy = timing.TimingPolicy.from_config(config["timing"])
    measurer = MoEMeasurer(
        moe, policy, devices, check_tokens=check_tokens, baseline_budget_s=baseline_budget_s
    )
    configs = grid.megamoe_points(moe, len(devices))
    env = capture_measured(device_type)
    cfg = raw_config(config, moe, len(devices), check_tokens, device_type)
    try:
        run_sweep(
            expand_points(configs, moe),
            measurer,
            Path(out),
            experiment="megamoe",
            backend="cuda",
            dataset=dataset,
            environment=env,
            config=cfg,
            point_timeout_s=POINT_TIMEOUT_S,
        )
    finally:
        measurer.close()
    if trace_out is None:
        return
    points = trace_points(configs)
    first = points[0]["id"].rsplit("/", 1)[0] if points else None
    run_sweep(
        points,
        lambda p: measurer.trace(p, keep_timeline=config_id(p) == first),
        Path(trace_out),
        experiment="megamoe_trace",
        backend="cuda",
        dataset=dataset,
        environment=capture_measured(device_type),
        config=cfg,
        point_timeout_s=POINT_TIMEOUT_S,
    )


def print_summary(out: str | Path, trace_out: str | Path | None = None) -> None:
    """A short table of a raw megamoe file (and its trace file): per configuration our two
    schedules' median times and speedup, the baselines' times, our wave kernel's TFLOP/s;
    then the totals: our speedup and our best time over each baseline's best (geomeans)."""
    from xstage_bench.results import read_raw

    doc = read_raw(out)
    by_config: dict[str, dict] = {}
    for r in doc["records"]:
        key = (r["point"].get("variant") or "ours", r["point"]["schedule"])
        cid = config_id({"id": r["id"], "variant": r["point"].get("variant")})
        by_config.setdefault(cid, {})[key] = r
    columns = [
        ("wave us", ("ours", "expert_wave")),
        ("inter us", ("ours", "interleaved")),
        ("unfused", ("unfused", "unfused")),
        ("dg wave", ("deepgemm", "expert_wave")),
        ("dg lag", ("deepgemm", "interleaved")),
    ]
    print(
        f"{'configuration':50s} "
        + " ".join(f"{name:>9s}" for name, _ in columns)
        + f" {'speedup':>7s} {'TFLOP/s':>7s} {'rel err':>8s}"
    )
    speedups, ratios = [], {"unfused": [], "deepgemm": []}
    for cid, recs in by_config.items():
        cells = {}
        for name, key in columns:
            r = recs.get(key)
            ok = r is not None and r["status"] == "ok"
            cells[name] = r["summary"]["time_us"]["median"] if ok else None
        shown = [f"{cells[n]:9.1f}" if cells[n] else f"{'-':>9s}" for n, _ in columns]
        speed = (
            cells["wave us"] / cells["inter us"] if cells["wave us"] and cells["inter us"] else None
        )
        if speed:
            speedups.append(speed)
        ours = min((c for c in (cells["wave us"], cells["inter us"]) if c), default=None)
        for base, names in (("unfused", ["unfused"]), ("deepgemm", ["dg wave", "dg lag"])):
            best = min((cells[n] for n in names if cells[n]), default=None)
            if ours and best:
                ratios[base].append(ours / best)
        wave = recs.get(("ours", "expert_wave"))
        tflops = wave["extra"]["tflops"] if wave and wave["status"] == "ok" else None
        err = max((wave.get("extra") or {}).get("rel_error", [math.nan])) if wave else math.nan
        status = ",".join(sorted({r["status"] for r in recs.values() if r["status"] != "ok"}))
        print(
            f"{cid:50s} {' '.join(shown)} "
            f"{(f'{speed:7.3f}' if speed else '      -')} "
            f"{(f'{tflops:7.0f}' if tflops else '      -')} {err:8.1e} {status}"
        )
    if speedups:
        s = np.asarray(speedups)
        print(
            f"speedup interleaved/wave over {len(s)} configs: geomean "
            f"{geomean(s):.3f} median {np.median(s):.3f} "
            f"min {s.min():.3f} max {s.max():.3f}"
        )
    for base, values in ratios.items():
        if values:
            v = np.asarray(values)
            print(
                f"our best time / {base} best time over {len(v)} configs: geomean "
                f"{geomean(v):.3f} min {v.min():.3f} max {v.max():.3f}"
            )
    if trace_out is not None and Path(trace_out).exists():
        for r in read_raw(trace_out)["records"]:
            spans = (r.get("samples") or {}).get("store_span_us")
            text = (
                (
                    f"store span median {np.median(spans):.2f} us p90 "
                    f"{np.percentile(spans, 90):.2f} us n={len(spans)}"
                )
                if spans
                else ""
            )
            print(f"trace {r['id']}: {r['status']} {text} {r.get('error') or ''}")


def add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line options that restrict the MegaMoE grid (see `select`)."""
    parser.add_argument("--config", required=True, help="config.yaml")
    parser.add_argument("--dataset", required=True, help="dataset name")
    parser.add_argument("--shapes", help="comma-separated shape names (default: all)")
    parser.add_argument("--precisions", help="comma-separated: w4a8, w8a8, bf16")
    parser.add_argument("--routings", help="comma-separated: balanced, skewed")
    parser.add_argument("--tokens", help="comma-separated tokens per rank")
    parser.add_argument(
        "--check-tokens",
        type=int,
        default=CHECK_TOKENS,
        help="tokens per home rank compared with the reference",
    )


def selected_grid(args: argparse.Namespace) -> tuple[dict, dict]:
    """(config, its megamoe section restricted as the options of add_grid_arguments say)."""
    config = load_config(args.config)

    def split(value):
        return value.split(",") if value else None

    moe = select(
        config["megamoe"],
        split(args.shapes),
        split(args.precisions),
        split(args.routings),
        split(args.tokens),
        split(getattr(args, "variants", None)),
    )
    return config, moe


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_grid_arguments(parser)
    parser.add_argument("--out", required=True, type=Path, help="raw/megamoe.json to write")
    parser.add_argument("--trace-out", type=Path, help="raw/megamoe_trace.json to write")
    parser.add_argument("--variants", help="comma-separated: ours, unfused, deepgemm")
    parser.add_argument(
        "--baseline-budget-s", type=float, help="wall-time bound on all DeepGEMM runs"
    )
    parser.add_argument("--world-size", type=int, help="GPUs to use (default: config)")
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
    )
    print_summary(args.out, args.trace_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
