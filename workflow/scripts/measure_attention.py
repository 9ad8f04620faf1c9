"""Rule entry point: measure the Ulysses attention sweep on this machine's GPUs."""

from xstage_bench.attention.runner import run_attention
from xstage_bench.joblog import gpu_job

with gpu_job(snakemake) as gpu_ids:  # noqa: F821 (injected by Snakemake)
    run_attention(
        snakemake.config,  # noqa: F821
        snakemake.wildcards.dataset,  # noqa: F821
        snakemake.output[0],  # noqa: F821
        world_size=len(gpu_ids),
    )
