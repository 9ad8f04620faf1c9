import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures import environment

from xstage_bench.data.results import RawResultError, ok_record, read_raw
from xstage_bench.measurement.sweep import (
    WATCHDOG_EXIT_CODE,
    Refresh,
    added_variants,
    kept_until_done,
    partial_path,
    records_refresh,
    run_sweep,
    same_config,
)

ENV = environment(simulated=True)


def point(name: str, i: int = 0) -> dict:
    """A microbench point with the fields the raw schema requires."""
    V = 4096 * (i + 1)
    return {"id": name, "kind": "isolated", "K": 1, "V": V, "B": V}


POINTS = [point(name, i) for i, name in enumerate("abcde")]


def counting_measure(fail=(), interrupt=None):
    """measure(point) -> ok record; raises for ids in `fail`; Ctrl-C at id `interrupt`."""

    def measure(point):
        measure.calls.append(point["id"])
        if point["id"] == interrupt:
            raise KeyboardInterrupt
        if point["id"] in fail:
            raise ValueError(f"boom at {point['id']}")
        return ok_record(point["id"], point, {"time_us": [1.0, 2.0, 3.0]})

    measure.calls = []
    return measure


def sweep(out, measure, points=POINTS, config=None, **kw):
    kw.setdefault("progress", lambda line: None)
    return run_sweep(
        points,
        measure,
        out,
        experiment="microbench",
        backend="sim",
        dataset="sim-test",
        environment=dict(ENV),
        config=config or {"k": 1},
        study="gap_sweep",
        **kw,
    )


def test_failing_point_is_recorded_and_sweep_goes_on(tmp_path):
    out = tmp_path / "raw" / "gap_sweep.json"
    measure = counting_measure(fail={"b"})
    doc = sweep(out, measure, point_timeout_s=30)
    assert measure.calls == list("abcde")
    assert [r["status"] for r in doc["records"]] == ["ok", "failed", "ok", "ok", "ok"]
    assert doc["records"][1]["error"] == "ValueError: boom at b"
    assert read_raw(out) == doc
    assert not partial_path(out).exists()
    assert doc["environment"]["finished_at"] != ENV["finished_at"]


def test_interrupt_keeps_partial_and_resume_measures_only_missing(tmp_path):
    out = tmp_path / "gap_sweep.json"
    first = counting_measure(interrupt="c")
    with pytest.raises(KeyboardInterrupt):
        sweep(out, first)
    partial = read_raw(partial_path(out))
    assert [r["id"] for r in partial["records"]] == ["a", "b"]
    assert not out.exists()

    second = counting_measure()
    doc = sweep(out, second)
    assert second.calls == ["c", "d", "e"]
    assert [r["id"] for r in doc["records"]] == list("abcde")
    assert len(doc["environment"]["resumes"]) == 1


def test_retry_failed_remeasures_only_failed_points(tmp_path):
    out = tmp_path / "gap_sweep.json"
    with pytest.raises(KeyboardInterrupt):
        sweep(out, counting_measure(fail={"b"}, interrupt="d"))
    again = counting_measure()
    doc = sweep(out, again, retry_failed=True)
    assert again.calls == ["b", "d", "e"]
    assert all(r["status"] == "ok" for r in doc["records"])


def test_kill_during_write_leaves_previous_partial_intact(tmp_path, monkeypatch):
    out = tmp_path / "gap_sweep.json"
    real_replace = os.replace
    replaced = []

    def dying_replace(src, dst):
        # Writes: the empty start, then one per point; die while writing point c's.
        if len(replaced) == 3:
            raise KeyboardInterrupt("killed mid-write")
        replaced.append(dst)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(KeyboardInterrupt):
        sweep(out, counting_measure(), checkpoint_every_s=0)  # a checkpoint after every point
    monkeypatch.setattr(os, "replace", real_replace)

    partial = read_raw(partial_path(out))  # still valid: the old file was never touched
    assert [r["id"] for r in partial["records"]] == ["a", "b"]
    assert [p.name for p in tmp_path.iterdir()] == [partial_path(out).name]  # no temp files
    resumed = counting_measure()
    sweep(out, resumed)
    assert resumed.calls == ["c", "d", "e"]


def test_corrupt_partial_raises_naming_the_file(tmp_path):
    out = tmp_path / "gap_sweep.json"
    partial_path(out).write_text('{"schema": 1, "records": [')
    with pytest.raises(RawResultError, match=re.escape(str(partial_path(out)))):
        sweep(out, counting_measure())
    assert partial_path(out).read_text() == '{"schema": 1, "records": ['  # not discarded


def test_partial_from_another_config_is_refused(tmp_path):
    out = tmp_path / "gap_sweep.json"
    with pytest.raises(KeyboardInterrupt):
        sweep(out, counting_measure(interrupt="b"))
    with pytest.raises(RawResultError, match="different config"):
        run_sweep(
            POINTS,
            counting_measure(),
            out,
            experiment="microbench",
            backend="sim",
            dataset="sim-test",
            environment=dict(ENV),
            config={"k": 2},
            study="gap_sweep",
            progress=lambda line: None,
        )


def test_repeated_ids_are_an_error(tmp_path):
    with pytest.raises(ValueError, match="repeated: a"):
        sweep(tmp_path / "x.json", counting_measure(), points=[point("a"), point("a")])


def test_record_for_wrong_point_becomes_failed(tmp_path):
    def measure(point):
        return ok_record("other", point, {"time_us": [1.0]})

    doc = sweep(tmp_path / "x.json", measure, points=[point("a")])
    assert doc["records"][0]["status"] == "failed"
    assert "record for 'other'" in doc["records"][0]["error"]


def test_progress_line_per_point(tmp_path):
    lines = []
    sweep(tmp_path / "x.json", counting_measure(), points=POINTS[:3], progress=lines.append)
    assert len(lines) == 3
    assert re.fullmatch(r"\[gap_sweep\] 1/3 a ok \d+\.\d s \(ETA \d+s\)", lines[0])


WATCHDOG_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from xstage_bench.data.results import ok_record
    from xstage_bench.measurement.sweep import run_sweep

    def measure(point):
        print("measure", point["id"], flush=True)
        if point["id"] == "b":
            time.sleep(60)  # a stuck point
        return ok_record(point["id"], point, {"time_us": [1.0]})

    run_sweep([{"id": i, "kind": "isolated", "K": 1, "V": 4096 * n, "B": 4096 * n}
               for n, i in enumerate("abc", 1)], measure, Path(sys.argv[1]),
              experiment="microbench", backend="sim", dataset="sim-test",
              environment=json.loads(sys.argv[2]), config={}, study="s",
              point_timeout_s=0.5)
    """
)


def test_watchdog_records_timeout_exits_and_rerun_continues(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(WATCHDOG_SCRIPT)
    out = tmp_path / "s.json"
    cmd = [sys.executable, str(script), str(out), json.dumps(ENV)]

    first = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert first.returncode == WATCHDOG_EXIT_CODE, first.stderr
    assert "point b ran longer than 0.5 s" in first.stderr
    partial = read_raw(partial_path(out))
    assert [(r["id"], r["status"]) for r in partial["records"]] == [("a", "ok"), ("b", "timeout")]

    second = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["measure", "c"]
    doc = read_raw(out)
    assert [r["status"] for r in doc["records"]] == ["ok", "timeout", "ok"]


def test_checkpoints_are_throttled_but_flushed_when_the_sweep_stops(tmp_path, monkeypatch):
    out = tmp_path / "gap_sweep.json"
    real_replace = os.replace
    writes = []

    def counting_replace(src, dst):
        writes.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", counting_replace)
    with pytest.raises(KeyboardInterrupt):
        sweep(out, counting_measure(interrupt="d"), checkpoint_every_s=3600)
    # the empty start and one flush on the way out, not one write per point
    assert writes == [partial_path(out).name] * 2
    assert [r["id"] for r in read_raw(partial_path(out))["records"]] == ["a", "b", "c"]


def test_a_partial_file_with_bad_values_is_not_resumed(tmp_path):
    out = tmp_path / "gap_sweep.json"
    with pytest.raises(KeyboardInterrupt):
        sweep(out, counting_measure(interrupt="c"))
    partial = partial_path(out)
    doc = json.loads(partial.read_text())
    doc["records"][0]["samples"]["time_us"][1] = -1.0
    partial.write_text(json.dumps(doc))
    measure = counting_measure()
    with pytest.raises(RawResultError, match=r"gap_sweep\.json\.partial\.json: record 'a'.*<= 0"):
        sweep(out, measure)
    assert measure.calls == [] and not out.exists()


def test_retry_measures_only_the_points_a_finished_sweep_recorded_not_ok(tmp_path, monkeypatch):
    out = tmp_path / "raw" / "gap_sweep.json"
    first = sweep(out, counting_measure(fail={"b", "d"}))
    assert [r["status"] for r in first["records"]] == ["ok", "failed", "ok", "failed", "ok"]
    monkeypatch.setenv("XSTAGE_RETRY_FAILED", "1")
    measure = counting_measure()
    second = sweep(out, measure)
    assert measure.calls == ["b", "d"]  # the good points are not measured again
    assert [r["status"] for r in second["records"]] == ["ok"] * 5
    for i in (0, 2, 4):
        assert second["records"][i] == first["records"][i]
    assert read_raw(out) == second and not partial_path(out).exists()
    assert [r["host"] for r in second["environment"]["resumes"]] == [ENV["host"]]


def test_a_retry_with_nothing_to_measure_leaves_the_finished_file_untouched(tmp_path):
    # a rule of two sweeps retried for one: the other's file must not gain a resume entry
    # naming code that measured none of its records
    out = tmp_path / "raw" / "gap_sweep.json"
    first = sweep(out, counting_measure())
    before = out.read_bytes()
    measure, lines = counting_measure(), []
    again = sweep(out, measure, retry_failed=True, progress=lines.append)
    assert measure.calls == [] and again == first
    assert out.read_bytes() == before and not partial_path(out).exists()
    assert any("nothing to measure, left as it was" in line for line in lines)


def test_retry_of_a_finished_sweep_with_another_config_measures_it_again_in_full(tmp_path):
    # as without the retry: a rule of two sweeps (MegaMoE and its traces) retried after a
    # change that one of them cannot refresh must not fail after the other has finished
    out = tmp_path / "gap_sweep.json"
    sweep(out, counting_measure(fail={"b"}))
    measure, lines = counting_measure(), []
    again = sweep(out, measure, config={"k": 2}, retry_failed=True, progress=lines.append)
    assert measure.calls == list("abcde")
    assert again["config"] == {"k": 2} and "resumes" not in again["environment"]
    assert any("another config: measured again in full" in line for line in lines)


def _moe_sweep(out, measure, variants, points, **kw):
    config = {
        "k": 1,
        "megamoe": {"variants": variants, "lead_rows": 256},  # the section repeats them
        "variants": variants,
        "baselines": {v: "..." for v in variants},
    }
    return sweep(out, measure, points, config=config, **kw)


def test_a_finished_sweep_grows_by_an_added_variant_measuring_only_its_points(tmp_path):
    out = tmp_path / "gap_sweep.json"
    first = _moe_sweep(out, counting_measure(), ["ours"], POINTS[:3])
    lines = []
    measure = counting_measure()
    grown = _moe_sweep(out, measure, ["ours", "extra"], POINTS, progress=lines.append)
    assert measure.calls == ["d", "e"]  # the added variant's points only
    assert grown["records"][:3] == first["records"]
    assert grown["config"]["variants"] == ["ours", "extra"]
    assert any("adds variant extra: measuring only their points" in line for line in lines)
    assert [r["host"] for r in grown["environment"]["resumes"]] == [ENV["host"]]


def test_a_finished_sweep_is_remeasured_when_more_than_its_variants_changed(tmp_path):
    out = tmp_path / "gap_sweep.json"
    _moe_sweep(out, counting_measure(), ["ours", "extra"], POINTS)
    measure = counting_measure()
    _moe_sweep(out, measure, ["ours"], POINTS[:3])  # fewer variants: a new sweep
    assert measure.calls == ["a", "b", "c"]
    assert added_variants({"k": 1, "variants": ["ours"]}, {"k": 2, "variants": ["ours", "x"]}) == []
    assert (
        added_variants({"variants": ["a"], "baselines": {"a": 1}}, {"variants": ["a", "b"]}) == []
    )
    assert added_variants({"variants": ["a"]}, {"variants": ["b", "a"]}) == ["variant b"]


def test_a_finished_sweep_grows_by_a_grid_value_measuring_only_its_points(tmp_path):
    """A token count added to the grid measures its points only; one dropped is a new
    sweep (records of a value the config no longer has would be kept for nothing)."""
    out = tmp_path / "gap_sweep.json"

    def grid_sweep(measure, tokens, points, **kw):
        config = {
            "megamoe": {"variants": ["ours"], "tokens_per_rank": tokens, "lead_rows": 256},
            "variants": ["ours"],
        }
        return sweep(out, measure, points, config=config, **kw)

    first = grid_sweep(counting_measure(), [1024, 4096], POINTS[:3])
    lines, measure = [], counting_measure()
    grown = grid_sweep(measure, [1024, 4096, 16384], POINTS, progress=lines.append)
    assert measure.calls == ["d", "e"] and grown["records"][:3] == first["records"]
    assert grown["config"]["megamoe"]["tokens_per_rank"] == [1024, 4096, 16384]
    assert any("adds megamoe.tokens_per_rank 16384" in line for line in lines)
    measure = counting_measure()
    grid_sweep(measure, [4096], POINTS[:2])
    assert measure.calls == ["a", "b"]
    had = {"variants": [], "m": {"tokens_per_rank": [1], "lead_rows": 1}}
    assert added_variants(had, {**had, "m": {"tokens_per_rank": [1, 2], "lead_rows": 2}}) == []


def _kernel_rule(previous, config):
    """A refresh rule like megamoe's: points whose V is in the changed part are stale."""
    if previous["k"] != config["k"] or previous["kernel"] == config["kernel"]:
        return None
    changed = {v for v in config["kernel"] if previous["kernel"].get(v) != config["kernel"][v]}
    return Refresh(f"kernel of {sorted(changed)}", lambda p: str(p["V"]) in changed)


def test_a_finished_sweep_is_refreshed_measuring_only_the_points_its_rule_names(tmp_path):
    out = tmp_path / "gap_sweep.json"
    first = sweep(out, counting_measure(), config={"k": 1, "kernel": {"4096": "a", "8192": "a"}})
    lines = []
    measure = counting_measure()
    config = {"k": 1, "kernel": {"4096": "a", "8192": "b"}}  # point b's kernel changed
    again = sweep(out, measure, config=config, refresh=_kernel_rule, progress=lines.append)
    assert measure.calls == ["b"]
    kept = [r for r in again["records"] if r["id"] != "b"]
    assert kept == [r for r in first["records"] if r["id"] != "b"]
    assert [r["id"] for r in again["records"]] == list("abcde")  # in point order
    assert again["config"] == config
    (resume,) = again["environment"]["resumes"]
    assert resume["remeasured"] == "kernel of ['8192']: 1 point(s)"
    assert any("measured again, the others kept" in line for line in lines)
    # Anything else changed: measured again in full; no rule: the same.
    measure = counting_measure()
    sweep(out, measure, config={"k": 2, "kernel": config["kernel"]}, refresh=_kernel_rule)
    assert measure.calls == list("abcde")


def test_a_partial_file_of_another_kernel_keeps_only_the_points_that_kernel_did_not_change(
    tmp_path,
):
    """A sweep resumed from a partial file that an earlier kernel wrote (interrupted, or the
    finished file copied there to resume from) measures the points whose kernel changed
    again: kept, they would stand under a config naming a kernel that never ran them."""
    out = tmp_path / "gap_sweep.json"
    before = {"k": 1, "kernel": {"4096": "a", "8192": "a"}}
    with pytest.raises(KeyboardInterrupt):
        sweep(out, counting_measure(interrupt="d"), config=before)
    measure, lines = counting_measure(), []
    config = {"k": 1, "kernel": {"4096": "a", "8192": "b"}}
    again = sweep(out, measure, config=config, refresh=_kernel_rule, progress=lines.append)
    assert measure.calls == ["b", "d", "e"]  # b: its kernel changed; d, e: never measured
    (resume,) = again["environment"]["resumes"]
    assert resume["remeasured"] == "kernel of ['8192']: 1 point(s)"
    assert again["config"] == config
    assert any("measured again, the others kept" in line for line in lines)


def _by_kernel(config):
    return {k: v for k, v in config.items() if k != "kernel"}, config["kernel"]


def test_a_refitted_model_that_agrees_to_1e9_does_not_make_a_finished_sweep_foreign(tmp_path):
    # ref-h200x1: the model refitted from the same files moved R by 1e-10 relative, and the
    # kernel refresh then refused the finished MegaMoE sweep as "a different config"
    out = tmp_path / "gap_sweep.json"
    kernel = {"4096": "a", "8192": "a"}
    sweep(out, counting_measure(), config={"R": 51.60824042928061, "kernel": kernel})
    refitted = {"R": 51.608240429281, "kernel": {"4096": "a", "8192": "b"}}
    measure = counting_measure()
    rule = lambda before, after: records_refresh(  # noqa: E731
        before, after, _by_kernel, lambda p, changed: str(p["V"]) in changed
    )
    sweep(out, measure, config=refitted, refresh=rule)
    assert measure.calls == ["b"]
    refit_further = {"R": 51.7, "kernel": {"4096": "a", "8192": "c"}}  # a real change
    measure = counting_measure()
    sweep(out, measure, config=refit_further, refresh=rule)
    assert measure.calls == list("abcde")


def test_same_config_tolerates_float_noise_only():
    assert same_config({"a": [1.0, {"b": 0.1 + 0.2}]}, {"a": [1, {"b": 0.3}]})
    assert not same_config({"a": 0.3}, {"a": 0.30001})
    assert not same_config({"a": 1}, {"a": 2})
    assert not same_config({"a": True}, {"a": 1})
    assert not same_config({"a": 1}, {"a": 1, "b": 2})
    assert not same_config([1, 2], [1, 2, 3])
    assert not same_config({"a": "x"}, {"a": "y"})


def test_an_unreadable_finished_file_is_replaced_not_resumed(tmp_path):
    out = tmp_path / "gap_sweep.json"
    out.write_text("{not json")
    measure = counting_measure()
    sweep(out, measure)
    assert measure.calls == list("abcde")


def test_a_finished_sweep_survives_a_later_failure_of_its_job_as_its_partial_file(tmp_path):
    out = tmp_path / "gap_sweep.json"
    doc = sweep(out, counting_measure())
    with pytest.raises(RuntimeError), kept_until_done(out, doc):
        out.unlink()  # what Snakemake does to an update() output when the job then fails
        raise RuntimeError("the trace sweep failed")
    measure = counting_measure()
    assert sweep(out, measure)["records"] == doc["records"]
    assert measure.calls == [] and not partial_path(out).exists()
    with kept_until_done(out, doc):
        assert partial_path(out).exists()
    assert not partial_path(out).exists()
