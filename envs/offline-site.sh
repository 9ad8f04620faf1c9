#!/usr/bin/env bash
# The optional backends of a full reference run, on a GPU machine that reaches no package
# registry: what was carried there, a part per call (a device call carries at most 64 MiB
# with the working tree), collected out of the repository as it arrives, then installed
# into one site directory with one file of exports.
#
#   envs/offline-site.sh collect PATH...   copy carried files or folders into CARRIED
#   envs/offline-site.sh install [SITE]    install everything CARRIED holds into SITE
#                                          (default /tmp/xstage-site), write SITE/env.sh
#   . SITE/env.sh && python3 -m snakemake ... --scheduler greedy
#
# CARRIED: $XSTAGE_CARRIED, default /root/xstage-carried (outside the repository: each
# call replaces the paths it carries, while files outside stay as long as the machine is
# warm, 30 s after a call). What install takes from it, by name, each where present:
#   snakemake/*.whl, fa3/*.whl, fa4/*.whl   wheel groups (../shared/device/wheels.sh makes
#                                           them): each group installed by ONE pip call
#   fa4-lib/part.* and fa4-lib/wheel-name   the CUTLASS DSL compiler wheel in parts,
#                                           joined and installed with fa4/
#   flashinfer-site.tar.xz[.part.*]         envs/flashinfer-site.sh's site (SPLIT=... parts)
#   deepgemm-src.tar.gz                     envs/deepgemm-source.sh's source, built here by
#                                           envs/deepgemm-sm90.sh (CXX=/usr/bin/g++-13 on
#                                           the H200 image; a minute or two)
# What is absent is left out and said; the run records such a backend `unsupported`.
# Nothing is downloaded. Uses $PYTHON -m pip (default python3: the image's `pip` is not its
# python3's).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
carried=${XSTAGE_CARRIED:-/root/xstage-carried}

fail() { echo "offline-site: $*" >&2; exit 1; }

collect() {
    [ $# -ge 1 ] || fail "collect: name at least one carried path"
    for path in "$@"; do
        [ -e "$path" ] || fail "collect: $path was not carried (is it in the call's carry?)"
    done
    mkdir -p "$carried"
    for path in "$@"; do
        cp -r "$path" "$carried/"
        echo "collected $path into $carried"
    done
}

pip_group() {  # pip_group TARGET WHEEL...: a group in one pip call, into a folder of its own
    # (a second --target install into one folder skips or replaces what the first put there)
    "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$1" "${@:2}"
}

install() {
    local site=${1:-/tmp/xstage-site} fi_site=""
    path_entries=()
    [ -n "$(ls -A "$carried" 2> /dev/null)" ] ||
        fail "install: nothing collected in $carried (run collect first)"
    mkdir -p "$site"
    for group in snakemake fa3; do
        if compgen -G "$carried/$group/*.whl" > /dev/null; then
            pip_group "$site/$group" "$carried/$group"/*.whl
            path_entries+=("$site/$group")
            echo "installed $group"
        else
            echo "not carried: $group"
        fi
    done
    if compgen -G "$carried/fa4/*.whl" > /dev/null; then
        local wheels=("$carried/fa4"/*.whl)
        if [ -f "$carried/fa4-lib/wheel-name" ]; then
            local joined
            joined="$site/$(cat "$carried/fa4-lib/wheel-name")"
            cat "$carried/fa4-lib"/part.* > "$joined"
            wheels+=("$joined")
        else
            echo "not carried: fa4-lib (the CUTLASS DSL compiler): FA4 will not import"
        fi
        pip_group "$site/fa4" "${wheels[@]}"
        # The CUTLASS DSL is found through a .pth file, which a --target install does not read.
        path_entries+=("$site/fa4" "$site/fa4/nvidia_cutlass_dsl/dsl_packages")
        echo "installed fa4"
    else
        echo "not carried: fa4"
    fi
    local packed="$carried/flashinfer-site.tar.xz"
    if compgen -G "$packed.part.*" > /dev/null || [ -f "$packed" ]; then
        fi_site="$site/flashinfer"
        mkdir -p "$fi_site"
        if compgen -G "$packed.part.*" > /dev/null; then
            cat "$packed".part.* | tar -C "$fi_site" -xJf -
        else
            tar -C "$fi_site" -xJf "$packed"
        fi
        echo "unpacked flashinfer-site"
    else
        echo "not carried: flashinfer-site"
    fi
    local dg_site=""
    if [ -f "$carried/deepgemm-src.tar.gz" ]; then
        dg_site="$site/deepgemm"
        PYTHON=${PYTHON:-python3} bash "$here/deepgemm-sm90.sh" "$carried/deepgemm-src.tar.gz" "$dg_site"
        echo "built deepgemm"
    else
        echo "not carried: deepgemm-src"
    fi
    write_env "$site" "$fi_site" "$dg_site" "${path_entries[@]+"${path_entries[@]}"}"
    echo "now: . $site/env.sh"
}

write_env() {  # write_env SITE FLASHINFER_SITE DEEPGEMM_SITE PATH_ENTRY...
    local site=$1 fi_site=$2 dg_site=$3 joined
    shift 3
    joined=$(IFS=:; echo "$*")
    {
        echo "# written by envs/offline-site.sh install: the backends carried here"
        echo "export PYTHONPATH=$joined\${PYTHONPATH:+:\$PYTHONPATH}"
        if [ -n "$fi_site" ]; then
            echo "export XSTAGE_FLASHINFER_SITE=$fi_site:$fi_site/nvidia_cutlass_dsl/dsl_packages"
        fi
        if [ -n "$dg_site" ]; then
            echo "export XSTAGE_DEEPGEMM_SITE=$dg_site"
        fi
    } > "$site/env.sh"
}

case "${1:-}" in
    collect) shift; collect "$@" ;;
    install) shift; install "$@" ;;
    *) fail "usage: $0 collect PATH... | install [SITE]" ;;
esac
