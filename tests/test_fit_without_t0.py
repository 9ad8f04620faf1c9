"""A store path whose isolated bursts drain slower than R (host bursts into pinned memory
at ~0.87 R, as one H200's GPU smoke run measured): the fit still gives T0 and a positive
Q where the records hold backpressure-free bursts, names the path and the reason where
they hold none, and fig-model-validation and fig-backpressure-map draw a "no data" panel
for a path without T0 beside the other paths' panels.

The records are SYNTHETIC: the simulator's host path (R = 52 GB/s, Q = 1 MiB), its
isolated study simulated with the drain at 0.87 R."""

from pathlib import Path

import numpy as np
import pytest
import yaml
from fixtures import MICROBENCH_DEFAULTS

from xstage_bench.data import layout
from xstage_bench.data.hardware import load_profile
from xstage_bench.data.results import read_raw, write_raw
from xstage_bench.model import capacity, fit
from xstage_bench.model.records import load
from xstage_bench.report.render import FIGURES, render_product
from xstage_bench.sim import run

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "tests" / "data" / "h200-seed.yaml"
MiB = 1 << 20
R_GBPS = 52.0
Q_BYTES = 1 * MiB
SLOW = 0.87  # the isolated bursts' drain rate, a fraction of R
SMALL_V = [64 << 10, 256 << 10, 512 << 10]  # below the knee: backpressure-free
LARGE_V = [2 * MiB, 3 * MiB, 4 * MiB, 6 * MiB, 8 * MiB, 12 * MiB, 16 * MiB, 24 * MiB]
FIGURE_NAMES = ("fig-model-validation", "fig-backpressure-map")


def studies(isolated_V: list[int], gaps: list[float]) -> dict:
    return {
        "drain": {"kind": "periodic", "K": [33, 132], "V": [4 * MiB, 16 * MiB], "gap_us": [0]},
        "gap_sweep": {"kind": "periodic", "K": [132], "V": [1 * MiB, 2 * MiB], "gap_us": gaps},
        "isolated": {"kind": "isolated", "K": [33, 132], "V": isolated_V},
    }


# Small bursts and gaps past V/R beside the knee: T0 is measured.
WITH_FREE_BURSTS = studies(SMALL_V + LARGE_V, [0, 4, 10, 60, 200])
# Every isolated burst past the knee and no gap that drains a burst: nothing is ever
# backpressure-free, so no T0 can be fitted whatever Q is.
ALL_STALLED = studies(LARGE_V, [0, 4, 10])


def _profile(tmp: Path, name: str, R: float) -> str:
    path = tmp / f"{name}.yaml"
    base = load_profile(H200).as_dict()
    path.write_text(yaml.safe_dump({**base, "drain_rate_GBps": R, "capacity_bytes": Q_BYTES}))
    return str(path)


def _as_host_path(path: Path) -> None:
    """Simulated peer-path records rewritten as the host path's (ids too)."""
    doc = read_raw(path)
    records = []
    for r in doc["records"]:
        rid = r["id"].replace("dest=peer", "dest=host")
        point = {**r["point"], "dest": "host", "path": "host", "id": rid}
        records.append({**r, "id": rid, "point": point})
    doc["records"] = records
    write_raw(path, doc)


def simulate(ds: Path, grids: dict[str, dict]) -> list[str]:
    """Raw microbench files in dataset `ds`, one per study, with the records of each path
    in `grids` (path -> studies): the host path's isolated bursts drained at SLOW * R, the
    peer path's from the H200 seed."""
    files = []
    for study in next(iter(grids.values())):
        out = ds / layout.microbench_raw(study)
        records = []
        for path, grid in grids.items():
            config = {
                "microbench": {
                    "bursts": 12,
                    "warmup_bursts": 4,
                    "launches": 3,
                    "defaults": dict(MICROBENCH_DEFAULTS),
                    "studies": grid,
                }
            }
            rate = R_GBPS * (SLOW if study == "isolated" else 1.0)
            profile = _profile(ds.parent, study, rate) if path == "host" else str(H200)
            run.simulate_microbench(config, profile, study, ds.name, str(out))
            if path == "host":
                _as_host_path(out)
            records += read_raw(out)["records"]
        doc = read_raw(out)
        doc["records"] = records
        write_raw(out, doc)
        files.append(str(out))
    return files


def fit_model(ds: Path, files: list[str]) -> dict:
    model = ds / layout.MODEL_JSON
    return fit.fit_files(
        files, ds.name, str(model), str(ds / "model" / "profile.yaml"), str(H200), n_bootstrap=10
    )


def test_isolated_bursts_draining_below_R_still_give_T0_and_a_positive_Q(tmp_path):
    ds = tmp_path / "sim-slow-host"
    files = simulate(ds, {"host": WITH_FREE_BURSTS})
    iso = load(files, "host").fit.isolated
    beyond = iso.V >= 8 * MiB  # the drain rate beyond the knee: the slope of V over T_iss
    drain = np.polyfit(iso.y[beyond], iso.V[beyond], 1)[0] / 1e3
    assert drain == pytest.approx(SLOW * R_GBPS, rel=0.02)
    result = fit_model(ds, files)
    p = result["params"]
    R = p["R_GBps"]["value"]
    assert R == pytest.approx(R_GBPS, rel=0.02)
    # What each K's bursts are seen to hold, the floor T0 falls back on, is no ~0 ...
    assert min(capacity.held(iso, R * 1e3).values()) > 0.5 * Q_BYTES
    # ... so T0 is the simulator's, and Q is positive: above the largest burst that never
    # stalled, below the capacity (the shared law, at R, reads the slower drain as less Q).
    truth = load_profile(H200)
    assert p["t0_fixed_us"]["value"] == pytest.approx(truth.t0_fixed_us, rel=0.05)
    assert p["issue_rate_per_sm_GBps"]["value"] == pytest.approx(
        truth.issue_rate_per_sm_GBps, rel=0.05
    )
    assert SMALL_V[-1] < p["Q_bytes"]["value"] < Q_BYTES
    for law in capacity.LAWS:
        assert result["variants"][law]["params"]["t0_fixed_us"]["value"] is not None
    assert result["validation"] and result["validation_summary"]["n"] > 0


def test_a_T0_the_records_cannot_give_is_named_with_its_path_and_why(tmp_path):
    ds = tmp_path / "sim-stalled-host"
    result = fit_model(ds, simulate(ds, {"host": ALL_STALLED}))
    p = result["params"]
    assert p["R_GBps"]["value"] == pytest.approx(R_GBPS, rel=0.02)
    t0 = p["t0_fixed_us"]
    assert t0["value"] is None and t0["ci_low"] is None and t0["ci_high"] is None
    reason = t0["reason"]
    assert reason.startswith("host path: T0 needs backpressure-free bursts")
    assert "with the capacity each K's bursts are seen to hold and R = 52.0 GB/s" in reason
    assert reason.endswith("below R from the zero-gap periods")
    assert "beyond the knee drain at about 45" in reason and "below R" in reason
    assert p["issue_rate_per_sm_GBps"]["value"] is None
    assert p["Q_bytes"]["value"] is None and p["Q_bytes"]["reason"].startswith("host path: ")
    window = result["variants"]["window"]["params"]["t0_fixed_us"]
    assert window["value"] is None and window["reason"].startswith("host path: ")
    assert result["validation"] == []


@pytest.fixture(scope="module")
def stalled_host(tmp_path_factory) -> Path:
    """A host-only dataset whose fit has no T0."""
    ds = tmp_path_factory.mktemp("host") / "sim-stalled-host"
    fit_model(ds, simulate(ds, {"host": ALL_STALLED}))
    return ds


@pytest.fixture(scope="module")
def peer_and_stalled_host(tmp_path_factory) -> Path:
    """The peer path fitted from the H200 seed beside the host path without T0."""
    ds = tmp_path_factory.mktemp("paths") / "sim-peer-and-stalled-host"
    fit_model(ds, simulate(ds, {"peer": WITH_FREE_BURSTS, "host": ALL_STALLED}))
    return ds


def _no_data_texts(ax) -> list[str]:
    return [" ".join(t.get_text().split()) for t in ax.texts if t.get_text().startswith("no data")]


def _panels(fig) -> list:
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.get_title()]


@pytest.mark.parametrize("name", FIGURE_NAMES)
def test_a_path_without_T0_gets_a_no_data_panel_naming_the_reason(name, stalled_host, tmp_path):
    out = tmp_path / f"{name}.pdf"
    render_product(name, stalled_host, out)
    assert out.exists() and out.with_suffix(".png").exists()
    panels = _panels(FIGURES[name](stalled_host))
    assert all(ax.get_title().startswith("host memory") for ax in panels)
    texts = [t for ax in panels for t in _no_data_texts(ax)]
    assert len(texts) == 1
    assert texts[0].startswith("no data: host path: T0 needs backpressure-free bursts")
    assert "R = 52.0 GB/s" in texts[0] and "below R" in texts[0]


def test_the_other_path_renders_as_before_beside_the_no_data_panel(peer_and_stalled_host):
    fig = FIGURES["fig-backpressure-map"](peer_and_stalled_host)
    titles = [ax.get_title() for ax in _panels(fig)]
    assert titles == [
        "peer GPU (NVLink), K=132, measured",
        "peer GPU (NVLink), K=132, model: steady-train law",
        "host memory: issue overhead t_iss - T0",
    ]
    host = _panels(fig)[-1]
    assert _no_data_texts(host)[0].startswith("no data: host path: T0 needs")
    assert all(not _no_data_texts(ax) for ax in _panels(fig)[:2])
    assert len(fig.axes) == 3 + 2  # each peer panel has its colour bar

    fig = FIGURES["fig-model-validation"](peer_and_stalled_host)
    peer = [ax for ax in fig.axes if ax.get_title().startswith("peer GPU")]
    assert len(peer) == 3 and peer[0].collections  # the scatter and both residual panels
    host = [ax for ax in fig.axes if ax.get_title().startswith("host memory")]
    assert len(host) == 1 and _no_data_texts(host[0])[0].startswith("no data: host path: T0")
    notes = " ".join(t.get_text() for t in fig.texts)
    assert "peer GPU (NVLink): held out (capacity law shared): median |err|" in notes
