"""Rule entry point: measure the Ulysses attention sweep on this machine's GPUs."""

from xstage_bench.attention.runner import run_attention
from xstage_bench.gpulock import GpuLock
from xstage_bench.joblog import tee_to

gpu_ids = snakemake.config.get("gpu_ids") or list(range(snakemake.resources.gpu))  # noqa: F821

# The lock keeps a second harness run (another snakemake) off these GPUs meanwhile.
with tee_to(snakemake.log[0]), GpuLock(gpu_ids):  # noqa: F821 (injected by Snakemake)
    run_attention(
        snakemake.config,  # noqa: F821
        snakemake.wildcards.dataset,  # noqa: F821
        snakemake.output[0],  # noqa: F821
        world_size=len(gpu_ids),
    )
