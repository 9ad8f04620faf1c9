"""The refit hardware profile (model/profile.yaml): the base profile with one store
path's fitted T0, R and capacity law (S as capacity_bytes, q as
capacity_per_producer_bytes, a ceiling C as capacity_ceiling_bytes) in place of its own,
for the simulator to run on.

This module exists because the profile is a second product of the fit, in the hardware
profiles' YAML and not the model file's JSON, with its own header and notes.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from xstage_bench.data import storepath
from xstage_bench.data.hardware import load_profile
from xstage_bench.model.stages import Params


def profile_yaml(
    p: Params,
    dataset: str,
    sources: list[str],
    base_path: str | None,
    sm_count: int | None,
    path: str = storepath.PEER,
) -> str:
    """A hardware profile with the fitted parameters of one store path; what was not
    fitted says so. A host-path profile keeps the base profile's NVLink line rate (the
    simulator's peer link): its drain path is host memory, and its header says so."""
    fitted = {
        "t0_fixed_us": None if p.t0_fixed is None else round(p.t0_fixed, 4),
        "issue_rate_per_sm_GBps": None if p.issue_rate is None else round(p.issue_rate / 1e3, 2),
        "drain_rate_GBps": None if p.R is None else round(p.R / 1e3, 2),
        "capacity_bytes": None if p.capacity is None else round(p.capacity.S),
        "capacity_per_producer_bytes": None if p.capacity is None else round(p.capacity.q),
    }
    base = load_profile(base_path).as_dict() if base_path else {}
    names = ", ".join(Path(s).name for s in sources)
    name = f"{dataset} (fitted)" if path == storepath.PEER else f"{dataset} (fitted, {path} path)"
    prof = {"name": name, "source": f"fit of {dataset}: {names}"}
    if path != storepath.PEER:
        prof["source"] += f" (store path '{path}': {storepath.far_end(path)})"
    if base_path:
        prof.update({k: v for k, v in base.items() if k not in ("name", "source")})
    elif sm_count:
        prof["sm_count"] = sm_count
    notes = []
    if p.capacity is not None or prof.get("capacity_ceiling_bytes") is None:
        prof.pop("capacity_ceiling_bytes", None)  # absent: no ceiling (the fitted law's own)
    if p.capacity is not None and p.capacity.capped:
        prof["capacity_ceiling_bytes"] = round(p.capacity.C)
    for key, value in fitted.items():
        if value is not None:
            prof[key] = value
        elif key in prof:
            notes.append(
                f"# {key}: not fitted ({p.reasons.get(_reason_key(key), '')}); "
                f"kept from {base_path}"
            )
        else:
            notes.append(f"# {key}: not fitted ({p.reasons.get(_reason_key(key), '')})")
    header = [f"# Hardware profile refitted from dataset '{dataset}' by xstage_bench.model.fit."]
    if p.capacity is not None:
        law = "capacity_bytes + K x capacity_per_producer_bytes"
        if p.capacity.capped:
            law = f"min({law}, capacity_ceiling_bytes)"
        header.append(
            f"# Capacity law Q(K) = {law} (the {p.law} variant, chosen by held-out error)."
        )
    if path != storepath.PEER:
        header.append(
            f"# Store path '{path}' ({storepath.far_end(path)}): T0, R and Q are that path's; "
            "nvlink_line_rate_GBps is the base profile's."
        )
    if not base_path:
        header.append("# No base profile: keys the fit does not give are absent.")
    return "\n".join(header + notes) + "\n" + yaml.safe_dump(prof, sort_keys=False)


def _reason_key(profile_key: str) -> str:
    return {
        "drain_rate_GBps": "R",
        "capacity_bytes": "Q",
        "capacity_per_producer_bytes": "Q",
    }.get(profile_key, "T0")
