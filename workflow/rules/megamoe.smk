# Stage 3a: the MegaMoE sweep (expert-wave vs interleaved schedules of the fused kernel),
# measured on this machine's GPUs or simulated; the traced runs feed the mechanism figures.
# A lead_rows of 'auto' gives the measuring jobs the dataset's fitted model (megamoe_model).
# Their `kernels` param names our kernel's build: a change reruns them (measure.kernel_stamp).


rule megamoe_measure:
    input:
        model=megamoe_model("megamoe"),
    output:
        sweep=update(str(RESULTS / "{dataset}" / layout.MEGAMOE_RAW)),
        trace=update(str(RESULTS / "{dataset}" / layout.MEGAMOE_TRACE_RAW)),
    log:
        RESULTS / "{dataset}" / "logs" / "megamoe.log",
    wildcard_constraints:
        dataset=measuring("megamoe"),
    conda:
        CONDA_ENV
    resources:
        gpu=GPU_JOB,
    params:
        config=measure_config("megamoe"),
        kernels=lambda wc: kernel_stamp("megamoe"),
        model=megamoe_model_arg("megamoe"),
    shell:
        f"{MEASURE} megamoe --out {{output.sweep:q}} --trace-out {{output.trace:q}} "
        f"{{params.model}} {MEASURE_ARGS}"


# Opt-in (measured_experiments: megamoe_per_gpu): our kernel's schedules once more, with one
# process per GPU (torch.distributed), for tab-process-model.
rule megamoe_measure_per_gpu:
    input:
        model=megamoe_model("megamoe_per_gpu"),
    output:
        update(str(RESULTS / "{dataset}" / layout.MEGAMOE_PER_GPU_RAW)),
    log:
        RESULTS / "{dataset}" / "logs" / "megamoe_per_gpu.log",
    wildcard_constraints:
        dataset=measuring("megamoe_per_gpu"),
    conda:
        CONDA_ENV
    resources:
        gpu=GPU_JOB,
    params:
        config=measure_config("megamoe_per_gpu"),
        kernels=lambda wc: kernel_stamp("megamoe_per_gpu"),
        model=megamoe_model_arg("megamoe_per_gpu"),
    shell:
        f"{MEASURE} megamoe_per_gpu --out {{output:q}} {{params.model}} {MEASURE_ARGS}"


# Opt-in (measured_experiments: megamoe_emulated): the kernel's tile lists, counters and
# peer stores with each tile's MMA replaced by a wait for its FLOPs at an emulated compute
# rate, over rates x remote fractions (megamoe.emulated), for fig-megamoe-crossover.
rule megamoe_measure_emulated:
    input:
        model=megamoe_model("megamoe_emulated"),
    output:
        update(str(RESULTS / "{dataset}" / layout.MEGAMOE_EMULATED_RAW)),
    log:
        RESULTS / "{dataset}" / "logs" / "megamoe_emulated.log",
    wildcard_constraints:
        dataset=measuring("megamoe_emulated"),
    conda:
        CONDA_ENV
    resources:
        gpu=GPU_JOB,
    params:
        config=measure_config("megamoe_emulated"),
        model=megamoe_model_arg("megamoe_emulated"),
    shell:
        f"{MEASURE} megamoe_emulated --out {{output:q}} {{params.model}} {MEASURE_ARGS}"


rule megamoe_simulate:
    input:
        profile=simulated_profile,
        stamp=lambda wc: config_stamp(wc.dataset, "megamoe"),
    output:
        RESULTS / "{dataset}" / "raw" / "{experiment}.json",
    log:
        RESULTS / "{dataset}" / "logs" / "{experiment}.log",
    wildcard_constraints:
        dataset=r"sim-[A-Za-z0-9._-]+",
        experiment="megamoe|megamoe_trace",
    conda:
        CONDA_ENV
    script:
        "../scripts/simulate.py"
