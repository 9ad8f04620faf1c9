"""Fitting T0, R, Q: simulate a reduced microbench grid from a profile, fit, recover it;
and the model's checks, each made to pass on data that follows the laws and to fail on
data (simulated, then edited) that breaks the assumption it tests."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from fixtures import MICROBENCH_DEFAULTS

from xstage_bench.data.hardware import load_profile
from xstage_bench.data.results import RawResultError, ok_record, read_raw, write_raw
from xstage_bench.model import checks, fit, validation
from xstage_bench.model.capacity import LAWS
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
    """Each fitted parameter is within 2% of the profile, and its 95% CI holds the truth
    (a profile of one shared capacity: S is it, q is 0, Q at any K is S)."""
    for name, true in (
        ("R_GBps", truth.drain_rate_GBps),
        ("Q_bytes", truth.capacity_bytes),
        ("S_bytes", truth.capacity_bytes),
        ("t0_fixed_us", truth.t0_fixed_us),
        ("issue_rate_per_sm_GBps", truth.issue_rate_per_sm_GBps),
    ):
        p = params[name]
        assert p["value"] == pytest.approx(true, rel=0.02), (name, p)
        assert p["ci_low"] <= true <= p["ci_high"], (name, true, p)
    assert params["q_bytes"]["value"] == 0.0


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
        "stall_visible_to_sender": None,  # no aligned records: nothing to tell apart
        "capacity_law_explains_isolated": True,
        "r_matches_sm_store_ceiling": True,
        "r_within_line_rate": True,
        "heldout_error_within_target": True,
    }, result["checks"]
    assert "met by" in result["checks"]["heldout_error_within_target"]["detail"]
    assert result["capacity_law"]["chosen"] == "shared"  # the truth is one shared capacity
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
        for name in ("R_GBps", "Q_bytes", "T0_us"):  # each CI is its own parameter's
            assert k[name]["ci_low"] <= k[name]["value"] <= k[name]["ci_high"], (name, k)
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
    assert result["checks"]["capacity_law_explains_isolated"]["passed"] is None
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


def law_profile(tmp, S: float, q: float, C: float | None = None) -> str:
    """The H200 seed with the capacity law's S, q (and ceiling C) in place of its one
    capacity."""
    path = tmp / "law.yaml"
    base = load_profile(H200).as_dict()
    law = {"capacity_bytes": S, "capacity_per_producer_bytes": q, "capacity_ceiling_bytes": C}
    path.write_text(yaml.safe_dump({**base, **law}))
    return str(path)


LAW_GRID = microbench(
    drain={"kind": "periodic", "K": [33, 132], "V": [4 * MiB, 16 * MiB], "gap_us": [0]},
    gap_sweep={"kind": "periodic", "K": [132], "V": [1 * MiB, 8 * MiB], "gap_us": [0, 30]},
    isolated={"kind": "isolated", "K": [33, 66, 132], "V": ISOLATED_V},
)


@pytest.mark.parametrize(
    ("S", "q", "law"), [(0, 16384, "window"), (1 << 20, 8192, "shared_plus_window")]
)
def test_the_capacity_law_is_recovered_and_chosen_by_held_out_error(tmp_path, S, q, law):
    # The simulator's capacity follows Q(K) = S + K q: each K meets its own knee.
    profile = law_profile(tmp_path, S, q)
    result = fit_dir(tmp_path, simulate(tmp_path, LAW_GRID, profile), H200, n_bootstrap=20)
    per_K = {k["K"]: k["Q_bytes"]["value"] for k in result["per_K"] if k["Q_bytes"]["value"]}
    assert per_K[132] > 1.5 * per_K[33]  # the knee grows with K
    chosen = result["capacity_law"]
    assert chosen["law"] == "min(S + K q, C)" and chosen["chosen"] == law, chosen
    assert chosen["fitted"].startswith("S " if S else "K x") and "K x " in chosen["fitted"]
    heldout = chosen["heldout"]
    assert heldout[law]["median_abs_rel_error"] < heldout["shared"]["median_abs_rel_error"]
    params = result["params"]
    assert params["q_bytes"]["value"] == pytest.approx(q, rel=0.05)
    assert params["S_bytes"]["value"] == pytest.approx(S, abs=0.05 * (S + 132 * q))
    assert params["Q_bytes"]["value"] == pytest.approx(S + 132 * q, rel=0.03)
    assert chosen["K_ref"] == 132
    for name in ("q_bytes", "Q_bytes"):
        p = params[name]
        assert p["ci_low"] <= p["value"] <= p["ci_high"], (name, p)
    assert result["checks"]["capacity_law_explains_isolated"]["passed"] is True
    # The paper's one shared Q, fitted beside it, misses the knees: its check would fail.
    shared = result["variants"]["shared"]["params"]["Q_bytes"]["value"]
    blocks = [
        {"K": K, "Q_bytes": {"value": v, "ci_low": None, "ci_high": None}} for K, v in per_K.items()
    ]
    assert (
        checks.capacity_law_explains_isolated(blocks, dict.fromkeys(per_K, shared), "shared")[
            "passed"
        ]
        is False
    )
    # The refit profile carries the law, and loads as a profile.
    refit = load_profile(tmp_path / "model" / "profile.yaml")
    assert refit.capacity_per_producer_bytes == pytest.approx(q, rel=0.05)
    header = (tmp_path / "model" / "profile.yaml").read_text().splitlines()[1]
    assert header == (
        "# Capacity law Q(K) = capacity_bytes + K x capacity_per_producer_bytes "
        f"(the {law} variant, chosen by held-out error)."
    )


def test_a_capacity_that_saturates_is_recovered_and_chosen_by_held_out_error(tmp_path):
    """The simulator's capacity is min(S + K q, C) with C reached at K = 132 alone (2 MiB,
    where the line gives 2.56): the capped law meets every knee and wins on held-out
    error; the line without a ceiling cannot bend to meet them."""
    S, q, C = 0.5 * MiB, 16384.0, 2.0 * MiB
    profile = law_profile(tmp_path, S, q, C)
    result = fit_dir(tmp_path, simulate(tmp_path, LAW_GRID, profile), H200, n_bootstrap=20)
    chosen = result["capacity_law"]
    assert chosen["chosen"] == "capped", chosen
    heldout = chosen["heldout"]
    for other in ("shared", "window", "shared_plus_window"):
        assert heldout["capped"]["median_abs_rel_error"] < heldout[other]["median_abs_rel_error"]
    params = result["params"]
    assert params["C_bytes"]["value"] == pytest.approx(C, rel=0.03)
    assert params["Q_bytes"]["value"] == pytest.approx(C, rel=0.03)  # at K_ref = 132
    assert params["S_bytes"]["value"] + 33 * params["q_bytes"]["value"] == pytest.approx(
        S + 33 * q, rel=0.05
    )
    assert chosen["fitted"].startswith("min(S ") and chosen["fitted"].endswith("MiB)")
    assert result["checks"]["capacity_law_explains_isolated"]["passed"] is True
    assert result["variants"]["shared_plus_window"]["params"]["C_bytes"]["value"] is None
    # the refit profile carries the ceiling, and the simulator reads it back
    refit = load_profile(tmp_path / "model" / "profile.yaml")
    assert refit.capacity_ceiling_bytes == pytest.approx(C, rel=0.03)
    header = (tmp_path / "model" / "profile.yaml").read_text().splitlines()[1]
    assert header == (
        "# Capacity law Q(K) = min(capacity_bytes + K x capacity_per_producer_bytes, "
        "capacity_ceiling_bytes) (the capped variant, chosen by held-out error)."
    )


def fit_set(**roles):
    """FitData of plain records (recs), every role empty unless given."""
    from xstage_bench.model.records import FitData

    empty = recs([], [])
    return FitData(**{r: roles.get(r, empty) for r in ("zero_gap", "periodic", "isolated")})


def test_the_held_out_split_is_stratified_seeded_and_its_folds_cover_every_record():
    study = recs(
        [1e6] * 40 + [4e6] * 40,
        [1.0] * 80,
        K=[33] * 20 + [132] * 60,
        G=[0.0] * 10 + [500.0] * 70,
        study="gap",
    )
    data = fit_set(periodic=study, isolated=recs([1e6] * 3, [1.0] * 3, kind="isolated"))
    held = validation.held_out_ids(data)
    assert held == validation.held_out_ids(data)  # deterministic
    assert validation.held_out_ids(data, seed=1) != held  # seeded
    # every stratum of study, K and regime is held out in proportion, none skipped
    for K, G in ((33, 0.0), (33, 500.0), (132, 500.0)):
        ids = [i for i, k, g in zip(study.ids, study.K, study.G, strict=True) if k == K and g == G]
        assert len(set(ids) & held) == pytest.approx(len(ids) / 5, abs=1), (K, G)
    folds = [validation.held_out_ids(data, fold=f) for f in range(validation.STRIDE)]
    assert set().union(*folds) == set(study.ids) | set(data.isolated.ids)
    assert sum(len(f) for f in folds) == len(study) + 3  # disjoint


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
    # Aligned periodic records are fitted on the sender-visible time, derived from their
    # period here (the simulator records no t_vis_slowest_us), and the file says so.
    assert {r["metric"] for r in fitted if r["kind"] == "periodic"} == {
        "t_vis_derived_us",
        "period_us",
    }
    visible = result["sender_visible"]
    assert visible["records_per_metric"]["t_vis_derived_us"] == 4 + 18
    assert "needs a new run" in visible["note"]
    # The simulated barrier keeps the backlog between bursts, so the sender sees the stall.
    assert result["checks"]["stall_visible_to_sender"]["passed"] is True


def test_a_measured_sender_visible_time_is_what_aligned_records_are_fitted_on(tmp_path):
    studies = ["drain_barrier", "gap_sweep_barrier", "isolated"]
    paths = simulate(tmp_path, ALIGNED, H200, studies)

    def measured(point, samples):  # what the kernel's barrier stamps give: 2% above the loop
        if point["kind"] == "periodic":
            samples["t_vis_slowest_us"] = [1.02 * t for t in samples["t_iss_slowest_us"]]
        return samples

    edit_samples(paths[1], measured)
    result = fit_dir(tmp_path, paths, H200, n_bootstrap=5)
    counts = result["sender_visible"]["records_per_metric"]
    assert counts == {"t_vis_slowest_us": 18, "t_vis_derived_us": 4, "t_iss_slowest_us": 0}
    rows = [r for r in result["validation"] if r["study"] == "gap_sweep_barrier"]
    assert {r["metric"] for r in rows} == {"t_vis_slowest_us", "period_us"}
    row = next(r for r in rows if r["metric"] == "t_vis_slowest_us")
    raw = next(r for r in read_raw(paths[1])["records"] if r["id"] == row["id"])
    assert row["measured_us"] == pytest.approx(np.median(raw["samples"]["t_vis_slowest_us"]))


def held_at_the_barrier(paths: list[str], period_too: bool) -> None:
    """Edit the aligned gap sweep as on the GPU: bursts that fit in Q end their store loop
    in T0 at every gap; with period_too, the barrier does not wait for the drain either
    (period T0 + G, at G > 0, so that R's zero-gap periods stay)."""
    truth = load_profile(H200)

    def edit(point, samples):
        T0 = truth.t0_us(point["K"], point["V"])
        if point["V"] <= truth.capacity_bytes:
            samples["t_iss_slowest_us"] = [T0] * len(samples["t_iss_slowest_us"])
            if period_too and point["gap_us"] > 0:
                samples["period_us"] = [T0 + point["gap_us"]] * len(samples["period_us"])
        return samples

    edit_samples(next(p for p in paths if p.endswith("gap_sweep_barrier.json")), edit)


def test_a_stall_that_leaves_the_store_loop_is_still_the_senders(tmp_path):
    """As on the GPU: bursts that fit in Q issue in T0 even at G = 0 and the wait for the
    drain lands on the barrier: the period carries it, so the sender-visible time does,
    and the store loop's small share of it is a finding, not a failed check."""
    studies = ["drain_barrier", "gap_sweep_barrier", "isolated"]
    paths = simulate(tmp_path, ALIGNED, H200, studies)
    held_at_the_barrier(paths, period_too=False)
    result = fit_dir(tmp_path, paths, H200, n_bootstrap=10)
    assert result["checks"]["stall_visible_to_sender"]["passed"] is True
    assert result["findings"]["store_loop_share"]["per_K"]["132"] < 0.5


def test_a_stall_the_sender_never_sees_fails_the_stall_check(tmp_path):
    studies = ["drain_barrier", "gap_sweep_barrier", "isolated"]
    paths = simulate(tmp_path, ALIGNED, H200, studies)
    held_at_the_barrier(paths, period_too=True)
    check = fit_dir(tmp_path, paths, H200, n_bootstrap=10)["checks"]["stall_visible_to_sender"]
    assert check["passed"] is False and "needs 80%" in check["detail"]


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


def summary(median, n=10):
    """A validation summary of n rows with this median error (p90 twice it)."""
    return {"n": n, "median_abs_rel_error": median, "p90_abs_rel_error": 2 * median}


def test_heldout_target_says_by_how_much_and_where_it_fails():
    shared = {
        "validation_summary": summary(0.12),
        "validation_summary_free": summary(0.3, 40),
        "validation_by_metric": {"t_iss_slowest_us": summary(0.12)},
        "validation_by_group": {
            "isolated/barrier:t_iss_slowest_us": {**summary(0.2, 4), "all": summary(0.18, 20)},
            "drain/barrier:period_us": {**summary(0.01, 3), "all": summary(0.02, 15)},
        },
    }
    laws = {"shared": summary(0.12), "window": summary(0.04)}
    check = checks.heldout_error_within_target(shared, laws, {"isolated": "aligned"})
    assert check["passed"] is False
    detail = check["detail"]
    assert "missed by 7.0 points" in detail
    assert "isolated/barrier:t_iss_slowest_us 20% (n=4), all records 18% (n=20)" in detail
    assert "drain/barrier" not in detail  # within target
    assert (
        "on this split, held-out median / p90: shared 12.0% / 24.0%, window 4.0% / 8.0%" in detail
    )
    assert "free-running records (never fitted): median |err| 30.0%" in detail


def test_heldout_target_fails_on_its_p90_alone():
    shared = {
        "validation_summary": {"n": 40, "median_abs_rel_error": 0.03, "p90_abs_rel_error": 0.4},
        "validation_summary_free": summary(0.0, 0),
        "validation_by_metric": {},
        "validation_by_group": {},
    }
    check = checks.heldout_error_within_target(shared, {}, {"isolated": "aligned"})
    assert check["passed"] is False
    assert "met by 2.0 points" in check["detail"] and "missed by 15.0 points" in check["detail"]


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

    monkeypatch.setattr(fit, "fit_laws", broken)
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


# ---- checks, predictions and summaries on hand-made records ---------------------------


def recs(
    V,
    y,
    *,
    K=None,
    B=None,
    G=None,
    kind="periodic",
    study="s",
    series=None,
    spread=0.0,
    metric="t_iss_slowest_us",
    loop=None,
):
    """Records of one role from plain lists; each record's samples are y * (1 -+ spread);
    loop is the store loop where the metric is not it (default: y)."""
    from xstage_bench.model.records import Recs

    n = len(V)
    V = np.asarray(V, dtype=float)
    y = np.asarray(y, dtype=float)
    K = np.asarray(K if K is not None else [1] * n, dtype=float)
    return Recs(
        ids=tuple(f"{study}/{j}" for j in range(n)),
        study=(study,) * n,
        kind=(kind,) * n,
        sync=("free",) * n,
        aligned=np.zeros(n, dtype=bool),
        K=K,
        V=V,
        B=np.asarray(B if B is not None else V / K, dtype=float),
        G=np.asarray(G if G is not None else [0.0] * n, dtype=float),
        y=y,
        samples=tuple(np.array([v * (1 - spread), v, v * (1 + spread)] * 3) for v in y),
        series=tuple(series or [f"{study}/K={k:g}/V={v:g}" for k, v in zip(K, V, strict=True)]),
        metric=(metric,) * n,
        loop=np.asarray(loop if loop is not None else y, dtype=float),
    )


def per_K_R(*rates):
    """per_K blocks from (K, R, ci_low, ci_high) in GB/s."""
    return [{"K": K, "R_GBps": {"value": v, "ci_low": lo, "ci_high": hi}} for K, v, lo, hi in rates]


def test_split_consistency_compares_the_splits_slopes_within_their_CIs():
    agree = per_K_R((33, 350.0, 345.0, 352.0), (132, 351.0, 348.0, 355.0))
    check = checks.split_consistency(agree)
    assert check["passed"] is True and "K=33: 350.0 (345.0-352.0)" in check["detail"]
    # 10% apart with narrow CIs: two drain rates, not one
    apart = per_K_R((33, 320.0, 318.0, 322.0), (132, 352.0, 350.0, 354.0))
    check = checks.split_consistency(apart)
    assert check["passed"] is False and "disagree beyond" in check["detail"]
    # no CI at all: each split still gets +-1%, so 1.5% apart agree and 3% do not
    bare = [(33, 350.0, None, None), (132, 355.0, None, None)]
    assert checks.split_consistency(per_K_R(*bare))["passed"] is True
    bare = [(33, 350.0, None, None), (132, 361.0, None, None)]
    assert checks.split_consistency(per_K_R(*bare))["passed"] is False
    one = checks.split_consistency(per_K_R((33, 350.0, 345.0, 352.0)))
    assert one["passed"] is None


def test_the_slope_of_a_split_ignores_its_fixed_cost_per_burst():
    """period = V/R + c: V/period is 8% slow at the smallest V, the slope is R."""
    from xstage_bench.model.stages import Params, slope_R

    V = np.array([2.0, 4.0, 8.0, 16.0]) * MiB
    zg = recs(V, V / 350e3 + 0.5, K=[33] * 4)
    R, c = slope_R(zg, Params(R=350e3))
    assert R == pytest.approx(350e3, rel=1e-6) and c == pytest.approx(0.5, rel=1e-6)
    with pytest.raises(FitError, match="two V or more"):
        slope_R(recs(V[:1], V[:1] / 350e3, K=[33]), Params(R=350e3))


def plateau_series(name, ys, V=1000, **kw):
    return recs([V] * len(ys), ys, G=[2.0, 5.0, 10.0][: len(ys)], series=[name] * len(ys), **kw)


def test_the_plateau_check_fails_on_the_least_flat_series_beyond_both_tolerances():
    # R = 1000 bytes/us, V = 1000 bytes: every gap >= 1 us drains the burst (the plateau).
    from xstage_bench.model.records import concat

    def Q(recs_):
        return np.full(len(recs_), 5000.0)  # every burst fits the capacity

    flat = plateau_series("a", [2.0, 2.04, 2.02])  # 2% spread: within 5%
    assert checks.t0_plateau_flat(flat, 1000.0, Q(flat))["passed"] is True
    steep = concat(flat, plateau_series("b", [2.0, 2.4, 2.2]))  # 20% and 400 ns: beyond both
    assert checks.t0_plateau_flat(steep, 1000.0, Q(steep))["passed"] is False
    # 50% but 50 ns: within two 32 ns timer ticks, so flat (the larger tolerance wins)
    short = concat(flat, plateau_series("c", [0.1, 0.15, 0.12]))
    assert checks.t0_plateau_flat(short, 1000.0, Q(short))["passed"] is True


def test_the_plateau_check_judges_only_bursts_that_fit_the_capacity():
    """A burst beyond Q(K) stalls even on an empty path: its plateau is not T0."""
    from xstage_bench.model.records import concat

    beyond = plateau_series("big", [20.0, 24.0, 22.0], V=900)  # not flat, but V > Q
    both = concat(plateau_series("a", [2.0, 2.04, 2.02]), beyond)
    Q = np.where(both.V > 950, 5000.0, 800.0)
    check = checks.t0_plateau_flat(both, 1000.0, Q)
    assert check["passed"] is True and "1 series with V <= Q(K)" in check["detail"]
    # with a capacity that holds it, the same series is judged, and fails
    assert checks.t0_plateau_flat(both, 1000.0, np.full(6, 5000.0))["passed"] is False
    # a derived sender-visible time is judged on its store loop (it carries the barrier's
    # alignment wait, which grows with G); the loop here is not flat, so the check fails
    derived = plateau_series("d", [2.0, 2.0, 2.0], metric="t_vis_derived_us", loop=[2.0, 2.4, 2.2])
    assert checks.t0_plateau_flat(derived, 1000.0, np.full(3, 5000.0))["passed"] is False


def per_K_Q(*qs):
    """per_K blocks from (K, value, ci_low, ci_high)."""
    return [{"K": K, "Q_bytes": {"value": v, "ci_low": lo, "ci_high": hi}} for K, v, lo, hi in qs]


def test_the_capacity_check_fails_where_the_law_misses_a_knee():
    knees = per_K_Q(
        (33, 1.5e6, 1.3e6, 1.6e6), (66, 2.0e6, 1.8e6, 2.2e6), (132, 3.0e6, 2.7e6, 3.2e6)
    )
    law = {33: 1.5e6, 66: 2.0e6, 132: 3.0e6}  # S + K q through them
    check = checks.capacity_law_explains_isolated(knees, law, "shared_plus_window")
    assert check["passed"] is True and "meets every K's knee" in check["detail"]
    shared = dict.fromkeys(law, 2.0e6)  # one Q for every K
    check = checks.capacity_law_explains_isolated(knees, shared, "shared")
    assert check["passed"] is False and "misses 2 of 3" in check["detail"]
    # a knee without a CI still gets +-10%: 9% off passes, 12% off fails
    bare = per_K_Q((33, 1.0e6, None, None), (132, 2.0e6, None, None))
    assert checks.capacity_law_explains_isolated(bare, {33: 1.09e6, 132: 2.0e6}, "w")["passed"]
    off = checks.capacity_law_explains_isolated(bare, {33: 1.12e6, 132: 2.0e6}, "w")
    assert off["passed"] is False
    one = checks.capacity_law_explains_isolated(per_K_Q((33, 1e6, None, None)), {33: 1e6}, "w")
    assert one["passed"] is None  # any law meets one knee


def test_the_law_with_the_least_held_out_error_is_chosen_and_a_tie_goes_to_the_simpler():
    def s(median, p90, n=10):
        return {"n": n, "median_abs_rel_error": median, "p90_abs_rel_error": p90}

    clear = {"shared": s(0.06, 0.3), "window": s(0.04, 0.3), "shared_plus_window": s(0.05, 0.2)}
    assert validation.choose_law(clear) == "window"
    # medians within 0.1 points tie: the lower p90 decides
    close = {"shared": s(0.0400, 0.3), "window": s(0.0404, 0.2), "shared_plus_window": s(0.2, 0.9)}
    assert validation.choose_law(close) == "window"
    # a full tie goes to the fewer free numbers
    tie = {law: s(0.04, 0.2) for law in ("shared_plus_window", "window", "shared")}
    assert validation.choose_law(tie) == "shared"
    assert validation.choose_law({"shared": s(None, None, 0)}) is None


def test_every_per_K_drain_rate_is_held_to_the_line_rate():
    per_K = [{"K": 33, "R_GBps": {"value": 360.0}}, {"K": 132, "R_GBps": {"value": 470.0}}]
    check = checks.r_within_line_rate({"value": 365.0}, per_K, 450.0)
    assert check["passed"] is False and "K=132: 470" in check["detail"]
    assert "pooled" not in check["detail"].split("impossible")[1]


def test_an_aligned_group_is_named_when_its_held_out_or_all_records_miss_the_target():
    shared = {
        "validation_summary": summary(0.02),
        "validation_summary_free": summary(0.0, 0),
        "validation_by_metric": {"t_iss_slowest_us": summary(0.02)},
        "validation_by_group": {
            # held out within target, all records not: a systematic miss, named
            "isolated/barrier:t_iss_slowest_us": {**summary(0.03, 4), "all": summary(0.09, 20)}
        },
    }
    aligned = checks.heldout_error_within_target(shared, {}, {"isolated": "aligned"})
    assert aligned["passed"] is True
    assert "isolated/barrier:t_iss_slowest_us 3% (n=4), all records 9% (n=20)" in aligned["detail"]
    # without aligned records in the fit set, the barrier groups are not its groups
    free = checks.heldout_error_within_target(shared, {}, {"isolated": "all"})
    assert "aligned groups" not in free["detail"]


def test_the_laws_predict_a_train_from_both_laws_and_an_isolated_burst_from_its_own():
    # The running example of test_laws: T0 = 0.5 + 50/100 = 1 us, V = 1000, R = 100, Q = 300.
    # At G = 5 the periodic law alone gives max(1, 10 - 5) = 5 us and a period of 10 us,
    # but the path empties in the gap and each burst stalls (V - Q)/R = 7 us: period 12 us.
    from xstage_bench.model.capacity import Capacity
    from xstage_bench.model.stages import Params

    p = Params(R=100.0, t0_fixed=0.5, issue_rate=100.0, capacity=Capacity("shared", 300.0, 0.0))
    train = recs([1000], [1.0], B=[50], G=[5.0])
    np.testing.assert_allclose(validation.predict(p, train, validation.ISSUE), [7.0])
    np.testing.assert_allclose(validation.predict(p, train, validation.PERIOD), [12.0])
    # G = 2: the backlog carries over, the periodic law's 8 us is the larger
    np.testing.assert_allclose(
        validation.predict(p, recs([1000], [1.0], B=[50], G=[2.0]), validation.ISSUE), [8.0]
    )
    big_Q = Params(R=100.0, t0_fixed=0.5, issue_rate=100.0, capacity=Capacity("shared", 5e3, 0))
    alone = recs([1000], [1.0], B=[50], kind="isolated")
    np.testing.assert_allclose(validation.predict(big_Q, alone, validation.ISSUE), [1.0])
    np.testing.assert_allclose(validation.predict(p, alone, validation.ISSUE), [7.0])
    # the capacity law: S = 100 + K = 2 producers x q = 100 is Q = 300 again
    law = Params(R=100.0, t0_fixed=0.5, issue_rate=100.0, capacity=Capacity("both", 100, 100))
    two = recs([1000], [1.0], K=[2], B=[50], kind="isolated")
    np.testing.assert_allclose(validation.predict(law, two, validation.ISSUE), [7.0])


def test_summaries_split_held_out_fitted_and_free_rows():
    def row(err, *, held_out, in_fit_set=True, aligned=True, study="iso", metric="t"):
        return {
            "rel_error": err,
            "held_out": held_out,
            "in_fit_set": in_fit_set,
            "aligned": aligned,
            "study": study,
            "sync": "barrier" if aligned else "free",
            "metric": metric,
        }

    rows = [row(e, held_out=True) for e in (-0.01, 0.02, 0.03, 0.04, -0.05)]
    rows += [row(0.5, held_out=False)]  # fitted: in "all" only
    rows += [row(0.2, held_out=True, in_fit_set=False, aligned=False, study="free")]
    # an aligned record validated apart is neither the fit set's nor free-running
    rows += [row(0.9, held_out=True, in_fit_set=False, aligned=True, study="probe")]
    s = validation.summaries(rows)
    held = np.abs([-0.01, 0.02, 0.03, 0.04, -0.05])
    assert s["validation_summary"] == {
        "n": 5,
        "median_abs_rel_error": pytest.approx(np.median(held)),
        "p90_abs_rel_error": pytest.approx(np.quantile(held, 0.9)),  # 0.046, not the median
    }
    assert s["validation_summary_free"]["n"] == 1
    assert s["validation_summary_free"]["median_abs_rel_error"] == pytest.approx(0.2)
    group = s["validation_by_group"]["iso/barrier:t"]
    assert group["n"] == 5 and group["all"]["n"] == 6
    assert group["median_abs_rel_error"] == pytest.approx(0.03)


def test_the_validation_fit_never_sees_a_held_out_record(monkeypatch):
    """The held-out error is out of sample only if the training fit lacks those records."""
    from xstage_bench.model import stages
    from xstage_bench.model.records import FitData, Loaded
    from xstage_bench.model.stages import Params

    many = recs([1000.0] * 60, [1.0] * 60)
    data = FitData(zero_gap=many, periodic=many, isolated=many, period=many)
    loaded = Loaded(data, data, {}, {}, "sim", {}, None, {})
    seen = []

    def spy(train, **_):
        seen.append({role: set(getattr(train, role).ids) for role in ("zero_gap", "isolated")})
        return Params(reasons={"R": "spy"})

    monkeypatch.setattr(stages, "fit_chain", spy)
    validation.validate(loaded)
    training = set(many.ids) - validation.held_out_ids(data)
    assert 0 < len(training) < len(many)
    assert seen and all(s == {"zero_gap": training, "isolated": training} for s in seen)
    # each cross-validation fold's fits lack that fold's records, and only them
    seen.clear()
    validation.cross_validated(loaded)
    folds = [set(many.ids) - validation.held_out_ids(data, fold=f) for f in range(5)]
    assert [s["isolated"] for s in seen] == [f for f in folds for _ in LAWS]


def test_stages_refuse_what_the_records_cannot_give():
    from xstage_bench.model import capacity
    from xstage_bench.model.stages import Params, fit_T0

    # every backpressure-free burst of one size: no slope, no issue rate
    one_B = recs([1000, 1000, 1000], [1.0, 1.01, 0.99], B=[50, 50, 50])
    with pytest.raises(FitError, match="at least two sizes B"):
        fit_T0(one_B, 100.0, None)
    # isolated bursts that all issue in T0 (no knee): Q is only bounded below
    p = Params(R=100.0, t0_fixed=0.5, issue_rate=100.0)
    iso = recs([100, 200, 300], [1.5, 2.5, 3.5], B=[100, 200, 300], kind="isolated")
    for law in capacity.LAWS:
        with pytest.raises(capacity.CapacityError, match="fewer than two isolated bursts stall"):
            capacity.fit(iso, 100.0, p.T0(iso.B), law)


def test_a_Q_too_low_for_T0_is_retried_at_what_the_bursts_hold():
    """Records that follow the laws exactly (T0 = 0.5 us + B at 10000 bytes/us, R = 1000
    bytes/us, Q = 2000 bytes, K = 1), and a chain started from Q = 1 byte: with it no burst
    is backpressure-free, so T0 is fitted again with capacity.held, the most any isolated burst
    held (V - R*T_iss = 10000 - 1000*8 = 2000), and the chain recovers the truth."""
    from xstage_bench.model.capacity import Capacity
    from xstage_bench.model.records import FitData
    from xstage_bench.model.stages import Params, fit_chain

    def T0(V):
        return 0.5 + np.asarray(V, dtype=float) / 10_000

    zg_V = [20_000, 40_000]
    plat_V = [1000, 2000, 4000]
    iso_V = [500, 1000, 1500, 4000, 6000, 8000, 10_000]
    data = FitData(
        zero_gap=recs(zg_V, np.maximum(T0(zg_V), np.divide(zg_V, 1000))),
        periodic=recs(plat_V, T0(plat_V), G=[100.0] * 3),
        isolated=recs(
            iso_V, np.maximum(T0(iso_V), (np.subtract(iso_V, 2000)) / 1000), kind="isolated"
        ),
    )
    p = fit_chain(data, start=Params(R=1000.0, capacity=Capacity("shared", 1.0, 0.0)))
    assert p.reasons == {}
    assert p.R == pytest.approx(1000.0, rel=1e-3)
    assert p.t0_fixed == pytest.approx(0.5, rel=1e-3)
    assert p.issue_rate == pytest.approx(10_000.0, rel=1e-3)
    assert p.capacity.S == pytest.approx(2000.0, rel=1e-3)


def _issue_bound_line_that_falls():
    """Bursts that follow T0 = 0.2 us + B / 80000 bytes/us: three sizes at K = 64 whose
    capacity (Q per record) leaves them stalled to 0.9 T_iss, so still issue-bound in the
    law but not "clearly" backpressure-free, and two sizes at K = 1 on an empty path, 2%
    noisy so that the line through these two falls with B (its rate is infinite)."""
    B = np.array([8192, 16384, 24576, 62_000, 64_000], dtype=float)
    K = np.array([64, 64, 64, 1, 1], dtype=float)
    y = (0.2 + B / 80_000) * np.array([1, 1, 1, 1.02, 0.98])
    R = 1000.0
    Q = np.where(K > 1, B * K - R * 0.9 * y, B * K)
    return recs(B * K, y, K=K, B=B), R, Q


def test_T0_recovers_the_issue_rate_where_the_line_start_ran_off():
    """The old start took the line through the backpressure-free bursts; falling, it put
    the rate at ~1e15 GB/s, where B/rate is nothing and the gradient is flat, so the
    solver stayed there (T0 flat; the capped and window laws of the H100 reference). The
    finite starts recover the truth, and a start stuck on the flat gradient (the previous
    round's) does not decide."""
    from xstage_bench.model.stages import Params, fit_T0

    r, R, Q = _issue_bound_line_that_falls()
    for start in (None, Params(t0_fixed=0.33, issue_rate=1e15)):
        t0_fixed, rate = fit_T0(r, R, Q, start)
        assert t0_fixed == pytest.approx(0.2, rel=0.01)
        assert rate == pytest.approx(80_000.0, rel=0.01)


def test_T0_keeps_the_start_of_least_cost():
    """Every start is tried and the least cost kept, whatever the order: a start at the
    truth wins over one stuck where the gradient is flat; the line start is there only
    where it rises with B; a finite start is always there."""
    from xstage_bench.model import stages
    from xstage_bench.model.stages import Params, fit_T0

    r, R, Q = _issue_bound_line_that_falls()
    free = (r.V - Q) / R < 0.8 * r.y
    starts = stages._T0_starts(r, free, ())
    assert len(starts) == 1 and np.isfinite(starts[0][1])  # no line: it falls
    rising = recs([1000, 2000, 3000], [0.3, 0.4, 0.5], B=[1000, 2000, 3000])
    assert len(stages._T0_starts(rising, np.ones(3, dtype=bool), ())) == 2  # and the line

    truth, stuck = Params(t0_fixed=0.2, issue_rate=80_000.0), Params(t0_fixed=0.6, issue_rate=1e15)
    for order in ((stuck, truth), (truth, stuck)):
        t0_fixed, rate = fit_T0(r, R, Q, order[0], order[1:])
        assert (t0_fixed, rate) == pytest.approx((0.2, 80_000.0), rel=0.01)


def test_T0_issue_rate_is_bounded_where_the_records_are_flat_in_B():
    """Bursts that take the same time at every size measure no rate: it stops at its
    finite bound (stages.MAX_ISSUE_RATE), not at ~1e15 GB/s."""
    from xstage_bench.model import stages

    flat = recs([1000, 2000, 4000, 8000], [0.5] * 4, B=[1000, 2000, 4000, 8000])
    t0_fixed, rate = stages.fit_T0(flat, 100.0, None, stages.Params(t0_fixed=0.5, issue_rate=1e15))
    assert rate <= stages.MAX_ISSUE_RATE
    assert t0_fixed == pytest.approx(0.5, rel=0.01)


def test_each_law_T0_starts_from_the_laws_fitted_before_it(monkeypatch):
    """fit_laws fits the variants fewest free numbers first and hands each chain the T0
    of those before it as starts (so the shared law's is a start of every other)."""
    from xstage_bench.model import stages
    from xstage_bench.model.records import FitData

    given = {}

    def spy(data, *, law, t0_starts):
        given[law] = [p.law for p in t0_starts]
        return stages.Params(law=law)

    monkeypatch.setattr(stages, "fit_chain", spy)
    many = recs([1000.0] * 3, [1.0] * 3)
    stages.fit_laws(FitData(zero_gap=many, periodic=many, isolated=many, period=many))
    assert given == {law: list(LAWS[:i]) for i, law in enumerate(LAWS)}


def _bursts_on_an_empty_path(per_wave: bool):
    """Isolated bursts far below any capacity at K = 66, 132 and 264 on 132 SMs, issuing in
    0.25 us + B / 80000 bytes/us, the fixed part paid once per producer an SM runs where
    per_wave (twice at K = 264), once a burst otherwise."""
    from xstage_bench.model.records import FitData

    K = np.array([66, 132, 264] * 3, dtype=float)
    B = np.repeat([4096.0, 16384.0, 32768.0], 3)
    waves = np.ceil(K / 132)
    y = 0.25 * (waves if per_wave else 1.0) + B / 80_000
    iso = replace(recs(B * K, y, K=K, B=B, kind="isolated"), waves=waves)
    none = recs([], [])
    return FitData(zero_gap=none, periodic=none, isolated=iso)


@pytest.mark.parametrize("per_wave", [True, False])
def test_T0_law_is_the_one_of_least_cost_where_bursts_outnumber_the_SMs(per_wave):
    """Both T0 laws have two free numbers, so the fit keeps the one that misses the bursts
    least: the per-wave law where K = 264's fixed time is twice K = 132's, the per-burst
    law where it is the same; either way t0_fixed and the rate are recovered."""
    from xstage_bench.model import stages

    data = _bursts_on_an_empty_path(per_wave)
    p = stages._T0_stage(data, 1000.0, stages.Params(R=1000.0))
    assert p.t0_per_wave is per_wave
    assert (p.t0_fixed, p.issue_rate) == pytest.approx((0.25, 80_000.0), rel=1e-3)
    assert p.T0_of(data.isolated) == pytest.approx(data.isolated.y, rel=1e-3)


def test_a_replicate_keeps_the_T0_law_it_starts_with():
    """A bootstrap replicate (a chain started from the pooled fit) does not choose again:
    the per-burst law kept on per-wave bursts misses K = 264's."""
    from xstage_bench.model import stages

    data = _bursts_on_an_empty_path(per_wave=True)
    kept = stages._T0_stage(data, 1000.0, stages.Params(R=1000.0), choose=False)
    assert kept.t0_per_wave is False
    assert np.max(np.abs(kept.T0_of(data.isolated) / data.isolated.y - 1)) > 0.1


def test_without_bursts_beyond_the_SMs_the_laws_agree_and_per_burst_stays():
    """Where no burst has more producers than SMs (or the SM count is unknown: no waves),
    the laws predict alike and the first, per burst, is kept without a second fit."""
    from xstage_bench.model import stages

    data = _bursts_on_an_empty_path(per_wave=False)
    unknown = replace(data, isolated=replace(data.isolated, waves=None))
    assert stages._T0_stage(unknown, 1000.0, stages.Params(R=1000.0)).t0_per_wave is False


def test_the_records_count_producers_per_SM_from_the_raw_files_SM_count():
    """load() gives every record ceil(K / SMs) from the raw files' environment: on the
    H100 reference (132 SMs) the K = 264 bursts are two waves, the rest one."""
    from xstage_bench.model.records import load

    raw = sorted(
        str(p) for p in (ROOT / "results" / "ref-h100x1" / "raw" / "microbench").glob("*.json")
    )
    loaded = load(raw, "host")
    assert loaded.sm_count == 132
    iso = loaded.fit.isolated
    assert set(iso.K) >= {132.0, 264.0}
    assert np.array_equal(iso.waves, np.ceil(iso.K / 132))


def test_the_report_pays_t0_fixed_per_wave_where_the_model_file_says_so():
    """fitted.t0_us follows the model file's T0_law: per_wave doubles t0_fixed at twice
    the SM count; per_burst (and files written before the law) never scale it."""
    from xstage_bench.report.analysis import fitted

    params = {"t0_fixed_us": {"value": 0.25}, "issue_rate_per_sm_GBps": {"value": 80.0}}
    B = 80_000.0  # bytes per producer: 1 us at 80 GB/s
    wave = {"params": params, "T0_law": {"law": "per_wave", "sm_count": 132}}
    assert fitted.t0_us(wave, 132, 132 * B) == pytest.approx(1.25)
    assert fitted.t0_us(wave, 264, 264 * B) == pytest.approx(1.5)
    for burst in (
        {"params": params, "T0_law": {"law": "per_burst", "sm_count": 132}},
        {"params": params},
    ):
        assert fitted.t0_us(burst, 264, 264 * B) == pytest.approx(1.25)
