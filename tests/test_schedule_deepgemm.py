"""DeepGEMM's own interleaving as a tile list (schedule.deepgemm_interleaved): upstream's
warm-up count, the 1:1 turns after it, the dependency order on any grid, its place in the
registry and config, and its ratio in tab-megamoe beside the compared pair."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fixtures import write_megamoe

from xstage_bench.data.results import ok_record
from xstage_bench.megamoe import schedule
from xstage_bench.report.tables import megamoe as megamoe_table

NAME = schedule.DEEPGEMM_INTERLEAVED


def _grid(rows_per_expert, l1, l2, block_m=128) -> schedule.TileGrid:
    blocks = [
        (e, min(block_m, r - s))
        for e, r in enumerate(rows_per_expert)
        for s in range(0, r, block_m)
    ]
    return schedule.TileGrid(
        np.array([b[0] for b in blocks], dtype=np.int64),
        np.array([b[1] for b in blocks], dtype=np.int64),
        l1,
        l2,
    )


def _random_grid(rng: np.random.Generator) -> schedule.TileGrid:
    """Several experts with uneven row blocks (some experts empty, a partial last block),
    either GEMM the wider one."""
    rows = rng.integers(0, 900, size=rng.integers(1, 10)).tolist() + [int(rng.integers(1, 130))]
    return _grid(rows, int(rng.integers(1, 24)), int(rng.integers(1, 24)))


def _turns_hold(tiles: np.ndarray, grid: schedule.TileGrid, num_programs: int) -> None:
    """The first W num_programs entries are L1 (all of L1 if fewer); then L2 and L1 strictly
    in turn, L2 first, while both remain; then L2 only."""
    kinds = tiles[:, 0].tolist()
    l1_total = grid.blocks * grid.l1_per_block
    warmup = min(schedule.deepgemm_warmup_waves(grid, num_programs) * num_programs, l1_total)
    assert kinds[:warmup] == [schedule.L1] * warmup
    rest = kinds[warmup:]
    left = l1_total - warmup  # L1 tiles after the warm-up: each follows one L2 tile
    assert rest[: 2 * left] == [schedule.L2, schedule.L1] * left
    assert rest[2 * left :] == [schedule.L2] * (len(rest) - 2 * left)


@pytest.mark.parametrize("seed", range(40))
def test_the_list_keeps_every_dependency_and_the_turns_on_random_grids(seed):
    rng = np.random.default_rng(seed)
    for _ in range(5):
        g = _random_grid(rng)
        programs = int(rng.integers(1, 201))
        tiles = schedule.build(NAME, g, programs)  # build runs check_dependencies
        assert len(tiles) == g.tiles and tiles.dtype == np.int32
        schedule.check_dependencies(tiles, g)
        _turns_hold(tiles, g, programs)


@pytest.mark.parametrize("programs", [1, 2, 3, 7, 64, 131, 132, 200])
def test_the_turns_hold_at_the_kernels_sizes_and_at_the_extremes(programs):
    for l1, l2 in [(16, 32), (8, 32), (44, 11), (24, 7), (1, 1)]:  # V4-Flash, Qwen3.5, DiT
        g = _grid([128 * 24] * 8 + [5, 0, 300], l1, l2)
        tiles = schedule.build(NAME, g, programs)
        _turns_hold(tiles, g, programs)
        start, wait = schedule.play(tiles, g, programs)
        assert np.isfinite(start).all() and (wait >= 0).all()


def test_warmup_waves_are_upstreams_max_of_the_first_l2_wave_and_the_l1_backlog():
    # DeepSeek-V4-Flash on 132 programs (n1 = 16, n2 = 32): the first 132 L2 tiles touch
    # 5 blocks, 80 L1 tiles: A = 1; B = ceil(16 / 132) + 1 = 2
    g = _grid([128 * 24] * 32, 16, 32)
    assert schedule.deepgemm_warmup_waves(g, 132) == 2
    # n1 = 44 > n2 = 11, 768 blocks: B = ceil((44 + 767 * 33) / 132) + 1 = 193 + 1, A = 4
    g = _grid([128 * 24] * 32, 44, 11)
    assert schedule.deepgemm_warmup_waves(g, 132) == 194
    # A = ceil(ceil(8 / 1) * 10 / 8) = 10 beats B = ceil(10 / 8) + 1 = 3, but the one
    # block's L1 tiles are 2 waves
    assert schedule.deepgemm_warmup_waves(_grid([100], 10, 1), 8) == 2
    # never more waves than all of L1: 3 blocks x 4 L1 tiles on 200 programs is one wave
    g = _grid([300], 4, 6)
    assert schedule.deepgemm_warmup_waves(g, 200) == 1
    assert schedule.deepgemm_warmup_waves(_grid([0], 4, 6), 8) == 0  # a rank with no rows


def test_registered_without_knobs_and_named_in_the_schema_and_config():
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    entry = schedule.SCHEDULES[NAME]
    assert entry.label == "DeepGEMM interleaved" and entry.knobs == {}
    assert schedule.knobs(NAME, {"lead_rows": 256, "block_m": 128}) == {}
    assert NAME not in schedule.COMPARED
    schema = json.loads((root / "src/xstage_bench/data/schemas/config.schema.json").read_text())
    assert NAME in schema["properties"]["megamoe"]["properties"]["schedules"]["items"]["enum"]
    config = yaml.safe_load((root / "config.yaml").read_text())
    assert NAME in config["megamoe"]["schedules"]
    g = _grid([100], 4, 6)
    # a lead in the config is another schedule's knob: the list does not change
    assert (schedule.build(NAME, g, 8, {"lead_rows": 4096}) == schedule.build(NAME, g, 8)).all()
    with pytest.raises(ValueError, match="num_programs must be >= 1"):
        schedule.build(NAME, g, 0)
    with pytest.raises(ValueError, match="unknown schedule 'deepgemm'.*deepgemm_interleaved"):
        schedule.build("deepgemm", g, 8)


def _with_deepgemm_interleaved(path, times_us: list[float]) -> None:
    """Add an ok record of the third schedule to the first configurations of a raw file
    write_megamoe wrote (expert waves at 100 us)."""
    doc = json.loads(path.read_text())
    waves = [r for r in doc["records"] if r["point"]["schedule"] == schedule.WAVE]
    for wave, time_us in zip(waves, times_us, strict=False):
        point = {**wave["point"], "schedule": NAME}
        config_id = wave["id"].rsplit("/", 1)[0]
        record = ok_record(f"{config_id}/{NAME}", point, {"time_us": [time_us] * 3})
        doc["records"].append(record)
    path.write_text(json.dumps(doc))


def test_tab_megamoe_shows_the_third_schedules_ratio_only_where_the_data_has_it(tmp_path):
    speedups = [1.0, 1.2, 1.5, 0.9, 1.1, 1.3, 0.95, 1.62]
    plain = tmp_path / "sim-two"
    write_megamoe(plain, speedups)
    two = megamoe_table.build(plain)
    three_ds = tmp_path / "sim-three"
    _with_deepgemm_interleaved(write_megamoe(three_ds, speedups), [80.0, 125.0, 100.0])
    three = megamoe_table.build(three_ds)
    # the headline and the groups of the compared pair unchanged; the third schedule's own
    # rows (over expert waves, and ours over it) added beside them
    added_rows = three.frame["group"].isin(
        [
            megamoe_table.over_group(schedule.DEEPGEMM_INTERLEAVED, schedule.WAVE),
            megamoe_table.over_group(schedule.INTERLEAVED, schedule.DEEPGEMM_INTERLEAVED),
        ]
    )
    assert added_rows.any()
    assert two.frame.equals(three.frame[~added_rows].reset_index(drop=True))
    before, after = two.sections[0][1], three.sections[0][1]
    label = "DeepGEMM interleaved layer time"
    added = [c for c in after.columns if c not in before.columns]
    assert added == [f"{label} {c}" for c in megamoe_table.SPEEDUP_COLUMNS]
    assert after[list(before.columns)].equals(before)  # the existing columns as they were
    assert not any(c.startswith("DeepGEMM interleaved") for c in before.columns)
    ratio = after[f"{label} speedup"]
    assert ratio.iloc[:3].tolist() == pytest.approx([100 / 80, 100 / 125, 1.0])
    assert ratio.iloc[3:].isna().all()  # configurations without the third schedule
    assert any(f"'{label} speedup' (per configuration, 3 of 8)" in n for n in three.notes)


def test_the_array_check_and_the_walk_judge_every_list_alike():
    """check_dependencies decides on whole arrays and walks the list only to name what is
    wrong: on every schedule's lists, and on each of them broken in one way (a tile moved
    before its Linear-1 tiles, one dropped, one repeated, one out of the grid), the arrays
    accept what the walk accepts and refuse what it refuses."""
    rng = np.random.default_rng(7)
    grid = _grid([300, 0, 129, 700], l1=3, l2=4)

    for name in schedule.SCHEDULES:
        tiles = schedule.build(name, grid, 8, {"lead_rows": 256})
        assert schedule._holds_every_dependency(tiles, grid)
        first_l2 = int(np.flatnonzero(tiles[:, 0] == schedule.L2)[0])
        early = np.insert(np.delete(tiles, first_l2, axis=0), 0, tiles[first_l2], axis=0)
        outside = tiles.copy()
        outside[rng.integers(len(tiles)), 3] = 99
        for broken in (early, tiles[1:], np.vstack([tiles, tiles[-1:]]), outside):
            assert not schedule._holds_every_dependency(broken, grid)
            with pytest.raises(schedule.ScheduleError, match=r"^(tile \d+|the list has)"):
                schedule.check_dependencies(broken, grid)  # the walk names where
