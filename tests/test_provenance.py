"""What made a raw file (xstage_bench.data.provenance): a simulated file made from another
config section is remade with what differs; one that cannot be read says so."""

import json

from xstage_bench.data.provenance import (
    differences,
    measured_changes,
    section_hash,
    simulated_change,
    unreadable_change,
)

SECTION = {"world_size": 2, "attention": {"seq_lens": [8192, 16384]}}


def test_a_simulated_file_from_another_section_lists_what_differs(tmp_path):
    raw = tmp_path / "attention.json"
    old = {"world_size": 2, "attention": {"seq_lens": [8192]}}
    raw.write_text(json.dumps({"config": old, "config_sha256": section_hash(old)}))
    assert simulated_change(raw, "attention", SECTION) == [
        "attention.seq_lens: [8192] -> [8192, 16384]"
    ]
    raw.write_text(json.dumps({"config": SECTION, "config_sha256": section_hash(SECTION)}))
    assert simulated_change(raw, "attention", SECTION) is None


def test_a_truncated_simulated_file_is_remade_as_unreadable_not_as_another_config(tmp_path):
    """Audit: a cut-short file was remade "made from another config than this run's
    (attention: added)": its unreadable config was compared as an empty one."""
    raw = tmp_path / "attention.json"
    raw.write_text('{"schema": 1, "records": [{"id": "attention-')
    assert simulated_change(raw, "attention", SECTION) == [
        "the file is unreadable: not valid JSON (Unterminated string starting at line 1, "
        "column 34), so it is remade whole"
    ]
    assert unreadable_change(simulated_change(raw, "attention", SECTION))
    raw.write_bytes(b"\xff\xfe")
    assert simulated_change(raw, "attention", SECTION) == [
        "the file is unreadable: not UTF-8 text, so it is remade whole"
    ]


def test_differences_name_added_removed_and_changed_keys():
    old = {"a": 1, "b": {"c": [1], "d": "x"}}
    new = {"b": {"c": [1, 2]}, "e": True}
    assert differences(old, new) == ["a: removed", "b.c: [1] -> [1, 2]", "b.d: removed", "e: added"]


def test_what_the_simulator_rewrites_is_no_difference(tmp_path):
    """The simulator records the resolved world size and its own backends: a file whose
    config differs from the section only there is remade (its hash differs) listing nothing."""
    raw = tmp_path / "attention.json"
    made = {"world_size": 8, "attention": {"seq_lens": [8192, 16384], "backends": ["sim"]}}
    raw.write_text(json.dumps({"config": made, "config_sha256": section_hash(made)}))
    section = {"world_size": "auto", "attention": {"seq_lens": [8192, 16384], "backends": []}}
    assert simulated_change(raw, "attention", section) == []


def test_a_measured_file_that_recorded_world_size_auto_is_not_held_to_a_size(tmp_path):
    from xstage_bench.data import layout

    moe = {"shapes": [], "variants": ["ours"]}
    raw = tmp_path / layout.MEGAMOE_RAW
    raw.parent.mkdir(parents=True)
    raw.write_text(json.dumps({"config": {"world_size": "auto", "megamoe": moe}}))
    section = {"world_size": "auto", "megamoe": moe}
    assert measured_changes(tmp_path, "megamoe", section, world_size=4) == []
    assert measured_changes(tmp_path, "megamoe", {**section, "world_size": 2}) == []
