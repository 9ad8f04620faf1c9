"""Our GPU kernels in Triton, imported by the harness as `xstage_kernels`.

megamoe        the fused MoE kernel (MegaMoE on Hopper): Linear-1, SwiGLU, Linear-2 and
               the combine pushed from the epilogue, over a swappable tile list
flash_ulysses  FlashAttention forward whose epilogue stores rows at their Ulysses owners
tma            whether a device can load by TMA (both kernels ask)

The CUDA C microbenchmark kernels are in kernels/microbench/ (built by nvcc in the
build rule, see xstage_bench.microbench.build).
"""
