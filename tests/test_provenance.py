"""What made a raw file (xstage_bench.data.provenance): a simulated file made from another
config section is remade with what differs; one that cannot be read says so."""

import json

from xstage_bench.data.provenance import section_hash, simulated_change, unreadable_change

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
