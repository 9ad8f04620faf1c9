"""MegaMoE on Hopper: a fused persistent Triton kernel with swappable tile schedules (kernel 1).

The kernel itself is xstage_kernels.megamoe (kernels/xstage_kernels/megamoe.py).

quant      block-scaled FP8 and word-split packed INT4 formats (numpy spec, torch versions)
routing    top-k expert choice (balanced, skewed), the padded expert-major dispatch layout,
           the host share's tokens and every row's destination offset
schedule   the tile lists: expert waves and interleaved, with the dependency check
drain      the X-Stage path as a fluid (T0, capacity Q(K) = min(S + K q, C), drain R)
playback   a tile list played through a path's drain as the kernel runs it (the hold too)
reference  the plain torch reference (dequantized, fp32)
layer/     one configuration laid out on the GPUs: seeded inputs, each rank's buffers and
           launch, the combine's top-k reduction, FLOPs and bytes, the problem (forward,
           checked outputs), and the per-GPU process's rank
ours/      our kernel's arms: the interleaved lead ('auto' from the playback), the
           check's verdict, paired timing, the measurer, the traces' waits and spans
points     the sweep's points: our arms (schedules, the lead map) and baselines per
           configuration, per store path; traced ones
options    the grid's command-line options
runner     the single-process sweep's raw files and its command line
distributed  the same sweep with one process per GPU (torch.distributed)
emulated   the kernel with its compute replaced by calibrated waits
ceiling    cuBLAS on a configuration's two GEMMs, and the roofline time
baselines/ what a user would run instead (unfused torch, DeepGEMM, FlashInfer), beside ours
"""
