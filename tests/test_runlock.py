"""Two harness runs in one directory: the second stops at once, naming the first."""

import fcntl
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import copy_workflow

from xstage_bench.run.runlock import RUN_LOCK, RunLockBusy, hold_run_lock

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def test_a_held_lock_names_its_holder_and_is_released_on_close(tmp_path):
    path = tmp_path / "run.lock"
    first = hold_run_lock(path)
    with pytest.raises(RunLockBusy, match=r"another harness run .*pid \d+"):
        hold_run_lock(path)
    first.close()
    hold_run_lock(path).close()  # free again


@pytest.mark.skipif(not SNAKEMAKE.exists(), reason="snakemake not installed")
def test_a_second_snakemake_run_stops_while_the_first_holds_the_directory(tmp_path):
    copy_workflow(tmp_path)
    lock = tmp_path / RUN_LOCK
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as held:  # stands for a first run in progress
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("pid 4242, started earlier: snakemake --cores all\n")
        held.flush()
        target = "results/sim-b200/raw/attention.json"
        out = subprocess.run(
            [str(SNAKEMAKE), "--cores", "1", target, "--config", "measure=never"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode != 0
        assert "another harness run is using this directory (pid 4242" in out.stderr
        assert not (tmp_path / target).exists()
        dry = subprocess.run(
            [str(SNAKEMAKE), "-n", target, "--config", "measure=never"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert dry.returncode == 0, dry.stderr[-2000:]  # a dry run takes no lock
