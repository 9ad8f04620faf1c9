"""The fused kernel predicted by the Burst-Gap playback (issue 52, items 4-5): the
analysis, its table and figure, and the lead rule replayed on a lead map.

The synthetic datasets are made by the model itself: every arm's kernel time is its own
tile list played through the fixture's host (or peer) fit with the hold, tiles at a hidden
multiple of the FLOP-rate costs. An analysis that calibrates right recovers them exactly.
"""

import json

import numpy as np
import pytest
from fixtures import environment, write_model

from xstage_bench.data import layout
from xstage_bench.data.results import ok_record, raw_document, write_raw
from xstage_bench.megamoe import playback
from xstage_bench.megamoe.ours import lead
from xstage_bench.report.analysis import megamoe_playback as mp
from xstage_bench.report.tables import common
from xstage_bench.report.tables import megamoe_playback as table

HIDDEN_SCALE = 1.7  # the kernel computes at 600 / 1.7 TFLOP/s
SHAPE = {"shape": "t", "H": 1024, "I": 512, "E": 8, "topk": 2}


def config(path: str, world_size: int) -> dict:
    return {
        **SHAPE,
        "precision": "w8a8",
        "routing": "balanced",
        "tokens_per_rank": 2048,
        "world_size": world_size,
        "path": path,
    }


def played(point: dict, far, hold: bool = True) -> float:
    rates = playback.Rates.at(point, 128, 128, lead.DEFAULT_TFLOPS, 132).scaled(HIDDEN_SCALE)
    return playback.play_kernel(point, {}, point["schedule"], rates, far, hold=hold).time_us


def arm(cfg: dict, f, schedule: str, lead_rows=None, sweep=False) -> dict:
    point = {**cfg, "schedule": schedule}
    if f is not None:
        point["remote_fraction"] = f
    where = "/path=host" if cfg.get("path") == "host" else ""
    share = "" if f is None else f"/f={f:g}"
    point["id"] = f"t/w8a8/balanced/T=2048/P={cfg['world_size']}{where}{share}/{schedule}"
    if lead_rows is not None:
        point.update(lead_rows=lead_rows, lead_rows_requested=lead_rows)
    if sweep:
        point["lead_sweep"] = True
        point["id"] += f"/lead={lead_rows}"
    return point


def write_dataset(ds, path: str, points: list[dict]) -> None:
    write_model(ds, paths=(path,))
    far = lead.read_drain(ds / layout.MODEL_JSON, path).path_params()
    records = []
    for p in points:
        kernel = played(p, far)
        samples = {"kernel_us": [kernel] * 3, "time_us": [kernel + 5.0] * 3}
        records.append(ok_record(p["id"], p, samples))
    doc = raw_document(
        experiment="megamoe",
        backend="cuda",
        dataset=ds.name,
        environment=environment(False, (path,)),
        config={},
        records=records,
    )
    write_raw(ds / layout.MEGAMOE_RAW, doc)
    mp.write_playback(ds)  # the rule play_megamoe's job


@pytest.fixture(scope="module")
def host_dataset(tmp_path_factory):
    """Host shares 0, 0.5 and 1 of one configuration: both schedules of the main grid
    (lead 256) and a lead map of leads 0 and 1024."""
    ds = tmp_path_factory.mktemp("data") / "h200x1"
    cfg = config("host", 1)
    points = []
    for f in (0.0, 0.5, 1.0):
        points += [arm(cfg, f, "expert_wave"), arm(cfg, f, "interleaved", 256)]
        points += [arm(cfg, f, "interleaved", rows, sweep=True) for rows in (0, 1024)]
    write_dataset(ds, "host", points)
    return ds


def test_the_playback_recovers_kernel_times_its_own_model_made(host_dataset):
    doc, metric, frame = mp.predictions(host_dataset)
    assert metric.sample == "kernel_us" and len(frame) == 12
    apart = frame["calibration"] == mp.CALIBRATION
    # each (schedule, lead) family is calibrated on its f = 0 control: 4 of them
    assert sorted(frame.loc[apart, "f"]) == [0.0] * 4
    assert set(frame.loc[~apart, "calibration"]) == {mp.CONTROL}
    np.testing.assert_allclose(frame["tile_scale_hold"], HIDDEN_SCALE, rtol=1e-9)
    np.testing.assert_allclose(frame["error_hold"], 0.0, atol=1e-9)
    # without the hold the same lists run faster where stores cross the path
    far = frame["f"] > 0
    assert (frame.loc[far, "error_no_hold"] < -0.01).any()
    assert (frame.loc[~far, "error_no_hold"].abs() < 1e-9).all()
    lead_map = frame[frame["grid"] == mp.LEAD_MAP]
    assert sorted(set(lead_map["lead"])) == ["0", "1024"]


def test_the_error_summary_keeps_the_calibration_arms_apart(host_dataset):
    _, _, frame = mp.predictions(host_dataset)
    frame.loc[
        frame["id"] == "t/w8a8/balanced/T=2048/P=1/path=host/f=1/expert_wave", "error_hold"
    ] = 0.2  # one miss
    summary = mp.error_summary(frame).set_index(["arms", "schedule"])
    every = summary.loc[("every arm", "")]
    assert every["n"] == 8 and every["median |error| hold"] == pytest.approx(0.0, abs=1e-9)
    assert every["p90 |error| hold"] == pytest.approx(0.2 * 0.3, rel=1e-6)  # 8 arms: p90
    assert summary.loc[(mp.CALIBRATION, ""), "n"] == 4
    assert summary.loc[(mp.LEAD_MAP, "interleaved"), "n"] == 4
    assert summary.loc[("", "expert_wave"), "median |error| hold"] == pytest.approx(0.1)


def test_without_a_control_the_smallest_share_calibrates(tmp_path):
    # the peer path on 2 GPUs at natural routing (f = 1/2) and 7/8 re-homed
    ds = tmp_path / "h200x2"
    cfg = config("peer", 2)
    points = [arm(cfg, f, "expert_wave") for f in (None, 0.875)]
    write_dataset(ds, "peer", points)
    _, _, frame = mp.predictions(ds)
    by_f = frame.set_index("f")
    assert list(by_f.loc[[0.5, 0.875], "calibration"]) == [mp.CALIBRATION, mp.SHARE]
    assert by_f.loc[0.875, "calibrated_on"] == "t/w8a8/balanced/T=2048/P=2/expert_wave"
    # a few fixed-point steps: within the calibration's tolerance of the truth
    assert abs(by_f.loc[0.875, "error_hold"]) < 3 * mp.CALIBRATION_TOLERANCE
    assert by_f.loc[0.875, "tile_scale_hold"] == pytest.approx(HIDDEN_SCALE, rel=5e-3)


def test_one_share_keeps_the_flop_rate(tmp_path):
    ds = tmp_path / "h200x1"
    write_dataset(ds, "host", [arm(config("host", 1), 0.5, "expert_wave")])
    _, _, frame = mp.predictions(ds)
    row = frame.iloc[0]
    assert row["calibration"] == mp.FLOPS and row["tile_scale_hold"] == 1.0
    assert row["error_hold"] < -0.05  # the hidden rate is slower than X: under-predicted


def test_a_model_without_the_path_says_so(tmp_path):
    ds = tmp_path / "h200x1"
    write_dataset(ds, "host", [arm(config("host", 1), 0.5, "expert_wave")])
    model = json.loads((ds / layout.MODEL_JSON).read_text())
    model.pop("paths")
    model["path"] = "peer"
    (ds / layout.MODEL_JSON).write_text(json.dumps(model))
    with pytest.raises(mp.NoDataError, match="no fit for store path 'host'"):
        mp.write_playback(ds)


def test_the_playback_is_a_labelled_prediction_of_the_files_it_was_made_from(tmp_path):
    ds = tmp_path / "h200x1"
    write_dataset(ds, "host", [arm(config("host", 1), 0.5, "expert_wave")])
    played_doc = json.loads((ds / layout.MEGAMOE_PLAYBACK).read_text())
    assert "no GPU ran it" in played_doc["simulated"]
    assert set(played_doc["made_from"]) == {layout.MEGAMOE_RAW, layout.MODEL_JSON}
    assert played_doc["paths"]["host"]["num_programs"] == 132
    assert len(played_doc["arms"]) == 1 and played_doc["lead_rule"] == []


def test_the_playback_records_the_fitted_drain_lag_and_does_not_play_it(tmp_path):
    ds = tmp_path / "h200x1"
    point = arm(config("host", 1), 0.5, "expert_wave")
    write_dataset(ds, "host", [point])
    unlagged = json.loads((ds / layout.MEGAMOE_PLAYBACK).read_text())
    model = json.loads((ds / layout.MODEL_JSON).read_text())
    for key, value in (("drain_lag_fraction", 0.3), ("drain_lag_rate_ratio", 0.4)):
        model["params"][key] = {"value": value, "ci_low": value, "ci_high": value}
    (ds / layout.MODEL_JSON).write_text(json.dumps(model))
    mp.write_playback(ds)
    played_doc = json.loads((ds / layout.MEGAMOE_PLAYBACK).read_text())
    host = played_doc["paths"]["host"]
    assert (host["drain_lag_fraction"], host["drain_lag_rate_ratio"]) == (0.0, 1.0)
    fitted = host["drain_lag_fitted"]
    assert (fitted["fraction"], fitted["rate_ratio"], fitted["played"]) == (0.3, 0.4, False)
    assert "PLAYS_DRAIN_LAG" in fitted["why"]
    # not played: every prediction is the drain without the lag's
    assert played_doc["arms"] == unlagged["arms"]
    assert unlagged["paths"]["host"]["drain_lag_fitted"]["played"]  # no lag fitted: nothing
    assert "a drain lag fitted (0.3 Q(K) at 0.4 R) but not played" in " ".join(
        table.build(ds).notes
    )


@pytest.mark.parametrize("changed", [layout.MEGAMOE_RAW, layout.MODEL_JSON])
def test_a_playback_of_other_files_is_refused_with_the_command_that_remakes_it(tmp_path, changed):
    ds = tmp_path / "h200x1"
    write_dataset(ds, "host", [arm(config("host", 1), 0.5, "expert_wave")])
    mp.predictions(ds)  # as made: read
    with open(ds / changed, "a") as f:
        f.write("\n")  # any other bytes: another run's file
    with pytest.raises(mp.NoDataError, match=f"made from another {changed} .*snakemake --cores"):
        mp.predictions(ds)


def test_a_missing_playback_names_its_file_and_the_command(tmp_path):
    ds = tmp_path / "h200x1"
    write_dataset(ds, "host", [arm(config("host", 1), 0.5, "expert_wave")])
    (ds / layout.MEGAMOE_PLAYBACK).unlink()
    with pytest.raises(mp.NoDataError, match="megamoe_playback.json does not exist.*snakemake"):
        mp.predictions(ds)


def test_the_table_shows_a_screen_of_columns_and_keeps_every_one(host_dataset):
    built = table.build(host_dataset)
    text = common.markdown(built)  # refuses a part wider than twelve columns
    assert "## prediction" in text and "## the arm's point and calibration (1)" in text
    assert {"predicted us (no hold)", "tile_scale_hold", "calibrated_on"} <= set(built.frame)
    assert built.notes[0].startswith("8 arms predicted: median |error| 0.0%, p90 0.0% with")
    titles = [t for t, _ in built.sections]
    assert titles[0].startswith("Error summary")


def test_the_lead_rule_is_replayed_on_the_swept_leads(host_dataset):
    built = table.build(host_dataset)
    sections = dict(built.sections)
    per_point = sections["The lead rule replayed per point (candidates: the swept leads)"]
    assert list(per_point["f"]) == ["0", "0.5", "1"]
    far = lead.read_drain(host_dataset / layout.MODEL_JSON, "host").path_params()
    for f, picked in zip((0.0, 0.5, 1.0), per_point["replayed_lead"], strict=True):
        point = {**arm(config("host", 1), f, "interleaved"), "lead_rows": 0}
        want = lead.choose(point, {}, far, tflops=600.0, num_programs=132, candidates=(0, 1024))
        assert picked == want.rows
    score = next(frame for title, frame in built.sections if title.startswith("The lead rule on"))
    replayed = score.set_index("lead").loc["rule replayed on the swept leads"]
    within = per_point["replayed_speedup"] >= 0.98 * per_point["best_speedup"]
    assert replayed["points"] == 3 and replayed["within 2% of best"] == within.sum()
    assert replayed["mean speedup"] == pytest.approx(per_point["replayed_speedup"].mean())


def test_a_lead_rule_is_scored_against_the_best_and_the_best_constant_lead():
    import pandas as pd

    from xstage_bench.report.analysis.megamoe_lead import auto_score

    picked, best = pd.Series([1.0, 0.97, 1.2]), pd.Series([1.0, 1.0, 1.2])
    constants = pd.Series({0: 1.0, 1024: 1.05})
    got = auto_score(picked, best, constants)
    assert got["points"] == 3 and got["within 2% of best"] == 2  # 0.97 is 3% short
    assert got["best constant lead"] == 1024 and got["its mean speedup"] == 1.05
    assert got["mean / best constant's"] == pytest.approx((3.17 / 3) / 1.05)


def test_the_figure_draws_both_modes_against_the_diagonal(host_dataset):
    from xstage_bench.report.figures import megamoe_playback as figure

    fig = figure.plot(host_dataset)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert [t.split(":")[0] for t in titles] == [
        "held until its stores drain",
        "moving on once issued",
    ]
    assert "median |error| 0.0%" in titles[0]
    held = fig.axes[0]
    # every predicted arm plotted once per panel, the calibration arms apart
    assert sum(len(c.get_offsets()) for c in held.collections[1:]) == 12
    on_diagonal = np.concatenate([c.get_offsets() for c in held.collections[2:]])
    np.testing.assert_allclose(on_diagonal[:, 1], on_diagonal[:, 0], rtol=1e-9)


def test_the_player_forgets_its_oldest_tile_lists():
    kept = mp.RecentLists(2)
    for key in "abc":
        kept[key] = key
    assert list(kept) == ["b", "c"]


def test_a_simulated_kernel_plays_at_its_profiles_matrix_rate():
    """The simulator runs every tile at its profile's matrix rate (fp8 for W8A8 and W4A8):
    the FLOP-rate tiles take that rate, not the lead_auto_tflops a GPU's auto assumes (with
    it, sim-b200's arms were predicted 6x too slow, sim-h200's 2.5x)."""
    moe = {"precisions": ["w4a8", "w8a8"], "lead_auto_tflops": 600}
    profile = {"matrix_tflops": {"bf16": 2250.0, "fp8": 4500.0}}
    simulated = {"config": {"megamoe": moe}, "environment": {"hardware_profile": profile}}
    assert mp.compute_tflops(simulated) == 4500.0
    measured = {"config": {"megamoe": moe}, "environment": {"gpus": [{"sm_count": 132}]}}
    assert mp.compute_tflops(measured) == 600.0
    mixed = {**simulated, "config": {"megamoe": {**moe, "precisions": ["w8a8", "bf16"]}}}
    assert mp.compute_tflops(mixed) == 600.0  # two rates: no one X, the configured one


def test_a_device_decided_interleaved_arm_plays_the_kernels_counted_order(tmp_path):
    """Decided on the device, interleaved is counted (the kernel's device rule): each
    block's L2 tiles right before the first L1 block lead_rows on, whatever the drain does,
    so the play takes schedule.claim_order's counted list at every share; a program that
    takes an L2 tile before its block is released waits (every dependency kept)."""
    from xstage_bench.megamoe import schedule

    write_model(tmp_path, paths=("host",))
    far = lead.read_drain(tmp_path / layout.MODEL_JSON, "host").path_params()
    rates = playback.Rates.at(config("host", 1), 128, 128, lead.DEFAULT_TFLOPS, 132)
    moe = {"lead_rows": 256}
    times = {}
    for f in (0.0, 1.0):
        point = {**config("host", 1), "remote_fraction": f, "decided_on": "device"}
        point["tokens_per_rank"] = 8192
        device = playback.play_kernel(point, moe, schedule.INTERLEAVED, rates, far)
        grid = device.work.grid
        schedule.check_dependencies(device.tiles, grid)
        want = schedule.claim_order(schedule.INTERLEAVED, grid, 132, 256)
        np.testing.assert_array_equal(device.tiles, want)
        times[f] = device.time_us
    assert times[1.0] > times[0.0]  # the same order, held by the drain
