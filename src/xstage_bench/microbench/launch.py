"""Launch the remote-store kernels of kernels/microbench/burst.cu and read their stamps back.

Two halves. The pure half (no GPU, tested on CPU): a grid point becomes a `TrainPlan`;
which buffers a destination is made of (`destination_specs`: a peer GPU's, pinned host
memory, or the sender's own for the local control); kernel arguments are packed from a
table that mirrors the kernels' C signatures; the pattern a launch must leave in a
destination buffer is recomputed on the host; per-CTA %globaltimer stamps become the data
contract's sample metrics. The GPU half is bench.BurstBench.

The kernels take every destination as a 64-bit address, so the host path needs no kernel
of its own: pinned, mapped host memory (hostmem.PinnedHostBuffer) is a valid device
address under unified addressing, and the same stores go over the GPU's host link.

Stamps are nanoseconds on the sending GPU's %globaltimer (32 ns resolution on H200);
metrics are microseconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

THREADS = 512  # threads per producer CTA: 16 warps keep an SM's store pipe busy
ROTATE_BYTES = 256 << 20  # destination buffer; "rotate" walks it (> 4x the 60 MB L2 of H200)
CEILING_GRID_PER_SM = 2  # bulk_store CTAs per SM for the SM-store ceiling
TIMEOUT_NS = 1_000_000_000  # every in-kernel wait gives up after 1 s and sets the error flag
ISOLATED_MIN_IDLE_US = 200.0
# The idle before an isolated burst drains 3 V at a rate below the path's own, so the burst
# meets an empty path: peer ~365 GB/s (NVLink4), host ~52 GB/s (PCIe Gen5 x16, SM stores).
# The local control keeps the peer's idle (its path drains at TB/s).
ISOLATED_IDLE_RATE_GBps = {"peer": 300.0, "host": 40.0, "local": 300.0}
POISON_WORD = 0xFFFFFFFF  # destinations are filled with 0xFF bytes before the checked launch
GUARD_BYTES = 64 << 10  # bytes past a launch's footprint that must still hold the poison
MIX = 0x9E3779B1  # burst.cu: mix(tag) = tag * MIX (mod 2^32)
# FMA-loop iterations the gap is calibrated at: up to ~640 us on H200 at K <= 132 (about
# 5 ns per iteration), past the longest configured gap (500 us, beyond V/R of a 16 MiB burst
# on the host path), so gaps are interpolated, not extrapolated.
GAP_CALIBRATION_ITERS = (0, 2000, 8000, 32000, 128000)
GAP_CALIBRATION_BURSTS = 8
GAP_LINEARITY_TOLERANCE = 0.05  # calibrated gaps of >= 5 us must sit within 5% of the line
GAP_LINEARITY_FLOOR_NS = 5000.0
GAP_EXTRAPOLATION = 1.25  # a gap may exceed the longest calibrated one by at most 25%

# burst.cu error bits (ERR_*); any of them fails the point with status "timeout".
ERROR_BITS = {
    1: "grid barrier timed out (producers not all resident?)",
    2: "drain probe: the receiver's acknowledgement never arrived",
    4: "drain probe: the receiver never saw every producer's signal",
    8: "kernel rejected a launch argument",
}
GAP_MODES = {"compute": 0, "timer": 1}
DESTS = ("peer", "host", "local")  # a point's dest: the two store paths and the local control
SYNC_MODES = {"free": 0, "barrier": 1}
WIDTHS = (4, 8, 16)


class MicrobenchError(RuntimeError):
    """A point could not be measured; `status` is the raw record status it maps to."""

    status = "failed"


class PointUnsupported(MicrobenchError):
    status = "unsupported"


class WrongResult(MicrobenchError):
    status = "wrong"


class KernelTimeout(MicrobenchError):
    status = "timeout"


# --- kernel arguments -------------------------------------------------------------------
# Each table mirrors one extern "C" signature in burst.cu, in order (a test parses the .cu
# and compares). "ptr" is a device address passed as a 64-bit integer, so peer addresses
# and local arrays travel the same way.

PTR, I32, U32, I64, U64 = "ptr", "int32", "uint32", "int64", "uint64"
KERNEL_PARAMS: dict[str, tuple[tuple[str, str], ...]] = {
    "burst_train": (
        ("dsts", PTR),
        ("n_dst", I32),
        ("bytes_per_producer", U32),
        ("slot_stride", U64),
        ("n_slots", I32),
        ("slot_base", I32),
        ("width", I32),
        ("n_bursts", I32),
        ("tag_base", U32),
        ("gap_mode", I32),
        ("gap_iters", I64),
        ("gap_ns", I64),
        ("idle_ns", I64),
        ("sync", I32),
        ("barrier_counter", PTR),
        ("timeout_ns", I64),
        ("stamps", PTR),
        ("err", PTR),
        ("sink", PTR),
    ),
    "drain_probe_send": (
        ("dst", U64),
        ("bytes_per_producer", U32),
        ("n_bursts", I32),
        ("tag_base", U32),
        ("idle_ns", I64),
        ("barrier_counter", PTR),
        ("peer_signal", U64),
        ("ack", PTR),
        ("timeout_ns", I64),
        ("stamps", PTR),
        ("err", PTR),
    ),
    "drain_probe_recv": (
        ("signal", PTR),
        ("remote_ack", U64),
        ("n_bursts", I32),
        ("producers", I32),
        ("timeout_ns", I64),
        ("recv_ns", PTR),
        ("err", PTR),
    ),
    "bulk_store": (("dst", U64), ("bytes", U64), ("tag", U32)),
}


def pack_args(kernel: str, values: Mapping[str, int]) -> tuple:
    """The kernel's arguments as numpy scalars of the C types, in signature order.

    Raises ValueError naming the kernel and parameter for a missing or unknown name, or a
    value that does not fit its C type.
    """
    params = KERNEL_PARAMS[kernel]
    names = [n for n, _ in params]
    missing = [n for n in names if n not in values]
    unknown = sorted(set(values) - set(names))
    if missing or unknown:
        raise ValueError(f"{kernel}: missing arguments {missing}, unknown arguments {unknown}")
    packed = []
    for name, ctype in params:
        dtype = np.dtype(np.uint64 if ctype == PTR else ctype)
        value = int(values[name])
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise ValueError(f"{kernel}: argument {name}={value} does not fit {dtype}")
        packed.append(dtype.type(value))
    return tuple(packed)


def describe_error(flags: int) -> str:
    known = [text for bit, text in ERROR_BITS.items() if flags & bit]
    rest = flags & ~sum(ERROR_BITS)
    if rest:
        known.append(f"unknown error bits {rest:#x}")
    return "; ".join(known)


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
    )


# --- the pattern ------------------------------------------------------------------------


def mix(tag: int) -> int:
    return (tag * MIX) & 0xFFFFFFFF


def last_burst_per_slot(n_bursts: int, n_slots: int, slot_base: int) -> dict[int, int]:
    """Rotation slot -> the last burst of the launch that wrote it (the one left visible)."""
    last: dict[int, int] = {}
    for n in range(n_bursts):
        last[(slot_base + n) % n_slots] = n
    return last


def expected_words(
    *,
    producers: int,
    B: int,
    slot_stride: int,
    last_burst: Mapping[int, int],
    tag_base: int,
    buffer_bytes: int,
) -> np.ndarray:
    """What one destination buffer must hold after a launch, as 32-bit words, up to the
    launch's footprint plus a guard band that must still hold the poison.

    `producers` slices of B bytes sit back to back at the start of every slot written;
    word w of a slot written by burst n holds mix(tag_base + n) ^ w (w counted from the
    buffer's start, as in burst.cu).
    """
    if not last_burst:
        raise ValueError("no burst wrote this destination")
    footprint = max(s * slot_stride for s in last_burst) + producers * B
    extent = min(buffer_bytes, footprint + GUARD_BYTES)
    image = np.full(extent // 4, POISON_WORD, dtype=np.uint32)
    for slot, n in last_burst.items():
        lo = slot * slot_stride // 4
        hi = lo + producers * B // 4
        image[lo:hi] = np.arange(lo, hi, dtype=np.uint32) ^ np.uint32(mix(tag_base + n))
    return image


def compare_words(got: np.ndarray, expected: np.ndarray, label: str) -> str | None:
    """None when equal; otherwise how many words differ and the first one, named."""
    if got.shape != expected.shape:
        return f"{label}: read {got.size} words, expected {expected.size}"
    bad = np.flatnonzero(got != expected)
    if bad.size == 0:
        return None
    i = int(bad[0])
    never = " (poison: never written)" if got[i] == POISON_WORD else ""
    return (
        f"{label}: {bad.size} of {expected.size} words wrong; first at byte {4 * i}: "
        f"got {int(got[i]):#010x}{never}, expected {int(expected[i]):#010x}"
    )


def pattern_mismatches(
    words: np.ndarray, tag: int, *, first_word: int = 0, chunk_words: int = 1 << 22
) -> tuple[int, int | None]:
    """(words that differ from mix(tag) ^ word_index, the first such index) over a uint32
    array whose element 0 is word `first_word` of the buffer.

    Checked chunk by chunk, so a 512 MiB host destination (the ceilings) costs 16 MiB of
    scratch memory, not a second 512 MiB image.
    """
    m = np.uint32(mix(tag))
    bad, first = 0, None
    for lo in range(0, words.size, chunk_words):
        chunk = words[lo : lo + chunk_words]
        want = np.arange(first_word + lo, first_word + lo + chunk.size, dtype=np.uint32) ^ m
        wrong = np.flatnonzero(chunk != want)
        if wrong.size and first is None:
            first = lo + int(wrong[0])
        bad += int(wrong.size)
    return bad, first


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


# --- stamps -> samples ------------------------------------------------------------------


def check_stamps(stamps: np.ndarray, label: str) -> None:
    """Every stamp must be set and each burst must end after it starts."""
    if np.any(stamps == 0):
        raise MicrobenchError(f"{label}: some stamps were never written")
    if np.any(stamps[1] < stamps[0]):
        raise MicrobenchError(f"{label}: a burst ends before it starts")


def _us(ns: np.ndarray) -> list[float]:
    return [float(x) / 1e3 for x in ns]


def train_metrics(
    start: np.ndarray, end: np.ndarray, warmup: int, kind: str, producer_bytes: int
) -> dict:
    """Sample metrics of one launch from per-CTA stamps (arrays of shape [bursts, K], ns).

    Per burst: t_iss_slowest = max over producers of its own store loop; t_iss_window =
    last producer's end - first producer's start; start_skew = last start - first start.
    Periodic launches add period (median over producers of each one's start of burst n+1 -
    its start of burst n, for steady n with a successor: free producers drift apart, and the
    earliest producer's period would time only the leader), gap_measured (median over
    producers of its next start - its own end) and one issue_rate per launch (see
    `issue_rate_GBps`). The first `warmup` bursts go to warmup_* metrics.
    """
    start = start.astype(np.int64)
    end = end.astype(np.int64)
    n = start.shape[0]
    if not 0 <= warmup < n:
        raise ValueError(f"warmup={warmup} must be in [0, {n}) bursts")
    slowest = (end - start).max(axis=1)
    window = end.max(axis=1) - start.min(axis=1)
    skew = start.max(axis=1) - start.min(axis=1)
    metrics = {
        "t_iss_slowest_us": _us(slowest[warmup:]),
        "t_iss_window_us": _us(window[warmup:]),
        "start_skew_us": _us(skew[warmup:]),
        "warmup_t_iss_slowest_us": _us(slowest[:warmup]),
        "warmup_t_iss_window_us": _us(window[:warmup]),
    }
    if kind == "periodic":
        metrics["period_us"] = _us(np.median(np.diff(start, axis=0), axis=1)[warmup:])
        metrics["gap_measured_us"] = _us(np.median(start[1:] - end[:-1], axis=1)[warmup:])
        rate = issue_rate_GBps(start, end, warmup, producer_bytes)
        metrics["issue_rate_GBps"] = [] if rate is None else [rate]
    return metrics


def issue_rate_GBps(start: np.ndarray, end: np.ndarray, warmup: int, producer_bytes: int):
    """Bytes issued per ns while every producer is in its steady bursts, or None.

    The window runs from the last producer's first steady start to the first producer's
    last end; bytes are those of the bursts that end inside it. Producers that run free
    drift apart, so the earliest producer's period then says how fast the leader runs, not
    how fast the path drains; this aggregate rate does not depend on their alignment, and
    under sustained backpressure it is the drain rate R (bytes/ns = GB/s).
    """
    t_a, t_b = start[warmup].max(), end[-1].min()
    inside = int(((end > t_a) & (end <= t_b)).sum())
    if t_b <= t_a or inside == 0:
        return None
    return inside * producer_bytes / float(t_b - t_a)


def probe_metrics(stamps: np.ndarray, warmup: int) -> dict:
    """Drain-probe metrics from stamps of shape [4 (start, end, fence, ack), bursts, K].

    visible = earliest ack - earliest start (an upper bound, see burst.cu); fence = last
    producer's fence return - earliest start (every store of the burst acknowledged).
    """
    start, end, fence, ack = (s.astype(np.int64) for s in stamps)
    first = start.min(axis=1)
    metrics = train_metrics(start, end, warmup, "isolated", producer_bytes=0)
    metrics["visible_us"] = _us((ack.min(axis=1) - first)[warmup:])
    metrics["fence_us"] = _us((fence.max(axis=1) - first)[warmup:])
    return metrics


def pool(into: dict[str, list[float]], metrics: Mapping[str, Sequence[float]]) -> None:
    """Append one launch's samples to the pooled samples of a point."""
    for name, values in metrics.items():
        into.setdefault(name, []).extend(values)


def stamps_extra(start: np.ndarray, end: np.ndarray) -> dict:
    """Per-CTA stamps of one launch for the record, in ns relative to its first start."""
    t0 = int(start.min())
    return {
        "unit": "ns since the launch's first burst start",
        "start": (start.astype(np.int64) - t0).tolist(),
        "end": (end.astype(np.int64) - t0).tolist(),
    }


def fit_gap_calibration(iters: Sequence[int], ns: Sequence[float]) -> dict:
    """Least-squares ns = fixed + per_iter * iters.

    A non-increasing fit is an error, and so is one that is not a line: every calibrated
    gap of GAP_LINEARITY_FLOOR_NS or more must sit within GAP_LINEARITY_TOLERANCE of it
    (the gaps of a sweep are read off this line, up to hundreds of microseconds).
    """
    x, y = np.asarray(iters, float), np.asarray(ns, float)
    per_iter, fixed = np.polyfit(x, y, 1)
    if per_iter <= 0:
        raise MicrobenchError(f"gap calibration is not increasing in iterations: {list(ns)} ns")
    long = y >= GAP_LINEARITY_FLOOR_NS
    residual = np.abs(fixed + per_iter * x - y)[long] / y[long]
    worst = float(residual.max()) if residual.size else 0.0
    if worst > GAP_LINEARITY_TOLERANCE:
        raise MicrobenchError(
            f"gap calibration is not linear in iterations: a calibrated gap is {worst:.1%} "
            f"off the fitted line (tolerance {GAP_LINEARITY_TOLERANCE:.0%}); "
            f"iters {list(map(int, iters))}, ns {list(ns)}"
        )
    return {
        "ns_per_iter": float(per_iter),
        "fixed_ns": float(fixed),
        "iters": [int(i) for i in iters],
        "ns": [float(v) for v in ns],
        "max_rel_residual": worst,
        "longest_calibrated_us": float(y.max()) / 1e3,
    }


def gap_iterations(calibration: Mapping, gap_us: float) -> int:
    """FMA iterations whose calibrated duration is closest to gap_us (0 for no gap).

    A gap beyond GAP_EXTRAPOLATION times the longest calibrated one is refused: the line is
    known only where it was measured.
    """
    if gap_us <= 0:
        return 0
    longest = calibration.get("longest_calibrated_us", max(calibration["ns"]) / 1e3)
    if gap_us > GAP_EXTRAPOLATION * longest:
        raise PointUnsupported(
            f"gap {gap_us:g} us is beyond the calibrated compute gaps (longest {longest:.0f} "
            f"us; GAP_CALIBRATION_ITERS in microbench/launch.py reaches it)"
        )
    iters = (gap_us * 1e3 - calibration["fixed_ns"]) / calibration["ns_per_iter"]
    return max(0, round(iters))
