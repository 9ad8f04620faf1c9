"""Rule entry point: measure the MegaMoE sweep (and its traced runs) on this machine's GPUs."""

from xstage_bench.gpulock import GpuLock
from xstage_bench.joblog import tee_to
from xstage_bench.megamoe.runner import run_megamoe

gpu_ids = snakemake.config.get("gpu_ids") or list(range(snakemake.resources.gpu))  # noqa: F821

# The lock keeps a second harness run (another snakemake) off these GPUs meanwhile.
with tee_to(snakemake.log[0]), GpuLock(gpu_ids):  # noqa: F821 (injected by Snakemake)
    run_megamoe(
        snakemake.config,  # noqa: F821
        snakemake.wildcards.dataset,  # noqa: F821
        snakemake.output.sweep,  # noqa: F821
        snakemake.output.trace,  # noqa: F821
        world_size=len(gpu_ids),
    )
