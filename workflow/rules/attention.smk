# Stage 3b: Ulysses attention, alone / serial (attention then All-to-All) / fused.


rule attention_measure:
    output:
        RESULTS / "{dataset}" / layout.ATTENTION_RAW,
    wildcard_constraints:
        dataset=measuring("attention"),
    params:
        gpu_ids=GPU_IDS,
    resources:
        gpu=GPU_JOB,
    conda:
        CONDA_ENV
    log:
        RESULTS / "{dataset}" / "logs" / "attention.log",
    script:
        "../scripts/measure_attention.py"


rule attention_simulate:
    input:
        profile=lambda wc: SIMULATED[wc.dataset],
        stamp=lambda wc: config_stamp(wc.dataset, "attention"),
    output:
        RESULTS / "{dataset}" / layout.ATTENTION_RAW,
    wildcard_constraints:
        dataset=r"sim-[A-Za-z0-9._-]+",
    params:
        experiment="attention",
    conda:
        CONDA_ENV
    log:
        RESULTS / "{dataset}" / "logs" / "attention.log",
    script:
        "../scripts/simulate.py"
