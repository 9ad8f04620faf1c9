"""Hardware profiles for the simulator (config/hardware/*.yaml)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from xstage_bench.data.config import ConfigError

GB = 1e9  # bytes per GB (decimal, as bandwidths are quoted)
US = 1e-6


@dataclass(frozen=True)
class HardwareProfile:
    """What the simulator needs to know of a GPU and its path to the peers."""

    name: str
    sm_count: int
    t0_fixed_us: float
    issue_rate_per_sm_GBps: float
    drain_rate_GBps: float
    capacity_bytes: float  # S: the part of the capacity the path shares
    nvlink_line_rate_GBps: float
    matrix_tflops: dict[str, float] = field(default_factory=dict)
    # q: each producer's own window; K producers meet min(S + K q, C) (model.laws.capacity)
    capacity_per_producer_bytes: float = 0.0
    capacity_ceiling_bytes: float | None = None  # C: the most the path holds; None: no ceiling
    source: str = ""
    world_size: int = 2  # GPUs of the node the simulator stands for (when config says auto)

    def t0_us(self, K: int, V: float) -> float:
        """Backpressure-free issue time of a burst of V bytes spread over K producers."""
        per_producer = V / K
        return self.t0_fixed_us + per_producer / (self.issue_rate_per_sm_GBps * GB * US)

    @property
    def drain_bytes_per_us(self) -> float:
        return self.drain_rate_GBps * GB * US

    def as_dict(self) -> dict:
        return asdict(self)


REQUIRED = (
    "name",
    "sm_count",
    "t0_fixed_us",
    "issue_rate_per_sm_GBps",
    "drain_rate_GBps",
    "capacity_bytes",
    "nvlink_line_rate_GBps",
)


def _positive_window(raw: dict) -> bool:
    window = raw.get("capacity_per_producer_bytes", 0.0)
    return isinstance(window, int | float) and math.isfinite(window) and window > 0


def load_profile(path: str | Path) -> HardwareProfile:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"hardware profile not found: {path}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping")
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise ConfigError(f"{path}: missing key(s) {', '.join(missing)}")
    for key in REQUIRED[1:]:
        value = raw[key]
        if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            if key == "capacity_bytes" and value == 0 and _positive_window(raw):
                continue  # a capacity of windows alone, S = 0
            raise ConfigError(
                f"{path}: key '{key}' must be a positive finite number, got {value!r}"
            )
    window = raw.get("capacity_per_producer_bytes", 0.0)
    if not isinstance(window, int | float) or not math.isfinite(window) or window < 0:
        raise ConfigError(
            f"{path}: key 'capacity_per_producer_bytes' must be a finite number >= 0, "
            f"got {window!r}"
        )
    ceiling = raw.get("capacity_ceiling_bytes")
    if ceiling is not None and (
        not isinstance(ceiling, int | float) or not math.isfinite(ceiling) or ceiling <= 0
    ):
        raise ConfigError(
            f"{path}: key 'capacity_ceiling_bytes' must be a positive finite number or null "
            f"(no ceiling), got {ceiling!r}"
        )
    ws = raw.get("world_size", 2)
    if isinstance(ws, bool) or not isinstance(ws, int) or ws < 2:
        raise ConfigError(f"{path}: key 'world_size' must be an integer >= 2, got {ws!r}")
    known = set(HardwareProfile.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    return HardwareProfile(**raw)
