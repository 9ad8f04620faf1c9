"""MegaMoE sweeps as frames (report/analysis/megamoe.py, megamoe_baselines.py) on a few
hand-made records: what a configuration is, which records a speedup and a baseline
comparison take, and the medians they report."""

import numpy as np
import pytest

from xstage_bench.data.results import ok_record
from xstage_bench.report.analysis.megamoe import megamoe_speedups, ratio_columns
from xstage_bench.report.analysis.megamoe_baselines import megamoe_baselines

CONFIG = {
    "shape": "toy",
    "precision": "w8a8",
    "routing": "balanced",
    "tokens_per_rank": 1024,
    "world_size": 2,
}


def record(name: str, times: list[float], **point) -> dict:
    """An ok record of CONFIG (on the peer path unless `path` says otherwise)."""
    point = {**CONFIG, **point}
    rid = f"{point.get('path', 'peer')}/{name}"
    return ok_record(rid, {**point, "id": rid}, {"time_us": times})


def test_a_speedup_reports_each_sides_median_not_its_mean():
    wave = record("expert_wave", [100.0, 101.0, 190.0], schedule="expert_wave")
    interleaved = record("interleaved", [80.0, 90.0, 91.0], schedule="interleaved")
    row = ratio_columns(wave, interleaved)
    assert (row["wave_us"], row["interleaved_us"]) == (101.0, 90.0)
    assert row["speedup"] == pytest.approx(101.0 / 90.0)


def test_the_same_configuration_on_two_paths_is_two_configurations():
    records = [
        record(schedule, [t] * 3, schedule=schedule, path=path)
        for path, times in (("peer", (100.0, 80.0)), ("host", (100.0, 50.0)))
        for schedule, t in zip(("expert_wave", "interleaved"), times, strict=True)
    ]
    speedups, incomplete = megamoe_speedups({"records": records})
    assert incomplete.empty
    by_path = dict(zip(speedups["path"], speedups["speedup"], strict=True))
    assert by_path == {"peer": pytest.approx(1.25), "host": pytest.approx(2.0)}


def test_baselines_compare_the_main_grids_arms_and_only_configurations_we_timed():
    # A lead-sweep arm of the same configuration (listed first, and fastest) is the lead
    # map's, not the main grid's; a configuration with a baseline but no time of ours
    # has nothing to compare.
    records = [
        record("interleaved/lead=0", [50.0] * 3, schedule="interleaved", lead_sweep=True),
        record("expert_wave", [100.0] * 3, schedule="expert_wave"),
        record("interleaved", [90.0] * 3, schedule="interleaved"),
        record("unfused", [200.0] * 3, schedule="unfused", variant="unfused"),
        record(
            "other/unfused", [300.0] * 3, schedule="unfused", variant="unfused", routing="skewed"
        ),
    ]
    wide = megamoe_baselines({"records": records})
    assert wide["routing"].tolist() == ["balanced"]
    row = wide.iloc[0]
    assert row["ours_best_us"] == 90.0 and row["unfused_us"] == 200.0
    assert row["ours_over_unfused"] == pytest.approx(0.45)
    assert row["ours_speedup"] == pytest.approx(100.0 / 90.0)
    assert np.isnan(row["deepgemm_best_us"])


def test_a_baselines_outcome_counts_each_status_and_each_reason():
    from xstage_bench.data.results import failed_record
    from xstage_bench.report.analysis.megamoe_baselines import variant_outcome

    def failed(name, error, status="failed"):
        point = {**CONFIG, "variant": "unfused", "schedule": "unfused", "id": name}
        return failed_record(name, point, error, status=status)

    doc = {
        "records": [
            failed("a", "CUDA out of memory\ntraceback"),
            failed("b", "CUDA out of memory"),
            failed("c", "not installed"),
            failed("d", "w4a8 not supported", status="unsupported"),
        ]
    }
    assert variant_outcome(doc, "unfused", "unfused torch") == (
        "3 failed (2: CUDA out of memory; 1: not installed); 1 unsupported (w4a8 not supported)"
    )
    assert variant_outcome(doc, "deepgemm", "DeepGEMM") == "the dataset has no DeepGEMM record"


def test_the_baselines_setting_is_natural_routing_and_the_host_paths_control_only():
    import pandas as pd

    from xstage_bench.report.analysis.megamoe import at_baseline_setting

    frame = pd.DataFrame(
        {"path": ["peer", "peer", "host", "host"], "remote_fraction": ["natural", "0", "0", "1"]}
    )
    kept = at_baseline_setting(frame)
    assert kept.to_dict("records") == [
        {"path": "peer", "remote_fraction": "natural"},
        {"path": "host", "remote_fraction": "0"},
    ]
