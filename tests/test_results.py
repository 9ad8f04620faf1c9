"""Raw result files: written atomically and valid, or refused with the file and field named."""

import json
import os
import re
from pathlib import Path

import pytest
from fixtures import ROOT, environment

from xstage_bench.cli import main
from xstage_bench.data.results import (
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


def test_a_bogus_status_is_reported_as_the_status_not_as_its_consequence(tmp_path):
    """Audit: an ok record edited to status 'bogus' was reported as "field
    'records/0/error': None is not of type 'string'" (the non-ok branch's demand)."""
    rec = ok_record("a", POINT, {"t_us": [1.0]})
    rec["status"] = "bogus"
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc([rec])))
    with pytest.raises(RawResultError) as e:
        read_raw(path)
    assert str(e.value).startswith(
        f"{path}: field 'records/0/status': 'bogus' is not one of ['ok', 'failed'"
    )


def test_a_truncated_file_names_the_line_and_column_once(tmp_path):
    """Audit: "not valid JSON (Unterminated string starting at at line 1)"."""
    path = tmp_path / "cut.json"
    path.write_text('{"schema": 1, "records": [{"id": "microbench-dr')
    with pytest.raises(RawResultError) as e:
        read_raw(path)
    assert str(e.value) == (
        f"{path}: not valid JSON (Unterminated string starting at line 1, column 34)"
    )


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
        failed_record(f"{status}-{i}", {**POINT, "K": 2 + j * 10 + i}, "why", status=status)
        for j, (status, n) in enumerate((("failed", 1), ("timeout", 2), ("unsupported", 3)))
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
    from xstage_bench.measurement import environment

    monkeypatch.setenv("XSTAGE_GIT_SHA", "a" * 40)
    monkeypatch.setenv("XSTAGE_GIT_DIRTY", "0")
    # this checkout has a .git of its own, which must not be asked
    assert environment.git_state() == {"sha": "a" * 40, "dirty": False}


# --- values checked against themselves and against physics (rawchecks.py) ---------------

GPU_ENV = environment(simulated=False)  # two NVIDIA H200
MIB = 1 << 20


def measured_doc(records, experiment="microbench", env=None):
    return raw_document(
        experiment=experiment,
        backend="cuda",
        dataset="h200x2",
        environment=env or GPU_ENV,
        config={},
        records=records,
        study="drain" if experiment == "microbench" else None,
    )


def drain_point(K=132, V=4 * MIB, **axes):
    """A point as grid.microbench_points makes it (V rounded to K whole producers)."""
    from xstage_bench.data.grid import microbench_points

    study = {"kind": "periodic", "K": [K], "V": [V], "gap_us": [0], **axes}
    defaults = {"width": 16, "dest": "peer", "pattern": "same", "peers": 1, "sync": "free"}
    mb = {"defaults": {**defaults, "gap_mode": "compute"}, "studies": {"drain": study}}
    return microbench_points(mb, "drain")[0]


def drain_record(point=None, scale=1.0):
    point = point or drain_point()
    rate = [scale * r for r in (349.0, 351.0, 350.0, 352.0, 348.0)]
    period = [scale * t for t in (12.0, 12.1, 11.9, 12.2, 12.0)]
    return ok_record(point["id"], point, {"issue_rate_GBps": rate, "period_us": period})


def write_as_is(tmp_path, doc):
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_rate_above_the_line_rate_is_refused_though_its_summary_agrees(tmp_path):
    """Issue 27: one drain record's period and rate times 10^6, summary recomputed, was
    valid and gave R = 1.9e8 GB/s."""
    read_raw(write_as_is(tmp_path, measured_doc([drain_record()])))
    edited = measured_doc([drain_record(scale=1e6)])
    with pytest.raises(RawResultError) as err:
        read_raw(write_as_is(tmp_path, edited))
    message = str(err.value)
    assert "record 'drain/K=132/V=4194304/" in message
    assert "issue_rate_GBps' reach 3.52e+08 GB/s" in message
    # an issue rate is bounded as a local store: a burst that Q absorbs issues faster than
    # the link drains it
    assert "HBM bandwidth of H200 (4800 GB/s)" in message and "peer path" in message


def test_an_issue_rate_above_the_link_is_a_burst_that_q_absorbs_not_an_error(tmp_path):
    """Seen on one H200's host path: 4 MiB bursts of 33 free-running producers issued at
    88 GB/s over a 63 GB/s PCIe link (Q is about 3 MiB there); a drain rate or a ceiling
    above the link is refused."""
    point = drain_point(dest=["host"])
    env = {**GPU_ENV, "host_links": [{"kind": "pcie", "gen": 5, "line_rate_GBps": 63.0}]}
    burst = ok_record(point["id"], point, {"issue_rate_GBps": [88.6, 87.9, 88.2]})
    read_raw(write_as_is(tmp_path, measured_doc([burst], env=env)))
    drained = ok_record(point["id"], point, {"bandwidth_GBps": [88.6, 87.9, 88.2]})
    with pytest.raises(RawResultError, match=r"above the host link's recorded line rate"):
        read_raw(write_as_is(tmp_path, measured_doc([drained], env=env)))


@pytest.mark.parametrize(
    "dest, links, rate, bound",
    [
        ("host", [{"kind": "pcie", "gen": 5, "width": 16, "line_rate_GBps": 63.0}], 80.0, "63"),
        ("host", [], 130.0, "PCIe Gen6 x16"),
        ("local", [], 13000.0, "HBM bandwidth of H200 (4800 GB/s)"),
    ],
    ids=["host-recorded-link", "host-no-link", "local-hbm"],
)
def test_each_path_is_bounded_by_its_own_link(tmp_path, dest, links, rate, bound):
    point = drain_point(dest=[dest])
    assert point["path"] == dest
    env = {**GPU_ENV, "host_links": links}
    fine = ok_record(point["id"], point, {"bandwidth_GBps": [rate / 2] * 3})
    read_raw(write_as_is(tmp_path, measured_doc([fine], env=env)))
    absurd = ok_record(point["id"], point, {"bandwidth_GBps": [rate] * 3})
    with pytest.raises(RawResultError, match=rf"above .*{re.escape(bound)}.* on the {dest} path"):
        read_raw(write_as_is(tmp_path, measured_doc([absurd], env=env)))


def test_a_file_without_paths_is_the_peer_path_and_a_simulated_file_is_not_bounded(tmp_path):
    point = {k: v for k, v in drain_point().items() if k != "path"}  # written before paths
    absurd = drain_record(point, scale=1e6)
    with pytest.raises(RawResultError, match="peer path"):
        read_raw(write_as_is(tmp_path, measured_doc([absurd])))
    simulated = doc([absurd])  # a model's output: its profile, not a GPU, made it
    simulated["study"] = "drain"
    read_raw(write_as_is(tmp_path, simulated))


def test_a_time_below_the_timer_tick_is_refused(tmp_path):
    point = drain_point()
    record = ok_record(point["id"], point, {"period_us": [12e-6, 12.1e-6, 11.9e-6]})
    with pytest.raises(RawResultError, match=r"period_us' hold 1.19e-05 us, below one tick"):
        read_raw(write_as_is(tmp_path, measured_doc([record])))


def test_tflops_above_the_gpus_peak_are_refused(tmp_path):
    from fixtures import megamoe_configs

    config = megamoe_configs()[0]
    point = {**config, "schedule": "expert_wave"}
    record_id = f"{config['id']}/expert_wave"

    def record(tflops):
        extra = {"tflops": tflops, "gemm_tflops": {"fp8": tflops / 2}}
        return ok_record(record_id, point, {"time_us": [10.0, 11.0, 12.0]}, extra=extra)

    read_raw(write_as_is(tmp_path, measured_doc([record(900.0)], "megamoe")))
    with pytest.raises(RawResultError, match=r"extra 'tflops' is 9e\+06 TFLOP/s, above the dense"):
        read_raw(write_as_is(tmp_path, measured_doc([record(9e6)], "megamoe")))


@pytest.mark.parametrize("field", ["q1", "q3", "ci_low", "ci_high", "rel_iqr", "min", "max"])
def test_a_summary_field_that_is_not_its_samples_is_refused(tmp_path, field):
    """Issue 27: bogus quartiles, CI and rel_iqr beside the true median were accepted (tab-noise
    showed rel_iqr 49.9 where the samples give 0.022)."""
    rec = drain_record()
    rec["summary"]["period_us"][field] = 49.9
    with pytest.raises(RawResultError, match=rf"summary 'period_us': {field} 49.9 is not the"):
        read_raw(write_as_is(tmp_path, measured_doc([rec])))


def test_the_fast_bootstrap_is_the_summary_bootstrap():
    import numpy as np

    from xstage_bench.data.rawchecks import bootstrap_ci
    from xstage_bench.data.stats import bootstrap_median_ci

    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 10, 67, 100, 101, 1024):
        x = rng.lognormal(size=n)
        x[: n // 3] = x[0]  # ties, as timer ticks give
        assert bootstrap_ci(x) == bootstrap_median_ci(x), n


def test_many_samples_need_a_ci_where_the_bootstrap_puts_it(tmp_path):
    import numpy as np
    from fixtures import megamoe_configs

    config = megamoe_configs()[0]
    point = {**config, "schedule": "expert_wave", "variant": "expert_wave"}
    spans = list(np.random.default_rng(1).lognormal(size=3000))
    rec = ok_record(f"{config['id']}/expert_wave", point, {"store_span_us": spans})
    read_raw(write_as_is(tmp_path, measured_doc([rec], "megamoe_trace")))
    summary = rec["summary"]["store_span_us"]
    summary["ci_low"], summary["ci_high"] = summary["min"], summary["max"]
    with pytest.raises(RawResultError, match="is not a bootstrap CI of the median of its 3000"):
        read_raw(write_as_is(tmp_path, measured_doc([rec], "megamoe_trace")))


def test_a_point_that_contradicts_its_id_is_refused(tmp_path):
    """Issue 27: a point whose V differs from its id was accepted and fitted."""
    rec = drain_record()
    rec["point"]["V"] = rec["point"]["V"] * 2
    with pytest.raises(RawResultError, match=r"the id names V=4194304 but the point has V=8384"):
        read_raw(write_as_is(tmp_path, measured_doc([rec])))
    rec = drain_record()
    rec["point"]["sync"] = "barrier"
    with pytest.raises(RawResultError, match="the id names sync=free but the point has sync="):
        read_raw(write_as_is(tmp_path, measured_doc([rec])))


@pytest.mark.parametrize(
    "experiment, field, value",
    [
        ("megamoe", "tokens_per_rank", 4096),
        ("megamoe", "precision", "w8a8"),
        ("megamoe", "schedule", "interleaved"),
        ("attention", "seq_len", 16384),
        ("attention", "backend", "fa4"),
    ],
)
def test_megamoe_and_attention_points_match_their_ids(tmp_path, experiment, field, value):
    from fixtures import ATTENTION, WORLD_SIZE, megamoe_configs

    from xstage_bench.data.grid import attention_points

    if experiment == "megamoe":
        config = megamoe_configs()[0]
        point, rid = {**config, "schedule": "expert_wave"}, f"{config['id']}/expert_wave"
    else:
        point = attention_points(ATTENTION, WORLD_SIZE)[0]
        rid = point["id"]
    rec = ok_record(rid, point, {"time_us": [10.0, 11.0, 12.0]})
    read_raw(write_as_is(tmp_path, measured_doc([rec], experiment)))
    rec["point"] = {**point, field: value}
    with pytest.raises(RawResultError, match=f"record '{rid}': "):
        read_raw(write_as_is(tmp_path, measured_doc([rec], experiment)))


def test_one_point_under_two_ids_is_refused(tmp_path):
    """Issue 27: a point duplicated under a new id was accepted and fitted twice."""
    rec = drain_record()
    twin = json.loads(json.dumps(rec))
    twin["id"] = rec["id"] + "/again"
    twin["point"]["id"] = twin["id"]
    with pytest.raises(RawResultError, match="are the same point"):
        read_raw(write_as_is(tmp_path, measured_doc([rec, twin])))


def test_ok_with_correct_false_is_impossible(tmp_path):
    """Issue 26/27: `status: ok` with `correct: false` was accepted by the schema."""
    point = drain_point()
    with pytest.raises(ValueError, match="cannot have correct=False"):
        ok_record(point["id"], point, {"period_us": [1.0]}, correct=False)
    rec = drain_record()
    rec["correct"] = False
    with pytest.raises(RawResultError, match="records/0/correct"):
        read_raw(write_as_is(tmp_path, measured_doc([rec])))
    wrong = failed_record(point["id"], point, "output differs", status="wrong", correct=False)
    read_raw(write_as_is(tmp_path, measured_doc([wrong])))


def test_the_committed_datasets_still_read(capsys):
    """results/ref-h200x2 and results/fault-demo pass every check above, through the CLI."""
    root = Path(__file__).resolve().parents[1] / "results"
    files = sorted(str(p) for d in ("ref-h200x2", "fault-demo") for p in (root / d).rglob("*.json"))
    files = [f for f in files if "/raw/" in f]
    assert len(files) == 15
    assert main(["check", *files]) == 0
    assert capsys.readouterr().out.count(": valid, ") == len(files)


def test_a_full_disk_names_the_file_and_the_fix(tmp_path, monkeypatch):
    """Issue 27: a disk-full error read "[Errno 28] No space left on device" with no path."""
    import errno

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    path = tmp_path / "raw" / "x.json"
    with pytest.raises(OSError) as err:
        write_raw(path, doc([ok_record("a", POINT, {"t_us": [1.0]})]))
    assert err.value.errno == errno.ENOSPC
    assert str(err.value) == (
        f"[Errno 28] cannot write {path}: No space left on device (free space on the disk "
        "that holds it, then run again)"
    )
    assert not any(path.parent.iterdir())  # no temporary left behind


def test_the_run_lock_on_a_full_disk_names_its_file(tmp_path, monkeypatch):
    import builtins
    import errno

    from xstage_bench.run.runlock import hold_run_lock

    real_open = builtins.open

    class Full:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            return getattr(self.f, name)

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(builtins, "open", lambda *a, **k: Full(real_open(*a, **k)))
    with pytest.raises(OSError, match=r"cannot write .*xstage-run\.lock: No space left"):
        hold_run_lock(tmp_path / ".snakemake" / "xstage-run.lock")


def test_the_gpu_table_agrees_with_the_simulator_profiles():
    """The line rates the raw checks bound measured files by are the profiles' (the H200's
    and the paper's B200), and no profile's matrix rate is above the peak they allow."""
    from xstage_bench.data.hardware import load_profile
    from xstage_bench.data.rawchecks import gpu_limits

    hardware = Path(__file__).resolve().parents[1] / "config" / "hardware"
    for name, file in (("NVIDIA H200", "h200.yaml"), ("NVIDIA B200", "b200.yaml")):
        fragment, limits = gpu_limits(name)
        profile = load_profile(hardware / file)
        assert fragment in name and limits.nvlink_GBps == profile.nvlink_line_rate_GBps
        assert max(profile.matrix_tflops.values()) <= limits.peak_tflops
    assert gpu_limits("NVIDIA GB200")[0] == "GB200"  # not B200's row
    assert "unlisted" in gpu_limits("Some Future GPU")[0]


def test_a_lead_map_arm_id_names_its_requested_lead():
    from xstage_bench.data.rawchecks import id_problem

    point = {
        "shape": "s", "precision": "w8a8", "routing": "balanced", "tokens_per_rank": 64,
        "world_size": 1, "path": "host", "remote_fraction": 0.25, "schedule": "interleaved",
        "lead_rows": 1024, "lead_rows_requested": "auto", "lead_sweep": True,
    }  # fmt: skip
    rid = "s/w8a8/balanced/T=64/P=1/path=host/f=0.25/interleaved/lead=auto"
    assert id_problem("megamoe", {"id": rid, "point": point}) is None
    wrong = {"id": rid.replace("lead=auto", "lead=256"), "point": point}
    assert "lead=256" in id_problem("megamoe", wrong)


def test_a_result_file_is_readable_as_any_file_and_an_interrupted_write_leaves_none(
    tmp_path, monkeypatch
):
    path = tmp_path / "x.json"
    write_raw(path, doc([ok_record("a", POINT, {"t_us": [1.0]})]))
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600
    before = path.read_text()

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_raw(path, doc([ok_record("b", POINT, {"t_us": [2.0]})]))
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary left behind


def test_a_summary_is_the_summary_of_its_samples_to_nine_digits(tmp_path):
    rec = ok_record("a", POINT, {"period_us": [1.0, 2.0, 3.0]})
    rec["summary"]["period_us"]["median"] = 2.0 * (1 + 1e-6)  # a rounded copy, not a recompute
    with pytest.raises(RawResultError, match="median 2 is not the median of its samples"):
        read_raw(_written(tmp_path, rec))
    rec = ok_record("a", POINT, {"period_us": [1.0, 2.0, 3.0]})
    rec["summary"]["kernel_us"] = rec["summary"]["period_us"]
    with pytest.raises(RawResultError, match="summary 'kernel_us' has no samples to come from"):
        read_raw(_written(tmp_path, rec))


def test_a_failed_record_without_a_reason_says_so():
    assert failed_record("a", POINT, "")["error"] == "unknown error"


def test_a_point_id_is_its_records_or_its_configurations(tmp_path):
    rec = drain_record()
    rec["point"]["id"] = "drain/K=33/V=4194304"
    with pytest.raises(RawResultError, match="point id 'drain/K=33/V=4194304' is neither"):
        read_raw(write_as_is(tmp_path, measured_doc([rec])))


def test_a_share_named_in_words_must_be_the_points(tmp_path):
    from fixtures import megamoe_configs

    config = megamoe_configs()[0]
    point = {k: v for k, v in config.items() if k != "id"}
    rid = f"{config['id']}/f=natural/expert_wave"
    point = {**point, "schedule": "expert_wave"}
    rec = ok_record(rid, point, {"time_us": [10.0, 11.0, 12.0]})
    read_raw(write_as_is(tmp_path, measured_doc([rec], "megamoe")))  # natural: no share set
    rec["point"]["remote_fraction"] = 0.5
    with pytest.raises(RawResultError, match="the id names f=natural but the point has"):
        read_raw(write_as_is(tmp_path, measured_doc([rec], "megamoe")))


@pytest.mark.parametrize(
    "env_edit, fine",
    [
        ({"simulated": True}, True),  # a model's output, whatever its backend says
        ({"device_type": "cpu"}, True),  # a CPU test of the harness
        ({}, False),
    ],
    ids=["simulated", "cpu", "gpu"],
)
def test_only_a_file_measured_on_a_gpu_is_held_to_its_bounds(tmp_path, env_edit, fine):
    path = write_as_is(
        tmp_path, measured_doc([drain_record(scale=1e6)], env={**GPU_ENV, **env_edit})
    )
    if fine:
        read_raw(path)
    else:
        with pytest.raises(RawResultError, match="above"):
            read_raw(path)


@pytest.mark.parametrize(
    "links, rate, bound",
    [
        # the fastest recorded link bounds the path (one GPU's x8, another's x16)
        ([{"line_rate_GBps": 31.5}, {"line_rate_GBps": 63.0}], 66.0, "(63 GB/s)"),
        # Grace Hopper's chip-to-chip link records no PCIe rate
        ([{"kind": "nvlink-c2c"}], 472.0, "NVLink-C2C line rate (450 GB/s)"),
    ],
    ids=["fastest-link", "nvlink-c2c"],
)
def test_the_host_path_is_bounded_by_its_fastest_link(tmp_path, links, rate, bound):
    point = drain_point(dest=["host"])
    env = {**GPU_ENV, "host_links": links}
    fine = ok_record(point["id"], point, {"bandwidth_GBps": [rate * 0.95] * 3})
    read_raw(write_as_is(tmp_path, measured_doc([fine], env=env)))
    absurd = ok_record(point["id"], point, {"bandwidth_GBps": [rate * 1.01] * 3})
    with pytest.raises(RawResultError, match=re.escape(bound)):
        read_raw(write_as_is(tmp_path, measured_doc([absurd], env=env)))


def test_tflops_per_precision_are_held_to_the_peak_too(tmp_path):
    from fixtures import megamoe_configs

    config = megamoe_configs()[0]
    point, rid = {**config, "schedule": "expert_wave"}, f"{config['id']}/expert_wave"
    extra = {"tflops": 900.0, "gemm_tflops": {"fp8": 9e6}}
    rec = ok_record(rid, point, {"time_us": [10.0, 11.0, 12.0]}, extra=extra)
    with pytest.raises(RawResultError, match=r"extra 'gemm_tflops.fp8' is 9e\+06 TFLOP/s"):
        read_raw(write_as_is(tmp_path, measured_doc([rec], "megamoe")))


@pytest.mark.parametrize(
    "claim, named",
    [
        ({"simulated": True}, "environment.simulated is true"),
        ({"gpus": []}, "environment.gpus is empty"),
    ],
    ids=["simulated", "no-gpus"],
)
def test_a_reference_file_that_says_it_was_not_measured_is_refused(
    tmp_path, monkeypatch, capsys, claim, named
):
    """Issue 54: samples times 10^6 with `simulated: true` (or no GPUs) passed `xstage
    check` and the reference's check, and were fitted as R = 5.1e7 GB/s."""
    from xstage_bench.data import origins

    dataset = tmp_path / "results" / "ref-x"
    path = dataset / "raw" / "microbench" / "drain.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(measured_doc([drain_record(scale=1e6)], env={**GPU_ENV, **claim})))
    read_raw(path)  # in no reference: a model's output or a test, not bounded
    config = tmp_path / "config.yaml"
    config.write_text(f"extends: {ROOT / 'config.yaml'}\ndatasets: {{reference: [ref-x]}}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", str(path)]) == 2
    said = capsys.readouterr().err
    assert f"{named}, but dataset 'ref-x' is a reference (config key 'datasets.reference')" in said
    with pytest.raises(RawResultError, match=re.escape(named)):
        origins.check_listing(dataset)  # the pipeline's check of a reference


def test_an_ok_record_with_no_samples_at_all_is_refused(tmp_path, capsys):
    """Issue 54: `samples: {}` passed where an empty list was refused."""
    rec = ok_record("a", POINT, {"period_us": [1.0]})
    rec["samples"], rec["summary"] = {}, {}
    path = write_as_is(tmp_path, doc([rec]))
    assert main(["check", str(path)]) == 2
    assert "record 'a': status 'ok' with no samples" in capsys.readouterr().err


def _schema_mutations(d: dict):
    """Documents that each break the raw schema in one way."""
    rec = d["records"][0]
    yield {**d, "schema": 2}
    yield {k: v for k, v in d.items() if k != "environment"}
    yield {**d, "extra": 1}
    for edit in (
        {"status": "bogus"},
        {"status": "failed"},  # no error text
        {"summary": None},
        {"samples": {"t_us": "many"}},
        {"id": 7},
        {"point": []},
    ):
        yield {**d, "records": [{**rec, **edit}, *d["records"][1:]]}
    yield {**d, "records": [{k: v for k, v in rec.items() if k != "samples"}]}


def test_the_fast_schema_check_agrees_with_jsonschema():
    """read_raw decides validity with the schema compiled by fastjsonschema (draft-07, $defs
    renamed) and asks jsonschema (2020-12) only for a refused document: the two must agree on
    valid documents, on each mutation, and on the committed references' files, and the
    schema must use no keyword whose meaning differs between the drafts."""
    import jsonschema

    from xstage_bench.data import results

    schema = results.raw_schema()
    slow = jsonschema.Draft202012Validator(schema)
    fast = results._schema_accepts()

    def fast_ok(document) -> bool:
        try:
            fast(document)
            return True
        except Exception:
            return False

    valid = doc([ok_record("a", POINT, {"t_us": [1.0, 2.0]}), failed_record("b", POINT, "x")])
    documents = [valid, *_schema_mutations(valid)]
    committed = sorted((ROOT / "results").glob("ref-*/raw/microbench/*.json"))[:4]
    documents += [json.loads(p.read_text()) for p in committed]
    verdicts = [(fast_ok(d), slow.is_valid(d)) for d in documents]
    assert all(f == s for f, s in verdicts), verdicts
    assert sum(s for _, s in verdicts) == 1 + len(committed)  # each mutation is refused
    assert results.schema_errors(valid) == []
    assert results.schema_errors(documents[1])  # jsonschema's errors, which name the field

    def keywords(node):
        if isinstance(node, dict):
            yield from node
            for value in node.values():
                yield from keywords(value)
        elif isinstance(node, list):
            for value in node:
                yield from keywords(value)

    differ = {"prefixItems", "dependentSchemas", "unevaluatedProperties", "$dynamicRef"}
    assert not differ & set(keywords(schema))


def test_a_file_read_once_is_checked_again_when_its_bytes_change(tmp_path):
    """read_raw skips the checks of a content it already passed in this process: an edit,
    even one that keeps the size, is a new content, checked again and refused; and a pass
    as a plain file is no pass as a reference's (which must hold GPU runs)."""
    path = tmp_path / "once.json"
    d = doc([ok_record("a", POINT, {"t_us": [1.0, 2.0]})])
    path.write_text(json.dumps(d))
    size = path.stat().st_size
    assert read_raw(path) == read_raw(path)
    path.write_text(json.dumps(d).replace('"status": "ok"', '"status": "no"'))
    assert path.stat().st_size == size
    with pytest.raises(RawResultError, match="status"):
        read_raw(path)
    path.write_text(json.dumps(d))
    read_raw(path)
    with pytest.raises(RawResultError, match="ref-x"):
        read_raw(path, reference="ref-x")
