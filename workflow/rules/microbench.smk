# Stage 2: the remote-store microbenchmarks: measured on this machine's GPUs, or simulated
# from a hardware profile. Both write results/<dataset>/raw/microbench/<study>.json.


# A CPU test (measure_device: cpu) has no nvcc to build the cubin: the rule then plans the
# study and records why every point could not be measured.
rule microbench_measure:
    input:
        cubin=[] if CPU_TEST else "build/kernels/sm_90/burst.cubin",
    output:
        update(str(RESULTS / "{dataset}" / layout.microbench_raw("{study}"))),
    log:
        RESULTS / "{dataset}" / "logs" / "microbench-{study}.log",
    wildcard_constraints:
        dataset=measuring("microbench"),
    conda:
        CONDA_ENV
    resources:
        gpu=GPU_JOB,
    params:
        config=measure_config("microbench"),
    shell:
        f"{MEASURE} microbench --study {{wildcards.study}} --out {{output:q}} {MEASURE_ARGS}"
        + ("" if CPU_TEST else " --cubin {input.cubin:q}")


rule microbench_simulate:
    input:
        profile=simulated_profile,
        stamp=lambda wc: config_stamp(wc.dataset, f"microbench-{wc.study}"),
    output:
        RESULTS / "{dataset}" / layout.microbench_raw("{study}"),
    log:
        RESULTS / "{dataset}" / "logs" / "microbench-{study}.log",
    wildcard_constraints:
        dataset=r"sim-[A-Za-z0-9._-]+",
    conda:
        CONDA_ENV
    script:
        "../scripts/simulate.py"
