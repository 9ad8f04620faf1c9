"""The README is a five-minute page and every number in it, or in docs/, comes from a file
(issue 56): its generated blocks are what the files give today, its prose holds no typed
number, the configuration reference follows the schema, and the sentences the records once
contradicted say what the records say."""

import copy
import json
import re
from pathlib import Path

import pytest

from xstage_bench.data import layout
from xstage_bench.data.config import config_schema
from xstage_bench.report import config_reference, generated_docs, products, readme_results

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MAX_README_LINES = 150
TIMES = ROOT / ".ci" / "readme_times.py"


@pytest.fixture(scope="module")
def made() -> dict[str, str]:
    return generated_docs.made(ROOT, ROOT / "results")


def test_every_generated_block_is_what_the_files_give(made):
    stale = [name for name, text in made.items() if (ROOT / name).read_text() != text]
    assert not stale, (
        f"{', '.join(stale)}: a generated block differs from the committed files; run "
        "`xstage readme --write` (after re-rendering the references if a renderer changed)"
    )


def test_the_readme_opens_with_the_two_commands_and_stays_short():
    lines = README.splitlines()
    assert len(lines) <= MAX_README_LINES
    commands = [line.strip() for line in lines[1:5] if line.startswith("    ")]
    assert commands[0].endswith("&& .venv/bin/snakemake --cores all")
    assert commands[1] == ".venv/bin/python -m pytest"
    ci = (ROOT / ".ci" / "run").read_text()  # CI runs the test command as printed
    assert ".venv/bin/python -m pytest\n" in ci


def prose(markdown: str) -> str:
    """The text a reader reads as prose: without generated blocks, code blocks and spans,
    link targets and comments."""
    text = re.sub(r"<!-- BEGIN (\w+):.*?<!-- END \1 -->", "", markdown, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("    "))
    text = re.sub(r"`[^`]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def typed_numbers(markdown: str) -> list[str]:
    """Numbers standing alone in the prose ('1.18', '8-GPU', '60 h'); names that hold
    digits (H200, NVLink5, W8A8, Linear-2) are not numbers."""
    return re.findall(r"(?<![\w.-])\d+(?:[.,]\d+)*", prose(markdown))


def test_the_readme_prose_holds_no_typed_number():
    assert typed_numbers(README) == []


def test_the_number_rule_finds_what_the_old_readme_typed():
    old = "its FlashInfer times came from retries 60-61 h before; an 8-GPU B200 node, 1.18x."
    assert typed_numbers(old) == ["60", "8", "1.18"]
    kept = "`config/h200x8.yaml` on H200 and NVLink5 (W8A8)\n    python -m x 8\n"
    kept += "<!-- BEGIN claims: x -->\n| 1.18 |\n<!-- END claims -->"
    assert typed_numbers(kept) == []


def test_the_readme_durations_are_the_ones_ci_checks():
    """The README's test time is a statement CI checks against its own run
    (.ci/readme_times.py), so it may stand in the prose; the smoke run's is in running.md."""
    source = TIMES.read_text()
    assert "README.md" in source and "docs/running.md" in source
    assert re.search(r"runs the tests \(CPU only, about \w+ minutes? on two cores\)", README)


def test_the_readme_figure_and_links_lead_somewhere():
    targets = re.findall(r"\]\(([^)#]+)\)", README)
    local = [t for t in targets if not t.startswith("http")]
    assert any(t.endswith(".png") for t in local)
    assert all((ROOT / t).exists() for t in local), [t for t in local if not (ROOT / t).exists()]
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert set(pages) <= set(local), "a docs page the README does not link"


def test_the_readme_shows_the_headline_claims_and_the_nodes():
    for block in generated_docs.BLOCKS:
        if block.file == "README.md":
            assert f"<!-- BEGIN {block.name}:" in README, block.name
    claims = README.split("<!-- BEGIN claims:")[1].split("<!-- END claims -->")[0]
    assert claims.count("\n|") == len(generated_docs.HEADLINE_CLAIMS) + 2  # header, rule
    model = README.split("<!-- BEGIN model:")[1].split("<!-- END model -->")[0]
    assert model.count("\n|") == len(generated_docs.MODEL_VERDICTS) + 2
    nodes = README.split("<!-- BEGIN nodes:")[1].split("<!-- END nodes -->")[0]
    assert "| 1 |" in nodes and "| 2 |" in nodes and "| 8 |" in nodes
    assert "--configfile config/h200x8.yaml" in nodes


def test_the_models_verdicts_are_each_references_tab_claims_rows_under_a_bar_not_the_paper():
    """Issue 52: the README states the model's verdicts from tab-claims (generated, not
    typed), every bar of paper.MODEL_CLAIMS, its column saying whose number it is."""
    block = generated_docs.model_verdicts(ROOT, ROOT / "results")
    header = block.splitlines()[1]
    assert "bar (issue 52)" in header and "paper" not in header
    assert {"model.checks", "model.heldout_median", "model.heldout_p90"} <= set(
        generated_docs.MODEL_VERDICTS
    )
    assert {"model.playback_median", "model.playback_p90", "model.lead_auto_within"} <= set(
        generated_docs.MODEL_VERDICTS
    )
    assert set(generated_docs.CLAIM_REFERENCES) < set(generated_docs.MODEL_REFERENCES)
    for name in generated_docs.MODEL_REFERENCES:
        frame = generated_docs._claims(ROOT / "results" / name)
        for claim_id in generated_docs.MODEL_VERDICTS:
            row = frame.loc[claim_id].str.replace("|", "\\|")  # as Markdown escapes it
            assert f"| {row['statement']} | {row['paper']} {row['unit']} |" in block
            assert f"| {row['ours']} | {row['verdict']} |" in block, (name, claim_id)


def test_every_schema_key_has_a_line_in_the_configuration_reference():
    text = (ROOT / "docs" / "configuration.md").read_text()
    for key in config_reference.keys():
        assert f"- `{key.path}`:" in text, key.path


def test_a_key_added_to_the_schema_changes_the_reference():
    """The reference is made from the schema: a key the schema gains (or changes) is in it,
    so the committed page differs and test_every_generated_block_... fails until it is
    written again."""
    config = (ROOT / "config.yaml").read_text()
    schema = copy.deepcopy(config_schema())
    schema["properties"]["timing"]["properties"]["new_knob"] = {
        "type": "integer",
        "minimum": 1,
        "description": "a knob",
    }
    grown = config_reference.reference(config, schema)
    assert "- `timing.new_knob`: integer (>= 1); optional. a knob" in grown
    assert grown != config_reference.reference(config)
    schema["properties"]["timing"]["properties"]["warmup"]["maximum"] = 5
    assert "- `timing.warmup`: integer (>= 0, <= 5); required" in config_reference.reference(
        config, schema
    )


def test_config_comments_are_read_per_key():
    text = "# what a is\na: 1\nb:\n  # inner\n  c: 2   # and more\n  - d: 3\n"
    assert config_reference.yaml_comments(text) == {"a": "what a is", "b.c": "inner and more"}


def test_every_product_has_an_entry():
    text = (ROOT / "docs" / "figures-and-tables.md").read_text()
    for name in products.PRODUCTS:
        assert f"- **{name}**:" in text, name


def words(path: Path) -> str:
    return " ".join(path.read_text().split())


def test_the_baselines_of_ref_h200x1_were_timed_before_our_kernel():
    """The README said ref-h200x1's FlashInfer times 'came from retries hours after its
    own kernel times'; the records' clocks say 60 to 61 h before (DeepGEMM's too)."""
    doc = json.loads((ROOT / "results" / "ref-h200x1" / layout.MEGAMOE_RAW).read_text())
    for variant in ("flashinfer", "deepgemm"):
        apart = readme_results._runs_apart(doc, variant)
        assert apart["apart"] == apart["configurations"] > 0, variant
        assert apart["high_h"] < 0, variant  # the baseline's time less ours
    text = words(ROOT / "docs" / "reproducing.md")
    assert (
        "DeepGEMM's and FlashInfer's times were taken in other runs than our kernel's, before"
        in text
    )
    assert "hours after" not in text and "hours after" not in README


def test_the_dit_moe_records_of_deepgemm_say_it_did_not_import():
    """The README said DiT-MoE 'is refused by [DeepGEMM's] own layout check'; every
    committed DiT-MoE record of DeepGEMM says the module did not import."""
    reasons = set()
    for name in ("ref-h200x1", "ref-h200x2"):
        doc = json.loads((ROOT / "results" / name / layout.MEGAMOE_RAW).read_text())
        reasons |= {
            (r["status"], "No module named 'deep_gemm'" in (r.get("error") or ""))
            for r in doc["records"]
            if r["point"].get("variant") == "deepgemm"
            and r["point"]["shape"].startswith("dit-moe")
            and r["point"].get("precision") == "w8a8"
        }
    assert reasons == {("unsupported", True)}
    text = words(ROOT / "docs" / "reproducing.md")
    assert (
        "its DiT-MoE records say the worker could not import it (`No module named 'deep_gemm'`)"
        in text
    )
    assert "layout check" not in text and "layout check" not in README
