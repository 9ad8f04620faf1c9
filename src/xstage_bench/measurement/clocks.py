"""Read GPU clocks, temperature, power and clock-slowdown reasons through NVML, and judge
whether a measured point ran throttled.

Read-only by design: nothing here sets clocks, power limits or any other GPU setting (the
machines are shared; we measure the card as we find it). Where NVML is missing (CPU
machines, CI) a sample says so instead of raising, and the verdict is "unknown" (None).

Typical use around one point:

    sampler = ClockSampler([0, 1])
    before = sampler.sample()
    ...measure...
    record = ok_record(..., **record_fields(before, sampler.sample()))
"""

from __future__ import annotations

import importlib
import os
from datetime import UTC, datetime

# NVML's clock-event ("throttle") reason bits; stable across driver versions.
REASON_BITS = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
# Reasons that mean the chip slowed itself down (power, heat, hardware): a point measured
# under them is not representative. Idle, application/display clock settings and sync
# boost describe the card's configured state, not a slowdown during our work.
SLOWDOWN_REASONS = frozenset(
    {
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "board_limit",
        "reliability",
    }
)
# Reasons under which an SM clock below its maximum is expected, not a throttle.
CLOCK_BELOW_MAX_EXPECTED = frozenset({"gpu_idle", "applications_clocks_setting", "sync_boost"})
MIN_CLOCK_FRACTION = 0.8


def _decode_reasons(mask: int) -> list[str]:
    names = [name for bit, name in REASON_BITS.items() if mask & bit]
    unknown = mask & ~sum(REASON_BITS)
    if unknown:
        names.append(f"unknown_{unknown:#x}")
    return names


def visible_entries(visible: str | None) -> list[str] | None:
    """The entries of CUDA_VISIBLE_DEVICES (`visible`), or None where it is unset: CUDA then
    numbers every GPU. Set but empty, it hides them all: no entries."""
    if visible is None:
        return None
    return [e.strip() for e in visible.split(",") if e.strip()]


def nvml_targets(cuda_indices: list[int]) -> list[int | str]:
    """The NVML index (int) or UUID prefix (str) for each CUDA device index.

    CUDA numbers only the devices in CUDA_VISIBLE_DEVICES; NVML numbers every device.
    Identical GPUs (our case) are ordered the same way by both, so the mapping only
    needs to undo CUDA_VISIBLE_DEVICES.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entries = visible_entries(visible)
    if entries is None:
        return list(cuda_indices)
    targets: list[int | str] = []
    for index in cuda_indices:
        if index >= len(entries):
            raise ValueError(
                f"CUDA device {index} does not exist: CUDA_VISIBLE_DEVICES={visible!r} "
                f"exposes {len(entries)} device(s)"
            )
        entry = entries[index]
        targets.append(int(entry) if entry.isdigit() else entry)
    return targets


class ClockSampler:
    """Samples clocks and slowdown reasons of the given CUDA devices through NVML."""

    def __init__(self, device_indices: list[int]):
        self.device_indices = list(device_indices)
        self._nvml = None
        self._handles: list = []
        self._unavailable: str | None = None
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            self._unavailable = "pynvml (nvidia-ml-py) is not installed"
            return
        targets = nvml_targets(self.device_indices)
        try:
            nvml.nvmlInit()
            self._handles = [self._handle(nvml, t) for t in targets]
        except Exception as e:  # NVMLError subclasses: no driver, no such device, ...
            self._unavailable = f"NVML could not be used: {type(e).__name__}: {e}"
            return
        self._nvml = nvml

    @staticmethod
    def _handle(nvml, target: int | str):
        if isinstance(target, int):
            return nvml.nvmlDeviceGetHandleByIndex(target)
        # CUDA_VISIBLE_DEVICES may hold UUID prefixes; NVML wants the full UUID.
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if uuid.startswith(target):
                return handle
        raise ValueError(f"no NVML device matches CUDA_VISIBLE_DEVICES entry {target!r}")

    def _read(self, fn_name: str, *args):
        """One NVML query; None where this device does not support it."""
        nvml = self._nvml
        error = getattr(nvml, "NVMLError", Exception)
        try:
            return getattr(nvml, fn_name)(*args)
        except error:
            return None

    def _reasons(self, handle) -> list[str] | None:
        # Newer NVML calls them clock *event* reasons; older bindings only have "throttle".
        name = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(self._nvml, name):
            name = "nvmlDeviceGetCurrentClocksThrottleReasons"
        mask = self._read(name, handle)
        return None if mask is None else _decode_reasons(int(mask))

    def _device(self, index: int, handle) -> dict:
        nvml = self._nvml
        power_mw = self._read("nvmlDeviceGetPowerUsage", handle)
        return {
            "index": index,
            "sm_clock_mhz": self._read("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM),
            "mem_clock_mhz": self._read("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": self._read("nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_SM),
            "temperature_c": self._read(
                "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU
            ),
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "throttle_reasons": self._reasons(handle),
        }

    def sample(self) -> dict:
        """{"available": True, "time", "devices": [per-device dict]} or, without NVML,
        {"available": False, "reason": ...}. A field the device cannot report is None."""
        if self._nvml is None:
            return {"available": False, "reason": self._unavailable}
        time = datetime.now(UTC).isoformat(timespec="milliseconds")
        devices = [
            self._device(i, h) for i, h in zip(self.device_indices, self._handles, strict=True)
        ]
        return {"available": True, "time": time, "devices": devices}


def _device_findings(label: str, device: dict, min_clock_fraction: float) -> tuple[list, bool]:
    """(slowdown findings, whether anything needed was unreadable) for one device sample."""
    where = f"{label} GPU {device['index']}"
    reasons = device.get("throttle_reasons")
    if reasons is None:
        return [], True
    findings = [f"{where}: {r}" for r in reasons if r in SLOWDOWN_REASONS]
    sm, max_sm = device.get("sm_clock_mhz"), device.get("max_sm_clock_mhz")
    if CLOCK_BELOW_MAX_EXPECTED.isdisjoint(reasons):
        if sm is None or not max_sm:
            return findings, True
        if sm < min_clock_fraction * max_sm:
            findings.append(
                f"{where}: SM clock {sm} MHz < {min_clock_fraction:.0%} of max {max_sm} MHz "
                "while busy"
            )
    return findings, False


def throttle_verdict(
    before: dict, after: dict, *, min_clock_fraction: float = MIN_CLOCK_FRACTION
) -> tuple[bool | None, list[str]]:
    """Was the point throttled? (True | False | None, reasons).

    True: a slowdown reason (power cap, thermal, hardware, board limit) is active on some
    device in either sample, or an SM clock is below `min_clock_fraction` of its maximum
    while no idle/application-clock/sync-boost reason explains it. False: all devices were
    readable and none of that happened. None: unknown — NVML unavailable or a needed field
    unreadable, with no slowdown seen elsewhere; store it as `throttled: null`, never False.
    """
    findings: list[str] = []
    unknown: list[str] = []
    for label, sample in (("before", before), ("after", after)):
        if not sample.get("available"):
            unknown.append(f"{label}: clocks unavailable ({sample.get('reason')})")
            continue
        for device in sample["devices"]:
            found, unreadable = _device_findings(label, device, min_clock_fraction)
            findings += found
            if unreadable:
                unknown.append(f"{label} GPU {device['index']}: clock fields unreadable")
    if findings:
        return True, findings
    if unknown:
        return None, unknown
    return False, []


def record_fields(before: dict, after: dict) -> dict:
    """`throttled` and `clocks` keyword arguments for `results.ok_record`."""
    throttled, reasons = throttle_verdict(before, after)
    return {
        "throttled": throttled,
        "clocks": {"before": before, "after": after, "verdict_reasons": reasons},
    }
