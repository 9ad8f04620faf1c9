#!/usr/bin/env bash
# The kernel options staged for the next GPU session, timed in one command: each a paired
# A/B of kernel_ab (off against on, every shape, balanced, 1024/4096/16384 tokens), and a
# pipeline run of a kernels/ab config through Snakemake where the question needs the grid.
#
#     OUT=<folder> bash kernels/ab/staged.sh [STEP...]   (repository root, PYTHONPATH=src:
#         kernels, snakemake installed: DEVICE.md says how; STEP: a step's name, as below)
#
# One JSON per A/B into $OUT, and its one-line summary here. A turn or barrier that never
# comes hangs the kernel rather than failing it, and a hang must not eat the session's device
# time: kernel_ab writes a point down as hung and exits once a check or a timing has not
# returned in --step-timeout seconds, and the shell's timeout kills whatever outlives that.
# An option that wins gets set True in megamoe_ws.py and a row in this folder's README; one
# that loses is taken out.
set -uo pipefail
out=${OUT:?set OUT to the folder for the records}
mkdir -p "$out"
failed=0

only=" $* "  # step names given on the command line: those steps alone (a session's call is short)

run() {  # run NAME COMMAND...: one record, its output kept in $out/NAME.log
    local name=$1 rc
    shift
    if [ "$only" != "  " ] && [[ $only != *" $name "* ]]; then return 0; fi
    printf '\n=== %s (%s)\n' "$name" "$(date +%T)"
    timeout -s KILL "${STAGED_TIMEOUT:-420}" "$@" > "$out/$name.log" 2>&1
    rc=$?
    tail -n 5 "$out/$name.log"
    if [ $rc -ne 0 ]; then
        echo "$name: exit $rc$([ $rc -eq 137 ] && echo ' (killed at the timeout: a hang?)')"
        failed=1
    fi
}

ab() {  # ab NAME PRECISION OPTION=0,V.. [device [SCHEDULE]]: device, decided on the GPU;
        # SCHEDULE expert_wave (default) or interleaved (at the config's lead, 1024);
        # SHAPES=a,b: those shapes only (default: the config's)
    run "$1" python3 -m xstage_bench.megamoe.kernel_ab --config config/reference-h200x1.yaml \
        --dataset ab --routings balanced --tokens 16384,4096,1024 --min-reps 5 \
        --precisions "$2" --option "$3" --decided-on "${4:-list}" ${SHAPES:+--shapes "$SHAPES"} \
        --schedule "${5:-expert_wave}" --step-timeout 120 --out "$out/$1.json"
}

pipeline() {  # pipeline NAME CONFIG: CONFIG's MegaMoE table through Snakemake, its raw file kept
    local dataset
    dataset=$(sed -n 's/^  measured: //p' "$2")
    run "$1" python3 -m snakemake "results/$dataset/tables/tab-megamoe.md" --cores all \
        --scheduler greedy --configfile "$2"
    cp "results/$dataset/raw/megamoe.json" "$out/$1.json" 2>/dev/null
    grep -A12 -i "oracle" "results/$dataset/tables/tab-megamoe.md" 2>/dev/null | head -n 16
}

# The device-decided schedules against their lists, at host share 0.25 and at 0 (no remote
# store: what deciding on the GPU costs by itself). Oracle over device kernel time at
# f = 0.25, expert waves found from the layout alone: one H100 (aeb110f) 0.990 and
# interleaved 0.976; one H200 (71cf5f4) 0.988 and 0.970, interleaved then decided in units.
# Issue 53 asks 0.98. Interleaved counted (since 2026-12-08, 0.990-0.996 of the units' time
# at f = 0) is not yet measured here: the next GPU session's first step.
pipeline device-rule-84 kernels/ab/device-rule-84.yaml
pipeline device-rule-84-f0 kernels/ab/device-rule-84-f0.yaml
# Where interleaved's device claims lose time: the host list, the device's order, and that
# order replayed as a list, paired, then one traced run of the device and the replay each
# (claim gaps). At 71cf5f4 on one H200, replay over device 0.945, list over replay 1.000.
run device-order-replay python3 kernels/ab/device_order_replay.py --config config/reference-h200x1.yaml \
    --dataset ab --routings balanced --precisions w4a8,w8a8 --shapes qwen3.5-397b-a17b,hy3-295b-a21b \
    --tokens 1024,4096,16384 --trace --out "$out/device-order-replay.json"
exit $failed
