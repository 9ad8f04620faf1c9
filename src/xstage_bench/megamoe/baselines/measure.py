"""The baselines measured beside our kernel, on the same inputs and in the same sweep:
each checked against the same torch reference before it is timed, each through
protocol.measure_point. They share the MoEMeasurer's current problem (measurer.py).

unfused   every GEMM path checked, then each checked one timed fully with CUDA events
          on GPU 0 (whose stream waits for every rank); the record's samples are the
          fastest path's, every path's time is in its facts
gemm_ceiling  cuBLAS on the configuration's two GEMMs (megamoe/ceiling.py), its product
          checked against fp32 first
deepgemm  one run of its worker pair per configuration (both schedules' records come
          from it): DeepGEMM picks the schedule, its workers time it (timing.measure_fixed)
flashinfer  one run of its worker pair per configuration, one record: its kernel on
          inputs it staged once, timed by its workers as DeepGEMM's are
"""

from __future__ import annotations

import dataclasses
import statistics
import time

from xstage_bench.measurement import timing
from xstage_bench.measurement.protocol import Measured, PointFailed, measure_point, wrong
from xstage_bench.megamoe import ceiling, reference
from xstage_bench.megamoe.baselines import deepgemm, flashinfer, unfused
from xstage_bench.megamoe.baselines.worker_pair import WorkerPair
from xstage_bench.megamoe.ours import verdict
from xstage_bench.megamoe.points import config_id


class UnfusedBaseline:
    """The unfused torch pipeline of the measurer's current configuration."""

    def __init__(self, measurer):
        self.m = measurer
        self._pipe = None  # unfused.UnfusedMoE of the current configuration
        self._reference: list | None = None
        self._weights: dict = {}  # its weights, per shape and precision

    def forget(self) -> None:
        """A new configuration: drop the pipeline and its reference."""
        self._pipe = self._reference = None

    def forget_weights(self) -> None:
        """A new shape or precision: drop the converted weights too."""
        self._weights = {}

    def _join_ranks(self) -> None:
        """GPU 0's stream waits for every other rank's work; their L2s are then flushed
        (GPU 0's is flushed by the timer, before its start event)."""
        m = self.m
        torch = m.torch
        s0 = torch.cuda.current_stream(m.devices[0])
        for q, d in enumerate(m.devices[1:], start=1):
            with torch.cuda.device(d):
                done = torch.cuda.Event()
                done.record(torch.cuda.current_stream(d))
                s0.wait_event(done)
                if m.flushers:
                    m.flushers[q]()

    def measure(self, point: dict) -> dict:
        """Check every GEMM path of the unfused pipeline, time each checked one fully."""
        checked: list[str] = []
        return measure_point(
            point,
            lambda: self._check(point, checked),
            lambda facts: self._time(point, facts, checked),
            sampler=self.m.sampler,
        )

    def _check(self, point: dict, checked: list) -> dict:
        m = self.m
        prob = m.problem(point)
        if self._pipe is None:
            self._pipe = unfused.UnfusedMoE(prob, self._weights)
        pipe = self._pipe
        path_errors: dict[str, str] = {}
        rel: dict[str, list[float]] = {}
        for gemm in unfused.gemm_paths(prob.precision):
            try:
                pipe.poison()
                pipe.forward(gemm)
                prob.synchronize()
                if self._reference is None:
                    self._reference = reference.reference_outputs(
                        prob.homes,
                        prob.experts,
                        m.tokens,
                        prob.precision,
                        intermediate_format=unfused.FORMAT,
                    )
                errors = m.errors(pipe.outputs(), self._reference)
            except Exception as e:  # a GEMM this torch cannot run: try the other path
                path_errors[gemm] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                continue
            rel[gemm] = errors
            bound = unfused.tolerance(gemm, m.tolerance)
            if max(errors) > bound:
                path_errors[gemm] = f"relative error {max(errors):.3g} > {bound:g}"
                continue
            checked.append(gemm)
        facts = {"gemm_errors": path_errors, "rel_error_by_gemm": rel}
        if not checked:
            wrong_result = any("relative error" in e for e in path_errors.values())
            text = "; ".join(f"{g}: {e}" for g, e in path_errors.items())
            raise PointFailed(text, status="wrong" if wrong_result else "failed", extra=facts)
        return facts

    def _time(self, point: dict, facts: dict, checked: list) -> Measured:
        m = self.m
        prob, pipe = m.problem(point), self._pipe
        times_by_gemm, leads = {}, {}
        for gemm in checked:
            leads[gemm] = timing.host_lead(m.policy)
            run_once = timing.cuda_event_timer(
                lambda g=gemm: (pipe.forward(g), self._join_ranks()),
                device=m.devices[0].index,
                flush_l2=m.policy.flush_l2,
                lead=leads[gemm],
            )
            times_by_gemm[gemm] = timing.measure(run_once, m.policy)
        medians = {g: statistics.median(t) for g, t in times_by_gemm.items()}
        gemm = min(medians, key=medians.get)
        times = times_by_gemm[gemm]
        flops = prob.useful_flops() / len(m.devices)
        nvlink = unfused.exchange_bytes([rb.plan for rb in prob.ranks], point["H"], prob.precision)
        rel = facts["rel_error_by_gemm"]
        extra = {
            **facts,
            "gemm": gemm,
            "gemm_time_us": medians,
            "gemm_tflops": {g: flops / (us * 1e6) for g, us in medians.items()},
            "gemm_format": {g: unfused.GEMM_FORMAT[g] for g in medians},
            "rel_error": rel[gemm],
            "checked_tokens_per_rank": len(m.tokens[0]),
            "tflops": flops / (medians[gemm] * 1e6),
            "nvlink_bytes": int(sum(nvlink)),
            "nvlink_bytes_per_rank": nvlink,
            "stop_reason": times.stop_reason,
            **timing.lead_facts(leads[gemm]),
        }
        text = " ".join(f"{g}={us:.1f}" for g, us in medians.items())
        line = f"  unfused time_us: {text} (err {max(rel[gemm]):.2e})"
        return Measured({"time_us": list(times)}, extra, correct=True, line=line)


class GemmCeiling:
    """cuBLAS on the configuration's two GEMMs on GPU 0, and its roofline (ceiling.py)."""

    def __init__(self, measurer):
        self.m = measurer
        self._hbm_gbs: float | None = None

    def measure(self, point: dict) -> dict:
        # Clocks sampled like every other record (issue 26: a ceiling at a lower clock
        # than the kernel it bounds would flatter the kernel).
        return measure_point(
            point,
            lambda: self._check(point),
            lambda facts: self._time(point),
            sampler=self.m.sampler,
        )

    def _check(self, point: dict) -> dict:
        if not self.m.cuda:
            raise PointFailed("the GEMM ceiling is cuBLAS on a GPU", status="unsupported")
        err = ceiling.check_gemm(self.m.torch, point["precision"], self.m.devices[0])
        if err > ceiling.CHECK_TOLERANCE:
            raise wrong(f"cuBLAS product relative error {err:.3g} > {ceiling.CHECK_TOLERANCE}")
        return {"rel_error": err}

    def _time(self, point: dict) -> Measured:
        m = self.m
        if self._hbm_gbs is None:
            self._hbm_gbs = ceiling.measure_hbm_gbs(m.torch, m.devices[0], m.policy)
        times, facts = ceiling.measure_ceiling(
            m.torch, point, m.devices[0], m.policy, self._hbm_gbs
        )
        line = f"  ceiling {facts['tflops']:.0f} TFLOP/s, roofline {facts['roofline_us']:.1f} us"
        return Measured({"time_us": times}, facts, correct=True, line=line)


def _per_rank(errors: list[str | None]) -> str:
    """'rank 0: e0; rank 1: e1', or 'every rank: e' when they all failed alike; '' if none."""
    if errors and errors[0] and all(e == errors[0] for e in errors):
        return f"every rank: {errors[0]}"
    return "; ".join(f"rank {q}: {e}" for q, e in enumerate(errors) if e)


class PairBaseline:
    """A baseline run by a worker pair (worker_pair.py) on the measurer's current
    configuration; `budget_s` bounds the wall time all its runs may take (None:
    unbounded). One run per configuration serves all of its points."""

    name = ""  # in the message of a spent budget
    job_timeout_s = 300.0

    def __init__(self, measurer, task, budget_s: float | None = None):
        self.m = measurer
        self.workers = WorkerPair(task, len(measurer.devices), self.job_timeout_s)
        self.budget_s = budget_s  # what is left of its wall time
        self._last: tuple | None = None  # (config id, worker results, failure)

    def close(self) -> None:
        self.workers.close()

    def measure(self, point: dict) -> dict:
        return measure_point(
            point,
            lambda: self._check(point),
            lambda facts: self._time(point, facts),
            sampler=self.m.sampler,
        )

    def _check(self, point: dict) -> dict:
        raise NotImplementedError

    def _time(self, point: dict, facts: dict) -> Measured:
        raise NotImplementedError

    def _results(self, point: dict) -> tuple[list | None, str | None]:
        """The worker results of the point's configuration, or why there are none."""
        cid = config_id(point)
        if self._last is not None and self._last[0] == cid:
            return self._last[1], self._last[2]
        timeout = self.job_timeout_s
        if self.budget_s is not None:
            timeout = min(timeout, self.budget_s)
        if timeout <= 0:
            results, failure = None, f"not run: this run's {self.name} time budget was spent"
        else:
            m = self.m
            job_point, tokens = m.worker_inputs(point)
            job = {
                "point": job_point,
                "seed": m.seed,
                "tokens": [t.tolist() for t in tokens],
                "policy": dataclasses.asdict(m.policy),
            }
            start = time.monotonic()
            try:
                results, failure = self.workers.run(job, timeout), None
            except (TimeoutError, RuntimeError) as e:
                results, failure = None, str(e)
            if self.budget_s is not None:
                self.budget_s -= time.monotonic() - start
        self._last = (cid, results, failure)
        return results, failure

    def _worker_results(self, point: dict, unsupported) -> list:
        """The worker results; PointFailed when there are none or a rank failed (status
        unsupported where `unsupported(errors)` says every rank's error means that)."""
        results, failure = self._results(point)
        if failure is not None:
            raise PointFailed(failure, status="timeout" if "no answer" in failure else "failed")
        errors = _per_rank([r.error for r in results])
        if errors:
            rejected = unsupported([r.error for r in results])
            raise PointFailed(errors, status="unsupported" if rejected else "failed")
        return results

    def _errors(self, rows: list, ref: list) -> list[float]:
        """Each rank's relative error of its sampled rows against `ref`."""
        outs = [
            self.m.torch.as_tensor(r, device=d) for r, d in zip(rows, self.m.devices, strict=True)
        ]
        return [reference.relative_error(o, f) for o, f in zip(outs, ref, strict=True)]

    def _timed(self, point: dict, results: list, facts: dict) -> tuple[list[float], float]:
        """The workers' times and their median; TFLOP/s, the bytes that cross NVLink (its
        dispatch and combine: dispatched rows with their scales, returned rows) and the
        host lead's facts into `facts`."""
        m = self.m
        prob = m.problem(point)
        times = results[0].times_us
        facts.update(results[0].host_lead or {})
        median = statistics.median(times)
        flops = prob.useful_flops() / len(m.devices)
        nvlink = unfused.exchange_bytes([rb.plan for rb in prob.ranks], point["H"], prob.precision)
        facts.update(
            tflops=flops / (median * 1e6),
            nvlink_bytes=int(sum(nvlink)),
            nvlink_bytes_per_rank=nvlink,
        )
        return times, median


class DeepGemmBaseline(PairBaseline):
    """DeepGEMM's SM90 MegaMoE through its worker pair (both schedules' points of a
    configuration share one run)."""

    name = "DeepGEMM"
    job_timeout_s = deepgemm.DEFAULT_JOB_TIMEOUT_S

    def __init__(self, measurer, budget_s: float | None = None):
        super().__init__(measurer, deepgemm.TASK, budget_s)

    def _check(self, point: dict) -> dict:
        reason = deepgemm.unsupported_reason(point)
        if reason:
            raise PointFailed(reason, status="unsupported")
        # its host-side checks (DG_HOST_ASSERT) reject a shape on every rank alike (a
        # missing sgl-deep-gemm is unsupported here too, as a missing FA3 is)
        results = self._worker_results(
            point,
            lambda errors: all(
                "assert" in e.lower() or e.startswith("ModuleNotFoundError") for e in errors
            ),
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
            raise PointFailed(
                "DeepGEMM printed no MegaMoESM90Config (DG_PRINT_CONFIGS): which schedule ran "
                f"is unknown; printed: {first.config_line!r}",
                status="failed",
                extra=facts,
            )
        if ran != point["schedule"]:
            raise PointFailed(
                deepgemm.other_schedule_reason(first.config_line, point["schedule"]),
                status="unsupported",
                extra=facts,
            )
        m = self.m
        prob = m.problem(point)
        fmt = reference.Intermediate(block=first.block, weighted=True)
        ref = reference.reference_outputs(
            prob.homes,
            prob.experts,
            m.tokens,
            prob.precision,
            intermediate_format=fmt,
            stored_intermediate=lambda h: deepgemm.stored_intermediate(h, first.block),
        )
        rel = self._errors([r.rows for r in results], ref)
        bound = deepgemm.tolerance(first.config_line, m.tolerance)
        facts.update(
            accumulation=deepgemm.accumulation_of(first.config_line),
            tolerance_rel_l2=bound,
            rel_error=rel,
            rel_error_vs_our_format=self._errors([r.rows for r in results], m.reference()),
            checked_tokens_per_rank=len(m.tokens[0]),
            intermediate_block=first.block,
            intermediate_scales="powers of two (amax / 448 rounded up)",
            time_includes=deepgemm.TIME_INCLUDES,
        )
        nan = [q for q, r in enumerate(results) if r.nan_rows]
        text = (f"output rows left NaN on ranks {nan}" if nan else None) or verdict.too_far(
            rel, bound
        )
        if text:
            raise wrong(text, facts)
        return facts

    def _time(self, point: dict, facts: dict) -> Measured:
        results, _ = self._results(point)
        times, median = self._timed(point, results, facts)
        line = (
            f"  deepgemm ({facts['deepgemm_schedule']}) time_us={median:.1f} "
            f"err={max(facts['rel_error']):.2e} first call {max(facts['first_call_s']):.1f} s"
        )
        return Measured({"time_us": times}, facts, correct=True, line=line)


class FlashInferBaseline(PairBaseline):
    """FlashInfer's SM90 FP8 MegaMoE through its worker pair, one point per configuration
    (its own schedule and dispatch; natural routing only)."""

    name = "FlashInfer"
    job_timeout_s = flashinfer.DEFAULT_JOB_TIMEOUT_S

    def __init__(self, measurer, budget_s: float | None = None):
        super().__init__(measurer, flashinfer.TASK, budget_s)
        self._missing: list = []  # [why the packages are missing, or None], once looked up

    def _unsupported(self, point: dict) -> str | None:
        """Why it cannot run here, found without starting a worker."""
        reason = flashinfer.unsupported_reason(point)
        if reason or not self.m.cuda:
            return reason or flashinfer.NEEDS_GPU
        if not self._missing:
            try:
                self._missing.append(flashinfer.missing_packages())
            except FileNotFoundError as e:  # XSTAGE_FLASHINFER_SITE names no directory
                self._missing.append(str(e))
        return self._missing[0]

    def _check(self, point: dict) -> dict:
        reason = self._unsupported(point)
        if reason:
            raise PointFailed(reason, status="unsupported")
        results = self._worker_results(
            point, lambda errors: all(e.startswith("ModuleNotFoundError") for e in errors)
        )
        first = results[0]
        facts = {
            "flashinfer_version": first.version,
            "flashinfer_torch": first.torch_version,
            "flashinfer_backend": flashinfer.BACKEND,
            "format": flashinfer.FORMAT,
            "time_includes": "its dispatch (the kernel pulls tokens over NVLink) and combine",
            "first_call_s": [r.first_call_s for r in results],
        }
        m = self.m
        prob = m.problem(point)
        ref = reference.reference_outputs(
            prob.homes,
            prob.experts,
            m.tokens,
            prob.precision,
            intermediate_format=flashinfer.INTERMEDIATE,
            stored_weights=flashinfer.stored_weights,
        )
        rel = {c: self._errors([r.rows[c] for r in results], ref) for c in flashinfer.CHECKS}
        timed = [r.rows["compute_staged"] for r in results]
        facts.update(
            rel_error=rel["compute_staged"],
            rel_error_by_call=rel,
            rel_error_vs_our_format=self._errors(timed, m.reference()),
            checked_tokens_per_rank=len(m.tokens[0]),
            intermediate_block=flashinfer.INTERMEDIATE.block,
        )
        for call in flashinfer.CHECKS:
            nan = [q for q, r in enumerate(results) if r.nan_rows[call]]
            text = (f"output rows left NaN on ranks {nan}" if nan else None) or verdict.too_far(
                rel[call], m.tolerance
            )
            if text:
                raise wrong(f"{call}: {text}", facts)
        return facts

    def _time(self, point: dict, facts: dict) -> Measured:
        results, _ = self._results(point)
        times, median = self._timed(point, results, facts)
        facts["forward_us"] = results[0].forward_us
        line = (
            f"  flashinfer time_us={median:.1f} (forward, bf16 in: {facts['forward_us']:.1f}) "
            f"err={max(facts['rel_error']):.2e} first call {max(facts['first_call_s']):.1f} s"
        )
        return Measured({"time_us": times}, facts, correct=True, line=line)
