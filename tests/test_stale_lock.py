"""Snakemake's lock left by a killed run (xstage_bench.run.stale_lock): stale only when no
other Snakemake run is in the directory; a job of a run is no run."""

import os
from pathlib import Path

from xstage_bench.run.stale_lock import other_snakemake_runs

# Above Linux's largest pid (2**22): never this process nor one of its parents.
MAIN, WRAPPER, JOB = 4194401, 4194402, 4194403


def fake_proc(tmp_path: Path, workdir: Path, processes: dict[int, list[str]]) -> Path:
    """A /proc holding `processes` (pid -> argv), each running in `workdir`."""
    proc = tmp_path / "proc"
    for pid, argv in processes.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        os.symlink(workdir, proc / str(pid) / "cwd")
    return proc


def test_a_job_of_a_killed_run_is_not_taken_for_a_run(tmp_path):
    """Audit: after a SIGKILL of the main Snakemake process, a script job still importing
    (not yet registered with orphans.py) has `.snakemake/scripts/...` in its argv and was
    counted as a live run: the rerun stopped at Snakemake's LockException."""
    work = tmp_path / "work"
    work.mkdir()
    script = ".snakemake/scripts/tmpk2j9x.attention_simulate.py"
    jobs = {
        WRAPPER: ["/bin/bash", "-c", f"set -euo pipefail;  /venv/bin/python {script}"],
        JOB: ["/venv/bin/python", str(work / script)],
    }
    assert other_snakemake_runs(work, fake_proc(tmp_path / "orphaned", work, jobs)) == []
    main = {MAIN: ["/venv/bin/python", "/venv/bin/snakemake", "all"], **jobs}
    assert other_snakemake_runs(work, fake_proc(tmp_path / "live", work, main)) == [MAIN]
