#!/usr/bin/env bash
# FlashInfer's SM90 FP8 MegaMoE (the MegaMoE variant `flashinfer`) for a GPU machine with no
# package registry: one site directory, packed, holding what its worker processes import.
#
#   envs/flashinfer-site.sh [OUT]        default OUT: .carry/flashinfer-site.tar.xz
#   SPLIT=46000000 envs/flashinfer-site.sh   also cut OUT into OUT.part.aa, .ab, ... of that size
#
# Then on the GPU machine (Python 3.12, torch 2.11 / CUDA 13 as seen on the H200s):
#   mkdir -p SITE && cat OUT.part.* | tar -C SITE -xJf -      (or tar -C SITE -xJf OUT)
#   export XSTAGE_FLASHINFER_SITE=SITE:SITE/nvidia_cutlass_dsl/dsl_packages
#
# Runs on any x86-64 Linux with pip, whatever its own Python: wheels are unpacked, not
# installed (pip refuses another Python's wheels). The SM90 FP8 kernel is written in the
# CuTe DSL and compiled from Python at its first call, so the CUDA/C++ sources FlashInfer
# ships for its other kernels' JIT builds (about 570 MB) are left out: 92 MB packed instead
# of 0.8 GB unpacked. A device call carries at most 64 MiB with the working tree; SPLIT
# lets the parts travel in consecutive calls (the machine keeps files outside the
# repository while it stays warm).
set -euo pipefail
out=${1:-.carry/flashinfer-site.tar.xz}
py_version=${PY_VERSION:-3.12}
tag=cp${py_version/./}
# Versions seen working on one and on two H200s (2026-11-30, 2026-12-02). nvidia-nvshmem,
# cuda-bindings and cuda-pathfinder come with the GPU machine's torch image.
wheels=(flashinfer-python==0.7.4 nvshmem4py-cu13==0.4.1 cuda-core==1.2.2
        nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1
        "apache-tvm-ffi<0.2" torch-c-dlpack-ext)
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py_version" \
    --implementation cp --abi "$tag" --abi abi3 --abi none "${platforms[@]}" -d "$work/wheels" "${wheels[@]}"
mkdir "$work/site"
for wheel in "$work"/wheels/*.whl; do
    python3 -m zipfile -e "$wheel" "$work/site"
done
# the C++/CUDA sources of FlashInfer's JIT-built kernels: not what the CuTe DSL path runs
find "$work/site/flashinfer" -type f \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' \
    -o -name '*.hpp' -o -name '*.inl' -o -name '*.cpp' -o -name '*.cc' -o -name '*.c' \
    -o -name '*.inc' -o -name '*.ptx' \) -delete
find "$work/site/flashinfer" -type d -empty -delete

mkdir -p "$(dirname "$out")"
tar -C "$work/site" -cf - . | xz -T0 -6 > "$out.tmp"
mv "$out.tmp" "$out"
if [ -n "${SPLIT:-}" ]; then
    rm -f "$out".part.*
    split -b "$SPLIT" "$out" "$out.part."
fi
ls -l "$out"*
