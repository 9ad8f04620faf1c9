"""Fitting T0, R, Q: simulate a reduced microbench grid from a profile, fit, recover it."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from xstage_bench.hardware import load_profile
from xstage_bench.model import fit
from xstage_bench.results import read_raw, write_raw
from xstage_bench.sim import run

ROOT = Path(__file__).resolve().parents[1]
H200 = str(ROOT / "config" / "hardware" / "h200.yaml")
B200 = str(ROOT / "config" / "hardware" / "b200.yaml")
MiB = 1 << 20
ISOLATED_V = [
    256 << 10,
    1 * MiB,
    2 * MiB,
    3 * MiB,
    4 * MiB,
    6 * MiB,
    8 * MiB,
    12 * MiB,
    16 * MiB,
    24 * MiB,
]


def microbench(**studies) -> dict:
    return {
        "microbench": {
            "bursts": 12,
            "warmup_bursts": 4,
            "launches": 3,
            "defaults": {
                "width": 16,
                "dest": "peer",
                "pattern": "same",
                "peers": 1,
                "sync": "free",
                "gap_mode": "compute",
            },
            "studies": studies,
        }
    }


REDUCED = microbench(
    drain={"kind": "periodic", "K": [33, 132], "V": [4 * MiB, 16 * MiB], "gap_us": [0]},
    gap_sweep={
        "kind": "periodic",
        "K": [132],
        "V": [1 * MiB, 2 * MiB, 8 * MiB],
        "gap_us": [0, 4, 10, 30, 60],
        "dest": ["peer", "local"],
    },
    isolated={"kind": "isolated", "K": [33, 132], "V": ISOLATED_V},
)


def simulate(tmp, config: dict, profile: str, studies=None) -> list[str]:
    paths = []
    for study in studies or config["microbench"]["studies"]:
        out = tmp / "raw" / f"{study}.json"
        run.simulate_microbench(config, profile, study, "sim-test", str(out))
        paths.append(str(out))
    return paths


def fit_dir(tmp, paths, base=None, **kw) -> dict:
    return fit.fit_files(
        paths,
        "sim-test",
        str(tmp / "model" / "burst_gap.json"),
        str(tmp / "model" / "profile.yaml"),
        base,
        **kw,
    )


@pytest.mark.parametrize("profile", [H200, B200], ids=["h200", "b200"])
def test_fit_recovers_the_profile(tmp_path, profile):
    truth = load_profile(profile)
    result = fit_dir(tmp_path, simulate(tmp_path, REDUCED, profile), profile)
    p = result["params"]
    assert p["R_GBps"]["value"] == pytest.approx(truth.drain_rate_GBps, rel=0.05)
    assert p["Q_bytes"]["value"] == pytest.approx(truth.capacity_bytes, rel=0.05)
    for K, V in ((33, 1 * MiB), (132, 2 * MiB), (132, 8 * MiB)):
        T0 = p["t0_fixed_us"]["value"] + V / K / (p["issue_rate_per_sm_GBps"]["value"] * 1e3)
        assert T0 == pytest.approx(truth.t0_us(K, V), rel=0.05)
    for name in ("R_GBps", "Q_bytes", "t0_fixed_us", "issue_rate_per_sm_GBps"):
        assert p[name]["ci_low"] <= p[name]["value"] <= p[name]["ci_high"]
    assert all(c["passed"] for c in result["checks"].values()), result["checks"]
    # What was written is what was returned, and the refit profile loads as a profile.
    assert json.loads((tmp_path / "model" / "burst_gap.json").read_text()) == result
    refit = load_profile(tmp_path / "model" / "profile.yaml")
    assert refit.drain_rate_GBps == pytest.approx(truth.drain_rate_GBps, rel=0.05)
    assert refit.sm_count == truth.sm_count and refit.world_size == truth.world_size


def test_per_K_validation_and_record_counts(tmp_path):
    profile = H200
    result = fit_dir(tmp_path, simulate(tmp_path, REDUCED, profile), profile, n_bootstrap=30)
    per_K = {k["K"]: k for k in result["per_K"]}
    assert sorted(per_K) == [33, 132]
    for k in per_K.values():
        assert k["R_GBps"]["value"] == pytest.approx(365.0, rel=0.02)
        assert k["Q_bytes"]["value"] == pytest.approx(2097152, rel=0.05)
    # T0 at the paper's B = 32 KiB: 0.1 us + 32768 bytes at 60 GB/s.
    assert per_K[132]["T0_us"]["value"] == pytest.approx(0.1 + 32768 / 60e3, rel=0.05)
    rows = result["validation"]
    held = [r for r in rows if r["held_out"]]
    assert 0 < len(held) < len(rows)
    assert result["validation_summary"]["n"] == len(held)
    assert result["validation_summary"]["median_abs_rel_error"] < 0.02
    assert {r["dest"] for r in rows} == {"peer"}
    assert result["records"]["local"] == 15  # the local gap sweep: kept for figures only
    assert result["records"]["used"] == 4 + 15 + 20


def test_dataset_without_isolated_bursts_reports_Q_null(tmp_path):
    profile = H200
    paths = simulate(tmp_path, REDUCED, profile, ["drain", "gap_sweep"])
    result = fit_dir(tmp_path, paths, profile, n_bootstrap=20)
    Q = result["params"]["Q_bytes"]
    assert Q["value"] is None and "isolated" in Q["reason"]
    assert result["params"]["R_GBps"]["value"] == pytest.approx(365.0, rel=0.05)
    assert result["checks"]["one_Q_explains_isolated"]["passed"] is None
    assert all(r["kind"] == "periodic" for r in result["validation"])
    text = (tmp_path / "model" / "profile.yaml").read_text()
    assert "# capacity_bytes: not fitted" in text
    assert yaml.safe_load(text)["capacity_bytes"] == 2097152  # kept from the base, said so


def test_dataset_without_zero_gap_records_reports_R_null(tmp_path):
    profile = H200
    paths = simulate(tmp_path, REDUCED, profile, ["isolated"])
    result = fit_dir(tmp_path, paths, None, n_bootstrap=20)
    for name in ("R_GBps", "Q_bytes", "t0_fixed_us"):
        assert result["params"][name]["value"] is None
    assert "zero-gap" in result["params"]["R_GBps"]["reason"]
    assert result["validation"] == [] and result["validation_summary"]["n"] == 0
    prof = yaml.safe_load((tmp_path / "model" / "profile.yaml").read_text())
    assert prof["sm_count"] == 132 and "drain_rate_GBps" not in prof


def test_a_Q_that_grows_with_K_fails_the_one_Q_check(tmp_path):
    # A per-producer window: each K gets its own capacity of 16 KiB per producer.
    base = load_profile(H200).as_dict()
    paths = simulate(tmp_path, REDUCED, H200, ["drain", "gap_sweep"])
    for K in (33, 132):
        prof = tmp_path / f"window{K}.yaml"
        prof.write_text(yaml.safe_dump({**base, "capacity_bytes": K * 16384}))
        cfg = microbench(**{f"iso{K}": {"kind": "isolated", "K": [K], "V": ISOLATED_V}})
        paths += simulate(tmp_path, cfg, str(prof))
    result = fit_dir(tmp_path, paths, None, n_bootstrap=20)
    per_K = {k["K"]: k["Q_bytes"]["value"] for k in result["per_K"]}
    assert per_K[132] > 3 * per_K[33]
    check = result["checks"]["one_Q_explains_isolated"]
    assert check["passed"] is False and "grows with K" in check["detail"]


def test_holdout_split_is_deterministic_and_about_a_fifth():
    ids = [f"gap_sweep/K=132/V={v}/gap_us={g}" for v in range(100) for g in range(10)]
    held = [fit.held_out(i) for i in ids]
    assert held == [fit.held_out(i) for i in ids]
    assert 0.15 < np.mean(held) < 0.25


def test_backends_are_never_mixed(tmp_path):
    paths = simulate(tmp_path, REDUCED, H200, ["drain"])
    doc = read_raw(paths[0])
    doc["backend"] = "cuda"
    write_raw(tmp_path / "cuda.json", doc)
    with pytest.raises(ValueError, match="different backends"):
        fit_dir(tmp_path, paths + [str(tmp_path / "cuda.json")])
