"""Faults and recovery: the default profile is loaded, one rerun recovers after a kill, and
a failed rerun leaves committed outputs in place."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures import copy_workflow

from xstage_bench.data import layout
from xstage_bench.report import render
from xstage_bench.run.stale_lock import clear_stale_locks, other_snakemake_runs

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
needs_snakemake = pytest.mark.skipif(not SNAKEMAKE.exists(), reason="snakemake is not installed")


def test_the_default_profile_is_loaded_and_sets_cores(monkeypatch):
    from snakemake.cli import parse_args

    monkeypatch.chdir(ROOT)
    _, args = parse_args(["results/sim-h200/figures/fig-drain.pdf"])
    assert args.cores == os.cpu_count()  # cores: all, so one figure needs no --cores
    assert args.rerun_incomplete and args.keep_going
    quiet = {str(q).lower() for q in args.quiet}
    assert "rules" in quiet and not quiet & {"progress", "all"}  # quieter, progress kept


def test_a_lock_is_stale_only_when_no_other_snakemake_runs_here(tmp_path):
    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.output.lock").write_text(str(tmp_path / "results" / "x.json") + "\n")
    # A process whose command line names snakemake, running in this directory.
    live = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "snakemake"], cwd=tmp_path
    )
    try:
        deadline = time.monotonic() + 10
        while live.pid not in other_snakemake_runs(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert live.pid in other_snakemake_runs(tmp_path)
        assert clear_stale_locks(tmp_path) == []
        assert (locks / "0.output.lock").exists()
    finally:
        live.kill()
        live.wait()
    assert clear_stale_locks(tmp_path) == [locks / "0.output.lock"]
    assert not any(locks.iterdir())


@needs_snakemake
def test_one_rerun_of_the_same_command_recovers_after_a_sigkill(tmp_path):
    work = copy_workflow(tmp_path)
    target = "results/sim-h200-smoke/raw/attention.json"
    command = [str(SNAKEMAKE), target, "--configfile", "config/smoke.yaml"]  # no --cores
    first = subprocess.Popen(
        command,
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    locks = work / ".snakemake" / "locks"
    deadline = time.monotonic() + 120
    while not (locks.is_dir() and any(locks.iterdir())) and first.poll() is None:
        assert time.monotonic() < deadline, "snakemake never took its lock"
        time.sleep(0.01)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert any(locks.iterdir()), "the kill came too late to leave a lock"
    again = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "no longer running" in again.stderr
    assert json.loads((work / target).read_text())["records"]


def _nan_sample(path: Path, metric: str) -> None:
    doc = json.loads(path.read_text())
    ok = next(r for r in doc["records"] if r["status"] == "ok")
    ok["samples"][metric][0] = float("nan")
    path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def rendered_reference(tmp_path_factory) -> Path:
    """The workflow with one committed-like reference dataset, SYNTHETIC (tests/fixtures.py),
    with the products the tests look at rendered by the DAG (`c.yaml` simulates nothing).
    Tests copy it."""
    import yaml
    from fixtures import make_dataset

    work = copy_workflow(tmp_path_factory.mktemp("reference"))
    ref = make_dataset(work / "results", "ref-fixture", megamoe=False)
    (ref / layout.MODEL_PROFILE).write_text("name: fixture (fitted)\n")
    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    config["datasets"] = {"measured": "auto", "reference": ["ref-fixture"], "simulated": {}}
    (work / "c.yaml").write_text(yaml.safe_dump(config))
    out = subprocess.run(
        [str(SNAKEMAKE), *RENDERED, "--configfile", "c.yaml"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return work


RENDERED = (
    "results/ref-fixture/figures/fig-ulysses.pdf",
    "results/ref-fixture/tables/tab-ulysses.csv",
)


def reference_workdir(rendered: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(rendered, tmp_path / "work", symlinks=True))


@needs_snakemake
def test_a_failed_rerun_leaves_committed_reference_outputs_in_place(rendered_reference, tmp_path):
    work = reference_workdir(rendered_reference, tmp_path)
    ref = work / "results" / "ref-fixture"
    kept = {
        p: p.read_bytes()
        for p in (
            ref / layout.MODEL_JSON,
            ref / layout.MODEL_PROFILE,
            ref / "figures" / "fig-ulysses.pdf",
            ref / "figures" / "fig-ulysses.png",
            ref / "tables" / "tab-ulysses.csv",
            ref / "tables" / "tab-ulysses.md",
        )
    }
    _nan_sample(ref / layout.ATTENTION_RAW, "sender_us")
    _nan_sample(ref / layout.microbench_raw("drain"), "t_iss_slowest_us")
    targets = [str(p.relative_to(work)) for p in kept if p.suffix in (".json", ".pdf", ".csv")]
    # Named targets, forced, as after a change to the fit or a renderer (a plain run does not
    # remake a committed reference: see the next test).
    force = ["--forcerun", "fit_burst_gap", "figure_fig_ulysses", "table_tab_ulysses"]
    out = subprocess.run(
        [str(SNAKEMAKE), *targets, "--configfile", "c.yaml", *force],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert "NaN or infinity" in out.stdout + out.stderr
    for path, before in kept.items():
        assert path.read_bytes() == before, f"{path.name} was changed by a failed rerun"


def planned_jobs(work: Path) -> tuple[str, str]:
    """A dry run of c.yaml in `work`: its table of planned jobs, and what it printed to
    stderr."""
    out = subprocess.run(
        [str(SNAKEMAKE), "-n", "--configfile", "c.yaml", "--quiet", "host"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split("Job stats:")[1].split("\n\n")[0], out.stderr


@needs_snakemake
def test_a_fresh_checkout_never_remakes_committed_reference_outputs(rendered_reference, tmp_path):
    work = reference_workdir(rendered_reference, tmp_path)
    later = time.time() + 60
    newer = [*(work / "results" / "ref-fixture" / "raw").rglob("*.json")]
    newer += [*(work / "workflow" / "scripts").glob("*.py")]
    for path in newer:
        os.utime(path, (later, later))  # checkout order can make any of them the newest
    shutil.rmtree(work / ".snakemake")  # and a fresh clone has no Snakemake metadata
    planned, _ = planned_jobs(work)
    assert "figure_fig_drain " in planned  # what is missing is made...
    for rule in ("figure_fig_ulysses", "table_tab_ulysses", "fit_burst_gap"):
        assert rule not in planned, planned  # ...and what is there is left alone


@needs_snakemake
def test_a_reference_whose_raw_files_changed_is_checked_and_rendered_again(
    rendered_reference, tmp_path
):
    # A committed reference's inputs count as old (ancient), so a replaced or damaged raw
    # file used to leave its figures and tables as they were, without a word.
    work = reference_workdir(rendered_reference, tmp_path)
    raw = work / "results" / "ref-fixture" / layout.ATTENTION_RAW
    raw.write_text(json.dumps(json.loads(raw.read_text()), indent=2))  # same data, new bytes
    planned, said = planned_jobs(work)
    assert "results/ref-fixture: raw/attention.json changed since its raw files were checked" in (
        said
    )
    for rule in ("check_reference", "figure_fig_ulysses", "table_tab_ulysses"):
        assert rule in planned, planned
    assert "fit_burst_gap" not in planned, planned  # its microbenchmarks did not change


def snakemake_in(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SNAKEMAKE), *args, "--configfile", "c.yaml"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )


@needs_snakemake
def test_a_refused_raw_file_is_checked_again_by_every_run_that_reads_it(
    rendered_reference, tmp_path
):
    """Issue 54: a truncated raw file stopped the named figure's run, which deleted the
    committed check listing; the same command then said "Nothing to be done" and kept the
    old figure over the corrupt file."""
    work = reference_workdir(rendered_reference, tmp_path)
    ref = work / "results" / "ref-fixture"
    listing = (ref / "logs" / "raw-check.txt").read_bytes()
    figure = ref / "figures" / "fig-ulysses.pdf"
    before = figure.read_bytes()
    raw = ref / layout.ATTENTION_RAW
    os.truncate(raw, raw.stat().st_size // 2)
    for attempt in ("first", "same command again"):
        out = snakemake_in(work, str(figure.relative_to(work)))
        said = out.stdout + out.stderr
        assert out.returncode != 0, f"{attempt}: {said[-3000:]}"
        assert "Nothing to be done" not in said, attempt
        assert "results/ref-fixture/raw/attention.json: not valid JSON" in said, attempt
        assert (ref / "logs" / "raw-check.txt").read_bytes() == listing, attempt
        assert figure.read_bytes() == before, attempt


@needs_snakemake
def test_a_product_of_a_changed_raw_file_stays_incomplete_whatever_the_target(
    rendered_reference, tmp_path
):
    """A run of the check alone reads the changed microbenchmark and rewrites the listing;
    the model and the figure made from the old file, not asked for then, are still remade
    by a later run that asks for the figure."""
    work = reference_workdir(rendered_reference, tmp_path)
    raw = work / "results" / "ref-fixture" / layout.microbench_raw("drain")
    raw.write_text(json.dumps(json.loads(raw.read_text()), indent=2))  # same data, new bytes
    check = snakemake_in(work, "results/ref-fixture/logs/raw-check.txt")
    assert check.returncode == 0, check.stderr[-3000:]
    figure = "results/ref-fixture/figures/fig-ulysses.pdf"  # reads the model
    planned = snakemake_in(work, figure, "-n", "--quiet", "host")
    assert planned.returncode == 0, planned.stderr[-3000:]
    for rule in ("fit_burst_gap", "figure_fig_ulysses"):
        assert rule in planned.stdout, planned.stdout
    assert "table_tab_ulysses" not in planned.stdout  # it does not read the microbenchmarks
    made = snakemake_in(work, figure)
    assert made.returncode == 0, made.stderr[-3000:]
    again = snakemake_in(work, figure, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


@needs_snakemake
def test_a_reference_without_its_check_listing_is_checked_before_a_named_product(
    rendered_reference, tmp_path
):
    work = reference_workdir(rendered_reference, tmp_path)
    (work / "results" / "ref-fixture" / "logs" / "raw-check.txt").unlink()
    planned = snakemake_in(work, "results/ref-fixture/figures/fig-ulysses.pdf", "-n")
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "logs/raw-check.txt is missing, so no raw file is known to be checked" in (
        planned.stderr
    )
    for rule in ("check_reference", "figure_fig_ulysses"):
        assert rule in planned.stdout, planned.stdout


def test_a_failed_render_leaves_the_previous_files(tmp_path, monkeypatch):
    ds = tmp_path / "ds"
    out = ds / "figures" / "fig-drain.pdf"
    out.parent.mkdir(parents=True)
    out.write_bytes(b"committed pdf")
    out.with_suffix(".png").write_bytes(b"committed png")

    def half_written(fig, path):
        Path(path).write_bytes(b"partial")
        raise RuntimeError("renderer crashed after the PDF")

    monkeypatch.setitem(render.FIGURES, "fig-drain", lambda d: None)
    monkeypatch.setattr(render, "save_figure", half_written)
    with pytest.raises(RuntimeError, match="crashed"):
        render.render_product("fig-drain", ds, out)
    assert out.read_bytes() == b"committed pdf"
    assert out.with_suffix(".png").read_bytes() == b"committed png"
    assert sorted(p.name for p in out.parent.iterdir()) == ["fig-drain.pdf", "fig-drain.png"]


def test_a_figure_that_fails_on_a_full_disk_names_its_output_and_the_fix(tmp_path, monkeypatch):
    """Issue 54: PIL's traceback ended in "[Errno 28] No space left on device", no path."""
    import errno

    out = tmp_path / "ds" / "figures" / "fig-drain.pdf"

    def disk_full(fig, path):
        raise OSError(errno.ENOSPC, "No space left on device")  # as PIL's write raises it

    monkeypatch.setitem(render.FIGURES, "fig-drain", lambda d: None)
    monkeypatch.setattr(render, "save_figure", disk_full)
    with pytest.raises(OSError) as err:
        render.render_product("fig-drain", tmp_path / "ds", out)
    assert err.value.errno == errno.ENOSPC
    assert str(err.value) == (
        f"[Errno 28] cannot write {out}: No space left on device (free space on the disk "
        "that holds it, then run again)"
    )


def test_smoke_datasets_never_share_a_name_with_full_runs():
    import yaml

    smoke = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())["datasets"]
    full = yaml.safe_load((ROOT / "config.yaml").read_text())["datasets"]
    assert not set(smoke["simulated"]) & set(full["simulated"])
    assert all(name.endswith("-smoke") for name in smoke["simulated"])


def _snapshot(folder: Path) -> dict:
    """Every file under `folder` with its modification time."""
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


@needs_snakemake
def test_a_simulated_file_is_remade_when_its_config_section_changes(tmp_path):
    """Issue 27: dry runs and runs of unrelated targets rewrote config stamps, and later
    runs printed "remaking it" and remade nothing. Now nothing but the remake writes, and
    the message comes with the remake."""
    import yaml

    work = copy_workflow(tmp_path)
    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    config["datasets"].update(simulated={"sim-h200": "config/hardware/h200.yaml"}, reference=[])
    target = "results/sim-h200/raw/attention.json"
    unrelated = "results/sim-h200/raw/microbench/drain.json"

    def run(seq_lens, *args, goal=target):
        config["attention"]["seq_lens"] = seq_lens
        (work / "c.yaml").write_text(yaml.safe_dump(config))
        out = subprocess.run(
            [str(SNAKEMAKE), goal, "--configfile", "c.yaml", *args],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        doc = json.loads((work / target).read_text())
        return out.stdout + out.stderr, {r["point"]["seq_len"] for r in doc["records"]}, doc

    _, lens, first = run([8192])
    assert lens == {8192}
    run([8192], goal=unrelated)
    before = _snapshot(work / "results")
    for args, goal in ((("-n",), target), ((), unrelated)):
        log, lens, _ = run([8192, 16384], *args, goal=goal)
        assert lens == {8192} and "remaking" not in log
        assert _snapshot(work / "results") == before, f"{args} {goal} wrote files"
    log, lens, second = run([8192, 16384])
    assert lens == {8192, 16384}
    assert log.count("remaking it") == 1
    assert "attention.seq_lens: [8192] -> [8192, 16384]" in log
    assert first["config_sha256"] != second["config_sha256"]
    log, _, third = run([8192, 16384])
    assert "Nothing to be done" in log and third == second and "remaking" not in log
    shutil.rmtree(work / ".snakemake")  # Snakemake's metadata lost: the file still tells
    log, lens, _ = run([8192])
    assert lens == {8192} and "remaking it" in log
    assert not list((work / "results").rglob(".config")), "no stamp is written"


@contextlib.contextmanager
def unwritable(folder: Path):
    """`folder` refuses new files (a full or read-only disk, a lost mount): by mode for
    a normal user, by the immutable attribute for root (whom modes do not stop)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        undo = ["chmod", "755", str(folder)]
    elif subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        undo = ["chattr", "-i", str(folder)]
    else:
        pytest.skip("root, and this file system has no immutable attribute (chattr +i)")
    try:
        yield
    finally:
        subprocess.run(undo, check=True)


@needs_snakemake
def test_a_failed_render_leaves_no_product_a_later_run_takes_as_current(tmp_path):
    """Issue 27: with the tables folder unwritable, the table rule failed and Snakemake
    "Restored previous version"; after the fix the rerun said "Nothing to be done" and
    tab-ulysses kept showing seq_len 32768 while the raw file held [8192, 16384]."""
    import yaml

    work = copy_workflow(tmp_path)
    config = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    config["datasets"].update(simulated={"sim-h200": "config/hardware/h200.yaml"}, reference=[])
    table = work / "results" / "sim-h200" / "tables" / "tab-ulysses.csv"

    def run(seq_lens):
        config["attention"]["seq_lens"] = seq_lens
        (work / "c.yaml").write_text(yaml.safe_dump(config))
        command = [str(SNAKEMAKE), str(table.relative_to(work)), "--configfile", "c.yaml"]
        return subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=300)

    assert run([8192, 16384, 32768]).returncode == 0
    assert "32768" in table.read_text()
    with unwritable(table.parent):
        failed = run([8192, 16384])
    assert failed.returncode != 0
    assert "Restored previous version" in failed.stderr
    assert "32768" in table.read_text()  # the previous table is back, for now
    fixed = run([8192, 16384])
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "Nothing to be done" not in fixed.stdout + fixed.stderr
    assert "32768" not in table.read_text() and "16384" in table.read_text()


@needs_snakemake
def test_one_rerun_recovers_after_a_sigkill_of_the_main_process_alone(tmp_path):
    """Issue 27: SIGKILL of the main Snakemake process left its jobs running (reparented to
    init) and the rerun stopped at Snakemake's LockException until they ended. Now the jobs
    record their pids, and the rerun ends those of the killed run and goes on."""
    from xstage_bench.run import orphans

    work = copy_workflow(tmp_path)
    target = "results/sim-h200-smoke/raw/attention.json"
    command = [str(SNAKEMAKE), target, "--configfile", "config/smoke.yaml"]
    env = {**os.environ, orphans.HOLD_ENV: "120"}  # its one job waits, so it is killed in it
    first = subprocess.Popen(
        command,
        cwd=work,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    jobs = work / orphans.JOBS_DIR
    try:
        deadline = time.monotonic() + 120
        while not (jobs.is_dir() and any(jobs.glob("*.json"))):
            assert first.poll() is None and time.monotonic() < deadline, "no job registered"
            time.sleep(0.05)
        job = json.loads(next(jobs.glob("*.json")).read_text())
        job_pid, job_start = job["processes"][0]
        os.kill(first.pid, signal.SIGKILL)  # the main process alone: its job goes on
        first.wait()
        assert orphans.process_start(job_pid) == job_start, "the job died with its run"
        again = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"ending 1 job(s) a killed run left running: pid {job_pid}" in again.stderr
        assert orphans.process_start(job_pid) is None
        assert json.loads((work / target).read_text())["records"]
        assert not any(jobs.glob("*.json"))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)


@needs_snakemake
def test_a_measured_file_made_with_another_config_stops_the_run(tmp_path):
    """Issue 27: in a fresh clone, a dry run with a changed attention.seq_lens wrote the
    measured dataset's config stamp; the config that had measured it was then refused.
    Now the raw file's own config is the record: nothing is written, the changed config
    is refused by every run, dry or not, and the original one goes on."""
    import yaml

    from xstage_bench.measure import experiment_config

    work = copy_workflow(tmp_path)
    config = {
        "extends": "config.yaml",
        "measure": "submit",  # measures through an executor: no GPU probe here
        "world_size": 2,
        "measured_experiments": ["attention"],
        "datasets": {"measured": "h200x2", "reference": [], "simulated": {}},
    }
    (work / "c.yaml").write_text(yaml.safe_dump(config))
    dataset = work / "results" / "h200x2"
    raw = dataset / layout.ATTENTION_RAW
    raw.parent.mkdir(parents=True)
    full = yaml.safe_load((ROOT / "config.yaml").read_text())
    made_with = experiment_config({**full, "world_size": 2}, "attention")
    raw.write_text(json.dumps({"config": made_with, "records": []}))  # as measured then
    before = sorted(p.relative_to(work) for p in dataset.rglob("*"))
    dry = [str(SNAKEMAKE), "-n", "--configfile", "c.yaml"]
    first = subprocess.run(dry, cwd=work, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]

    config["attention"] = {"seq_lens": [8192]}
    (work / "c.yaml").write_text(yaml.safe_dump(config))
    for command in (dry, dry[:1] + dry[2:]):  # a dry run and a real one
        second = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=300)
        assert second.returncode != 0
        assert "dataset 'h200x2' holds raw files measured with another config" in second.stderr
        assert (
            "raw/attention.json: attention.seq_lens: [8192, 16384, 32768, 49152, 65536, 131072]"
            " -> [8192]" in second.stderr
        )
    assert sorted(p.relative_to(work) for p in dataset.rglob("*")) == before  # nothing written

    del config["attention"]  # the config that measured it
    (work / "c.yaml").write_text(yaml.safe_dump(config))
    third = subprocess.run(dry, cwd=work, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]


def test_a_sweep_grown_by_variants_or_measured_over_the_same_paths_is_no_change(tmp_path):
    """The comparison is of what the measurement depends on: added variants grow a sweep
    in place; `dest: remote` over the peer path is what older files call `peer`."""
    from xstage_bench.data import provenance

    ds = tmp_path / "ds"
    (ds / "raw" / "microbench").mkdir(parents=True)
    moe = {"shapes": [], "variants": ["ours"]}
    (ds / layout.MEGAMOE_RAW).write_text(json.dumps({"config": {"world_size": 2, "megamoe": moe}}))
    section = {"world_size": "auto", "megamoe": {**moe, "variants": ["ours", "flashinfer"]}}
    assert provenance.measured_changes(ds, "megamoe", section, world_size=2) == []
    fewer = {"world_size": "auto", "megamoe": {**moe, "variants": []}}
    assert provenance.measured_changes(ds, "megamoe", fewer, world_size=2)
    assert provenance.measured_changes(ds, "megamoe", section, world_size=4) == [
        "raw/megamoe.json: world_size: 2 -> 4"
    ]
    # a grid axis may grow (its new values' points are measured on their own), never shrink
    grid = {**moe, "tokens_per_rank": [1024, 4096]}
    (ds / layout.MEGAMOE_RAW).write_text(json.dumps({"config": {"world_size": 2, "megamoe": grid}}))
    grown = {"world_size": 2, "megamoe": {**grid, "tokens_per_rank": [1024, 4096, 16384]}}
    assert provenance.measured_changes(ds, "megamoe", grown) == []
    shrunk = {"world_size": 2, "megamoe": {**grid, "tokens_per_rank": [4096]}}
    assert provenance.measured_changes(ds, "megamoe", shrunk) == [
        "raw/megamoe.json: megamoe.tokens_per_rank: [1024, 4096] -> [4096]"
    ]
    # a changed lead map re-measures its own arms (megamoe/refresh.py); the main lead may not
    mapped = {**grid, "lead_rows": 1024, "lead_sweep": {"lead_rows": [0, 1024]}}
    made = {"config": {"world_size": 2, "megamoe": mapped}}
    (ds / layout.MEGAMOE_RAW).write_text(json.dumps(made))
    wider = {**mapped, "lead_sweep": {"lead_rows": [0, 512, 1024, "auto"]}}
    assert provenance.measured_changes(ds, "megamoe", {"world_size": 2, "megamoe": wider}) == []
    main_auto = {"world_size": 2, "megamoe": {**mapped, "lead_rows": "auto"}}
    assert provenance.measured_changes(ds, "megamoe", main_auto) == [
        'raw/megamoe.json: megamoe.lead_rows: 1024 -> "auto"'
    ]
    (ds / layout.MEGAMOE_RAW).write_text(json.dumps({"config": {"world_size": 2, "megamoe": grid}}))
    # the per-GPU run's file holds the grid megamoe.per_gpu rewrote: not held to the config's
    per_gpu = {**grid, "tokens_per_rank": [4096], "remote_fractions": [0.5]}
    (ds / layout.MEGAMOE_PER_GPU_RAW).write_text(
        json.dumps({"config": {"world_size": 2, "megamoe": per_gpu}})
    )
    assert provenance.measured_changes(ds, "megamoe", grown) == []
    (ds / layout.MEGAMOE_PER_GPU_RAW).unlink()
    (ds / layout.MEGAMOE_RAW).write_text(json.dumps({"config": {"world_size": 2, "megamoe": moe}}))
    mb = {"bursts": 4, "warmup_bursts": 1, "launches": 1, "defaults": {"dest": "peer"}}
    made = {"microbench": {**mb, "studies": {"s": {"kind": "isolated", "dest": ["peer"]}}}}
    (ds / layout.microbench_raw("s")).write_text(json.dumps({"config": made}))
    now = provenance.microbench_section(
        {
            "microbench": {
                **mb,
                "defaults": {"dest": "remote"},
                "studies": {"s": {"kind": "isolated", "dest": ["remote"]}},
            }
        },
        "s",
    )
    assert provenance.measured_changes(ds, "microbench-s", now, ["peer"]) == []
    changed = provenance.measured_changes(ds, "microbench-s", now, ["peer", "host"])
    assert 'microbench.defaults.dest: ["peer"] -> ["peer", "host"]' in changed[0]
