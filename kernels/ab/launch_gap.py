"""How much of our layer's kernel_us is the GPU waiting for the host to enqueue it.

    PYTHONPATH=src:kernels python3 kernels/ab/launch_gap.py --config config/reference-h200x1.yaml \
        --dataset ab --shapes deepseek-v4-flash --precisions w8a8 --routings balanced --tokens 1024

Each configuration (expert waves, every combine row local) is checked, then timed as the
harness timed it before its CUDA graphs and host lead (L2 flush, start event, the eager
MoEProblem.forward, end event) and, alternating
with that, with a sleep kernel enqueued after the flush, so that the GPU is still busy while
the host enqueues the layer and starts it the moment its turn comes. The difference is the
GPU's idle wait for the host inside the timed region. A development record, not a dataset.
"""

import argparse
import statistics
import sys
import time

import torch

from xstage_bench.measurement import timing
from xstage_bench.megamoe.kernel_ab import local_configs
from xstage_bench.megamoe.options import add_grid_arguments, selected_grid
from xstage_bench.megamoe.ours.measurer import MoEMeasurer
from xstage_bench.megamoe.runner import default_devices, measured_paths

SLEEP_CYCLES = 4_000_000  # about 2 ms at 1.98 GHz: longer than the host's enqueue
WARMUP, ROUNDS = 3, 15


def timed_once(prob, key, flush, sleep_cycles: int) -> tuple[float, float, float]:
    """(layer us, kernel us, host enqueue us) of one forward."""
    flush()
    if sleep_cycles:
        torch.cuda._sleep(sleep_cycles)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    kernel_events = []
    start.record()
    t0 = time.perf_counter()
    prob.forward(key, kernel_events=kernel_events, eager=True)
    host_us = (time.perf_counter() - t0) * 1e6
    end.record()
    end.synchronize()
    k_start, k_end = kernel_events[0][0]
    return start.elapsed_time(end) * 1e3, k_start.elapsed_time(k_end) * 1e3, host_us


def main(argv) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_grid_arguments(parser)
    args = parser.parse_args(argv)
    config, moe = selected_grid(args)
    devices = default_devices(config, 1, "cuda")
    policy = timing.TimingPolicy.from_config(config["timing"])
    measurer = MoEMeasurer(moe, policy, devices, check_tokens=args.check_tokens)
    flush = timing.l2_flusher(torch, 0)
    for point in local_configs(moe, 1, measured_paths(config, 1)):
        error, _ = measurer.check(point)
        prob = measurer.problem(point)
        key = prob.arm(point)
        runs = {0: [], SLEEP_CYCLES: []}
        for n in range(WARMUP + ROUNDS):
            for cycles, samples in runs.items():
                sample = timed_once(prob, key, flush, cycles)
                if n >= WARMUP:
                    samples.append(sample)
        idle, busy = ([statistics.median(s[i] for s in runs[c]) for i in range(3)] for c in runs)
        print(
            f"{point['id']} check={error or 'ok'} | as timed: time {idle[0]:.1f} kernel "
            f"{idle[1]:.1f} host-enqueue {idle[2]:.1f} us | GPU busy during enqueue: time "
            f"{busy[0]:.1f} kernel {busy[1]:.1f} us",
            flush=True,
        )
    measurer.close()


if __name__ == "__main__":
    main(sys.argv[1:])
