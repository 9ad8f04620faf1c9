"""One MoE configuration laid out on P GPUs driven by one process, ready to run.

Each rank holds E/P experts (expert parallelism) and T tokens of its own (its home
tokens). Dispatch happens once, when the problem is built (torch copies between the
GPUs; it is not part of the timed kernel): every rank receives the FP8 (or bf16) rows of
the tokens routed to its experts, in the padded expert-major layout of routing.py.

`forward` is what is timed: on every rank, zero the sync buffer and launch the fused
kernel, whose Linear-2 epilogue stores each output row into its home rank's combine
buffer (peer memory: the GPUs have peer access, and a row's destination is an element
offset from the launching rank's buffer); then a cross-GPU barrier (every rank's stream
waits for every kernel) and, on each home rank, the top-k weighted reduction of its
combine buffer (a bf16 batched GEMV with fp32 accumulation).

On the host store path (storepath.HOST) a share f of each home rank's tokens (the point's
`remote_fraction`, routing.host_tokens) is host-homed: all their top-k combine rows are
stored into that home rank's combine buffer in host memory (pinned, hostmem.host_tensor;
the same slot layout as the device combine buffer), through the same epilogue stores: a
row's destination offset is then (host buffer - launching rank's combine buffer) / 2 +
slot * H, an int64 that may be negative and far beyond 2^31. Routing stays natural. The
timed reduction is the GPU's, over its whole combine buffer (the host-homed tokens' rows
there are stale: reducing them belongs to the far end, and is not timed);
`checked_outputs` reduces the host rows too, for the check only.

On CPU tensors (the CPU tests, TRITON_INTERPRET=1) the same code runs rank after rank,
with no streams or events (the host buffers are plain CPU tensors there; host clock
stamps stand in for the kernel events).
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass

import numpy as np

from xstage_bench.data import grid, storepath
from xstage_bench.measurement import hostmem
from xstage_bench.megamoe import routing, schedule
from xstage_bench.megamoe.quant import SCALE_BLOCK, check_precision, pack_int4, quantize_rows
from xstage_bench.megamoe.reference import ExpertWeights, HomeTokens
from xstage_kernels import megamoe as kernel

INT4_STD = math.sqrt((16**2 - 1) / 12)  # standard deviation of integers uniform in [-8, 7]


def _seed(*parts: object) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode())


def _generator(torch, device, *parts: object):
    gen = torch.Generator(device=device)
    gen.manual_seed(_seed(*parts))
    return gen


def enable_peer_access(devices: list) -> None:
    """Let every GPU's kernels store into every other GPU's memory (single process).

    A device-to-device torch copy enables peer access for the pair (PyTorch's
    get_p2p_access); CuPy, where present, enables it explicitly as well. A pair that
    cannot reach each other is an error: the combine stores would fault.
    """
    import torch

    for a in devices:
        for b in devices:
            if a == b:
                continue
            if not torch.cuda.can_device_access_peer(a.index, b.index):
                raise RuntimeError(f"GPU {a.index} cannot access GPU {b.index}'s memory (no P2P)")
            torch.ones(1, device=a).to(b)
    try:
        import cupy
    except ImportError:
        return
    for a in devices:
        for b in devices:
            if a != b:
                with cupy.cuda.Device(a.index):
                    try:
                        cupy.cuda.runtime.deviceEnablePeerAccess(b.index)
                    except cupy.cuda.runtime.CUDARuntimeError as e:
                        if "PeerAccessAlreadyEnabled" not in str(e):
                            raise


def make_expert_weights(point: dict, precision: str, rank: int, device, seed: int = 0):
    """Random weights of one rank's E/P experts in the kernel's storage format.

    Values are normal (bf16, w8a8) or uniform 4-bit integers (w4a8), with block scales
    uniform in [0.5, 1.5] over the fan-in's square root, so activations stay of order one.
    Seeded by shape, precision and rank: every configuration of a shape shares them.
    """
    import torch

    check_precision(precision)
    H, I, E, P = point["H"], point["I"], point["E"], point["world_size"]  # noqa: E741
    local = E // P
    gen = _generator(torch, device, seed, point["shape"], precision, f"rank={rank}")

    def one(n: int, k: int):
        if precision == "bf16":
            w = torch.empty(local, n, k, dtype=torch.bfloat16, device=device)
            for e in range(local):
                w[e] = torch.randn(n, k, generator=gen, device=device) / math.sqrt(k)
            return w, None
        spread = 1.0 if precision == "w8a8" else INT4_STD
        scales = (
            torch.rand(local, n // SCALE_BLOCK, k // SCALE_BLOCK, generator=gen, device=device)
            + 0.5
        ) / (spread * math.sqrt(k))
        if precision == "w8a8":
            w = torch.empty(local, n, k, dtype=torch.float8_e4m3fn, device=device)
            for e in range(local):
                w[e] = torch.randn(n, k, generator=gen, device=device).to(torch.float8_e4m3fn)
        else:
            w = torch.empty(local, n, k // 2, dtype=torch.uint8, device=device)
            for e in range(local):
                ints = torch.randint(-8, 8, (n, k), generator=gen, device=device)
                w[e] = pack_int4(ints.to(torch.int8))
        return w, scales

    w1, s1 = one(2 * I, H)
    w2, s2 = one(H, I)
    return ExpertWeights(w1, s1, w2, s2)


def host_share(point: dict) -> float:
    """The share of each home rank's tokens whose combine rows go to host memory: the
    point's remote_fraction on the host path ('natural' there is 0), else 0."""
    if storepath.point_path(point) != storepath.HOST:
        return 0.0
    f = point.get("remote_fraction", 0.0)
    return 0.0 if f == grid.NATURAL else float(f)


def routing_point(point: dict) -> dict:
    """The point as routing sees it: on the host path the remote fraction is a host share,
    not a re-homing, so routing stays natural."""
    if storepath.point_path(point) == storepath.HOST:
        return {k: v for k, v in point.items() if k != "remote_fraction"}
    return point


def make_home_tokens(point: dict, precision: str, rank: int, device, seed: int = 0) -> HomeTokens:
    """One home rank's tokens (normal, then FP8-quantized per 128 channels unless bf16),
    their experts and combine weights (routing.route)."""
    import torch

    moe_key = (point["shape"], f"T={point['tokens_per_rank']}", f"P={point['world_size']}")
    gen = _generator(torch, device, seed, *moe_key, f"home={rank}")
    x = torch.randn(point["tokens_per_rank"], point["H"], generator=gen, device=device)
    ids, weights = routing.route(routing_point(point), point["skew_zipf"], rank, seed)
    if precision == "bf16":
        return HomeTokens(x.to(torch.bfloat16), None, ids, weights)
    xq, xs = quantize_rows(x)
    return HomeTokens(xq, xs, ids, weights)


@dataclass
class RankBuffers:
    """Everything one rank's kernel reads and writes."""

    plan: routing.RankRows
    grid: schedule.TileGrid
    x: object  # received rows (padded_rows, H)
    xs: object  # their scales, or a 1-element dummy (bf16)
    h: object  # intermediate (padded_rows, I)
    hs: object
    comb: object  # this rank's combine buffer (T * topk, H) bf16: peers write into it
    out: object  # (T, H) bf16 MoE output of this rank's tokens
    combine_weights: object  # (T, 1, topk) bf16
    row_dst: object  # int64 (padded_rows,): offsets from comb to each row's destination
    sync: object  # int32 (2 + blocks,)
    tiles: dict  # arm key (arm_key) -> int32 (n, 4) tile list on the device, built on demand
    sink: object = None  # local-control destination (P * T * topk, H) bf16, on demand
    row_dst_local: object = None


def act_dtype(torch, precision: str):
    """What the kernel stores activations and the intermediate as."""
    return torch.bfloat16 if precision == "bf16" else torch.float8_e4m3fn


def scale_buffer(torch, precision: str, rows: int, channels: int, device):
    """FP8 scales per 128 channels, or a 1-element dummy (bf16 has none)."""
    if precision == "bf16":
        return torch.zeros(1, dtype=torch.float32, device=device)
    return torch.zeros(rows, channels // SCALE_BLOCK, dtype=torch.float32, device=device)


def useful_flops(point: dict, plans: list[routing.RankRows]) -> float:
    """6 H I FLOPs per routed row (Linear-1: 4 H I, Linear-2: 2 H I), all ranks."""
    return 6.0 * point["H"] * point["I"] * sum(plan.rows for plan in plans)


def nvlink_bytes(
    point: dict, plans: list[routing.RankRows], host_homed: np.ndarray | None = None
) -> list[int]:
    """Bytes each rank's combine epilogue stores into peers (routing.peer_rows)."""
    return [int(np.count_nonzero(routing.peer_rows(p, host_homed))) * point["H"] * 2 for p in plans]


def host_bytes(
    point: dict, plans: list[routing.RankRows], host_homed: np.ndarray | None
) -> list[int]:
    """Bytes each rank's combine epilogue stores into host memory (routing.host_rows)."""
    return [int(np.count_nonzero(routing.host_rows(p, host_homed))) * point["H"] * 2 for p in plans]


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

    H, I, T, topk = point["H"], point["I"], point["tokens_per_rank"], point["topk"]  # noqa: E741
    precision = point["precision"]
    grid = schedule.TileGrid(
        plan.block_expert, plan.block_rows, I // kernel.BLOCK_N, H // kernel.BLOCK_N
    )
    row_dst = routing.row_destinations(
        plan, comb_offsets, H, host_offsets, host_homed, pad=kernel.PAD_DST
    )
    weights = torch.as_tensor(combine_weights, device=device)
    return RankBuffers(
        plan=plan,
        grid=grid,
        x=x,
        xs=xs,
        h=torch.empty(plan.padded_rows, I, dtype=act_dtype(torch, precision), device=device),
        hs=scale_buffer(torch, precision, plan.padded_rows, I, device),
        comb=comb,
        out=torch.empty(T, H, dtype=torch.bfloat16, device=device),
        combine_weights=weights.to(torch.bfloat16).reshape(T, 1, topk),
        row_dst=torch.as_tensor(row_dst, device=device),
        sync=torch.zeros(kernel.SYNC_HEADER + plan.blocks, dtype=torch.int32, device=device),
        tiles={},
    )


def arm_key(point: dict) -> str:
    """Which tile list a point runs: its schedule, and the lead of an interleaved point
    that names one ('interleaved/lead=1024'); a point without lead_rows uses the config's."""
    if point["schedule"] == schedule.INTERLEAVED and "lead_rows" in point:
        return f"{schedule.INTERLEAVED}/lead={int(point['lead_rows'])}"
    return point["schedule"]


def tiles_for(rb: RankBuffers, point: dict, megamoe: dict, num_programs: int) -> str:
    """The point's tile list on this rank, built (and checked) once: its key in rb.tiles.
    Knobs come from the point (lead_rows) or else the megamoe config."""
    import torch

    key = arm_key(point)
    if key not in rb.tiles:
        knobs = {**megamoe, **{k: point[k] for k in ("lead_rows",) if k in point}}
        tiles = schedule.build(point["schedule"], rb.grid, num_programs, knobs)
        rb.tiles[key] = torch.as_tensor(tiles, device=rb.x.device)
    return key


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
    )


def combine_rank(rb: RankBuffers, point: dict) -> None:
    """The home rank's top-k weighted reduction of its combine buffer (bf16 batched GEMV)."""
    import torch

    T, topk, H = point["tokens_per_rank"], point["topk"], point["H"]
    torch.bmm(rb.combine_weights, rb.comb.view(T, topk, H), out=rb.out.view(T, 1, H))


class HostStamp:
    """A host clock reading with a CUDA event's `elapsed_time` (ms): the kernel "events" of
    a CPU run, where every launch is synchronous. Never a GPU measurement."""

    def __init__(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end: HostStamp) -> float:
        return (end.t - self.t) * 1e3


class MoEProblem:
    """A configuration's inputs, weights, dispatched rows, buffers and tile lists."""

    def __init__(
        self,
        point: dict,
        megamoe: dict,
        devices: list,
        experts: list[ExpertWeights],
        *,
        num_programs: int,
        seed: int = 0,
    ):
        import torch

        self.torch = torch
        self.moe = megamoe
        self.point = {**point, "skew_zipf": megamoe["skew_zipf"]}
        self.precision = point["precision"]
        check_precision(self.precision)
        self.devices = devices
        self.experts = experts
        self.num_programs = num_programs
        self.cuda = devices[0].type == "cuda"
        self.path = storepath.point_path(point)
        H = point["H"]
        check_tiles(megamoe)
        T, topk = point["tokens_per_rank"], point["topk"]
        self.homes = [
            make_home_tokens(self.point, self.precision, r, d, seed) for r, d in enumerate(devices)
        ]
        plans = routing.dispatch_plan([h.ids for h in self.homes], point["E"], kernel.BLOCK_M)
        comb = [torch.empty(T * topk, H, dtype=torch.bfloat16, device=d) for d in devices]
        share = host_share(point)
        self.host_tokens = [
            routing.host_tokens(point, share, r, seed) if share > 0 else np.zeros(0, np.int64)
            for r in range(len(devices))
        ]
        self.host_homed = None  # (P, T) bool, or None: no row goes to host memory
        self.host_comb: list = [None] * len(devices)  # per home rank, in host memory
        host_ptrs = np.zeros(len(devices), dtype=object)
        if any(len(t) for t in self.host_tokens):
            self.host_homed = np.zeros((len(devices), T), dtype=bool)
            for r, (d, tokens) in enumerate(zip(devices, self.host_tokens, strict=True)):
                self.host_homed[r, tokens] = True
                buf = hostmem.host_tensor((T * topk, H), torch.bfloat16, d)
                if buf.data_ptr() % 16:
                    raise RuntimeError("a host combine buffer is not 16-byte aligned")
                self.host_comb[r] = buf
                host_ptrs[r] = buf.data_ptr()
        self.ranks = []
        for q, (d, plan) in enumerate(zip(devices, plans, strict=True)):
            base = comb[q].data_ptr()
            host_offsets = None
            if self.host_homed is not None:
                host_offsets = np.array([(int(p) - base) // 2 for p in host_ptrs], dtype=np.int64)
            self.ranks.append(
                rank_buffers(
                    self.point,
                    megamoe,
                    plan,
                    device=d,
                    x=self._dispatch(q, plan, "xq", H),
                    xs=self._dispatch(q, plan, "xs", H // SCALE_BLOCK),
                    comb=comb[q],
                    comb_offsets=np.array(
                        [(c.data_ptr() - base) // 2 for c in comb], dtype=np.int64
                    ),
                    combine_weights=self.homes[q].weights,
                    num_programs=num_programs,
                    host_offsets=host_offsets,
                    host_homed=self.host_homed,
                )
            )

    def arm(self, point: dict) -> str:
        """Build the point's tile list on every rank (once); its key for `forward`."""
        keys = {tiles_for(rb, point, self.moe, self.num_programs) for rb in self.ranks}
        (key,) = keys
        return key

    def _key(self, name: str) -> str:
        """A tile-list key for `forward`: an arm key already built, or a schedule name (its
        tile list built with the config's knobs)."""
        if name not in self.ranks[0].tiles:
            if name not in schedule.SCHEDULES:
                raise KeyError(f"no tile list {name!r}: build it with MoEProblem.arm(point)")
            return self.arm({"schedule": name})
        return name

    # ---- construction helpers --------------------------------------------------------

    def _dispatch(self, q: int, plan: routing.RankRows, field: str, width: int):
        """Rank q's received rows of one home-token field (xq or xs), gathered from every
        home rank; padding rows stay zero (fp8 zero, scale zero)."""
        torch = self.torch
        device = self.devices[q]
        if field == "xs" and self.precision == "bf16":
            return torch.zeros(1, dtype=torch.float32, device=device)
        dtype = act_dtype(torch, self.precision) if field == "xq" else torch.float32
        recv = torch.zeros(plan.padded_rows, width, dtype=dtype, device=device)
        raw = recv.view(torch.uint8) if dtype == torch.float8_e4m3fn else recv
        for r, home in enumerate(self.homes):
            at = np.flatnonzero(plan.home == r)
            if len(at) == 0:
                continue
            src = getattr(home, field)
            src = src.view(torch.uint8) if src.dtype == torch.float8_e4m3fn else src
            rows = src[torch.as_tensor(plan.token[at], device=src.device)].to(device)
            raw[torch.as_tensor(at, device=device)] = rows
        return recv

    def ensure_local_sink(self) -> None:
        """The local-store control's destination: the same rows, written to this rank's
        own memory (slot home * T * topk + t * topk + k), so no store crosses NVLink."""
        torch = self.torch
        T, topk, H = self.point["tokens_per_rank"], self.point["topk"], self.point["H"]
        P = len(self.devices)
        for q, rb in enumerate(self.ranks):
            if rb.sink is not None:
                continue
            plan = rb.plan
            rb.sink = torch.empty(P * T * topk, H, dtype=torch.bfloat16, device=self.devices[q])
            local = np.where(plan.home >= 0, (plan.home * T * topk + plan.slot) * H, kernel.PAD_DST)
            rb.row_dst_local = torch.as_tensor(local.astype(np.int64), device=self.devices[q])

    # ---- what the measurement reads -------------------------------------------------

    def useful_flops(self) -> float:
        return useful_flops(self.point, [rb.plan for rb in self.ranks])

    def nvlink_bytes(self) -> list[int]:
        return nvlink_bytes(self.point, [rb.plan for rb in self.ranks], self.host_homed)

    def host_bytes(self) -> list[int]:
        return host_bytes(self.point, [rb.plan for rb in self.ranks], self.host_homed)

    def remote_bytes(self) -> list[int]:
        """Bytes each rank stores across its path: into host memory on the host path, into
        peers on the peer path."""
        return self.host_bytes() if self.path == storepath.HOST else self.nvlink_bytes()

    def padded_rows(self) -> list[int]:
        return [rb.plan.padded_rows for rb in self.ranks]

    def poison(self, *, local: bool = False) -> None:
        """NaN everywhere the kernel and the combine (or, local, the control) write, the
        host combine buffers included, so a missed write shows."""
        if local:
            self.ensure_local_sink()
        self.synchronize()  # nothing of an earlier run still writes into the host buffers
        for rb in self.ranks:
            poison_rank(self.torch, rb)
        for buf in self.host_comb:
            if buf is not None:
                buf.fill_(float("nan"))

    def synchronize(self) -> None:
        if self.cuda:
            for d in self.devices:
                self.torch.cuda.synchronize(d)

    def error_flags(self) -> list[int]:
        return [int(rb.sync[1].item()) for rb in self.ranks]

    def host_unwritten(self) -> list[int]:
        """Home ranks whose host combine buffer kept a NaN of the poison in a row the kernel
        had to store there (a host-homed token's top-k rows)."""
        torch = self.torch
        T, topk, H = self.point["tokens_per_rank"], self.point["topk"], self.point["H"]
        bad = []
        for r, (buf, tokens) in enumerate(zip(self.host_comb, self.host_tokens, strict=True)):
            if buf is None or not len(tokens):
                continue
            rows = buf.view(T, topk, H)[torch.as_tensor(tokens)]
            if torch.isnan(rows).any():
                bad.append(r)
        return bad

    def combine_unwritten(self) -> list[int]:
        """Home ranks whose device combine buffer kept a NaN in a row of a GPU-homed token
        (the rows of host-homed tokens there are never written)."""
        torch = self.torch
        T, topk, H = self.point["tokens_per_rank"], self.point["topk"], self.point["H"]
        bad = []
        for r, rb in enumerate(self.ranks):
            rows = rb.comb.view(T, topk, H)
            if self.host_homed is not None:
                keep = torch.as_tensor(np.flatnonzero(~self.host_homed[r]), device=rows.device)
                rows = rows[keep]
            if torch.isnan(rows).any():
                bad.append(r)
        return bad

    def checked_outputs(self) -> list:
        """Every home rank's (T, H) output as the check sees it: the GPU's reduction for
        its GPU-homed tokens, and for host-homed tokens the same reduction of their rows in
        host memory (copied to the GPU; untimed, the far end's work)."""
        torch = self.torch
        T, topk, H = self.point["tokens_per_rank"], self.point["topk"], self.point["H"]
        outs = []
        for r, rb in enumerate(self.ranks):
            out = rb.out
            tokens = self.host_tokens[r]
            if len(tokens):
                out = out.clone()
                idx = torch.as_tensor(tokens, device=out.device)
                rows = self.host_comb[r].to(out.device).view(T, topk, H)[idx]
                out[idx] = torch.bmm(rb.combine_weights[idx], rows).view(len(tokens), H)
            outs.append(out)
        return outs

    # ---- running --------------------------------------------------------------------

    def _launch(self, q: int, name: str, *, local: bool, trace, emulate_ns=None) -> None:
        """Enqueue rank q's kernel with tile list `name` (a key of _key)."""
        launch_rank(
            self.ranks[q],
            self.experts[q],
            self.point,
            name,
            self.num_programs,
            local=local,
            trace=None if trace is None else trace[q],
            emulate_ns=emulate_ns,
        )

    def _combine(self, q: int) -> None:
        combine_rank(self.ranks[q], self.point)

    def forward(
        self,
        name: str,
        *,
        local: bool = False,
        trace: list | None = None,
        kernel_events: list | None = None,
        flushers: dict | None = None,
        emulate_ns: tuple[int, int] | None = None,
    ) -> None:
        """Enqueue one MoE layer on every rank (see the module doc) with tile list `name`
        (a schedule name, or the key MoEProblem.arm gave). local: the local-store
        control (no combine). trace: per-rank int64 (n_tiles, 6) buffers (TRACE build).
        kernel_events: a list to which [(start, end) per rank] is appended. flushers:
        rank -> callable that flushes that rank's L2 after its part is done (ranks > 0;
        the timer flushes rank 0 before its start event). emulate_ns: the compute-emulated
        build's per-tile waits (kernel.emulated_tile_ns)."""
        if local:
            self.ensure_local_sink()
        name = self._key(name)
        if not self.cuda:
            stamps = []
            for q in range(len(self.devices)):
                start = HostStamp()
                self._launch(q, name, local=local, trace=trace, emulate_ns=emulate_ns)
                stamps.append((start, HostStamp()))
            if kernel_events is not None:
                kernel_events.append(stamps)
            if not local:
                for q in range(len(self.devices)):
                    self._combine(q)
            return
        torch = self.torch
        streams = [torch.cuda.current_stream(d) for d in self.devices]
        go = torch.cuda.Event()
        go.record(streams[0])
        done, events = [], []
        for q, d in enumerate(self.devices):
            with torch.cuda.device(d):
                if q:
                    streams[q].wait_event(go)
                pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                pair[0].record(streams[q])
                self._launch(q, name, local=local, trace=trace, emulate_ns=emulate_ns)
                pair[1].record(streams[q])
                events.append(pair)
                done.append(torch.cuda.Event())
                done[q].record(streams[q])
        if kernel_events is not None:
            kernel_events.append(events)
        for q, d in enumerate(self.devices):
            with torch.cuda.device(d):
                for r, event in enumerate(done):
                    if r != q:
                        streams[q].wait_event(event)  # the cross-rank barrier
                if not local:
                    self._combine(q)
                if q:
                    finished = torch.cuda.Event()
                    finished.record(streams[q])
                    streams[0].wait_event(finished)
                    if flushers and q in flushers:
                        flushers[q]()

    def outputs(self) -> list:
        return [rb.out for rb in self.ranks]
