"""Issue 26: an ok record's empty sample list is refused, and the committed files that held
one are repaired (microbench/repair.py) to the form new records have."""

import json
from pathlib import Path

import pytest
from fixtures import environment

from xstage_bench.cli import main
from xstage_bench.data.results import (
    RawResultError,
    failed_record,
    ok_record,
    raw_document,
    read_raw,
    write_raw,
)
from xstage_bench.measurement.sweep import run_sweep
from xstage_bench.microbench import repair, runner

ROOT = Path(__file__).resolve().parents[1]
POINT = {"kind": "periodic", "K": 1, "V": 4096, "B": 4096, "gap_us": 0.0}
# What a drain record held before 089da0d: no launch had a steady window.
OLD_SAMPLES = {"period_us": [3.0, 1.0, 2.0], "issue_rate_GBps": []}
EXTRA = {"launches": 2}


def old_doc() -> dict:
    """A document as written before 089da0d: one record with an empty list, one without."""
    records = [
        ok_record("empty", POINT, OLD_SAMPLES, extra=EXTRA),
        ok_record("full", {**POINT, "K": 2}, {"period_us": [4.0, 5.0]}, extra=EXTRA),
        failed_record("failed", {**POINT, "K": 3}, "kernel timed out", status="timeout"),
    ]
    return microbench_doc(records, "drain", simulated=True)


def microbench_doc(records: list, study: str, *, simulated: bool) -> dict:
    return raw_document(
        experiment="microbench",
        backend="sim" if simulated else "cuda",
        dataset="sim-x" if simulated else "ref-x",
        environment=environment(simulated=simulated),
        config={},
        records=records,
        study=study,
    )


def write_as_written(path: Path, doc: dict) -> Path:
    """Bytes as write_raw lays them out, without its validation (which now refuses them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def test_an_empty_sample_list_in_an_ok_record_is_refused_with_file_record_and_metric(tmp_path):
    path = write_as_written(tmp_path / "drain.json", old_doc())
    with pytest.raises(RawResultError) as err:
        read_raw(path)
    message = str(err.value)
    assert message.startswith(f"{path}: record 'empty': ")
    assert "samples 'issue_rate_GBps' is an empty list" in message
    assert "metrics_without_samples" in message
    fixed = old_doc()
    del fixed["records"][0]["samples"]["issue_rate_GBps"]
    read_raw(write_as_written(tmp_path / "fixed.json", fixed))  # only the empty list was wrong


def test_the_repair_writes_records_as_new_ones_are_once_and_says_so(tmp_path, capsys):
    dataset = tmp_path / "ds"
    path = write_as_written(dataset / "raw" / "microbench" / "drain.json", old_doc())
    assert repair.main([str(dataset), "--date", "2026-12-02"]) == 0
    assert "1 record(s) repaired\n  empty" in capsys.readouterr().out
    doc = read_raw(path)
    before = old_doc()
    new = runner.PointMeasurer._measured(POINT, (dict(OLD_SAMPLES), dict(EXTRA)))
    empty, full, failed = doc["records"]
    assert empty["samples"] == new.samples and empty["extra"] == new.extra
    assert empty["summary"] == before["records"][0]["summary"]
    assert {k: v for k, v in empty.items() if k not in ("samples", "extra")} == {
        k: v for k, v in before["records"][0].items() if k not in ("samples", "extra")
    }
    assert [full, failed] == before["records"][1:]
    header = ("environment", "records")
    assert {k: v for k, v in doc.items() if k not in header} == {
        k: v for k, v in before.items() if k not in header
    }
    [note] = doc["environment"].pop("repairs")
    assert doc["environment"] == before["environment"]
    assert note["date"] == "2026-12-02" and note["records"] == ["empty"]
    assert "microbench.repair" in note["by"] and "issue 26" in note["why"]
    written = path.read_bytes()
    assert repair.main([str(dataset), "--date", "2026-12-03"]) == 0
    assert "0 record(s) repaired" in capsys.readouterr().out
    assert path.read_bytes() == written  # a second run changes nothing


def test_a_resumed_sweep_keeps_the_repair_note(tmp_path):
    """The note lives in the environment block, which a resumption keeps (sweep.py)."""
    out = tmp_path / "drain.json"
    point = {**POINT, "id": "a"}

    def measure(p):
        return ok_record(p["id"], p, {"period_us": [1.0, 2.0]})

    header = dict(
        experiment="microbench",
        backend="sim",
        dataset="sim-x",
        environment=environment(simulated=True),
        config={},
        study="drain",
        progress=lambda line: None,
    )
    doc = run_sweep([point], lambda p: failed_record(p["id"], p, "boom"), out, **header)
    note = {"date": "2026-12-02", "change": "c", "why": "w", "by": "b", "records": ["a"]}
    doc["environment"]["repairs"] = [note]
    write_raw(out, doc)
    again = run_sweep([point], measure, out, retry_failed=True, **header)
    assert again["records"][0]["status"] == "ok"
    assert len(again["environment"]["resumes"]) == 1
    assert read_raw(out)["environment"]["repairs"] == [note]


# The records of the committed references that held `issue_rate_GBps: []` until the repair.
REPAIRED = {
    "ref-h200x1": [
        f"drain/K=33/V={v}/gap_us=0/width=16/dest=host/pattern=same/peers=1/sync=free/"
        "gap_mode=compute"
        for v in (4194304, 8388608, 16777216, 33554432)
    ],
    "ref-h200x2": [
        "drain/K=33/V=2097152/gap_us=0/width=16/dest=peer/pattern=same/peers=1/sync=free/"
        "gap_mode=compute"
    ],
}


def test_the_committed_references_pass_the_raw_checks_and_name_their_repair(capsys):
    results = ROOT / "results"
    files = sorted(str(p) for d in REPAIRED for p in (results / d / "raw").rglob("*.json"))
    assert len(files) == 13 + 14
    assert main(["check", *files]) == 0
    assert capsys.readouterr().out.count(": valid, ") == len(files)
    for dataset, ids in REPAIRED.items():
        doc = read_raw(results / dataset / "raw" / "microbench" / "drain.json")
        [note] = doc["environment"]["repairs"]
        assert note["records"] == ids and note["date"] == "2026-12-02"
        records = {r["id"]: r for r in doc["records"]}
        for rid in ids:
            assert "issue_rate_GBps" not in records[rid]["samples"]
            reason = records[rid]["extra"]["metrics_without_samples"]["issue_rate_GBps"]
            assert reason == runner.NO_SAMPLES["issue_rate_GBps"]
        assert repair.repair_doc(doc, "2026-12-03") == []  # nothing left to repair


def aligned_doc() -> dict:
    """An aligned train's record as written before the sender-visible time was the store
    loop plus the hold: 2 launches of 3 steady bursts, 2 each with a successor."""
    samples = {
        "t_iss_slowest_us": [0.3, 0.31, 0.32, 0.29, 0.3, 0.33],
        "hold_us": [0.0, 2.0, 0.5, -0.256],  # the last: the timer's tick, counted as 0
        "t_vis_slowest_us": [0.9, 2.8, 1.1, 0.7],  # period - gap_spent - base: gap spread in
        "period_us": [100.0, 102.0, 100.5, 100.0],
    }
    point = {**POINT, "K": 4, "sync": "barrier"}
    records = [ok_record("aligned", point, samples, extra=EXTRA)]
    return microbench_doc(records, "gap_sweep_barrier", simulated=False)


def test_the_sender_visible_time_is_recomputed_as_the_store_loop_plus_the_hold(tmp_path):
    path = write_as_written(tmp_path / "gap_sweep_barrier.json", aligned_doc())
    assert repair.repair_file(path, "2026-12-07") == ["aligned"]
    doc = read_raw(path)
    (record,) = doc["records"]
    # launch 0: bursts 0, 1 (burst 2 has no successor); launch 1: bursts 3, 4
    want = [0.3 + 0.0, 0.31 + 2.0, 0.29 + 0.5, 0.3 + 0.0]
    assert record["samples"]["t_vis_slowest_us"] == pytest.approx(want)
    assert record["summary"]["t_vis_slowest_us"]["median"] == pytest.approx((0.3 + 0.79) / 2)
    assert record["samples"]["period_us"] == [100.0, 102.0, 100.5, 100.0]  # the rest as it was
    (note,) = doc["environment"]["repairs"]
    assert note["change"] == repair.VISIBLE_CHANGE and note["records"] == ["aligned"]
    assert repair.repair_file(path, "2026-12-08") == []  # a second run changes nothing


def test_samples_that_do_not_split_into_the_launches_are_refused_naming_the_record():
    doc = aligned_doc()
    doc["records"][0]["samples"]["hold_us"].append(1.0)
    with pytest.raises(ValueError, match="record 'aligned': 6 store loops and 5 holds"):
        repair.repair_doc(doc, "2026-12-07")
