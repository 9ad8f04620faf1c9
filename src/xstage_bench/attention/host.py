"""Ulysses attention on the host path: one GPU plays rank 0 of a P-GPU node, and host
memory stands in for the other P-1 owners of its output rows.

On a P-GPU node rank 0 computes H/P heads over all S tokens; after attention the rows of
its own S/P tokens stay in its memory and the (P-1)/P owned by ranks 1..P-1 leave it. Here
the GPU does exactly rank 0's work and its outgoing rows land in host memory, over the
GPU's host link instead of NVLink. What one GPU cannot show is the traffic it would
receive from the other ranks, nor their contention.

Where rows land: owner v's (B, S/P, H, D) final buffer is chunk v of one range made by
`hostmem.host_window` (chunk 0 in the GPU's memory, chunks 1..P-1 in host memory), so
the unmodified FA3/FA4 kernels write through one strided `out` view over the range
(exactly Workspace's layout across P real ranks) and our Triton kernel through the chunk
addresses. Where the driver refuses host-located VMM (`hostmem.HostMemoryUnsupported`),
there is no such range: FA3/FA4 fused are unsupported (with the driver's message) and our
kernel stores into pinned host chunks (`hostmem.host_tensor`) through its pointers.

The modes here:

- alone:  attention only, into this GPU's (B, S, H/P, D) buffer;
- serial: attention, the yunchang/xDiT pack (as on the peer path), then a copy-engine
          copy (cudaMemcpyAsync D2H) of the (P-1)/P host share into pinned host memory;
          the own 1/P stays packed on the GPU. Unpacking is each receiver's work, the far
          end's, and is not timed (or done, except to check);
- fused:  attention whose epilogue stores the host share straight into host memory.

Clocks (modes.timed_rep on a fabric.SoloFabric): sender-visible = this GPU's work for the
mode has finished (for serial, the copy included); completion = after that, a
system-scope fence on the GPU has run (every row is visible in host memory). With one
rank there is nobody else to wait for: the cross-rank barrier is that fence.
"""

from __future__ import annotations

from dataclasses import dataclass

from xstage_bench.attention.layout import UlyssesLayout

DEFINITIONS = {
    "host path": "the GPU plays rank 0 of a P-GPU Ulysses node (H/P heads over all S "
    "tokens); the rows of its own S/P tokens stay in its memory, the (P-1)/P owned by "
    "ranks 1..P-1 land in host memory, which stands in for those owners; on a machine with "
    "more GPUs only GPU 0 runs the host path, the others idle meanwhile",
    "host path serial": "attention, the yunchang pack, then one copy-engine copy "
    "(cudaMemcpyAsync D2H) of the (P-1)/P host share into pinned host memory; the own 1/P "
    "stays packed on the GPU; the receivers' unpack is the far end's work, not timed",
    "host path fused": "attention whose epilogue stores the host share into host memory: "
    "fa3/fa4 through one out view over a VMM range (owner 0's chunk on the GPU, owners "
    "1..P-1 in host-NUMA memory), ours through the chunk addresses (pinned host chunks "
    "where the driver refuses host-located VMM; extra.host_memory says which)",
    "host path completion": "sender-visible time, then a one-thread kernel that fences at "
    "system scope (fence.sc.sys) and an event after it: everything the GPU enqueued is "
    "done and visible to the host; with one rank the cross-rank barrier is that fence",
}


@dataclass(frozen=True)
class HostNode:
    """Which rows of rank 0's output stay on the GPU and which go to host memory."""

    layout: UlyssesLayout  # world_size is the P of the node rank 0 belongs to

    def __post_init__(self) -> None:
        if self.layout.world_size < 2:
            raise ValueError(
                f"the host path needs P >= 2 (P-1 owners in host memory), "
                f"got P={self.layout.world_size}"
            )

    @property
    def size(self) -> int:
        return self.layout.world_size

    def on_host(self, owner: int) -> bool:
        """Whether owner `owner`'s chunk is in host memory (every owner but rank 0)."""
        if not 0 <= owner < self.size:
            raise ValueError(f"owner={owner} outside 0..{self.size - 1}")
        return owner != 0

    def host_tokens(self) -> range:
        """The tokens whose rows land in host memory: those of owners 1..P-1."""
        return range(self.layout.shard_len, self.layout.seq_len)

    def host_fraction(self) -> float:
        """Share of rank 0's output rows that goes to host memory: (P-1)/P."""
        return (self.size - 1) / self.size

    def host_bytes(self, itemsize: int) -> int:
        """Bytes of rank 0's output stored into host memory per call."""
        lay = self.layout
        rows = lay.batch * len(self.host_tokens()) * lay.local_heads
        return rows * lay.head_dim * itemsize


class HostWorkspace:
    """Workspace (modes.py) of one shape on the host path, on the GPU playing rank 0.

    q, k, v and `out` are rank 0's (B, S, H/P, D); `chunks[v]` is owner v's (B, S/P, H, D)
    final buffer (chunk 0 on the GPU, the others in host memory); `target` routes the
    fused epilogue to them at rank 0's heads (0 .. H/P-1); `exchange` is serial's pack and
    D2H copy; `outcome` reads rank 0's rows back from wherever a mode put them.
    """

    def __init__(self, layout: UlyssesLayout, fabric, dtype):
        import torch

        from xstage_bench.attention.backends import FusedTarget
        from xstage_bench.attention.modes import spanning_out_view
        from xstage_bench.measurement import hostmem

        self.layout, self.fabric, self.dtype = layout, fabric, dtype
        self.node = HostNode(layout)
        dev, p = fabric.device, layout.world_size
        self.q, self.k, self.v, self.out = (
            torch.empty(layout.local_shape, dtype=dtype, device=dev) for _ in range(4)
        )
        b, shard, h, d = layout.final_shape
        strides = (shard * h * d, h * d, d, 1)
        self.chunk_bytes = b * shard * h * d * dtype.itemsize
        self.window, self._pinned, refused = None, None, None
        try:
            self.window = hostmem.host_window(
                self.chunk_bytes, chunks=p, device=dev, device_chunks=1
            )
        except hostmem.HostMemoryUnsupported as e:
            refused = str(e)
        if self.window is not None:
            ptrs = [self.window.chunk_ptr(v) for v in range(p)]
            self.host_memory = (
                "VMM range: chunk 0 in GPU memory, chunks 1..P-1 in host-NUMA memory"
                if dev.type == "cuda"
                else "CPU stand-in of host memory (one tensor)"
            )
        else:
            own = torch.empty(layout.final_shape, dtype=dtype, device=dev)
            self._pinned = (own, hostmem.host_tensor((p - 1, *layout.final_shape), dtype, dev))
            ptrs = [own.data_ptr()] + [self._pinned[1][v].data_ptr() for v in range(p - 1)]
            self.host_memory = f"pinned host chunks (host-located VMM refused: {refused})"
        self.chunks = [self._chunk(ptr, v, strides) for v, ptr in enumerate(ptrs)]
        self.target = FusedTarget(
            dest_ptrs=torch.tensor(ptrs, dtype=torch.int64, device=dev),
            dest_strides=strides[:3],
            rows_per_dest=shard,
            head_offset=0,
            peer_out=None,
        )
        if self.window is None:
            self.target.peer_out_reason = (
                "the driver refuses host-located VMM, so no one address range spans GPU "
                f"and host memory: {refused}"
            )
        else:
            self.target.peer_out, self.target.peer_out_reason = spanning_out_view(
                self.window, layout, dtype, 0, self.chunk_bytes
            )
        hl = layout.local_heads
        self.host_packed = hostmem.host_tensor((p - 1, hl, shard, b, d), dtype, dev)
        self.own_packed = None
        self.final = self.chunks  # what run_fused returns: the rows are in the chunks

    def _chunk(self, ptr: int, owner: int, strides):
        """Owner `owner`'s final buffer as a tensor: over the window (on the GPU, or the
        CPU stand-in), or the pinned chunks (a CPU tensor over pinned host memory)."""
        from xstage_bench.measurement.vmm import tensor_at

        if self._pinned is not None:
            own, host = self._pinned
            return own if owner == 0 else host[owner - 1]
        shape = self.layout.final_shape
        return tensor_at(ptr, self.chunk_bytes, self.fabric.device, self.dtype, shape, strides)

    def fill(self, seed: int) -> None:
        from xstage_bench.attention.modes import fill_inputs

        fill_inputs(self, seed)

    def poison(self) -> None:
        """NaN into every buffer a mode writes, after the GPU has finished with them (a
        copy still in flight into pinned memory would land after a host-side fill)."""
        self.fabric.wait()
        self.out.fill_(float("nan"))
        for chunk in self.chunks:
            chunk.fill_(float("nan"))
        self.host_packed.fill_(float("nan"))
        self.own_packed = None

    def exchange(self, out):
        """Serial's send: the yunchang pack, then one D2H copy-engine copy of the host
        share (owners 1..P-1) into pinned host memory. The own share stays packed."""
        from xstage_bench.attention.layout import pack_for_all_to_all

        packed = pack_for_all_to_all(out, self.layout.world_size)  # (P, H/P, S/P, B, D)
        self.own_packed = packed[0]
        self.host_packed.copy_(packed[1:], non_blocking=True)
        return self.host_packed

    def outcome(self, result, ref_local):
        """(rank 0's rows read back from where `result`'s mode put them, its reference),
        both (B, S, H/P, D) in token order on this device."""
        got = self._serial_rows() if result is self.host_packed else self.landed()
        return got, ref_local

    def landed(self):
        """Rank 0's rows read back from the owners' chunks (fused): (B, S, H/P, D)."""
        import torch

        heads, dev = self.layout.local_heads, self.fabric.device
        return torch.cat([c[:, :, :heads].to(dev) for c in self.chunks], dim=1)

    def _serial_rows(self):
        """Rank 0's rows from the packed own share and the host copy (serial)."""
        import torch

        dev = self.fabric.device
        blocks = [self.own_packed, *(block.to(dev) for block in self.host_packed)]
        # each block (H/P, S/P, B, D) -> (B, S/P, H/P, D)
        return torch.cat([blk.permute(2, 1, 0, 3) for blk in blocks], dim=1)

    def close(self) -> None:
        """Drop every view of the window, then unmap it (no kernel may still write)."""
        self.chunks, self.final, self._pinned, self.target = [], [], None, None
        if self.window is not None:
            self.window.close()
            self.window = None
