# Stage 3a: the MegaMoE sweep (expert-wave vs interleaved). The fused GPU kernel is
# issue 4's; today this stage is simulated, and committed references are rendered.


rule megamoe_simulate:
    input:
        profile=lambda wc: SIMULATED[wc.dataset],
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
