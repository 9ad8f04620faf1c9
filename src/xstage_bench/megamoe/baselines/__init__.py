"""What a user would run instead of our fused kernel, measured in the same sweep.

unfused   the plain torch pipeline: dispatch copies, grouped GEMM, SwiGLU, grouped GEMM,
          combine copies and the top-k weighted sum, each its own kernel
deepgemm  DeepGEMM's SM90 FP8 MegaMoE (PyPI sgl-deep-gemm), in its own torch.distributed
          process pair, checked against our reference before it is timed
"""

VARIANTS = ("ours", "unfused", "deepgemm")
BASELINES = VARIANTS[1:]
