"""What a multi-process experiment runs on: its groups, peer windows, barrier and clock.

`CudaFabric` is the measurement: NCCL for collectives, gloo for control, CUDA VMM peer
windows (peer.py) and a device-side cross-rank barrier. `HostFabric` is its CPU stand-in
(gloo for everything, shared-memory windows, host clocks, the Triton interpreter), so
the CPU tests run the same multi-process code end to end. `SoloFabric` is one rank of
either working alone, as on the host path (this GPU and host memory, no other rank): its
barrier is a system-scope fence on the GPU.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from xstage_bench.measurement.peer import (
    CudaPeerWindow,
    DeviceBarrier,
    FdExchange,
    HostPeerWindow,
    _fence_system,
)


class WaitTimeout(TimeoutError):
    """Work on the device did not finish within its bound."""


class CudaFabric:
    """NCCL for the All-to-All, gloo for control, VMM peer windows, a device barrier."""

    device_type = "cuda"

    def __init__(
        self, *, rank: int, world_size: int, run_id: str, ctrl, group, wait_timeout_s: float
    ):
        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cuda", rank)
        self.ctrl, self.group = ctrl, group
        self.wait_timeout_s = wait_timeout_s
        self.exchange = FdExchange(run_id, rank, world_size, self.host_barrier)
        self.barrier = DeviceBarrier(
            rank=rank,
            world_size=world_size,
            device=rank,
            exchange=self.exchange,
            timeout_s=wait_timeout_s,
        )

    def host_barrier(self) -> None:
        dist.barrier(group=self.ctrl)

    def window(self, nbytes: int):
        return CudaPeerWindow(
            nbytes,
            rank=self.rank,
            world_size=self.world_size,
            device=self.rank,
            exchange=self.exchange,
        )

    def stamp(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def elapsed_us(a, b) -> float:
        return a.elapsed_time(b) * 1000.0

    def wait(self, event=None) -> None:
        """Wait (bounded) for `event`, or everything enqueued so far; then check the
        barrier's error flag."""
        if event is None:
            event = self.stamp()
        deadline = time.monotonic() + self.wait_timeout_s
        while not event.query():
            if time.monotonic() > deadline:
                raise WaitTimeout(
                    f"rank {self.rank}: GPU work not finished after {self.wait_timeout_s:g} s"
                )
            time.sleep(1e-4)
        if self.barrier.failed():
            raise WaitTimeout(
                f"rank {self.rank}: cross-rank barrier timed out on the GPU "
                f"(a peer never raised its flag within {self.wait_timeout_s:g} s)"
            )

    def close(self) -> None:
        self.barrier.close()
        self.exchange.close()


class HostFabric:
    """The CPU stand-in: gloo for everything, shared-memory windows, host clocks."""

    device_type = "cpu"

    def __init__(
        self, *, rank: int, world_size: int, run_id: str, ctrl, group, wait_timeout_s: float
    ):
        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cpu")
        self.ctrl, self.group = ctrl, group
        self.run_id = run_id
        self._windows = 0

    def host_barrier(self) -> None:
        dist.barrier(group=self.ctrl)

    def barrier(self) -> None:
        self.host_barrier()

    def window(self, nbytes: int):
        self._windows += 1
        return HostPeerWindow(
            nbytes,
            rank=self.rank,
            world_size=self.world_size,
            name=f"xs{self.run_id}w{self._windows}",
            barrier=self.host_barrier,
        )

    def stamp(self) -> float:
        return time.perf_counter()

    @staticmethod
    def elapsed_us(a: float, b: float) -> float:
        return (b - a) * 1e6

    def wait(self, event=None) -> None:
        return None

    def close(self) -> None:
        return None


@triton.jit
def _system_fence(done_ptr):
    # fence.sc.sys: every earlier write of this GPU (the host-bound stores and copies of
    # the kernels before us in the stream) is ordered before anything after it, at system
    # scope, so the host sees them once this kernel has run.
    tl.store(done_ptr, _fence_system())


class SystemFence:
    """A one-thread kernel on the current stream that fences at system scope."""

    def __init__(self, device: torch.device):
        self._done = torch.zeros(1, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        _system_fence[(1,)](self._done, num_warps=1)


class SoloFabric:
    """One rank of a fabric working alone: no other rank takes part in its work.

    The host path's fabric (attention/host.py): the GPU plays rank 0 of a P-GPU node and
    host memory stands in for the other owners, so there is no rank to wait for. Its
    `barrier`, the end of the completion clock, is therefore a system-scope fence on the
    GPU (`SystemFence`: everything enqueued before it is ordered before it for the host;
    with one rank the cross-rank barrier reduces to this) and nothing on the CPU stand-in;
    `host_barrier` is nothing. Clocks and the bounded wait are the parent fabric's.
    """

    rank, world_size = 0, 1
    group = ctrl = None

    def __init__(self, parent):
        self.parent = parent
        self.device, self.device_type = parent.device, parent.device_type
        self.wait_timeout_s = getattr(parent, "wait_timeout_s", None)
        self._fence = SystemFence(parent.device) if parent.device_type == "cuda" else None

    def host_barrier(self) -> None:
        return None

    def barrier(self) -> None:
        if self._fence is not None:
            self._fence()

    def stamp(self):
        return self.parent.stamp()

    def elapsed_us(self, a, b) -> float:
        return self.parent.elapsed_us(a, b)

    def wait(self, event=None) -> None:
        self.parent.wait(event)

    def window(self, nbytes: int):
        raise TypeError(
            "a rank working alone has no peer windows; host memory comes from storepath"
        )

    def close(self) -> None:
        return None
