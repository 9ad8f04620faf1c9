"""What a user would run instead of our fused kernel, measured in the same sweep.

unfused   the plain torch pipeline: dispatch copies, grouped GEMM, SwiGLU, grouped GEMM,
          combine copies and the top-k weighted sum, each its own kernel
deepgemm  DeepGEMM's SM90 FP8 MegaMoE (PyPI sgl-deep-gemm), in its own torch.distributed
          process pair, checked against our reference before it is timed
flashinfer  FlashInfer's SM90 FP8 MegaMoE (PyPI flashinfer-python, moe_ep backend
          sm90_fp8_fp8_bf16_pull_cutedsl), in its own process pair over NVSHMEM, checked
          the same way; one point per configuration at natural routing (its own schedule
          and dispatch: the re-homed remote fractions do not apply to it)
gemm_ceiling  not a MoE: cuBLAS on the same two GEMMs of one rank, the ceiling each
          configuration's TFLOP/s sits beside, with its roofline time (megamoe/ceiling.py)
"""

VARIANTS = ("ours", "unfused", "deepgemm", "flashinfer", "gemm_ceiling")
BASELINES = ("unfused", "deepgemm", "flashinfer")
