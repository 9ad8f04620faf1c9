"""The layer from its home tokens (megamoe.layer_from 'home_tokens'): the dispatch and the
layout run on the GPU inside the timed layer, as FlashInfer's and DeepGEMM's timed calls
contain theirs (issue 53, item 2).

Per forward, before the fused kernel (one rank; its FP8 home tokens and top-k ids in):
count each expert's routed rows and each row's place among them (xstage_kernels.dispatch,
in the host plan's order: token, then choice), build the schedule layout from those counts
(xstage_kernels.layout: the block count, the rows the device rule reads, each expert's
first padded row), and gather every routed row's activations, scales and destination into
the padded expert-major buffers the kernel reads (padding rows get destination PAD_DST
only: their contents are never stored, dispatch.py says why). Nothing is read
back to the host: every buffer is sized for the most rows and blocks the tokens can need
(capacity), the kernel reads the block count from the layout, so one captured graph
serves every routing of a shape.

The host still builds the plan (routing.dispatch_plan), but only to check the layer and to
count its FLOPs and bytes; a device-decided arm runs from the GPU's layout alone. A list
arm (an oracle) runs its host-built tile list on the rows the GPU dispatched: the same
rows in the same order, so the list fits them.

One GPU for now: a dispatch across GPUs (each rank pulling its experts' rows from every
home rank) is not built, and a point on more GPUs is recorded unsupported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xstage_bench.data.grid import EXPERT_ROWS, HOME_TOKENS, layer_from
from xstage_bench.measurement.protocol import PointFailed
from xstage_bench.megamoe import schedule

__all__ = ["EXPERT_ROWS", "HOME_TOKENS", "TokenDispatch", "check_supported", "token_dispatch"]

# The kernels (Triton) are imported where they run: the harness reads this module's names
# where no Triton is installed (the report, the config checks).


def check_supported(point: dict, megamoe: dict) -> None:
    """A point the layer from home tokens cannot run is recorded unsupported, not faked."""
    if layer_from(megamoe) == HOME_TOKENS and point["world_size"] != 1:
        raise PointFailed(
            "megamoe.layer_from 'home_tokens' runs on one GPU: the dispatch across GPUs is "
            f"not built (this point has world_size {point['world_size']})",
            status="unsupported",
        )


@dataclass
class TokenDispatch:
    """One rank's dispatch buffers, sized for any routing of its tokens."""

    expert_ids: object  # int32 (T * topk,): pair t * topk + k's expert (copy new ids here)
    x_home: object  # (T, H) fp8 (or bf16) home tokens
    xs_home: object  # (T, H/128) fp32 scales, or None (bf16)
    token_dst: object  # int64 (T,): offset of token t's combine rows' base (host-homed: far)
    counts: object  # int32 (E,): routed rows per expert
    rank: object  # int32 (T * topk,): each pair's place among its expert's rows
    held: object  # int32 scratch of the count (dispatch.count_scratch)
    expert_row0: object  # int32 (E,): each expert's first padded row
    x: object  # (capacity_rows, H) the rows the kernel reads
    xs: object  # (capacity_rows, H/128) their scales as the gather writes them, or None
    row_dst: object  # int64 (capacity_rows,): each row's destination, PAD_DST for padding
    scratch_layout: object  # int32: the layout a list arm's dispatch builds (its rows unread)
    capacity_rows: int
    capacity_blocks: int
    topk: int
    l1_per_block: int
    l2_per_block: int
    num_programs: int
    headers: dict = field(default_factory=dict)  # device arm key -> (rule, lead_rows)

    def new_layout(self):
        """A device arm's layout buffer: zero blocks until a dispatch builds it."""
        import torch

        from xstage_kernels import layout as layout_kernel

        size = layout_kernel.layout_size(self.capacity_blocks)
        return torch.zeros(size, dtype=torch.int32, device=self.x.device)

    def enqueue(self, layout=None, key: str | None = None) -> None:
        """Count, lay out and gather on the current stream (no host sync). layout: the
        device arm `key`'s buffer, else the scratch one (a list arm: its rule unread)."""
        from xstage_kernels import dispatch as dispatch_kernel
        from xstage_kernels import layout as layout_kernel
        from xstage_kernels import megamoe as kernel

        rule, lead = self.headers.get(key, (schedule.RULE_WAVE, 0))
        layout = self.scratch_layout if layout is None else layout
        dispatch_kernel.count_rows(self.expert_ids, self.counts, self.rank, self.held)
        layout_kernel.build_layout(
            self.counts,
            layout,
            self.expert_row0,
            rule=rule,
            lead_rows=lead,
            num_programs=self.num_programs,
            n1=self.l1_per_block,
            n2=self.l2_per_block,
        )
        dispatch_kernel.gather_rows(
            self.expert_ids,
            self.rank,
            self.expert_row0,
            layout,
            self.x_home,
            self.xs_home,
            self.x,
            self.xs,
            self.row_dst,
            self.token_dst,
            topk=self.topk,
            pad_dst=kernel.PAD_DST,
        )

    def poison(self, torch) -> None:
        """NaN in every row the gather writes, no destination (PAD_DST: a missed row stores
        nothing, so its combine rows stay NaN), and no blocks in the scratch layout."""
        from xstage_kernels import megamoe as kernel

        if self.x.dtype == torch.float8_e4m3fn:
            self.x.view(torch.uint8).fill_(0x7F)
        else:
            self.x.fill_(float("nan"))
        if self.xs is not None:
            self.xs.fill_(float("nan"))
        self.row_dst.fill_(kernel.PAD_DST)
        self.scratch_layout.zero_()


def token_dispatch(
    point: dict,
    home,
    device,
    *,
    token_offsets: np.ndarray,
    num_programs: int,
    step_major_scales: bool,
) -> TokenDispatch:
    """A rank's dispatch from its home tokens `home` (reference.HomeTokens; one GPU, so
    every expert is local). token_offsets: (T,) int64, each token's combine rows' base
    offset from the combine buffer (0, or its host buffer's). step_major_scales: the kernel
    reads the scales step-major (formats.step_major), so the gather writes them so."""
    import torch

    from xstage_kernels import dispatch as dispatch_kernel
    from xstage_kernels import layout as layout_kernel
    from xstage_kernels import megamoe as kernel

    T, topk, E, H, I = (point[k] for k in ("tokens_per_rank", "topk", "E", "H", "I"))  # noqa: E741
    pairs = T * topk
    rows = dispatch_kernel.capacity_rows(pairs, E)
    blocks = layout_kernel.capacity_blocks(pairs, E)
    fp8 = home.xs is not None
    xs = None
    if fp8:
        channels = H // kernel.BLOCK_N
        if step_major_scales:  # (H/128, rows) in memory, written through its transpose
            xs = torch.zeros(channels, rows, dtype=torch.float32, device=device).t()
        else:
            xs = torch.zeros(rows, channels, dtype=torch.float32, device=device)

    def ints(n: int):
        return torch.zeros(n, dtype=torch.int32, device=device)

    return TokenDispatch(
        expert_ids=torch.as_tensor(home.ids.reshape(-1).astype(np.int32), device=device),
        x_home=home.xq,
        xs_home=home.xs,
        token_dst=torch.as_tensor(np.asarray(token_offsets, dtype=np.int64), device=device),
        counts=ints(E),
        rank=ints(pairs),
        held=torch.zeros(dispatch_kernel.count_scratch(pairs, E), dtype=torch.int32, device=device),
        expert_row0=ints(E),
        x=torch.zeros(rows, H, dtype=home.xq.dtype, device=device),
        xs=xs,
        row_dst=torch.full((rows,), kernel.PAD_DST, dtype=torch.int64, device=device),
        scratch_layout=torch.zeros(
            layout_kernel.layout_size(blocks), dtype=torch.int32, device=device
        ),
        capacity_rows=rows,
        capacity_blocks=blocks,
        topk=topk,
        l1_per_block=I // kernel.BLOCK_N,
        l2_per_block=H // kernel.BLOCK_N,
        num_programs=num_programs,
    )
