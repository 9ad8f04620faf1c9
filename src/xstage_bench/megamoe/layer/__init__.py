"""One MoE layer laid out on the GPUs: its seeded inputs, each rank's buffers and launch,
the combine's top-k reduction, the FLOPs and bytes it moves, the per-GPU process's rank,
and the dispatch on the GPU where the timed layer starts from home tokens (token_dispatch)."""
