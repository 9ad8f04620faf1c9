# Stage 3b: Ulysses attention, alone / serial (attention then All-to-All) / fused, on every
# measured store path (config["store_paths"]): peer (P GPUs, or two emulating a P-GPU node)
# and host (one GPU as rank 0 of a P-GPU node, host memory the other owners; one GPU
# measures only this). The modes and backends of one setting and shape are timed in paired
# rounds (attention/rank.py).


rule attention_measure:
    output:
        update(str(RESULTS / "{dataset}" / layout.ATTENTION_RAW)),
    log:
        RESULTS / "{dataset}" / "logs" / "attention.log",
    wildcard_constraints:
        dataset=measuring("attention"),
    conda:
        CONDA_ENV
    resources:
        gpu=GPU_JOB,
    params:
        config=measure_config("attention"),
        kernels=lambda wc: kernel_stamp("attention"),
    shell:
        f"{MEASURE} attention --out {{output:q}} {MEASURE_ARGS}"


rule attention_simulate:
    input:
        profile=simulated_profile,
        stamp=lambda wc: config_stamp(wc.dataset, "attention"),
    output:
        RESULTS / "{dataset}" / layout.ATTENTION_RAW,
    log:
        RESULTS / "{dataset}" / "logs" / "attention.log",
    wildcard_constraints:
        dataset=r"sim-[A-Za-z0-9._-]+",
    conda:
        CONDA_ENV
    params:
        experiment="attention",
    script:
        "../scripts/simulate.py"
