"""Raw result files: written atomically and valid, or refused with the file and field named."""

import json
import os

import pytest
from fixtures import environment

from xstage_bench.results import (
    RawResultError,
    failed_record,
    ok_record,
    raw_document,
    read_raw,
    write_raw,
)

ENV = environment(simulated=True)


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
    rec = ok_record("a", {"K": 1}, {"period_us": [3.0, 1.0, 2.0]})
    bad = failed_record("b", {"K": 2}, "kernel timed out", status="timeout")
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
    d = doc([ok_record("a", {}, {"t_us": [1.0]})])
    d["backend"] = "gpu-ish"
    with pytest.raises(RawResultError, match="field 'backend'"):
        write_raw(path, d)
    assert not path.exists()


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "x.json"
    write_raw(path, doc([ok_record("a", {}, {"t_us": [1.0]})]))
    before = path.read_text()

    def boom(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        write_raw(path, doc([ok_record("b", {}, {"t_us": [2.0]})]))
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary left behind


def test_reader_names_file_and_field(tmp_path):
    path = tmp_path / "bad.json"
    d = doc([ok_record("a", {}, {"t_us": [1.0]})])
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
    d = doc([failed_record("a", {}, "wrong output", status="wrong")])
    d["records"][0]["error"] = ""
    with pytest.raises(RawResultError, match="records/0/error"):
        write_raw("/nonexistent/never-written.json", d)


def test_duplicate_ids_are_refused(tmp_path):
    r = ok_record("same", {}, {"t_us": [1.0]})
    with pytest.raises(RawResultError, match="duplicate record id 'same'"):
        write_raw(tmp_path / "d.json", doc([r, dict(r)]))
