"""A/B of our MegaMoE kernel's launch options: the evidence behind a kernel change.

    python -m xstage_bench.megamoe.kernel_ab --config config/reference-h200x1.yaml \
        --dataset ab --shapes deepseek-v4-flash --tokens 1024,4096 \
        --option SKIP_PADDING_HALVES=0,1 --out ab.json

Each configuration of the grid (restricted by the runner's options; expert waves, every
combine row local: the host path's f = 0, the peer path's natural routing) runs once per
value of the option. Each value's build is checked first (outputs poisoned, one layer,
the sampled tokens against the reference: MoEMeasurer.check), and the builds that pass
are timed together in paired rounds (timing.measure_paired), so the ratio of each value
over the first is over samples of one run, interleaved in time, with its paired 95% CI.
A build that fails its check is reported and not timed: wrong outputs, or a check that
raised (a build that does not compile or launch; its error is the check's). A check or a
point's timing that has not returned after `--step-timeout` seconds is taken for a hung
kernel (a deadlock never returns, and only ending the process frees the GPU): the point is
written down with `hung` naming the step, and the run exits with HUNG_EXIT. `--min-reps N`
asks for at least N paired rounds (the config's timing block stops at its own min_reps once
the spread is small: reference-h200x1 gives 5), for a close call.

An option is one of the launch constants of xstage_kernels.megamoe_ws (LAUNCH_OPTIONS),
set before each launch. `--decided-on device` runs the schedule decided by the kernel's
programs (points.decided_where: device mode, a `layout` instead of a tile list), for an
option of device mode's build; the default, `list`, the host's lists. `--schedule`: expert
waves (the default) or the paper's interleaving at `--lead-rows` (default: the config's
megamoe.lead_rows, which must then be a number).
The JSON written is a kernel's development record, not a raw file of a dataset: it carries
the environment block and every sample.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import json
import os
import statistics
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from xstage_bench.data import grid, stats
from xstage_bench.data.grid import DEVICE, LIST
from xstage_bench.data.results import atomic_write_text
from xstage_bench.measurement import launch_option, timing
from xstage_bench.measurement.environment import capture_measured, finish
from xstage_bench.megamoe import schedule
from xstage_bench.megamoe.options import add_grid_arguments, megamoe_policy, selected_grid
from xstage_bench.megamoe.points import decided_where, with_lead
from xstage_bench.megamoe.runner import default_devices, measured_paths

# Seconds a build's check (its compile, capture and poisoned run) or a point's paired
# timing may take before it is taken for a hung kernel; a point takes seconds.
STEP_TIMEOUT_S = 300.0
HUNG_EXIT = 3  # the exit status of a run ended by a hung step


@contextlib.contextmanager
def watchdog(timeout_s: float, on_timeout: Callable[[], None]):
    """Run the body; if it has not returned after timeout_s seconds, call on_timeout (from
    another thread: the body is stuck, in a CUDA wait for a kernel that never ends) and end
    the process with HUNG_EXIT. faulthandler ends it a minute later all the same, should
    on_timeout never get the interpreter. 0: no limit."""
    if not timeout_s:
        yield
        return

    def fire():
        try:
            on_timeout()
        finally:
            os._exit(HUNG_EXIT)

    timer = threading.Timer(timeout_s, fire)
    timer.daemon = True
    timer.start()
    faulthandler.dump_traceback_later(timeout_s + 60.0, exit=True)
    try:
        yield
    finally:
        timer.cancel()
        faulthandler.cancel_dump_traceback_later()


def parse_option(text: str) -> tuple[str, list[int]]:
    """'NAME=v1,v2,...' -> (NAME, [v1, v2, ...]): a launch constant of megamoe_ws and the
    integer values to compare (the first is the baseline of every ratio)."""
    from xstage_kernels import megamoe_ws

    return launch_option.values(text, megamoe_ws)


def fixed_options(text: str) -> dict[str, int]:
    """'NAME=v,NAME2=v2' -> the launch constants every arm holds (`--set`)."""
    from xstage_kernels import megamoe_ws

    return dict(launch_option.fixed(item, megamoe_ws) for item in text.split(",") if item)


def local_configs(
    moe: dict,
    world_size: int,
    paths: Sequence[str],
    decided_on: str = LIST,
    schedule_name: str = schedule.WAVE,
    lead_rows: int = 0,
) -> list[dict]:
    """The grid's configurations with every combine row local, as points of one schedule
    (interleaved: at lead_rows); decided_on 'device': decided by the kernel's programs
    (`decided_on: device`)."""
    configs = grid.megamoe_points({**moe, "remote_fractions": [grid.NATURAL]}, world_size, paths)
    points = [{**c, "schedule": schedule_name, "id": f"{c['id']}/{schedule_name}"} for c in configs]
    led = [with_lead(p, lead_rows, None) for p in points]
    return [decided_where(p, {**moe, "schedule_on": decided_on}) for p in led]


def ab_lead(requested: int | None, moe: dict) -> int:
    """The interleaved arms' lead: --lead-rows, else the config's megamoe.lead_rows when it
    is a number (auto needs the fitted model, which an A/B does not read)."""
    lead = moe.get("lead_rows", 0) if requested is None else requested
    if isinstance(lead, bool) or not isinstance(lead, int) or lead < 0:
        raise ValueError(
            f"the interleaved arms need a lead of rows >= 0: pass --lead-rows N (the config's "
            f"megamoe.lead_rows is {lead!r})"
        )
    return lead


def padding_halves(prob) -> float:
    """Share of the rank 0 blocks whose second half (rows 64..127) is all padding."""
    rows = prob.ranks[0].plan.block_rows
    return float((rows <= 64).mean()) if len(rows) else 0.0


def _unguarded(stage: str):
    return contextlib.nullcontext()


def compare(
    measurer,
    point: dict,
    option: str,
    values: list[int],
    *,
    result: dict | None = None,
    guard: Callable[[str], contextlib.AbstractContextManager] = _unguarded,
) -> dict:
    """One configuration: every value checked, those that pass timed in paired rounds.
    result: filled in as the comparison goes (what a hang or an error leaves of it is
    written down: main); guard(stage): around each check and the timing (main's watchdog)."""
    from xstage_kernels import megamoe_ws

    result = {} if result is None else result
    result.update(id=point["id"], point=point)
    checks = result.setdefault("checks", {})
    prob = measurer.problem(point)
    key = prob.arm(point)
    for v in values:
        setattr(megamoe_ws, option, v)
        with guard(f"the check of {option}={v}"):
            try:
                error, facts = measurer.check(point)
            except Exception as e:  # a build that does not compile or launch: not timed
                error, facts = f"raised {type(e).__name__}: {e}", {}
        checks[str(v)] = {"error": error, **facts}
    passed = [v for v in values if checks[str(v)]["error"] is None]
    events: dict[int, list] = {v: [] for v in passed}
    leads = {v: timing.host_lead(measurer.policy) for v in passed}

    def timer(v: int):
        def run():
            setattr(megamoe_ws, option, v)
            prob.forward(key, kernel_events=events[v], flushers=measurer.flushers)

        if measurer.cuda:
            return timing.cuda_event_timer(
                run,
                device=measurer.devices[0].index,
                flush_l2=measurer.policy.flush_l2,
                lead=leads[v],
            )
        return timing.host_timer(run)

    samples = {}
    if passed:
        with guard("the timing"):
            samples = timing.measure_paired({v: timer(v) for v in passed}, measurer.policy)
    arms = {}
    for v in passed:
        kernel_us = timing.slowest_rank_us(events[v], len(samples[v]))
        arms[v] = {"time_us": list(samples[v]), "kernel_us": kernel_us}
        if leads[v] is not None:
            arms[v]["host_lead"] = leads[v].as_extra()
    ratios = [
        {
            "value": v,
            "over": passed[0],
            **{
                metric: stats.ratio_ci(arms[v][metric], arms[passed[0]][metric], paired=True)
                for metric in ("time_us", "kernel_us")
            },
        }
        for v in passed[1:]
    ]
    result.update(
        padding_halves=padding_halves(prob),
        useful_flops_per_gpu=prob.useful_flops() / len(measurer.devices),
        checks=checks,
        arms={str(v): a for v, a in arms.items()},
        ratios=ratios,
    )
    return result


def summary_line(result: dict) -> str:
    """'<id> pad=<share> v=<kernel_us> ... ratio [CI]' for one configuration."""
    parts = [f"{result['id']} pad={result['padding_halves']:.2f}"]
    for v, arm in result["arms"].items():
        kernel_us = statistics.median(arm["kernel_us"])
        tflops = result["useful_flops_per_gpu"] / (kernel_us * 1e6)
        parts.append(f"{v}: {kernel_us:.1f} us {tflops:.0f} TF/s")
    for r in result["ratios"]:
        k = r["kernel_us"]
        parts.append(
            f"{r['value']}/{r['over']} {k['ratio']:.3f} [{k['ci_low']:.3f}-{k['ci_high']:.3f}]"
        )
    failed = [f"{v} {c['error']}" for v, c in result["checks"].items() if c["error"]]
    return "  ".join(parts + [f"FAILED {f}" for f in failed])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_grid_arguments(parser)
    parser.add_argument("--option", required=True, help="NAME=v1,v2 (megamoe_ws.LAUNCH_OPTIONS)")
    parser.add_argument(
        "--set", default="", help="other launch options for every arm, e.g. SPLIT_CONVERTED=1"
    )
    parser.add_argument(
        "--decided-on",
        choices=(LIST, DEVICE),
        default=LIST,
        help="where the schedule's order is decided: the host's tile lists (list), or the "
        "kernel's programs as they claim (device: device mode, for an option of its build)",
    )
    parser.add_argument(
        "--schedule",
        choices=(schedule.WAVE, schedule.INTERLEAVED),
        default=schedule.WAVE,
        help="the schedule every arm runs (default: expert waves)",
    )
    parser.add_argument(
        "--lead-rows",
        type=int,
        help="interleaved's lead (default: the config's megamoe.lead_rows, if a number)",
    )
    parser.add_argument("--out", required=True, type=Path, help="JSON to write")
    parser.add_argument("--world-size", type=int, help="GPUs to use (default: config)")
    parser.add_argument(
        "--min-reps",
        type=int,
        help="paired rounds at least (default: the config's timing.min_reps): more samples "
        "for a close call",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=STEP_TIMEOUT_S,
        help="seconds a build's check or a point's timing may take before it is taken for a "
        f"hung kernel: the point is written down and the run exits with {HUNG_EXIT} "
        "(0: no limit)",
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: two ranks under the Triton interpreter (TRITON_INTERPRET=1), which run "
        "the tl kernel: a test of this tool, not of the option",
    )
    args = parser.parse_args(argv)
    device_type = args.device
    try:
        config, moe = selected_grid(args)
        option, values = parse_option(args.option)
        fixed = fixed_options(args.set)
        lead = ab_lead(args.lead_rows, moe) if args.schedule == schedule.INTERLEAVED else 0
    except ValueError as e:
        parser.error(str(e))
    if option in fixed:
        parser.error(f"--set {option}: that is the option compared (--option)")
    from xstage_bench.megamoe.ours.measurer import MoEMeasurer
    from xstage_kernels import megamoe_ws

    devices = default_devices(config, args.world_size, device_type)
    policy = megamoe_policy(config, moe)
    if args.min_reps is not None:
        if args.min_reps < 1:
            parser.error(f"--min-reps must be >= 1, got {args.min_reps}")
        reps = {"min_reps": args.min_reps, "max_reps": max(args.min_reps, policy.max_reps)}
        policy = dataclasses.replace(policy, **reps)
    measurer = MoEMeasurer(moe, policy, devices, check_tokens=args.check_tokens)
    kept = {name: getattr(megamoe_ws, name) for name in [option, *fixed]}
    for name, value in fixed.items():
        setattr(megamoe_ws, name, value)
    doc = {
        "what": "kernel A/B (xstage_bench.megamoe.kernel_ab): development numbers, not a dataset",
        "option": option,
        "values": values,
        "fixed": fixed,
        "environment": capture_measured(device_type),
        "results": [],
    }
    paths = measured_paths(config, len(devices))
    points = local_configs(moe, len(devices), paths, args.decided_on, args.schedule, lead)

    def write(result: dict) -> None:
        doc["results"].append(result)
        finish(doc["environment"])  # the file's span ends at its last result
        atomic_write_text(args.out, json.dumps(doc, indent=1))

    try:
        for n, point in enumerate(points, 1):
            result: dict = {}

            def guard(stage: str, n=n, point=point, result=result):
                def hung():
                    result["hung"] = f"{stage}: no return after {args.step_timeout:g} s"
                    write(result)
                    print(f"[{n}/{len(points)}] {point['id']} HUNG in {stage}", flush=True)

                return watchdog(args.step_timeout, hung)

            try:
                compare(measurer, point, option, values, result=result, guard=guard)
            except Exception as e:
                result["error"] = f"{type(e).__name__}: {e}"
                write(result)
                raise
            write(result)
            print(f"[{n}/{len(points)}] {summary_line(result)}", flush=True)
    finally:
        for name, value in kept.items():
            setattr(megamoe_ws, name, value)
        measurer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
