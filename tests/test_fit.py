"""Fitting T0, R, Q: simulate a reduced microbench grid from a profile, fit, recover it;
and the model's checks, each made to pass on data that follows the laws and to fail on
data (simulated, then edited) that breaks the assumption it tests."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from fixtures import MICROBENCH_DEFAULTS

from xstage_bench.data.hardware import load_profile
from xstage_bench.data.results import RawResultError, ok_record, read_raw, write_raw
from xstage_bench.model import checks, fit, validation
from xstage_bench.model.stages import FitError
from xstage_bench.sim import run

ROOT = Path(__file__).resolve().parents[1]
H200 = str(ROOT / "tests" / "data" / "h200-seed.yaml")  # fixed: independent of refits
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
            "defaults": dict(MICROBENCH_DEFAULTS),
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
    ceilings={"kind": "ceiling", "method": ["sm_store"], "dest": ["peer"], "V": [64 * MiB]},
)
# Aligned bursts beside free-running ones whose producers start up to 20 us apart.
ALIGNED = microbench(
    drain={"kind": "periodic", "K": [33, 132], "V": [4 * MiB, 16 * MiB], "gap_us": [0]},
    drain_barrier={
        "kind": "periodic",
        "K": [33, 132],
        "V": [4 * MiB, 16 * MiB],
        "gap_us": [0],
        "sync": ["barrier"],
    },
    gap_sweep_barrier={
        "kind": "periodic",
        "K": [132],
        "V": [1 * MiB, 2 * MiB, 8 * MiB],
        "gap_us": [0, 2, 4, 10, 30, 60],
        "sync": ["barrier"],
    },
    isolated={"kind": "isolated", "K": [33, 132], "V": ISOLATED_V, "sync": ["barrier"]},
)
JITTER = run.SimOptions(start_jitter_us=20.0)


def simulate(tmp, config: dict, profile: str, studies=None, free_options=None) -> list[str]:
    """Simulated raw files; free_options (e.g. start jitter) applies to free-running studies."""
    paths = []
    for study in studies or config["microbench"]["studies"]:
        out = tmp / "raw" / f"{study}.json"
        free = "barrier" not in config["microbench"]["studies"][study].get("sync", [])
        options = free_options if free else None
        run.simulate_microbench(config, profile, study, "sim-test", str(out), options)
        paths.append(str(out))
    return paths


def edit_samples(path: str, edit) -> None:
    """Rewrite a raw file's ok records: edit(point, samples) returns the new samples."""
    doc = read_raw(path)
    doc["records"] = [
        ok_record(r["id"], r["point"], edit(r["point"], dict(r["samples"])))
        if r["status"] == "ok"
        else r
        for r in doc["records"]
    ]
    write_raw(path, doc)


def fit_dir(tmp, paths, base=None, **kw) -> dict:
    return fit.fit_files(
        paths,
        "sim-test",
        str(tmp / "model" / "burst_gap.json"),
        str(tmp / "model" / "profile.yaml"),
        base,
        **kw,
    )


def assert_truth_in_ci(params: dict, truth) -> None:
    """Each fitted parameter is within 2% of the profile, and its 95% CI holds the truth."""
    for name, true in (
        ("R_GBps", truth.drain_rate_GBps),
        ("Q_bytes", truth.capacity_bytes),
        ("t0_fixed_us", truth.t0_fixed_us),
        ("issue_rate_per_sm_GBps", truth.issue_rate_per_sm_GBps),
    ):
        p = params[name]
        assert p["value"] == pytest.approx(true, rel=0.02), (name, p)
        assert p["ci_low"] <= true <= p["ci_high"], (name, true, p)


@pytest.mark.parametrize("t0_fixed", [0.2, 0.5])
def test_fitted_Q_is_unbiased_whatever_the_fixed_overhead(tmp_path, t0_fixed):
    # The simulator's isolated burst and the fitted law are one definition
    # (PathParams.issue_end): Q used to come out low by about R * t0_fixed.
    raw = yaml.safe_load(Path(H200).read_text())
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({**raw, "t0_fixed_us": t0_fixed}))
    studies = ["drain", "gap_sweep", "isolated"]
    result = fit_dir(tmp_path, simulate(tmp_path, REDUCED, str(profile), studies), n_bootstrap=100)
    assert_truth_in_ci(result["params"], load_profile(profile))


@pytest.mark.parametrize("profile", [H200, B200], ids=["h200", "b200"])
def test_fit_recovers_the_profile(tmp_path, profile):
    truth = load_profile(profile)
    result = fit_dir(tmp_path, simulate(tmp_path, REDUCED, profile), profile, n_bootstrap=100)
    p = result["params"]
    assert_truth_in_ci(p, truth)
    for K, V in ((33, 1 * MiB), (132, 2 * MiB), (132, 8 * MiB)):
        T0 = p["t0_fixed_us"]["value"] + V / K / (p["issue_rate_per_sm_GBps"]["value"] * 1e3)
        assert T0 == pytest.approx(truth.t0_us(K, V), rel=0.02)
    verdicts = {name: c["passed"] for name, c in result["checks"].items()}
    assert verdicts == {
        "split_consistency": True,
        "t0_plateau_flat": True,
        "stall_in_store_loop": None,  # no aligned records: nothing to tell apart
        "one_Q_explains_isolated": True,
        "per_producer_Q_fits_better": False,  # the truth is one shared Q
        "r_matches_sm_store_ceiling": True,
        "r_within_line_rate": True,
        "heldout_error_within_target": True,
    }, result["checks"]
    assert "met by" in result["checks"]["heldout_error_within_target"]["detail"]
    assert result["fit_set"]["isolated"] == "all (no aligned records)"
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
    assert {r["metric"] for r in rows} == {"t_iss_slowest_us", "period_us"}
    periodic = [r for r in rows if r["kind"] == "periodic"]
    assert len(periodic) == 2 * (4 + 15)  # an issue time and a period per periodic record
    assert result["validation_by_metric"]["period_us"]["median_abs_rel_error"] < 0.02
    assert result["records"]["local"] == 15  # the local gap sweep: kept for figures only
    assert result["records"]["used"] == 4 + 15 + 20
    assert result["ceilings"]["peer_GBps"]["sm_store"] == pytest.approx(365.0, rel=0.02)
    assert result["ceilings"]["nvlink_line_rate_GBps"] == 450.0


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
    # The per-producer variant finds the window and predicts the held-out bursts better.
    window = result["variants"]["per_producer_Q"]
    assert window["params"]["q_bytes"]["value"] == pytest.approx(16384, rel=0.05)
    better = result["checks"]["per_producer_Q_fits_better"]
    assert better["passed"] is True and "per-producer window fits" in better["detail"]
    assert (
        window["validation_summary"]["median_abs_rel_error"]
        < result["validation_summary"]["median_abs_rel_error"]
    )


def test_holdout_split_is_deterministic_and_about_a_fifth():
    ids = [f"gap_sweep/K=132/V={v}/gap_us={g}" for v in range(100) for g in range(10)]
    held = [validation.held_out(i) for i in ids]
    assert held == [validation.held_out(i) for i in ids]
    assert 0.15 < np.mean(held) < 0.25


def test_backends_are_never_mixed(tmp_path):
    paths = simulate(tmp_path, REDUCED, H200, ["drain"])
    doc = read_raw(paths[0])
    doc["backend"] = "cuda"
    write_raw(tmp_path / "cuda.json", doc)
    with pytest.raises(ValueError, match="different backends"):
        fit_dir(tmp_path, paths + [str(tmp_path / "cuda.json")])


def test_aligned_records_are_fitted_and_free_ones_validated_apart(tmp_path):
    paths = simulate(tmp_path, ALIGNED, H200, free_options=JITTER)
    result = fit_dir(tmp_path, paths, H200, n_bootstrap=20)
    assert set(result["fit_set"].values()) == {"aligned"}
    assert result["params"]["R_GBps"]["value"] == pytest.approx(365.0, rel=0.02)
    rows = result["validation"]
    apart = [r for r in rows if not r["in_fit_set"]]
    assert apart and all(r["study"] == "drain" and r["sync"] == "free" for r in apart)
    assert all(r["held_out"] and not r["aligned"] for r in apart)  # never fitted
    fitted = [r for r in rows if r["in_fit_set"]]
    assert all(r["aligned"] and r["sync"] == "barrier" for r in fitted)
    assert result["validation_summary"]["n"] == sum(r["held_out"] for r in fitted)
    assert result["validation_summary_free"]["n"] == len(apart)
    group = result["validation_by_group"]["drain/free:t_iss_slowest_us"]
    assert group["n"] == group["all"]["n"] == len(apart) // 2
    # The simulated barrier keeps the backlog between bursts, so the store loop stalls.
    assert result["checks"]["stall_in_store_loop"]["passed"] is True


def test_a_barrier_that_holds_the_drain_fails_the_store_loop_check(tmp_path):
    """As on 2x H200: bursts that fit in Q issue in T0 even at G=0, and the wait for the
    drain shows in the period instead (a barrier that completes once the path is empty)."""
    paths = simulate(tmp_path, ALIGNED, H200, ["drain_barrier", "gap_sweep_barrier", "isolated"])
    truth = load_profile(H200)

    def drained_start(point, samples):
        T0 = truth.t0_us(point["K"], point["V"])
        if point["kind"] == "periodic" and point["V"] <= truth.capacity_bytes:
            samples["t_iss_slowest_us"] = [T0] * len(samples["t_iss_slowest_us"])
        return samples

    edit_samples(paths[1], drained_start)
    check = fit_dir(tmp_path, paths, H200, n_bootstrap=10)["checks"]["stall_in_store_loop"]
    assert check["passed"] is False
    assert "moved out of the store loop into the wait between bursts" in check["detail"]


def test_R_comes_from_the_aggregate_issue_rate_where_records_have_it(tmp_path):
    """Drifting producers shorten each one's own period; the aggregate rate does not drift."""
    paths = simulate(tmp_path, REDUCED, H200, ["drain", "gap_sweep", "isolated"])

    def drifting(point, samples):
        if point["kind"] == "periodic" and point["gap_us"] == 0:
            samples["issue_rate_GBps"] = [365.0, 366.0, 364.0]
            samples["period_us"] = [0.5 * p for p in samples["period_us"]]
        return samples

    edit_samples(paths[0], drifting)
    result = fit_dir(tmp_path, paths, H200, n_bootstrap=10)
    assert result["zero_gap_sources"] == {"issue_rate": 4, "period": 3}  # gap_sweep has none
    assert result["params"]["R_GBps"]["value"] == pytest.approx(365.0, rel=0.02)


def test_R_off_the_ceiling_or_above_the_line_rate_fails_its_check(tmp_path):
    paths = simulate(tmp_path, REDUCED, H200, ["drain", "isolated", "ceilings"])
    edit_samples(paths[2], lambda p, s: {"bandwidth_GBps": [2 * b for b in s["bandwidth_GBps"]]})
    slow_link = tmp_path / "slow_link.yaml"
    slow_link.write_text(
        yaml.safe_dump({**load_profile(H200).as_dict(), "nvlink_line_rate_GBps": 300.0})
    )
    result = fit_dir(tmp_path, paths, str(slow_link), n_bootstrap=10)
    ceiling = result["checks"]["r_matches_sm_store_ceiling"]
    off = result["params"]["R_GBps"]["value"] / result["ceilings"]["peer_GBps"]["sm_store"] - 1
    assert off == pytest.approx(-0.5, abs=0.02)
    assert ceiling["passed"] is False and f"{off:+.1%}" in ceiling["detail"]
    line = result["checks"]["r_within_line_rate"]
    assert line["passed"] is False and "above the 300 GB/s NVLink line rate" in line["detail"]


def test_heldout_target_says_by_how_much_and_where_it_fails():
    def summary(median, n=10):
        return {"n": n, "median_abs_rel_error": median, "p90_abs_rel_error": 2 * median}

    shared = {
        "validation_summary": summary(0.12),
        "validation_summary_free": summary(0.3, 40),
        "validation_by_metric": {"t_iss_slowest_us": summary(0.12)},
        "validation_by_group": {
            "isolated/barrier:t_iss_slowest_us": {**summary(0.2, 4), "all": summary(0.18, 20)},
            "drain/barrier:period_us": {**summary(0.01, 3), "all": summary(0.02, 15)},
        },
    }
    window = {"validation_summary": summary(0.04)}
    check = checks.heldout_error_within_target(shared, window, {"isolated": "aligned"})
    assert check["passed"] is False
    detail = check["detail"]
    assert "missed by 7.0 points" in detail
    assert "isolated/barrier:t_iss_slowest_us 20% (n=4), all records 18% (n=20)" in detail
    assert "drain/barrier" not in detail  # within target
    assert "per-producer window variant: held-out median |err| 4.0%" in detail
    assert "free-running records (never fitted): median |err| 30.0%" in detail


def test_a_bad_value_is_refused_naming_the_file(tmp_path):
    paths = simulate(tmp_path, REDUCED, H200)
    isolated = next(p for p in paths if p.endswith("isolated.json"))
    doc = json.loads(Path(isolated).read_text())
    doc["records"][0]["samples"]["t_iss_slowest_us"][0] = float("nan")
    Path(isolated).write_text(json.dumps(doc))
    with pytest.raises(RawResultError, match=r"isolated\.json: record '.*': .*NaN"):
        fit_dir(tmp_path, paths, n_bootstrap=2)


def test_a_record_the_fit_cannot_use_is_named_with_its_file(tmp_path):
    paths = simulate(tmp_path, REDUCED, H200, studies=["isolated"])
    doc = json.loads(Path(paths[0]).read_text())
    rec = doc["records"][0]
    del rec["samples"]["t_iss_slowest_us"], rec["summary"]["t_iss_slowest_us"]
    Path(paths[0]).write_text(json.dumps(doc))
    with pytest.raises(
        RawResultError, match=rf"isolated\.json: record '{rec['id']}'.*t_iss_slowest"
    ):
        fit_dir(tmp_path, paths, n_bootstrap=2)


def test_a_failing_fit_names_the_files(tmp_path, monkeypatch):
    paths = simulate(tmp_path, REDUCED, H200, studies=["drain", "isolated"])

    def broken(*_, **__):
        raise ValueError("Residuals are not finite in the initial point.")

    monkeypatch.setattr(fit, "fit_chain", broken)
    with pytest.raises(FitError, match=r"fitting .*drain\.json, .*isolated\.json: ValueError"):
        fit_dir(tmp_path, paths, n_bootstrap=2)
    assert not (tmp_path / "model" / "burst_gap.json").exists()


# ---- store paths ---------------------------------------------------------------------

HOST_LINK = {"kind": "pcie", "gpu": "NVIDIA H200", "gen": 5, "width": 16, "line_rate_GBps": 63.0}


def host_profile(tmp) -> Path:
    """A SYNTHETIC host path: the H200 seed with R = 52 GB/s (as seen for SM stores into
    pinned host memory over PCIe Gen5 x16) and a capacity of 1 MiB."""
    path = tmp / "host.yaml"
    base = load_profile(H200).as_dict()
    path.write_text(yaml.safe_dump({**base, "drain_rate_GBps": 52.0, "capacity_bytes": 1 << 20}))
    return path


def as_host_path(path: str) -> None:
    """Rewrite a simulated (peer-path) raw file as host-path records: the remote points'
    dest and path become 'host' (ids too), local controls are dropped (the peer set has
    them), and the environment names a PCIe Gen5 x16 host link."""
    doc = read_raw(path)
    records = []
    for r in doc["records"]:
        if r["point"].get("dest") == "local":
            continue
        point = {**r["point"], "dest": "host", "path": "host"}
        rid = r["id"].replace("dest=peer", "dest=host")
        records.append({**r, "id": rid, "point": {**point, "id": rid}})
    doc["records"] = records
    doc["environment"]["host_links"] = [HOST_LINK]
    write_raw(path, doc)


def two_paths(tmp, studies=("drain", "gap_sweep", "isolated", "ceilings")) -> list[str]:
    peer = simulate(tmp / "peer", REDUCED, H200, list(studies))
    host = simulate(tmp / "host", REDUCED, str(host_profile(tmp)), list(studies))
    for path in host:
        as_host_path(path)
    return peer + host


def test_each_store_path_is_fitted_on_its_own_records(tmp_path):
    result = fit_dir(tmp_path, two_paths(tmp_path), H200, n_bootstrap=30)
    assert result["path"] == "peer" and result["paths"] == ["peer", "host"]
    peer, host = result, result["other_paths"]["host"]
    assert peer["params"]["R_GBps"]["value"] == pytest.approx(365.0, rel=0.02)
    R = host["params"]["R_GBps"]
    assert R["value"] == pytest.approx(52.0, rel=0.02) and R["ci_low"] <= 52.0 <= R["ci_high"]
    assert host["params"]["Q_bytes"]["value"] == pytest.approx(1 << 20, rel=0.05)
    # T0 is the issuer's: the same on both paths
    assert host["params"]["t0_fixed_us"]["value"] == pytest.approx(
        peer["params"]["t0_fixed_us"]["value"], rel=0.05
    )
    assert {k["K"]: round(k["R_GBps"]["value"]) for k in host["per_K"]} == {33: 52, 132: 52}
    # every validation row and count belongs to its path; local controls are the peer set's
    assert {r["path"] for r in host["validation"]} == {r["dest"] for r in host["validation"]}
    assert {r["path"] for r in host["validation"]} == {"host"}
    assert {r["path"] for r in peer["validation"]} == {"peer"}
    assert host["records"]["used"] == peer["records"]["used"] == 4 + 15 + 20
    assert host["records"]["other_paths"] == peer["records"]["used"] + 1  # + the peer ceiling
    # each path's R against its own ceiling and line rate
    assert host["ceilings"]["host_GBps"]["sm_store"] == pytest.approx(52.0, rel=0.02)
    assert host["ceilings"]["host_line_rate_GBps"] == 63.0
    assert host["ceilings"]["line_rate_source"].endswith("pcie gen 5 x16 (specification)")
    checks_ = host["checks"]
    assert checks_["r_matches_sm_store_ceiling"]["passed"] is True
    assert "SM-store ceiling to host memory" in checks_["r_matches_sm_store_ceiling"]["detail"]
    assert checks_["r_within_line_rate"]["passed"] is True
    assert "63 GB/s host link line rate" in checks_["r_within_line_rate"]["detail"]
    assert peer["checks"]["r_within_line_rate"]["detail"].count("450 GB/s NVLink") == 1
    # the file validates and its host fit reads back in a one-path model's shape
    from xstage_bench.model.document import path_fit, read_model

    written = read_model(tmp_path / "model" / "burst_gap.json")
    assert path_fit(written, "host")["params"] == host["params"]
    assert path_fit(written, "host")["dataset"] == "sim-test"
    # the refit profile is the top level's (the peer path)
    assert load_profile(tmp_path / "model" / "profile.yaml").drain_rate_GBps == pytest.approx(
        365.0, rel=0.02
    )


def test_a_host_only_dataset_gives_one_complete_fit_named_host(tmp_path):
    paths = simulate(tmp_path, REDUCED, str(host_profile(tmp_path)))
    for path in paths:
        as_host_path(path)
    result = fit_dir(tmp_path, paths, H200, n_bootstrap=20)
    assert result["path"] == "host" and result["paths"] == ["host"]
    assert "other_paths" not in result
    assert result["params"]["R_GBps"]["value"] == pytest.approx(52.0, rel=0.02)
    assert result["checks"]["r_matches_sm_store_ceiling"]["passed"] is True
    assert result["validation_summary"]["median_abs_rel_error"] < 0.02
    text = (tmp_path / "model" / "profile.yaml").read_text()
    assert "Store path 'host' (host memory)" in text
    profile = load_profile(tmp_path / "model" / "profile.yaml")
    assert profile.drain_rate_GBps == pytest.approx(52.0, rel=0.02)
    assert profile.name == "sim-test (fitted, host path)"


def test_a_host_path_without_a_recorded_host_link_leaves_its_line_rate_unchecked(tmp_path):
    paths = simulate(tmp_path, REDUCED, str(host_profile(tmp_path)), ["drain", "isolated"])
    for path in paths:
        as_host_path(path)
        doc = read_raw(path)
        del doc["environment"]["host_links"]  # as in files written before the host path
        write_raw(path, doc)
    check = fit_dir(tmp_path, paths, H200, n_bootstrap=5)["checks"]["r_within_line_rate"]
    assert check["passed"] is None and "host_links[0].line_rate_GBps" in check["detail"]


def test_the_committed_reference_still_reads_and_fits_as_the_peer_path(tmp_path):
    """results/ref-h200x2 predates store paths: its model file is the peer path's fit, and
    its raw files (records without `path`) refit to the same R."""
    from xstage_bench.model.document import fitted_paths, path_fit, primary_path, read_model

    ref = ROOT / "results" / "ref-h200x2"
    model = read_model(ref / "model" / "burst_gap.json")
    assert primary_path(model) == "peer" and fitted_paths(model) == ["peer"]
    assert path_fit(model, "peer") is model
    with pytest.raises(ValueError, match="no fit for store path 'host'"):
        path_fit(model, "host")
    raw = sorted(str(p) for p in (ref / "raw" / "microbench").glob("*.json"))
    result = fit_dir(tmp_path, raw, H200, n_bootstrap=2)
    assert result["paths"] == ["peer"] and "other_paths" not in result
    assert result["params"]["R_GBps"]["value"] == pytest.approx(
        model["params"]["R_GBps"]["value"], rel=1e-6
    )
    assert result["records"]["used"] == model["records"]["used"]


def test_a_model_file_cut_short_names_its_line_and_column(tmp_path):
    from xstage_bench.model.document import ModelFileError, read_model

    cut = tmp_path / "burst_gap.json"
    cut.write_text('{"schema": 1, "fit": "')
    with pytest.raises(ModelFileError) as e:
        read_model(cut)
    assert str(e.value) == (
        f"{cut}: not valid JSON (Unterminated string starting at line 1, column 22)"
    )
