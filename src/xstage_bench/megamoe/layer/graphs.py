"""Our layer's launches captured as CUDA graphs: what a timed forward replays on a GPU.

Enqueueing the layer eagerly takes the host 200-340 us (Triton's Python launch path with
four TMA descriptors, zeroing the sync buffer, launching the combine, the events), and
the GPU waited for most of that inside the timed region; replaying the captured graphs
takes 26-36 us (one H200, kernels/ab/2026-12-02-enqueue-profile-1024.txt). Per rank there
are two graphs: the sync buffer's zero with the fused kernel (kernel_us is timed around
it), and the top-k combine (which runs after the cross-rank barrier); a third before them
where the layer starts from home tokens: the dispatch (token_dispatch.py).

A rank's pair is captured once per tile list, per fused kernel in force and per value of
megamoe_ws's launch options (kernel_ab changes those between launches), after one eager
run of the same launches: that compiles and loads the kernels outside the capture. The
traced, compute-emulated and local-control runs stay eager: they are instruments, not
the layer as it is timed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

CUDA_GRAPH = "cuda_graph"
EAGER = "eager"


@dataclass
class RankGraphs:
    """One rank's captured launches."""

    kernel: object  # torch.cuda.CUDAGraph: zero the sync buffer, the fused kernel
    combine: object  # torch.cuda.CUDAGraph: the top-k reduction of the combine buffer
    dispatch: object = None  # torch.cuda.CUDAGraph: the dispatch (token_dispatch), if timed


def graph_key(arm: str) -> tuple:
    """What a captured launch depends on besides its buffers: the tile list, the fused
    kernel a launch picks (XSTAGE_MOE_FP8_KERNEL) and megamoe_ws's launch options."""
    from xstage_kernels import megamoe, megamoe_ws

    options = tuple(getattr(megamoe_ws, name) for name in megamoe_ws.LAUNCH_OPTIONS)
    return arm, megamoe.fp8_kernel(), options


def capture(torch, device, enqueue: Callable[[], None]):
    """A CUDA graph of `enqueue`'s work on `device`, after one eager run of it (on a side
    stream, as torch asks: the capture must not be the kernels' first launch)."""
    with torch.cuda.device(device):
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            enqueue()
        current.wait_stream(side)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            enqueue()
    return graph
