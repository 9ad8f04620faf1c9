"""The kernel A/B tool (xstage_bench.megamoe.kernel_ab) without a GPU: its option parsing
names what is wrong, and a run under the Triton interpreter checks every value before it
times them in paired rounds and writes each ratio with its CI. The interpreter runs the
tl kernel, which reads no launch option: this pins the tool, not an option's effect."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HAVE_TRITON = all(importlib.util.find_spec(m) for m in ("torch", "triton"))
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="torch and triton not installed")
ROOT = Path(__file__).parents[1]


@needs_triton
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SKIP_PADDING_HALVES", "expected NAME=v1,v2"),
        ("STAGES=4,6", "not a launch option"),
        ("SKIP_PADDING_HALVES=yes,no", "must be integers"),
        ("SKIP_PADDING_HALVES=1", "at least two different values"),
        ("SKIP_PADDING_HALVES=1,1", "at least two different values"),
    ],
)
def test_a_bad_option_is_named(text, message):
    from xstage_bench.megamoe.kernel_ab import parse_option

    with pytest.raises(ValueError, match=message):
        parse_option(text)
    assert parse_option("SKIP_PADDING_HALVES=0,1") == ("SKIP_PADDING_HALVES", [0, 1])


@needs_triton
def test_options_every_arm_holds_are_parsed_and_checked():
    from xstage_bench.megamoe.kernel_ab import fixed_options

    assert fixed_options("") == {}
    held = fixed_options("SPLIT_CONVERTED=1,CONVERT_ROWS=64")
    assert held == {"SPLIT_CONVERTED": 1, "CONVERT_ROWS": 64}
    with pytest.raises(ValueError, match="'STAGES' is not a launch option"):
        fixed_options("STAGES=4")


def test_an_interleaved_ab_needs_a_numeric_lead():
    from xstage_bench.megamoe import kernel_ab

    moe = {"lead_rows": "auto"}
    with pytest.raises(
        ValueError, match=r"pass --lead-rows N \(the config's megamoe.lead_rows is 'auto'\)"
    ):
        kernel_ab.ab_lead(None, moe)
    with pytest.raises(ValueError, match="lead of rows >= 0"):
        kernel_ab.ab_lead(-1, moe)
    assert kernel_ab.ab_lead(512, moe) == 512 and kernel_ab.ab_lead(None, {"lead_rows": 256}) == 256


@needs_triton
def test_holding_the_compared_option_is_refused_before_any_device_is_touched(capsys, monkeypatch):
    from xstage_bench.megamoe import kernel_ab
    from xstage_bench.megamoe.ours import measurer

    def no_measurer(*args, **kwargs):
        raise AssertionError("the measurer was built before the arguments were checked")

    monkeypatch.setattr(measurer, "MoEMeasurer", no_measurer)

    config = str(ROOT / "config" / "ci-measure.yaml")
    argv = ["--config", config, "--dataset", "ab-test", "--device", "cpu", "--out", "unused"]
    argv += ["--option", "GATE_BF16=0,1", "--set", "GATE_BF16=1"]
    with pytest.raises(SystemExit) as stop:
        kernel_ab.main(argv)
    assert stop.value.code == 2
    assert "--set GATE_BF16: that is the option compared" in capsys.readouterr().err


def test_interleaved_ab_points_carry_their_lead_and_where_they_are_decided():
    """--schedule interleaved --lead-rows N: every configuration's point is interleaved at
    that lead, decided on the device with --decided-on device (the CPU run below covers the
    expert waves end to end; an interleaved launch differs only in the rule, which
    test_device_schedule.py runs under the interpreter)."""
    from xstage_bench.data.config import load_config
    from xstage_bench.megamoe import kernel_ab

    moe = load_config(ROOT / "config" / "ci-measure.yaml")["megamoe"]
    points = kernel_ab.local_configs(moe, 2, ["peer", "host"], "device", "interleaved", 128)
    assert [p["path"] for p in points] == ["peer", "host"]
    for p in points:
        assert p["schedule"] == "interleaved" and p["id"].endswith("/interleaved")
        assert p["lead_rows"] == 128 and p["decided_on"] == "device"
    waves = kernel_ab.local_configs(moe, 2, ["peer", "host"])
    assert all(p["schedule"] == "expert_wave" and "lead_rows" not in p for p in waves)


@needs_triton
@pytest.mark.parametrize("decided_on", [None, "device"])
def test_a_cpu_run_checks_each_value_then_times_them_paired(tmp_path, decided_on):
    """Without --decided-on the expert waves run from the host's lists, as before the flag;
    with --decided-on device every point is decided by the kernel's programs (device mode,
    its realized order checked with the outputs). The interpreter's kernel reads no launch
    option, so one option serves both."""
    out = tmp_path / "ab.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    where = ["--decided-on", decided_on] if decided_on else []
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "xstage_bench.megamoe.kernel_ab",
            "--config",
            "config/ci-measure.yaml",
            "--dataset",
            "ab-test",
            "--device",
            "cpu",
            *where,
            "--option",
            "SKIP_PADDING_HALVES=0,1",
            "--set",
            "TILE_MAJOR_WEIGHTS=0",
            "--min-reps",
            "4",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["environment"]["device_type"] == "cpu" and doc["values"] == [0, 1]
    env = doc["environment"]  # finished_at was the start time in every record before
    assert env["finished_at"] > env["started_at"]
    assert doc["fixed"] == {"TILE_MAJOR_WEIGHTS": 0}
    # ci-measure's one configuration on both store paths of two ranks, every row local
    assert [r["point"]["path"] for r in doc["results"]] == ["peer", "host"]
    for result in doc["results"]:
        assert result["point"]["schedule"] == "expert_wave"
        if decided_on:
            assert result["point"]["decided_on"] == decided_on
        else:
            assert "decided_on" not in result["point"]
        assert result["point"].get("remote_fraction", 0.0) == 0.0
        # 32 tokens x top-2 over 8 experts and 2 ranks: 16 rows an expert, half a block
        assert result["padding_halves"] == 1.0
        for check in result["checks"].values():
            assert check["error"] is None and max(check["rel_error"]) < 0.1
        arms = result["arms"]
        assert set(arms) == {"0", "1"}
        # --min-reps 4 over the config's 3 (max_reps raised with it)
        assert len(arms["0"]["time_us"]) == len(arms["1"]["kernel_us"]) == 4
        (ratio,) = result["ratios"]
        assert (ratio["value"], ratio["over"]) == (1, 0)
        for metric in ("time_us", "kernel_us"):
            ci = ratio[metric]
            assert ci["ci_low"] <= ci["ratio"] <= ci["ci_high"]
    assert "1/0" in run.stdout and "[2/2]" in run.stdout


@needs_triton
def test_the_staged_script_compares_real_options_that_are_still_off():
    """kernels/ab/staged.sh is what the next GPU session runs first: each option it names
    must be a launch option, and staged means off (0, the build as it is, against others)."""
    import re

    from xstage_kernels import megamoe_ws

    script = (ROOT / "kernels" / "ab" / "staged.sh").read_text()
    assert re.search(r"^ab\(\) \{", script, flags=re.M), "staged.sh lost its ab function"
    calls = re.findall(r"^ab .*$", script, flags=re.M)
    form = r"^ab \S+ (\S+) (\w+)=(\S+)(?: (list|device)(?: (expert_wave|interleaved))?)?$"
    staged = re.findall(form, script, flags=re.M)
    assert len(staged) == len(calls), f"not ab NAME PRECISION X=0,V.. [device [SCHEDULE]]: {calls}"
    for precision, name, values, _decided_on, _schedule in staged:
        assert precision in megamoe_ws.PRECISIONS, precision
        assert name in megamoe_ws.LAUNCH_OPTIONS, name
        first, *others = values.split(",")
        assert first == "0" and others and all(v.isdigit() for v in others), f"{name}={values}"
        assert not getattr(megamoe_ws, name), f"{name} is on already: not staged"
    for name, config in re.findall(r"^pipeline (\S+) (\S+)$", script, flags=re.M):
        from xstage_bench.data.config import load_config

        loaded = load_config(ROOT / config)  # a bad key fails here, not on the GPU machine
        assert loaded["measure"] == "always" and loaded["datasets"]["measured"], name


class _Stamp:
    def __init__(self, ms: float):
        self.ms = ms

    def elapsed_time(self, end) -> float:
        return end.ms - self.ms


class _FakeProblem:
    """What compare reads of a configuration's problem, with no kernel behind it."""

    def __init__(self):
        import numpy as np

        plan = type("Plan", (), {"block_rows": np.array([64, 128])})
        self.ranks = [type("Rank", (), {"plan": plan})]

    def arm(self, point):
        return "key"

    def forward(self, key, kernel_events, flushers):
        kernel_events.append([(_Stamp(0.0), _Stamp(0.01))])

    def useful_flops(self):
        return 1.0


class _FakeMeasurer:
    """A measurer whose check of value 1 of the compared option raises (or never returns)."""

    cuda = False
    flushers = None
    devices = ["cpu"]

    def __init__(self, *args, hang=False, **kwargs):
        from xstage_bench.measurement.timing import TimingPolicy

        self.hang = hang
        self.policy = TimingPolicy(
            warmup=0, min_reps=2, max_reps=2, target_rel_iqr=1.0, budget_s=1.0, flush_l2=False
        )

    def problem(self, point):
        return _FakeProblem()

    def check(self, point):
        from xstage_kernels import megamoe_ws

        if megamoe_ws.PREFETCH_TILE == 1:
            if self.hang:
                import time

                time.sleep(3600)  # a kernel that never ends
            raise RuntimeError("ptxas: the build does not compile")
        return None, {"rel_error": [0.01]}

    def close(self):
        pass


@needs_triton
def test_a_check_that_raises_is_a_failed_check_and_its_value_is_not_timed(monkeypatch):
    """A build whose check raises (it does not compile, or does not launch) is written down
    as a failed check and not timed; the other values are timed as usual."""
    from xstage_bench.megamoe import kernel_ab
    from xstage_kernels import megamoe_ws

    monkeypatch.setattr(megamoe_ws, "PREFETCH_TILE", megamoe_ws.PREFETCH_TILE)
    result: dict = {}
    point = {"id": "p"}
    out = kernel_ab.compare(_FakeMeasurer(), point, "PREFETCH_TILE", [0, 1], result=result)
    assert out is result and result["id"] == "p"
    assert result["checks"]["0"] == {"error": None, "rel_error": [0.01]}
    assert (
        result["checks"]["1"]["error"] == "raised RuntimeError: ptxas: the build does not compile"
    )
    assert set(result["arms"]) == {"0"} and result["ratios"] == []
    assert "FAILED 1 raised RuntimeError" in kernel_ab.summary_line(result)


_HUNG_RUN = """
import sys
from xstage_bench.megamoe import kernel_ab
from xstage_bench.megamoe.ours import measurer
sys.path.insert(0, sys.argv[1])
from test_kernel_ab import _FakeMeasurer
measurer.MoEMeasurer = lambda *a, **k: _FakeMeasurer(hang=True)
kernel_ab.main(sys.argv[2:])
"""


@needs_triton
def test_a_hung_check_is_written_down_and_ends_the_run(tmp_path):
    """A check that never returns (a deadlocked kernel) is written down, naming the step,
    after --step-timeout, and the run exits with HUNG_EXIT instead of waiting forever."""
    from xstage_bench.megamoe.kernel_ab import HUNG_EXIT

    out = tmp_path / "ab.json"
    argv = ["--config", "config/ci-measure.yaml", "--dataset", "ab-test", "--device", "cpu"]
    argv += ["--option", "PREFETCH_TILE=0,1", "--step-timeout", "2", "--out", str(out)]
    run = subprocess.run(
        [sys.executable, "-c", _HUNG_RUN, str(ROOT / "tests"), *argv],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == HUNG_EXIT, run.stderr[-3000:]
    (result,) = json.loads(out.read_text())["results"]
    assert result["hung"] == "the check of PREFETCH_TILE=1: no return after 2 s"
    assert result["checks"] == {"0": {"error": None, "rel_error": [0.01]}}
    assert "HUNG in the check of PREFETCH_TILE=1" in run.stdout
