"""Launch the remote-store kernels of kernels/microbench/burst.cu and read their stamps back.

Two halves. The pure half (no GPU, tested on CPU): a grid point becomes a `TrainPlan`;
kernel arguments are packed from a table that mirrors the kernels' C signatures; the
pattern a launch must leave in a destination buffer is recomputed on the host; per-CTA
%globaltimer stamps become the data contract's sample metrics. The GPU half, `BurstBench`,
owns the CuPy module, the buffers and the peer mappings, and runs one launch at a time.

Stamps are nanoseconds on the sending GPU's %globaltimer (32 ns resolution on H200);
metrics are microseconds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

THREADS = 512  # threads per producer CTA: 16 warps keep an SM's store pipe busy
ROTATE_BYTES = 256 << 20  # destination buffer; "rotate" walks it (> 4x the 60 MB L2 of H200)
CEILING_GRID_PER_SM = 2  # bulk_store CTAs per SM for the SM-store ceiling
TIMEOUT_NS = 1_000_000_000  # every in-kernel wait gives up after 1 s and sets the error flag
ISOLATED_MIN_IDLE_US = 200.0
ISOLATED_IDLE_RATE_GBps = 300.0  # idle >= 3 V at this rate, well under the path's ~365 GB/s
POISON_WORD = 0xFFFFFFFF  # destinations are filled with 0xFF bytes before the checked launch
GUARD_BYTES = 64 << 10  # bytes past a launch's footprint that must still hold the poison
MIX = 0x9E3779B1  # burst.cu: mix(tag) = tag * MIX (mod 2^32)
GAP_CALIBRATION_ITERS = (0, 2000, 8000, 16000)  # up to ~80 us of FMA loop on H200
GAP_CALIBRATION_BURSTS = 8

# burst.cu error bits (ERR_*); any of them fails the point with status "timeout".
ERROR_BITS = {
    1: "grid barrier timed out (producers not all resident?)",
    2: "drain probe: the receiver's acknowledgement never arrived",
    4: "drain probe: the receiver never saw every producer's signal",
    8: "kernel rejected a launch argument",
}
GAP_MODES = {"compute": 0, "timer": 1}
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
    dest: str  # peer | local
    n_dst: int  # destination buffers (peers; the local control mimics them with local ones)
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


def isolated_idle_us(V: int) -> float:
    """Idle before an isolated burst: long enough to drain V at a rate below the path's."""
    return max(ISOLATED_MIN_IDLE_US, 3.0 * V / (ISOLATED_IDLE_RATE_GBps * 1e3))


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
    if dest not in ("peer", "local"):
        raise PointUnsupported(f"dest must be 'peer' or 'local', got {dest!r}")
    if dest == "peer" and peers > world_size - 1:
        raise PointUnsupported(
            f"peers={peers} needs {peers + 1} GPUs, but this run has world_size={world_size} "
            f"({world_size - 1} peer(s))"
        )
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
        idle_us=isolated_idle_us(K * B) if kind == "isolated" else 0.0,
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
    """Least-squares ns = fixed + per_iter * iters; a non-increasing fit is an error."""
    per_iter, fixed = np.polyfit(np.asarray(iters, float), np.asarray(ns, float), 1)
    if per_iter <= 0:
        raise MicrobenchError(f"gap calibration is not increasing in iterations: {list(ns)} ns")
    return {
        "ns_per_iter": float(per_iter),
        "fixed_ns": float(fixed),
        "iters": [int(i) for i in iters],
        "ns": [float(x) for x in ns],
    }


def gap_iterations(calibration: Mapping, gap_us: float) -> int:
    """FMA iterations whose calibrated duration is closest to gap_us (0 for no gap)."""
    if gap_us <= 0:
        return 0
    iters = (gap_us * 1e3 - calibration["fixed_ns"]) / calibration["ns_per_iter"]
    return max(0, round(iters))


# --- the GPU side -----------------------------------------------------------------------


def _cupy():
    try:
        import cupy
    except ImportError:
        raise MicrobenchError("the microbenchmarks need CuPy (pip install cupy-cuda13x)") from None
    return cupy


class BurstBench:
    """The loaded kernels, their buffers and peer mappings, for one sender GPU.

    gpu_ids[0] sends; gpu_ids[1:] are its peers (destination d lives on gpu_ids[1 + d]).
    The local control writes buffers on the sender with everything else identical.
    """

    def __init__(
        self,
        cubin: str | Path,
        gpu_ids: Sequence[int],
        *,
        threads: int = THREADS,
        buffer_bytes: int = ROTATE_BYTES,
        timeout_ns: int = TIMEOUT_NS,
    ):
        cp = self.cp = _cupy()
        if len(gpu_ids) < 2:
            raise MicrobenchError(f"need at least 2 GPUs (a sender and a peer), got {gpu_ids}")
        cubin = Path(cubin)
        if not cubin.is_file():
            raise MicrobenchError(f"cubin not found: {cubin} (build it with build.build_cubin)")
        self.gpu_ids = list(gpu_ids)
        self.sender, self.peers = self.gpu_ids[0], self.gpu_ids[1:]
        self.threads, self.buffer_bytes, self.timeout_ns = threads, buffer_bytes, timeout_ns
        self._enable_peer_access()
        module = cp.RawModule(path=str(cubin))
        self.kernels = {name: module.get_function(name) for name in KERNEL_PARAMS}
        self.sm_count = cp.cuda.runtime.getDeviceProperties(self.sender)["multiProcessorCount"]
        self._buffers: dict[tuple[int, str, int], object] = {}
        self._calibrations: dict[int, dict] = {}
        with cp.cuda.Device(self.sender):
            self.counter = cp.zeros(1, cp.uint32)
            self.err = cp.zeros(1, cp.uint32)
            self.sink = cp.zeros(1, cp.float32)
            self.ack = cp.zeros(1, cp.uint32)

    def _enable_peer_access(self) -> None:
        cp = self.cp
        for a in self.gpu_ids:
            for b in self.gpu_ids:
                if a == b:
                    continue
                if not cp.cuda.runtime.deviceCanAccessPeer(a, b):
                    raise MicrobenchError(f"GPU {a} cannot reach GPU {b}'s memory (no peer access)")
                with cp.cuda.Device(a):
                    try:
                        cp.cuda.runtime.deviceEnablePeerAccess(b)
                    except cp.cuda.runtime.CUDARuntimeError as e:
                        if "AlreadyEnabled" not in str(e):
                            raise

    def _sync_all(self) -> None:
        for g in self.gpu_ids:
            self.cp.cuda.Device(g).synchronize()

    def _check(self, err, label: str) -> None:
        flags = int(err.get()[0])
        if flags:
            raise KernelTimeout(f"{label}: {describe_error(flags)}")

    def buffer(self, device: int, role: str, index: int = 0, nbytes: int | None = None):
        """A cached uint8 buffer on `device` (role names its use, so uses never share)."""
        nbytes = nbytes or self.buffer_bytes
        key = (device, role, index)
        if key not in self._buffers:
            with self.cp.cuda.Device(device):
                self._buffers[key] = self.cp.empty(nbytes, self.cp.uint8)
        buf = self._buffers[key]
        if buf.nbytes < nbytes:
            raise ValueError(f"buffer {key} holds {buf.nbytes} bytes, {nbytes} requested")
        return buf

    def destinations(self, dest: str, n_dst: int) -> list[tuple[int, object]]:
        """(device, buffer) per destination: peers' buffers, or local buffers mimicking them."""
        if dest == "peer":
            if n_dst > len(self.peers):
                raise PointUnsupported(f"{n_dst} peers requested, {len(self.peers)} available")
            return [(self.peers[d], self.buffer(self.peers[d], "dest")) for d in range(n_dst)]
        return [(self.sender, self.buffer(self.sender, "local", d)) for d in range(n_dst)]

    def max_coresident(self, kernel: str, shared_bytes: int) -> int:
        """How many CTAs of `kernel` can be resident at once on the sender (occupancy API)."""
        cp = self.cp
        with cp.cuda.Device(self.sender):
            func = self.kernels[kernel].kernel.ptr
            per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                func, self.threads, shared_bytes
            )
        return per_sm * self.sm_count

    def require_coresident(self, kernel: str, K: int, shared_bytes: int) -> int:
        limit = self.max_coresident(kernel, shared_bytes)
        if K > limit:
            raise PointUnsupported(
                f"K={K} producers cannot all be resident at once (at most {limit} CTAs of "
                f"{self.threads} threads on {self.sm_count} SMs): they would not form one burst"
            )
        return limit

    # -- gap calibration --

    def gap_calibration(self, K: int) -> dict:
        """ns of compute gap per FMA-loop iteration, for K CTAs of `threads` (cached per K:
        CTAs sharing an SM share its FMA pipes). Measured with burst_train itself, 16-byte
        local bursts, as next start - own end: the gap exactly as the trains realize it."""
        if K not in self._calibrations:
            plan = TrainPlan(
                kind="periodic",
                K=K,
                B=16,
                width=16,
                dest="local",
                n_dst=1,
                n_slots=1,
                slot_stride=-(-K * 16 // 128) * 128,
                n_bursts=GAP_CALIBRATION_BURSTS,
                warmup=0,
                sync="free",
                gap_mode="compute",
                gap_us=0.0,
                idle_us=0.0,
            )
            ns = []
            for iters in GAP_CALIBRATION_ITERS:
                start, end = self.run_train(plan, tag_base=0, slot_base=0, gap_iters=iters)
                ns.append(float(np.median(start[1:].astype(np.int64) - end[:-1])))
            self._calibrations[K] = {
                "K": K,
                "threads": self.threads,
                "method": "burst_train, 16-byte local bursts, median of next start - own end",
                **fit_gap_calibration(GAP_CALIBRATION_ITERS, ns),
            }
        return self._calibrations[K]

    # -- burst trains --

    def run_train(self, plan: TrainPlan, *, tag_base: int, slot_base: int, gap_iters: int):
        """One launch; returns (start, end) stamps, each [bursts, K] in ns."""
        cp = self.cp
        dests = self.destinations(plan.dest, plan.n_dst)
        N, K = plan.n_bursts, plan.K
        with cp.cuda.Device(self.sender):
            dsts = cp.asarray([buf.data.ptr for _, buf in dests], dtype=cp.uint64)
            stamps = cp.zeros(2 * N * K, cp.uint64)
            self.counter.fill(0)
            self.err.fill(0)
            args = pack_args(
                "burst_train",
                {
                    "dsts": dsts.data.ptr,
                    "n_dst": plan.n_dst,
                    "bytes_per_producer": plan.B,
                    "slot_stride": plan.slot_stride,
                    "n_slots": plan.n_slots,
                    "slot_base": slot_base,
                    "width": plan.width,
                    "n_bursts": N,
                    "tag_base": tag_base,
                    "gap_mode": GAP_MODES[plan.gap_mode],
                    "gap_iters": gap_iters,
                    "gap_ns": round(plan.gap_us * 1e3),
                    "idle_ns": round(plan.idle_us * 1e3),
                    "sync": SYNC_MODES[plan.sync],
                    "barrier_counter": self.counter.data.ptr,
                    "timeout_ns": self.timeout_ns,
                    "stamps": stamps.data.ptr,
                    "err": self.err.data.ptr,
                    "sink": self.sink.data.ptr,
                },
            )
            self.kernels["burst_train"]((K,), (self.threads,), args, shared_mem=2 * N * 8)
            self._sync_all()
            self._check(self.err, "burst_train")
            st = stamps.get().reshape(2, N, K)
        check_stamps(st, "burst_train")
        return st[0], st[1]

    def _read_words(self, device: int, buf, nwords: int) -> np.ndarray:
        with self.cp.cuda.Device(device):
            return buf[: 4 * nwords].view(self.cp.uint32).get()

    def _poison(self, dests) -> None:
        for device, buf in dests:
            with self.cp.cuda.Device(device):
                buf.fill(0xFF)

    def check_train(
        self,
        plan: TrainPlan,
        *,
        gap_iters: int,
        tag_base: int,
        kernel_tag_base: int | None = None,
    ) -> str | None:
        """Poison every destination, run one launch, and compare every destination with the
        pattern it must hold; None when correct, else the first difference, named.
        `kernel_tag_base` other than `tag_base` runs a deliberately wrong launch (faults)."""
        dests = self.destinations(plan.dest, plan.n_dst)
        self._poison(dests)
        self._sync_all()
        launched = tag_base if kernel_tag_base is None else kernel_tag_base
        self.run_train(plan, tag_base=launched, slot_base=0, gap_iters=gap_iters)
        last = last_burst_per_slot(plan.n_bursts, plan.n_slots, 0)
        for d, (device, buf) in enumerate(dests):
            want = expected_words(
                producers=plan.producers_of(d),
                B=plan.B,
                slot_stride=plan.slot_stride,
                last_burst=last,
                tag_base=tag_base,
                buffer_bytes=buf.nbytes,
            )
            wrong = compare_words(
                self._read_words(device, buf, want.size),
                want,
                f"{plan.dest} destination {d} (GPU {device})",
            )
            if wrong:
                return wrong
        return None

    # -- drain probe --

    def run_probe(self, *, K: int, B: int, n_bursts: int, idle_us: float, tag_base: int):
        """One drain-probe launch (sender and receiver); stamps [4, bursts, K] in ns."""
        cp = self.cp
        receiver = self.peers[0]
        dest = self.buffer(receiver, "dest")
        with cp.cuda.Device(receiver):
            signal = self.buffer(receiver, "signal", nbytes=4096)[:4].view(cp.uint32)
            recv_err = self.buffer(receiver, "recv_err", nbytes=4096)[:4].view(cp.uint32)
            recv_ns = cp.zeros(n_bursts, cp.uint64)
            signal.fill(0)
            recv_err.fill(0)
        with cp.cuda.Device(self.sender):
            stamps = cp.zeros(4 * n_bursts * K, cp.uint64)
            self.counter.fill(0)
            self.err.fill(0)
            self.ack.fill(0)
        self._sync_all()
        with cp.cuda.Device(receiver):
            # Launched first, so it is polling before the sender's first signal.
            self.kernels["drain_probe_recv"](
                (1,),
                (32,),
                pack_args(
                    "drain_probe_recv",
                    {
                        "signal": signal.data.ptr,
                        "remote_ack": self.ack.data.ptr,
                        "n_bursts": n_bursts,
                        "producers": K,
                        "timeout_ns": self.timeout_ns,
                        "recv_ns": recv_ns.data.ptr,
                        "err": recv_err.data.ptr,
                    },
                ),
            )
        with cp.cuda.Device(self.sender):
            self.kernels["drain_probe_send"](
                (K,),
                (self.threads,),
                pack_args(
                    "drain_probe_send",
                    {
                        "dst": dest.data.ptr,
                        "bytes_per_producer": B,
                        "n_bursts": n_bursts,
                        "tag_base": tag_base,
                        "idle_ns": round(idle_us * 1e3),
                        "barrier_counter": self.counter.data.ptr,
                        "peer_signal": signal.data.ptr,
                        "ack": self.ack.data.ptr,
                        "timeout_ns": self.timeout_ns,
                        "stamps": stamps.data.ptr,
                        "err": self.err.data.ptr,
                    },
                ),
                shared_mem=4 * n_bursts * 8,
            )
        self._sync_all()
        with cp.cuda.Device(receiver):
            self._check(recv_err, "drain_probe_recv")
        with cp.cuda.Device(self.sender):
            self._check(self.err, "drain_probe_send")
            st = stamps.get().reshape(4, n_bursts, K)
        check_stamps(st, "drain_probe_send")
        return st

    def check_probe(self, *, K: int, B: int, n_bursts: int, idle_us: float, tag_base: int):
        receiver = self.peers[0]
        dest = self.buffer(receiver, "dest")
        self._poison([(receiver, dest)])
        self._sync_all()
        self.run_probe(K=K, B=B, n_bursts=n_bursts, idle_us=idle_us, tag_base=tag_base)
        want = expected_words(
            producers=K,
            B=B,
            slot_stride=K * B,
            last_burst={0: n_bursts - 1},
            tag_base=tag_base,
            buffer_bytes=dest.nbytes,
        )
        return compare_words(
            self._read_words(receiver, dest, want.size),
            want,
            f"drain-probe destination (GPU {receiver})",
        )

    # -- ceilings --

    def _ceiling_dest(self, dest: str, nbytes: int) -> tuple[int, object]:
        device = self.peers[0] if dest == "peer" else self.sender
        return device, self.buffer(device, "ceiling_dst", nbytes=nbytes)

    def _device_check(self, device: int, buf, nbytes: int, tag: int, label: str) -> str | None:
        # 512 MiB is checked on the GPU that holds it (the same pattern formula as
        # expected_words), not copied to the host.
        cp = self.cp
        with cp.cuda.Device(device):
            got = buf[:nbytes].view(cp.uint32)
            want = cp.arange(got.size, dtype=cp.uint32) ^ cp.uint32(mix(tag))
            bad = int(cp.count_nonzero(got != want))
        return None if bad == 0 else f"{label}: {bad} of {got.size} words wrong"

    def bulk_store_fn(self, dest: str, nbytes: int, tag: int) -> tuple[Callable[[], None], dict]:
        """A callable enqueuing the SM-store ceiling kernel on torch's current stream."""
        cp = self.cp
        _, buf = self._ceiling_dest(dest, nbytes)
        grid = CEILING_GRID_PER_SM * self.sm_count
        args = pack_args("bulk_store", {"dst": buf.data.ptr, "bytes": nbytes, "tag": tag})

        def fn() -> None:
            import torch

            with (
                cp.cuda.Device(self.sender),
                cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream),
            ):
                self.kernels["bulk_store"]((grid,), (self.threads,), args)

        return fn, {"grid": grid, "threads": self.threads}

    def copy_engine_fn(self, dest: str, nbytes: int, tag: int) -> tuple[Callable[[], None], dict]:
        """A callable enqueuing one copy-engine copy of a pattern-filled source buffer."""
        cp = self.cp
        device, dst = self._ceiling_dest(dest, nbytes)
        src = self.buffer(self.sender, "ceiling_src", nbytes=nbytes)
        grid = CEILING_GRID_PER_SM * self.sm_count
        with cp.cuda.Device(self.sender):
            fill = pack_args("bulk_store", {"dst": src.data.ptr, "bytes": nbytes, "tag": tag})
            self.kernels["bulk_store"]((grid,), (self.threads,), fill)
        self._sync_all()

        def fn() -> None:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
            if device == self.sender:
                cp.cuda.runtime.memcpyAsync(
                    dst.data.ptr, src.data.ptr, nbytes, cp.cuda.runtime.memcpyDeviceToDevice, stream
                )
            else:
                cp.cuda.runtime.memcpyPeerAsync(
                    dst.data.ptr, device, src.data.ptr, self.sender, nbytes, stream
                )

        how = "memcpyAsync (device to device)" if device == self.sender else "memcpyPeerAsync"
        return fn, {"api": how}

    def check_ceiling(self, fn: Callable[[], None], dest: str, nbytes: int, tag: int) -> str | None:
        """Poison the destination, run `fn` once, check every word on the device."""
        import torch

        device, buf = self._ceiling_dest(dest, nbytes)
        self._poison([(device, buf)])
        self._sync_all()
        with torch.cuda.device(self.sender):
            fn()
        self._sync_all()
        return self._device_check(device, buf, nbytes, tag, f"ceiling destination (GPU {device})")
