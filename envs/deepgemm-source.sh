#!/usr/bin/env bash
# Pack DeepGEMM's SM90 FP8 MegaMoE source for a GPU machine that reaches no network:
# the fork's tree at one commit plus the headers of its two submodules, into one tarball
# that envs/deepgemm-sm90.sh builds from.
#
#   envs/deepgemm-source.sh DEEPGEMM_GIT_DIR [REV] [OUT.tar.gz]
#
# DEEPGEMM_GIT_DIR  a git directory (bare or not) holding the fork AichenF/DeepGEMM, e.g.
#                   the mirror /work/.mirror/AichenF+DeepGEMM/repo (the `fetch` tool's copy
#                   of github:AichenF/DeepGEMM), or a clone's .git
# REV               default megamoe_sm90_fp8_dev (bc4f33a, "Add SM90 FP8 MegaMoE support")
# OUT.tar.gz        default .carry/deepgemm-src.tar.gz (.carry/ is git-ignored)
#
# Submodules (their gitlink commits are read from REV's tree, never guessed):
#   third-party/cutlass  NVIDIA/cutlass: only include/cute and include/cutlass (+ LICENSE.txt);
#                        the host extension and every JIT-compiled kernel include them
#   third-party/fmt      fmtlib/fmt: only include/fmt (+ LICENSE); header-only, host side
# Their git directories: $CUTLASS_GIT_DIR and $FMT_GIT_DIR, by default the mirrors beside
# DEEPGEMM_GIT_DIR (/work/.mirror/NVIDIA+cutlass/repo, /work/.mirror/fmtlib+fmt/repo).
# Left out of the fork's tree: .github/ and the tests other than the two SM90 MegaMoE ones
# (tests/test_mega_moe_sm90.py, tests/bench_mega_moe_sm90.py). The tarball's top folder is
# deepgemm-src/; deepgemm-src/XSTAGE_SOURCE.txt names every commit it was cut from.
# Needs git, tar and gzip; reads nothing over the network.
set -uo pipefail

fail() { echo "deepgemm-source: step '$1' failed: $2" >&2; exit 1; }

[ $# -ge 1 ] && [ $# -le 3 ] || fail "arguments" "usage: $0 DEEPGEMM_GIT_DIR [REV] [OUT.tar.gz]"
dg_git=$1
rev=${2:-megamoe_sm90_fp8_dev}
repo_root=$(cd "$(dirname "$0")/.." && pwd)
out=${3:-$repo_root/.carry/deepgemm-src.tar.gz}
mirrors=$(dirname "$(dirname "$dg_git")")
cutlass_git=${CUTLASS_GIT_DIR:-$mirrors/NVIDIA+cutlass/repo}
fmt_git=${FMT_GIT_DIR:-$mirrors/fmtlib+fmt/repo}

for tool in git tar gzip; do
    command -v "$tool" >/dev/null || fail "tools" "$tool is not on PATH"
done
git --git-dir="$dg_git" rev-parse --git-dir >/dev/null 2>&1 ||
    fail "DeepGEMM repository" "$dg_git is not a git directory"
commit=$(git --git-dir="$dg_git" rev-parse --verify -q "$rev^{commit}") ||
    fail "DeepGEMM revision" "$rev is not a commit of $dg_git (git --git-dir=$dg_git branch -a lists its branches)"
for f in csrc/apis/sm90_mega.hpp csrc/jit_kernels/heuristics/sm90_mega_moe.hpp \
    deep_gemm/include/deep_gemm/impls/sm90_fp8_mega_moe.cuh setup.py; do
    git --git-dir="$dg_git" cat-file -e "$commit:$f" 2>/dev/null ||
        fail "DeepGEMM revision" "$rev ($commit) has no $f: not an SM90 MegaMoE tree"
done

# gitlink commit of a submodule path in REV's tree
submodule_commit() {
    local line
    line=$(git --git-dir="$dg_git" ls-tree "$commit" "$1") || return 1
    set -- $line
    [ "${2:-}" = commit ] || return 1
    echo "$3"
}
cutlass_commit=$(submodule_commit third-party/cutlass) ||
    fail "submodule commits" "$rev has no gitlink third-party/cutlass"
fmt_commit=$(submodule_commit third-party/fmt) ||
    fail "submodule commits" "$rev has no gitlink third-party/fmt"

check_sub() {  # name git-dir commit
    git --git-dir="$2" rev-parse --git-dir >/dev/null 2>&1 ||
        fail "$1 repository" "$2 is not a git directory (fetch github:$4, or set $5)"
    git --git-dir="$2" cat-file -e "$3^{commit}" 2>/dev/null ||
        fail "$1 commit" "$2 lacks commit $3, the one $rev pins (a newer snapshot of github:$4 is needed)"
}
check_sub cutlass "$cutlass_git" "$cutlass_commit" NVIDIA/cutlass CUTLASS_GIT_DIR
check_sub fmt "$fmt_git" "$fmt_commit" fmtlib/fmt FMT_GIT_DIR

stage=$(mktemp -d) || fail "staging" "mktemp -d failed"
trap 'rm -rf "$stage"' EXIT
top=$stage/deepgemm-src

# archive DIR COMMIT PREFIX PATHSPEC...: export paths of COMMIT under $top/PREFIX. A
# mirror may lack the blobs of large files (CUTLASS's media/ images): git archive then
# prints "invalid object" for them even when they lie outside the pathspec, and exits 0.
# So its messages are shown only when it fails, and the submodule exports are counted
# against their trees below (a blob missing inside them fails the step).
archive() {
    local git_dir=$1 rev_=$2 prefix=$3
    shift 3
    mkdir -p "$top/$prefix" &&
        git --git-dir="$git_dir" archive --format=tar "$rev_" -- "$@" 2>"$stage/archive.err" |
        tar -x -C "$top/$prefix" || { cat "$stage/archive.err" >&2; return 1; }
}
# exported DIR COMMIT PREFIX PATH...: every file of PATH... in COMMIT is under $top/PREFIX
exported() {
    local git_dir=$1 rev_=$2 prefix=$3 want got
    shift 3
    want=$(git --git-dir="$git_dir" ls-tree -r --name-only "$rev_" -- "$@" | wc -l)
    got=$(cd "$top/$prefix" && find "$@" -type f | wc -l)
    [ "$want" -gt 0 ] && [ "$want" -eq "$got" ] ||
        fail "check export" "$prefix: $got of $want files of $* exported (blobs missing from $git_dir?)"
}
archive "$dg_git" "$commit" "" . ':(exclude).github' ':(exclude)tests' ||
    fail "export DeepGEMM tree" "git archive of $commit failed"
archive "$dg_git" "$commit" "" tests/test_mega_moe_sm90.py tests/bench_mega_moe_sm90.py ||
    fail "export DeepGEMM tree" "git archive of its SM90 MegaMoE tests failed"
archive "$cutlass_git" "$cutlass_commit" third-party/cutlass include/cute include/cutlass LICENSE.txt ||
    fail "export CUTLASS headers" "git archive of $cutlass_commit include/cute include/cutlass failed"
archive "$fmt_git" "$fmt_commit" third-party/fmt include/fmt LICENSE ||
    fail "export fmt headers" "git archive of $fmt_commit include/fmt failed"
exported "$cutlass_git" "$cutlass_commit" third-party/cutlass include/cute include/cutlass LICENSE.txt
exported "$fmt_git" "$fmt_commit" third-party/fmt include/fmt LICENSE
for f in third-party/cutlass/include/cute/arch/mma_sm100_desc.hpp \
    third-party/cutlass/include/cutlass/arch/barrier.h third-party/fmt/include/fmt/format.h; do
    [ -f "$top/$f" ] || fail "check export" "$f is missing from the staged tree"
done

{
    echo "DeepGEMM SM90 FP8 MegaMoE source, packed by envs/deepgemm-source.sh"
    echo "deepgemm $rev $commit $(git --git-dir="$dg_git" log -1 --format='%cI %s' "$commit")"
    echo "cutlass $cutlass_commit $(git --git-dir="$cutlass_git" log -1 --format='%cI %s' "$cutlass_commit") (include/cute, include/cutlass)"
    echo "fmt $fmt_commit $(git --git-dir="$fmt_git" log -1 --format='%cI %s' "$fmt_commit") (include/fmt)"
    echo "left out: .github/, tests/ except test_mega_moe_sm90.py and bench_mega_moe_sm90.py"
} >"$top/XSTAGE_SOURCE.txt" || fail "manifest" "could not write XSTAGE_SOURCE.txt"

mkdir -p "$(dirname "$out")" || fail "output" "cannot create $(dirname "$out")"
tar -C "$stage" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - deepgemm-src |
    gzip -9n >"$out.tmp" || fail "write tarball" "tar | gzip into $out.tmp failed"
mv "$out.tmp" "$out" || fail "write tarball" "cannot move $out.tmp to $out"
size=$(wc -c <"$out")
[ "$size" -lt $((20 * 1024 * 1024)) ] || fail "size" "$out is $size bytes, over the 20 MiB bound"
echo "wrote $out ($size bytes, $(tar -tzf "$out" | grep -vc '/$') files)"
cat "$top/XSTAGE_SOURCE.txt"
