"""Errors a user can act on, on Snakemake's command line: the file, the line and the fix.

Snakemake reads --configfile and --config before the Snakefile; the harness's Snakemake
plugin (plugins/snakemake-logger-plugin-xstage) explains what goes wrong there
(xstage_bench.run.snakemake_cli). These tests put the plugin on the path, as an install does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import copy_workflow

from xstage_bench.run.snakemake_cli import (
    configfile_problem,
    nested_config_entries,
    typed_config_value,
)

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "plugins" / "snakemake-logger-plugin-xstage"
SNAKEMAKE = Path(sys.executable).parent / "snakemake"


def test_a_yaml_error_names_the_file_the_line_and_the_fix(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("world_size: auto\nmeasure: [never\n")
    problem = configfile_problem(path)
    assert problem.startswith(f"{path}, line 3, column 1: not valid YAML")
    assert f"xstage validate {path}" in problem


def test_a_target_read_as_a_config_file_says_to_put_it_first(tmp_path):
    pdf = tmp_path / "fig-drain.pdf"
    for path in (pdf, tmp_path / "raw.json.gz"):
        assert "Put targets first: snakemake" in configfile_problem(path)  # missing
    pdf.write_bytes(b"%PDF-1.4\n\xff\xfe binary")
    assert "is not text" in configfile_problem(pdf) and "Put targets first" in configfile_problem(
        pdf
    )
    good = tmp_path / "ok.yaml"
    good.write_text("world_size: 2\n")
    assert configfile_problem(good) is None


def test_dotted_config_entries_are_nested_keys():
    plain, dotted = nested_config_entries(["measure=never", "timing.warmup=2", "a.b.c="])
    assert plain == ["measure=never"]
    assert dotted == [(("timing", "warmup"), "2"), (("a", "b", "c"), "")]


def test_a_config_list_or_mapping_holds_numbers_as_a_config_file_would():
    """Snakemake reads a --config list with YAML's BaseLoader: [8192] was ['8192']."""
    assert typed_config_value(["8192", "16384"], "[8192,16384]") == [8192, 16384]
    assert typed_config_value({"a": "1"}, "'{a: 1, b: [on]}'") == {"a": 1, "b": [True]}
    assert typed_config_value(2, "2") == 2 and typed_config_value("never", "never") == "never"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return copy_workflow(tmp_path_factory.mktemp("cli"))


def snakemake(work, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGIN), env.get("PYTHONPATH")]))
    command = [str(SNAKEMAKE), "-n", *args]
    out = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    out.stderr = out.stdout + out.stderr  # Snakemake prints some errors on stdout
    return out


@pytest.mark.skipif(not SNAKEMAKE.exists(), reason="snakemake is not installed")
def test_snakemake_itself_says_what_is_wrong_before_the_snakefile(work):
    """Issue 27: a YAML error through --configfile gave "Config file is not valid JSON or
    YAML" with no file or line; a target after --configfile and `--config timing.warmup=2`
    ended in Snakemake tracebacks."""
    (work / "bad.yaml").write_text("world_size: auto\nmeasure: [never\n")
    out = snakemake(work, "--configfile", "bad.yaml")
    assert out.returncode != 0 and "bad.yaml, line 3, column 1: not valid YAML" in out.stderr

    target = "results/sim-h200-smoke/figures/fig-drain.pdf"
    out = snakemake(work, "--configfile", "config/smoke.yaml", target)
    assert out.returncode != 0
    assert f"Put targets first: snakemake {target} --configfile" in out.stderr

    # Issue 54: a raw .json target loaded as a config, then "config key 'backend' unknown".
    raw = work / "results" / "ref-x" / "raw" / "attention.json"
    raw.parent.mkdir(parents=True)
    shutil.copy(ROOT / "results" / "ref-h200x2" / "raw" / "attention.json", raw)
    target = str(raw.relative_to(work))
    out = snakemake(work, "--configfile", "config/smoke.yaml", target)
    assert out.returncode != 0 and "config key" not in out.stderr
    assert f"Config file {target} is a raw result file, not a config." in out.stderr
    assert f"Put targets first: snakemake {target} --configfile" in out.stderr

    out = snakemake(work, "--config", "timing.warmup=-1")  # reaches the config's validation
    assert out.returncode != 0 and "config key 'timing.warmup': -1 is less than" in out.stderr
    out = snakemake(work, "--config", "timing.warmup=2", "--quiet", "all")
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.skipif(not SNAKEMAKE.exists(), reason="snakemake is not installed")
def test_integer_lists_given_through_config_are_integers(work):
    """Audit: `--config attention.seq_lens=[8192,16384]` was refused as "'16384' is not of
    type 'integer'", and `--config gpu_ids=[0]` as "'0' is not of type 'integer'"."""
    for entry in ("attention.seq_lens=[8192,16384]", "gpu_ids=[0]"):
        out = snakemake(work, "--config", entry, "--quiet", "all")
        assert out.returncode == 0, f"{entry}: {out.stderr[-2000:]}"
