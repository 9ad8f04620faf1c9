"""Rule entry point: measure one microbenchmark study on this machine's GPUs."""

from xstage_bench.gpulock import GpuLock
from xstage_bench.joblog import tee_to
from xstage_bench.microbench.runner import run_study

gpu_ids = snakemake.config.get("gpu_ids") or list(range(snakemake.resources.gpu))  # noqa: F821

# The lock keeps a second harness run (another snakemake) off these GPUs meanwhile.
with tee_to(snakemake.log[0]), GpuLock(gpu_ids):  # noqa: F821 (injected by Snakemake)
    run_study(
        snakemake.config,  # noqa: F821
        snakemake.wildcards.study,  # noqa: F821
        snakemake.wildcards.dataset,  # noqa: F821
        snakemake.output[0],  # noqa: F821
        snakemake.input.cubin,  # noqa: F821
        gpu_ids=gpu_ids,
    )
