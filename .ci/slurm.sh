#!/usr/bin/env bash
# CI: the smoke DAG through workflow/profiles/slurm on a real single-node Slurm (Debian's munge
# and Slurm 22.05, no accounting database, so no sacct), and its outputs against a local run's.
#   .ci/slurm.sh [LOCAL]   LOCAL: a tree where the smoke config already ran locally (CI passes
#                          its checkout after the smoke step); without it, a local run first.
# Run as root on a throwaway machine: it installs packages, writes /etc/slurm/slurm.conf (the
# only place the jobs' inner srun looks: the plugin drops SLURM_CONF from their environment),
# starts munged, slurmctld and slurmd, and on exit stops them and removes that file.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SNAKEMAKE=$REPO/.venv/bin/snakemake
LOCAL=${1:+$(realpath "$1")}
CONF=/etc/slurm/slurm.conf
# What the README has users export. Without an accounting database any account is accepted;
# the partition is not the default one, so every job in it shows that it got through.
ACCOUNT=xstage-ci
PARTITION=xstage

die() { echo "slurm.sh: $*" >&2; exit 1; }
[[ $EUID -eq 0 ]] || die "run as root: it installs Slurm and starts its daemons"
[[ -x $SNAKEMAKE ]] || die "no $SNAKEMAKE: run the install step of .ci/run first"
[[ ! -e $CONF ]] || die "$CONF exists: this script only starts a Slurm of its own"
[[ -z $LOCAL || -d $LOCAL/results ]] || die "no results/ in $LOCAL"

if ! for tool in munged slurmctld slurmd sbatch; do command -v $tool; done >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq </dev/null
    apt-get install -y -qq --no-install-recommends munge slurmctld slurmd slurm-client \
        </dev/null >/dev/null
fi

WORK=$(mktemp -d /tmp/xstage-slurm.XXXXXX)
chmod 755 "$WORK" # munged wants every directory above its socket searchable by all

cleanup() {
    local rc=$?
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
    local daemon pid
    for daemon in slurmd slurmctld munged; do
        pid=$(cat "$WORK/$daemon.pid" 2>/dev/null) && kill "$pid" 2>/dev/null || continue
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null && sleep 0.5 || break; done
    done
    rm -f "$CONF"
    if ((rc)); then
        for log in slurmctld.log slurmd.log local.log slurm.log; do
            [[ -s $WORK/$log ]] && { echo "--- tail of $log"; tail -n 40 "$WORK/$log"; }
        done
        echo "slurm.sh: failed; everything is kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT

# munge with its own key and socket, so a munged already on the machine is left alone.
dd if=/dev/urandom of="$WORK/munge.key" bs=1024 count=1 status=none
chmod 400 "$WORK/munge.key"
munged --key-file="$WORK/munge.key" --socket="$WORK/munge.socket" \
    --pid-file="$WORK/munged.pid" --log-file="$WORK/munged.log" --seed-file="$WORK/munged.seed"

# One node: this host as slurmd -C sees it (name, cores, memory). The profile asks 2 CPUs and
# 8000 MB per job; a CI job mostly waits on Python start-up, so four may share a core.
# MinJobAge keeps every finished job visible to squeue/scontrol until the checks below.
NODE=$(slurmd -C | head -n 1)
HOST=$(sed -E 's/^NodeName=([^ ]+).*/\1/' <<<"$NODE")
CPUS=$(sed -E 's/.* CPUs=([0-9]+).*/\1/' <<<"$NODE")
MEM=$(sed -E 's/.* RealMemory=([0-9]+).*/\1/' <<<"$NODE")
((CPUS >= 2 && MEM >= 8000)) || die "the profile's jobs need 2 CPUs and 8000 MB; this host: $NODE"
mkdir -p "$(dirname "$CONF")" "$WORK/ctld" "$WORK/spool"
cat >"$CONF" <<EOF
# Written by .ci/slurm.sh for this run only; removed when it ends.
ClusterName=xstage-ci
SlurmctldHost=$HOST(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=$WORK/munge.socket
CredType=cred/munge
SlurmUser=root
StateSaveLocation=$WORK/ctld
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
ReturnToService=2
$NODE NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=main Nodes=$HOST Default=YES State=UP
PartitionName=$PARTITION Nodes=$HOST OverSubscribe=FORCE:4 State=UP
EOF
slurmctld
slurmd
for _ in $(seq 60); do
    [[ $(sinfo -h -p "$PARTITION" -o %T 2>/dev/null) == idle ]] && break
    sleep 0.5
done
[[ $(sinfo -h -p "$PARTITION" -o %T) == idle ]] || die "the node did not come up"
echo "Slurm $(sinfo -V | cut -d' ' -f2) up: $NODE"

# This tree (tracked and untracked files, not ignored ones) in a fresh directory per run.
copy_tree() {
    mkdir -p "$1"
    git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents --no-dereference -t "$1"
}
if [[ -z $LOCAL ]]; then
    LOCAL=$WORK/local
    copy_tree "$LOCAL"
    SECONDS=0
    (cd "$LOCAL" && "$SNAKEMAKE" --cores all --configfile config/smoke.yaml) \
        >"$WORK/local.log" 2>&1
    echo "local run: ${SECONDS} s"
fi
copy_tree "$WORK/slurm"

# The README's command on the smoke config, with a 2 s first status poll (the plugin's 40 s
# default would dominate this tiny DAG). A hung run is killed: Snakemake ignores SIGTERM here.
SECONDS=0
(
    cd "$WORK/slurm"
    export SBATCH_ACCOUNT=$ACCOUNT SBATCH_PARTITION=$PARTITION
    # --quiet host: the default profile hides each job's details, which the checks below read
    timeout -k 15 900 "$SNAKEMAKE" --profile workflow/profiles/slurm \
        --configfile config/smoke.yaml --slurm-init-seconds-before-status-checks 2 --quiet host
) >"$WORK/slurm.log" 2>&1
echo "run through Slurm: ${SECONDS} s"

"$REPO/.venv/bin/python" - "$WORK/slurm" "$LOCAL" "$ACCOUNT" "$PARTITION" <<'EOF'
"""Every non-render job went through Slurm with the profile's resources; outputs match."""
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

slurm_run, local_run = Path(sys.argv[1]), Path(sys.argv[2])
account, partition = sys.argv[3:5]
slurm_log = (slurm_run.parent / "slurm.log").read_text()
assert "Falling back to 'sacct'" not in slurm_log, "the plugin polled sacct"

# Figures, tables and the report ran beside Snakemake (localrules), every other job through Slurm.
remote = Counter(re.findall(r"^rule (\w+):", slurm_log, re.M))
local = Counter(re.findall(r"^localrule (\w+):", slurm_log, re.M))
steps = int(re.search(r"^(\d+) of \1 steps \(100%\) done", slurm_log, re.M).group(1))
assert remote.total() + local.total() == steps, (remote, local, steps)
LOCAL_RULES = ("all", "report_summary", "check_reference")  # and figure_*, table_* (Snakefile)


def is_local(rule):
    return rule.startswith(("figure_", "table_")) or rule in LOCAL_RULES


assert all(is_local(r) for r in local), local
assert remote and not any(is_local(r) for r in remote), remote

ids = re.findall(r"submitted with SLURM jobid (\d+)", slurm_log)
assert len(ids) == remote.total(), (len(ids), remote)
for job in ids:
    info = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True,
                          text=True, check=True).stdout
    fields = dict(kv.split("=", 1) for kv in info.split() if "=" in kv)
    want = {"JobState": "COMPLETED", "Account": account, "Partition": partition,
            "NumCPUs": "2", "MinMemoryNode": "8000M"}
    got = {k: fields.get(k) for k in want}
    assert got == want and fields["TimeLimit"] != "UNLIMITED", (job, got, fields["TimeLimit"])

# Outputs: the same files; tables and models byte for byte, raw results but for their
# environment block (host, times), the playback but for the digests of those; figures and
# the report summary that inlines them only present (fig-ulysses differs from run to run).
# Only the datasets the Slurm run made: the local tree may hold others (CI's dry run of the
# full config stamps the full-size simulated datasets).
DATASETS = sorted(d.name for d in (slurm_run / "results").iterdir() if d.is_dir())


def outputs(root):
    return {p.relative_to(root) for d in DATASETS for p in (root / "results" / d).rglob("*")
            if p.is_file() and "logs" not in p.parts}

made = outputs(local_run)
assert made == outputs(slurm_run), made ^ outputs(slurm_run)
for rel in sorted(made):
    if rel.suffix in (".pdf", ".png", ".html"):  # the report summary inlines the figures
        continue
    x, y = (local_run / rel).read_bytes(), (slurm_run / rel).read_bytes()
    if "raw" in rel.parts and rel.suffix == ".json":
        x, y = ({k: v for k, v in json.loads(d).items() if k != "environment"} for d in (x, y))
    elif rel.name == "megamoe_playback.json":  # made_from: the raw file's sha256, host and all
        x, y = ({k: v for k, v in json.loads(d).items() if k != "made_from"} for d in (x, y))
    assert x == y, f"{rel} differs between the local and the Slurm run"
print(f"{len(ids)} jobs through Slurm, all COMPLETED in account {account}, partition "
      f"{partition}; {local.total()} local; {len(made)} outputs match the local run's")
EOF
