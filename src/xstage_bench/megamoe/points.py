"""The MegaMoE sweep's points: per configuration of the grid (grid.megamoe_points), our
kernel's schedules and the baselines, as `megamoe.variants` asks; the traced
configurations; the sampled tokens every check compares; the grid restricted by name.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xstage_bench.megamoe import schedule
from xstage_bench.megamoe.baselines import VARIANTS
from xstage_bench.megamoe.routing import LOCAL_CONTROL

CPU_PROGRAMS = 3  # persistent programs per rank under the Triton interpreter
POINT_TIMEOUT_S = 600.0  # spins are bounded in the kernel; this is only a last resort
CHECK_TOKENS = 32  # tokens of every home rank compared with the reference


def expand_schedules(points: list[dict], schedules: Sequence[str]) -> list[dict]:
    """One point per (configuration, schedule); id '<config id>/<schedule>'."""
    return [{**p, "schedule": s, "id": f"{p['id']}/{s}"} for p in points for s in schedules]


def expand_points(points: list[dict], megamoe: dict) -> list[dict]:
    """Per configuration, in this order so that they share its inputs: our kernel's
    schedules, the unfused pipeline, DeepGEMM's schedules, FlashInfer (natural routing
    only: it runs its own schedule and dispatch, so rows re-homed to a remote fraction
    mean nothing to it), the GEMM ceiling (natural routing only: it does not depend on
    where rows go), as `megamoe.variants` asks."""
    variants = megamoe.get("variants", list(VARIANTS))
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown megamoe variant(s) {unknown}; known: {list(VARIANTS)}")
    out = []
    for p in points:
        if "ours" in variants:
            out += expand_schedules([p], megamoe["schedules"])
        if "unfused" in variants:
            out.append(
                {**p, "variant": "unfused", "schedule": "unfused", "id": f"{p['id']}/unfused"}
            )
        if "deepgemm" in variants:
            out += [
                {**p, "variant": "deepgemm", "schedule": s, "id": f"{p['id']}/deepgemm/{s}"}
                for s in megamoe["schedules"]
            ]
        if "flashinfer" in variants and "remote_fraction" not in p:
            out.append(
                {
                    **p,
                    "variant": "flashinfer",
                    "schedule": "flashinfer",
                    "id": f"{p['id']}/flashinfer",
                }
            )
        if "gemm_ceiling" in variants and "remote_fraction" not in p:  # routing-blind
            out.append(
                {
                    **p,
                    "variant": "gemm_ceiling",
                    "schedule": "gemm_ceiling",
                    "id": f"{p['id']}/gemm_ceiling",
                }
            )
    return out


def trace_points(points: list[dict], tokens: int | None = None) -> list[dict]:
    """The traced configurations: per shape, W8A8 (else the first precision), skewed
    routing (else the first), the fewest tokens (or `tokens`); each under expert waves,
    interleaved and the local-store control (expert waves, every store local)."""
    if not points:
        return []
    want = tokens if tokens is not None else min(p["tokens_per_rank"] for p in points)

    def preference(p: dict) -> tuple[bool, bool]:
        return (p["precision"] != "w8a8", p["routing"] != "skewed")

    chosen: dict[str, dict] = {}
    for p in points:
        if p["tokens_per_rank"] == want and (
            p["shape"] not in chosen or preference(p) < preference(chosen[p["shape"]])
        ):
            chosen[p["shape"]] = p
    out = []
    for p in chosen.values():
        for variant in (*schedule.COMPARED, LOCAL_CONTROL):
            sched = schedule.WAVE if variant == LOCAL_CONTROL else variant
            out.append({**p, "schedule": sched, "variant": variant, "id": f"{p['id']}/{variant}"})
    return out


def sampled_tokens(T: int, check_tokens: int, world_size: int, seed: int) -> list[np.ndarray]:
    """The home tokens of every rank whose outputs are checked against the reference."""
    rng = np.random.default_rng(seed)
    n = min(T, check_tokens)
    return [np.sort(rng.choice(T, n, replace=False)) for _ in range(world_size)]


def config_id(point: dict) -> str:
    """The grid id of a point's configuration (its id less the variant and schedule:
    '<config>/<schedule>', '<config>/deepgemm/<schedule>', '<config>/flashinfer')."""
    return point["id"].rsplit("/", 2 if point.get("variant") == "deepgemm" else 1)[0]


def select(
    megamoe: dict, shapes=None, precisions=None, routings=None, tokens=None, variants=None
) -> dict:
    """The megamoe config restricted to the named shapes, precisions, routings, tokens and
    variants (ours, unfused, deepgemm, flashinfer, gemm_ceiling)."""
    moe = dict(megamoe)
    if variants:
        moe["variants"] = list(variants)
    if shapes:
        known = {s["name"] for s in megamoe["shapes"]}
        unknown = sorted(set(shapes) - known)
        if unknown:
            raise ValueError(f"unknown megamoe shape(s) {unknown}; config has {sorted(known)}")
        moe["shapes"] = [s for s in megamoe["shapes"] if s["name"] in shapes]
    if precisions:
        moe["precisions"] = list(precisions)
    if routings:
        moe["routings"] = list(routings)
    if tokens:
        moe["tokens_per_rank"] = [int(t) for t in tokens]
    return moe
