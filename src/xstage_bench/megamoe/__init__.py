"""MegaMoE on Hopper: a fused persistent Triton kernel with swappable tile schedules (kernel 1).

The kernel itself is xstage_kernels.megamoe (kernels/xstage_kernels/megamoe.py).

quant      block-scaled FP8 and half-split packed INT4 formats (numpy spec, torch versions)
routing    top-k expert choice (balanced, skewed) and the padded expert-major dispatch layout
schedule   the tile lists: expert waves and interleaved, with the dependency check
reference  the plain torch reference (dequantized, fp32)
problem    one configuration laid out on the GPUs: inputs, weights, dispatch, forward
runner     the checked and timed sweep, the trace runs, the command line
"""
