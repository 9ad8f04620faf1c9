"""Our GPU kernels in Triton, imported by the harness as `xstage_kernels`.

megamoe        the fused MoE kernel (MegaMoE on Hopper): Linear-1, SwiGLU, Linear-2 and
               the combine pushed from the epilogue, over a swappable tile list
megamoe_ws     the same kernel warp-specialized (Gluon): what the real sweep times for FP8
int4_fp8       the W4A8 weights' 4-bit to FP8 conversion
flash_ulysses  FlashAttention forward whose epilogue stores rows at their Ulysses owners
flash_ws       the same attention warp-specialized (Gluon)
tma            whether a device can load by TMA (both kernels ask), and run the
               warp-specialized kernels (Hopper only)
combine        the home rank's top-k weighted reduction of its combine buffer
dispatch       the dispatch on the GPU: each expert's rows counted, gathered expert-major
layout         the device schedule's layout built on the GPU from the experts' row counts
formats        the number formats and trace layout the harness shares with the kernels

The CUDA C microbenchmark kernels are in kernels/microbench/ (built by nvcc in the
build rule, see xstage_bench.microbench.build).
"""
