"""Rule entry point: measure the MegaMoE sweep (and its traced runs) on this machine's GPUs."""

from xstage_bench.joblog import gpu_job
from xstage_bench.megamoe.runner import run_megamoe

with gpu_job(snakemake) as gpu_ids:  # noqa: F821 (injected by Snakemake)
    run_megamoe(
        snakemake.config,  # noqa: F821
        snakemake.wildcards.dataset,  # noqa: F821
        snakemake.output.sweep,  # noqa: F821
        snakemake.output.trace,  # noqa: F821
        world_size=len(gpu_ids),
    )
