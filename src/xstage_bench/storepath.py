"""Store paths: where a kernel's remote stores land, and the buffers that put them there.

The X-Stage is the time between a store leaving the SM and it being visible at the far
end. Every experiment names that far end, its *path*:

- `peer`: another GPU's memory over NVLink (or PCIe peer-to-peer): peer windows
  (peer.py: one VMM range, each rank's chunk on its own GPU);
- `host`: the node's host memory over the GPU's host link (PCIe, or NVLink-C2C on Grace
  machines): pinned, mapped host memory, which a kernel reaches through its host pointer
  (unified addressing), or a VMM range whose far chunks are host-NUMA memory, so that an
  unmodified kernel (cuBLAS, FA3, FA4) can take one strided `out` tensor over it.

Beside each path every experiment keeps its local control: the same stores into the
issuing GPU's own memory (`LOCAL`). Configs name the paths as `store_paths` (`auto`: the
host path on one GPU, both on two or more); a study's `dest: remote` means "the far end of
each measured path". This module is the one place that makes the far-end buffers:
experiments ask it, nothing else knows where host memory comes from.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from collections.abc import Sequence

PEER, HOST = "peer", "host"
PATHS = (PEER, HOST)
LOCAL = "local"  # the local-store control beside every path
REMOTE = "remote"  # config only: one point per measured path
AUTO = "auto"


class StorePathError(ValueError):
    """A config asks for a path this run cannot measure; the message names the key."""


class HostMemoryUnsupported(RuntimeError):
    """The driver refuses the host memory a path needs; the message is the driver's."""


def resolve(requested, world_size: int, key: str = "store_paths") -> list[str]:
    """The paths a run measures: `auto` is the host path on one GPU and both paths on
    two or more; an explicit list is checked against the GPUs this run has."""
    if requested in (None, AUTO):
        return [HOST] if world_size < 2 else [PEER, HOST]
    paths = list(requested)
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise StorePathError(f"config key '{key}': unknown path {unknown[0]!r}; known: {PATHS}")
    if PEER in paths and world_size < 2:
        raise StorePathError(
            f"config key '{key}' asks for 'peer' (another GPU's memory), but this run has "
            f"{world_size} GPU; use 'host' or 'auto'"
        )
    return paths


def destinations(dests: Sequence[str], paths: Sequence[str]) -> list[str]:
    """A study's `dest` values with `remote` expanded into one per path (order kept,
    duplicates dropped): e.g. [remote, local] over [peer, host] -> [peer, host, local]."""
    out: list[str] = []
    for d in dests:
        for concrete in paths if d == REMOTE else [d]:
            if concrete not in out:
                out.append(concrete)
    return out


def path_of(dest: str) -> str:
    """A point's path from its destination: the path itself, or `local` for the control."""
    return dest if dest in PATHS else LOCAL


def point_path(point: dict) -> str:
    """A record's path. Files written before paths existed measured the peer path (their
    microbenchmark points name it as `dest`)."""
    if "path" in point:
        return point["path"]
    return path_of(point["dest"]) if "dest" in point else PEER


def far_end(path: str) -> str:
    """How tables and figures name a path's far end."""
    return {PEER: "peer GPU (NVLink)", HOST: "host memory", LOCAL: "local control"}[path]


# --- the host link ----------------------------------------------------------------------

# PCIe line rate per direction and lane, GB/s, after encoding (gen3+: 128b/130b).
PCIE_LANE_GBps = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def pcie_line_rate_GBps(gen: int, width: int) -> float | None:
    lane = PCIE_LANE_GBps.get(gen)
    return None if lane is None else round(lane * width, 1)


def host_link(device: int = 0) -> dict | None:
    """The GPU's link to host memory as nvidia-smi reports it, or None without a driver:
    kind (pcie or nvlink-c2c), PCIe generation and width, line rate per direction."""
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                f"--id={device}",
                "--query-gpu=name,pcie.link.gen.current,pcie.link.width.current",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
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


class _Chunks:
    """Chunks of `chunk_bytes` laid end to end from `base`: the first `device_chunks` on the
    device, the rest in host memory (what both windows below share)."""

    base: int
    chunk_bytes: int
    world_size: int
    device_chunks: int
    device: object

    def chunk_ptr(self, c: int) -> int:
        return self.base + c * self.chunk_bytes

    def on_host(self, c: int) -> bool:
        return c >= self.device_chunks

    def view(self, dtype, shape, strides, offset_bytes: int = 0):
        """A tensor on the window's device over the range from `offset_bytes` (device and
        host chunks alike)."""
        from xstage_bench.peer import tensor_at

        total = self.chunk_bytes * self.world_size
        return tensor_at(
            self.base + offset_bytes, total - offset_bytes, self.device, dtype, shape, strides
        )


class CudaHostWindow(_Chunks):
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

        from xstage_bench.peer import PeerMemoryError, _driver, _drv

        cu = _driver()
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
            gran = max(int(_drv("cuMemGetAllocationGranularity", p, minimum)) for p in props)
            self.chunk_bytes = -(-nbytes // gran) * gran
            total = self.chunk_bytes * chunks
            self.base = int(_drv("cuMemAddressReserve", total, gran, 0, 0))
            for c in range(chunks):
                prop = props[0] if c < device_chunks else props[1]
                handle = _drv("cuMemCreate", self.chunk_bytes, prop, 0)
                self._handles.append(handle)
                addr = self.chunk_ptr(c)
                _drv("cuMemMap", cu.CUdeviceptr(addr), self.chunk_bytes, 0, handle, 0)
                self._mapped.append(addr)
            access = cu.CUmemAccessDesc()
            access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            access.location.id = device
            access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            _drv("cuMemSetAccess", cu.CUdeviceptr(self.base), total, [access], 1)
        except PeerMemoryError as e:
            self.close()
            raise HostMemoryUnsupported(f"host-NUMA memory in a VMM range: {e}") from e
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        from xstage_bench.peer import _driver, _drv

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
