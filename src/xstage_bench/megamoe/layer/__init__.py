"""One MoE layer laid out on the GPUs: its seeded inputs, each rank's buffers and launch,
the combine's top-k reduction, the FLOPs and bytes it moves, and the per-GPU process's rank."""
