"""Where our layer's host enqueue time goes, and what a CUDA graph of it costs instead.

    PYTHONPATH=src:kernels python3 kernels/ab/enqueue_profile.py \
        --config config/reference-h200x1.yaml --dataset ab \
        --shapes deepseek-v4-flash --precisions w8a8 --routings balanced --tokens 1024

For each configuration (expert waves, every combine row local), after its check:
1. host time of each piece of MoEProblem.forward (the GPU drained before each call);
2. cProfile of forward, the functions with the most own time;
3. the layer captured as two CUDA graphs (zero + fused kernel; the combine), checked
   bitwise against the eager layer, and the host time of their replay;
4. GPU time of the eager layer and of the graphs, each as the harness times it now and
   with a GPU sleep enqueued before the start event (the host then enqueues while the GPU
   is still busy), alternating in rounds.
A development record, not a dataset.
"""

import cProfile
import io
import pstats
import statistics
import sys
import time

import one_gpu  # this folder
import torch

from xstage_bench.megamoe.layer import reduction
from xstage_bench.megamoe.layer.rank import launch_rank
from xstage_kernels import megamoe_ws

SLEEP_CYCLES = 4_000_000  # about 2 ms at 1.98 GHz
CALLS, WARMUP, ROUNDS = 200, 3, 15


def host_us(fn, calls: int = CALLS) -> float:
    """Median host time of one call of fn (the GPU drained before each)."""
    samples = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def pieces(prob, key, point) -> dict:
    rb, ex = prob.ranks[0], prob.experts[0]
    H, I = point["H"], point["I"]  # noqa: E741
    scales = (rb.xs_steps, rb.hs)

    def descriptors():
        return megamoe_ws.descriptors(
            rb.x, ex.w1, rb.h, ex.w2, H, I, point["precision"], scales=scales
        )

    descs = descriptors()
    kw = dict(
        tiles=rb.tiles[key],
        sync=rb.sync,
        xs=rb.xs,
        s1=ex.s1,
        s2=ex.s2,
        h=rb.h,
        hs=rb.hs,
        out=rb.comb,
        row_dst=rb.row_dst,
        H=H,
        I=I,
        max_spin=4_000_000,
        R=rb.x.shape[0],
    )

    def events():
        pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        pair[0].record()
        pair[1].record()
        torch.cuda.Event().record()

    return {
        "forward": host_us(lambda: prob.forward(key, kernel_events=[], eager=True)),
        "launch_rank (zero + descriptors + kernel)": host_us(
            lambda: launch_rank(rb, ex, prob.point, key, prob.num_programs)
        ),
        "sync.zero_": host_us(rb.sync.zero_),
        "descriptors": host_us(descriptors),
        "kernel launch (descriptors built)": host_us(
            lambda: megamoe_ws.launch(
                precision=point["precision"], num_programs=prob.num_programs, descs=descs, **kw
            )
        ),
        "combine": host_us(lambda: reduction.combine_rank(rb, prob.point, prob.reduction)),
        "3 events": host_us(events),
    }


def profile(prob, key) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(100):
        prob.forward(key, kernel_events=[], eager=True)
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(18)
    return out.getvalue()


def graphs(prob, key):
    """(kernel graph, combine graph) of rank 0, captured after an eager warm-up."""
    rb, ex = prob.ranks[0], prob.experts[0]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        launch_rank(rb, ex, prob.point, key, prob.num_programs)
        reduction.combine_rank(rb, prob.point, prob.reduction)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    kernel_graph, combine_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(kernel_graph):
        launch_rank(rb, ex, prob.point, key, prob.num_programs)
    with torch.cuda.graph(combine_graph):
        reduction.combine_rank(rb, prob.point, prob.reduction)
    return kernel_graph, combine_graph


def graph_forward(kernel_graph, combine_graph, kernel_events):
    pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
    pair[0].record()
    kernel_graph.replay()
    pair[1].record()
    combine_graph.replay()
    kernel_events.append([pair])


def study(measurer, point, flush) -> None:
    """Steps 1-4 of the module doc for one configuration."""
    error, _ = measurer.check(point)
    prob = measurer.problem(point)
    key = prob.arm(point)
    print(f"== {point['id']} check={error or 'ok'}", flush=True)
    for name, us in pieces(prob, key, point).items():
        print(f"  host {name}: {us:.1f} us", flush=True)
    print(profile(prob, key), flush=True)
    eager_out = prob.ranks[0].out.clone()
    kernel_graph, combine_graph = graphs(prob, key)
    prob.poison()
    kernel_graph.replay()
    combine_graph.replay()
    torch.cuda.synchronize()
    same = torch.equal(prob.ranks[0].out, eager_out)
    print(f"  graphs: output bitwise equal to the eager layer's: {same}", flush=True)
    replay_us = host_us(lambda: graph_forward(kernel_graph, combine_graph, []))
    print(f"  host graph replay (both): {replay_us:.1f} us", flush=True)

    def eager(ev):
        prob.forward(key, kernel_events=ev, eager=True)

    def graphed(ev):
        graph_forward(kernel_graph, combine_graph, ev)

    arms = {
        ("eager", 0): eager,
        ("eager", SLEEP_CYCLES): eager,
        ("graph", 0): graphed,
        ("graph", SLEEP_CYCLES): graphed,
    }
    runs = {arm: [] for arm in arms}
    for n in range(WARMUP + ROUNDS):
        for arm, forward in arms.items():
            sample = one_gpu.timed_once(forward, flush, arm[1])
            if n >= WARMUP:
                runs[arm].append(sample)
    for (how, cycles), samples in runs.items():
        med = [statistics.median(s[i] for s in samples) for i in range(3)]
        lead = "GPU busy during enqueue" if cycles else "as timed"
        print(
            f"  {how:5s} {lead:24s}: time {med[0]:.1f} kernel {med[1]:.1f} "
            f"host-enqueue {med[2]:.1f} us",
            flush=True,
        )


def main(argv) -> None:
    for measurer, point, flush in one_gpu.configurations(argv, __doc__):
        study(measurer, point, flush)


if __name__ == "__main__":
    main(sys.argv[1:])
