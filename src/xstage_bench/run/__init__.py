"""The run's plumbing that the workflow calls: run and GPU-job locks, job logs, orphan recovery,
restored and committed products, the Snakemake command-line errors."""
