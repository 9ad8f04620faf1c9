"""Where our kernel's schedule is decided (megamoe.schedule_on) and the oracle arms beside
the device-decided ones (megamoe.oracle_arms): the points a sweep plans, what a raw file
may call them, the config's errors, and tab-megamoe's section comparing the two."""

import copy
from pathlib import Path

import pytest
import yaml

from xstage_bench.data import rawchecks
from xstage_bench.data.config import ConfigError, validate_config
from xstage_bench.data.grid import side_arm
from xstage_bench.data.results import ok_record
from xstage_bench.megamoe.points import arm_sets, config_id, expand_points
from xstage_bench.report.analysis.frames import records_frame
from xstage_bench.report.analysis.megamoe import main_grid, megamoe_speedups
from xstage_bench.report.tables import megamoe_oracle
from xstage_bench.report.tables.megamoe import oracle_rows

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {
    "id": "s/w8a8/balanced/T=1024/P=1/path=host/f=0.25",
    "shape": "s",
    "precision": "w8a8",
    "routing": "balanced",
    "tokens_per_rank": 1024,
    "world_size": 1,
    "path": "host",
    "remote_fraction": 0.25,
}
DEVICE = {
    "schedules": ["expert_wave", "interleaved"],
    "lead_rows": 512,
    "variants": ["ours"],
    "schedule_on": "device",
    "oracle_arms": ["interleaved"],
}


def test_device_arms_carry_where_they_were_decided_and_oracles_sit_beside_them():
    points = expand_points([CONFIG], DEVICE)
    ids = [p["id"].removeprefix(CONFIG["id"] + "/") for p in points]
    assert ids == ["expert_wave", "interleaved", "interleaved/oracle"]
    assert [p["decided_on"] for p in points] == ["device", "device", "list"]
    oracle = points[2]
    assert oracle["oracle"] and oracle["lead_rows"] == points[1]["lead_rows"] == 512
    assert [side_arm(p) for p in points] == [False, False, True]
    assert {config_id(p) for p in points} == {CONFIG["id"]}
    # the oracle is timed in the same paired rounds as the device-decided arms
    assert [len(arms) for arms in arm_sets(points).values()] == [3]


def test_list_decided_points_are_the_records_before_device_schedules():
    points = expand_points([CONFIG], {**DEVICE, "schedule_on": "list", "oracle_arms": []})
    assert [p["id"].rsplit("/", 1)[1] for p in points] == ["expert_wave", "interleaved"]
    assert all("decided_on" not in p and "oracle" not in p for p in points)


def test_a_raw_file_may_name_an_oracle_arm_only_on_an_oracle_point():
    point = expand_points([CONFIG], DEVICE)[2]
    record = {"id": point["id"], "point": point}
    assert rawchecks.id_problem("megamoe", record) is None
    plain = {**point, "oracle": False}
    assert "'oracle'" in rawchecks.id_problem("megamoe", {"id": point["id"], "point": plain})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schedule_on": "list"}, "needs megamoe.schedule_on 'device'"),
        (
            {"schedules": ["expert_wave", "interleaved"], "oracle_arms": ["deepgemm_interleaved"]},
            "not in megamoe.schedules",
        ),
    ],
)
def test_oracle_arms_need_device_decisions_and_a_schedule_the_grid_runs(change, message):
    config = copy.deepcopy(yaml.safe_load((ROOT / "config.yaml").read_text()))
    config["megamoe"].update({"schedule_on": "device", "oracle_arms": ["interleaved"], **change})
    with pytest.raises(ConfigError, match=message) as found:
        validate_config(config)
    assert "megamoe.oracle_arms" in str(found.value)


def _records(device_us: float, oracle_us: float) -> list[dict]:
    """One configuration: expert waves and interleaved decided on the device, interleaved
    from its list, timed in three paired rounds."""
    points = expand_points([CONFIG], DEVICE)
    arms = [p["id"] for p in points]
    out = []
    for point, us in zip(points, (120.0, device_us, oracle_us), strict=True):
        times = [us, us * 1.01, us * 0.99]
        record = ok_record(point["id"], point, {"time_us": times, "kernel_us": times})
        record["extra"] = {"paired": {"arms": arms, "rounds": 3}}
        out.append(record)
    return out


def test_the_speedup_tables_leave_the_oracle_out_and_its_section_compares_it():
    doc = {"records": _records(device_us=98.0, oracle_us=100.0)}
    speedups, _ = megamoe_speedups(doc)
    assert len(speedups) == 1 and speedups["speedup"].iloc[0] == pytest.approx(120.0 / 98.0)
    assert len(main_grid(records_frame(doc))) == 2
    pairs = megamoe_oracle.oracle_pairs(doc)
    assert list(pairs["schedule"]) == ["interleaved"]
    rows = oracle_rows(pairs)
    assert set(rows["metric"]) == {"layer time (kernel + barrier + reduction)", "kernel time"}
    # oracle time over device time: above 1, the device rule is faster
    assert rows["geomean"].tolist() == pytest.approx([100.0 / 98.0] * 2)


def test_an_oracle_without_its_device_arm_is_not_compared():
    doc = {"records": [r for r in _records(98.0, 100.0) if r["point"].get("oracle")]}
    assert megamoe_oracle.oracle_pairs(doc).empty


def test_the_oracle_section_splits_into_parts_a_reader_can_read():
    """An H100 run of the 84 configurations stopped at this section: 16 columns in one
    Markdown table, more than common.py allows."""
    import pandas as pd

    from xstage_bench.report.tables import common, megamoe

    rows = oracle_rows(megamoe_oracle.oracle_pairs({"records": _records(98.0, 100.0)}))
    sections = [(megamoe.ORACLE_SECTION, rows)]
    whole = common.Table(pd.DataFrame({"a": [1]}), "t", "x", sections=sections)
    with pytest.raises(ValueError, match="more than"):
        common.markdown(whole)
    split = common.markdown(
        common.Table(
            pd.DataFrame({"a": [1]}),
            "t",
            "x",
            sections=sections,
            columns={megamoe.ORACLE_SECTION: megamoe.ORACLE_COLUMNS},
        )
    )
    assert "oracle time over device time" in split and "counts" in split
