"""A changed lead map re-measures the lead map, not the whole sweep.

sweep.run_sweep keeps a finished raw file's records when its config differs from the run's
only as a refresh rule allows, and measures again the points the rule names. A MegaMoE
file's lead map (`megamoe.lead_sweep`: more leads, shares or shapes) and what `auto` read
(`lead_auto`: the rule and the path's fitted drain) change no other measurement, so
`lead_map_refresh` names our kernel's arms at every configuration the old or the new lead
map holds: they are measured again together, so that each lead's speedup over its expert
waves stays the ratio of one run's paired rounds. With a main-grid lead of `auto`, a new
fit makes every configuration's arms stale. The baselines are kept: they are never paired
with our arms (points.arm_sets).
"""

from __future__ import annotations

from collections.abc import Callable

from xstage_bench.data.grid import fraction_label
from xstage_bench.measurement.sweep import Refresh, RefreshRule, same_config
from xstage_bench.megamoe.ours.lead import AUTO

LEAD_KEYS = ("lead_sweep", "lead_auto")


def _split(raw: dict) -> tuple[dict, dict]:
    """(the raw config less the lead map and lead_auto, those two)."""
    moe = dict(raw.get("megamoe") or {})
    parts = {"lead_sweep": moe.pop("lead_sweep", None), "lead_auto": raw.get("lead_auto")}
    rest = {k: v for k, v in raw.items() if k not in LEAD_KEYS}
    rest["megamoe"] = moe
    return rest, parts


def in_lead_map(point: dict, sweep: dict, megamoe: dict) -> bool:
    """Whether the point's configuration is one of the lead map `sweep`'s (its absent keys
    are the main grid's, as points.lead_sweep_configs reads them)."""

    def axis(key: str) -> list:
        return sweep.get(key) or megamoe.get(key) or []

    shares = {fraction_label(f) for f in axis("remote_fractions")}
    return (
        point.get("shape") in axis("shapes")
        and point.get("precision") in axis("precisions")
        and point.get("routing") in axis("routings")
        and point.get("tokens_per_rank") in axis("tokens_per_rank")
        and fraction_label(point.get("remote_fraction", 0)) in shares
    )


def lead_map_refresh(previous: dict, config: dict) -> Refresh | None:
    """The refresh rule of a changed lead map (module doc); None when anything else differs."""
    rest_before, before = _split(previous)
    rest_after, after = _split(config)
    changed = [k for k in LEAD_KEYS if not same_config(before[k], after[k])]
    if not changed or not same_config(rest_before, rest_after):
        return None
    moe = rest_after["megamoe"]
    sweeps = [s for s in (before["lead_sweep"], after["lead_sweep"]) if s]
    every_config = "lead_auto" in changed and moe.get("lead_rows") == AUTO

    def stale(point: dict) -> bool:
        if point.get("variant") not in (None, "ours"):
            return False
        return (
            bool(point.get("lead_sweep"))
            or every_config
            or any(in_lead_map(point, s, moe) for s in sweeps)
        )

    what = " and ".join(changed)
    scope = "every configuration (the main lead is auto)" if every_config else "its configurations"
    return Refresh(f"the lead map changed ({what}): our kernel's arms at {scope}", stale)


def first_refresh(*rules: RefreshRule) -> Callable[[dict, dict], Refresh | None]:
    """The first rule that allows the difference (each covers one kind of change)."""

    def first(previous: dict, config: dict) -> Refresh | None:
        return next((found for r in rules if (found := r(previous, config))), None)

    return first
