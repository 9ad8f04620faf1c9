"""The attention kernels compared, behind one small interface, and the SDPA reference.

Every backend computes forward, non-causal attention of q, k, v shaped (B, S, H, D) — the
layout FA3/FA4 use — in two ways:

- `local(q, k, v, out)`: into `out`, a (B, S, H, D) tensor on this GPU (alone, serial);
- `fused(q, k, v, target)`: every output row into the rank that owns its token
  (`FusedTarget`). FA3 and FA4 are unmodified kernels: they get an `out` whose pages live on
  the owner GPUs (peer.CudaPeerWindow). Our Triton kernel routes rows in its epilogue.

External backends are imported on first use; a missing one raises BackendUnavailable with
the import error, which the runner records as "unsupported".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (not installed, or this mode needs what it lacks)."""


@dataclass
class FusedTarget:
    """Where the fused epilogue writes on this rank.

    `dest_ptrs` (int64, on this GPU): each owner rank's final (B, S/P, H, D) buffer, mapped
    here; `dest_strides`: that buffer's (batch, token, head) strides in elements;
    `rows_per_dest` = S/P; `head_offset` = first global head of this rank.
    `peer_out`: this rank's heads of one (B, S, H, D) tensor whose token rows live on their
    owners, or None where no such single strided view exists (then `peer_out_reason`).
    """

    dest_ptrs: torch.Tensor
    dest_strides: tuple[int, int, int]
    rows_per_dest: int
    head_offset: int
    peer_out: torch.Tensor | None
    peer_out_reason: str = ""


def softmax_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def sdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch's scaled_dot_product_attention in the (B, S, H, D) layout."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=False
    )
    return out.transpose(1, 2)


class TritonBackend:
    """Ours (xstage_kernels.flash_ulysses): one kernel, the epilogue computes each row's
    destination."""

    name = "triton"

    def __init__(self, config: dict | None = None):
        from xstage_kernels import flash_ulysses

        self._fa = flash_ulysses
        self.config = config
        self._local_ptrs: tuple[int, torch.Tensor] | None = None

    def local(self, q, k, v, out) -> None:
        # One destination (out itself); the pointer tensor is cached per buffer so the
        # timed call enqueues no host-to-device copy.
        if self._local_ptrs is None or self._local_ptrs[0] != out.data_ptr():
            ptrs = torch.tensor([out.data_ptr()], dtype=torch.int64, device=q.device)
            self._local_ptrs = (out.data_ptr(), ptrs)
        ptrs = self._local_ptrs[1]
        self._fa.flash_attention_routed(
            q,
            k,
            v,
            ptrs,
            dest_strides=out.stride()[:3],
            rows_per_dest=q.shape[1],
            config=self.config,
        )

    def fused(self, q, k, v, target: FusedTarget) -> None:
        self._fa.flash_attention_routed(
            q,
            k,
            v,
            target.dest_ptrs,
            dest_strides=target.dest_strides,
            rows_per_dest=target.rows_per_dest,
            head_offset=target.head_offset,
            config=self.config,
        )


class _PeerOutBackend:
    """An unmodified kernel that takes `out`: fused = the peer-backed out view."""

    name = ""

    def fused(self, q, k, v, target: FusedTarget) -> None:
        if target.peer_out is None:
            raise BackendUnavailable(
                f"{self.name} fused needs a peer-backed out view: {target.peer_out_reason}"
            )
        self.local(q, k, v, target.peer_out)


class FA3Backend(_PeerOutBackend):
    """FlashAttention-3 (tokenspeed-fa3, module flash_attn_interface), Hopper only.

    Called through the raw op `torch.ops.flash_attn_3.fwd`: the public function has no
    `out`, and the custom-op wrapper refuses an out that it cannot prove unaliased.
    """

    name = "fa3"

    def __init__(self):
        try:
            import flash_attn_interface  # noqa: F401  (registers torch.ops.flash_attn_3)
        except Exception as e:  # ImportError, or an OSError from the compiled library
            raise BackendUnavailable(
                f"fa3: cannot import flash_attn_interface: {type(e).__name__}: {e}"
            ) from e
        self._fwd = torch.ops.flash_attn_3.fwd

    def local(self, q, k, v, out) -> None:
        # The 35 positional arguments of flash_attn_interface._flash_attn_forward.
        self._fwd(
            q,
            k,
            v,
            None,
            None,
            None,
            out,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            softmax_scale(q.shape[-1]),
            False,
            -1,
            -1,
            0,
            0.0,
            True,
            None,
            1,
            None,
            0,
            None,
        )


class FA4Backend(_PeerOutBackend):
    """FlashAttention-4 (flash-attn-4, CuTe DSL): `flash_attn.cute.interface._flash_attn_fwd`,
    which accepts a strided `out`."""

    name = "fa4"

    def __init__(self):
        try:
            from flash_attn.cute.interface import _flash_attn_fwd
        except Exception as e:
            raise BackendUnavailable(
                f"fa4: cannot import flash_attn.cute.interface: {type(e).__name__}: {e}"
            ) from e
        self._fwd = _flash_attn_fwd

    def local(self, q, k, v, out) -> None:
        self._fwd(q, k, v, softmax_scale=softmax_scale(q.shape[-1]), causal=False, out=out)


BACKENDS = {"triton": TritonBackend, "fa3": FA3Backend, "fa4": FA4Backend}


def load_backend(name: str, triton_config: dict | None = None):
    """The backend called `name`; BackendUnavailable (with the import error) if it cannot run."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(BACKENDS)}")
    if name == "triton":
        try:
            return TritonBackend(triton_config)
        except ImportError as e:
            raise BackendUnavailable(f"triton: {type(e).__name__}: {e}") from e
    return BACKENDS[name]()
