"""Raw result files: written atomically and valid, or refused with the file and field named."""

import json
import os

import pytest
from fixtures import environment

from xstage_bench.cli import main
from xstage_bench.results import (
    RawResultError,
    failed_record,
    ok_record,
    raw_document,
    read_raw,
    write_raw,
)

ENV = environment(simulated=True)
# A microbench point with the fields its readers need.
POINT = {"kind": "periodic", "K": 1, "V": 4096, "B": 4096, "gap_us": 0.0}


def doc(records):
    return raw_document(
        experiment="microbench",
        backend="sim",
        dataset="sim-x",
        environment=ENV,
        config={},
        records=records,
        study="drain",
    )


def test_round_trip_keeps_samples_and_summary(tmp_path):
    rec = ok_record("a", POINT, {"period_us": [3.0, 1.0, 2.0]})
    bad = failed_record("b", {**POINT, "K": 2}, "kernel timed out", status="timeout")
    path = tmp_path / "raw" / "x.json"
    write_raw(path, doc([rec, bad]))
    back = read_raw(path)
    assert back["records"][0]["samples"]["period_us"] == [3.0, 1.0, 2.0]
    summary = back["records"][0]["summary"]["period_us"]
    assert summary["median"] == 2.0 and summary["n"] == 3
    assert summary["ci_low"] <= 2.0 <= summary["ci_high"]
    assert back["records"][1]["status"] == "timeout"
    assert back["records"][1]["error"] == "kernel timed out"


def test_invalid_document_is_not_written(tmp_path):
    path = tmp_path / "x.json"
    d = doc([ok_record("a", POINT, {"t_us": [1.0]})])
    d["backend"] = "gpu-ish"
    with pytest.raises(RawResultError, match="field 'backend'"):
        write_raw(path, d)
    assert not path.exists()


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "x.json"
    write_raw(path, doc([ok_record("a", POINT, {"t_us": [1.0]})]))
    before = path.read_text()

    def boom(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_raw(path, doc([ok_record("b", POINT, {"t_us": [2.0]})]))
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary left behind


def test_reader_names_file_and_field(tmp_path):
    path = tmp_path / "bad.json"
    d = doc([ok_record("a", POINT, {"t_us": [1.0]})])
    del d["records"][0]["summary"]
    path.write_text(json.dumps(d))
    with pytest.raises(RawResultError, match=r"bad\.json: field 'records/0'.*summary"):
        read_raw(path)
    path.write_text("{ truncated")
    with pytest.raises(RawResultError, match=r"bad\.json: not valid JSON"):
        read_raw(path)


def test_failed_record_needs_a_reason_and_a_known_status():
    with pytest.raises(ValueError):
        failed_record("a", {}, "x", status="meh")
    d = doc([failed_record("a", POINT, "wrong output", status="wrong")])
    d["records"][0]["error"] = ""
    with pytest.raises(RawResultError, match="records/0/error"):
        write_raw("/nonexistent/never-written.json", d)


def test_duplicate_ids_are_refused(tmp_path):
    r = ok_record("same", POINT, {"t_us": [1.0]})
    with pytest.raises(RawResultError, match="duplicate record id 'same'"):
        write_raw(tmp_path / "d.json", doc([r, dict(r)]))


def _written(tmp_path, record, experiment="microbench"):
    """A raw file holding `record` as-is (no validation on the way out)."""
    d = doc([record])
    d["experiment"] = experiment
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(d))
    return path


@pytest.mark.parametrize(
    "samples, match",
    [
        ([1.0, float("nan"), 2.0], "NaN or infinity"),
        ([1.0, float("inf"), 2.0], "NaN or infinity"),
        ([1.0, 0.0, 2.0], "value <= 0"),
        ([1.0, -3.0, 2.0], "value <= 0"),
    ],
    ids=["nan", "inf", "zero", "negative"],
)
def test_unphysical_samples_are_refused_naming_the_record(tmp_path, samples, match):
    rec = ok_record("a", POINT, {"period_us": [1.0, 2.0, 3.0]})
    rec["samples"]["period_us"] = samples
    with pytest.raises(RawResultError, match=rf"edited\.json: record 'a': .*{match}"):
        read_raw(_written(tmp_path, rec))


def test_non_duration_metrics_may_be_zero_but_not_negative(tmp_path):
    rec = ok_record("a", POINT, {"start_skew_us": [0.0, 0.0, 1.0]})
    read_raw(_written(tmp_path, rec))
    rec["samples"]["start_skew_us"] = [-1.0, 0.0, 1.0]
    with pytest.raises(RawResultError, match="negative"):
        read_raw(_written(tmp_path, rec))


def test_summary_must_agree_with_its_samples(tmp_path):
    rec = ok_record("a", POINT, {"period_us": [1.0, 2.0, 3.0]})
    rec["summary"]["period_us"]["median"] = 1e6  # a spike plotted while the fit used samples
    with pytest.raises(RawResultError, match=r"record 'a': summary 'period_us': median 1e\+06"):
        read_raw(_written(tmp_path, rec))
    rec = ok_record("a", POINT, {"period_us": [1.0, 2.0, 3.0]})
    rec["summary"]["period_us"]["n"] = 4
    with pytest.raises(RawResultError, match="n is 4 but there are 3 samples"):
        read_raw(_written(tmp_path, rec))


@pytest.mark.parametrize(
    "experiment, point, match",
    [
        ("microbench", {"kind": "periodic", "K": 132, "B": 4096}, "'V' is a required property"),
        ("microbench", {**POINT, "V": "big"}, "records/0/point/V': 'big' is not of type"),
        ("microbench", {"kind": "ceiling", "V": 4096}, "'method' is a required property"),
        ("megamoe", {"shape": "x", "H": 64}, "records/0/point': 'I' is a required"),
        ("attention", {"backend": "fa3", "mode": "fused", "heads": 8}, "'seq_len' is a required"),
    ],
    ids=["microbench-V", "microbench-V-type", "ceiling", "megamoe", "attention"],
)
def test_each_experiment_requires_its_point_fields(tmp_path, experiment, point, match):
    rec = ok_record("a", point, {"time_us": [1.0]})
    with pytest.raises(RawResultError, match=match):
        read_raw(_written(tmp_path, rec, experiment))


def test_check_counts_each_status(tmp_path, capsys):
    records = [ok_record("a", POINT, {"period_us": [1.0]})] + [
        failed_record(f"{status}-{i}", POINT, "why", status=status)
        for status, n in (("failed", 1), ("timeout", 2), ("unsupported", 3))
        for i in range(n)
    ]
    path = tmp_path / "x.json"
    write_raw(path, doc(records))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("7 records, 1 ok, 6 not ok, 1 failed, 2 timeout, 3 unsupported"), (
        out
    )


def test_the_senders_commit_wins_over_a_copied_trees_git(monkeypatch):
    from xstage_bench import environment

    monkeypatch.setenv("XSTAGE_GIT_SHA", "a" * 40)
    monkeypatch.setenv("XSTAGE_GIT_DIRTY", "0")
    # this checkout has a .git of its own, which must not be asked
    assert environment.git_state() == {"sha": "a" * 40, "dirty": False}
