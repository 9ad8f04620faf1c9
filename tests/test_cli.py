"""The `xstage` command on bad input: a clear error naming the file, key or argument and a
non-zero exit, never a traceback; and nothing measured is replaced by simulated data."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from xstage_bench.cli import main

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "config" / "hardware" / "h200.yaml")
MEASURED = ROOT / "results" / "ref-h200x2" / "raw" / "microbench" / "ceilings.json"  # 16 KB


def simulate(*args: str, config: str = "config.yaml") -> int:
    return main(["simulate", *args, "--config", str(ROOT / config), "--profile", PROFILE])


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Path:
    """A simulated attention raw file (the smoke grid: 11 KB); a clean clone has none."""
    out = tmp_path_factory.mktemp("simulated") / "attention.json"
    assert (
        simulate(
            "attention", "--dataset", "sim-b200", "--out", str(out), config="config/smoke.yaml"
        )
        == 0
    )
    return out


def test_simulate_refuses_to_replace_a_measured_raw_file(tmp_path, capsys):
    """The audit: `xstage simulate attention --out results/ref-h200x1/raw/attention.json`
    exited 0 and put simulated data in place of the measurement."""
    out = tmp_path / "attention.json"
    shutil.copy(MEASURED, out)
    assert simulate("attention", "--dataset", "h200x1", "--out", str(out)) == 2
    assert out.read_bytes() == MEASURED.read_bytes()
    err = capsys.readouterr().err
    assert f"xstage: error: --out {out}: the file there is not a simulated raw file" in err

    out.write_text("not JSON: a file of unknown origin is kept as well\n")
    assert simulate("attention", "--dataset", "h200x1", "--out", str(out)) == 2
    assert out.read_text().startswith("not JSON")


def test_simulate_still_replaces_a_simulated_raw_file(tmp_path, simulated):
    out = tmp_path / "attention.json"
    shutil.copy(simulated, out)
    assert simulate("attention", "--dataset", "h200x1", "--out", str(out)) == 0
    assert out.read_bytes() != simulated.read_bytes()  # written again, for the full grid


def test_an_unknown_study_names_the_config_key(tmp_path, capsys):
    args = ("microbench", "--study", "drian", "--dataset", "x", "--out", str(tmp_path / "s.json"))
    assert simulate(*args) == 2
    err = capsys.readouterr().err
    assert "microbench study 'drian' is not in config key 'microbench.studies'" in err
    assert "drain" in err and not (tmp_path / "s.json").exists()


def test_fit_of_a_file_that_is_not_microbench_says_so(tmp_path, capsys, simulated):
    argv = ["fit", str(simulated), "--dataset", "x"]
    argv += ["--out-json", str(tmp_path / "m.json"), "--out-profile", str(tmp_path / "p.yaml")]
    assert main(argv) == 2
    assert f"xstage: error: {simulated}: experiment 'attention' is not microbench" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "m.json").exists()


@pytest.mark.parametrize(
    ("name", "out", "message"),
    [
        ("fig-nope", "x.pdf", "unknown product 'fig-nope'; known: fig-issue-vs-gap"),
        ("fig-drain", "x.csv", "fig-drain is a figure; its output must end in .pdf"),
        ("tab-megamoe", "x.pdf", "tab-megamoe is a table; its output must end in .csv"),
    ],
)
def test_render_refuses_an_unknown_product_or_an_output_of_the_wrong_kind(
    tmp_path, capsys, name, out, message
):
    """tab-megamoe into x.pdf exited 0 with CSV in the .pdf; the others were tracebacks."""
    dataset = ROOT / "results" / "ref-h200x2"
    assert main(["render", name, str(dataset), str(tmp_path / out)]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_render_without_the_data_names_the_missing_file(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    argv = ["render", "fig-drain", str(tmp_path / "empty"), str(tmp_path / "x.pdf")]
    assert main(argv) == 2
    assert "no raw data: raw/microbench/drain.json does not exist" in capsys.readouterr().err


def test_check_reports_every_file_then_fails(tmp_path, capsys, simulated):
    """`xstage check a bad c` stopped at `bad`; c went unchecked."""
    bad = tmp_path / "bad.json"
    bad.write_text("{\n")
    assert main(["check", str(MEASURED), str(bad), str(simulated)]) == 2
    out, err = capsys.readouterr()
    assert f"{MEASURED}: valid" in out and f"{simulated}: valid" in out
    assert f"xstage: error: {bad}: not valid JSON" in err
    assert "1 raw file(s) not valid" in err


def test_check_of_a_dataset_folder_checks_its_raw_files(tmp_path, capsys, simulated):
    """`xstage check results/ref-h200x2/raw` printed a bare '[Errno 21] Is a directory'."""
    raw = tmp_path / "ds" / "raw"
    (raw / "microbench").mkdir(parents=True)
    shutil.copy(MEASURED, raw / "microbench" / "ceilings.json")
    shutil.copy(simulated, raw / "attention.json")
    (raw / "microbench" / "drain.json.partial.json").write_text("{")  # resume state: skipped
    for folder in (raw, raw.parent):
        assert main(["check", str(folder)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert [line.split(":")[0] for line in out] == [
            str(raw / "attention.json"),
            str(raw / "microbench" / "ceilings.json"),
        ]
    (tmp_path / "empty").mkdir()
    assert main(["check", str(tmp_path / "empty")]) == 2
    assert "a directory with no raw files" in capsys.readouterr().err
