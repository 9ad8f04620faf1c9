"""MegaMoE on Hopper: a fused persistent Triton kernel with swappable tile schedules (kernel 1).

The kernel itself is xstage_kernels.megamoe (kernels/xstage_kernels/megamoe.py).

quant      block-scaled FP8 and word-split packed INT4 formats (numpy spec, torch versions)
routing    top-k expert choice (balanced, skewed), the padded expert-major dispatch layout,
           the host share's tokens and every row's destination offset
schedule   the tile lists: expert waves and interleaved, with the dependency check
reference  the plain torch reference (dequantized, fp32)
inputs     a configuration's seeded weights and tokens, and its host share
rank       one rank's buffers, tile lists, poisoning and launch (both process models)
accounting FLOPs and the bytes each path's stores carry, from the dispatch plans
reduction  the home rank's top-k weighted reduction of its combine buffer (which one ran)
problem    one configuration laid out on the GPUs: dispatch, forward, checked outputs
points     the sweep's points: our arms (schedules, the lead map) and baselines per
           configuration, per store path; traced ones
lead       lead_rows 'auto': the interleaved lead chosen from the path's fitted T0, R, Q
paired     a configuration's arms checked alone, then timed together in paired rounds
verdict    the one judgement of a checked run (both process models, the emulated build)
measurer   our kernel checked, timed and traced from one process driving every GPU
summary    the traced runs' waits, spans and timeline; the table a sweep prints
options    the grid's command-line options
runner     the single-process sweep's raw files and its command line
distributed  the same sweep with one process per GPU (torch.distributed)
per_gpu_rank one worker process of that model
emulated   the kernel with its compute replaced by calibrated waits
baselines  what a user would run instead (unfused torch, DeepGEMM, FlashInfer), beside ours
"""
