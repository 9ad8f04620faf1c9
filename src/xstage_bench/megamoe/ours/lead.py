"""The interleaved schedule's lead (`lead_rows`), chosen by the Burst-Gap model: `auto`.

How far the Linear-1 cursor runs ahead of the Linear-2 cursor decides how much Linear-1
work is queued between two Linear-2 row blocks. The model says how much is enough:

- One row block's Linear-2 tiles are one burst: H / block_n producers (tiles), each
  storing block_m x block_n bf16 outputs, of which a share f is remote (crosses the
  path). So the burst is V = f block_m H 2 bytes, B = f block_m block_n 2 per producer.
- A burst on an empty path issues in T0 (T0 = t0_fixed + B / issue rate per producer,
  the model's issue law); meanwhile R T0 bytes drain, so it leaves a backlog of
  [V - R T0]+ (laws.backlog_peak). The path holds Q of that without stalling the issuer;
  the rest, [V - R T0 - Q]+, drains at R: t_drain = [V - R T0 - Q]+ / R. (This is the
  isolated law's stall beyond T0, laws.isolated_issue_time - T0.)
- `lead` rows of Linear-1 work (gate and up: 4 H I FLOPs per row) take
  t_L1 = 4 H I lead / X at the kernel's compute rate X (per GPU).
- The lead is the smallest multiple of block_m with t_L1 >= t_drain: the queued Linear-1
  work covers the drain of the burst before it, so programs that finish a Linear-2 tile
  find Linear-1 work instead of stalled stores. It is 0 when a burst fits the path
  (t_drain = 0), e.g. every row local (f = 0).

X is `megamoe.lead_auto_tflops` (default DEFAULT_TFLOPS: the measured median of our W8A8
kernel on H200), or the emulated rate in the compute-emulated sweep. T0, R and Q are the
path's fit in the dataset's model file (model/burst_gap.json; `read_drain`). Everything
here is pure (numpy and json), so the CPU tests pin it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from xstage_bench.data import storepath
from xstage_bench.model import laws

AUTO = "auto"
# Our W8A8 kernel's median per-GPU rate on H200 (2x H200 reference, 84 configurations,
# 2026-11-30: 601 TFLOP/s; megamoe_ws.py's docstring).
DEFAULT_TFLOPS = 600.0
LINEAR1_FLOPS_PER_ROW = 4  # x H x I: gate and up


class LeadModelError(ValueError):
    """The model file cannot give the path's T0, R and Q; the message names the file."""


@dataclass(frozen=True)
class PathDrain:
    """A path's fitted Burst-Gap parameters, as `auto_lead_rows` uses them."""

    path: str
    source: str  # the model file, and which part of it
    t0_fixed_us: float
    issue_rate_per_producer_GBps: float
    R_GBps: float
    Q_bytes: float

    def T0_us(self, producer_bytes: float) -> float:
        """The issue law: T0 = t0_fixed + B / issue rate (per producer)."""
        rate = float(laws.gbps_to_bytes_per_us(self.issue_rate_per_producer_GBps))
        return self.t0_fixed_us + producer_bytes / rate

    def describe(self) -> dict:
        return {
            "path": self.path,
            "model_file": self.source,
            "t0_fixed_us": self.t0_fixed_us,
            "issue_rate_per_producer_GBps": self.issue_rate_per_producer_GBps,
            "R_GBps": self.R_GBps,
            "Q_bytes": self.Q_bytes,
        }


PARAM_KEYS = {
    "t0_fixed_us": "t0_fixed_us",
    "issue_rate_per_producer_GBps": "issue_rate_per_sm_GBps",
    "R_GBps": "R_GBps",
    "Q_bytes": "Q_bytes",
}


def read_drain(model_file: str | Path, path: str) -> PathDrain:
    """The path's T0, R, Q from a model file (model.document.path_fit: the top-level fit
    or the path's part of `other_paths`; files without `path` fitted the peer path). A
    LeadModelError names the file when it cannot be read, does not fit the path, or a
    parameter is missing or undetermined."""
    from xstage_bench.model.document import ModelFileError, path_fit

    source = str(model_file)
    try:
        doc = json.loads(Path(model_file).read_text())
        params = path_fit(doc, path).get("params") or {}
    except (OSError, json.JSONDecodeError, ModelFileError) as e:
        raise LeadModelError(f"lead_rows 'auto' on the {path} path needs {source}: {e}") from None
    where = source if path == doc.get("path", storepath.PEER) else f"{source} (other_paths.{path})"
    values = {}
    for name, key in PARAM_KEYS.items():
        value = (params.get(key) or {}).get("value")
        if value is None or not math.isfinite(float(value)) or float(value) < 0:
            raise LeadModelError(
                f"lead_rows 'auto' on the {path} path: {where} has no usable '{key}' "
                f"({(params.get(key) or {}).get('reason', 'missing')})"
            )
        values[name] = float(value)
    if values["R_GBps"] <= 0 or values["issue_rate_per_producer_GBps"] <= 0:
        raise LeadModelError(f"lead_rows 'auto': {where} has a zero rate")
    return PathDrain(path=path, source=where, **values)


def burst_bytes(H: int, remote_share: float, block_m: int, block_n: int) -> tuple[float, float]:
    """(V, B): one row block's remote Linear-2 bytes, and each of its H/block_n tiles'."""
    return remote_share * block_m * H * 2, remote_share * block_m * block_n * 2


def drain_time_us(H: int, remote_share: float, drain: PathDrain, block_m: int, block_n: int):
    """t_drain: how long one row block's backlog beyond Q takes to drain (module doc)."""
    V, B = burst_bytes(H, remote_share, block_m, block_n)
    R = laws.gbps_to_bytes_per_us(drain.R_GBps)
    backlog = laws.backlog_peak(drain.T0_us(B), V, R)
    return float(max(backlog - drain.Q_bytes, 0.0) / R)


def linear1_time_us(H: int, I: int, rows: int, tflops: float) -> float:  # noqa: E741
    """t_L1: the Linear-1 time of `rows` rows at `tflops` per GPU."""
    return LINEAR1_FLOPS_PER_ROW * H * I * rows / (tflops * 1e6)


def auto_lead_rows(
    *,
    H: int,
    I: int,  # noqa: E741
    remote_share: float,
    drain: PathDrain,
    tflops: float,
    block_m: int = 128,
    block_n: int = 128,
) -> int:
    """The smallest multiple of block_m whose Linear-1 time covers t_drain (module doc)."""
    if not tflops > 0:
        raise ValueError(f"megamoe.lead_auto_tflops must be > 0, got {tflops}")
    if not 0.0 <= remote_share <= 1.0:
        raise ValueError(f"remote share must be in [0, 1], got {remote_share}")
    need = drain_time_us(H, remote_share, drain, block_m, block_n)
    if need <= 0.0:
        return 0
    return block_m * math.ceil(need / linear1_time_us(H, I, block_m, tflops) - 1e-12)


def remote_share(point: dict) -> float:
    """The share of a point's combine rows that cross its path: the host share on the host
    path; on the peer path the re-homed fraction, or (P-1)/P at natural routing."""
    f = point.get("remote_fraction")
    if storepath.point_path(point) == storepath.HOST or f not in (None, "natural"):
        return float(f or 0.0)
    P = point["world_size"]
    return (P - 1) / P


def requested_leads(megamoe: dict) -> list:
    """Every lead_rows value the config asks for: the main one and the sweep's."""
    return [megamoe.get("lead_rows", 0), *(megamoe.get("lead_sweep") or {}).get("lead_rows", [])]


def needs_model(megamoe: dict) -> bool:
    """Whether any lead is `auto` (then the measuring rules need the model file)."""
    return AUTO in requested_leads(megamoe)


class LeadChooser:
    """Resolves requested leads (an integer, or `auto`) per point; reads each path's fit
    once. model_file None: `auto` is an error naming what is missing."""

    def __init__(self, model_file: str | Path | None, tflops: float = DEFAULT_TFLOPS):
        self.model_file = None if model_file is None else str(model_file)
        self.tflops = float(tflops)
        self._drains: dict[str, PathDrain] = {}

    @classmethod
    def of(cls, megamoe: dict, model_file: str | Path | None) -> LeadChooser:
        return cls(model_file, megamoe.get("lead_auto_tflops", DEFAULT_TFLOPS))

    def drain(self, path: str) -> PathDrain:
        if path not in self._drains:
            if self.model_file is None:
                raise LeadModelError(
                    "config key 'megamoe.lead_rows' (or megamoe.lead_sweep.lead_rows) is "
                    "'auto', but no model file was given (--model results/<dataset>/"
                    "model/burst_gap.json)"
                )
            self._drains[path] = read_drain(self.model_file, path)
        return self._drains[path]

    def resolve(self, requested, point: dict, tflops: float | None = None) -> int:
        """The integer lead for `point` (its path, shape and remote share)."""
        if requested != AUTO:
            if isinstance(requested, bool) or not isinstance(requested, int) or requested < 0:
                raise ValueError(
                    f"config key 'megamoe.lead_rows': an integer >= 0 or 'auto', got {requested!r}"
                )
            return requested
        return auto_lead_rows(
            H=point["H"],
            I=point["I"],
            remote_share=remote_share(point),
            drain=self.drain(storepath.point_path(point)),
            tflops=self.tflops if tflops is None else tflops,
        )

    def describe(self) -> dict:
        """The raw config's `lead_auto`: the rule, the file read, the T0/R/Q used, X."""
        return {
            "rule": "smallest multiple of block_m with 4 H I lead / X >= [V - R T0 - Q]+ / R, "
            "V = f block_m H 2 (one row block's remote Linear-2 bytes), T0 = t0_fixed + B / "
            "issue rate, B = f block_m block_n 2 (src/xstage_bench/megamoe/ours/lead.py)",
            "model_file": self.model_file,
            "tflops": self.tflops,
            "paths": {p: d.describe() for p, d in sorted(self._drains.items())},
        }
