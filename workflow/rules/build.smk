# Stage 1: compile the CUDA kernels in kernels/ with nvcc: sm_90 code and its PTX, which the
# driver compiles for a later GPU (B200) when it loads the image (build.py).
# Triton kernels compile on first use on the GPU machine.
# The command is xstage_bench.microbench.build's, the one nvcc build definition.

import shlex

from xstage_bench.microbench.build import nvcc_command


rule build_cubin:
    input:
        "kernels/microbench/{name}.cu",
    output:
        "build/kernels/sm_90/{name}.cubin",
    log:
        "build/kernels/sm_90/{name}.log",
    conda:
        CONDA_ENV
    params:
        nvcc=lambda wildcards, input, output: shlex.join(nvcc_command(input[0], output[0])),
    shell:
        "{params.nvcc} > {log:q} 2>&1"
