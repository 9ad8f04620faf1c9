"""MegaMoE on Hopper: a fused persistent Triton kernel with swappable tile schedules (kernel 1).

The kernel itself is xstage_kernels.megamoe (kernels/xstage_kernels/megamoe.py).

quant      block-scaled FP8 and word-split packed INT4 formats (numpy spec, torch versions)
routing    top-k expert choice (balanced, skewed) and the padded expert-major dispatch layout
schedule   the tile lists: expert waves and interleaved, with the dependency check
reference  the plain torch reference (dequantized, fp32)
problem    one configuration laid out on the GPUs: inputs, weights, dispatch, forward
points     the sweep's points: schedules and baselines per configuration, traced ones
verdict    the one judgement of a checked run (both process models, the emulated build)
measurer   our kernel checked, timed and traced from one process driving every GPU
summary    the traced runs' waits, spans and timeline; the table a sweep prints
options    the grid's command-line options
runner     the single-process sweep's raw files and its command line
distributed  the same sweep with one process per GPU (torch.distributed)
emulated   the kernel with its compute replaced by calibrated waits
baselines  what a user would run instead (unfused torch, DeepGEMM), measured beside ours
"""
