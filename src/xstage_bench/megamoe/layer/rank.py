"""One rank's part of a configuration: the buffers its fused kernel reads and writes, its
tile lists, and the launch.

Both process models build a rank the same way from here: one process driving every GPU
(problem.MoEProblem, one RankBuffers per GPU, peer access) and one process per GPU
(distributed.py, its combine buffer a chunk of a peer window). Only how the combine
buffers are mapped differs, and that reaches a rank as element offsets (`rank_buffers`).
The home rank's top-k reduction of its combine buffer is reduction.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xstage_bench.data.grid import DEVICE, decided_on
from xstage_bench.megamoe import routing, schedule
from xstage_bench.megamoe.quant import SCALE_BLOCK
from xstage_bench.megamoe.reference import ExpertWeights
from xstage_kernels import megamoe as kernel
from xstage_kernels.formats import step_major


@dataclass
class RankBuffers:
    """Everything one rank's kernel reads and writes."""

    plan: routing.RankRows
    grid: schedule.TileGrid
    x: object  # received rows (padded_rows, H)
    xs: object  # their scales, or a 1-element dummy (bf16)
    xs_steps: object  # the same step-major (H/128, padded_rows): what the FP8 kernel reads
    h: object  # intermediate (padded_rows, I)
    hs: object
    comb: object  # this rank's combine buffer (T * topk, H) bf16: peers write into it
    out: object  # (T, H) bf16 MoE output of this rank's tokens
    combine_weights: object  # (T, 1, topk) bf16
    row_dst: object  # int64 (padded_rows,): offsets from comb to each row's destination
    sync: object  # int32 (kernel.sync_size(blocks),): tile counter, error flag, block counters
    tiles: dict  # arm key (arm_key) -> int32 (n, 4) tile list on the device, built on demand
    # (a device-decided arm's: the order its programs claimed, written by each launch)
    layouts: dict = field(default_factory=dict)  # device-decided arm key -> its device layout
    sink: object = None  # local-control destination (P * T * topk, H) bf16, on demand
    row_dst_local: object = None
    # token_dispatch.TokenDispatch when the layer starts from home tokens (its buffers are
    # x, xs and row_dst, sized for any routing), else None: rows dispatched once at build
    dispatch: object = None

    def claimed(self, key: str):
        """Arm `key`'s tile list as it ran: a device-decided arm's buffer may have room for
        more blocks than this routing made (token_dispatch), which no launch writes."""
        return self.tiles[key][: self.grid.tiles]


def act_dtype(torch, precision: str):
    """What the kernel stores activations and the intermediate as."""
    return torch.bfloat16 if precision == "bf16" else torch.float8_e4m3fn


def scale_buffer(torch, precision: str, rows: int, channels: int, device):
    """FP8 scales per 128 channels, or a 1-element dummy (bf16 has none)."""
    if precision == "bf16":
        return torch.zeros(1, dtype=torch.float32, device=device)
    return torch.zeros(rows, channels // SCALE_BLOCK, dtype=torch.float32, device=device)


def check_tiles(megamoe: dict) -> None:
    """The config's tile sizes must be the kernel's (they are recorded, not chosen)."""
    if megamoe["block_m"] != kernel.BLOCK_M or megamoe["block_n"] != kernel.BLOCK_N:
        raise ValueError(
            f"the kernel's tiles are {kernel.BLOCK_M}x{kernel.BLOCK_N}; config asks "
            f"block_m={megamoe['block_m']}, block_n={megamoe['block_n']}"
        )


def rank_buffers(
    point: dict,
    megamoe: dict,
    plan: routing.RankRows,
    *,
    device,
    x,
    xs,
    comb,
    comb_offsets: np.ndarray,
    combine_weights: np.ndarray,
    num_programs: int,
    host_offsets: np.ndarray | None = None,
    host_homed: np.ndarray | None = None,
) -> RankBuffers:
    """One rank's buffers around its dispatched rows `x`, `xs` (tile lists: `tiles_for`).

    comb_offsets[r]: the element offset from this rank's combine buffer `comb` to rank
    r's, however the buffers are mapped (peer access in one process, a peer window
    across processes); host_offsets[r] the same to rank r's host combine buffer, used for
    the rows of host_homed[r] tokens (row_destinations).
    """
    import torch

    row_dst = routing.row_destinations(
        plan, comb_offsets, point["H"], host_offsets, host_homed, pad=kernel.PAD_DST
    )
    return _rank_around(
        point,
        plan,
        device=device,
        x=x,
        xs=xs,
        xs_steps=step_major(xs) if xs.ndim == 2 else xs,
        row_dst=torch.as_tensor(row_dst, device=device),
        comb=comb,
        combine_weights=combine_weights,
        rows=plan.padded_rows,
        blocks=plan.blocks,
    )


def _rank_around(
    point: dict,
    plan: routing.RankRows,
    *,
    device,
    x,
    xs,
    xs_steps,
    row_dst,
    comb,
    combine_weights: np.ndarray,
    rows: int,
    blocks: int,
    dispatch=None,
) -> RankBuffers:
    """A rank's buffers around its rows `x` (room for `rows`) and destinations `row_dst`:
    the intermediate for as many rows, a sync buffer for `blocks` row blocks, its output
    and combine weights; the tile grid from the host's `plan`."""
    import torch

    H, I, T, topk = point["H"], point["I"], point["tokens_per_rank"], point["topk"]  # noqa: E741
    precision = point["precision"]
    weights = torch.as_tensor(combine_weights, device=device)
    return RankBuffers(
        plan=plan,
        grid=schedule.TileGrid(
            plan.block_expert, plan.block_rows, I // kernel.BLOCK_N, H // kernel.BLOCK_N
        ),
        x=x,
        xs=xs,
        xs_steps=xs_steps,
        h=torch.empty(rows, I, dtype=act_dtype(torch, precision), device=device),
        hs=scale_buffer(torch, precision, rows, I, device),
        comb=comb,
        out=torch.empty(T, H, dtype=torch.bfloat16, device=device),
        combine_weights=weights.to(torch.bfloat16).reshape(T, 1, topk),
        row_dst=row_dst,
        sync=torch.zeros(kernel.sync_size(blocks), dtype=torch.int32, device=device),
        tiles={},
        dispatch=dispatch,
    )


def token_rank_buffers(
    point: dict,
    plan: routing.RankRows,
    dispatch,
    *,
    comb,
    combine_weights: np.ndarray,
) -> RankBuffers:
    """One rank's buffers around the GPU's dispatch (token_dispatch.TokenDispatch): the
    rows, scales and destinations it gathers, the intermediate and sync buffer sized for
    its capacity. plan: the host's view of the same rows, for the checks and the counts."""
    import torch

    device = dispatch.x.device
    xs = dispatch.xs
    if xs is None:  # bf16: the kernel's 1-element dummy
        xs = scale_buffer(torch, point["precision"], 0, point["H"], device)
    return _rank_around(
        point,
        plan,
        device=device,
        x=dispatch.x,
        xs=xs,
        # The gather writes the scales step-major where the kernel reads them so
        # (token_dispatch); else a launch that needs them so makes them (megamoe.launch).
        xs_steps=xs.t() if not xs.is_contiguous() else (None if xs.ndim == 2 else xs),
        row_dst=dispatch.row_dst,
        comb=comb,
        combine_weights=combine_weights,
        rows=dispatch.capacity_rows,
        blocks=dispatch.capacity_blocks,
        dispatch=dispatch,
    )


def arm_key(point: dict) -> str:
    """Which tile list a point runs: its schedule, the lead of an interleaved point that
    names one ('interleaved/lead=1024'; a point without lead_rows uses the config's), and
    '@device' where its programs decide the order (grid.decided_on)."""
    key = point["schedule"]
    if point["schedule"] == schedule.INTERLEAVED and "lead_rows" in point:
        key = f"{schedule.INTERLEAVED}/lead={int(point['lead_rows'])}"
    return key + schedule.DEVICE_SUFFIX if decided_on(point) == DEVICE else key


def is_device_key(key: str) -> bool:
    return key.endswith(schedule.DEVICE_SUFFIX)


def arm_knobs(point: dict, megamoe: dict) -> dict:
    """The schedule knobs an arm runs with: the point's lead_rows, else the config's."""
    return {**megamoe, **{k: point[k] for k in ("lead_rows",) if k in point}}


def tiles_for(rb: RankBuffers, point: dict, megamoe: dict, num_programs: int) -> str:
    """The point's tile list on this rank, built (and checked) once: its key in rb.tiles.
    Knobs come from the point (lead_rows) or else the megamoe config."""
    import torch

    key = arm_key(point)
    if key not in rb.tiles:
        knobs = arm_knobs(point, megamoe)
        if is_device_key(key):
            blocks = rb.grid.blocks
            if rb.dispatch is not None:  # built on the GPU by each forward, for any routing
                header = schedule.layout_header(point["schedule"], num_programs, knobs)
                rb.dispatch.headers[key] = header
                rb.layouts[key] = rb.dispatch.new_layout()
                blocks = rb.dispatch.capacity_blocks
            else:
                layout = schedule.device_layout(point["schedule"], rb.grid, num_programs, knobs)
                rb.layouts[key] = torch.as_tensor(layout, device=rb.x.device)
            tiles = blocks * (rb.grid.l1_per_block + rb.grid.l2_per_block)  # the realized order
            rb.tiles[key] = torch.full((tiles, 4), -1, dtype=torch.int32, device=rb.x.device)
        else:
            tiles = schedule.build(point["schedule"], rb.grid, num_programs, knobs)
            rb.tiles[key] = torch.as_tensor(tiles, device=rb.x.device)
    return key


def realized_order_error(rb: RankBuffers, key: str, point: dict, megamoe: dict, num_programs: int):
    """After a device-decided launch: why the order its programs claimed is wrong, or None.
    It must list every tile once, each Linear-2 tile after its block's Linear-1 tiles, and
    be its rule's order exactly (schedule.claim_order: no rule reads time, interleaved is
    counted)."""
    if not is_device_key(key):
        return None
    realized = rb.claimed(key).cpu().numpy()
    try:
        schedule.check_dependencies(realized, rb.grid)
    except schedule.ScheduleError as e:
        return f"the order the device claimed breaks the schedule: {e}"
    lead = int(arm_knobs(point, megamoe).get("lead_rows", 0))
    ruled = schedule.claim_order(point["schedule"], rb.grid, num_programs, lead)
    if not np.array_equal(realized, ruled):
        first = int(np.flatnonzero((realized != ruled).any(axis=1))[0])
        name = point["schedule"]
        return f"the order the device claimed differs from the {name} rule's at {first}"
    return None


def poison_rank(torch, rb: RankBuffers) -> None:
    """NaN everywhere one rank's kernel and combine (or the local control) write."""
    for t in (rb.comb, rb.out):
        t.fill_(float("nan"))
    if rb.h.dtype == torch.float8_e4m3fn:
        rb.h.view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
        rb.hs.fill_(float("nan"))
    else:
        rb.h.fill_(float("nan"))
    if rb.sink is not None:
        rb.sink.fill_(float("nan"))
    if rb.dispatch is not None:  # what the dispatch writes too
        rb.dispatch.poison(torch)
        for layout in rb.layouts.values():
            layout.zero_()


def launch_rank(
    rb: RankBuffers,
    ex: ExpertWeights,
    point: dict,
    name: str,
    num_programs: int,
    *,
    local: bool = False,
    trace=None,
    emulate_ns: tuple[int, int] | None = None,
) -> None:
    """Zero the rank's sync buffer and enqueue its fused kernel with schedule `name`
    (emulate_ns: the compute-emulated build, see xstage_kernels.megamoe)."""
    dummy = rb.xs if point["precision"] == "bf16" else None
    rb.sync.zero_()
    kernel.launch(
        precision=point["precision"],
        tiles=rb.tiles[name],
        sync=rb.sync,
        x=rb.x,
        xs=rb.xs,
        w1=ex.w1,
        s1=dummy if ex.s1 is None else ex.s1,
        w2=ex.w2,
        s2=dummy if ex.s2 is None else ex.s2,
        h=rb.h,
        hs=rb.hs,
        out=rb.sink if local else rb.comb,
        row_dst=rb.row_dst_local if local else rb.row_dst,
        H=point["H"],
        I=point["I"],
        num_programs=num_programs,
        trace=trace,
        emulate_ns=emulate_ns,
        xs_steps=rb.xs_steps,
        layout=rb.layouts.get(name),
    )
