"""What a multi-process experiment runs on: its groups, peer windows, barrier and clock.

`CudaFabric` is the measurement: NCCL for collectives, gloo for control, CUDA VMM peer
windows (peer.py) and a device-side cross-rank barrier. `HostFabric` is its CPU stand-in
(gloo for everything, shared-memory windows, host clocks, the Triton interpreter), so
the CPU tests run the same multi-process code end to end.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from xstage_bench.peer import CudaPeerWindow, DeviceBarrier, FdExchange, HostPeerWindow


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
