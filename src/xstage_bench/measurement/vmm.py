"""Chunks laid end to end in one address range, and the CUDA VMM range that holds them.

Both far ends of a remote store use this layout: the peer window (peer.py: rank r's chunk
on GPU r) and the host window (hostmem.py: device chunks, then host-NUMA chunks). What
they share lives here once: the checked driver call, a tensor over memory torch does not
own, a chunk's address, one tensor over the whole range, granting the GPU read-write
access, and unmapping and releasing it. torch and the driver bindings are imported only
where a function needs them, so hostmem.py still loads without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class PeerMemoryError(RuntimeError):
    """Peer memory could not be created, shared or mapped; the message names the call."""


def tensor_at(
    ptr: int,
    nbytes: int,
    device: torch.device,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
) -> torch.Tensor:
    """A tensor over memory torch does not own, on an explicit device.

    torch.as_tensor(__cuda_array_interface__) would ask the driver which device the
    pointer belongs to, and for a range whose first pages live on a peer it answers with
    the peer: the tensor would be on the wrong device (and a `device=` argument would then
    copy it). Building the storage from the pointer keeps the device we name.
    """
    import torch

    storage = torch._C._construct_storage_from_data_pointer(ptr, device, nbytes)
    return torch.empty(0, dtype=dtype, device=device).set_(storage, 0, shape, strides)


def driver():
    """The CUDA driver bindings (cuda.bindings.driver)."""
    try:
        from cuda.bindings import driver as bindings
    except ImportError as e:
        raise PeerMemoryError(f"peer windows need cuda-bindings (cuda.bindings.driver): {e}") from e
    return bindings


def call_driver(name: str, *args):
    """Call a CUDA driver function; raise PeerMemoryError naming it when it fails."""
    cu = driver()
    result = getattr(cu, name)(*args)
    err, rest = result[0], result[1:]
    if err != cu.CUresult.CUDA_SUCCESS:
        _, msg = cu.cuGetErrorString(err)
        text = msg.decode() if isinstance(msg, bytes) else str(msg)
        raise PeerMemoryError(f"{name} failed: {getattr(err, 'name', err)} ({text})")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


class ChunkRange:
    """`world_size` chunks of `chunk_bytes` laid end to end from `base`, on `device`."""

    base: int
    chunk_bytes: int
    world_size: int
    device: object

    def chunk_ptr(self, c: int) -> int:
        return self.base + c * self.chunk_bytes

    def view(self, dtype, shape, strides, offset_bytes: int = 0):
        """A tensor on the range's device from `offset_bytes` (it may span several chunks)."""
        total = self.chunk_bytes * self.world_size
        return tensor_at(
            self.base + offset_bytes, total - offset_bytes, self.device, dtype, shape, strides
        )


class VmmRange(ChunkRange):
    """A ChunkRange in one reserved virtual range whose chunks the CUDA driver mapped:
    `_mapped` holds the mapped addresses, `_handles` the physical allocations."""

    _mapped: list[int]
    _handles: list

    def grant_read_write(self, device: int) -> None:
        """Let GPU `device` read and write the whole range."""
        cu = driver()
        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        total = self.chunk_bytes * self.world_size
        call_driver("cuMemSetAccess", cu.CUdeviceptr(self.base), total, [access], 1)

    def close(self) -> None:
        """Unmap and release (call only when no kernel still writes into the range)."""
        cu = driver()
        for addr in self._mapped:
            call_driver("cuMemUnmap", cu.CUdeviceptr(addr), self.chunk_bytes)
        self._mapped = []
        if self.base:
            call_driver(
                "cuMemAddressFree", cu.CUdeviceptr(self.base), self.chunk_bytes * self.world_size
            )
            self.base = 0
        for handle in self._handles:
            call_driver("cuMemRelease", handle)
        self._handles = []
