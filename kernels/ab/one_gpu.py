"""What this folder's development scripts share: our measurer on one GPU, over the grid
their command line selects (options.add_grid_arguments), and its configurations with
expert waves and every combine row local (kernel_ab.local_configs)."""

import argparse
import time
from collections.abc import Iterator

import torch

from xstage_bench.measurement import timing
from xstage_bench.megamoe.kernel_ab import local_configs
from xstage_bench.megamoe.options import add_grid_arguments, selected_grid
from xstage_bench.megamoe.ours.measurer import MoEMeasurer
from xstage_bench.megamoe.runner import default_devices, measured_paths


def configurations(argv, doc: str) -> Iterator[tuple[MoEMeasurer, dict, object]]:
    """(measurer, point, L2 flush of GPU 0) per selected configuration; the measurer's
    worker baselines are closed at the end."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_grid_arguments(parser)
    args = parser.parse_args(argv)
    config, moe = selected_grid(args)
    devices = default_devices(config, 1, "cuda")
    policy = timing.TimingPolicy.from_config(config["timing"])
    measurer = MoEMeasurer(moe, policy, devices, check_tokens=args.check_tokens)
    flush = timing.l2_flusher(torch, 0)
    try:
        for point in local_configs(moe, 1, measured_paths(config, 1)):
            yield measurer, point, flush
    finally:
        measurer.close()


def timed_once(forward, flush, sleep_cycles: int) -> tuple[float, float, float]:
    """(layer us, kernel us, host enqueue us) of one forward(kernel_events), after the L2
    flush and, given sleep_cycles, a GPU sleep that outlasts the enqueue."""
    flush()
    if sleep_cycles:
        torch.cuda._sleep(sleep_cycles)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    kernel_events = []
    start.record()
    t0 = time.perf_counter()
    forward(kernel_events)
    host = (time.perf_counter() - t0) * 1e6
    end.record()
    end.synchronize()
    k_start, k_end = kernel_events[0][0]
    return start.elapsed_time(end) * 1e3, k_start.elapsed_time(k_end) * 1e3, host
