"""Rule entry point: the summary page of the report (xstage_bench.report.summary)."""

from pathlib import Path

from xstage_bench.report import summary as report_summary
from xstage_bench.run.joblog import tee_to

with tee_to(snakemake.log[0]):  # noqa: F821 (injected by Snakemake)
    datasets = [
        report_summary.Dataset(Path(path), profile)
        for path, profile in snakemake.params.datasets  # noqa: F821
    ]
    page = report_summary.build(
        datasets,
        report_summary.figure_pngs(list(snakemake.input.figures)),  # noqa: F821
        Path("workflow/report"),
    )
    report_summary.write(Path(snakemake.output[0]), page)  # noqa: F821
