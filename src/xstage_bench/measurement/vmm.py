"""Chunks laid end to end in one address range, and the CUDA VMM range that holds them.

Both far ends of a remote store use this layout: the peer window (peer.py: rank r's chunk
on GPU r) and the host window (hostmem.py: device chunks, then host-NUMA chunks). What
they share lives here once: a chunk's address, one tensor over the whole range, granting
the GPU read-write access, and unmapping and releasing it. torch and the driver bindings
are imported only where a method needs them, so hostmem.py still loads without torch.
"""

from __future__ import annotations


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
        from xstage_bench.measurement.peer import tensor_at

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
        from xstage_bench.measurement.peer import _driver, _drv

        cu = _driver()
        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        total = self.chunk_bytes * self.world_size
        _drv("cuMemSetAccess", cu.CUdeviceptr(self.base), total, [access], 1)

    def close(self) -> None:
        """Unmap and release (call only when no kernel still writes into the range)."""
        from xstage_bench.measurement.peer import _driver, _drv

        cu = _driver()
        for addr in self._mapped:
            _drv("cuMemUnmap", cu.CUdeviceptr(addr), self.chunk_bytes)
        self._mapped = []
        if self.base:
            _drv("cuMemAddressFree", cu.CUdeviceptr(self.base), self.chunk_bytes * self.world_size)
            self.base = 0
        for handle in self._handles:
            _drv("cuMemRelease", handle)
        self._handles = []
