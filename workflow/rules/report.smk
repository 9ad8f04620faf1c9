# Stage 6: the page `snakemake --report` opens on. workflow/report/workflow.rst (the
# Snakefile's `report:`) includes the summary: the claims with their verdicts, how each
# dataset was made, then every figure with its caption and the command that rebuilds it.


rule report_summary:
    input:
        unpack(summary_inputs),
    output:
        report(
            SUMMARY,
            caption="../report/summary.rst",
            category="Summary",
        ),
    log:
        str(RESULTS / "report" / "summary.log"),
    conda:
        CONDA_ENV
    params:
        datasets=lambda wc: [(str(RESULTS / d), SIMULATED.get(d)) for d in datasets()],
    script:
        "../scripts/report_summary.py"


# A committed reference's raw files are read back against the schema before anything is
# rendered from them. Its products wait for this listing, so every dataset's jobs start at
# the same depth of the DAG (measured and simulated ones start at their measuring rule):
# the report's rule graph then shows each rule once. The listing is update(): a check that
# refuses a file puts the committed listing back, which still differs from the raw files,
# so every later run checks them again (common.smk, CHANGED_REFERENCES).
rule check_reference:
    input:
        lambda wc: as_read(wc.dataset, [str(p) for p in layout.raw_files(RESULTS / wc.dataset)]),
        stamp=lambda wc: reference_stamp(wc.dataset),
    output:
        update(str(RESULTS / "{dataset}" / REFERENCE_CHECK)),
    log:
        str(RESULTS / "{dataset}" / "logs" / "check_reference.log"),
    wildcard_constraints:
        dataset="|".join(REFERENCE) if REFERENCE else "no-reference-dataset",
    conda:
        CONDA_ENV
    script:
        "../scripts/check_reference.py"
