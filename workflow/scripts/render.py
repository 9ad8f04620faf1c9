"""Rule entry point: render one figure or table of one dataset from its raw JSON."""

from pathlib import Path

from xstage_bench.report.render import render_product
from xstage_bench.run.joblog import tee_to

with tee_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    render_product(
        snakemake.params.product,  # noqa: F821
        Path(snakemake.output[0]).parent.parent,  # noqa: F821 (results/<dataset>)
        Path(snakemake.output[0]),  # noqa: F821
    )
