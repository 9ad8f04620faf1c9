"""Rule entry point: measure one microbenchmark study on this machine's GPUs."""

from xstage_bench.joblog import gpu_job
from xstage_bench.microbench.runner import run_study

with gpu_job(snakemake) as gpu_ids:  # noqa: F821 (injected by Snakemake)
    run_study(
        snakemake.config,  # noqa: F821
        snakemake.wildcards.study,  # noqa: F821
        snakemake.wildcards.dataset,  # noqa: F821
        snakemake.output[0],  # noqa: F821
        snakemake.input.cubin,  # noqa: F821
        gpu_ids=gpu_ids,
    )
