# Stage 3a: the MegaMoE sweep (expert-wave vs interleaved schedules of the fused kernel),
# measured on this machine's GPUs or simulated; the traced runs feed the mechanism figures.


rule megamoe_measure:
    output:
        sweep=RESULTS / "{dataset}" / layout.MEGAMOE_RAW,
        trace=RESULTS / "{dataset}" / layout.MEGAMOE_TRACE_RAW,
    wildcard_constraints:
        dataset=measuring("megamoe"),
    params:
        gpu_ids=GPU_IDS,
    resources:
        gpu=GPU_JOB,
    conda:
        CONDA_ENV
    log:
        RESULTS / "{dataset}" / "logs" / "megamoe.log",
    script:
        "../scripts/measure_megamoe.py"


# Opt-in (measured_experiments: megamoe_per_gpu): our kernel's schedules once more, with one
# process per GPU (torch.distributed), for tab-process-model.
rule megamoe_measure_per_gpu:
    output:
        RESULTS / "{dataset}" / layout.MEGAMOE_PER_GPU_RAW,
    wildcard_constraints:
        dataset=measuring("megamoe_per_gpu"),
    params:
        gpu_ids=GPU_IDS,
    resources:
        gpu=GPU_JOB,
    conda:
        CONDA_ENV
    log:
        RESULTS / "{dataset}" / "logs" / "megamoe_per_gpu.log",
    script:
        "../scripts/measure_megamoe_per_gpu.py"


rule megamoe_simulate:
    input:
        profile=lambda wc: SIMULATED[wc.dataset],
        stamp=lambda wc: config_stamp(wc.dataset, "megamoe"),
    output:
        RESULTS / "{dataset}" / "raw" / "{experiment}.json",
    wildcard_constraints:
        dataset=r"sim-[A-Za-z0-9._-]+",
        experiment="megamoe|megamoe_trace",
    conda:
        CONDA_ENV
    log:
        RESULTS / "{dataset}" / "logs" / "{experiment}.log",
    script:
        "../scripts/simulate.py"
