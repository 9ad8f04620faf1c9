"""Rule entry point: read a reference dataset's raw files back against the schema."""

from pathlib import Path

from xstage_bench.data.origins import check_listing
from xstage_bench.data.results import atomic_write_text
from xstage_bench.run.joblog import tee_to

with tee_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    dataset_dir = Path(snakemake.output[0]).parent.parent  # noqa: F821 (results/<dataset>)
    atomic_write_text(snakemake.output[0], check_listing(dataset_dir))  # noqa: F821
