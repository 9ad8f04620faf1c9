"""Rule entry point: our MegaMoE kernel again, one process per GPU (to compare process models)."""

from xstage_bench.joblog import gpu_job
from xstage_bench.megamoe.distributed import run_per_gpu

with gpu_job(snakemake) as gpu_ids:  # noqa: F821 (injected by Snakemake)
    run_per_gpu(
        snakemake.config,  # noqa: F821
        snakemake.wildcards.dataset,  # noqa: F821
        snakemake.output[0],  # noqa: F821
        world_size=len(gpu_ids),
    )
