"""The analysis layer draws nothing, tables never load the plotting stack, and the model
file is validated against its schema where it is written and where it is read."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from xstage_bench.data import layout
from xstage_bench.model.document import ModelFileError, read_model, write_model
from xstage_bench.report.analysis.load import model_doc

ROOT = Path(__file__).resolve().parents[1]


def test_tables_and_the_analysis_layer_load_no_plotting_stack():
    code = (
        "import pkgutil, sys, importlib\n"
        "import xstage_bench.report.analysis as a, xstage_bench.report.tables as t\n"
        "for pkg in (a, t):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__):\n"
        "        importlib.import_module(f'{pkg.__name__}.{m.name}')\n"
        "plot = ('matplotlib', 'seaborn', 'xstage_bench.report.figures')\n"
        "bad = [m for m in sys.modules if m.startswith(plot)]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_committed_model_file_matches_the_schema():
    models = sorted((ROOT / "results").glob(f"*/{layout.MODEL_JSON}"))
    assert models
    for path in models:
        read_model(path)


def _reference_model() -> dict:
    return json.loads(next((ROOT / "results").glob(f"*/{layout.MODEL_JSON}")).read_text())


def test_a_model_without_a_parameter_is_refused_on_read_naming_file_and_field(tmp_path):
    model = _reference_model()
    del model["params"]["R_GBps"]
    path = tmp_path / "ds" / layout.MODEL_JSON
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(model))
    with pytest.raises(ModelFileError, match=r"burst_gap\.json: field 'params': 'R_GBps'"):
        model_doc(tmp_path / "ds")


def test_a_malformed_model_is_never_written(tmp_path):
    model = _reference_model()
    model["checks"]["split_consistency"] = {"passed": "maybe", "detail": ""}
    out = tmp_path / "burst_gap.json"
    with pytest.raises(ModelFileError, match="checks/split_consistency/passed"):
        write_model(out, model)
    assert not out.exists()
    write_model(out, _reference_model())
    assert read_model(out) == _reference_model()


def test_fitted_reads_each_store_path_and_old_files_as_the_peer_path(tmp_path):
    from fixtures import HOST_LINE_RATE, HOST_TRUTH, write_model

    from xstage_bench.data.hardware import load_profile
    from xstage_bench.report.analysis import fitted
    from xstage_bench.report.analysis.load import model_doc

    ds = tmp_path / "h200x2-paths"
    write_model(ds, paths=("peer", "host"))
    model = model_doc(ds)
    assert fitted.paths(model) == ["peer", "host"]
    host = fitted.for_path(model, "host")
    assert fitted.path_of(host) == "host" and host["dataset"] == ds.name
    assert fitted.drain_rate(host) == pytest.approx(HOST_TRUTH["R_GBps"] * 1e3)
    assert fitted.drain_rate(model) == pytest.approx(365e3)  # the top level: the peer path
    assert fitted.ceilings(host)["host link line rate (spec)"] == HOST_LINE_RATE
    assert "sm-store host memory ceiling" in fitted.ceilings(host)
    # a profile refit to the top level's path, taken to the host path's T0, R and Q
    profile = fitted.path_profile(load_profile(ROOT / "tests/data/h200-seed.yaml"), model, "host")
    assert profile.drain_rate_GBps == HOST_TRUTH["R_GBps"]
    assert profile.capacity_bytes == HOST_TRUTH["Q_bytes"] and profile.name.endswith("host path")
    assert profile.capacity_per_producer_bytes == 0.0  # the fixture's law is the shared one
    # results/ref-h200x2 predates paths: one fit, the peer path's, its ceilings as before
    ref = model_doc(ROOT / "results" / "ref-h200x2")
    assert fitted.paths(ref) == ["peer"] and fitted.for_path(ref, "peer") is ref
    assert set(fitted.ceilings(ref)) == {
        "sm-store peer ceiling",
        "copy-engine peer ceiling",
        "NVLink line rate (spec)",
    }


def test_the_capacity_drawn_for_K_is_the_law_where_the_file_has_one(tmp_path):
    from fixtures import write_model

    from xstage_bench.report.analysis import fitted

    ds = tmp_path / "sim-law"
    write_model(ds)
    model = model_doc(ds)
    S = model["params"]["S_bytes"]["value"]
    model["params"]["q_bytes"]["value"] = 1000.0
    assert fitted.capacity_for_K(model, 66) == pytest.approx(S + 66 * 1000.0)
    # a file written before the law: the Q fitted to that K, else the pooled Q
    for name in ("S_bytes", "q_bytes"):
        del model["params"][name]
    knee = next(k["Q_bytes"]["value"] for k in model["per_K"] if k["K"] == 66)
    assert fitted.capacity_for_K(model, 66) == knee
    assert fitted.capacity_for_K(model, 33) == model["params"]["Q_bytes"]["value"]


def _before_the_ceiling(model: dict) -> dict:
    """A model file as fits wrote it before the capped law: law "S + K q", three variants,
    no C_bytes anywhere."""
    old = json.loads(json.dumps(model))
    old["capacity_law"]["law"] = "S + K q"
    for block in (old["capacity_law"]["heldout"], old["capacity_law"]["heldout_all_records"]):
        del block["capped"]
    del old["variants"]["capped"]
    for params in [old["params"], *(v["params"] for v in old["variants"].values())]:
        del params["C_bytes"]
    return old


def test_a_model_written_before_the_ceiling_loads_and_has_none(tmp_path):
    from fixtures import write_model

    from xstage_bench.data.hardware import load_profile
    from xstage_bench.megamoe.ours import lead
    from xstage_bench.report.analysis import fitted

    ds = tmp_path / "sim-old"
    write_model(ds)
    path = ds / layout.MODEL_JSON
    old = _before_the_ceiling(model_doc(ds))
    old["params"]["q_bytes"]["value"] = 1000.0
    path.write_text(json.dumps(old))
    model = read_model(path)
    S = model["params"]["S_bytes"]["value"]
    assert fitted.ceiling(model) == float("inf")
    assert fitted.law_capacity(model, 264) == pytest.approx(S + 264 * 1000.0)
    seed = load_profile(ROOT / "tests/data/h200-seed.yaml")
    assert fitted.path_profile(seed, model, "peer").capacity_ceiling_bytes is None
    drain = lead.read_drain(path, "peer")
    assert drain.C_bytes is None and drain.path_params().capacity_ceiling == float("inf")
    assert drain.capacity_bytes(264) == pytest.approx(S + 264 * 1000.0)


def test_the_capped_law_is_read_with_its_ceiling_and_a_law_unknown_names_the_file(tmp_path):
    from fixtures import write_model

    from xstage_bench.data.hardware import load_profile
    from xstage_bench.megamoe.ours import lead
    from xstage_bench.report.analysis import fitted

    ds = tmp_path / "sim-capped"
    write_model(ds)
    path = ds / layout.MODEL_JSON
    model = model_doc(ds)
    model["capacity_law"]["chosen"] = "capped"
    model["params"] = model["variants"]["capped"]["params"]
    path.write_text(json.dumps(model))
    model = read_model(path)
    S, q, C = (model["params"][f"{n}_bytes"]["value"] for n in ("S", "q", "C"))
    assert S + 132 * q > C > S + 66 * q  # the fixture's ceiling binds at K = 132 only
    assert fitted.law_capacity(model, 66) == pytest.approx(S + 66 * q)
    assert fitted.law_capacity(model, 132) == pytest.approx(C)
    seed = load_profile(ROOT / "tests/data/h200-seed.yaml")
    assert fitted.path_profile(seed, model, "peer").capacity_ceiling_bytes == C
    drain = lead.read_drain(path, "peer")
    assert drain.C_bytes == C and drain.path_params().capacity_ceiling == C
    assert drain.capacity_bytes(132) == pytest.approx(C)
    model["capacity_law"]["chosen"] = "saturating"  # no such variant
    path.write_text(json.dumps(model))
    with pytest.raises(ModelFileError, match=r"burst_gap\.json: field 'capacity_law/chosen'"):
        read_model(path)
