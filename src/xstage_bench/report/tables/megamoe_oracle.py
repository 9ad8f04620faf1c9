"""tab-megamoe's section on where the schedule is decided: each device-decided arm of our
kernel against the same schedule run from the host-built list (its oracle arm, timed in
the same paired rounds: megamoe.oracle_arms).

The device rule reads no clock: each claimed position's tile follows from the routing's
layout (interleaved counted: a row block's Linear-2 tiles right before the first block that
starts lead_rows after it, a program that takes one waiting until the block is ready). The
host list was played ahead with the tiles' FLOP costs, an oracle no layer could afford per
batch. The ratio says what the device rule costs or gains: oracle time over device time,
above 1 the device rule faster.
"""

from __future__ import annotations

import pandas as pd

from xstage_bench.data import storepath
from xstage_bench.data.grid import DEVICE, decided_on, fraction_label
from xstage_bench.report.analysis import megamoe

DEVICE_OVER_ORACLE = "device rule over the host list (oracle time / device time)"


def _ok_timed(record: dict) -> bool:
    samples = record.get("samples") or {}
    return record["status"] == "ok" and bool(samples.get(megamoe.LAYER.sample))


def oracle_pairs(doc: dict) -> pd.DataFrame:
    """One row per oracle arm with an ok device-decided counterpart (same configuration,
    schedule and lead): its path, share, schedule and megamoe.ratio_columns(oracle, device)."""
    device: dict[tuple, dict] = {}
    oracles = []
    for record in doc["records"]:
        point = record["point"]
        if not megamoe.is_ours(point) or not _ok_timed(record) or point.get("lead_sweep"):
            continue
        if point.get("oracle"):
            oracles.append(record)
        elif decided_on(point) == DEVICE:
            device[(megamoe.megamoe_config_key(point), point["schedule"])] = record
    rows = []
    for oracle in oracles:
        point = oracle["point"]
        mine = device.get((megamoe.megamoe_config_key(point), point["schedule"]))
        if mine is None:
            continue
        rows.append(
            {
                "path": storepath.point_path(point),
                "remote_fraction": fraction_label(point.get("remote_fraction")),
                "schedule": point["schedule"],
                "config": megamoe.megamoe_config_key(point),
                **megamoe.ratio_columns(oracle, mine),
            }
        )
    return pd.DataFrame(rows)


def oracle_note() -> str:
    return (
        f"{DEVICE_OVER_ORACLE}: per configuration the oracle arm's median time over the "
        "device-decided arm's (paired rounds), summarised like the speedups above; wins: the "
        "device rule faster (CI above 1). Device-decided: every claim is one atomic add, as "
        "the list's, and its tile follows from the position and the routing's layout "
        "(interleaved counted: a row block's Linear-2 tiles right before the first block "
        "lead_rows after it, whether or not it is ready then; xstage_kernels.megamoe); "
        "oracle: the host-built tile list (schedule.py), played ahead with the tiles' FLOP "
        "costs."
    )
