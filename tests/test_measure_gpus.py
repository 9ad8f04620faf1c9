"""Which GPUs a measuring job measures on: the config's gpu_ids, made the only GPUs the job
(and its workers) can see, before anything initializes CUDA."""

from __future__ import annotations

import contextlib
import importlib.util

import pytest

from xstage_bench import measure


def test_the_job_sees_exactly_its_gpus():
    assert measure.visible_devices([2, 3], None) == "2,3"
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES='' shows 0 GPU"):
        measure.visible_devices([0], "")  # set but empty: CUDA shows no GPU
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


def test_a_job_locks_the_machine_s_gpus_under_a_scheduler_s_share(monkeypatch, tmp_path):
    """A scheduler left GPUs 4-7 of a node visible and the config names 0 and 1: the job
    measures on GPUs 4 and 5 and locks those, not GPUs 0 and 1 (another run's, given the
    other half of the node, which locks 0 and 1 for its own)."""
    ran = {}
    monkeypatch.setattr(measure, "_run", lambda exp, cfg, args, ids: ran.update(ids=ids))
    monkeypatch.setattr(
        "xstage_bench.run.joblog.measuring_job",
        lambda log, ids, lock: contextlib.nullcontext(ran.update(locked=ids)),
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    out = str(tmp_path / "raw" / "attention.json")
    argv = ["attention", "--config-json", "{}", "--dataset", "h200x8", "--out", out]
    assert measure.main([*argv, "--gpu-ids", "0,1"]) == 0
    assert ran == {"ids": [0, 1], "locked": [4, 5]}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa,GPU-bbb")
    assert measure.main([*argv, "--gpu-ids", "1"]) == 0
    assert ran == {"ids": [0], "locked": ["GPU-bbb"]}


@pytest.mark.parametrize(
    "experiment, runner",
    [
        ("attention", "attention.runner"),
        pytest.param(
            "megamoe_per_gpu",
            "megamoe.distributed",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("triton") is None, reason="triton not installed"
            ),
        ),
    ],
)
def test_the_workers_of_a_job_see_the_gpus_the_job_was_given(
    monkeypatch, tmp_path, experiment, runner
):
    """A scheduler left GPUs 4-7 of an 8-GPU node visible, and the config names its GPUs 0
    and 1 (CUDA's numbers there): the job sees physical GPUs 4 and 5, and so must the
    one-process-per-GPU workers it spawns (they once saw the config's ids again, as
    physical GPUs 0 and 1: GPUs of another job)."""
    import json

    from xstage_bench.data.config import load_config

    seen = {}
    monkeypatch.setattr(
        f"xstage_bench.{runner}.launch",
        lambda *a, **k: seen.update(visible=measure.os.environ["CUDA_VISIBLE_DEVICES"]),
    )
    monkeypatch.setattr(
        "xstage_bench.run.joblog.measuring_job", lambda log, ids, lock: contextlib.nullcontext()
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    config = {**load_config(measure.Path(__file__).parents[1] / "config.yaml"), "world_size": 2}
    config["gpu_ids"] = [0, 1]
    out = str(tmp_path / "raw" / f"{experiment}.json")
    argv = [experiment, "--config-json", json.dumps(config), "--dataset", "h200x8"]
    assert measure.main([*argv, "--out", out, "--gpu-ids", "0,1"]) == 0
    assert seen == {"visible": "4,5"}
