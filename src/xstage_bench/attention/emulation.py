"""Ulysses attention at an emulated world size: two GPUs play two ranks of a P-GPU node.

On a P-GPU node each rank computes H/P heads over all S tokens and, after attention, keeps
1/P of its output rows and sends (P-1)/P of them to the other ranks. Two GPUs can carry
exactly that per-GPU load: GPU 0 plays rank 0 of the emulated node and GPU 1 plays rank
P-1; each computes H/P heads, keeps the rows of the tokens its virtual rank owns, and
sends every other row to the other GPU, which stands in for the P-1 other owners. Each GPU
then issues and receives the NVLink bytes of a rank of the P-GPU node, with the compute of
that rank between them; what two GPUs cannot show is NVLink contention among eight.

Where rows land. Each GPU's window holds P chunks, each one owner's (B, S/P, H, D) final
buffer; the window's 2P chunks are numbered in mapping order (GPU 0's first). Sender s
writes virtual owner v's rows into chunk `position(s, v)` = base(s) + v, at its virtual
rank's heads: GPU 0 starts at its own last chunk (so owner 0 is local and owners 1..P-1
are GPU 1's first P-1 chunks), GPU 1 starts at GPU 0's second chunk (owners 0..P-2 on GPU
0, owner P-1 its own first chunk). Two senders may share a chunk, never a head, and each
sender's rows form one strided (S, H, D) range, so the unmodified FA3/FA4 kernels can write
them through one `out` view, as they do at the physical world size.
"""

from __future__ import annotations

from dataclasses import dataclass

from xstage_bench.attention.layout import UlyssesLayout

PHYSICAL_RANKS = 2


def unsupported_on(world_size: int) -> str | None:
    """Why a run on `world_size` GPUs cannot play an emulated node, or None (it can on
    exactly two). The grid keeps such points (grid.attention_points); they are recorded
    unsupported with this reason, so a config made for two GPUs still runs on four or
    eight, where the physical world size is measured instead."""
    if world_size == PHYSICAL_RANKS:
        return None
    return (
        f"an emulated world size is played by exactly {PHYSICAL_RANKS} GPUs (ranks 0 and P-1 "
        f"of the emulated node); this run has {world_size}"
    )


@dataclass(frozen=True)
class EmulatedNode:
    """Which virtual rank each of the two GPUs plays, and where each row it sends lands."""

    layout: UlyssesLayout  # world_size is the emulated P

    def __post_init__(self) -> None:
        if self.layout.world_size <= PHYSICAL_RANKS:
            raise ValueError(
                f"an emulated world size must exceed the {PHYSICAL_RANKS} GPUs that play it, "
                f"got {self.layout.world_size}"
            )

    @property
    def size(self) -> int:
        return self.layout.world_size

    def plays(self, rank: int) -> int:
        """The virtual rank that GPU `rank` plays: 0 or P-1."""
        self._check_rank(rank)
        return 0 if rank == 0 else self.size - 1

    def position(self, rank: int, owner: int) -> int:
        """Window chunk (0 .. 2P-1) that receives sender `rank`'s rows of virtual `owner`."""
        if not 0 <= owner < self.size:
            raise ValueError(f"owner={owner} outside 0..{self.size - 1}")
        base = self.size - 1 if self.plays(rank) == 0 else 1
        return base + owner

    def host(self, rank: int, owner: int) -> int:
        """The GPU whose memory holds that chunk."""
        return self.position(rank, owner) // self.size

    def owners_on(self, sender: int, host: int) -> list[int]:
        """Virtual owners of `sender`'s rows that live on GPU `host`, in order."""
        return [v for v in range(self.size) if self.host(sender, v) == host]

    def remote_fraction(self) -> float:
        """Share of each sender's output rows that crosses NVLink: (P-1)/P."""
        return (self.size - 1) / self.size

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < PHYSICAL_RANKS:
            raise ValueError(f"rank={rank}: an emulated node is played by GPUs 0 and 1")


class EmulatedWorkspace:
    """Workspace (modes.py) of one shape at an emulated world size, on one of the two GPUs.

    q, k, v and `out` are this GPU's (B, S, H/P, D); `target` routes the fused epilogue by
    `EmulatedNode.position`; `exchange` is the serial All-to-All with uneven splits (1/P
    stays, (P-1)/P goes to the other GPU) that moves the same rows; `landed` reads this
    sender's rows back from wherever they went, for the check.
    """

    def __init__(self, layout: UlyssesLayout, fabric, dtype):
        import torch

        from xstage_bench.attention.backends import FusedTarget

        unsupported = unsupported_on(fabric.world_size)
        if unsupported:
            raise ValueError(f"attention.emulated_world_sizes: {unsupported}")
        self.layout, self.fabric, self.dtype = layout, fabric, dtype
        self.node = EmulatedNode(layout)
        rank, dev, p = fabric.rank, fabric.device, layout.world_size
        self.q, self.k, self.v, self.out = (
            torch.empty(layout.local_shape, dtype=dtype, device=dev) for _ in range(4)
        )
        b, shard, h, d = layout.final_shape
        self.chunk_shape = layout.final_shape
        self.chunk_strides = (shard * h * d, h * d, d, 1)
        self.chunk_bytes = b * shard * h * d * dtype.itemsize
        self.window = fabric.window(p * self.chunk_bytes)
        self.own = self._chunks(rank * p, p)  # (P, B, S/P, H, D): this GPU's chunks
        first_head = layout.head_offset(self.node.plays(rank))
        self.heads = slice(first_head, first_head + layout.local_heads)
        self.target = FusedTarget(
            dest_ptrs=torch.tensor(
                [self._chunk_ptr(self.node.position(rank, v)) for v in range(p)],
                dtype=torch.int64,
                device=dev,
            ),
            dest_strides=self.chunk_strides[:3],
            rows_per_dest=shard,
            head_offset=self.heads.start,
            peer_out=None,
        )
        self._peer_out_view()
        self.final = None  # the rows stay spread over the window; `landed` gathers them

    def _chunk_ptr(self, position: int) -> int:
        p = self.layout.world_size
        return self.window.chunk_ptr(position // p) + (position % p) * self.chunk_bytes

    def _chunks(self, first: int, count: int):
        """`count` consecutive chunks of one GPU as a (count, B, S/P, H, D) tensor."""
        from xstage_bench.measurement.vmm import tensor_at

        return tensor_at(
            self._chunk_ptr(first),
            count * self.chunk_bytes,
            self.fabric.device,
            self.dtype,
            (count, *self.chunk_shape),
            (self.chunk_strides[0] * self.chunk_shape[0], *self.chunk_strides),
        )

    def _peer_out_view(self) -> None:
        lay, window, p = self.layout, self.window, self.layout.world_size
        if not window.contiguous:
            self.target.peer_out_reason = "this window's chunks are not one address range"
        elif lay.batch != 1:
            self.target.peer_out_reason = (
                f"batch={lay.batch}: tokens are one strided axis at batch 1"
            )
        elif window.chunk_bytes != p * self.chunk_bytes:
            self.target.peer_out_reason = (
                f"each GPU's {p} chunks ({p * self.chunk_bytes} bytes) are not a multiple of "
                f"the mapping granularity, so they are padded to {window.chunk_bytes} bytes"
            )
        else:
            s, h, d = lay.seq_len, lay.heads, lay.head_dim
            first = self.node.position(self.fabric.rank, 0) * self.chunk_bytes
            full = window.view(self.dtype, (1, s, h, d), (s * h * d, h * d, d, 1), first)
            self.target.peer_out = full[:, :, self.heads, :]

    def fill(self, seed: int) -> None:
        from xstage_bench.attention.modes import fill_inputs

        fill_inputs(self, seed)

    def poison(self) -> None:
        self.out.fill_(float("nan"))
        self.own.fill_(float("nan"))

    def exchange(self, out):
        """The serial All-to-All of the emulated node: this GPU keeps its own owner's
        rows and sends the rest to the other GPU (one all_to_all_single with uneven
        splits), then each received block goes to its chunks at its sender's heads."""
        import torch
        import torch.distributed as dist

        from xstage_bench.attention.layout import pack_for_all_to_all

        node, rank, p = self.node, self.fabric.rank, self.layout.world_size
        packed = pack_for_all_to_all(out, p)  # (P, H/P, S/P, B, D): chunk v for owner v
        send = [len(node.owners_on(rank, r)) for r in range(PHYSICAL_RANKS)]
        recv = [len(node.owners_on(s, rank)) for s in range(PHYSICAL_RANKS)]
        received = torch.empty((sum(recv), *packed.shape[1:]), dtype=out.dtype, device=out.device)
        dist.all_to_all_single(received, packed, recv, send, group=self.fabric.group)
        at = 0
        for sender, count in enumerate(recv):
            if not count:
                continue
            first = node.position(sender, node.owners_on(sender, rank)[0]) - rank * p
            heads = node.plays(sender) * self.layout.local_heads
            block = received[at : at + count].permute(0, 3, 2, 1, 4)  # (n, B, S/P, H/P, D)
            self.own[first : first + count, :, :, heads : heads + self.layout.local_heads] = block
            at += count
        return self.own

    def outcome(self, result, ref_local):
        """(what landed, what should have): this sender's rows read back from their
        chunks, against its own reference."""
        return self.landed(), ref_local

    def landed(self):
        """This sender's rows read back from their chunks: (B, S, H/P, D), token order."""
        import torch

        rank = self.fabric.rank
        return torch.cat(
            [
                self._chunks(self.node.position(rank, v), 1)[0][:, :, self.heads]
                for v in range(self.layout.world_size)
            ],
            dim=1,
        )

    def close(self) -> None:
        self.window.close()
