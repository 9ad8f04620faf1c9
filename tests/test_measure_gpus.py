"""Which GPUs a measuring job measures on: the config's gpu_ids, made the only GPUs the job
(and its workers) can see, before anything initializes CUDA."""

from __future__ import annotations

import contextlib

import pytest

from xstage_bench import measure


def test_the_job_sees_exactly_its_gpus():
    assert measure.visible_devices([2, 3], None) == "2,3"
    assert measure.visible_devices([0], "") == "0"
    # a scheduler's own restriction: gpu_ids number the GPUs it left visible
    assert measure.visible_devices([0, 2], "4,5,6") == "4,6"
    assert measure.visible_devices([1], "GPU-aaa,GPU-bbb") == "GPU-bbb"
    with pytest.raises(ValueError, match="config key 'gpu_ids': GPU 2 does not exist"):
        measure.visible_devices([2], "4,5")


def test_every_experiment_measures_on_the_config_s_gpus(monkeypatch, tmp_path):
    # Before, MegaMoE and attention took only the count and ran on GPUs 0..n-1 while the
    # locks were held on the GPUs the config named.
    ran = {}
    monkeypatch.setattr(measure, "_run", lambda exp, cfg, args, ids: ran.update(ids=ids))
    monkeypatch.setattr(
        "xstage_bench.run.joblog.measuring_job",
        lambda log, ids, lock: contextlib.nullcontext(ran.update(locked=ids)),
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    out = str(tmp_path / "raw" / "megamoe.json")
    common = ["--config-json", "{}", "--dataset", "h200x2", "--out", out]
    argv = ["megamoe", *common, "--trace-out", out + ".trace", "--gpu-ids", "2,3"]
    assert measure.main(argv) == 0
    assert ran == {"ids": [0, 1], "locked": [2, 3]}
    assert measure.os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert measure.main([*argv[:-1], "1"]) == 2  # GPU 1 of one visible GPU: a clear error
