"""Expand the configuration into measurement points, each with a stable id.

The id is what makes a sweep resumable: a rerun skips every id already recorded. Measured
and simulated backends expand the same grid, so their raw files line up point for point.
"""

from __future__ import annotations

import itertools
from typing import Any

from xstage_bench.data import storepath

MICROBENCH_AXES = (
    "K",
    "V",
    "gap_us",
    "width",
    "dest",
    "pattern",
    "peers",
    "sync",
    "gap_mode",
    "next_op",  # no default: only the studies that name it carry it (and its id part)
    "method",
)
STORE_ALIGN = 16  # a producer's burst is a whole number of the widest (16-byte) stores


# How a remote fraction (peer path) or host share (host path) is named in ids and tables.
NATURAL = "natural"  # remote fraction: wherever routing sends the rows


def fraction_label(fraction) -> str:
    """How a remote fraction is written in point ids and tables: 'natural' (also for an
    absent one), else the number, e.g. '0.875'."""
    return NATURAL if fraction is None or fraction == NATURAL else f"{float(fraction):g}"


# The traced run with every store local (remote fraction 0, expert waves): the variant a
# trace record names beside its schedule, and a series of the trace figures and tables.
LOCAL_CONTROL = "local_control"

# Where our kernel's schedule is decided (megamoe.schedule_on), and the id suffix of an arm
# run from the host-built list beside a device-decided one (megamoe.oracle_arms).
DEVICE, LIST = "device", "list"
ORACLE = "oracle"

# Where our timed layer starts (megamoe.layer_from): from rows dispatched once when the
# problem is built, or from home tokens, the dispatch on the GPU inside the time
# (megamoe/layer/token_dispatch.py). A record before the key started from expert rows.
EXPERT_ROWS, HOME_TOKENS = "expert_rows", "home_tokens"


def layer_from(megamoe_or_extra: dict) -> str:
    """Where a config's (or a record extra's) timed layer starts."""
    return megamoe_or_extra.get("layer_from", EXPERT_ROWS)


def side_arm(point: dict) -> bool:
    """An arm of ours the main grid's tables leave out: a lead-map arm or an oracle arm
    (each has its own table)."""
    return bool(point.get("lead_sweep") or point.get("oracle"))


def decided_on(point: dict) -> str:
    """Where a point's schedule was decided: records before device schedules, the list."""
    return point.get("decided_on", LIST)


def is_local_control(fraction) -> bool:
    """Remote fraction 0 of the emulated sweep: not rows re-homed, but the local-store
    control (natural routing, every row stored in its own rank's memory)."""
    return fraction_label(fraction) == "0"


def producer_bytes(V: int, K: int) -> int:
    """Bytes per producer (B) for a burst of about V bytes over K producers, store-aligned."""
    B = (V // K) // STORE_ALIGN * STORE_ALIGN
    if B <= 0:
        raise ValueError(f"burst of {V} bytes is too small for {K} producers")
    return B


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def microbench_points(
    microbench: dict, study: str, paths: tuple[str, ...] | list[str] = (storepath.PEER,)
) -> list[dict]:
    """Cartesian product of a study's axes over the defaults; V is rounded to K·B. A
    `dest` of `remote` becomes one point per store path in `paths` (the measured paths of
    this run; a simulated dataset's profile describes the peer path); every point names
    its `path` (`local` for the local control)."""
    spec = microbench["studies"][study]
    kind = spec["kind"]
    axes = {**{k: [v] for k, v in microbench["defaults"].items()}}
    axes.update({k: v for k, v in spec.items() if k in MICROBENCH_AXES})
    if "dest" in axes:
        axes["dest"] = storepath.destinations(axes["dest"], paths)
    axes.setdefault("gap_us", [0.0])
    if kind != "ceiling":
        axes.pop("method", None)
    else:
        axes.pop("K", None)
    names = [a for a in MICROBENCH_AXES if a in axes]
    points = []
    for values in itertools.product(*(axes[a] for a in names)):
        p = dict(zip(names, values, strict=True))
        p["kind"] = kind
        p["study"] = study
        p["gap_us"] = float(p["gap_us"])
        # The id names the requested values, so it stays stable if rounding changes.
        p["id"] = f"{study}/" + "/".join(f"{a}={_fmt(p[a])}" for a in names)
        if "dest" in p:
            p["path"] = storepath.path_of(p["dest"])
        if kind != "ceiling":
            p["B"] = producer_bytes(p["V"], p["K"])
            p["V"] = p["B"] * p["K"]
        points.append(p)
    return points


def megamoe_points(
    megamoe: dict, world_size: int, paths: tuple[str, ...] | list[str] = (storepath.PEER,)
) -> list[dict]:
    """One point per (shape, precision, routing, tokens, path, remote fraction)
    configuration, schedules inside; every point names its `path`.

    The 84 paper configurations are 7 shapes x 2 precisions x 2 routings x 3 sizes. On
    the peer path a remote fraction re-homes rows (routing.py) and ids are those of
    earlier datasets ('<shape>/<precision>/<routing>/T=<T>/P=<P>[/f=<f>]'). On the host
    path it is the host share (routing.host_tokens; 'natural' is 0, the local control:
    every row on the GPU) and ids add the path:
    '<shape>/<precision>/<routing>/T=<T>/P=<P>/path=host/f=<f>'.
    """
    fractions = megamoe.get("remote_fractions", [NATURAL])
    host_fractions = list(dict.fromkeys(0.0 if f == NATURAL else float(f) for f in fractions))
    points = []
    for shape, precision, routing, tokens in itertools.product(
        megamoe["shapes"], megamoe["precisions"], megamoe["routings"], megamoe["tokens_per_rank"]
    ):
        if shape["E"] % world_size:
            raise ValueError(
                f"megamoe shape '{shape['name']}': E={shape['E']} experts do not divide over "
                f"world_size={world_size} ranks"
            )
        base = {"shape": shape["name"], **{k: v for k, v in shape.items() if k != "name"}}
        base.update(
            precision=precision, routing=routing, tokens_per_rank=tokens, world_size=world_size
        )
        base_id = f"{base['shape']}/{precision}/{routing}/T={tokens}/P={world_size}"
        for path in paths:
            if path == storepath.PEER:
                for fraction in fractions:
                    p = {**base, "path": path, "id": base_id}
                    if fraction != NATURAL:  # natural routing keeps the ids of earlier datasets
                        p["remote_fraction"] = float(fraction)
                        p["id"] += f"/f={fraction_label(fraction)}"
                    points.append(p)
            elif path == storepath.HOST:
                for fraction in host_fractions:
                    label = fraction_label(fraction)
                    points.append(
                        {
                            **base,
                            "path": path,
                            "remote_fraction": fraction,
                            "id": f"{base_id}/path={path}/f={label}",
                        }
                    )
            else:
                raise ValueError(f"megamoe: unknown store path {path!r}; known: {storepath.PATHS}")
    return points


DEFAULT_HOST_WORLD_SIZES = (2, 8)


def attention_points(
    attention: dict, world_size: int, paths: tuple[str, ...] | list[str] = (storepath.PEER,)
) -> list[dict]:
    """One point per (backend, mode, heads, S) on each store path in `paths` (the measured
    paths of this run; a simulated dataset describes the peer path). Every point names
    its `path`.

    - peer: at the physical world size, and again at each `attention.emulated_world_sizes`
      above it (two GPUs playing ranks 0 and P-1 of a larger node, attention/emulation.py;
      a run of another GPU count records those points unsupported, and a size equal to
      the GPU count is the physical run itself); ids
      `backend/mode/H=../S=../P=<GPUs>[/emulated-P=..]`, as before paths existed.
    - host: at each `attention.host_world_sizes` P, one GPU playing rank 0 of a P-GPU node
      with host memory as the other P-1 owners (attention/host.py); ids add `/path=host`
      and, where P is not the GPU count, `/emulated-P=P` (`emulated_world_size`).

    Heads and S must divide over every P.
    """
    points = []
    if storepath.PEER in paths:
        points += _peer_attention_points(attention, world_size)
    if storepath.HOST in paths:
        points += _host_attention_points(attention, world_size)
    return points


def _attention_point(attention: dict, backend, mode, heads, seq, world_size, path) -> dict:
    return {
        "backend": backend,
        "mode": mode,
        "heads": heads,
        "seq_len": seq,
        "head_dim": attention["head_dim"],
        "batch": attention["batch"],
        "world_size": world_size,
        "path": path,
    }


def _check_divides(attention: dict, size: int, key: str) -> None:
    for heads in attention["heads"]:
        if heads % size:
            raise ValueError(
                f"attention heads={heads} do not divide over world_size={size} ranks ({key})"
            )
    for seq in attention["seq_lens"]:
        if seq % size:
            raise ValueError(f"attention seq_len={seq} does not divide over {size} ranks ({key})")


def _peer_attention_points(attention: dict, world_size: int) -> list[dict]:
    if world_size < 2:
        raise ValueError(
            f"the peer path of attention needs 2 or more GPUs; this run has {world_size}"
        )
    emulated = attention.get("emulated_world_sizes", [])
    for size in (world_size, *emulated):
        if size < world_size:
            raise ValueError(
                f"attention.emulated_world_sizes: {size} is below the {world_size} GPUs here"
            )
        key = "world_size" if size == world_size else "attention.emulated_world_sizes"
        _check_divides(attention, size, key)
    sizes = (world_size, *(s for s in emulated if s != world_size))
    return _attention_grid(attention, sizes, world_size, storepath.PEER)


def _host_attention_points(attention: dict, world_size: int) -> list[dict]:
    sizes = list(attention.get("host_world_sizes", DEFAULT_HOST_WORLD_SIZES))
    for size in sizes:
        if size < 2:
            raise ValueError(
                f"attention.host_world_sizes: {size} leaves nothing to send (P must be >= 2)"
            )
        _check_divides(attention, size, "attention.host_world_sizes")
    return _attention_grid(attention, sizes, world_size, storepath.HOST)


def _attention_grid(attention: dict, sizes, world_size: int, path: str) -> list[dict]:
    """Every (P, backend, mode, heads, S) point of one path; ids name the path unless it is
    the peer path (whose ids predate paths), and a P other than the GPU count as emulated."""
    points = []
    part = "" if path == storepath.PEER else f"/path={path}"
    for size, backend, mode, heads, seq in itertools.product(
        sizes,
        attention["backends"],
        attention["modes"],
        attention["heads"],
        attention["seq_lens"],
    ):
        p = _attention_point(attention, backend, mode, heads, seq, world_size, path)
        p["id"] = f"{backend}/{mode}/H={heads}/S={seq}/P={world_size}{part}"
        if size != world_size:
            p["emulated_world_size"] = size
            p["id"] += f"/emulated-P={size}"
        points.append(p)
    return points
