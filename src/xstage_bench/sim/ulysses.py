"""Ulysses attention on one rank, with the post-attention All-to-All alone, serial or fused.

After the first All-to-All a rank holds the full sequence S for H/P heads. Its attention
kernel runs one persistent program per SM over Q tiles of 128 rows; a tile costs
4*128*S*D FLOPs (QK^T and PV, non-causal) at the SM's share of the bf16 matrix rate times
ATTENTION_EFFICIENCY. Every tile ends with an epilogue that stores its 128 x D bf16 output:

- alone:  all of it locally (the kernel without any communication);
- serial: alone, then an All-to-All kernel pushes the remote (P-1)/P share of the whole
          output through the peer path (one burst from every SM);
- fused:  each tile's epilogue pushes its remote share through the peer path (capacity
          Q, drain R: backpressure stalls that program) and the rest locally, and the
          program goes on with its next Q tile while the X-Stage drains.

sender_us is when the last program has issued its last store; completion_us is when
every byte has also drained. Ranks are symmetric, so one rank stands for all.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from xstage_bench.data.hardware import HardwareProfile
from xstage_bench.megamoe.drain import EventBudget, PathParams
from xstage_bench.sim.xstage import path_params, simulate_bursts

Q_TILE_ROWS = 128
OUTPUT_BYTES = 2  # bf16
# FA3 and FA4 reached 660-700 TFLOP/s forward (bf16, head_dim 128) on H200 (DEVICE.md),
# about 0.85 of the H200 profile's 790 TFLOP/s; the simulator applies that to every profile.
ATTENTION_EFFICIENCY = 0.85
MODES = ("alone", "serial", "fused")


@dataclass(frozen=True)
class AttentionResult:
    sender_us: float
    completion_us: float
    tflops: float  # attention FLOPs over sender_us


def _tiles(
    n_tiles: int,
    programs: int,
    tile_us: float,
    remote_bytes: float,
    local_bytes: float,
    peer: PathParams,
    local: PathParams,
) -> tuple[float, float]:
    """Persistent programs over identical tiles, each ending with its epilogue stores."""
    peer_path, local_path = peer.new_path(), local.new_path()
    events: list[tuple[float, int, str, int]] = []
    seq = 0
    taken = 0
    sender = 0.0
    began: dict[int, float] = {}  # program -> when its epilogue stores began
    budget = EventBudget(n_tiles + programs, f"attention: {n_tiles} tiles")

    def push(t: float, what: str, prog: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, what, prog))
        seq += 1

    def next_tile(prog: int, t: float) -> None:
        nonlocal taken, sender
        if taken == n_tiles:
            sender = max(sender, t)
            return
        taken += 1
        push(t + tile_us, "epilogue", prog)

    def issue_local(prog: int, t: float) -> None:
        if local_bytes > 0:
            local_path.add(prog, local_bytes)
        else:
            stored(prog, t)

    def stored(prog: int, t: float) -> None:
        """Every byte admitted: the epilogue ends as PathParams.issue_end says."""
        push(peer.issue_end(began.pop(prog), remote_bytes + local_bytes, t), "stored", prog)

    for prog in range(programs):
        next_tile(prog, 0.0)
    while events or peer_path.n or local_path.n:
        budget.step()
        t = min(events[0][0] if events else math.inf, peer_path.next_time(), local_path.next_time())
        remote_done, local_done = peer_path.advance(t), local_path.advance(t)
        for prog, _ in remote_done:
            issue_local(prog, t)
        for prog, _ in local_done:
            stored(prog, t)
        while events and events[0][0] <= t:
            _, _, what, prog = heapq.heappop(events)
            if what == "stored":
                next_tile(prog, t)
                continue
            began[prog] = t  # the epilogue's stores go to the path at once
            if remote_bytes > 0:
                peer_path.add(prog, remote_bytes)
            else:
                issue_local(prog, t)
    return sender, max(sender, peer_path.empty_time(), local_path.empty_time())


def simulate(point: dict, profile: HardwareProfile) -> AttentionResult:
    """One (mode, heads, seq_len) point of the Ulysses sweep on `profile`; at an emulated
    world size, the load of a rank of that node (its heads, its remote share)."""
    mode, P = point["mode"], point.get("emulated_world_size") or point["world_size"]
    heads, S, D, batch = point["heads"], point["seq_len"], point["head_dim"], point["batch"]
    if mode not in MODES:
        raise ValueError(f"attention mode must be one of {MODES}, got {mode!r}")
    if heads % P:
        raise ValueError(f"heads={heads} do not divide over world_size={P}")
    n_tiles = batch * (heads // P) * math.ceil(S / Q_TILE_ROWS)
    flops_per_us_per_sm = (
        profile.matrix_tflops["bf16"] * 1e6 * ATTENTION_EFFICIENCY / profile.sm_count
    )
    tile_us = 4.0 * Q_TILE_ROWS * S * D / flops_per_us_per_sm
    tile_bytes = float(Q_TILE_ROWS * D * OUTPUT_BYTES)
    remote_share = (P - 1) / P
    peer, local = path_params(profile, "peer"), path_params(profile, "local")
    if mode == "fused":
        sender, completion = _tiles(
            n_tiles,
            profile.sm_count,
            tile_us,
            tile_bytes * remote_share,
            tile_bytes * (1 - remote_share),
            peer,
            local,
        )
    else:
        sender, completion = _tiles(
            n_tiles, profile.sm_count, tile_us, 0.0, tile_bytes, peer, local
        )
        if mode == "serial":
            # The All-to-All starts after the kernel; every SM pushes an equal share.
            remote = n_tiles * tile_bytes * remote_share
            K = profile.sm_count
            a2a = simulate_bursts(K, remote / K, 1, 0.0, peer)
            completion += a2a.drained_at
            sender = completion
    flops = 4.0 * batch * (heads // P) * S * S * D
    return AttentionResult(sender, completion, flops / sender / 1e6)
