"""Every renderer opens exactly what products.PRODUCTS declares it reads, so the DAG (which
builds each rule's inputs from that declaration) never draws a figure before its inputs."""

import sys
from pathlib import Path

import pytest
from fixtures import make_dataset, write_megamoe_emulated

from xstage_bench.data import layout
from xstage_bench.report import products
from xstage_bench.report.render import NoDataError, render_product

ROOT = Path(__file__).resolve().parents[1]
_opened: list[Path] | None = None


def _audit(event: str, args: tuple) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], str | Path):
        _opened.append(Path(args[0]).resolve())


sys.addaudithook(_audit)  # cannot be removed; it records only while _opened is a list


def files_opened(render) -> set[Path]:
    global _opened
    _opened = []
    try:
        render()
        return set(_opened)
    finally:
        _opened = None


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    ds = make_dataset(tmp_path_factory.mktemp("data"), "sim-fixture", playback=True)
    write_megamoe_emulated(ds)  # measured only, but every product must be audited
    (ds / layout.MODEL_PROFILE).write_text((ROOT / "config" / "hardware" / "h200.yaml").read_text())
    return ds.resolve()


def declared(product: products.Product, dataset: Path) -> set[Path]:
    paths = {Path(r) for r in products.Holding.on_disk(dataset).reads(product.reads)}
    if Path(layout.MODEL_JSON) in paths:
        # The model's own inputs, every microbench study, are made before the model is;
        # renderers open one of them for the dataset's environment.
        paths |= {Path(layout.microbench_raw(s)) for s in layout.studies_on_disk(dataset)}
    return paths


# the process model and the lead map need datasets of their own (tests below)
RENDERED = sorted(
    set(products.PRODUCTS) - {"tab-process-model", "fig-megamoe-lead", "tab-megamoe-lead"}
)


@pytest.mark.parametrize("name", RENDERED)
def test_a_renderer_opens_only_what_its_product_declares(name, dataset, tmp_path):
    out = tmp_path / ("x.pdf" if name.startswith("fig-") else "x.csv")
    try:
        opened = files_opened(lambda: render_product(name, dataset, out))
    except NoDataError as e:  # a new experiment: give make_dataset a writer for it
        pytest.skip(f"the synthetic dataset has no data for {name}: {e}")
    read = {p.relative_to(dataset) for p in opened if dataset in p.parents}
    assert read, f"{name} opened nothing of the dataset"
    assert read <= declared(products.PRODUCTS[name], dataset)


@pytest.mark.parametrize("name", ["fig-megamoe-lead", "tab-megamoe-lead"])
def test_the_lead_map_opens_only_what_it_declares(name, tmp_path):
    from fixtures import write_megamoe_host

    ds = tmp_path / "h200x1"
    write_megamoe_host(ds)
    ds = ds.resolve()
    out = tmp_path / ("x.pdf" if name.startswith("fig-") else "x.csv")
    opened = files_opened(lambda: render_product(name, ds, out))
    read = {p.relative_to(ds) for p in opened if ds in p.parents}
    assert read == declared(products.PRODUCTS[name], ds)


def test_the_process_model_table_declares_both_runs(tmp_path):
    from fixtures import write_megamoe, write_megamoe_per_gpu

    ds = tmp_path / "h200x2"
    write_megamoe(ds, baselines=True)
    write_megamoe_per_gpu(ds)
    ds = ds.resolve()
    opened = files_opened(lambda: render_product("tab-process-model", ds, tmp_path / "x.csv"))
    read = {p.relative_to(ds) for p in opened if ds in p.parents}
    assert read == declared(products.PRODUCTS["tab-process-model"], ds)


def test_a_stray_partial_file_is_not_a_study(dataset, tmp_path):
    import shutil

    ds = tmp_path / "copy"
    shutil.copytree(dataset, ds)
    partial = ds / "raw" / "microbench" / "drain.json.partial.json"
    shutil.copy(ds / layout.microbench_raw("drain"), partial)
    (ds / "raw" / "microbench" / "Odd Name.json").write_text("{}")
    assert "drain.json.partial" not in layout.studies_on_disk(ds)
    assert layout.studies_on_disk(ds) == sorted(layout.studies_on_disk(dataset))
    assert partial not in layout.raw_files(ds)
