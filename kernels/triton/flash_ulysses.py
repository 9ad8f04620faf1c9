"""Our Triton FlashAttention forward with the Ulysses All-to-All fused into its epilogue.

The kernel lives in the package (src/xstage_bench/attention/triton_fa.py), so that the
installed harness imports it like any other module; this file re-exports it where the
project keeps its kernel sources.
"""

from xstage_bench.attention.triton_fa import (  # noqa: F401
    DEFAULT_CONFIG,
    flash_attention,
    flash_attention_routed,
)
