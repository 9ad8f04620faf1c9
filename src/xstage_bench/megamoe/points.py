"""The MegaMoE sweep's points: per configuration of the grid (grid.megamoe_points), our
kernel's arms (its schedules, and the lead-sweep's interleaved leads) and the baselines,
as `megamoe.variants` asks; the traced configurations; the sampled tokens every check
compares; the grid restricted by name.

Our kernel's arms of one configuration are measured together, in paired rounds
(measurer.py): `arm_sets` groups them. An interleaved arm carries `lead_rows` (the integer
its tile list was built with) and `lead_rows_requested` (an integer or 'auto', resolved
by lead.py). `megamoe.lead_sweep` adds, for its configurations, one interleaved arm per
lead, id '<config id>/interleaved/lead=<n|auto>' with `lead_sweep: True`; their
expert-wave counterpart is the configuration's '<config id>/expert_wave' point (added,
with `lead_sweep: True`, for a configuration the main grid does not hold).

Where the schedule is decided (`megamoe.schedule_on`): with 'device' every arm carries
`decided_on: device` (the kernel's programs pick each next tile when they claim it), and
`megamoe.oracle_arms` adds per named schedule the same arm run from the host-built list,
id '<arm id>/oracle' with `oracle: True`: the side arm that says what the device rule costs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xstage_bench.data import grid, storepath
from xstage_bench.data.grid import DEVICE, LIST, LOCAL_CONTROL, ORACLE
from xstage_bench.measurement.protocol import PointFailed
from xstage_bench.megamoe import schedule
from xstage_bench.megamoe.baselines import VARIANTS
from xstage_bench.megamoe.ours.lead import LeadChooser, LeadModelError

CPU_PROGRAMS = 3  # persistent programs per rank under the Triton interpreter
POINT_TIMEOUT_S = 600.0  # spins are bounded in the kernel; this is only a last resort
CHECK_TOKENS = 32  # tokens of every home rank compared with the reference


def expand_schedules(
    points: list[dict],
    schedules: Sequence[str],
    megamoe: dict | None = None,
    leads: LeadChooser | None = None,
) -> list[dict]:
    """One point per (configuration, schedule); id '<config id>/<schedule>'. With `megamoe`,
    interleaved points carry their lead (`with_lead`), every point where its schedule is
    decided (`decided_where`), and the oracle arms follow (`oracle_arms`)."""
    out = [{**p, "schedule": s, "id": f"{p['id']}/{s}"} for p in points for s in schedules]
    if megamoe is None:
        return out
    arms = [decided_where(with_lead(p, megamoe.get("lead_rows", 0), leads), megamoe) for p in out]
    return arms + oracle_arms(arms, megamoe)


def with_lead(point: dict, requested, leads: LeadChooser | None, tflops: float | None = None):
    """An interleaved point with `lead_rows` (resolved) and `lead_rows_requested`; other
    schedules as they are. `tflops`: the compute rate `auto` assumes (default: the config's).
    An `auto` the model cannot resolve (no model file, no fit for the point's path) leaves
    the point without lead_rows and with `lead_error`: it is recorded failed with that
    reason (lead_failure), the rest of the sweep measured."""
    if point["schedule"] != schedule.INTERLEAVED:
        return point
    chooser = leads or LeadChooser(None)
    try:
        resolved = chooser.resolve(requested, point, tflops)
    except LeadModelError as e:
        return {**point, "lead_rows_requested": requested, "lead_error": str(e)}
    return {**point, "lead_rows": resolved, "lead_rows_requested": requested}


def lead_failure(point: dict) -> PointFailed | None:
    """The failure of a point whose lead could not be chosen (with_lead), else None."""
    if "lead_error" not in point:
        return None
    return PointFailed(point["lead_error"], status="failed")


def _natural(point: dict) -> bool:
    """Routing's own rows, nothing re-homed: the configuration a routing-blind baseline
    (FlashInfer, the GEMM ceiling) runs at. On the host path: the f = 0 control."""
    if storepath.point_path(point) == storepath.HOST:
        return float(point.get("remote_fraction", 0.0)) == 0.0
    return "remote_fraction" not in point


def _baseline_configs(points: list[dict]) -> list[dict]:
    """The configurations the baselines run at, as before paths: the peer path's; on a run
    without it (one GPU), the host path's f = 0 control (nothing goes to the host there, so
    a baseline, which knows no host share, computes the same problem)."""
    peer = [p for p in points if storepath.point_path(p) == storepath.PEER]
    if peer:
        return peer
    return [p for p in points if _natural(p)]


def shapes_named(megamoe: dict, sub_grid: str) -> dict[str, dict]:
    """The shapes a sub-grid of megamoe (`lead_sweep`, `emulated`) names, by name and in its
    order, from megamoe.shapes and the sub-grid's own custom_shapes; a name neither has is
    an error naming the key."""
    custom = megamoe[sub_grid].get("custom_shapes", [])
    known = {s["name"]: s for s in [*megamoe["shapes"], *custom]}
    names = megamoe[sub_grid]["shapes"]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise ValueError(
            f"config key 'megamoe.{sub_grid}.shapes': unknown shape(s) {unknown}; "
            f"megamoe.shapes and its custom_shapes have {sorted(known)}"
        )
    return {name: known[name] for name in names}


def lead_sweep_configs(megamoe: dict, world_size: int, paths: Sequence[str]) -> list[dict]:
    """The configurations of `megamoe.lead_sweep` (absent keys: the main grid's precisions
    and routings), per path, as grid.megamoe_points lays them out."""
    spec = megamoe.get("lead_sweep")
    if not spec:
        return []
    sub = {
        "shapes": list(shapes_named(megamoe, "lead_sweep").values()),
        "precisions": spec.get("precisions", megamoe["precisions"]),
        "routings": spec.get("routings", megamoe["routings"]),
        "tokens_per_rank": spec["tokens_per_rank"],
        "remote_fractions": spec["remote_fractions"],
    }
    return grid.megamoe_points(sub, world_size, paths)


def lead_label(requested) -> str:
    return str(requested)


def our_arms(
    config: dict,
    megamoe: dict,
    leads: LeadChooser | None,
    *,
    main: bool = True,
    sweep_leads: Sequence = (),
) -> list[dict]:
    """Our kernel's arms of one configuration: its schedules (main grid; the interleaved
    one at megamoe.lead_rows), then, in the lead map, one interleaved arm per swept lead
    (and its expert-wave counterpart when the main grid does not hold the configuration)."""
    if main:
        arms = expand_schedules([config], megamoe["schedules"], megamoe, leads)
    else:
        wave = {**config, "schedule": schedule.WAVE, "id": f"{config['id']}/{schedule.WAVE}"}
        arms = [decided_where({**wave, "lead_sweep": True}, megamoe)]
    for requested in sweep_leads:
        arm = {
            **config,
            "schedule": schedule.INTERLEAVED,
            "id": f"{config['id']}/{schedule.INTERLEAVED}/lead={lead_label(requested)}",
            "lead_sweep": True,
        }
        arms.append(decided_where(with_lead(arm, requested, leads), megamoe))
    return arms


def decided_where(arm: dict, megamoe: dict) -> dict:
    """The arm with `decided_on: device` when megamoe.schedule_on is 'device' (its kernel's
    programs decide each next tile); a list-decided arm carries no field, as every record
    before device schedules."""
    if megamoe.get("schedule_on", LIST) == DEVICE:
        return {**arm, "decided_on": DEVICE}
    return arm


def oracle_arms(arms: list[dict], megamoe: dict) -> list[dict]:
    """Per main-grid arm whose schedule megamoe.oracle_arms names, the same arm run from the
    host-built list (same lead), id '<arm id>/oracle', `oracle: True`."""
    wanted = megamoe.get("oracle_arms", [])
    return [
        {**a, "decided_on": LIST, "oracle": True, "id": f"{a['id']}/{ORACLE}"}
        for a in arms
        if a["schedule"] in wanted and not a.get("lead_sweep")
    ]


def expand_points(
    points: list[dict],
    megamoe: dict,
    leads: LeadChooser | None = None,
    sweep: list[dict] = (),
) -> list[dict]:
    """Per configuration, in this order so that they share its inputs: our kernel's arms
    (`our_arms`; `sweep`: the lead map's configurations, lead_sweep_configs), the unfused
    pipeline, DeepGEMM's schedules, FlashInfer (natural routing only: it runs its own
    schedule and dispatch, so rows re-homed to a remote fraction mean nothing to it), the
    GEMM ceiling (natural routing only: it does not depend on where rows go), as
    `megamoe.variants` asks; then the lead map's configurations the main grid lacks. The
    baselines run at `_baseline_configs`."""
    variants = megamoe.get("variants", list(VARIANTS))
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise ValueError(f"unknown megamoe variant(s) {unknown}; known: {list(VARIANTS)}")
    sweep_leads = (megamoe.get("lead_sweep") or {}).get("lead_rows", [])
    in_sweep = {p["id"] for p in sweep} if "ours" in variants else set()
    main_ids = {p["id"] for p in points}
    baseline_ids = {p["id"] for p in _baseline_configs(points)}
    out = []
    for p in points:
        if "ours" in variants:
            swept = sweep_leads if p["id"] in in_sweep else ()
            out += our_arms(p, megamoe, leads, sweep_leads=swept)
        if p["id"] not in baseline_ids:
            continue
        if "unfused" in variants:
            out.append(
                {**p, "variant": "unfused", "schedule": "unfused", "id": f"{p['id']}/unfused"}
            )
        if "deepgemm" in variants:
            out += [
                {**p, "variant": "deepgemm", "schedule": s, "id": f"{p['id']}/deepgemm/{s}"}
                for s in megamoe["schedules"]
                if s in schedule.COMPARED  # DeepGEMM's own two (baselines/deepgemm.py)
            ]
        if "flashinfer" in variants and _natural(p):
            out.append(
                {
                    **p,
                    "variant": "flashinfer",
                    "schedule": "flashinfer",
                    "id": f"{p['id']}/flashinfer",
                }
            )
        if "gemm_ceiling" in variants and _natural(p):  # routing-blind
            out.append(
                {
                    **p,
                    "variant": "gemm_ceiling",
                    "schedule": "gemm_ceiling",
                    "id": f"{p['id']}/gemm_ceiling",
                }
            )
    if "ours" in variants:
        for p in sweep:
            if p["id"] not in main_ids:
                out += our_arms(p, megamoe, leads, main=False, sweep_leads=sweep_leads)
    return out


def arm_sets(points: list[dict]) -> dict[str, list[dict]]:
    """Our kernel's points grouped by configuration, in list order: the arms measured
    together in paired rounds (the baselines are not among them)."""
    sets: dict[str, list[dict]] = {}
    for p in points:
        if p.get("variant") in (None, "ours"):
            sets.setdefault(config_id(p), []).append(p)
    return sets


def trace_points(
    points: list[dict],
    tokens: int | None = None,
    megamoe: dict | None = None,
    leads: LeadChooser | None = None,
) -> list[dict]:
    """The traced configurations, per path: per shape, W8A8 (else the first precision),
    skewed routing (else the first), the fewest tokens (or `tokens`), and on the host path
    the largest host share of the grid; each under expert waves, interleaved (at
    megamoe.lead_rows, when `megamoe` is given) and the local-store control (expert waves,
    every store local: on the host path that is the f = 0 control, every row on the GPU)."""
    if not points:
        return []
    want = tokens if tokens is not None else min(p["tokens_per_rank"] for p in points)

    def preference(p: dict) -> tuple[bool, bool]:
        return (p["precision"] != "w8a8", p["routing"] != "skewed")

    by_path: dict[str, list[dict]] = {}
    for p in points:
        by_path.setdefault(storepath.point_path(p), []).append(p)
    out = []
    for path, mine in by_path.items():
        if path == storepath.HOST:
            share = max(float(p.get("remote_fraction", 0.0)) for p in mine)
            mine = [p for p in mine if float(p.get("remote_fraction", 0.0)) == share]
        chosen: dict[str, dict] = {}
        for p in mine:
            if p["tokens_per_rank"] == want and (
                p["shape"] not in chosen or preference(p) < preference(chosen[p["shape"]])
            ):
                chosen[p["shape"]] = p
        for p in chosen.values():
            for variant in (*schedule.COMPARED, LOCAL_CONTROL):
                sched = schedule.WAVE if variant == LOCAL_CONTROL else variant
                traced = {**p, "schedule": sched, "variant": variant, "id": f"{p['id']}/{variant}"}
                if megamoe is not None:
                    traced = with_lead(traced, megamoe.get("lead_rows", 0), leads)
                    traced = decided_where(traced, megamoe)
                out.append(traced)
    return out


def sampled_tokens(T: int, check_tokens: int, world_size: int, seed: int) -> list[np.ndarray]:
    """The home tokens of every rank whose outputs are checked against the reference."""
    rng = np.random.default_rng(seed)
    n = min(T, check_tokens)
    return [np.sort(rng.choice(T, n, replace=False)) for _ in range(world_size)]


def config_id(point: dict) -> str:
    """The grid id of a point's configuration (its id less the variant and schedule:
    '<config>/<schedule>', '<config>/deepgemm/<schedule>', '<config>/flashinfer',
    '<config>/interleaved/lead=<n|auto>', '<config>/<schedule>/oracle')."""
    ident = point["id"].removesuffix(f"/{ORACLE}") if point.get("oracle") else point["id"]
    parts = ident.rsplit("/", 2)
    two = point.get("variant") == "deepgemm" or parts[-1].startswith("lead=")
    return ident.rsplit("/", 2 if two else 1)[0]


def trace_first_configs(points: list[dict]) -> set[str]:
    """The configuration whose traced runs keep the timeline: the first of each path."""
    first: dict[str, str] = {}
    for p in points:
        first.setdefault(storepath.point_path(p), config_id(p))
    return set(first.values())


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
        sweep = megamoe.get("lead_sweep")
        if sweep:  # the lead map keeps only the selected shapes (none left: no lead map)
            kept = [s for s in sweep["shapes"] if s in shapes]
            if kept:
                moe["lead_sweep"] = {**sweep, "shapes": kept}
            else:
                moe.pop("lead_sweep")
    if precisions:
        moe["precisions"] = list(precisions)
    if routings:
        moe["routings"] = list(routings)
    if tokens:
        moe["tokens_per_rank"] = [int(t) for t in tokens]
    return moe
