# Stage 4: fit the Burst-Gap model (T0, R, Q) to a dataset's microbenchmarks and validate
# it on held-out points; also writes a refit hardware profile for the simulator. Outputs are
# update(), as the figures' are: a failed refit leaves a committed model in place.


rule fit_burst_gap:
    input:
        raw=model_inputs,
        checked=model_checked,
    output:
        model=update(RESULTS / "{dataset}" / layout.MODEL_JSON),
        profile=update(RESULTS / "{dataset}" / layout.MODEL_PROFILE),
    log:
        RESULTS / "{dataset}" / "logs" / "fit_burst_gap.log",
    conda:
        CONDA_ENV
    params:
        base_profile=lambda wc: SIMULATED.get(wc.dataset, "config/hardware/h200.yaml"),
    script:
        "../scripts/fit_model.py"


# The fused kernel's arms played through the fitted drain (issue 52, item 4): minutes of CPU
# on a reference, so made once here and read by fig- and tab-megamoe-playback.


rule play_megamoe:
    input:
        playback_inputs,
    output:
        playback=update(RESULTS / "{dataset}" / layout.MEGAMOE_PLAYBACK),
    log:
        RESULTS / "{dataset}" / "logs" / "play_megamoe.log",
    conda:
        CONDA_ENV
    script:
        "../scripts/play_megamoe.py"
