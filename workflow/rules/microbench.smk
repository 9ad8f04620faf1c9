# Stage 2: the remote-store microbenchmarks: measured on this machine's GPUs, or simulated
# from a hardware profile. Both write results/<dataset>/raw/microbench/<study>.json.


rule microbench_measure:
    input:
        cubin="build/kernels/sm_90/burst.cubin",
    output:
        RESULTS / "{dataset}" / layout.microbench_raw("{study}"),
    wildcard_constraints:
        dataset=measuring("microbench"),
    params:
        gpu_ids=GPU_IDS,
    resources:
        gpu=GPU_JOB,
    conda:
        CONDA_ENV
    log:
        RESULTS / "{dataset}" / "logs" / "microbench-{study}.log",
    script:
        "../scripts/measure_microbench.py"


rule microbench_simulate:
    input:
        profile=lambda wc: SIMULATED[wc.dataset],
        stamp=lambda wc: config_stamp(wc.dataset, f"microbench-{wc.study}"),
    output:
        RESULTS / "{dataset}" / layout.microbench_raw("{study}"),
    wildcard_constraints:
        dataset=r"sim-[A-Za-z0-9._-]+",
    conda:
        CONDA_ENV
    log:
        RESULTS / "{dataset}" / "logs" / "microbench-{study}.log",
    script:
        "../scripts/simulate.py"
