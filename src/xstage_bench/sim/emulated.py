"""The simulator's prediction of the compute-emulated MegaMoE, and the two side by side.

The emulated kernel (megamoe/emulated.py) keeps the real tile lists, counters and stores
and replaces each tile's MMA by a wait for its FLOPs at one program's share of an
emulated per-GPU rate X. The simulator plays the same lists with the same tile times, so
the two differ only where the model does (the store paths, and whatever else the real
kernel does: launch, clocks, the receiver side). The remote fraction f follows the
emulated run's definition: 0 is the local-store control (natural routing, every row
stored on its own GPU); a number re-homes rows (routing.py); "natural" keeps them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from xstage_bench.data import grid
from xstage_bench.data.hardware import HardwareProfile
from xstage_bench.megamoe import schedule
from xstage_bench.sim import megamoe

SCHEDULES = schedule.COMPARED
# The kernel's tiles and the config's interleaving lead and skew (config.yaml megamoe).
DEFAULT_MEGAMOE = {"block_m": 128, "block_n": 128, "lead_rows": 256, "skew_zipf": 1.2}
POINT_KEYS = ("shape", "routing", "tokens_per_rank", "world_size", "emulated_tflops")


def predict_emulated(
    point: dict,
    profile: HardwareProfile,
    tflops: float,
    num_programs: int,
    *,
    megamoe_config: dict | None = None,
    schedules: tuple[str, ...] = SCHEDULES,
) -> dict[str, float]:
    """Simulated kernel time (us) of each schedule at an emulated per-GPU rate of
    `tflops` TFLOP/s over num_programs programs, with the profile's store paths.

    point: shape, H, I, E, topk, tokens_per_rank, routing, world_size and remote_fraction
    (absent: natural). megamoe_config: block_m, block_n, lead_rows, skew_zipf (pass the
    emulated run's raw config; DEFAULT_MEGAMOE otherwise).
    """
    moe = {**DEFAULT_MEGAMOE, **(megamoe_config or {})}
    fraction = point.get("remote_fraction", grid.NATURAL)
    local = grid.is_local_control(fraction)
    routed = {**point, "remote_fraction": grid.NATURAL if local else fraction}
    return {
        name: megamoe.simulate_at_rate(
            routed,
            moe,
            profile,
            name,
            tflops=tflops,
            num_programs=num_programs,
            local_control=local,
        ).time_us
        for name in schedules
    }


def _time_us(record: dict) -> float:
    """The slowest rank's kernel where the record has it (what the simulator times),
    else time_us (which adds the barrier and the top-k combine)."""
    samples = record["samples"]
    return float(np.median(samples.get("kernel_us") or samples["time_us"]))


def compare_emulated(
    records: list[dict],
    profile: HardwareProfile,
    *,
    megamoe_config: dict | None = None,
    num_programs: int | None = None,
) -> pd.DataFrame:
    """Measured and predicted interleaved-over-expert-wave speedup per emulated point.

    One row per (shape, routing, tokens_per_rank, world_size, emulated_tflops,
    remote_fraction) with an ok record for both schedules: measured_speedup = expert-wave
    time / interleaved time (medians; kernel_us where recorded), predicted_speedup the
    same from predict_emulated, error = predicted / measured - 1. num_programs: the
    records' own (extra.num_programs), else this, else the profile's SM count.
    """
    times: dict[tuple, dict[str, float]] = {}
    points: dict[tuple, dict] = {}
    programs: dict[tuple, int] = {}
    for r in records:
        if r.get("status") != "ok" or r["point"].get("schedule") not in SCHEDULES:
            continue
        p = r["point"]
        key = (*(p[k] for k in POINT_KEYS), str(p.get("remote_fraction", grid.NATURAL)))
        times.setdefault(key, {})[p["schedule"]] = _time_us(r)
        if key not in points or p["schedule"] == schedule.INTERLEAVED:
            points[key] = p  # the interleaved point: it carries the lead its list was built with
        extra = r.get("extra") or {}
        programs[key] = extra.get("num_programs") or num_programs or profile.sm_count
    rows = []
    for key, t in times.items():
        if set(t) != set(SCHEDULES):
            continue  # a schedule failed or is missing: nothing to compare
        p = points[key]
        predicted = predict_emulated(
            p, profile, p["emulated_tflops"], programs[key], megamoe_config=megamoe_config
        )
        measured = t[schedule.WAVE] / t[schedule.INTERLEAVED]
        model = predicted[schedule.WAVE] / predicted[schedule.INTERLEAVED]
        rows.append(
            {
                **{k: p[k] for k in POINT_KEYS},
                "remote_fraction": p.get("remote_fraction", grid.NATURAL),
                "measured_speedup": measured,
                "predicted_speedup": model,
                "error": model / measured - 1.0,
            }
        )
    columns = [*POINT_KEYS, "remote_fraction", "measured_speedup", "predicted_speedup", "error"]
    return pd.DataFrame(rows, columns=columns)
