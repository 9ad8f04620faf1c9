"""tab-model-checks: the model's errors and checks as rows (issue 27: fig-model-validation's
dozen lines of footnote moved into the table beside it)."""

import json

from fixtures import make_dataset

from xstage_bench.report.analysis import fitted, load
from xstage_bench.report.render import TABLES
from xstage_bench.report.tables import model_checks


def test_every_check_of_every_path_is_a_row_with_its_detail(tmp_path):
    ds = make_dataset(tmp_path, "sim-fixture")
    model = load.model_doc(ds)
    frame = TABLES["tab-model-checks"](ds).frame
    for path in fitted.paths(model):
        fit = fitted.for_path(model, path)
        checks = frame[(frame["path"] == path) & (frame["kind"] == "check")]
        assert list(checks["item"]) == list(fit["checks"])
        assert list(checks["detail"]) == [c["detail"] for c in fit["checks"].values()]
        mine = frame[frame["path"] == path]
        held = mine[mine["item"] == "fit set, held out (capacity law shared)"]
        summary = fit["validation_summary"]
        assert held["n"].item() == summary["n"]
        assert held["median_abs_rel_error"].item() == summary["median_abs_rel_error"]
        assert held["p90_abs_rel_error"].item() == summary["p90_abs_rel_error"]
        # every variant of the capacity law, the chosen one marked
        laws = mine[mine["item"].str.startswith("capacity law ")]
        assert list(laws["item"]) == [
            "capacity law shared, chosen: isolated bursts, held out over 5 folds",
            "capacity law window: isolated bursts, held out over 5 folds",
            "capacity law shared_plus_window: isolated bursts, held out over 5 folds",
            "capacity law capped: isolated bursts, held out over 5 folds",
        ]
        # the findings and the worst held-out rows, each with its numbers
        finding = mine[mine["kind"] == "finding"]
        assert finding["item"].tolist() == ["store_loop_share"]
        assert finding["detail"].item().startswith("K=132: 2% (3 records)")
        worst = mine[mine["kind"] == "worst held-out row"]
        assert list(worst["item"]) == [w["id"] for w in fit["worst_heldout"]]
        first = fit["worst_heldout"][0]
        assert f"({first['rel_error']:+.0%})" in worst["detail"].iloc[0]


def test_a_failed_check_reads_failed_and_is_counted(tmp_path):
    ds = make_dataset(tmp_path, "sim-fixture")
    path = ds / "model" / "burst_gap.json"
    doc = json.loads(path.read_text())
    name = next(n for n, c in doc["checks"].items() if c["passed"] is True)
    before = sum(c["passed"] is False for c in doc["checks"].values())
    doc["checks"][name].update(passed=False, detail="made to fail")
    path.write_text(json.dumps(doc))
    table = TABLES["tab-model-checks"](ds)
    row = table.frame[table.frame["item"] == name]
    assert row["result"].tolist()[0] == "FAILED" and row["detail"].tolist()[0] == "made to fail"
    assert table.notes[0].startswith(f"{before + 1} check(s) FAILED") and name in table.notes[0]
    counts = model_checks.counts(fitted.for_path(load.model_doc(ds), "peer"))
    assert counts.startswith(f"{before + 1} FAILED")
