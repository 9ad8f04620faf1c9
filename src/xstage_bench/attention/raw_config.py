"""What an attention raw file records as its config, beyond the run's own: the store paths
measured, which kernel ran our backend, and what the pairing and the host path's modes and
clocks are; and sweep.run_sweep's refresh rule, which makes a finished sweep measure the
points paired with a backend again when the kernel that ran it changes.
"""

from __future__ import annotations

from xstage_bench.data import storepath
from xstage_bench.measurement.sweep import Refresh, records_refresh

TL_KERNEL = {"kernel": "tl", "source": "kernels/xstage_kernels/flash_ulysses.py"}


def kernels_that_ran(device_type: str) -> dict:
    """Which kernel ran our backend ('triton'); each record's extra.triton_config says it per
    point. A backend's entry changes only when its kernel or its launch options do, and a
    finished sweep then measures its pairing groups again (kernel_refresh)."""
    from xstage_kernels import flash_ulysses, flash_ws, tma

    if device_type != "cuda" or flash_ulysses.attention_kernel() == "tl":
        return {"triton": TL_KERNEL}
    if not tma.first_gpu_runs_warpgroup_mma():  # not a Hopper GPU: launch_config picks tl
        return {"triton": TL_KERNEL}
    return {
        "triton": {
            "kernel": "ws",
            "source": "kernels/xstage_kernels/flash_ws.py (Gluon, warp-specialized: one TMA "
            "producer warp, two math warpgroups of 64 query rows)",
            "where": "S a multiple of 128, contiguous q/k/v, head_dim 64 or 128; "
            "else kernels/xstage_kernels/flash_ulysses.py",
            "launch": "a call with the last call's arguments reuses its compiled kernel and "
            "TMA descriptors",
            "launch_options": flash_ws.launch_options(),
        }
    }


def kernel_refresh(previous: dict, config: dict) -> Refresh | None:
    """sweep.run_sweep's refresh rule: when two raw configs differ only in the kernel that
    ran some backends, the points of every pairing group holding one of them are stale, the
    other backends' included: they are timed in the same rounds (points.pairing_group), so
    a ratio across backends (ours over FA3) compares one run's paired samples. Every group
    holds every backend of the config. Raw files written before `kernels` existed ran the tl
    kernel."""
    timed_together = set(config["attention"]["backends"])
    return records_refresh(
        previous,
        config,
        lambda cfg: (cfg, cfg.pop("kernels", {"triton": TL_KERNEL})),
        lambda point, changed: bool(timed_together & set(changed)),
        prefix="the backends timed in the same rounds as ",
    )


PAIRED_DEFINITION = (
    "the backends and modes of one (path, P, heads, S) are checked, then timed together in "
    "rounds (timing.measure_paired): sample i of each from round i; extra.paired.group is "
    "the same for the records of one timing and unique to it"
)


HOST_LEAD_DEFINITION = (
    "each timed call starts with the GPU busy: a sleep kernel before the ranks' start "
    "barrier lasts twice the longest recent enqueue plus 50 us (timing.HostLead), so the "
    "clocks time GPU work; extra.host_enqueue_us is rank 0's median enqueue of one call, "
    "extra.gpu_waited_for_host how many of its extra.host_lead_calls found the start "
    "event already passed (the GPU may have idled)"
)


def raw_config(config: dict, device_type: str, paths: list[str]) -> dict:
    """What the raw file records as its config: the run's config with the store paths it
    measured, which kernel ran our backend, and what the pairing and (where measured) the
    host path's modes and clocks are (attention/host.py)."""
    from xstage_bench.attention.host import DEFINITIONS

    definitions = {"paired": PAIRED_DEFINITION}
    if config["attention"].get("host_lead"):
        definitions["host lead"] = HOST_LEAD_DEFINITION
    if storepath.HOST in paths:
        definitions.update(DEFINITIONS)
    return {
        **config,
        "store_paths": list(paths),
        "kernels": kernels_that_ran(device_type),
        "definitions": definitions,
    }
