"""Measure the fused MoE kernel over the configured grid and write its raw files.

    python -m xstage_bench.megamoe.runner --config config.yaml --dataset h200x2 \
        --out results/h200x2/raw/megamoe.json --trace-out results/h200x2/raw/megamoe_trace.json

One record per (configuration, schedule). Every record is checked before it is timed: the
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
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from xstage_bench import grid, timing
from xstage_bench.clocks import ClockSampler, record_fields
from xstage_bench.config import load_config
from xstage_bench.environment import capture
from xstage_bench.megamoe import reference, schedule
from xstage_bench.results import failed_record, ok_record
from xstage_bench.sweep import run_sweep

POINT_TIMEOUT_S = 600.0  # spins are bounded in the kernel; this is only a last resort
CHECK_TOKENS = 32  # tokens of every home rank compared with the reference
LOCAL_CONTROL = "local_control"
NS_PER_US = 1000.0


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def expand_schedules(points: list[dict], schedules: Sequence[str]) -> list[dict]:
    """One point per (configuration, schedule); id '<config id>/<schedule>'."""
    return [{**p, "schedule": s, "id": f"{p['id']}/{s}"} for p in points for s in schedules]


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


def _config_id(point: dict) -> str:
    return point["id"].rsplit("/", 1)[0]


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
    ):
        import torch

        self.torch = torch
        self.moe = megamoe
        self.policy = policy
        self.devices = devices
        self.check_tokens = check_tokens
        self.seed = seed
        self.num_programs = torch.cuda.get_device_properties(devices[0]).multi_processor_count
        self.sampler = ClockSampler([d.index for d in devices])
        self.flushers = self._flushers() if policy.flush_l2 else None
        self._weights_key = None
        self._weights: list = []
        self._problem_id = None
        self._problem = None  # problem.MoEProblem of the current configuration
        self._reference: list | None = None
        self._tokens: list[np.ndarray] = []
        self._outputs: dict[str, list] = {}

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

        cid = _config_id(point)
        if cid == self._problem_id:
            return self._problem
        torch = self.torch
        self._problem = self._reference = None
        self._outputs = {}
        key = (point["shape"], point["precision"])
        if key != self._weights_key:
            self._weights = []
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
        T = point["tokens_per_rank"]
        rng = np.random.default_rng(self.seed)
        n = min(T, self.check_tokens)
        self._tokens = [np.sort(rng.choice(T, n, replace=False)) for _ in self.devices]
        return self._problem

    def reference(self) -> list:
        if self._reference is None:
            prob = self._problem
            self._reference = reference.reference_outputs(
                prob.homes, prob.experts, self._tokens, prob.precision
            )
        return self._reference

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
                if torch.isnan(s[_valid_slots(rb, prob)]).any()
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
        if max(errors) > reference.TOLERANCE:
            return (
                f"relative error vs the torch reference {max(errors):.3g} > "
                f"{reference.TOLERANCE:g} (per rank {[f'{e:.3g}' for e in errors]})",
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
        run_once = timing.cuda_event_timer(
            fn, device=self.devices[0].index, flush_l2=self.policy.flush_l2
        )
        times = timing.measure(run_once, self.policy)
        kernel_us = [
            max(start.elapsed_time(end) * 1000.0 for start, end in ranks)
            for ranks in events[-len(times) :]
        ]
        median = statistics.median(times)
        flops = prob.useful_flops() / len(self.devices)
        nvlink = prob.nvlink_bytes()
        extra = {
            **facts,
            "tflops": flops / (median * 1e6),
            "tflops_kernel": flops / (statistics.median(kernel_us) * 1e6),
            "nvlink_bytes": int(sum(nvlink)),
            "nvlink_bytes_per_rank": nvlink,
            "padded_rows_per_rank": prob.padded_rows(),
            "tiles_per_rank": [int(rb.tiles[point["schedule"]].shape[0]) for rb in prob.ranks],
            "stop_reason": times.stop_reason,
        }
        fields = record_fields(before, self.sampler.sample())
        _say(
            f"  time_us={median:.1f} kernel_us={statistics.median(kernel_us):.1f} "
            f"tflops={extra['tflops']:.0f} err={max(facts['rel_error']):.2e}"
        )
        return ok_record(
            point["id"],
            point,
            {"time_us": list(times), "kernel_us": kernel_us},
            correct=True,
            extra=extra,
            **fields,
        )

    def trace(self, point: dict, keep_timeline: bool) -> dict:
        """One instrumented run (after one warm-up run) of a schedule or the control."""
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
        fields = record_fields(before, self.sampler.sample())
        _say(
            f"  store span median {np.median(spans) if spans else math.nan:.2f} us, "
            f"kernel {extra['time_us']:.1f} us"
        )
        correct = None if point.get("variant") == LOCAL_CONTROL else True
        return ok_record(
            point["id"],
            point,
            {"store_span_us": spans},
            correct=correct,
            extra={**facts, **extra},
            **fields,
        )


def _valid_slots(rb, prob) -> object:
    """Indices of the local-control sink rows this rank's kernel should have written."""
    T, topk = prob.point["tokens_per_rank"], prob.point["topk"]
    plan = rb.plan
    slots = plan.home[plan.home >= 0] * T * topk + plan.slot[plan.home >= 0]
    return prob.torch.as_tensor(slots, device=rb.sink.device)


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


def select(megamoe: dict, shapes=None, precisions=None, routings=None, tokens=None) -> dict:
    """The megamoe config restricted to the named shapes, precisions, routings, tokens."""
    moe = dict(megamoe)
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


def default_devices(config: dict, world_size: int | None = None) -> list:
    import torch

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


def raw_config(config: dict, moe: dict, devices: list, check_tokens: int) -> dict:
    from xstage_bench.megamoe import kernel

    return {
        "megamoe": moe,
        "timing": config["timing"],
        "world_size": len(devices),
        "kernel": {
            "source": "src/xstage_bench/megamoe/kernel.py (Triton, persistent)",
            "block_m": kernel.BLOCK_M,
            "block_n": kernel.BLOCK_N,
            "block_k": kernel.BLOCK_K,
            "num_warps": kernel.NUM_WARPS,
            "num_stages": kernel.NUM_STAGES,
            "max_spin": kernel.MAX_SPIN,
        },
        "check": {"tokens_per_rank": check_tokens, "tolerance_rel_l2": reference.TOLERANCE},
        "definitions": {
            "time_us": "GPU 0 events around: every rank's fused kernel, the cross-GPU barrier "
            "and every home rank's top-k weighted reduction (dispatch excluded, done once)",
            "kernel_us": "max over ranks of the fused kernel alone (events on its stream)",
            "tflops": "useful FLOPs (6 H I per routed row, no padding) per GPU / median time_us",
            "nvlink_bytes": "bf16 output bytes the combine epilogues store into peers, all ranks",
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
) -> None:
    """Measure every (configuration, schedule) and write raw/megamoe.json (`out`); with
    `trace_out`, the instrumented runs of the traced configurations too."""
    from xstage_bench.megamoe.problem import enable_peer_access

    moe = megamoe or config["megamoe"]
    devices = default_devices(config, world_size)
    if len(devices) > 1:
        enable_peer_access(devices)
    policy = timing.TimingPolicy.from_config(config["timing"])
    measurer = MoEMeasurer(moe, policy, devices, check_tokens=check_tokens)
    configs = grid.megamoe_points(moe, len(devices))
    env = capture(simulated=False)
    cfg = raw_config(config, moe, devices, check_tokens)
    run_sweep(
        expand_schedules(configs, moe["schedules"]),
        measurer,
        Path(out),
        experiment="megamoe",
        backend="cuda",
        dataset=dataset,
        environment=env,
        config=cfg,
        point_timeout_s=POINT_TIMEOUT_S,
    )
    if trace_out is None:
        return
    points = trace_points(configs)
    first = points[0]["id"].rsplit("/", 1)[0] if points else None
    run_sweep(
        points,
        lambda p: measurer.trace(p, keep_timeline=_config_id(p) == first),
        Path(trace_out),
        experiment="megamoe_trace",
        backend="cuda",
        dataset=dataset,
        environment=capture(simulated=False),
        config=cfg,
        point_timeout_s=POINT_TIMEOUT_S,
    )


def print_summary(out: str | Path, trace_out: str | Path | None = None) -> None:
    """A short table of a raw megamoe file (and its trace file): per configuration the
    two schedules' median times, the speedup, the wave kernel's TFLOP/s; then the totals."""
    from xstage_bench.results import read_raw

    doc = read_raw(out)
    by_config: dict[str, dict] = {}
    for r in doc["records"]:
        by_config.setdefault(_config_id(r), {})[r["point"]["schedule"]] = r
    print(
        f"{'configuration':58s} {'wave us':>9s} {'inter us':>9s} {'speedup':>7s} "
        f"{'TFLOP/s':>7s} {'rel err':>8s}"
    )
    speedups = []
    for cid, recs in by_config.items():
        cells = []
        for name in ("expert_wave", "interleaved"):
            r = recs.get(name)
            ok = r is not None and r["status"] == "ok"
            cells.append(r["summary"]["time_us"]["median"] if ok else None)
        wave = recs.get("expert_wave")
        shown = [f"{c:9.1f}" if c else f"{'-':>9s}" for c in cells]
        speed = cells[0] / cells[1] if all(cells) else None
        if speed:
            speedups.append(speed)
        tflops = wave["extra"]["tflops"] if wave and wave["status"] == "ok" else None
        err = max((wave.get("extra") or {}).get("rel_error", [math.nan])) if wave else math.nan
        status = ",".join(r["status"] for r in recs.values() if r["status"] != "ok")
        print(
            f"{cid:58s} {shown[0]} {shown[1]} "
            f"{(f'{speed:7.3f}' if speed else '      -')} "
            f"{(f'{tflops:7.0f}' if tflops else '      -')} {err:8.1e} {status}"
        )
    if speedups:
        s = np.asarray(speedups)
        print(
            f"speedup interleaved/wave over {len(s)} configs: geomean "
            f"{np.exp(np.log(s).mean()):.3f} median {np.median(s):.3f} "
            f"min {s.min():.3f} max {s.max():.3f}"
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="config.yaml")
    parser.add_argument("--dataset", required=True, help="dataset name")
    parser.add_argument("--out", required=True, type=Path, help="raw/megamoe.json to write")
    parser.add_argument("--trace-out", type=Path, help="raw/megamoe_trace.json to write")
    parser.add_argument("--shapes", help="comma-separated shape names (default: all)")
    parser.add_argument("--precisions", help="comma-separated: w4a8, w8a8, bf16")
    parser.add_argument("--routings", help="comma-separated: balanced, skewed")
    parser.add_argument("--tokens", help="comma-separated tokens per rank")
    parser.add_argument("--world-size", type=int, help="GPUs to use (default: config)")
    parser.add_argument(
        "--check-tokens",
        type=int,
        default=CHECK_TOKENS,
        help="tokens per home rank compared with the reference",
    )
    args = parser.parse_args(argv)
    config = load_config(args.config)

    def split(value):
        return value.split(",") if value else None

    moe = select(
        config["megamoe"],
        split(args.shapes),
        split(args.precisions),
        split(args.routings),
        split(args.tokens),
    )
    run_megamoe(
        config,
        args.dataset,
        args.out,
        args.trace_out,
        args.world_size,
        megamoe=moe,
        check_tokens=args.check_tokens,
    )
    print_summary(args.out, args.trace_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
