"""Ulysses attention with the post-attention All-to-All fused into the kernel (kernel 2).

Our Triton kernel itself is xstage_kernels.flash_ulysses (kernels/xstage_kernels/).

layout    which rank owns which (token, head) after the All-to-All; the yunchang reshapes
backends  FA3, FA4 and ours behind one interface; the SDPA reference
modes     alone / serial / fused, the correctness check, one timed repetition
emulation two GPUs playing ranks 0 and P-1 of a P-GPU node (the peer path)
host      one GPU playing rank 0 of a P-GPU node, host memory the other owners (host path)
points    the sweep's points in run order, and the groups timed together
rank      one worker's checks and paired rounds, and the records it builds
raw_config what the raw file records as its config (and when a kernel change re-measures)
runner    one process per GPU, the resumable sweep, the command line

Peer windows and the device barrier are in xstage_bench.measurement.peer, the fabric they
make up in measurement.fabric, the process plumbing in measurement.workers (MegaMoE uses
them too).
"""
