"""The commands of docs/running.md and docs/reproducing.md, run as printed: each does what
its comment says.

The commands run in a copy of the workflow with the committed reference, with the test's
environment first on PATH (what `. .venv/bin/activate` does, as the README says). The ones
that would take minutes here (the full DAG, every simulated dataset) are checked as dry runs
of the same command; the smoke run is CI's own step, run as printed (.ci/run). Commands with
placeholders (my-config.yaml, A.json) run with those files made. A command added to the
README without a case here fails `test_every_common_command_has_a_case`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixtures import copy_workflow

ROOT = Path(__file__).resolve().parents[1]
RUNNING = (ROOT / "docs" / "running.md").read_text()
REPRODUCING = (ROOT / "docs" / "reproducing.md").read_text()
BIN = Path(sys.executable).parent
GPU_MACHINE = shutil.which("nvidia-smi") is not None  # where `measured` would measure
pytestmark = pytest.mark.skipif(not (BIN / "snakemake").exists(), reason="no snakemake here")


def section(title: str, page: str = RUNNING) -> str:
    return page.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def common_commands() -> list[str]:
    """The indented block of 'Common commands', comments stripped."""
    block = re.search(r"\n((?:    \S.*\n)+)", section("Common commands")).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines()]


RERENDER = re.search(r"`(snakemake \S+ --forcerun [^`]+)`", section("Datasets", REPRODUCING)).group(
    1
)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    work = copy_workflow(tmp_path_factory.mktemp("readme"))
    shutil.copytree(ROOT / "results" / "ref-h200x2", work / "results" / "ref-h200x2")
    # The smoke config's bootstrap count (config/smoke.yaml): a simulated fit 5x quicker,
    # what each command makes the same
    config = work / "config.yaml"
    text = config.read_text()
    assert "bootstrap_replicates: 200" in text
    config.write_text(text.replace("bootstrap_replicates: 200", "bootstrap_replicates: 40"))
    return work


def run(command: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """`command` as a user types it, in the README's environment (its bin first on PATH)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def ran(out: subprocess.CompletedProcess) -> list[str]:
    return re.findall(r"\(Rule: (\w+)\)", out.stdout + out.stderr)


def planned(out: subprocess.CompletedProcess) -> dict[str, int]:
    table = (out.stdout + out.stderr).split("Job stats:")[1].split("\n\n")[0]
    return {k: int(v) for k, v in re.findall(r"^(\w+)\s+(\d+)$", table, flags=re.M)}


def test_the_environment_to_use_is_named():
    commands = section("Common commands")
    assert ". .venv/bin/activate" in commands and ".venv/bin/snakemake" in commands


def test_the_rerender_command_makes_that_figure_and_nothing_else(work):
    """Issue 27: `snakemake --forcerun figure_fig_drain <pdf>` ran the default target (the
    path went into --forcerun's list): 5 jobs, a committed PNG rewritten."""
    pdf = work / "results" / "ref-h200x2" / "figures" / "fig-drain.pdf"
    before = pdf.stat().st_mtime_ns
    out = run(RERENDER, work)
    assert out.returncode == 0, out.stderr[-3000:]
    assert ran(out) == ["figure_fig_drain"], out.stderr[-3000:]
    assert pdf.stat().st_mtime_ns != before


def test_every_common_command_has_a_case():
    assert set(common_commands()) == set(CASES), "a docs/running.md command without a test case"


def _full_run_plans_every_dataset(out, work):
    counts = planned(out)
    assert counts["microbench_simulate"] and counts["report_summary"] == 1


def _measured_is_nothing_here(out, work):
    if GPU_MACHINE:  # planned, not run: it would measure
        assert "Job stats:" in out.stdout + out.stderr
        return
    assert ran(out) == ["measured"] and "No measurement was made on this machine" in out.stderr


def _simulated_plans_only_simulations(out, work):
    counts = planned(out)
    assert counts["microbench_simulate"] and "report_summary" not in counts
    assert "check_reference" not in counts


def _one_figure(out, work):
    assert ran(out)[-1] == "figure_fig_drain" and (work / "results/sim-h200/figures").is_dir()
    assert set(ran(out)) == {"microbench_simulate", "fit_burst_gap", "figure_fig_drain"}


def _smoke_plans_the_smoke_datasets(out, work):
    smoke = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    counts = planned(out)
    n = len(smoke["datasets"]["simulated"]) * len(smoke["microbench"]["studies"])
    assert counts["microbench_simulate"] == n and counts["report_summary"] == 1


def _dry_run_says_why_and_warns_of_nothing(out, work):
    """Issue 27: every dry run ended with "10 jobs have missing provenance/metadata"."""
    assert "Reasons:" in out.stdout and "provenance/metadata" not in out.stdout + out.stderr


def ref_only_config() -> str:
    """config.yaml with the committed reference as its only dataset (an `extends` cannot
    empty a mapping: mappings merge)."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["measure"] = "never"
    config["datasets"] = {"measured": "auto", "reference": ["ref-h200x2"], "simulated": {}}
    return yaml.safe_dump(config)


def _report_after_the_run_it_reports(out, work):
    """Issue 27: a smoke run then `snakemake --report` gave a summary of the smoke datasets
    beside the full config's sections, and 19 "Missing metadata" warnings. The report of a
    run of another config is refused, naming both; with the run's config it warns of
    nothing (the committed reference's jobs got their metadata in that run)."""
    assert out.returncode != 0
    assert "summary.html was made by a run of datasets ref-h200x2, this config has" in out.stderr
    same = run("snakemake --report report.html --configfile ref-only.yaml", work)
    assert same.returncode == 0, same.stderr[-3000:]
    assert "Missing metadata" not in same.stderr and (work / "report.html").stat().st_size


def _probe(out, work):
    assert "can measure:" in out.stdout


def _validate(out, work):
    assert out.stdout.strip() == "my-config.yaml: valid"


def _check(out, work):
    assert out.stdout.count(": valid, microbench (cuda)") == 9


def _compare(out, work):
    assert "agree" in out.stdout and out.returncode == 0


# command -> (how it is run: "run" as printed, "dry" with -n added; what it must show)
CASES = {
    "snakemake --cores all": ("dry", _full_run_plans_every_dataset),
    "snakemake --cores all measured": ("dry" if GPU_MACHINE else "run", _measured_is_nothing_here),
    "snakemake --cores all simulated": ("dry", _simulated_plans_only_simulations),
    "snakemake results/sim-h200/figures/fig-drain.pdf": ("run", _one_figure),
    "snakemake --cores all --configfile config/smoke.yaml": (
        "dry",
        _smoke_plans_the_smoke_datasets,
    ),
    "snakemake -n --quiet host": ("run", _dry_run_says_why_and_warns_of_nothing),
    "snakemake --report report.html": ("report", _report_after_the_run_it_reports),
    "xstage probe": ("run", _probe),
    "xstage validate my-config.yaml": ("run", _validate),
    "xstage check results/ref-h200x2/raw/microbench/*.json": ("run", _check),
    "xstage compare A.json B.json": ("run", _compare),
}


@pytest.mark.parametrize("command", list(CASES))
def test_a_common_command_does_what_it_says(work, command):
    how, check = CASES[command]
    (work / "my-config.yaml").write_text("extends: config.yaml\nworld_size: 2\n")
    raw = work / "results" / "ref-h200x2" / "raw" / "microbench" / "drain.json"
    for name in ("A.json", "B.json"):
        shutil.copy(raw, work / name)
    if how == "report":  # the last run: the reference alone
        (work / "ref-only.yaml").write_text(ref_only_config())
        made = run("snakemake --configfile ref-only.yaml", work)
        assert made.returncode == 0, made.stderr[-3000:]
    out = run(f"{command} -n" if how == "dry" else command, work)
    if how != "report":
        assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    check(out, work)


def test_the_docs_name_the_kernel_the_emulated_sweep_ran():
    """Issue 26: the emulated sweep runs the plain Triton kernel's EMULATE build, not the
    warp-specialized kernel the real sweep times; docs/reproducing.md says which, as each
    committed raw file records it."""
    import json

    for dataset in ("ref-h200x1", "ref-h200x2"):
        raw = json.loads((ROOT / "results" / dataset / "raw" / "megamoe_emulated.json").read_text())
        source = raw["config"]["kernel"]["source"].split(" ")[0]
        assert f"EMULATE build of the plain Triton kernel, `{source}`" in " ".join(
            REPRODUCING.split()
        ), dataset
