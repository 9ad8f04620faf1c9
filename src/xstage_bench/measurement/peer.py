"""Peer-backed output buffers and the cross-rank barrier of the fused Ulysses modes.

A `PeerWindow` is one chunk of memory per rank, each physically on its own rank's GPU,
mapped into every rank's address space. On CUDA (`CudaPeerWindow`) the chunks sit in rank
order in ONE reserved virtual range (cuMemCreate / cuMemMap, the recipe of DEVICE.md), so
an unmodified kernel can take an ordinary strided tensor over the whole range as its
output and each token row lands on the GPU that owns it; our Triton kernel instead takes
the chunk addresses and computes the destination itself. The physical handles travel
between processes as POSIX file descriptors over a Unix socket (`FdExchange`), which needs
no ptrace rights and no multicast object (cuMulticastCreate is never called).

`HostPeerWindow` is the same interface over POSIX shared memory, for the CPU tests (Triton
interpreter, gloo): it lets the whole multi-process path run without a GPU.

`DeviceBarrier` is the completion clock's end: a one-program Triton kernel that fences at
system scope, raises this rank's flag in every peer's signal slot, and spins (bounded by
%globaltimer) until every peer's flag has reached this barrier's epoch.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
from collections.abc import Callable
from multiprocessing import shared_memory

import torch
import triton
import triton.language as tl

from xstage_bench.measurement.vmm import PeerMemoryError, VmmRange, call_driver, driver, tensor_at


class FdExchange:
    """All-gather of one file descriptor per rank over abstract Unix sockets (SCM_RIGHTS).

    `barrier` must be a host-side barrier over all ranks (gloo): it guarantees every rank
    listens before anyone connects, and rounds do not overlap.
    """

    def __init__(
        self,
        run_id: str,
        rank: int,
        world_size: int,
        barrier: Callable[[], None],
        timeout_s: float = 60.0,
    ):
        self.run_id, self.rank, self.world_size = run_id, rank, world_size
        self.barrier, self.timeout_s = barrier, timeout_s
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self._name(rank))
        self.server.listen(world_size)
        self.server.settimeout(timeout_s)

    def _name(self, rank: int) -> str:
        return f"\0xstage-bench-{self.run_id}-{rank}"

    def all_gather(self, fd: int) -> list[int]:
        """Every rank's descriptor (its own `fd` at its own index; the others are new
        descriptors in this process, which the caller closes)."""
        self.barrier()
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(self.timeout_s)
                conn.connect(self._name(peer))
                socket.send_fds(conn, [struct.pack("i", self.rank)], [fd])
        got: dict[int, int] = {}
        for _ in range(self.world_size - 1):
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                raise PeerMemoryError(
                    f"rank {self.rank}: no descriptor from ranks "
                    f"{sorted(set(range(self.world_size)) - set(got) - {self.rank})} "
                    f"within {self.timeout_s:g} s"
                ) from None
            with conn:
                msg, fds, _, _ = socket.recv_fds(conn, 16, 1)
            if len(fds) != 1 or len(msg) < 4:
                raise PeerMemoryError(f"rank {self.rank}: malformed descriptor message")
            got[struct.unpack("i", msg[:4])[0]] = fds[0]
        return [fd if r == self.rank else got[r] for r in range(self.world_size)]

    def close(self) -> None:
        self.server.close()


class CudaPeerWindow(VmmRange):
    """One chunk per rank, chunk r on GPU r, all mapped in rank order into one range."""

    contiguous = True

    def __init__(
        self, nbytes: int, *, rank: int, world_size: int, device: int, exchange: FdExchange
    ):
        cu = driver()
        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cuda", device)
        fd_type = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device
        prop.requestedHandleTypes = fd_type
        gran = int(
            call_driver(
                "cuMemGetAllocationGranularity",
                prop,
                cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        )
        self.chunk_bytes = -(-nbytes // gran) * gran
        self._handles: list = []
        self._mapped: list[int] = []
        self.base = 0
        try:
            own = call_driver("cuMemCreate", self.chunk_bytes, prop, 0)
            self._handles.append(own)
            fd = int(call_driver("cuMemExportToShareableHandle", own, fd_type, 0))
            fds = exchange.all_gather(fd)
            handles = []
            for r, peer_fd in enumerate(fds):
                if r == rank:
                    handles.append(own)
                    continue
                handles.append(call_driver("cuMemImportFromShareableHandle", peer_fd, fd_type))
                self._handles.append(handles[-1])
                os.close(peer_fd)
            os.close(fd)
            total = self.chunk_bytes * world_size
            self.base = int(call_driver("cuMemAddressReserve", total, gran, 0, 0))
            for r, handle in enumerate(handles):
                addr = self.base + r * self.chunk_bytes
                call_driver("cuMemMap", cu.CUdeviceptr(addr), self.chunk_bytes, 0, handle, 0)
                self._mapped.append(addr)
            self.grant_read_write(device)
        except BaseException:
            self.close()
            raise


class HostPeerWindow:
    """The same interface over POSIX shared memory (CPU tests); chunks are not contiguous."""

    contiguous = False

    def __init__(
        self, nbytes: int, *, rank: int, world_size: int, name: str, barrier: Callable[[], None]
    ):
        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cpu")
        self.chunk_bytes = nbytes
        own = shared_memory.SharedMemory(name=f"{name}-{rank}", create=True, size=nbytes)
        barrier()
        self._shms = []
        for r in range(world_size):
            if r == rank:
                self._shms.append(own)
                continue
            # Attaching registers the name with the resource tracker that the spawned
            # ranks share with their parent; the creator's unlink() unregisters it.
            self._shms.append(shared_memory.SharedMemory(name=f"{name}-{r}"))
        self._ptrs = []
        for shm in self._shms:
            anchor = ctypes.c_char.from_buffer(shm.buf)
            self._ptrs.append(ctypes.addressof(anchor))
            del anchor  # release the buffer export so close() can unmap

    def chunk_ptr(self, r: int) -> int:
        return self._ptrs[r]

    def view(self, dtype, shape, strides, offset_bytes: int = 0) -> torch.Tensor:
        raise PeerMemoryError("a host window's chunks are not one contiguous range")

    def close(self) -> None:
        for r, shm in enumerate(self._shms):
            shm.close()
            if r == self.rank:
                shm.unlink()
        self._shms = []


@triton.jit
def _globaltimer():
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def _fence_system():
    return tl.inline_asm_elementwise(
        "fence.sc.sys;\n mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit(do_not_specialize=["rank", "world_size", "epoch"])
def _cross_rank_barrier(
    sig_ptrs, err_ptr, rank, world_size, epoch, timeout_ns, WORLD: tl.constexpr
):
    offs = tl.arange(0, WORLD)
    live = offs < world_size
    # Order every earlier write of this GPU (the peer stores of the kernel before us in
    # the stream) before the flags: a peer that sees our flag sees our data.
    _fence_system()
    peers = tl.load(sig_ptrs + offs, mask=live, other=0).to(tl.pointer_type(tl.int32))
    tl.atomic_xchg(peers + rank, epoch, mask=live, sem="release", scope="sys")
    mine = tl.load(sig_ptrs + rank).to(tl.pointer_type(tl.int32))
    start = _globaltimer()
    flags = tl.atomic_add(mine + offs, 0, mask=live, sem="acquire", scope="sys")
    lowest = tl.min(tl.where(live, flags, epoch))
    while (lowest < epoch) & (_globaltimer() - start < timeout_ns):
        flags = tl.atomic_add(mine + offs, 0, mask=live, sem="acquire", scope="sys")
        lowest = tl.min(tl.where(live, flags, epoch))
    if lowest < epoch:
        tl.store(err_ptr, 1)


class DeviceBarrier:
    """A cross-rank barrier enqueued on the current stream; bounded, never hangs.

    Each call uses the next epoch, so flags never need resetting. A timeout sets the
    error flag (read with `failed()`) and lets the stream go on.
    """

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        device: int,
        exchange: FdExchange,
        timeout_s: float = 30.0,
    ):
        self.rank, self.world_size = rank, world_size
        self.window = CudaPeerWindow(
            4 * world_size, rank=rank, world_size=world_size, device=device, exchange=exchange
        )
        dev = self.window.device
        own = tensor_at(
            self.window.chunk_ptr(rank),
            self.window.chunk_bytes,
            dev,
            torch.int32,
            (world_size,),
            (1,),
        )
        own.zero_()
        torch.cuda.synchronize(dev)
        exchange.barrier()  # every rank's slots are zero before anyone raises a flag
        self.sig_ptrs = torch.tensor(
            [self.window.chunk_ptr(r) for r in range(world_size)], dtype=torch.int64, device=dev
        )
        self.error = torch.zeros(1, dtype=torch.int32, device=dev)
        self.epoch = 0
        self.timeout_ns = int(timeout_s * 1e9)
        self._world_p2 = max(2, triton.next_power_of_2(world_size))

    def __call__(self) -> None:
        self.epoch += 1
        _cross_rank_barrier[(1,)](
            self.sig_ptrs,
            self.error,
            self.rank,
            self.world_size,
            self.epoch,
            self.timeout_ns,
            WORLD=self._world_p2,
            num_warps=1,
        )

    def failed(self) -> bool:
        return bool(self.error.item())

    def close(self) -> None:
        self.window.close()
