"""What this machine can measure (measurement/machine.py): the GPUs a config asks for are
checked when the run is planned, against what CUDA shows here."""

from __future__ import annotations

import os

from xstage_bench.measurement.machine import GpuProbe, asked_gpus_problem, dataset_name

ONE_H200 = GpuProbe(["NVIDIA H200"], "one GPU: the peer path needs a second GPU")
TWO_H200 = GpuProbe(["NVIDIA H200"] * 2, "", no_peer=())


def test_a_run_asking_for_more_gpus_than_cuda_shows_stops_naming_the_key():
    assert asked_gpus_problem(ONE_H200, 1, [0], None) is None
    assert asked_gpus_problem(TWO_H200, 2, [0, 1], "0,1") is None
    # set but empty, it hides every GPU from CUDA
    assert "CUDA shows 0 GPU(s) here" in asked_gpus_problem(TWO_H200, 2, [0, 1], "")
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


def _machine_with(monkeypatch, tmp_path, gpus: list[tuple[str, str]], visible: str | None) -> None:
    """An nvidia-smi on PATH that lists `gpus` (every GPU of the machine, name and UUID);
    CUDA shows `shown` of them and, as CUDA does, refuses a peer query about a device it
    does not show."""
    import sys
    from types import SimpleNamespace

    shown = len(visible.split(",")) if visible else len(gpus)
    names = "\n".join(name for name, _ in gpus)
    both = "\n".join(f"{name}, {uuid}" for name, uuid in gpus)
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir(exist_ok=True)
    smi.write_text(
        f'#!/bin/sh\ncase "$*" in *name,uuid*) printf "{both}\\n";; *) printf "{names}\\n";; esac\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")

    def can_access_peer(a: int, b: int) -> int:
        if not (0 <= a < shown and 0 <= b < shown):
            raise RuntimeError("cudaErrorInvalidDevice: invalid device ordinal")
        return 1

    runtime = SimpleNamespace(deviceCanAccessPeer=can_access_peer)
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


EIGHT_H200 = [("NVIDIA H200", f"GPU-{i}a1b2c3") for i in range(8)]


def test_the_probe_is_of_the_gpus_cuda_shows_on_a_shared_node(monkeypatch, tmp_path):
    """Two of an 8-GPU node's GPUs (CUDA_VISIBLE_DEVICES=4,5): the peer check asks CUDA
    about its devices 0 and 1 only, and the count, paths and dataset are of those two."""
    from xstage_bench.measurement.machine import probe_gpus

    _machine_with(monkeypatch, tmp_path, EIGHT_H200, "4,5")
    probe = probe_gpus()
    assert (probe.count, probe.peer_access, probe.paths) == (2, True, ["peer", "host"])
    assert dataset_name(probe.names) == "h200x2"
    assert asked_gpus_problem(probe, 2, [0, 1], "4,5") is None
    assert "2 GPU(s)" in asked_gpus_problem(probe, 8, [], "4,5")

    _machine_with(monkeypatch, tmp_path, EIGHT_H200, None)
    probe = probe_gpus()
    assert (probe.count, probe.peer_access, dataset_name(probe.names)) == (8, True, "h200x8")

    _machine_with(monkeypatch, tmp_path, EIGHT_H200, "GPU-6a1")  # a UUID prefix: one GPU
    probe = probe_gpus()
    assert (probe.count, probe.paths, dataset_name(probe.names)) == (1, ["host"], "h200x1")


def test_cuda_visible_follows_cuda_numbering():
    from xstage_bench.measurement.machine import cuda_visible

    node = [("NVIDIA H200", "GPU-aaa"), ("NVIDIA B200", "GPU-bbb"), ("NVIDIA B200", "GPU-bbc")]
    assert cuda_visible(node, None) == ["NVIDIA H200", "NVIDIA B200", "NVIDIA B200"]
    assert cuda_visible(node, "2,1") == ["NVIDIA B200", "NVIDIA B200"]
    # CUDA ignores every entry from the first that names no GPU (or more than one) on
    assert cuda_visible(node, "0,7,1") == ["NVIDIA H200"]
    assert cuda_visible(node, "GPU-bbc,GPU-b") == ["NVIDIA B200"]
    assert dataset_name(cuda_visible(node, "1,2")) == "b200x2"
    assert cuda_visible(node, "") == []  # set but empty: CUDA shows no GPU


def test_an_empty_cuda_visible_devices_shows_no_gpu(monkeypatch, tmp_path):
    from xstage_bench.measurement.machine import probe_gpus

    _machine_with(monkeypatch, tmp_path, EIGHT_H200, "")
    probe = probe_gpus()
    assert probe.count == 0 and not probe.can_measure
    assert "CUDA_VISIBLE_DEVICES=''" in probe.reason


def test_peer_access_counts_only_the_pairs_of_the_gpus_a_run_uses(monkeypatch, tmp_path):
    """An 8-GPU PCIe node whose GPUs 0-3 and 4-7 sit under two CPU sockets, with peer
    access within each half only: a run on GPUs 0 and 1 measures the peer path; one on
    GPUs 0 and 7 (or on all eight) cannot, and says which pairs lack it."""
    import sys
    from types import SimpleNamespace

    from xstage_bench.measurement.machine import probe_gpus

    _machine_with(monkeypatch, tmp_path, EIGHT_H200, None)
    runtime = SimpleNamespace(deviceCanAccessPeer=lambda a, b: int(a // 4 == b // 4))
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    probe = probe_gpus()
    assert not probe.peer_access and probe.paths == ["host"]
    assert probe.peer_problem([0, 1]) is None
    assert probe.peer_problem([4, 5, 6, 7]) is None
    assert probe.peer_problem([0, 7]) == "no peer access between GPUs 0->7, 7->0"
    assert "0->4" in probe.peer_problem(list(range(8)))
    assert probe.peer_problem([3]).startswith("one GPU")
    assert TWO_H200.peer_problem([0, 1]) is None
