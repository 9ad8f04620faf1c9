"""Grid expansion: stable ids, store-aligned bursts, the sweeps' sizes."""

from pathlib import Path

import pytest

from xstage_bench.data.config import load_config
from xstage_bench.data.grid import (
    attention_points,
    megamoe_points,
    microbench_points,
    producer_bytes,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cfg():
    return load_config(ROOT / "config.yaml")


def test_producer_bytes_are_16_byte_aligned():
    assert producer_bytes(4 * 2**20, 132) == 31760
    assert producer_bytes(4 * 2**20, 132) % 16 == 0
    with pytest.raises(ValueError, match="too small"):
        producer_bytes(1000, 132)


def test_microbench_points_are_unique_and_complete(cfg):
    for study in cfg["microbench"]["studies"]:
        points = microbench_points(cfg["microbench"], study)
        ids = [p["id"] for p in points]
        assert len(ids) == len(set(ids)), study
        for p in points:
            assert p["study"] == study
            if p["kind"] != "ceiling":
                assert p["V"] == p["K"] * p["B"]


def test_study_axes_override_defaults(cfg):
    points = microbench_points(cfg["microbench"], "gap_sweep")
    assert {p["dest"] for p in points} == {"peer", "local"}
    assert {p["width"] for p in points} == {16}
    gaps = cfg["microbench"]["studies"]["gap_sweep"]["gap_us"]
    assert len(points) == 5 * len(gaps) * 2


def test_megamoe_grid_is_84_configurations(cfg):
    points = megamoe_points(cfg["megamoe"], 2)
    assert len(points) == 84
    assert len({p["id"] for p in points}) == 84
    with pytest.raises(ValueError, match="do not divide"):
        megamoe_points(cfg["megamoe"], 3)


def test_attention_grid_checks_heads_divide(cfg):
    assert len(attention_points(cfg["attention"], 2)) == 3 * 3 * 2 * 6
    with pytest.raises(ValueError, match="heads=24"):
        attention_points(cfg["attention"], 16)


def test_a_remote_fraction_is_a_configuration_of_its_own(cfg):
    moe = {**cfg["megamoe"], "remote_fractions": ["natural", 0.875]}
    points = megamoe_points(moe, 2)
    assert len(points) == 2 * len(megamoe_points(cfg["megamoe"], 2))
    natural, rehomed = points[0], points[1]
    assert "remote_fraction" not in natural and not natural["id"].endswith("/f=natural")
    assert rehomed["remote_fraction"] == 0.875 and rehomed["id"] == natural["id"] + "/f=0.875"


def test_the_host_path_has_one_configuration_per_host_share(cfg):
    moe = {**cfg["megamoe"], "remote_fractions": ["natural", 0, 0.25]}
    host = megamoe_points(moe, 1, ["host"])
    assert len(host) == 2 * 84  # 'natural' is the f = 0 control there
    assert {p["path"] for p in host} == {"host"}
    assert (
        host[0]["id"].endswith("/T=1024/P=1/path=host/f=0") and host[1]["remote_fraction"] == 0.25
    )
    both = megamoe_points(moe, 2, ["peer", "host"])
    peer = [p for p in both if p["path"] == "peer"]
    assert [p["id"] for p in peer] == [p["id"] for p in megamoe_points(moe, 2)]
    assert len(both) == 3 * 84 + 2 * 84
