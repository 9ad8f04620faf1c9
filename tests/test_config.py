"""The configuration: both shipped configs are valid, and bad values name their key."""

import copy
from pathlib import Path

import pytest
import yaml

from xstage_bench.config import ConfigError, load_config, validate_config

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
    (tmp_path / "v.yaml").write_text("extends: nowhere.yaml\nworld_size: 4\n")
    with pytest.raises(ConfigError, match="nowhere.yaml"):
        load_config(tmp_path / "v.yaml", root=tmp_path)


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
    ],
    ids=["V", "gap-nan", "budget-inf", "tokens", "seq_len", "bursts", "ws-1000", "ws-6", "topk"],
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
