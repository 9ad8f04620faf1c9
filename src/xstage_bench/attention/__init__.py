"""Ulysses attention with the post-attention All-to-All fused into the kernel (kernel 2).

Our Triton kernel itself is xstage_kernels.flash_ulysses (kernels/xstage_kernels/).

layout    which rank owns which (token, head) after the All-to-All; the yunchang reshapes
backends  FA3, FA4 and ours behind one interface; the SDPA reference
modes     alone / serial / fused, the correctness check, one timed repetition
runner    one process per GPU, the resumable sweep, the command line

Peer windows and the device barrier are in xstage_bench.peer, the fabric they make up in
xstage_bench.fabric, the process plumbing in xstage_bench.workers (MegaMoE uses them too).
"""
