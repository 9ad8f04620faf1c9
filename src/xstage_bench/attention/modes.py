"""The three Ulysses modes, their correctness check, and one timed repetition.

- alone:  attention only, output in this rank's (B, S, H/P, D) buffer;
- serial: attention, then the yunchang/xDiT reshape, NCCL `all_to_all_single`, reshape
          back: rank j ends with its (B, S/P, H, D) tokens for all heads;
- fused:  attention whose output rows are stored straight into their owner's final buffer
          during the kernel (backends.FusedTarget).

Two clocks per repetition, both from the start of the rank's work: sender-visible (the
rank's own work is done: attention for alone/fused, attention + All-to-All for serial) and
completion (every rank can read its full result: after a system-scope fence and a
cross-rank barrier). Each repetition starts behind a cross-rank barrier, so the ranks'
clocks start together, and its samples are the maximum over ranks.

The modes run on a `fabric.CudaFabric` (the measurement) or, in the CPU tests, a
`fabric.HostFabric`: the collective group, peer windows, the barrier and the clock. The
same functions serve the host path (host.HostWorkspace on a fabric.SoloFabric: one GPU,
host memory as the far end, the barrier a system-scope fence) and the emulated world sizes
(emulation.EmulatedWorkspace): a workspace says where rows land and how to read them back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from xstage_bench.attention.backends import FusedTarget, sdpa_reference
from xstage_bench.attention.layout import (
    UlyssesLayout,
    pack_for_all_to_all,
    unpack_after_all_to_all,
)
from xstage_bench.measurement.vmm import tensor_at

MODES = ("alone", "serial", "fused")
# Max |error| allowed against the reference, as a fraction of the reference's largest
# |value|: a few bf16/fp16 rounding steps (2^-8 relative) at the top of the range. A
# misplaced row or head is off by about the whole range.
REL_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-4}


class Workspace:
    """Buffers of one (B, S, H, D) shape on one rank, reused by every backend and mode."""

    def __init__(self, layout: UlyssesLayout, fabric, dtype: torch.dtype):
        self.layout, self.fabric, self.dtype = layout, fabric, dtype
        rank, dev = fabric.rank, fabric.device
        self.q, self.k, self.v, self.out = (
            torch.empty(layout.local_shape, dtype=dtype, device=dev) for _ in range(4)
        )
        b, shard, h, d = layout.final_shape
        final_bytes = b * shard * h * d * dtype.itemsize
        final_strides = (shard * h * d, h * d, d, 1)
        self.window = fabric.window(final_bytes)
        self.final = tensor_at(
            self.window.chunk_ptr(rank),
            self.window.chunk_bytes,
            dev,
            dtype,
            layout.final_shape,
            final_strides,
        )
        self.target = FusedTarget(
            dest_ptrs=torch.tensor(
                [self.window.chunk_ptr(r) for r in range(layout.world_size)],
                dtype=torch.int64,
                device=dev,
            ),
            dest_strides=final_strides[:3],
            rows_per_dest=shard,
            head_offset=layout.head_offset(rank),
            peer_out=None,
        )
        self._peer_out_view(final_bytes)

    def _peer_out_view(self, final_bytes: int) -> None:
        """This rank's heads of one (1, S, H, D) tensor spanning every rank's chunk."""
        first = self.layout.head_offset(self.fabric.rank)
        self.target.peer_out, self.target.peer_out_reason = spanning_out_view(
            self.window, self.layout, self.dtype, first, final_bytes
        )

    def poison(self) -> None:
        self.out.fill_(float("nan"))
        self.final.fill_(float("nan"))

    def exchange(self, out) -> torch.Tensor:
        """The serial All-to-All: the yunchang/xDiT reshape, NCCL `all_to_all_single`,
        and the reshape back to this rank's (B, S/P, H, D)."""
        p = self.layout.world_size
        packed = pack_for_all_to_all(out, p)
        received = torch.empty_like(packed)
        dist.all_to_all_single(received, packed, group=self.fabric.group)
        return unpack_after_all_to_all(received, p)

    def outcome(self, result: torch.Tensor, ref_local: torch.Tensor):
        """(this rank's final tokens, what they should be), built independently."""
        return result, expected_final(ref_local, self.layout, self.fabric.group)

    def fill(self, seed: int) -> None:
        fill_inputs(self, seed)

    def close(self) -> None:
        self.window.close()


def spanning_out_view(window, layout: UlyssesLayout, dtype, first_head: int, share_bytes: int):
    """(view, "") or (None, why not): heads first_head .. first_head + H/P - 1 of one
    (1, S, H, D) tensor over the window's chunks in order, chunk v holding owner v's
    (1, S/P, H, D) rows, so that an unmodified kernel given it as `out` stores each row
    in its owner's chunk. Needs one address range, batch 1 (tokens one strided axis) and
    chunks of exactly `share_bytes` (no padding between owners)."""
    if not window.contiguous:
        return None, "this window's chunks are not one address range"
    if layout.batch != 1:
        return None, (
            f"batch={layout.batch}: rank chunks hold (B, S/P, H, D), "
            "so tokens are one strided axis only at batch 1"
        )
    if window.chunk_bytes != share_bytes:
        return None, (
            f"each rank's share ({share_bytes} bytes) is not a multiple of the mapping "
            f"granularity, so the chunks are padded to {window.chunk_bytes} bytes"
        )
    s, h, d = layout.seq_len, layout.heads, layout.head_dim
    full = window.view(dtype, (1, s, h, d), (s * h * d, h * d, d, 1))
    return full[:, :, first_head : first_head + layout.local_heads, :], ""


def fill_inputs(ws, seed: int) -> None:
    """Fresh random q, k, v for this rank. q is scaled up so that softmax is peaked and
    every query row differs visibly: a misplaced row cannot pass the check."""
    gen = torch.Generator(device=ws.fabric.device)
    gen.manual_seed(seed)
    for t, scale in ((ws.q, 2.0), (ws.k, 1.0), (ws.v, 1.0)):
        t.copy_(torch.randn(t.shape, generator=gen, device=t.device) * scale)


def run_alone(backend, ws: Workspace) -> torch.Tensor:
    backend.local(ws.q, ws.k, ws.v, ws.out)
    return ws.out


def run_serial(backend, ws: Workspace) -> torch.Tensor:
    backend.local(ws.q, ws.k, ws.v, ws.out)
    return ws.exchange(ws.out)


def run_fused(backend, ws: Workspace) -> torch.Tensor:
    backend.fused(ws.q, ws.k, ws.v, ws.target)
    return ws.final


RUNNERS = {"alone": run_alone, "serial": run_serial, "fused": run_fused}


def expected_final(ref_local: torch.Tensor, layout: UlyssesLayout, group) -> torch.Tensor:
    """What rank j must hold after the All-to-All, built independently of the yunchang
    reshapes: slice j of every rank's reference, gathered and stacked by source head."""
    p, shard = layout.world_size, layout.shard_len
    send = torch.stack([ref_local[:, j * shard : (j + 1) * shard] for j in range(p)])
    recv = torch.empty_like(send)  # (P, B, S/P, H/P, D); recv[i] came from rank i
    dist.all_to_all_single(recv, send, group=group)
    b, _, hl, d = ref_local.shape
    return recv.permute(1, 2, 0, 3, 4).reshape(b, shard, p * hl, d)


def compare(result: torch.Tensor, expected: torch.Tensor) -> tuple[bool, float, str]:
    """(within tolerance, max |error|, what was wrong if anything)."""
    if result.shape != expected.shape:
        return False, float("inf"), f"shape {tuple(result.shape)} != {tuple(expected.shape)}"
    got, want = result.float(), expected.float()
    nan = int(torch.isnan(got).sum())
    if nan:
        return False, float("nan"), f"{nan} output values still NaN (poison not overwritten)"
    err = float((got - want).abs().max())
    bound = REL_TOLERANCE[result.dtype] * max(float(want.abs().max()), 1e-6)
    if err > bound:
        return False, err, f"max |error| {err:.3g} > {bound:.3g}"
    return True, err, ""


@dataclass
class Verdict:
    correct: bool
    max_abs_err: float
    detail: str
    bitwise_equal_serial: bool | None = None


def check(backend, mode: str, ws: Workspace, seed: int) -> Verdict:
    """Run `mode` once on fresh inputs into NaN-poisoned outputs and compare it with SDPA
    (and, for fused, with the serial path's result). Collective: every rank calls it with
    the same arguments. `ws` is a Workspace or an emulation.EmulatedWorkspace."""
    fabric = ws.fabric
    ws.fill(seed)
    ws.poison()
    fabric.wait()
    fabric.host_barrier()  # nobody writes into a peer before that peer has poisoned
    result = RUNNERS[mode](backend, ws)
    fabric.barrier()
    fabric.wait()
    ref_local = sdpa_reference(ws.q, ws.k, ws.v)
    if mode == "alone":
        return Verdict(*compare(result, ref_local))
    got, want = ws.outcome(result, ref_local)
    ok, err, detail = compare(got, want)
    if mode != "fused":
        return Verdict(ok, err, detail)
    fused = got.clone()
    fabric.host_barrier()  # every rank has read its fused rows before serial rewrites them
    serial = run_serial(backend, ws)
    fabric.barrier()
    fabric.wait()
    serial, _ = ws.outcome(serial, ref_local)
    same = bool(torch.equal(fused, serial))
    ok_s, err_s, detail_s = compare(fused, serial)
    if not ok_s:
        detail = "; ".join(x for x in (detail, f"vs serial: {detail_s}") if x)
    return Verdict(ok and ok_s, max(err, err_s), detail, same)


def timed_rep(backend, mode: str, ws: Workspace, flush=None, lead=None) -> tuple[float, float]:
    """One repetition on this rank: (sender-visible us, completion us). With `lead` (a
    timing.HostLead; GPU fabrics only) the GPU sleeps before the barrier while the host
    enqueues the rest, so the clocks time GPU work: the ranks still leave the barrier
    together, and the call's enqueue is recorded and checked."""
    fabric = ws.fabric
    if flush is not None:
        flush()
    if lead is not None:
        lead.before_start(torch)
    fabric.barrier()  # start together
    start = fabric.stamp()
    enqueue_start = time.perf_counter()
    RUNNERS[mode](backend, ws)
    if lead is not None:
        lead.after_enqueue(start, (time.perf_counter() - enqueue_start) * 1e6)
    sent = fabric.stamp()
    fabric.barrier()
    done = fabric.stamp()
    fabric.wait(done)
    return fabric.elapsed_us(start, sent), fabric.elapsed_us(start, done)
