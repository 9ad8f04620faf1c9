# X-Stage bench: one DAG from the configuration to every figure and table.
#
#   snakemake --cores all                                  # everything this machine can do
#   snakemake results/<dataset>/figures/<name>.pdf         # one figure, and only what it needs
#   snakemake --cores all --configfile config/smoke.yaml   # the CI-sized run
#
# Stages, one rule file each: build -> microbench / megamoe / attention (measured on GPUs or
# simulated) -> model (Burst-Gap fit) -> figures and tables -> report summary.

from snakemake.utils import min_version

min_version("9.0")


# A --configfile given on the command line replaces config.yaml whole (it is not merged
# into it): a reduced config such as config/smoke.yaml must not inherit the full grids.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


# `snakemake --report report.html` opens on this page: it includes the summary (report.smk).
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/microbench.smk"
include: "workflow/rules/megamoe.smk"
include: "workflow/rules/attention.smk"
include: "workflow/rules/model.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/report.smk"


# A figure, a table, the report's summary or a reference's raw-file check takes seconds: on a
# cluster it runs beside Snakemake instead of queueing as a job of its own (figures.smk makes
# one rule per product; report.smk holds the other two).
workflow.localrules(
    *(p.rule for p in products.PRODUCTS.values()),
    "report_summary",
    "check_reference",
)


onstart:
    print_measurement_verdict()
    print_remade_simulations()
    committed.record_metadata(workflow, REFERENCE)
    record_outputs_of_changed_raw()


rule all:
    default_target: True
    input:
        all_targets(),
        SUMMARY,


# Only this machine's measurements and what is rendered from them.
rule measured:
    input:
        dataset_targets(MEASURED) if MEASURED else [],


# Only what this machine's measuring rules write (raw files), nothing rendered.
rule measured_raw:
    input:
        measured_raw_files(),


# Only the simulated datasets.
rule simulated:
    input:
        [t for dataset in SIMULATED for t in dataset_targets(dataset)],
