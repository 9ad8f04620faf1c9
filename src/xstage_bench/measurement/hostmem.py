"""The host path's far end: the GPU's link to host memory, and host memory a kernel stores into.

Pinned, mapped host memory, which a kernel reaches through its host pointer (unified
addressing), or one VMM range whose far chunks are host-NUMA memory, so that an unmodified
kernel (cuBLAS, FA3, FA4) can take one strided `out` tensor over it. This module is the one
place that makes host memory for a kernel: experiments ask it, nothing else knows where
host memory comes from.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from collections.abc import Sequence

from xstage_bench.data.storepath import pcie_line_rate_GBps
from xstage_bench.measurement.clocks import nvml_targets
from xstage_bench.measurement.vmm import ChunkRange, VmmRange


class HostMemoryUnsupported(RuntimeError):
    """The driver refuses the host memory a path needs; the message is the driver's."""


# --- the host link ----------------------------------------------------------------------


def host_link(device: int = 0) -> dict | None:
    """The link to host memory of CUDA device `device` (CUDA_VISIBLE_DEVICES undone: a
    measuring job sees only its GPUs) as nvidia-smi reports it, or None without a driver:
    kind (pcie or nvlink-c2c), PCIe generation and width, line rate per direction."""
    try:
        (target,) = nvml_targets([device])
        out = subprocess.run(
            [
                "nvidia-smi",
                f"--id={target}",
                "--query-gpu=name,pcie.link.gen.current,pcie.link.width.current",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    name, gen, width = (part.strip() for part in out.split(",")[:3])
    if re.search(r"\bG[HB]\d{3}\b", name):  # Grace Hopper / Grace Blackwell superchips
        return {"kind": "nvlink-c2c", "gpu": name}
    link: dict = {"kind": "pcie", "gpu": name}
    if gen.isdigit() and width.isdigit():
        link.update(gen=int(gen), width=int(width))
        link["line_rate_GBps"] = pcie_line_rate_GBps(int(gen), int(width))
    return link


# --- host memory a kernel can store into ------------------------------------------------


def host_tensor(shape: Sequence[int], dtype, device):
    """A tensor in host memory that kernels on `device` store into directly.

    On a GPU: pinned memory (cudaHostAlloc), which unified addressing maps into every
    GPU's address space, so its data_ptr() is a valid device address; torch calls it a
    CPU tensor, and kernels take its address. On the CPU (the tests) a plain tensor.
    """
    import torch

    return torch.empty(tuple(shape), dtype=dtype, pin_memory=device.type == "cuda")


class PinnedHostBuffer:
    """Pinned, mapped host memory for CuPy launches (the microbenchmarks): `ptr` is the
    address a kernel stores to; `words(n)` reads the first n 32-bit words back on the
    host; `fill(byte)` writes every byte from the host."""

    def __init__(self, nbytes: int):
        import cupy

        self._rt = cupy.cuda.runtime
        self.nbytes = int(nbytes)
        # cudaHostAllocPortable | cudaHostAllocMapped: every GPU may store into it.
        self.ptr = int(self._rt.hostAlloc(self.nbytes, 1 | 2))
        self._view = (ctypes.c_uint8 * self.nbytes).from_address(self.ptr)

    def array(self):
        import numpy as np

        return np.ctypeslib.as_array(self._view)

    def fill(self, byte: int) -> None:
        ctypes.memset(self.ptr, byte, self.nbytes)

    def words(self, n: int):
        return self.array()[: 4 * n].view("<u4").copy()

    def close(self) -> None:
        if self.ptr:
            self._rt.freeHost(self.ptr)
            self.ptr = 0


class _Chunks(ChunkRange):
    """The first `device_chunks` on the device, the rest in host memory (what both windows
    below share)."""

    device_chunks: int

    def on_host(self, c: int) -> bool:
        return c >= self.device_chunks


class CudaHostWindow(VmmRange, _Chunks):
    """`chunks` equal chunks in one reserved virtual range: the first `device_chunks` in
    the GPU's memory, the rest in host memory (cuMemCreate with a host-NUMA location),
    all mapped read-write for the GPU. An unmodified kernel given one strided tensor over
    the range writes its far rows straight into host memory (DEVICE.md, 2026-12-01: cuBLAS
    and FA3 bit-exact). The interface of peer.CudaPeerWindow; raises HostMemoryUnsupported
    with the driver's message where the driver refuses host-located VMM."""

    contiguous = True

    def __init__(
        self, nbytes: int, *, chunks: int, device: int, device_chunks: int = 1, numa_node: int = 0
    ):
        import torch

        from xstage_bench.measurement.vmm import PeerMemoryError, call_driver, driver

        cu = driver()
        self.device = torch.device("cuda", device)
        self.world_size = chunks  # peer.CudaPeerWindow's name for the chunk count
        self.device_chunks = device_chunks
        props = []
        for on_host in (False, True):
            prop = cu.CUmemAllocationProp()
            prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
            prop.location.type = (
                cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
                if on_host
                else cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            )
            prop.location.id = numa_node if on_host else device
            props.append(prop)
        minimum = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        self._handles: list = []
        self._mapped: list[int] = []
        self.base = 0
        try:
            gran = max(int(call_driver("cuMemGetAllocationGranularity", p, minimum)) for p in props)
            self.chunk_bytes = -(-nbytes // gran) * gran
            total = self.chunk_bytes * chunks
            self.base = int(call_driver("cuMemAddressReserve", total, gran, 0, 0))
            for c in range(chunks):
                prop = props[0] if c < device_chunks else props[1]
                handle = call_driver("cuMemCreate", self.chunk_bytes, prop, 0)
                self._handles.append(handle)
                addr = self.chunk_ptr(c)
                call_driver("cuMemMap", cu.CUdeviceptr(addr), self.chunk_bytes, 0, handle, 0)
                self._mapped.append(addr)
            self.grant_read_write(device)
        except PeerMemoryError as e:
            self.close()
            raise HostMemoryUnsupported(f"host-NUMA memory in a VMM range: {e}") from e
        except BaseException:
            self.close()
            raise


class CpuHostWindow(_Chunks):
    """The same interface over one CPU tensor (the CPU tests): chunks are contiguous."""

    contiguous = True

    def __init__(self, nbytes: int, *, chunks: int, device_chunks: int = 1):
        import torch

        self.device = torch.device("cpu")
        self.world_size, self.device_chunks = chunks, device_chunks
        self.chunk_bytes = nbytes
        self._memory = torch.empty(nbytes * chunks, dtype=torch.uint8)
        self.base = self._memory.data_ptr()

    def close(self) -> None:
        self._memory = None


def host_window(nbytes: int, *, chunks: int, device, device_chunks: int = 1):
    """A window of `chunks` chunks, the first `device_chunks` on `device`, the rest in
    host memory: CUDA VMM on a GPU, one CPU tensor in the tests."""
    if device.type == "cuda":
        return CudaHostWindow(
            nbytes, chunks=chunks, device=device.index, device_chunks=device_chunks
        )
    return CpuHostWindow(nbytes, chunks=chunks, device_chunks=device_chunks)
