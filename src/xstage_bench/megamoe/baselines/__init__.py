"""What a user would run instead of our fused kernel, measured in the same sweep.

unfused   the plain torch pipeline: dispatch copies, grouped GEMM, SwiGLU, grouped GEMM,
          combine copies and the top-k weighted sum, each its own kernel
deepgemm  DeepGEMM's SM90 FP8 MegaMoE (PyPI sgl-deep-gemm), in its own torch.distributed
          process pair, checked against our reference before it is timed
gemm_ceiling  not a MoE: cuBLAS on the same two GEMMs of one rank, the ceiling each
          configuration's TFLOP/s sits beside, with its roofline time (megamoe/ceiling.py)
"""

VARIANTS = ("ours", "unfused", "deepgemm", "gemm_ceiling")
BASELINES = ("unfused", "deepgemm")
