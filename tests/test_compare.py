"""Comparing two runs point by point: ratios, the noise rule, what is left out, the CLI
and tab-process-model."""

from __future__ import annotations

import pytest
from fixtures import read_json, write_megamoe, write_megamoe_per_gpu

from xstage_bench.cli import main
from xstage_bench.data import layout
from xstage_bench.data.compare import CompareError, compare_docs
from xstage_bench.data.results import ok_record, raw_document
from xstage_bench.report.analysis.load import NoDataError
from xstage_bench.report.render import render_product


def _doc(times: dict[str, list[float]], experiment: str = "megamoe", sha: str = "a") -> dict:
    env = {"host": "h", "python": "3.12", "packages": {"torch": "2.11"}, "git": {"sha": sha}}
    records = [ok_record(i, {"id": i}, {"time_us": t}) for i, t in times.items()]
    return raw_document(
        experiment=experiment,
        backend="cuda",
        dataset="d",
        environment=env,
        config={},
        records=records,
    )


def test_identical_runs_agree_everywhere():
    a = _doc({"p1": [10.0, 10.1, 9.9], "p2": [20.0, 20.2, 19.8]})
    c = compare_docs(a, a)
    s = c.summary()
    assert c.metric == "time_us"
    assert s["points"] == 2 and s["agree"] == 2 and s["ci_disjoint"] == 0
    assert s["geomean_ratio"] == pytest.approx(1.0)
    assert c.environment == []


def test_a_shift_beyond_tolerance_with_tight_samples_disagrees_and_is_named():
    a = _doc({"p1": [10.0] * 5, "p2": [20.0] * 5, "p3": [30.0] * 5})
    b = _doc({"p1": [10.2] * 5, "p2": [22.0] * 5, "p3": [30.0] * 5}, sha="b")
    c = compare_docs(a, b)
    rows = c.rows.set_index("id")
    # p1: CIs disjoint (no spread) but 2% is within the 3% tolerance of run-to-run drift
    assert not rows.loc["p1", "ci_overlap"] and rows.loc["p1", "agree"]
    assert not rows.loc["p2", "agree"]
    assert rows.loc["p2", "ratio"] == pytest.approx(1.1)
    assert c.summary()["agree"] == 2
    text = "\n".join(c.lines())
    assert "p2: 20 -> 22 (x1.1000, disagrees)" in text
    assert "git sha: a vs b" in text
    assert compare_docs(a, b, tolerance=0.15).summary()["agree"] == 3


def test_noisy_samples_whose_cis_overlap_agree_even_beyond_tolerance():
    a = _doc({"p": [8.0, 10.0, 12.0, 9.0, 11.0]})
    b = _doc({"p": [9.0, 11.0, 13.0, 10.0, 12.0]})
    c = compare_docs(a, b)
    assert c.rows.loc[0, "ratio"] == pytest.approx(1.1)
    assert c.rows.loc[0, "ci_overlap"] and c.rows.loc[0, "agree"]


def test_points_missing_or_failed_in_one_run_are_listed_not_compared():
    a = _doc({"p1": [1.0], "p2": [2.0], "p3": [3.0]})
    b = _doc({"p2": [2.0], "p3": [3.0], "p4": [4.0]})
    b["records"][1] = {**b["records"][1], "status": "failed", "error": "boom"}
    c = compare_docs(a, b)
    assert list(c.rows["id"]) == ["p2"]
    assert (c.only_a, c.only_b, c.not_ok) == (["p1"], ["p4"], ["p3"])


def test_bad_comparisons_are_refused_with_the_reason():
    a = _doc({"p": [1.0]})
    with pytest.raises(CompareError, match="different experiments: megamoe vs attention"):
        compare_docs(a, _doc({"p": [1.0]}, experiment="attention"))
    with pytest.raises(CompareError, match="tolerance must be in"):
        compare_docs(a, a, tolerance=1.5)
    with pytest.raises(CompareError, match="point p has no metric 'kernel_us'"):
        compare_docs(a, a, metric="kernel_us")
    empty = {**a, "records": []}
    with pytest.raises(CompareError, match="has no ok point"):
        compare_docs(empty, a)


def test_cli_exit_code_says_whether_every_point_agrees(tmp_path, capsys):
    ds = tmp_path / "ds"
    write_megamoe(ds)
    write_megamoe_per_gpu(ds)
    single, per_gpu = ds / layout.MEGAMOE_RAW, ds / layout.MEGAMOE_PER_GPU_RAW
    csv = tmp_path / "rows.csv"
    assert main(["compare", str(single), str(per_gpu), "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "not ok in one run: 1" in out and "only in a:" in out  # a failed point, baselines
    assert csv.read_text().startswith("id,median_a,median_b,ratio")
    first = read_json(single)["records"][0]["id"]
    write_megamoe_per_gpu(ds, scale={first: 1.2})
    assert main(["compare", str(single), str(per_gpu)]) == 1
    assert f"{first}: 100 -> 120 (x1.2000, disagrees)" in capsys.readouterr().out
    assert main(["compare", str(single), str(tmp_path / "missing.json")]) == 2


def test_process_model_table_summarizes_the_two_runs(tmp_path):
    ds = tmp_path / "h200x2"
    write_megamoe(ds, baselines=True)
    first = read_json(ds / layout.MEGAMOE_RAW)["records"][0]["id"]
    write_megamoe_per_gpu(ds, scale={first: 1.5})
    out = ds / "tables" / "tab-process-model.csv"
    render_product("tab-process-model", ds, out)
    row = out.read_text().splitlines()
    assert row[0].startswith("metric,points,geomean_ratio,median_ratio,min_ratio,max_ratio,agree")
    assert len(row) == 2  # the fixture's records have the layer time only
    metric, points, _, _, low, high, agree = row[1].split(",")[:7]
    assert metric == "layer time (kernel + barrier + reduction)"
    records = read_json(ds / layout.MEGAMOE_RAW)["records"]
    ours = sum(1 for r in records if "variant" not in r["point"])
    assert int(points) == ours - 1  # one point failed in the per-GPU run
    assert float(high) == pytest.approx(1.5) and float(low) == pytest.approx(1.0)
    assert int(agree) == int(points) - 1
    md = out.with_suffix(".md").read_text()
    assert "one process per GPU" in md and "not ok in one run, left out" in md
    assert "git sha" in md  # the fixture's per-GPU run carries another sha
    # every per-point ratio has its CI and a verdict: the scaled point is told apart
    assert "| ratio (CI) | verdict | agree |" in md
    assert md.count("| single faster |") == 1


def test_process_model_table_without_a_per_gpu_run_names_the_missing_file(tmp_path):
    ds = tmp_path / "h200x2"
    write_megamoe(ds)
    with pytest.raises(NoDataError, match="raw/megamoe_per_gpu.json does not exist"):
        render_product("tab-process-model", ds, ds / "tables" / "tab-process-model.csv")
    assert not (ds / "tables").exists()  # no empty folder left behind by a failed render
