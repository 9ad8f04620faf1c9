"""What this machine can measure (measurement/machine.py): the GPUs a config asks for are
checked when the run is planned, against what CUDA shows here."""

from __future__ import annotations

from xstage_bench.measurement.machine import GpuProbe, asked_gpus_problem, dataset_name

ONE_H200 = GpuProbe(["NVIDIA H200"], False, "one GPU: the peer path needs a second GPU")
TWO_H200 = GpuProbe(["NVIDIA H200"] * 2, True, "")


def test_a_run_asking_for_more_gpus_than_cuda_shows_stops_naming_the_key():
    assert asked_gpus_problem(ONE_H200, 1, [0], None) is None
    assert asked_gpus_problem(TWO_H200, 2, [0, 1], "") is None
    assert asked_gpus_problem(ONE_H200, 4, [0, 1, 2, 3], None) == (
        "config key 'gpu_ids': GPU 3 does not exist: this machine shows 1 GPU(s)"
    )
    assert asked_gpus_problem(TWO_H200, 2, [5, 6], None).startswith(
        "config key 'gpu_ids': GPU 6 does not exist"
    )
    # a world size alone (gpu_ids derived from it are checked the same way)
    assert asked_gpus_problem(TWO_H200, 4, [], None) == (
        "config key 'world_size': 4 GPUs asked for, but this machine shows 2 GPU(s)"
    )
    # a scheduler's CUDA_VISIBLE_DEVICES: CUDA numbers only what it lists
    assert "CUDA_VISIBLE_DEVICES='1'" in asked_gpus_problem(TWO_H200, 1, [1], "1")
    assert asked_gpus_problem(TWO_H200, 1, [0], "1") is None


def test_datasets_are_named_by_gpu_model_and_count():
    assert dataset_name(ONE_H200.names) == "h200x1"
    assert dataset_name(["NVIDIA H200", "NVIDIA B200"]) == "mixedx2"
