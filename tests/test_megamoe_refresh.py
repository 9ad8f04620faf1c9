"""A changed lead map re-measures our arms at the lead map's configurations and keeps the rest
(megamoe/refresh.py), through run_sweep as the MegaMoE runner calls it."""

from fixtures import environment

from xstage_bench.data.results import ok_record
from xstage_bench.measurement.sweep import run_sweep
from xstage_bench.megamoe.refresh import first_refresh, in_lead_map, lead_map_refresh
from xstage_bench.megamoe.runner import kernel_refresh

MOE = {
    "shapes": [{"name": "a"}, {"name": "b"}],
    "precisions": ["w8a8"],
    "routings": ["balanced"],
    "tokens_per_rank": [1024, 4096],
    "remote_fractions": [0, 0.25],
    "lead_rows": 1024,
}
OLD_SWEEP = {"shapes": ["a"], "tokens_per_rank": [4096], "remote_fractions": [0, 0.1]}
NEW_SWEEP = {**OLD_SWEEP, "remote_fractions": [0, 0.1, 0.4], "lead_rows": [0, 512, "auto"]}


def raw(sweep: dict | None, auto: dict | None = None, **moe) -> dict:
    config = {"megamoe": {**MOE, **moe}, "kernel": {"ran": {"w8a8": "ws"}}}
    if sweep is not None:
        config["megamoe"]["lead_sweep"] = sweep
    if auto is not None:
        config["lead_auto"] = auto
    return config


def point(shape="a", tokens=4096, f=0.0, variant="ours", **extra) -> dict:
    # the raw schema's microbench fields let run_sweep validate the records
    return {
        "id": f"{shape}/tok{tokens}/share{f:g}/{variant}/{extra.get('lead', '')}",
        "kind": "isolated",
        "K": 1,
        "V": 4096,
        "B": 4096,
        "shape": shape,
        "precision": "w8a8",
        "routing": "balanced",
        "tokens_per_rank": tokens,
        "remote_fraction": f,
        "variant": variant,
        **extra,
    }


def test_a_lead_map_point_is_one_of_its_configurations():
    assert in_lead_map(point(f=0.1), OLD_SWEEP, MOE)
    assert not in_lead_map(point(f=0.25), OLD_SWEEP, MOE)  # a main-grid share only
    assert not in_lead_map(point(tokens=1024), OLD_SWEEP, MOE)
    assert not in_lead_map(point(shape="b"), OLD_SWEEP, MOE)


def test_only_a_changed_lead_map_or_fit_is_refreshed_and_baselines_are_kept():
    refresh = lead_map_refresh(raw(OLD_SWEEP), raw(NEW_SWEEP))
    assert "lead_sweep" in refresh.reason
    assert refresh.stale(point(f=0.1))  # ours at an old lead-map configuration
    assert refresh.stale(point(f=0.4, lead_sweep=True))  # a new one
    assert refresh.stale(point(f=0.0, schedule="expert_wave"))  # the waves its leads pair with
    assert not refresh.stale(point(f=0.0, variant="flashinfer"))  # never paired with ours
    assert not refresh.stale(point(shape="b", f=0.25))  # the rest of the main grid
    # anything else that differs is no lead-map change: measured again in full
    assert lead_map_refresh(raw(OLD_SWEEP), raw(NEW_SWEEP, world_size_note=2)) is None
    assert lead_map_refresh(raw(OLD_SWEEP), raw(OLD_SWEEP)) is None


def test_a_new_fit_refreshes_every_configuration_when_the_main_lead_is_auto():
    before, after = {"R_GBps": 51.0}, {"R_GBps": 52.0}
    fixed = lead_map_refresh(raw(OLD_SWEEP, before), raw(OLD_SWEEP, after))
    assert fixed.stale(point(f=0.1)) and not fixed.stale(point(shape="b", f=0.25))
    auto = lead_map_refresh(
        raw(OLD_SWEEP, before, lead_rows="auto"), raw(OLD_SWEEP, after, lead_rows="auto")
    )
    assert auto.stale(point(shape="b", f=0.25)) and "every configuration" in auto.reason
    assert not auto.stale(point(shape="b", f=0.25, variant="unfused"))


def test_first_refresh_takes_whichever_rule_covers_the_change():
    rule = first_refresh(kernel_refresh, lead_map_refresh)
    assert rule(raw(OLD_SWEEP), raw(NEW_SWEEP)).stale(point(f=0.1))
    newer_kernel = raw(OLD_SWEEP)
    newer_kernel["kernel"]["ran"]["w8a8"] = "ws2"
    assert "kernel" in rule(raw(OLD_SWEEP), newer_kernel).reason
    both = raw(NEW_SWEEP)
    both["kernel"]["ran"]["w8a8"] = "ws2"
    assert rule(raw(OLD_SWEEP), both) is None


def test_a_finished_file_grows_its_lead_map_and_keeps_the_rest(tmp_path):
    out = tmp_path / "megamoe.json"
    main = [point(shape="b", f=0.25), point(f=0.25), point(f=0.0, variant="unfused")]
    old_map = [point(f=0.1, lead_sweep=True, lead="0")]
    calls: list[str] = []

    def measure(p):
        calls.append(p["id"])
        return ok_record(p["id"], p, {"time_us": [1.0, 2.0]})

    def sweep(points, config):
        return run_sweep(
            points,
            measure,
            out,
            experiment="microbench",
            backend="cuda",
            dataset="ref-test",
            environment=environment(simulated=False),
            config=config,
            study="megamoe",
            refresh=first_refresh(kernel_refresh, lead_map_refresh),
            progress=lambda line: None,
        )

    sweep(main + old_map, raw(OLD_SWEEP))
    calls.clear()
    new_map = [*old_map, point(f=0.4, lead_sweep=True, lead="512")]
    doc = sweep(main + new_map, raw(NEW_SWEEP))
    assert sorted(calls) == sorted(p["id"] for p in new_map)
    assert len(doc["records"]) == len(main) + len(new_map)
    assert "lead map changed" in doc["environment"]["resumes"][-1]["remeasured"]
