"""Rule entry point: fit the Burst-Gap model to a dataset's microbenchmarks."""

from xstage_bench.model.bootstrap import N_BOOTSTRAP
from xstage_bench.model.fit import fit_files
from xstage_bench.run.joblog import tee_to

with tee_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    fit_files(
        list(snakemake.input.raw),  # noqa: F821
        snakemake.wildcards.dataset,  # noqa: F821
        snakemake.output.model,  # noqa: F821
        snakemake.output.profile,  # noqa: F821
        snakemake.params.base_profile,  # noqa: F821
        # read here, not as a rule's params: a count changed in one config must not make
        # Snakemake refit a committed reference that another config also renders
        n_bootstrap=snakemake.config.get("model", {}).get(  # noqa: F821
            "bootstrap_replicates", N_BOOTSTRAP
        ),
    )
