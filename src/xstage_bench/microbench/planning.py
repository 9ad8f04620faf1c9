"""A grid point resolved into what to launch, without a GPU: a burst train's `TrainPlan`
(or PointUnsupported saying why it cannot run) and the buffers a destination is made of
(`destination_specs`: a peer GPU's, pinned host memory, or the sender's own for the local
control).

This module exists so that every decision about a point that needs no GPU is made, and
tested, on the CPU before bench.py touches one.

The kernels take every destination as a 64-bit address, so the host path needs no kernel
of its own: pinned, mapped host memory (hostmem.PinnedHostBuffer) is a valid device
address under unified addressing, and the same stores go over the GPU's host link.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from xstage_bench.microbench.errors import PointUnsupported
from xstage_bench.microbench.launch import GAP_MODES, NEXT_OPS, SYNC_MODES

ROTATE_BYTES = 256 << 20  # destination buffer; "rotate" walks it (> 4x the 60 MB L2 of H200)
ISOLATED_MIN_IDLE_US = 200.0
# The idle before an isolated burst drains 3 V at a rate below the path's own, so the burst
# meets an empty path: peer ~365 GB/s (NVLink4), host ~52 GB/s (PCIe Gen5 x16, SM stores).
# The local control keeps the peer's idle (its path drains at TB/s).
ISOLATED_IDLE_RATE_GBps = {"peer": 300.0, "host": 40.0, "local": 300.0}
DESTS = ("peer", "host", "local")  # a point's dest: the two store paths and the local control
WIDTHS = (4, 8, 16)


# --- plans ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainPlan:
    """One burst_train configuration, resolved from a grid point."""

    kind: str  # periodic | isolated
    K: int
    B: int
    width: int
    dest: str  # peer | host | local
    n_dst: int  # destination buffers: peers, host buffers, or local ones mimicking them
    n_slots: int  # 1: rewrite the same lines; > 1: rotate through the buffer
    slot_stride: int
    n_bursts: int
    warmup: int
    sync: str
    gap_mode: str
    gap_us: float
    idle_us: float
    next_op: str = "none"  # what each producer does right after its burst (launch.NEXT_OPS)

    def producers_of(self, d: int) -> int:
        """How many producers store to destination d (CTA k stores to k % n_dst)."""
        return len(range(d, self.K, self.n_dst))

    def as_dict(self) -> dict:
        return asdict(self)


def isolated_idle_us(V: int, dest: str = "peer") -> float:
    """Idle before an isolated burst: long enough to drain V at a rate below the path's."""
    return max(ISOLATED_MIN_IDLE_US, 3.0 * V / (ISOLATED_IDLE_RATE_GBps[dest] * 1e3))


def isolated_idle_rule(dest: str) -> str:
    """The idle as the raw config records it."""
    return f"max({ISOLATED_MIN_IDLE_US:g}, 3 V / {ISOLATED_IDLE_RATE_GBps[dest]:g} GB/s) us"


def require_peer_gpus(peers: int, world_size: int) -> None:
    """PointUnsupported where a peer destination needs more GPUs than this run has."""
    if world_size < 2:
        raise PointUnsupported(
            f"dest 'peer' stores into another GPU's memory, but this run has world_size="
            f"{world_size} (no peer GPU); one GPU measures the host path (dest 'host')"
        )
    if peers > world_size - 1:
        raise PointUnsupported(
            f"peers={peers} needs {peers + 1} GPUs, but this run has world_size={world_size} "
            f"({world_size - 1} peer(s))"
        )


def plan_train(
    point: Mapping,
    *,
    bursts: int,
    warmup_bursts: int,
    world_size: int,
    buffer_bytes: int = ROTATE_BYTES,
) -> TrainPlan:
    """Resolve a periodic or isolated grid point; PointUnsupported says why one cannot run."""
    kind, K, B = point["kind"], int(point["K"]), int(point["B"])
    if kind not in ("periodic", "isolated"):
        raise ValueError(f"point {point['id']}: kind {kind!r} is not a burst train")
    peers, dest, width = int(point["peers"]), point["dest"], int(point["width"])
    if dest not in DESTS:
        raise PointUnsupported(f"dest must be one of {DESTS}, got {dest!r}")
    if dest == "peer":
        require_peer_gpus(peers, world_size)
    if peers < 1:
        raise PointUnsupported(f"peers must be >= 1, got {peers}")
    if width not in WIDTHS:
        raise PointUnsupported(f"store width must be one of {WIDTHS} bytes, got {width}")
    if B % width:
        raise PointUnsupported(f"B={B} bytes per producer is not a multiple of width={width}")
    if B >= 2**32:
        raise PointUnsupported(f"B={B} bytes per producer exceeds the kernel's 32-bit count")
    if point["sync"] not in SYNC_MODES:
        raise PointUnsupported(f"sync must be one of {sorted(SYNC_MODES)}, got {point['sync']!r}")
    if point["gap_mode"] not in GAP_MODES:
        raise PointUnsupported(
            f"gap_mode must be one of {sorted(GAP_MODES)}, got {point['gap_mode']!r}"
        )
    next_op = point.get("next_op", "none")
    if next_op not in NEXT_OPS:
        raise PointUnsupported(f"next_op must be one of {sorted(NEXT_OPS)}, got {next_op!r}")
    if next_op != "none" and point["sync"] != "free":
        # The barrier's own arrival atomic would wait for the drain whatever came before it.
        raise PointUnsupported(
            f"next_op {next_op!r} needs sync 'free': with the grid barrier every next "
            "operation is followed by the barrier's atomic, which waits on its own"
        )
    # A burst's slices are contiguous per destination; slots start on a 128-byte line.
    slot_stride = -(-math.ceil(K / peers) * B // 128) * 128
    if point["pattern"] == "same":
        n_slots = 1
        if slot_stride > buffer_bytes:
            raise PointUnsupported(
                f"burst of {slot_stride} bytes exceeds the {buffer_bytes}-byte destination buffer"
            )
    elif point["pattern"] == "rotate":
        n_slots = buffer_bytes // slot_stride
        if n_slots < 2:
            raise PointUnsupported(
                f"pattern 'rotate' needs at least 2 bursts of {slot_stride} bytes in the "
                f"{buffer_bytes}-byte buffer"
            )
    else:
        raise PointUnsupported(f"pattern must be 'same' or 'rotate', got {point['pattern']!r}")
    return TrainPlan(
        kind=kind,
        K=K,
        B=B,
        width=width,
        dest=dest,
        n_dst=peers,
        n_slots=n_slots,
        slot_stride=slot_stride,
        n_bursts=bursts,
        warmup=warmup_bursts,
        sync=point["sync"],
        gap_mode=point["gap_mode"],
        gap_us=float(point["gap_us"]),
        idle_us=isolated_idle_us(K * B, dest) if kind == "isolated" else 0.0,
        next_op=next_op,
    )


# --- destinations -----------------------------------------------------------------------


@dataclass(frozen=True)
class DestinationSpec:
    """One destination buffer of a launch: where it lives and its cache key."""

    device: int | None  # the GPU whose memory holds it; None: pinned host memory
    role: str  # what it is for, so that uses never share a buffer
    index: int

    @property
    def on_host(self) -> bool:
        return self.device is None

    def label(self, dest: str, d: int) -> str:
        where = "host memory" if self.on_host else f"GPU {self.device}"
        return f"{dest} destination {d} ({where})"


def destination_specs(
    dest: str, n_dst: int, sender: int, peers: Sequence[int]
) -> list[DestinationSpec]:
    """The buffers a launch with `n_dst` destinations stores into: destination d is peer
    d's buffer (peer), host buffer d (host: one pinned buffer per destination index, as
    many far ends as peers), or local buffer d on the sender (the local control)."""
    if dest == "peer":
        if n_dst > len(peers):
            if not peers:
                raise PointUnsupported(
                    "dest 'peer' needs a peer GPU, and this run has only the sender "
                    f"(GPU {sender}); one GPU measures the host path"
                )
            raise PointUnsupported(f"{n_dst} peers requested, {len(peers)} available")
        return [DestinationSpec(peers[d], "dest", 0) for d in range(n_dst)]
    if dest == "host":
        return [DestinationSpec(None, "host_dest", d) for d in range(n_dst)]
    if dest == "local":
        return [DestinationSpec(sender, "local", d) for d in range(n_dst)]
    raise PointUnsupported(f"dest must be one of {DESTS}, got {dest!r}")


def ceiling_spec(dest: str, sender: int, peers: Sequence[int]) -> DestinationSpec:
    """The destination of a ceiling: the first peer's memory, host memory or the sender's."""
    spec = destination_specs(dest, 1, sender, peers)[0]
    return DestinationSpec(spec.device, "ceiling_dst", 0)
