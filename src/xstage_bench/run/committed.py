"""A committed reference's files are known to Snakemake as made, so no run warns about them.

A reference dataset is committed as rendered (figures, tables, model, its raw-file check).
Its products are inputs of the report's summary, so their jobs sit in every DAG, and in a
clone they have no Snakemake metadata: every dry run ended with "10 jobs have missing
provenance/metadata", and `snakemake --report` printed a "Missing metadata" warning per
file and left the reference's figures out of its per-dataset sections.

- `record_metadata`: at the start of a run that executes jobs (the Snakefile's `onstart`),
  each job of a reference dataset that need not run, whose outputs all exist and lack
  metadata, gets the metadata Snakemake records for a finished job (rule, params, inputs):
  what the run that made the committed files recorded on its machine.
- `quiet_missing_metadata`: drops Snakemake's "N jobs have missing provenance/metadata"
  when every job it counts is a reference's (a fresh clone's dry run, before any run
  recorded them); any other job without metadata is still reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

SNAKEMAKE_LOGGER = "snakemake.logging"
MISSING_METADATA = "jobs have missing provenance/metadata"


def _is_reference(job, references: set[str]) -> bool:
    return job.wildcards_dict.get("dataset") in references


def _unrecorded(workflow, references: set[str]) -> list:
    """Reference jobs of the DAG that need not run, with every output present, not all
    of them with metadata."""
    persistence, dag = workflow.persistence, workflow.dag
    return [
        job
        for job in dag.jobs
        if _is_reference(job, references)
        and not dag.needrun(job)
        and all(Path(f).exists() for f in job.output)
        and not persistence.has_metadata(job)
    ]


def record_metadata(workflow, references: Iterable[str]) -> int:
    """Give the DAG's committed reference outputs their metadata; returns how many jobs."""
    jobs = _unrecorded(workflow, set(references))
    for job in jobs:
        workflow.async_run(workflow.persistence.finished(job))
    return len(jobs)


class _ReferenceOnly(logging.Filter):
    def __init__(self, unexplained: Callable[[], bool]):
        super().__init__()
        self.unexplained = unexplained

    def filter(self, record: logging.LogRecord) -> bool:
        if MISSING_METADATA not in str(record.msg):
            return True
        try:
            return self.unexplained()
        except Exception:  # the DAG is not there to ask: keep Snakemake's message
            return True


def quiet_missing_metadata(workflow, references: Iterable[str]) -> None:
    """Install the filter (see the module doc) on Snakemake's logger."""
    references = set(references)

    def unexplained() -> bool:
        dag = workflow.dag
        return any(
            dag.reason(job).no_metadata and not dag.needrun(job)
            for job in dag.jobs
            if not _is_reference(job, references)
        )

    logging.getLogger(SNAKEMAKE_LOGGER).addFilter(_ReferenceOnly(unexplained))
