"""One MoE configuration laid out on P GPUs driven by one process, ready to run.

Each rank holds E/P experts (expert parallelism) and T tokens of its own (its home
tokens). Dispatch happens once, when the problem is built (torch copies between the
GPUs; it is not part of the timed kernel): every rank receives the FP8 (or bf16) rows of
the tokens routed to its experts, in the padded expert-major layout of routing.py; or,
where the layer starts from home tokens (megamoe.layer_from, one GPU), in every forward on
the GPU before the kernel, inside the timed layer (token_dispatch.py). The inputs are
inputs.py's, each rank's buffers and launch rank.py's.

`forward` is what is timed: on every rank, zero the sync buffer and launch the fused
kernel, whose Linear-2 epilogue stores each output row into its home rank's combine
buffer (peer memory: the GPUs have peer access, and a row's destination is an element
offset from the launching rank's buffer); then a cross-GPU barrier (every rank's stream
waits for every kernel) and, on each home rank, the top-k weighted reduction of its
combine buffer (reduction.py: the Triton kernel xstage_kernels.combine on GPUs, torch.bmm
on the CPU; the check runs the same one). On a GPU the launches are replayed from CUDA
graphs that `arm` captures (graphs.py: the host's eager launch path is slower than the
GPU at small token counts).

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

import time

import numpy as np

from xstage_bench.data import storepath
from xstage_bench.measurement import hostmem
from xstage_bench.megamoe import routing, schedule
from xstage_bench.megamoe.layer import accounting, graphs, reduction, token_dispatch
from xstage_bench.megamoe.layer.inputs import host_share, make_home_tokens
from xstage_bench.megamoe.layer.rank import (
    act_dtype,
    check_tiles,
    launch_rank,
    poison_rank,
    rank_buffers,
    realized_order_error,
    tiles_for,
    token_rank_buffers,
)
from xstage_bench.megamoe.quant import SCALE_BLOCK, check_precision
from xstage_bench.megamoe.reference import ExpertWeights
from xstage_kernels import megamoe as kernel


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


class HostStamp:
    """A host clock reading with a CUDA event's `elapsed_time` (ms): the kernel "events" of
    a CPU run, where every launch is synchronous. Never a GPU measurement."""

    def __init__(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end: HostStamp) -> float:
        return (end.t - self.t) * 1e3


def problem_point(point: dict, megamoe: dict) -> dict:
    """The point as the problem (and a worker baseline's copy of its inputs) reads it."""
    return {**point, "skew_zipf": megamoe["skew_zipf"]}


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
        self.point = problem_point(point, megamoe)
        self.precision = point["precision"]
        check_precision(self.precision)
        self.devices = devices
        self.experts = experts
        self.num_programs = num_programs
        self.cuda = devices[0].type == "cuda"
        # The top-k reduction both the check and the timed runs use (reduction.py).
        self.reduction = reduction.default_reduction(devices[0].type)
        self.path = storepath.point_path(point)
        H = point["H"]
        check_tiles(megamoe)
        token_dispatch.check_supported(point, megamoe)
        self.from_tokens = token_dispatch.layer_from(megamoe) == token_dispatch.HOME_TOKENS
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
        self._graphs: dict[tuple, list[graphs.RankGraphs]] = {}  # graphs.graph_key -> per rank
        self.ranks = []
        for q, (d, plan) in enumerate(zip(devices, plans, strict=True)):
            base = comb[q].data_ptr()
            host_offsets = None
            if self.host_homed is not None:
                host_offsets = np.array([(int(p) - base) // 2 for p in host_ptrs], dtype=np.int64)
            if self.from_tokens:  # one GPU (check_supported): its own tokens, every expert
                self.ranks.append(self._token_rank(q, plan, comb[q], host_offsets))
                continue
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

    def arm(self, point: dict, *, graphed: bool = False) -> str:
        """Build the point's tile list on every rank (once); its key for `forward`.
        graphed: also capture its launches as CUDA graphs now (on a GPU; graphs.py), so
        that a check after this replays them (their capture runs the layer once)."""
        keys = {tiles_for(rb, point, self.moe, self.num_programs) for rb in self.ranks}
        (key,) = keys
        if graphed and self.cuda:
            self._rank_graphs(key)
        return key

    def trace_buffers(self, key: str) -> list:
        """Per rank a zeroed int64 (tiles, 6) buffer for a traced forward of arm `key`."""
        torch = self.torch
        return [
            torch.zeros(rb.tiles[key].shape[0], 6, dtype=torch.int64, device=d)
            for rb, d in zip(self.ranks, self.devices, strict=True)
        ]

    def traced(self, key: str, bufs: list) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """After a traced forward of arm `key`: per rank its stamps and the tiles they stamp,
        the claimed ones (a buffer with room for any routing's tiles holds this one's
        first)."""
        tiles = [rb.claimed(key).cpu().numpy() for rb in self.ranks]
        stamps = [b[: len(t)].cpu().numpy() for b, t in zip(bufs, tiles, strict=True)]
        return stamps, tiles

    def realized_order_error(self, key: str, point: dict) -> str | None:
        """After a checked run: why a device-decided arm's claimed order is wrong on some
        rank (rank.realized_order_error), or None."""
        for q, rb in enumerate(self.ranks):
            error = realized_order_error(rb, key, point, self.moe, self.num_programs)
            if error:
                return f"rank {q}: {error}"
        return None

    def launch_mode(self) -> str:
        """How `forward` enqueues the layer as timed (no trace, not emulated, not the
        local control): replayed graphs on a GPU, eager launches elsewhere."""
        return graphs.CUDA_GRAPH if self.cuda else graphs.EAGER

    def _rank_graphs(self, name: str) -> list[graphs.RankGraphs]:
        """Every rank's captured launches with tile list `name`, captured on first use."""
        key = graphs.graph_key(name)
        if key not in self._graphs:
            torch = self.torch
            self._graphs[key] = [
                graphs.RankGraphs(
                    kernel=graphs.capture(
                        torch, d, lambda q=q: self._launch(q, name, local=False, trace=None)
                    ),
                    combine=graphs.capture(torch, d, lambda q=q: self._combine(q)),
                    dispatch=self.ranks[q].dispatch
                    and graphs.capture(torch, d, lambda q=q: self._dispatch_tokens(q, name)),
                )
                for q, d in enumerate(self.devices)
            ]
        return self._graphs[key]

    def _key(self, name: str) -> str:
        """A tile-list key for `forward`: an arm key already built, or a schedule name (its
        tile list built with the config's knobs)."""
        if name not in self.ranks[0].tiles:
            if name not in schedule.SCHEDULES:
                raise KeyError(f"no tile list {name!r}: build it with MoEProblem.arm(point)")
            return self.arm({"schedule": name})
        return name

    # ---- construction helpers --------------------------------------------------------

    def _token_rank(self, q: int, plan: routing.RankRows, comb, host_offsets):
        """Rank q's buffers around a dispatch on its GPU from its home tokens."""
        home = self.homes[q]
        token_offsets = np.zeros(self.point["tokens_per_rank"], dtype=np.int64)
        if host_offsets is not None:  # the host-homed tokens' rows go to the host buffer
            token_offsets[self.host_homed[q]] = host_offsets[q]
        step_major = kernel.uses_ws_kernel(self.precision, home.xq)
        if step_major:
            from xstage_kernels import megamoe_ws

            step_major = megamoe_ws.SCALES_TMA  # what the warp-specialized kernel reads
        dispatch = token_dispatch.token_dispatch(
            self.point,
            home,
            self.devices[q],
            token_offsets=token_offsets,
            num_programs=self.num_programs,
            step_major_scales=step_major,
        )
        return token_rank_buffers(
            self.point, plan, dispatch, comb=comb, combine_weights=home.weights
        )

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
            local = np.full(rb.x.shape[0], kernel.PAD_DST, dtype=np.int64)  # any capacity
            rows = np.flatnonzero(plan.home >= 0)
            local[rows] = (plan.home[rows] * T * topk + plan.slot[rows]) * H
            rb.row_dst_local = torch.as_tensor(local, device=self.devices[q])

    # ---- what the measurement reads -------------------------------------------------

    def useful_flops(self) -> float:
        return accounting.useful_flops(self.point, [rb.plan for rb in self.ranks])

    def nvlink_bytes(self) -> list[int]:
        return accounting.nvlink_bytes(self.point, [rb.plan for rb in self.ranks], self.host_homed)

    def host_bytes(self) -> list[int]:
        return accounting.host_bytes(self.point, [rb.plan for rb in self.ranks], self.host_homed)

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
                part = torch.empty(len(tokens), H, dtype=torch.bfloat16, device=out.device)
                reduction.reduce(rb.combine_weights[idx], rows.view(-1, H), part, self.reduction)
                out[idx] = part
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

    def _dispatch_tokens(self, q: int, name: str) -> None:
        """Enqueue rank q's dispatch from its home tokens, for arm `name` (token_dispatch);
        nothing where its rows were dispatched when the problem was built."""
        rb = self.ranks[q]
        if rb.dispatch is not None:
            rb.dispatch.enqueue(rb.layouts.get(name), name)

    def _combine(self, q: int) -> None:
        reduction.combine_rank(self.ranks[q], self.point, self.reduction)

    def forward(
        self,
        name: str,
        *,
        local: bool = False,
        trace: list | None = None,
        kernel_events: list | None = None,
        flushers: dict | None = None,
        emulate_ns: tuple[int, int] | None = None,
        eager: bool = False,
        dispatch_events: list | None = None,
    ) -> None:
        """Enqueue one MoE layer on every rank (see the module doc) with tile list `name`
        (a schedule name, or the key MoEProblem.arm gave). local: the local-store
        control (no combine). trace: per-rank int64 (n_tiles, 6) buffers (TRACE build).
        kernel_events: a list to which [(start, end) per rank] is appended. flushers:
        rank -> callable that flushes that rank's L2 after its part is done (ranks > 0;
        the timer flushes rank 0 before its start event). emulate_ns: the compute-emulated
        build's per-tile waits (kernel.emulated_tile_ns). On a GPU the layer as timed (no
        trace, not emulated, not local) replays `arm`'s graphs, captured here if it did not;
        eager: launch from Python all the same (kernels/ab compares the two).
        dispatch_events: where the layer starts from home tokens, a list to which [(start,
        end) per rank] around each rank's dispatch is appended."""
        if local:
            self.ensure_local_sink()
        name = self._key(name)
        if not self.cuda:
            stamps, dispatched = [], []
            for q in range(len(self.devices)):
                before = HostStamp()
                self._dispatch_tokens(q, name)
                dispatched.append((before, HostStamp()))
                start = HostStamp()
                self._launch(q, name, local=local, trace=trace, emulate_ns=emulate_ns)
                stamps.append((start, HostStamp()))
            if kernel_events is not None:
                kernel_events.append(stamps)
            if dispatch_events is not None and self.from_tokens:
                dispatch_events.append(dispatched)
            if not local:
                for q in range(len(self.devices)):
                    self._combine(q)
            return
        torch = self.torch
        replayed = None
        if trace is None and emulate_ns is None and not local and not eager:
            replayed = self._rank_graphs(name)
        streams = [torch.cuda.current_stream(d) for d in self.devices]
        go = torch.cuda.Event()
        go.record(streams[0])
        done, events, dispatched = [], [], []
        for q, d in enumerate(self.devices):
            with torch.cuda.device(d):
                if q:
                    streams[q].wait_event(go)
                timed = dispatch_events is not None and self.from_tokens
                if timed:  # events only where asked: they are enqueued inside time_us
                    around = (
                        torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True),
                    )
                    around[0].record(streams[q])
                if replayed and replayed[q].dispatch:
                    replayed[q].dispatch.replay()
                elif not replayed:
                    self._dispatch_tokens(q, name)
                if timed:
                    around[1].record(streams[q])
                    dispatched.append(around)
                pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                pair[0].record(streams[q])
                if replayed:
                    replayed[q].kernel.replay()
                else:
                    self._launch(q, name, local=local, trace=trace, emulate_ns=emulate_ns)
                pair[1].record(streams[q])
                events.append(pair)
                done.append(torch.cuda.Event())
                done[q].record(streams[q])
        if kernel_events is not None:
            kernel_events.append(events)
        if dispatched:
            dispatch_events.append(dispatched)
        for q, d in enumerate(self.devices):
            with torch.cuda.device(d):
                for r, event in enumerate(done):
                    if r != q:
                        streams[q].wait_event(event)  # the cross-rank barrier
                if replayed:
                    replayed[q].combine.replay()
                elif not local:
                    self._combine(q)
                if q:
                    finished = torch.cuda.Event()
                    finished.record(streams[q])
                    streams[0].wait_event(finished)
                    if flushers and q in flushers:
                        flushers[q]()

    def outputs(self) -> list:
        return [rb.out for rb in self.ranks]
