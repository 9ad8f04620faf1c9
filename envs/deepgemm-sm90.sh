#!/usr/bin/env bash
# Build DeepGEMM's SM90 FP8 MegaMoE host extension from source against the torch that is
# installed here, with no network, and install `deep_gemm` into a site directory of its own
# (the MegaMoE baseline's workers put it first on sys.path: XSTAGE_DEEPGEMM_SITE=SITE).
#
#   envs/deepgemm-sm90.sh SOURCE [SITE] [--smoke] [--pack FILE.tar.gz]
#
# SOURCE  a DeepGEMM source tree (a folder with setup.py and csrc/apis/sm90_mega.hpp), or a
#         tarball of one: .carry/deepgemm-src.tar.gz from envs/deepgemm-source.sh (the fork
#         AichenF/DeepGEMM, branch megamoe_sm90_fp8_dev, bc4f33a, with its submodules'
#         headers). The tree is copied, never built in place.
# SITE    default /tmp/deepgemm-sm90/site; SITE/deep_gemm is replaced
# --smoke also run the fork's own smallest SM90 MegaMoE test on GPU 0 (world size 1; JIT-
#         compiles its two kernels, a minute or two)
# --pack  also write SITE/deep_gemm as FILE.tar.gz (unpack it into a site folder with
#         `tar -xzf FILE.tar.gz -C SITE` on a machine with the same torch, CUDA and python:
#         a later session need not build again)
#
# Needs, all already on the GPU image: python (PYTHON, default `python`) with torch built for
# CUDA (2.11 here), setuptools, wheel and packaging; a g++ that builds torch extensions;
# (CXX; when set, the link uses it too: LDSHARED="$CXX -shared". On the H200 image a build
# without CXX gave a _C.so that did not name libstdc++.so and crashed in std::regex;
# CXX=/usr/bin/g++-13 worked, and a build whose _C.so does not name libstdc++ is refused);
# a CUDA toolkit >= 12.3 (13 here) at CUDA_HOME, or where `nvcc` is on PATH, or
# /usr/local/cuda: its nvcc (the kernels are JIT-compiled with it at run time), headers
# (cuda.h, cuda_runtime.h, nvrtc.h, cublasLt.h, cccl/) and lib64/libcudart.so, libnvrtc.so.
# Third-party headers (the fork's submodules), looked for in this order:
#   CUTLASS/CuTe (include/cute and include/cutlass; the fork pins CUTLASS 4.2.1, f3fde58)
#     1. $DEEPGEMM_CUTLASS_INCLUDE, a folder holding cute/ and cutlass/
#     2. SOURCE's third-party/cutlass/include (the tarball carries it)
#     3. the CUTLASS that an installed flashinfer wheel bundles:
#        <site-packages>/flashinfer/data/cutlass/include (another CUTLASS version: warned)
#   fmt (header-only, host side; >= 11, it includes fmt/base.h)
#     1. $DEEPGEMM_FMT_INCLUDE, a folder holding fmt/
#     2. SOURCE's third-party/fmt/include (the tarball carries it)
# The build runs the fork's setup.py (`build`: build_py copies cute/ and cutlass/ into the
# package, where the run-time JIT looks for them; build_ext compiles csrc/python_api.cpp),
# with DG_FORCE_BUILD=1 so that nothing is downloaded. Work files: $DEEPGEMM_WORK (default
# /tmp/deepgemm-sm90/work; build log build.log there). A failing step says which and why,
# and the script exits non-zero.
set -uo pipefail

step=arguments
fail() { echo "deepgemm-sm90: step '$step' failed: $*" >&2; exit 1; }
log() { echo "deepgemm-sm90: $*"; }

usage="usage: $0 SOURCE [SITE] [--smoke] [--pack FILE.tar.gz]"
smoke=0
pack=
args=()
while [ $# -gt 0 ]; do
    case $1 in
        --smoke) smoke=1 ;;
        --pack) [ $# -ge 2 ] || fail "--pack needs a file ($usage)"; pack=$2; shift ;;
        -*) fail "unknown option $1 ($usage)" ;;
        *) args+=("$1") ;;
    esac
    shift
done
[ ${#args[@]} -ge 1 ] && [ ${#args[@]} -le 2 ] || fail "$usage"
source_arg=${args[0]}
site=${args[1]:-/tmp/deepgemm-sm90/site}
work=${DEEPGEMM_WORK:-/tmp/deepgemm-sm90/work}
py=${PYTHON:-python}
[ -e "$source_arg" ] || fail "SOURCE $source_arg does not exist"
source_arg=$(cd "$(dirname "$source_arg")" && pwd)/$(basename "$source_arg")
mkdir -p "$site" || fail "cannot create SITE $site"
site=$(cd "$site" && pwd)

step=python
command -v "$py" >/dev/null || fail "$py is not on PATH (set PYTHON)"
torch_info=$("$py" -c '
import torch
assert torch.version.cuda, "torch " + torch.__version__ + " is a CPU build"
print("torch", torch.__version__, torch.version.cuda, int(torch.compiled_with_cxx11_abi()))
' 2>&1) || fail "$py cannot import a CUDA build of torch: $(echo "$torch_info" | tail -1)"
read -r _ torch_version torch_cuda torch_abi <<<"$(echo "$torch_info" | grep '^torch ' | tail -1)"
log "python $(command -v "$py"), torch $torch_version (CUDA $torch_cuda, cxx11 abi $torch_abi)"
out=$("$py" -c 'import setuptools, wheel.bdist_wheel, packaging' 2>&1) ||
    fail "setup.py needs setuptools, wheel and packaging: $(echo "$out" | tail -1)"
command -v "${CXX:-g++}" >/dev/null || fail "no C++ compiler (${CXX:-g++}) on PATH"
if [ -n "${CXX:-}" ]; then
    export CC=${CC:-$CXX} LDSHARED=${LDSHARED:-"$CXX -shared"}
fi
log "C++ compiler $(command -v "${CXX:-g++}") ($("${CXX:-g++}" -dumpfullversion 2>/dev/null))"

step="CUDA toolkit"
cuda_home=${CUDA_HOME:-${CUDA_PATH:-}}
if [ -z "$cuda_home" ]; then
    if command -v nvcc >/dev/null; then
        cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
    else
        cuda_home=/usr/local/cuda
    fi
fi
[ -x "$cuda_home/bin/nvcc" ] || fail "no nvcc at $cuda_home/bin/nvcc (set CUDA_HOME)"
nvcc_version=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p')
[ -n "$nvcc_version" ] || fail "$cuda_home/bin/nvcc --version printed no release"
nvcc_major=${nvcc_version%%.*}
nvcc_minor=${nvcc_version#*.}
nvcc_minor=${nvcc_minor%%.*}
[ "$nvcc_major" -gt 12 ] || { [ "$nvcc_major" -eq 12 ] && [ "$nvcc_minor" -ge 3 ]; } ||
    fail "nvcc $nvcc_version: DeepGEMM's SM90 kernels need CUDA >= 12.3"
for h in cuda.h cuda_runtime.h nvrtc.h cublasLt.h; do
    [ -f "$cuda_home/include/$h" ] || fail "$cuda_home/include/$h is missing"
done
[ -d "$cuda_home/include/cccl" ] || [ "$nvcc_major" -lt 13 ] ||
    fail "$cuda_home/include/cccl is missing (CUDA 13 keeps the CCCL headers there)"
for lib in libcudart.so libnvrtc.so; do
    ls "$cuda_home/lib64/$lib"* >/dev/null 2>&1 || fail "$cuda_home/lib64/$lib* is missing"
done
[ "${torch_cuda%%.*}" = "$nvcc_major" ] ||
    log "warning: torch is built for CUDA $torch_cuda, nvcc is $nvcc_version"
log "CUDA $cuda_home, nvcc $nvcc_version"

step="unpack source"
case $(realpath -m "$work") in
    / | "$HOME" | "$(pwd)") fail "DEEPGEMM_WORK=$work would be emptied: name a folder of its own" ;;
esac
rm -rf "$work" && mkdir -p "$work" || fail "cannot create work folder $work"
if [ -d "$source_arg" ]; then
    cp -a "$source_arg" "$work/src" || fail "cannot copy $source_arg to $work/src"
    tree=$work/src
else
    mkdir -p "$work/unpack" && tar -xzf "$source_arg" -C "$work/unpack" ||
        fail "cannot unpack $source_arg (a .tar.gz from envs/deepgemm-source.sh?)"
    setup=$(find "$work/unpack" -maxdepth 2 -name setup.py | head -1)
    [ -n "$setup" ] || fail "$source_arg holds no setup.py in its top two folders"
    tree=$(dirname "$setup")
fi
for f in setup.py csrc/python_api.cpp csrc/apis/sm90_mega.hpp scripts/generate_pyi.py \
    deep_gemm/include/deep_gemm/impls/sm90_fp8_mega_moe.cuh; do
    [ -f "$tree/$f" ] || fail "$tree has no $f: not DeepGEMM's SM90 MegaMoE source"
done
[ -f "$tree/XSTAGE_SOURCE.txt" ] && sed -n 2p "$tree/XSTAGE_SOURCE.txt" | sed 's/^/deepgemm-sm90: source: /'

step="CUTLASS headers"
cutlass_dir=$tree/third-party/cutlass/include
pyfind() {  # print the folder of an installed package without importing it
    "$py" -c 'import importlib.util, os, sys
s = importlib.util.find_spec(sys.argv[1])
print(os.path.dirname(s.origin) if s and s.origin else "")' "$1" 2>/dev/null
}
has_cutlass() { [ -f "$1/cute/arch/mma_sm100_desc.hpp" ] && [ -f "$1/cutlass/arch/barrier.h" ]; }
if [ -n "${DEEPGEMM_CUTLASS_INCLUDE:-}" ]; then
    has_cutlass "$DEEPGEMM_CUTLASS_INCLUDE" ||
        fail "DEEPGEMM_CUTLASS_INCLUDE=$DEEPGEMM_CUTLASS_INCLUDE lacks cute/arch/mma_sm100_desc.hpp or cutlass/arch/barrier.h"
    cutlass_from=$DEEPGEMM_CUTLASS_INCLUDE
elif has_cutlass "$cutlass_dir"; then
    cutlass_from="the source tree"
else
    fi_dir=$(pyfind flashinfer)
    if [ -n "$fi_dir" ] && has_cutlass "$fi_dir/data/cutlass/include"; then
        cutlass_from=$fi_dir/data/cutlass/include
    else
        fail "no CUTLASS: set DEEPGEMM_CUTLASS_INCLUDE to a folder holding cute/ and cutlass/ (CUTLASS 4.2.1 include/), use the tarball of envs/deepgemm-source.sh, or install a flashinfer wheel (flashinfer/data/cutlass/include)"
    fi
fi
if [ "$cutlass_from" != "the source tree" ]; then
    rm -rf "$cutlass_dir" && mkdir -p "$cutlass_dir" &&
        cp -r "$cutlass_from/cute" "$cutlass_from/cutlass" "$cutlass_dir/" ||
        fail "cannot copy CUTLASS headers from $cutlass_from"
fi
cutlass_version=$(sed -n 's/^#define CUTLASS_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' \
    "$cutlass_dir/cutlass/version.h" | paste -sd.)
log "CUTLASS ${cutlass_version:-unknown version} from $cutlass_from"
[ "$cutlass_version" = 4.2.1 ] ||
    log "warning: the fork pins CUTLASS 4.2.1 (f3fde58); $cutlass_version may not compile with it"

step="fmt headers"
fmt_dir=$tree/third-party/fmt/include
has_fmt() { [ -f "$1/fmt/base.h" ] && [ -f "$1/fmt/format.h" ]; }
if [ -n "${DEEPGEMM_FMT_INCLUDE:-}" ]; then
    has_fmt "$DEEPGEMM_FMT_INCLUDE" ||
        fail "DEEPGEMM_FMT_INCLUDE=$DEEPGEMM_FMT_INCLUDE lacks fmt/base.h or fmt/format.h (fmt >= 11)"
    rm -rf "$fmt_dir" && mkdir -p "$fmt_dir" && cp -r "$DEEPGEMM_FMT_INCLUDE/fmt" "$fmt_dir/" ||
        fail "cannot copy fmt headers from $DEEPGEMM_FMT_INCLUDE"
    fmt_from=$DEEPGEMM_FMT_INCLUDE
else
    has_fmt "$fmt_dir" ||
        fail "no fmt headers in $fmt_dir: set DEEPGEMM_FMT_INCLUDE to a folder holding fmt/ (fmt >= 11), or use the tarball of envs/deepgemm-source.sh"
    fmt_from="the source tree"
fi
log "fmt from $fmt_from"

step="build host extension"
log "building (python setup.py build; log $work/build.log) ..."
t0=$(date +%s)
(
    cd "$tree" &&
        CUDA_HOME=$cuda_home DG_FORCE_BUILD=1 DG_USE_LOCAL_VERSION=1 \
            LDFLAGS="${LDFLAGS:-} -Wl,-rpath,$cuda_home/lib64" "$py" setup.py build
) >"$work/build.log" 2>&1 || {
    grep -n -m 20 -i "error" "$work/build.log" >&2
    tail -n 30 "$work/build.log" >&2
    fail "setup.py build exited non-zero (the lines above are from $work/build.log)"
}
built=$(find "$tree/build" -maxdepth 3 -path '*/lib*/deep_gemm' -type d | head -1)
[ -n "$built" ] || fail "setup.py build left no build/lib*/deep_gemm"
ls "$built"/_C*.so >/dev/null 2>&1 || fail "$built has no _C*.so"
# an extension that does not name libstdc++ carries its own C++ runtime beside torch's and
# crashed at the first std::regex or ostream call (seen on the H200 image without CXX)
if command -v readelf >/dev/null; then
    readelf -d "$built"/_C*.so | grep -q 'NEEDED.*libstdc++' ||
        fail "$(basename "$built"/_C*.so) does not link libstdc++.so: build with the system compiler, CXX=/usr/bin/g++-NN"
fi
for d in include/cute include/cutlass include/deep_gemm; do
    [ -d "$built/$d" ] || fail "$built/$d is missing (the run-time JIT includes it)"
done
log "built in $(( $(date +%s) - t0 )) s"

step=install
rm -rf "$site/deep_gemm" && cp -a "$built" "$site/deep_gemm" ||
    fail "cannot copy $built to $site/deep_gemm"
[ -f "$tree/XSTAGE_SOURCE.txt" ] && cp "$tree/XSTAGE_SOURCE.txt" "$site/deep_gemm/"
{
    echo "built by envs/deepgemm-sm90.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) from $source_arg"
    echo "torch $torch_version (CUDA $torch_cuda, cxx11 abi $torch_abi)"
    echo "nvcc $nvcc_version ($cuda_home)"
    echo "cutlass headers ${cutlass_version:-unknown} from $cutlass_from; fmt from $fmt_from"
} >"$site/deep_gemm/XSTAGE_BUILD.txt" || fail "cannot write $site/deep_gemm/XSTAGE_BUILD.txt"

step="import check"
out=$(cd "$work" && CUDA_HOME=$cuda_home PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$py" -c '
import sys, deep_gemm
site = sys.argv[1]
assert deep_gemm.__file__.startswith(site), f"imported {deep_gemm.__file__}, not the build in {site}"
api = ("fp8_mega_moe", "get_symm_buffer_for_sm90_mega_moe", "transform_weights_for_mega_moe_sm90")
missing = [n for n in api if not hasattr(deep_gemm, n)]
assert not missing, f"deep_gemm lacks {missing}"
assert hasattr(deep_gemm._C, "fp8_mega_moe"), "_C was built without fp8_mega_moe (CUDA < 12.1?)"
print(deep_gemm.__version__, deep_gemm.__file__)
' "$site" 2>&1) || fail "import deep_gemm from $site: $(echo "$out" | tail -3)"
log "deep_gemm $(echo "$out" | tail -1)"

if [ "$smoke" = 1 ]; then
    step="smoke test"
    # the fork's test puts its own folder's parent first on sys.path: run a copy of it
    # outside the tree, so that it imports the installed build
    mkdir -p "$work/smoke/tests" && cp "$tree/tests/test_mega_moe_sm90.py" "$work/smoke/tests/" ||
        fail "the source has no tests/test_mega_moe_sm90.py"
    port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    (
        cd "$work/smoke" &&
            NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
                CUDA_HOME=$cuda_home MASTER_PORT=$port DG_JIT_CACHE_DIR=$work/jit-cache \
                PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" \
                timeout 480 "$py" tests/test_mega_moe_sm90.py --num-processes 1 --layers 1
    ) >"$work/smoke.log" 2>&1 || {
        tail -n 30 "$work/smoke.log" >&2
        fail "tests/test_mega_moe_sm90.py --num-processes 1 --layers 1 failed (log $work/smoke.log)"
    }
    grep -q "PASSED all" "$work/smoke.log" ||
        fail "the smoke test printed no 'PASSED all' (log $work/smoke.log): $(tail -n 3 "$work/smoke.log")"
    log "smoke test: $(grep -m1 'L1.smoke' "$work/smoke.log")"
fi

if [ -n "$pack" ]; then
    step=pack
    mkdir -p "$(dirname "$pack")" && tar -C "$site" -czf "$pack" deep_gemm ||
        fail "cannot write $pack"
    log "packed $site/deep_gemm into $pack ($(wc -c <"$pack") bytes)"
fi

echo "deepgemm-sm90: done: export XSTAGE_DEEPGEMM_SITE=$site"
