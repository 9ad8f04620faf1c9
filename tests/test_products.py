"""products.py, the one declaration of what each figure and table reads: every read is
made by an experiment, which products a dataset gets, their inputs, their renderers."""

import importlib
import json
from pathlib import Path

import pytest
from fixtures import SIMULATED_HOLDING

from xstage_bench.data import layout
from xstage_bench.report import products
from xstage_bench.report.products import PRODUCTS, Holding

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ("microbench", *layout.EXPERIMENT_FILES)


def test_every_read_is_made_by_an_experiment():
    for product in PRODUCTS.values():
        assert set(product.optional) <= set(product.reads), product.name
        for read in product.reads + product.counterpart_reads:
            if read != layout.ALL_RAW:
                assert products.made_from(read) in EXPERIMENTS, (product.name, read)
    with pytest.raises(ValueError, match="raw/unknown.json"):
        products.made_from("raw/unknown.json")


def test_the_experiments_are_the_configs_measured_experiments():
    schema = json.loads((ROOT / "src/xstage_bench/data/schemas/config.schema.json").read_text())
    enum = schema["properties"]["measured_experiments"]["items"]["enum"]
    assert sorted(enum) == sorted(EXPERIMENTS)
    assert set(layout.SIMULATED_EXPERIMENTS) <= set(EXPERIMENTS)


def test_every_product_has_its_renderer_module():
    for product in PRODUCTS.values():
        module = importlib.import_module(product.renderer)
        assert callable(getattr(module, "plot" if product.is_figure else "build")), product.name


def test_names_rules_and_outputs():
    drain, claims = PRODUCTS["fig-drain"], PRODUCTS["tab-claims"]
    assert (drain.rule, drain.renderer) == ("figure_fig_drain", "xstage_bench.report.figures.drain")
    assert drain.output(Path("results/d")) == Path("results/d/figures/fig-drain.pdf")
    assert drain.output(Path("d"), companion=True) == Path("d/figures/fig-drain.png")
    assert claims.output(Path("d"), companion=True) == Path("d/tables/tab-claims.md")
    assert len({p.rule for p in PRODUCTS.values()}) == len(PRODUCTS)


def gives(experiments, studies=()):
    has = Holding.of(experiments, studies)
    return {name for name, product in PRODUCTS.items() if has.gives(product)}


def test_a_simulated_dataset_gets_every_product_but_the_gpu_only_ones():
    got = {n for n, p in PRODUCTS.items() if SIMULATED_HOLDING.gives(p)}
    gpu_only = {"tab-process-model", "fig-megamoe-crossover", "tab-megamoe-crossover"}
    gpu_only |= {"fig-megamoe-lead", "tab-megamoe-lead"}  # the simulator sweeps no leads
    assert got == set(PRODUCTS) - gpu_only


def test_which_products_a_dataset_gets():
    assert gives(()) == set()
    megamoe = {"fig-megamoe-speedup", "fig-megamoe-timeline", "fig-store-span-cdf"}
    assert gives({"megamoe"}) == megamoe | {"tab-megamoe", "tab-claims", "tab-noise"}
    # the process-model table needs both process models' runs
    assert "tab-process-model" not in gives({"megamoe_per_gpu"})
    assert "tab-process-model" in gives({"megamoe", "megamoe_per_gpu"})
    # a figure needs its required study, not its optional one
    assert "fig-issue-vs-gap" not in gives({"microbench"}, ["drain"])
    assert "fig-issue-vs-gap" in gives({"microbench"}, ["gap_sweep"])
    # the model is fitted from microbench: a model-only product needs the studies' experiment
    assert "fig-model-validation" in gives({"microbench"}, ["drain"])
    assert "fig-ulysses" in gives({"attention"})  # its model line is optional


def test_reads_resolve_to_what_the_dataset_has():
    has = Holding.of({"microbench", "megamoe"}, ["gap_sweep"])
    issue = PRODUCTS["fig-issue-vs-gap"]
    assert has.reads(issue.reads) == ["raw/microbench/gap_sweep.json", layout.MODEL_JSON]
    assert has.reads(PRODUCTS["tab-noise"].reads) == [
        "raw/microbench/gap_sweep.json",
        layout.MEGAMOE_RAW,
        layout.MEGAMOE_TRACE_RAW,
    ]
    assert has.reads(PRODUCTS["tab-claims"].counterpart_reads) == [
        *has.all_raw(),
        layout.MODEL_JSON,
        layout.MEGAMOE_PLAYBACK,  # the model's verdict on the fused kernel
    ]


def test_what_is_on_disk(tmp_path):
    assert Holding.on_disk(tmp_path) == Holding.of((), ())
    (tmp_path / "raw" / "microbench").mkdir(parents=True)
    (tmp_path / layout.microbench_raw("drain")).write_text("{}")
    (tmp_path / layout.MEGAMOE_TRACE_RAW).write_text("{}")  # a trace alone: not the sweep
    (tmp_path / layout.ATTENTION_RAW).write_text("{}")
    assert Holding.on_disk(tmp_path) == Holding.of({"microbench", "attention"}, ["drain"])


def test_the_lead_map_is_given_only_where_the_sweep_has_lead_arms(tmp_path):
    from fixtures import write_megamoe, write_megamoe_host

    lead_products = {"fig-megamoe-lead", "tab-megamoe-lead"}
    assert lead_products.isdisjoint(gives({"megamoe"}))
    has = Holding.of({"megamoe"}, (), {products.LEAD_SWEEP})
    assert lead_products <= {n for n, p in PRODUCTS.items() if has.gives(p)}
    # on disk: read from raw/megamoe.json's records
    plain, swept = tmp_path / "h200x2", tmp_path / "h200x1"
    write_megamoe(plain)
    write_megamoe_host(swept)
    assert Holding.on_disk(plain).contents == frozenset()
    assert Holding.on_disk(swept).contents == {products.LEAD_SWEEP}
    assert all(Holding.on_disk(swept).gives(PRODUCTS[n]) for n in lead_products)
    # a run that measures megamoe with a lead sweep in its config makes it
    config = {"megamoe": {products.LEAD_SWEEP_KEY: {"shapes": ["glm-5.2"]}}}
    assert products.contents_of_config(config, ["megamoe"]) == {products.LEAD_SWEEP}
    assert products.contents_of_config(config, ["attention"]) == frozenset()
    assert products.contents_of_config({"megamoe": {}}, ["megamoe"]) == frozenset()
