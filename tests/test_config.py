"""The configuration: both shipped configs are valid, and bad values name their key."""

import copy
from pathlib import Path

import pytest
import yaml

from xstage_bench.data.config import ConfigError, load_config, validate_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def full_config():
    return load_config(ROOT / "config.yaml")


def test_shipped_configs_are_valid(full_config):
    smoke = load_config(ROOT / "config" / "smoke.yaml")
    assert smoke["measure"] == "never"
    assert len(full_config["megamoe"]["shapes"]) == 7


def test_full_config_has_the_84_megamoe_configurations(full_config):
    mm = full_config["megamoe"]
    n = len(mm["shapes"]) * len(mm["precisions"]) * len(mm["routings"]) * len(mm["tokens_per_rank"])
    assert n == 84
    assert set(mm["precisions"]) == {"w4a8", "w8a8"}
    assert mm["tokens_per_rank"] == [1024, 4096, 16384]


def test_full_config_ulysses_sweep(full_config):
    att = full_config["attention"]
    assert att["seq_lens"] == [8192, 16384, 32768, 49152, 65536, 131072]
    assert att["heads"] == [24, 40] and att["head_dim"] == 128


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda c: c["timing"].update(min_reps="ten"), "timing.min_reps"),
        (lambda c: c["attention"].update(head_dim=96), "attention.head_dim"),
        (lambda c: c["megamoe"]["shapes"][1].update(H=-4), "megamoe.shapes[1].H"),
        (
            lambda c: c["microbench"]["studies"]["drain"].update(K=[0]),
            "microbench.studies.drain.K[0]",
        ),
        (lambda c: c.update(world_size=0), "world_size"),
        (lambda c: c.update(world_size=1, store_paths=["peer"]), "store_paths"),
        (lambda c: c.update(store_paths=["nvlink"]), "store_paths"),
        (lambda c: c["datasets"].update(measured="sim-oops"), "datasets.measured"),
        (lambda c: c["timing"].update(max_reps=4, min_reps=5), "timing.max_reps"),
        (lambda c: c.pop("attention"), "(top level)"),
        (lambda c: c["microbench"].update(typo=1), "microbench"),
        (lambda c: c.update(world_size=2, gpu_ids=[0, 1, 2]), "gpu_ids"),
        (lambda c: c["megamoe"].update(lead_rows="fast"), "megamoe.lead_rows"),
        (lambda c: c["megamoe"].update(lead_auto_tflops=0), "megamoe.lead_auto_tflops"),
        (
            lambda c: c["megamoe"].update(
                lead_sweep={
                    "shapes": ["nope"],
                    "tokens_per_rank": [4096],
                    "remote_fractions": [0.5],
                    "lead_rows": [0, "auto"],
                }
            ),
            "megamoe.lead_sweep.shapes",
        ),
        (
            lambda c: c["megamoe"].update(
                lead_sweep={"shapes": ["glm-5.2"], "tokens_per_rank": [4096], "lead_rows": [0]}
            ),
            "megamoe.lead_sweep",
        ),
    ],
)
def test_bad_values_name_their_key(full_config, mutate, key):
    bad = copy.deepcopy(full_config)
    mutate(bad)
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    assert f"'{key}'" in str(err.value)


def test_megamoe_lead_rows_may_be_auto_and_swept(full_config):
    config = copy.deepcopy(full_config)
    config["megamoe"]["lead_rows"] = "auto"
    config["megamoe"]["lead_sweep"] = {
        "shapes": ["glm-5.2", "deepseek-v4-flash"],
        "precisions": ["w8a8"],
        "tokens_per_rank": [4096],
        "remote_fractions": [0, 0.25, 1],
        "lead_rows": [0, 256, 1024, 4096, "auto"],
    }
    validate_config(config)


def test_the_lead_map_may_add_shapes_of_its_own():
    """The reference's lead map: a shape drawn at random that no grid holds, named in its
    shapes and defined in custom_shapes, at every swept lead and share (issue 52)."""
    from xstage_bench.megamoe.points import lead_sweep_configs

    config = load_config(ROOT / "config" / "reference-h200x1.yaml")
    moe = config["megamoe"]
    assert "random-52" not in {s["name"] for s in moe["shapes"]}
    assert load_config(ROOT / "config.yaml")["megamoe"]["lead_rows"] == "auto"
    sweep = moe["lead_sweep"]
    assert sweep["lead_rows"] == [0, 256, 512, 768, 1024, 1536, 2048, 4096, "auto"]
    assert sweep["remote_fractions"][0] == 0 and sweep["remote_fractions"][-1] == 1
    configs = lead_sweep_configs(moe, 1, ["host"])
    drawn = [c for c in configs if c["shape"] == "random-52"]
    assert len({c["shape"] for c in configs}) == 4 and len(drawn) == 7
    assert (drawn[0]["H"], drawn[0]["I"], drawn[0]["E"], drawn[0]["topk"]) == (7168, 2048, 128, 6)
    clash = copy.deepcopy(config)
    clash["megamoe"]["lead_sweep"]["custom_shapes"][0]["name"] = "glm-5.2"
    with pytest.raises(ConfigError, match="megamoe.lead_sweep.custom_shapes"):
        validate_config(clash)
    wide = copy.deepcopy(config)
    wide["megamoe"]["lead_sweep"]["custom_shapes"][0]["E"] = 4  # fewer experts than topk
    with pytest.raises(ConfigError, match=r"custom_shapes\[0\]\.topk"):
        validate_config(wide)


def test_megamoe_variants_accept_flashinfer(full_config):
    config = copy.deepcopy(full_config)
    config["megamoe"]["variants"] = ["ours", "deepgemm", "flashinfer", "gemm_ceiling"]
    validate_config(config)
    config["megamoe"]["variants"] = ["ours", "flashinfer_sm100"]
    with pytest.raises(ConfigError, match="megamoe.variants"):
        validate_config(config)


def test_measured_dataset_cannot_overwrite_a_reference(full_config):
    bad = copy.deepcopy(full_config)
    bad["datasets"]["measured"] = bad["datasets"]["reference"][0]
    with pytest.raises(ConfigError, match="overwrite"):
        validate_config(bad)


def test_load_config_names_the_file(tmp_path, full_config):
    path = tmp_path / "c.yaml"
    bad = copy.deepcopy(full_config)
    bad["measure"] = "sometimes"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=r"c\.yaml: config key 'measure'"):
        load_config(path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


def test_extends_merges_mappings_and_replaces_lists():
    config = load_config(ROOT / "config" / "h200x8.yaml")
    full = load_config(ROOT / "config.yaml")
    assert config["world_size"] == 8 and config["datasets"]["measured"] == "h200x8"
    # mappings merge: the full studies stay, the variant's fan-out study is added
    assert set(config["microbench"]["studies"]) == set(full["microbench"]["studies"]) | {"fanout"}
    assert config["microbench"]["studies"]["fanout"]["peers"] == [1, 2, 4, 7]
    assert config["megamoe"] == full["megamoe"]
    assert "extends" not in config


def test_extends_of_a_missing_file_is_named(tmp_path):
    (tmp_path / "v.yaml").write_text("world_size: 4\nextends: nowhere.yaml\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "v.yaml")
    assert str(err.value).startswith(f"{tmp_path / 'v.yaml'}, line 2: extends 'nowhere.yaml'")
    assert f"{tmp_path / 'nowhere.yaml'} does not exist" in str(err.value)


def test_extends_is_relative_to_the_file_that_names_it(tmp_path, monkeypatch):
    """Issue 27: extends was resolved against the current directory."""
    (tmp_path / "variants").mkdir()
    (tmp_path / "base.yaml").write_text((ROOT / "config.yaml").read_text())
    (tmp_path / "variants" / "v.yaml").write_text("extends: ../base.yaml\nworld_size: 4\n")
    monkeypatch.chdir(ROOT / "config")  # anywhere else
    assert load_config(tmp_path / "variants" / "v.yaml")["world_size"] == 4
    # A path written relative to the current directory is named, with the path that works.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "variants" / "w.yaml").write_text("extends: base.yaml\n")
    with pytest.raises(
        ConfigError, match=r"line 1: extends 'base.yaml', .*did you mean '../base.yaml'"
    ):
        load_config(tmp_path / "variants" / "w.yaml")


def test_an_extends_cycle_is_named_not_a_recursion_error(tmp_path):
    """Issue 27: `extends:` pointing at itself raised RecursionError."""
    (tmp_path / "self.yaml").write_text("world_size: 2\nextends: self.yaml\n")
    with pytest.raises(ConfigError, match=r"self\.yaml, line 2: extends 'self.yaml', .* a cycle"):
        load_config(tmp_path / "self.yaml")
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(
        ConfigError, match=r"b\.yaml, line 1: extends 'a.yaml'.*a\.yaml -> .*b\.yaml -> .*a\.yaml"
    ):
        load_config(tmp_path / "a.yaml")


def test_every_shipped_config_is_valid():
    paths = sorted((ROOT / "config").glob("*.yaml"))
    assert paths  # an empty glob (a moved folder) would pass without checking anything
    for path in paths:
        load_config(path)


def _study(name):
    return lambda c: c["microbench"]["studies"][name]


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda c: _study("drain")(c).update(V=[10**15]), "microbench.studies.drain.V[0]"),
        (
            lambda c: _study("gap_sweep")(c).update(gap_us=[0, float("nan")]),
            "microbench.studies.gap_sweep.gap_us[1]",
        ),
        (lambda c: c["timing"].update(budget_s=float("inf")), "timing.budget_s"),
        (lambda c: c["megamoe"].update(tokens_per_rank=[10**12]), "megamoe.tokens_per_rank[0]"),
        (lambda c: c["attention"].update(seq_lens=[10**12]), "attention.seq_lens[0]"),
        (lambda c: c["microbench"].update(bursts=10**9), "microbench.bursts"),
        (lambda c: c.update(world_size=1000), "world_size"),
        (lambda c: c.update(world_size=6), "megamoe.shapes[0].E"),
        (lambda c: c["megamoe"]["shapes"][0].update(topk=17), "megamoe.shapes[0].topk"),
        # issue 54: the sub-grids' token lists are bounded as the main grid's
        (
            lambda c: c["megamoe"]["lead_sweep"].update(
                shapes=["glm-5.2"], tokens_per_rank=[262144]
            ),
            "megamoe.lead_sweep.tokens_per_rank[0]",
        ),
        (
            lambda c: c["megamoe"].update(per_gpu={"tokens_per_rank": [262144]}),
            "megamoe.per_gpu.tokens_per_rank[0]",
        ),
        (
            lambda c: c["megamoe"].update(per_gpu={"tokens_per_rank": [10**15]}),
            "megamoe.per_gpu.tokens_per_rank[0]",
        ),
        (lambda c: c["megamoe"].update(per_gpu={"shapes": ["glm5.2"]}), "megamoe.per_gpu.shapes"),
    ],
    ids=[
        "V",
        "gap-nan",
        "budget-inf",
        "tokens",
        "seq_len",
        "bursts",
        "ws-1000",
        "ws-6",
        "topk",
        "lead-sweep-tiles",
        "per-gpu-tiles",
        "per-gpu-1e15",
        "per-gpu-shape",
    ],
)
def test_values_that_would_hang_or_exhaust_memory_name_their_key(full_config, mutate, key):
    bad = copy.deepcopy(full_config)
    mutate(bad)
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    assert str(err.value).startswith(f"config key '{key}'"), err.value


def test_world_size_zero_says_which_values_are_allowed(full_config):
    bad = copy.deepcopy(full_config)
    bad["world_size"] = 0
    with pytest.raises(ConfigError, match=r"'world_size': must be \"auto\" or an integer from 1"):
        validate_config(bad)


def test_a_misspelled_key_is_named_not_the_whole_config(full_config):
    bad = copy.deepcopy(full_config)
    bad["attentoin"] = bad.pop("attention")
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    message = str(err.value)
    assert "'attentoin' (did you mean 'attention'?): unknown" in message
    assert len(message) < 300 and "seq_lens" not in message


def test_yaml_errors_name_the_file_once_with_line_and_column(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("world_size: auto\nmeasure: [never\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert message.count(str(path)) == 1 and "<unicode string>" not in message
    assert message.startswith(f"{path}, line 3, column 1: not valid YAML")


# --- bounded work (workload.py) ----------------------------------------------------------


def test_a_megamoe_shape_at_the_schemas_maxima_is_refused_before_any_work(full_config):
    """Issue 27: H = I = 65536, E = 4096, topk 64 at 262144 tokens validated, and
    `xstage simulate` reached 18.8 GB RSS after 228 s."""
    bad = copy.deepcopy(full_config)
    bad["megamoe"]["shapes"][0].update(H=65536, I=65536, E=4096, topk=64)
    bad["megamoe"]["tokens_per_rank"] = [1024, 262144]
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    message = str(err.value)
    assert message.startswith("config key 'megamoe.tokens_per_rank[0]': 1024 tokens per rank")
    assert "tiles per rank" in message and "GB" in message and "at most 1,000,000" in message


def test_xstage_simulate_refuses_it_at_once(tmp_path, full_config, capsys):
    import time

    from xstage_bench.cli import main

    bad = copy.deepcopy(full_config)
    bad["megamoe"]["shapes"] = [{"name": "huge", "H": 65536, "I": 65536, "E": 4096, "topk": 64}]
    bad["megamoe"]["tokens_per_rank"] = [262144]
    bad["megamoe"].pop("lead_sweep", None)  # its shapes are config.yaml's, not 'huge'
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(bad))
    start = time.monotonic()
    argv = ["simulate", "megamoe", "--config", str(tmp_path / "c.yaml"), "--dataset", "sim-x"]
    argv += [
        "--profile",
        str(ROOT / "config/hardware/h200.yaml"),
        "--out",
        str(tmp_path / "o.json"),
    ]
    assert main(argv) == 2
    assert time.monotonic() - start < 10
    assert "config key 'megamoe.tokens_per_rank[0]'" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize(
    "mutate, key, words",
    [
        (
            lambda c: c["megamoe"]["shapes"][0].update(H=65536, I=65536, E=64, topk=1),
            "megamoe.shapes[0]",
            "per GPU",
        ),
        (
            lambda c: c["attention"].update(seq_lens=[1048576], heads=[1024], batch=1),
            "attention.seq_lens[0]",
            "per GPU",
        ),
        (
            lambda c: (
                c["microbench"].update(bursts=4096, launches=1000),
                c["microbench"]["studies"]["gap_sweep"].update(gap_us=[1e6]),
            ),
            "microbench.studies.gap_sweep",
            "at most 24 h",
        ),
    ],
    ids=["moe-bytes", "attention-bytes", "microbench-time"],
)
def test_memory_and_time_estimates_name_the_key(full_config, mutate, key, words):
    bad = copy.deepcopy(full_config)
    if "megamoe.shapes" in key:
        bad["megamoe"]["tokens_per_rank"] = [128]
    mutate(bad)
    with pytest.raises(ConfigError) as err:
        validate_config(bad)
    assert str(err.value).startswith(f"config key '{key}'") and words in str(err.value)


def test_the_shipped_grids_sit_well_inside_the_limits():
    from xstage_bench.data import workload

    for path in [ROOT / "config.yaml", *sorted((ROOT / "config").glob("*.yaml"))]:
        config = load_config(path)
        moe = config["megamoe"]
        P = workload._world(config)
        tiles = max(
            workload.megamoe_tiles(s, t, P, moe["block_m"], moe["block_n"])
            for s in moe["shapes"]
            for t in moe["tokens_per_rank"]
        )
        assert tiles < workload.MAX_TILES_PER_RANK / 5, path


def test_the_schema_states_the_defaults_the_code_uses():
    # The schema's defaults are what a user reads: they once named three MegaMoE variants
    # while a config without the key ran all five, and required two GPUs in gpu_ids while a
    # one-GPU node measures the host path.
    from xstage_bench.data.config import config_schema
    from xstage_bench.megamoe.baselines import VARIANTS

    schema = config_schema()["properties"]
    assert schema["megamoe"]["properties"]["variants"]["default"] == list(VARIANTS)
    config = load_config(ROOT / "config.yaml")
    config.update(world_size=1, gpu_ids=[3])
    validate_config(config)
