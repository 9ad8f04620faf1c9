"""The GPU half of the microbenchmarks: the loaded kernels of burst.cu, their destination
buffers and peer mappings, one launch at a time (CuPy). Everything that can be decided
without a GPU (plans and destinations: planning.py; argument packing: launch.py; the
expected pattern: store_pattern.py; stamps to metrics: stamp_metrics.py) is tested on the
CPU; this module is kept thin because no CPU test can run it.

A destination is a `Destination`: its address for the kernels, how to poison it and how
to read it back. Device buffers (a peer's, or the sender's for the local control) are
poisoned and read through CuPy; host buffers (hostmem.PinnedHostBuffer, pinned and
mapped, so the kernels store to its host pointer) are poisoned and read on the host, with
no device copy in between: what the check reads is what crossed the host link.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from xstage_bench.microbench.errors import KernelTimeout, MicrobenchError, PointUnsupported
from xstage_bench.microbench.gap_calibration import fit_gap_calibration
from xstage_bench.microbench.launch import (
    CEILING_GRID_PER_SM,
    GAP_CALIBRATION_BURSTS,
    GAP_CALIBRATION_ITERS,
    GAP_MODES,
    KERNEL_PARAMS,
    MAX_PRODUCERS,
    NEXT_OPS,
    STAMP_ROWS,
    SYNC_MODES,
    THREADS,
    TIMEOUT_NS,
    describe_error,
    pack_args,
    scratch_bytes,
)
from xstage_bench.microbench.planning import (
    ROTATE_BYTES,
    DestinationSpec,
    TrainPlan,
    ceiling_spec,
    destination_specs,
)
from xstage_bench.microbench.stamp_metrics import TrainStamps, check_reach, check_stamps
from xstage_bench.microbench.store_pattern import (
    compare_words,
    expected_words,
    last_burst_per_slot,
    mix,
    pattern_mismatches,
)


def _cupy():
    try:
        import cupy
    except ImportError:
        raise MicrobenchError("the microbenchmarks need CuPy (pip install cupy-cuda13x)") from None
    return cupy


class DeviceDestination:
    """A uint8 CuPy buffer on one GPU."""

    def __init__(self, cp, device: int, buf):
        self.cp, self.device, self.buf = cp, device, buf
        self.ptr = int(buf.data.ptr)
        self.nbytes = int(buf.nbytes)

    def poison(self, nbytes: int | None = None) -> None:
        with self.cp.cuda.Device(self.device):
            self.buf[: nbytes or self.nbytes].fill(0xFF)

    def words(self, n: int) -> np.ndarray:
        with self.cp.cuda.Device(self.device):
            return self.buf[: 4 * n].view(self.cp.uint32).get()

    def pattern_errors(self, nbytes: int, tag: int) -> int:
        # 512 MiB is checked on the GPU that holds it (the formula of expected_words), not
        # copied to the host.
        cp = self.cp
        with cp.cuda.Device(self.device):
            got = self.buf[:nbytes].view(cp.uint32)
            want = cp.arange(got.size, dtype=cp.uint32) ^ cp.uint32(mix(tag))
            return int(cp.count_nonzero(got != want))


class HostDestination:
    """A pinned, mapped host buffer (hostmem.PinnedHostBuffer), read on the host."""

    device = None

    def __init__(self, buf):
        self.buf = buf
        self.ptr = int(buf.ptr)
        self.nbytes = int(buf.nbytes)

    def poison(self, nbytes: int | None = None) -> None:
        # Only what the check reads: a host memset of the whole 256 MiB would cost ~50 ms
        # a point.
        if nbytes is None or nbytes >= self.nbytes:
            self.buf.fill(0xFF)
        else:
            self.buf.array()[:nbytes] = 0xFF

    def words(self, n: int) -> np.ndarray:
        return self.buf.words(n)

    def pattern_errors(self, nbytes: int, tag: int) -> int:
        # Host memory is checked where it is, chunk by chunk (store_pattern.pattern_mismatches).
        words = self.buf.array()[:nbytes].view("<u4")
        return pattern_mismatches(words, tag)[0]


class BurstBench:
    """The loaded kernels, their buffers and peer mappings, for one sender GPU.

    gpu_ids[0] sends; gpu_ids[1:] are its peers (destination d of dest 'peer' lives on
    gpu_ids[1 + d]). One GPU is a valid bench: its peer points are unsupported, its host
    and local points measured. Host destinations are pinned host buffers, one per
    destination index; the local control writes buffers on the sender with everything
    else identical.
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
        if len(gpu_ids) < 1:
            raise MicrobenchError("need at least one GPU (the sender), got none")
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
        self._buffers: dict[tuple[int | None, str, int], object] = {}
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

    def destination(self, spec: DestinationSpec, nbytes: int | None = None):
        """The cached buffer of `spec` (allocated once: a 512 MiB ceiling destination too)."""
        nbytes = nbytes or self.buffer_bytes
        key = (spec.device, spec.role, spec.index)
        if key not in self._buffers:
            if spec.on_host:
                from xstage_bench.measurement.hostmem import PinnedHostBuffer

                self._buffers[key] = HostDestination(PinnedHostBuffer(nbytes))
            else:
                with self.cp.cuda.Device(spec.device):
                    buf = self.cp.empty(nbytes, self.cp.uint8)
                self._buffers[key] = DeviceDestination(self.cp, spec.device, buf)
        dest = self._buffers[key]
        if dest.nbytes < nbytes:
            raise ValueError(f"buffer {key} holds {dest.nbytes} bytes, {nbytes} requested")
        return dest

    def device_buffer(self, device: int, role: str, nbytes: int):
        """A cached uint8 CuPy buffer on `device` (scratch: signals, copy sources)."""
        return self.destination(DestinationSpec(device, role, 0), nbytes).buf

    def destinations(self, dest: str, n_dst: int) -> list[tuple[DestinationSpec, object]]:
        return [
            (spec, self.destination(spec))
            for spec in destination_specs(dest, n_dst, self.sender, self.peers)
        ]

    def close(self) -> None:
        """Free the pinned host buffers (device buffers go with CuPy's pool)."""
        for dest in self._buffers.values():
            if isinstance(dest, HostDestination):
                dest.buf.close()
        self._buffers.clear()

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
                start, end, _ = self.run_train(plan, tag_base=0, slot_base=0, gap_iters=iters)
                ns.append(float(np.median(start[1:].astype(np.int64) - end[:-1])))
            self._calibrations[K] = {
                "K": K,
                "threads": self.threads,
                "method": "burst_train, 16-byte local bursts, median of next start - own end",
                **fit_gap_calibration(GAP_CALIBRATION_ITERS, ns),
            }
        return self._calibrations[K]

    # -- burst trains --

    def run_train(
        self, plan: TrainPlan, *, tag_base: int, slot_base: int, gap_iters: int
    ) -> TrainStamps:
        """One launch; its stamps, each [bursts, K] in ns (reach with sync = barrier)."""
        cp = self.cp
        dests = self.destinations(plan.dest, plan.n_dst)
        N, K = plan.n_bursts, plan.K
        # one buffer for every K (cached by role): sized for the most producers a study names
        scratch = self.device_buffer(self.sender, "next_op_scratch", scratch_bytes(MAX_PRODUCERS))
        with cp.cuda.Device(self.sender):
            # Device and host addresses alike: pinned host memory is mapped (UVA).
            dsts = cp.asarray([dest.ptr for _, dest in dests], dtype=cp.uint64)
            stamps = cp.zeros(STAMP_ROWS * N * K, cp.uint64)
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
                    "next_op": NEXT_OPS[plan.next_op],
                    "scratch": scratch.data.ptr,
                },
            )
            self.kernels["burst_train"]((K,), (self.threads,), args, shared_mem=STAMP_ROWS * N * 8)
            self._sync_all()
            self._check(self.err, "burst_train")
            st = stamps.get().reshape(STAMP_ROWS, N, K)
        check_stamps(st[:2], "burst_train")
        if plan.sync != "barrier":
            return TrainStamps(st[0], st[1])
        check_reach(st[0], st[1], st[2], "burst_train")
        return TrainStamps(st[0], st[1], st[2])

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
        last = last_burst_per_slot(plan.n_bursts, plan.n_slots, 0)
        wants = [
            expected_words(
                producers=plan.producers_of(d),
                B=plan.B,
                slot_stride=plan.slot_stride,
                last_burst=last,
                tag_base=tag_base,
                buffer_bytes=dest.nbytes,
            )
            for d, (_, dest) in enumerate(dests)
        ]
        # Every byte the check reads is poisoned first: the footprint and its guard band.
        for (_, dest), want in zip(dests, wants, strict=True):
            dest.poison(4 * want.size)
        self._sync_all()
        launched = tag_base if kernel_tag_base is None else kernel_tag_base
        self.run_train(plan, tag_base=launched, slot_base=0, gap_iters=gap_iters)
        for d, ((spec, dest), want) in enumerate(zip(dests, wants, strict=True)):
            wrong = compare_words(dest.words(want.size), want, spec.label(plan.dest, d))
            if wrong:
                return wrong
        return None

    # -- drain probe (peer path only: its receiver is a kernel on the peer GPU) --

    def run_probe(self, *, K: int, B: int, n_bursts: int, idle_us: float, tag_base: int):
        """One drain-probe launch (sender and receiver); stamps [4, bursts, K] in ns."""
        cp = self.cp
        spec, dest = self.destinations("peer", 1)[0]
        receiver = spec.device
        with cp.cuda.Device(receiver):
            signal = self.device_buffer(receiver, "signal", 4096)[:4].view(cp.uint32)
            recv_err = self.device_buffer(receiver, "recv_err", 4096)[:4].view(cp.uint32)
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
                        "dst": dest.ptr,
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
        spec, dest = self.destinations("peer", 1)[0]
        dest.poison()
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
        return compare_words(dest.words(want.size), want, f"drain-probe {spec.label('peer', 0)}")

    # -- ceilings --

    def _ceiling_dest(self, dest: str, nbytes: int):
        spec = ceiling_spec(dest, self.sender, self.peers)
        return spec, self.destination(spec, nbytes)

    def bulk_store_fn(self, dest: str, nbytes: int, tag: int) -> tuple[Callable[[], None], dict]:
        """A callable enqueuing the SM-store ceiling kernel on torch's current stream."""
        cp = self.cp
        _, buf = self._ceiling_dest(dest, nbytes)
        grid = CEILING_GRID_PER_SM * self.sm_count
        args = pack_args("bulk_store", {"dst": buf.ptr, "bytes": nbytes, "tag": tag})

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
        spec, dst = self._ceiling_dest(dest, nbytes)
        src = self.device_buffer(self.sender, "ceiling_src", nbytes)
        grid = CEILING_GRID_PER_SM * self.sm_count
        with cp.cuda.Device(self.sender):
            fill = pack_args("bulk_store", {"dst": src.data.ptr, "bytes": nbytes, "tag": tag})
            self.kernels["bulk_store"]((grid,), (self.threads,), fill)
        self._sync_all()
        rt = cp.cuda.runtime

        def fn() -> None:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
            if spec.on_host:
                rt.memcpyAsync(dst.ptr, src.data.ptr, nbytes, rt.memcpyDeviceToHost, stream)
            elif spec.device == self.sender:
                rt.memcpyAsync(dst.ptr, src.data.ptr, nbytes, rt.memcpyDeviceToDevice, stream)
            else:
                rt.memcpyPeerAsync(dst.ptr, spec.device, src.data.ptr, self.sender, nbytes, stream)

        if spec.on_host:
            how = "memcpyAsync (device to pinned host memory)"
        elif spec.device == self.sender:
            how = "memcpyAsync (device to device)"
        else:
            how = "memcpyPeerAsync"
        return fn, {"api": how}

    def check_ceiling(self, fn: Callable[[], None], dest: str, nbytes: int, tag: int) -> str | None:
        """Poison the destination, run `fn` once, check every word where it lives (the GPU
        that holds it, or the host for host memory)."""
        import torch

        spec, buf = self._ceiling_dest(dest, nbytes)
        buf.poison()
        self._sync_all()
        with torch.cuda.device(self.sender):
            fn()
        self._sync_all()
        bad = buf.pattern_errors(nbytes, tag)
        where = "host memory" if spec.on_host else f"GPU {spec.device}"
        return (
            None
            if bad == 0
            else f"ceiling destination ({where}): {bad} of {nbytes // 4} words wrong"
        )
