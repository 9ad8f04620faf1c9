"""Ulysses sequence parallelism: which rank owns which (token, head) of the attention output.

Before attention each rank holds all S tokens of its H/P heads (rank r: heads r·H/P ...
(r+1)·H/P - 1). After the post-attention All-to-All, rank j must hold its S/P tokens
(j·S/P ... (j+1)·S/P - 1) for all H heads, as a (B, S/P, H, D) buffer. This module is that
mapping, written once: the fused epilogues store by it, the serial path reaches it through
the yunchang/xDiT reshapes around `all_to_all_single`, and the tests check one against
the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UlyssesLayout:
    """Shapes of one Ulysses attention layer spread over `world_size` ranks."""

    batch: int
    seq_len: int
    heads: int
    head_dim: int
    world_size: int

    def __post_init__(self) -> None:
        for name in ("batch", "seq_len", "heads", "head_dim", "world_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"UlyssesLayout.{name} must be >= 1, got {getattr(self, name)}")
        if self.heads % self.world_size:
            raise ValueError(
                f"heads={self.heads} do not divide over world_size={self.world_size} ranks"
            )
        if self.seq_len % self.world_size:
            raise ValueError(
                f"seq_len={self.seq_len} does not divide over world_size={self.world_size} ranks"
            )

    @property
    def shard_len(self) -> int:
        """Tokens each rank owns after the All-to-All (S/P)."""
        return self.seq_len // self.world_size

    @property
    def local_heads(self) -> int:
        """Heads each rank computes attention for (H/P)."""
        return self.heads // self.world_size

    @property
    def local_shape(self) -> tuple[int, int, int, int]:
        """q, k, v and the attention output on one rank: (B, S, H/P, D)."""
        return (self.batch, self.seq_len, self.local_heads, self.head_dim)

    @property
    def final_shape(self) -> tuple[int, int, int, int]:
        """What each rank holds after the All-to-All: (B, S/P, H, D)."""
        return (self.batch, self.shard_len, self.heads, self.head_dim)

    def owner(self, token: int) -> int:
        """The rank whose final buffer holds `token` (for every head)."""
        self._check_token(token)
        return token // self.shard_len

    def destination(self, src_rank: int, token: int, local_head: int) -> tuple[int, int, int]:
        """Where row (token, local_head) computed on `src_rank` goes: (rank, row, head) of
        that rank's (B, S/P, H, D) final buffer; the batch index is unchanged."""
        self._check_token(token)
        if not 0 <= src_rank < self.world_size:
            raise ValueError(f"src_rank={src_rank} outside 0..{self.world_size - 1}")
        if not 0 <= local_head < self.local_heads:
            raise ValueError(f"local_head={local_head} outside 0..{self.local_heads - 1}")
        dest = token // self.shard_len
        return dest, token - dest * self.shard_len, src_rank * self.local_heads + local_head

    def head_offset(self, src_rank: int) -> int:
        """First global head computed on `src_rank`."""
        return src_rank * self.local_heads

    def attention_flops(self) -> float:
        """Forward, non-causal FLOPs on one rank: two matmuls of 2·S·S·D per local head."""
        return 4.0 * self.batch * self.seq_len**2 * self.local_heads * self.head_dim

    def _check_token(self, token: int) -> None:
        if not 0 <= token < self.seq_len:
            raise ValueError(f"token={token} outside 0..{self.seq_len - 1}")


def pack_for_all_to_all(x, world_size: int):
    """yunchang/xDiT `all_to_all_4D` (scatter_idx=1, gather_idx=2), before the collective:
    (B, S, H/P, D) -> (P, H/P, S/P, B, D), contiguous, so chunk j of `all_to_all_single`
    is every local head's rows for the tokens rank j owns."""
    b, s, hl, d = x.shape
    return (
        x.reshape(b, world_size, s // world_size, hl, d)
        .transpose(0, 3)
        .transpose(0, 1)
        .contiguous()
        .reshape(world_size, hl, s // world_size, b, d)
    )


def unpack_after_all_to_all(y, world_size: int):
    """The other half of `all_to_all_4D`: the received (P, H/P, S/P, B, D) buffer, whose
    chunk i came from rank i, -> (B, S/P, H, D) with global head i·H/P + h."""
    p, hl, shard, b, d = y.shape
    return y.reshape(p * hl, shard, b, d).transpose(0, 2).contiguous().reshape(b, shard, p * hl, d)
