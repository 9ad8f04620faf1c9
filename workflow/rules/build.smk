# Stage 1: compile the CUDA kernels in kernels/ with nvcc for sm_90 into cubins.
# Triton kernels compile on first use on the GPU machine.

rule build_cubin:
    input:
        "kernels/microbench/{name}.cu",
    output:
        "build/kernels/sm_90/{name}.cubin",
    conda:
        CONDA_ENV
    log:
        "build/kernels/sm_90/{name}.log",
    shell:
        "nvcc -arch=sm_90 -cubin -O3 -lineinfo -Xptxas -v -o {output} {input} > {log} 2>&1"
