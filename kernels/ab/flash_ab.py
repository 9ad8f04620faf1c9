"""A/B of our attention kernel's launch options (flash_ws.LAUNCH_OPTIONS), with FA3 timed
in the same rounds: the evidence behind an attention kernel change.

    PYTHONPATH=src:kernels python3 kernels/ab/flash_ab.py --config config/reference-h200x1.yaml \
        --option OVERLAP=0,1 --fa3 --out ab.json [--seq-lens 8192] [--heads 24] [--min-reps 9]

The shapes are the config's attention sweep as one GPU runs it: batch 1, head_dim 128, all
S tokens, H/P heads for every H of `heads` and P of `host_world_sizes`. Per shape, every arm
(our kernel at each value of the option, then FA3) is checked on fresh random inputs into a
NaN-poisoned output against torch's SDPA (attention.modes.compare), then the arms that pass
are timed together in paired rounds (timing.measure_paired, L2 flushed before each call),
so each ratio is over samples of one run, interleaved in time, with its paired 95% CI. The
JSON written is a development record, not a dataset's raw file: it carries the
environment block and every sample.
"""

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from xstage_bench.attention.backends import BackendUnavailable, load_backend, sdpa_reference
from xstage_bench.attention.modes import compare
from xstage_bench.data import stats
from xstage_bench.data.config import load_config
from xstage_bench.data.results import atomic_write_text
from xstage_bench.measurement import launch_option, timing
from xstage_bench.measurement.environment import capture_measured
from xstage_kernels import flash_ws

HEAD_DIM = 128


def parse_option(text: str) -> tuple[str, list[int]]:
    """'NAME=v1,v2' -> (NAME, [v1, v2]): a launch option of flash_ws and its values."""
    return launch_option.values(text, flash_ws)


def fixed_option(text: str) -> tuple[str, int]:
    """'NAME=v' -> (NAME, v): a launch option held at one value for every arm."""
    return launch_option.fixed(text, flash_ws)


def shapes(attention: dict, seq_lens, heads) -> list[tuple[int, int]]:
    """(local heads, S) of every point of the one-GPU sweep, without repeats."""
    out = []
    for p in attention["host_world_sizes"]:
        for h in heads or attention["heads"]:
            for s in seq_lens or attention["seq_lens"]:
                if (h // p, s) not in out:
                    out.append((h // p, s))
    return out


def arms(option: str, values: list[int], with_fa3: bool) -> tuple[dict, dict]:
    """({arm: (backend, option value or None)}, {arm: why it cannot run})."""
    # a backend per value: each keeps its own cached destination pointers and launch
    runnable = {f"{option}={v}": (load_backend("triton"), v) for v in values}
    unsupported = {}
    if with_fa3:
        try:
            runnable["fa3"] = (load_backend("fa3"), None)
        except BackendUnavailable as e:
            unsupported["fa3"] = str(e)
    return runnable, unsupported


def enqueue_us(call, calls: int = 20) -> float:
    """Median host time to enqueue one call, the GPU idle before each: the timed region
    starts right after the L2 flush, so an enqueue longer than the flush is GPU idle time
    inside it."""
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def flush_us(repeats: int = 10) -> float:
    """Median GPU time of the L2 flush that runs before each timed call."""
    flush = timing.l2_flusher(torch, 0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        flush()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def compare_shape(
    runnable: dict, option: str, heads: int, seq_len: int, policy, seed: int, lead: bool
):
    """One shape: every arm checked, those that pass timed in paired rounds (with `lead`, a
    timing.HostLead per arm keeps the GPU busy while the host enqueues: GPU time only)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (
        torch.randn(1, seq_len, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        for _ in range(3)
    )
    want = sdpa_reference(q, k, v)
    outs = {arm: torch.empty_like(q) for arm in runnable}

    def call(arm: str) -> None:
        backend, value = runnable[arm]
        if value is not None:
            setattr(flash_ws, option, value)
        backend.local(q, k, v, outs[arm])

    checks = {}
    for arm in runnable:
        outs[arm].fill_(float("nan"))
        call(arm)
        torch.cuda.synchronize()
        ok, err, detail = compare(outs[arm], want)
        checks[arm] = {"correct": ok, "max_abs_err": err, "error": detail or None}
    passed = [arm for arm in runnable if checks[arm]["correct"]]
    leads = {arm: timing.HostLead() if lead else None for arm in passed}
    timers = {
        arm: timing.cuda_event_timer(
            lambda arm=arm: call(arm), device=0, flush_l2=True, lead=leads[arm]
        )
        for arm in passed
    }
    samples = timing.measure_paired(timers, policy) if passed else {}
    enqueue = {arm: enqueue_us(lambda arm=arm: call(arm)) for arm in passed}
    flops = 4.0 * heads * seq_len * seq_len * HEAD_DIM
    result = {
        "heads": heads,
        "seq_len": seq_len,
        "flops": flops,
        "checks": checks,
        "time_us": {arm: list(samples[arm]) for arm in passed},
        "tflops": {arm: flops / statistics.median(samples[arm]) / 1e6 for arm in passed},
        "host_enqueue_us": enqueue,
        "host_lead": {arm: timing.lead_facts(leads[arm]) for arm in passed},
    }
    ours = [arm for arm in passed if arm != "fa3"]
    # time ratios: each value over the first (< 1: faster), FA3 over each of ours (our share
    # of FA3's TFLOP/s)
    result["ratios"] = [
        {"of": arm, "over": ours[0], **stats.ratio_ci(samples[arm], samples[ours[0]], paired=True)}
        for arm in ours[1:]
    ] + [
        {"of": "fa3", "over": arm, **stats.ratio_ci(samples["fa3"], samples[arm], paired=True)}
        for arm in ours
        if "fa3" in passed
    ]
    return result


def summary_line(result: dict) -> str:
    parts = [f"H={result['heads']} S={result['seq_len']}"]
    parts += [
        f"{arm}: {tf:.0f} TF/s (enqueue {result['host_enqueue_us'][arm]:.0f} us)"
        for arm, tf in result["tflops"].items()
    ]
    parts += [
        f"{r['of']}/{r['over']} {r['ratio']:.3f} [{r['ci_low']:.3f}-{r['ci_high']:.3f}]"
        for r in result["ratios"]
    ]
    parts += [f"FAILED {arm}: {c['error']}" for arm, c in result["checks"].items() if c["error"]]
    return "  ".join(parts)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--option", required=True, help="NAME=v1,v2 (flash_ws.LAUNCH_OPTIONS)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--fa3", action="store_true", help="time FA3 in the same rounds")
    parser.add_argument(
        "--set", default="", help="other launch options for every arm, e.g. OVERLAP=1"
    )
    parser.add_argument("--seq-lens", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--heads", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--min-reps", type=int, help="paired rounds at least")
    parser.add_argument(
        "--host-lead",
        action="store_true",
        help="a GPU sleep before each timed call outlasts its enqueue: GPU time only",
    )
    args = parser.parse_args(argv)
    try:
        option, values = parse_option(args.option)
        fixed = dict(fixed_option(item) for item in args.set.split(",") if item)
    except ValueError as e:
        parser.error(str(e))
    for name, value in fixed.items():
        setattr(flash_ws, name, value)
    config = load_config(args.config)
    policy = timing.TimingPolicy.from_config(config["timing"])
    if args.min_reps:
        reps = {"min_reps": args.min_reps, "max_reps": max(args.min_reps, policy.max_reps)}
        policy = dataclasses.replace(policy, **reps)
    runnable, unsupported = arms(option, values, args.fa3)
    doc = {
        "what": "attention kernel A/B (kernels/ab/flash_ab.py): development numbers",
        "option": option,
        "values": values,
        "fixed": flash_ws.launch_options(),
        "host_lead": args.host_lead,
        "unsupported": unsupported,
        "environment": capture_measured("cuda"),
        "l2_flush_us": flush_us(),
        "results": [],
    }
    todo = shapes(config["attention"], args.seq_lens, args.heads)
    print(f"{option}={values}, {doc['fixed']}, L2 flush {doc['l2_flush_us']:.1f} us", flush=True)
    kept = getattr(flash_ws, option)
    try:
        for n, (heads, seq_len) in enumerate(todo, 1):
            result = compare_shape(
                runnable, option, heads, seq_len, policy, seed=n, lead=args.host_lead
            )
            doc["results"].append(result)
            atomic_write_text(args.out, json.dumps(doc, indent=1))
            print(f"[{n}/{len(todo)}] {summary_line(result)}", flush=True)
    finally:
        setattr(flash_ws, option, kept)
    return 0


if __name__ == "__main__":
    sys.exit(main())
