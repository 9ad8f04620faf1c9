"""Deliberate faults: off by default, parsed strictly, matched by point id."""

import pytest

from xstage_bench.measurement import faults


def test_off_by_default(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    assert not faults.injected("wrong", "gap_sweep/K=132/V=1/gap_us=10/")
    faults.apply_before_measure("anything")  # neither raises nor hangs


def test_faults_match_by_id_substring(monkeypatch):
    monkeypatch.setenv(faults.ENV, "wrong:gap_us=10/;raise:V=4194304/")
    assert faults.injected("wrong", "gap_sweep/K=132/V=1048576/gap_us=10/width=16")
    assert not faults.injected("wrong", "gap_sweep/K=132/V=1048576/gap_us=0/width=16")
    with pytest.raises(RuntimeError, match="injected fault"):
        faults.apply_before_measure("drain/K=33/V=4194304/gap_us=0")


def test_malformed_spec_is_named(monkeypatch):
    monkeypatch.setenv(faults.ENV, "explode:K=33")
    with pytest.raises(ValueError, match="XSTAGE_INJECT_FAULT: 'explode:K=33'"):
        faults.injected("wrong", "x")


def test_a_crash_ends_the_process_with_its_own_exit_code(monkeypatch):
    import subprocess
    import sys

    monkeypatch.setenv(faults.ENV, "crash:K=33/")
    code = (
        "from xstage_bench.measurement import faults; faults.apply_before_measure('drain/K=33/V=1')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == faults.CRASH_EXIT_CODE
    assert "crash at drain/K=33/V=1" in done.stderr
