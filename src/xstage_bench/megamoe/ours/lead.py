"""The interleaved schedule's lead (`lead_rows`), chosen by the Burst-Gap model: `auto`.

How far the Linear-1 cursor runs ahead of the Linear-2 cursor decides how much Linear-1
work sits between the Linear-2 tiles' remote stores: too little and the programs that
stored wait on a full drain (and, held at their next atomic until their stores drained,
issue 52 finding 1, cannot compute meanwhile); too much and Linear-2 bunches at the end,
where nothing is left to hide the drain. What matters is every program storing at once
into one drain, so the rule asks the playback (megamoe/playback.py): each candidate lead's
tile list, built as the kernel builds it, played through the path's fitted drain (issue
time T0 = t0_fixed + B / issue rate, capacity Q(K) = min(S + K q, C), drain R, the hold
on), with tile costs from the kernel's FLOP rate X. `auto` is the candidate with
the shortest predicted kernel time; candidates the playback cannot tell apart (within TIE)
go to the longest lead, whose slack covers tile-time jitter the playback does not model
(measured: at f = 0 leads of 1024-4096 rows beat 0-256 by up to 8%, where the playback
sees 3%).

It is causal: no measured kernel time enters it, only the point, the fit and X. For speed
(every point of the 84-configuration grid is planned before anything is measured) it
plays the busiest rank's first PLAN_BLOCKS row blocks (a longer prefix changed the
choice's predicted time by at most 0.24% over the reference grid at f = 0.25) and keeps
each choice per configuration and share: the precisions share it, X being one rate.

X is `megamoe.lead_auto_tflops` (default DEFAULT_TFLOPS: the measured median of our W8A8
kernel on H200), or the emulated rate in the compute-emulated sweep. T0, R, S and q are
the path's fit in the dataset's model file (model/burst_gap.json; `read_drain`), or a
simulated profile's own path (`LeadChooser.of_paths`). The drain's lag beyond the knee
(drain_lag_fraction and drain_lag_rate_ratio) is read but not played: PLAYS_DRAIN_LAG.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from xstage_bench.data import storepath
from xstage_bench.megamoe import playback, schedule
from xstage_bench.megamoe.drain import PathParams
from xstage_bench.model import laws

AUTO = "auto"
# Our W8A8 kernel's median per-GPU rate on H200 (2x H200 reference, 84 configurations,
# 2026-11-30: 601 TFLOP/s; megamoe_ws.py's docstring).
DEFAULT_TFLOPS = 600.0
DEFAULT_PROGRAMS = 132  # SMs of an H100 or H200 (SXM): the kernel runs one program per SM
CANDIDATES = (0, 256, 512, 768, 1024, 1536, 2048, 4096)  # rows, multiples of block_m
PLAN_BLOCKS = 160  # row blocks of the busiest rank the rule plays
TIE = 1e-3  # predicted times closer than this (relative) are one time to the rule
# The fit's drain lag (laws.stall_time) is not played: drain.StorePath's slow start made
# every host reference's playback worse (median/p90 |error| with the hold, ref-h100x1
# 2.0/5.4% -> 3.9/10.2%, ref-h200x1 3.1/7.0 -> 6.2/14.1, ref-h200x2 peer 1.5/6.9 -> 2.0/7.1)
# and the lead replay lost 2 of 28 points on ref-h100x1 (within 2% of best, 23 -> 21). The
# kernel's sparse, staggered stores do not show the isolated bursts' slow start. True plays
# it (the playback and `auto` alike); the playback document records the choice.
PLAYS_DRAIN_LAG = False
LAG_NOT_PLAYED = (
    "fitted on isolated bursts, not played: with it the playback's error with the hold "
    "doubled on the host references and the lead replay lost points (lead.PLAYS_DRAIN_LAG)"
)


class LeadModelError(ValueError):
    """The model file cannot give the path's drain; the message names the file."""


@dataclass(frozen=True)
class PathDrain:
    """A path's fitted Burst-Gap parameters, as the playback uses them."""

    path: str
    source: str  # the model file, and which part of it
    t0_fixed_us: float
    issue_rate_per_producer_GBps: float
    R_GBps: float
    Q_bytes: float | None  # the fit's one shared capacity, where it has one
    # The capacity law Q(K) = min(S + K q, C) at K producers storing at once; files without
    # it (one shared capacity) read as S = Q_bytes, q = 0; C None is no ceiling (C_bytes
    # null, or absent in files written before the ceiling).
    S_bytes: float
    q_bytes: float
    C_bytes: float | None = None
    # The drain's lag beyond the knee (laws.stall_time), as fitted: 0 and 1, none, in files
    # without it. path_params plays it only where PLAYS_DRAIN_LAG.
    lag_fraction: float = 0.0
    lag_rate_ratio: float = 1.0

    def T0_us(self, producer_bytes: float) -> float:
        """The issue law: T0 = t0_fixed + B / issue rate (per producer)."""
        rate = float(laws.gbps_to_bytes_per_us(self.issue_rate_per_producer_GBps))
        return self.t0_fixed_us + producer_bytes / rate

    @property
    def ceiling(self) -> float:
        return math.inf if self.C_bytes is None else self.C_bytes

    def capacity_bytes(self, K: float) -> float:
        return laws.capacity(K, self.S_bytes, self.q_bytes, self.ceiling)

    def path_params(self) -> PathParams:
        """The fluid path the playback plays tile lists through (drain.py): R and Q(K) as
        fitted, the drain's lag only where PLAYS_DRAIN_LAG (none otherwise)."""
        lag = PLAYS_DRAIN_LAG
        return PathParams(
            t0_fixed_us=self.t0_fixed_us,
            issue_rate=float(laws.gbps_to_bytes_per_us(self.issue_rate_per_producer_GBps)),
            drain=float(laws.gbps_to_bytes_per_us(self.R_GBps)),
            capacity=self.S_bytes,
            capacity_per_issuer=self.q_bytes,
            capacity_ceiling=self.ceiling,
            lag_fraction=self.lag_fraction if lag else 0.0,
            lag_rate_ratio=self.lag_rate_ratio if lag else 1.0,
        )

    def describe(self) -> dict:
        return {
            "path": self.path,
            "model_file": self.source,
            "t0_fixed_us": self.t0_fixed_us,
            "issue_rate_per_producer_GBps": self.issue_rate_per_producer_GBps,
            "R_GBps": self.R_GBps,
            "Q_bytes": self.Q_bytes,
            "S_bytes": self.S_bytes,
            "q_bytes": self.q_bytes,
            "C_bytes": self.C_bytes,
            "lag_fraction": self.lag_fraction,
            "lag_rate_ratio": self.lag_rate_ratio,
            "lag_played": PLAYS_DRAIN_LAG,
        }


PARAM_KEYS = {
    "t0_fixed_us": "t0_fixed_us",
    "issue_rate_per_producer_GBps": "issue_rate_per_sm_GBps",
    "R_GBps": "R_GBps",
}
# The capacity law; a file without it (older fits) has one shared capacity, Q_bytes.
CAPACITY_LAW_KEYS = {"S_bytes": "S_bytes", "q_bytes": "q_bytes"}
# The drain's lag; a file without it (fitted before it) has none: these values.
LAG_KEYS = {
    "lag_fraction": ("drain_lag_fraction", 0.0),
    "lag_rate_ratio": ("drain_lag_rate_ratio", 1.0),
}


def _usable(value) -> bool:
    return value is not None and math.isfinite(float(value)) and float(value) >= 0


def read_drain(model_file: str | Path, path: str) -> PathDrain:
    """The path's T0, R and capacity law from a model file (model.document.path_fit: the
    top-level fit or the path's part of `other_paths`; files without `path` fitted the
    peer path). A LeadModelError names the file when it cannot be read, does not fit the
    path, or a parameter is missing or undetermined."""
    try:
        doc = json.loads(Path(model_file).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LeadModelError(
            f"lead_rows 'auto' on the {path} path needs {model_file}: {e}"
        ) from None
    return drain_of(doc, path, str(model_file))


def drain_of(doc: dict, path: str, source: str) -> PathDrain:
    """read_drain of a model document already read (`source`: the file, for messages)."""
    from xstage_bench.model.document import ModelFileError, path_fit

    try:
        params = path_fit(doc, path).get("params") or {}
    except ModelFileError as e:
        raise LeadModelError(f"lead_rows 'auto' on the {path} path needs {source}: {e}") from None
    where = source if path == doc.get("path", storepath.PEER) else f"{source} (other_paths.{path})"

    def value(key: str) -> float:
        block = params.get(key) or {}
        if not _usable(block.get("value")):
            raise LeadModelError(
                f"lead_rows 'auto' on the {path} path: {where} has no usable '{key}' "
                f"({block.get('reason', 'missing')})"
            )
        return float(block["value"])

    values = {name: value(key) for name, key in PARAM_KEYS.items()}
    shared = (params.get("Q_bytes") or {}).get("value")
    values["Q_bytes"] = float(shared) if _usable(shared) else None
    if any(key in params for key in CAPACITY_LAW_KEYS.values()):
        values.update({name: value(key) for name, key in CAPACITY_LAW_KEYS.items()})
        values["C_bytes"] = _ceiling(params, where, path)
    else:  # one shared capacity
        values.update(S_bytes=value("Q_bytes"), q_bytes=0.0)
    for name, (key, none) in LAG_KEYS.items():
        values[name] = value(key) if key in params else none
    if values["R_GBps"] <= 0 or values["issue_rate_per_producer_GBps"] <= 0:
        raise LeadModelError(f"lead_rows 'auto': {where} has a zero rate")
    ceiling = values.get("C_bytes")
    if min(values["S_bytes"] + values["q_bytes"], math.inf if ceiling is None else ceiling) <= 0:
        raise LeadModelError(f"lead_rows 'auto': {where} has no capacity (S + q = 0 or C = 0)")
    return PathDrain(path=path, source=where, **values)


def _ceiling(params: dict, where: str, path: str) -> float | None:
    """The law's ceiling C_bytes: None where the law has none (null with its reason, or no
    C_bytes in files written before the ceiling); a LeadModelError where it is unusable."""
    C = (params.get("C_bytes") or {}).get("value")
    if C is None:
        return None
    if not _usable(C):
        raise LeadModelError(
            f"lead_rows 'auto' on the {path} path: {where} has no usable 'C_bytes' ({C!r})"
        )
    return float(C)


@dataclass(frozen=True)
class LeadChoice:
    """What the rule chose for one configuration and share, and what it saw."""

    rows: int
    predicted_us: dict[int, float]  # candidate -> predicted kernel time of the played prefix


def choose(
    point: dict,
    megamoe: dict,
    far: PathParams,
    *,
    tflops: float,
    num_programs: int,
    candidates: tuple[int, ...] = CANDIDATES,
    blocks: int | None = PLAN_BLOCKS,
) -> LeadChoice:
    """The candidate lead with the shortest predicted kernel time (module doc): the
    busiest rank's first `blocks` row blocks (None: all of them) played through `far`
    with the hold, tiles lasting their FLOPs at `tflops` per GPU."""
    if not tflops > 0:
        raise ValueError(f"megamoe.lead_auto_tflops must be > 0, got {tflops}")
    if not candidates or any(c < 0 for c in candidates):
        raise ValueError(f"lead candidates must be rows >= 0, got {candidates}")
    block_m, block_n = megamoe.get("block_m", 128), megamoe.get("block_n", 128)
    rates = playback.Rates.at(point, block_m, block_n, tflops, num_programs)
    works = playback.rank_works(point, megamoe)
    work = max(works, key=lambda w: rates.lower_bound_us(w, far.drain))
    if blocks is not None:
        work = work.prefix(blocks)
    predicted = {}
    for lead in sorted(set(candidates)):
        tiles = schedule.build(schedule.INTERLEAVED, work.grid, num_programs, {"lead_rows": lead})
        predicted[lead] = playback.play(tiles, work, rates, far).time_us
    fastest = min(predicted.values())
    rows = max(lead for lead, t in predicted.items() if t <= fastest * (1 + TIE))
    return LeadChoice(rows, predicted)


def requested_leads(megamoe: dict) -> list:
    """Every lead_rows value the config asks for: the main one and the sweep's."""
    return [megamoe.get("lead_rows", 0), *(megamoe.get("lead_sweep") or {}).get("lead_rows", [])]


def needs_model(megamoe: dict) -> bool:
    """Whether any lead is `auto` (then the measuring rules need the model file)."""
    return AUTO in requested_leads(megamoe)


@dataclass
class LeadChooser:
    """Resolves requested leads (an integer, or `auto`) per point; reads each path's fit
    once and keeps each choice. model_file None and no `paths`: `auto` is an error naming
    what is missing."""

    model_file: str | None
    tflops: float = DEFAULT_TFLOPS
    megamoe: dict = field(default_factory=dict)
    num_programs: int = DEFAULT_PROGRAMS
    paths: dict[str, PathParams] = field(default_factory=dict)  # a simulated profile's
    _drains: dict[str, PathDrain] = field(default_factory=dict, init=False, repr=False)
    _chosen: dict[tuple, LeadChoice] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def of(
        cls, megamoe: dict, model_file: str | Path | None, num_programs: int = DEFAULT_PROGRAMS
    ) -> LeadChooser:
        return cls(
            None if model_file is None else str(model_file),
            float(megamoe.get("lead_auto_tflops", DEFAULT_TFLOPS)),
            megamoe,
            num_programs,
        )

    @classmethod
    def of_paths(
        cls, megamoe: dict, paths: dict[str, PathParams], num_programs: int
    ) -> LeadChooser:
        """A chooser that plays through given paths (a simulated profile's), no file."""
        return cls(
            None,
            float(megamoe.get("lead_auto_tflops", DEFAULT_TFLOPS)),
            megamoe,
            num_programs,
            dict(paths),
        )

    def far_path(self, path: str) -> PathParams:
        if path in self.paths:
            return self.paths[path]
        if path not in self._drains:
            if self.model_file is None:
                raise LeadModelError(
                    "config key 'megamoe.lead_rows' (or megamoe.lead_sweep.lead_rows) is "
                    "'auto', but no model file was given (--model results/<dataset>/"
                    "model/burst_gap.json)"
                )
            self._drains[path] = read_drain(self.model_file, path)
        return self._drains[path].path_params()

    def choice(self, point: dict, tflops: float | None = None) -> LeadChoice:
        """The rule's choice for `point` (its path, configuration and share), kept."""
        rate = self.tflops if tflops is None else float(tflops)
        path = storepath.point_path(point)
        far = self.far_path(path)
        share = point.get("remote_fraction")
        key = (playback.config_key(point, self.megamoe), path, str(share), rate)
        if key not in self._chosen:
            self._chosen[key] = choose(
                point, self.megamoe, far, tflops=rate, num_programs=self.num_programs
            )
        return self._chosen[key]

    def resolve(self, requested, point: dict, tflops: float | None = None) -> int:
        """The integer lead for `point` (its path, configuration and share)."""
        if requested != AUTO:
            if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
                raise ValueError(
                    f"config key 'megamoe.lead_rows': an integer >= 0 or 'auto', got {requested!r}"
                )
            return requested
        return self.choice(point, tflops).rows

    def describe(self) -> dict:
        """The raw config's `lead_auto`: the rule, the file read, the drains used, X."""
        return {
            "rule": "the candidate lead with the shortest predicted kernel time (ties within "
            f"{TIE:g} to the longest): the busiest rank's first {PLAN_BLOCKS} row blocks' "
            "interleaved tile list played through the path's fitted drain (T0 = t0_fixed + "
            "B / issue rate, Q(K) = min(S + K q, C), R; the fitted drain lag "
            f"{'played' if PLAYS_DRAIN_LAG else 'not played'}; a program held until its "
            "stores drain), "
            "tiles at X (src/xstage_bench/megamoe/ours/lead.py, megamoe/playback.py)",
            "candidates": list(CANDIDATES),
            "model_file": self.model_file,
            "tflops": self.tflops,
            "num_programs": self.num_programs,
            "paths": {p: d.describe() for p, d in sorted(self._drains.items())},
        }
