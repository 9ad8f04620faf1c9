"""The attention sweep's points in the order they run, and the pairing groups they are
timed in: every backend and mode of one (store path, P, shape) is checked, then timed
together in paired rounds (rank.py), so the points of a group run one after another and
each shape's buffers are built once. Which store paths a run measures is decided here too.
"""

from __future__ import annotations

from xstage_bench.data import storepath
from xstage_bench.data.grid import attention_points

PATH_ORDER = {storepath.PEER: 0, storepath.HOST: 1}


def ordered_points(
    attention: dict, world_size: int, paths: tuple[str, ...] | list[str] = (storepath.PEER,)
) -> list[dict]:
    """The sweep's points, grouped by setting and shape (`pairing_group`) so each shape's
    buffers are built once and each group's arms are measured together."""
    points = attention_points(attention, world_size, paths)
    backends = {b: i for i, b in enumerate(attention["backends"])}
    modes = {m: i for i, m in enumerate(attention["modes"])}
    return sorted(
        points,
        key=lambda p: (
            PATH_ORDER[storepath.point_path(p)],
            p.get("emulated_world_size", 0),
            p["heads"],
            p["seq_len"],
            backends[p["backend"]],
            modes[p["mode"]],
        ),
    )


def pairing_group(point: dict) -> tuple:
    """The points timed together in paired rounds: every backend and mode of one store
    path, P and shape."""
    return (
        storepath.point_path(point),
        point.get("emulated_world_size", point["world_size"]),
        point["heads"],
        point["seq_len"],
        point["head_dim"],
        point["batch"],
    )


def arm_name(point: dict) -> str:
    """A point's arm in its pairing group: backend/mode."""
    return f"{point['backend']}/{point['mode']}"


def compared_ratios(arms) -> list[tuple[str, str]]:
    """What tab-ulysses compares among a group's arm names, as timing.measure_paired's
    `ratios`: each backend's serial time over its fused time."""
    return [
        (f"{b}/serial", f"{b}/fused")
        for b in dict.fromkeys(a.split("/")[0] for a in arms)
        if f"{b}/serial" in arms and f"{b}/fused" in arms
    ]


def measured_paths(config: dict, world_size: int) -> list[str]:
    """The store paths this run measures: config["store_paths"] as the Snakefile resolved
    it, or `auto` resolved here (a runner started by hand)."""
    return storepath.resolve(config.get("store_paths", storepath.AUTO), world_size)
