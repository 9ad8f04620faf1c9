import sys
import types

import pytest
from fixtures import environment

from xstage_bench.data.results import ok_record, raw_document, validate_raw
from xstage_bench.measurement.clocks import ClockSampler, record_fields, throttle_verdict

IDLE, APP_CLOCKS, POWER_CAP, HW_THERMAL = 0x1, 0x2, 0x4, 0x40


class NVMLError(Exception):
    pass


def fake_nvml(devices: dict[int, dict], *, init_error: bool = False) -> types.ModuleType:
    """A pynvml stand-in with getters only: any setter call would fail with AttributeError.

    `devices` maps the NVML index to {sm, mem, max_sm, temp, power_mw, reasons}; a value
    of None makes that query raise NVMLError (not supported on this device).
    """
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0

    def get(handle, key):
        value = devices[handle][key]
        if value is None:
            raise NVMLError("Not Supported")
        return value

    def init():
        if init_error:
            raise NVMLError("Driver Not Loaded")

    m.nvmlInit = init
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetClockInfo = lambda h, t: get(h, "sm" if t == 1 else "mem")
    m.nvmlDeviceGetMaxClockInfo = lambda h, t: get(h, "max_sm")
    m.nvmlDeviceGetTemperature = lambda h, s: get(h, "temp")
    m.nvmlDeviceGetPowerUsage = lambda h: get(h, "power_mw")
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: get(h, "reasons")
    return m


def device(sm=1980, reasons=0, power_mw=650_000, max_sm=1980):
    return {
        "sm": sm,
        "mem": 3201,
        "max_sm": max_sm,
        "temp": 55,
        "power_mw": power_mw,
        "reasons": reasons,
    }


@pytest.fixture
def nvml(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def install(devices, **kw):
        monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(devices, **kw))

    return install


def test_sample_reads_every_field(nvml):
    nvml({0: device(), 1: device(sm=1900)})
    s = ClockSampler([0, 1]).sample()
    assert s["available"] is True and "time" in s
    d0, d1 = s["devices"]
    assert d0 == {
        "index": 0,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 3201,
        "max_sm_clock_mhz": 1980,
        "temperature_c": 55,
        "power_w": 650.0,
        "throttle_reasons": [],
    }
    assert d1["sm_clock_mhz"] == 1900


def test_power_capped_sample_is_flagged(nvml):
    nvml({0: device(), 1: device(sm=1500, reasons=POWER_CAP)})
    sampler = ClockSampler([0, 1])
    before, after = sampler.sample(), sampler.sample()
    throttled, reasons = throttle_verdict(before, after)
    assert throttled is True
    assert "before GPU 1: sw_power_cap" in reasons and "after GPU 1: sw_power_cap" in reasons
    assert not any("GPU 0" in r for r in reasons)


def test_thermal_reason_in_one_sample_is_enough(nvml):
    nvml({0: device()})
    before = ClockSampler([0]).sample()
    nvml({0: device(reasons=HW_THERMAL)})
    after = ClockSampler([0]).sample()
    assert throttle_verdict(before, after) == (True, ["after GPU 0: hw_thermal_slowdown"])


def test_idle_low_clock_is_not_throttled(nvml):
    nvml({0: device(sm=345, reasons=IDLE)})
    s = ClockSampler([0]).sample()
    assert throttle_verdict(s, s) == (False, [])


def test_application_clock_setting_is_not_throttled(nvml):
    nvml({0: device(sm=1410, reasons=APP_CLOCKS)})
    s = ClockSampler([0]).sample()
    assert throttle_verdict(s, s) == (False, [])


def test_busy_clock_well_below_max_is_flagged(nvml):
    nvml({0: device(sm=1000)})
    s = ClockSampler([0]).sample()
    throttled, reasons = throttle_verdict(s, s)
    assert throttled is True
    assert reasons[0] == "before GPU 0: SM clock 1000 MHz < 80% of max 1980 MHz while busy"


def test_unsupported_power_query_is_none_not_an_error(nvml):
    nvml({0: device(power_mw=None)})
    s = ClockSampler([0]).sample()
    assert s["devices"][0]["power_w"] is None
    assert throttle_verdict(s, s) == (False, [])


def test_unreadable_reasons_make_the_verdict_unknown(nvml):
    nvml({0: device(reasons=None)})
    s = ClockSampler([0]).sample()
    throttled, reasons = throttle_verdict(s, s)
    assert throttled is None and "unreadable" in reasons[0]


def test_nvml_missing_is_unavailable_not_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    s = ClockSampler([0]).sample()
    assert s == {"available": False, "reason": "pynvml (nvidia-ml-py) is not installed"}
    throttled, reasons = throttle_verdict(s, s)
    assert throttled is None
    assert reasons[0].startswith("before: clocks unavailable")


def test_nvml_init_failure_is_unavailable(nvml):
    nvml({0: device()}, init_error=True)
    s = ClockSampler([0]).sample()
    assert s["available"] is False and "Driver Not Loaded" in s["reason"]


def test_cuda_visible_devices_maps_to_nvml_index(nvml, monkeypatch):
    nvml({3: device(sm=1111, max_sm=1111), 5: device(sm=1555, max_sm=1555)})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    s = ClockSampler([1]).sample()
    assert s["devices"][0]["index"] == 1 and s["devices"][0]["sm_clock_mhz"] == 1555
    with pytest.raises(ValueError, match="CUDA device 2 does not exist"):
        ClockSampler([2])


def test_record_fields_fit_the_raw_schema(nvml):
    nvml({0: device(sm=1700, reasons=POWER_CAP)})
    s = ClockSampler([0]).sample()
    point = {"backend": "fa3", "mode": "fused", "heads": 8, "seq_len": 4096, "world_size": 2}
    known = ok_record("p", {"id": "p", **point}, {"t_us": [1.0]}, **record_fields(s, s))
    assert known["throttled"] is True
    assert known["clocks"]["verdict_reasons"] == [
        "before GPU 0: sw_power_cap",
        "after GPU 0: sw_power_cap",
    ]
    gone = {"available": False, "reason": "no NVML"}
    other = {"id": "q", **point, "seq_len": 8192}  # one record per point
    unknown = ok_record("q", other, {"t_us": [1.0]}, **record_fields(gone, gone))
    assert unknown["throttled"] is None
    env = environment(simulated=False)
    validate_raw(
        raw_document(
            experiment="attention",
            backend="cuda",
            dataset="d",
            environment=env,
            config={},
            records=[known, unknown],
        ),
        "test",
    )
