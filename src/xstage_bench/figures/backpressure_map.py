"""fig-backpressure-map: measured issue overhead t_iss - T0 over burst size V and gap G.

T0 is the fitted backpressure-free issue time of each (K, V). The model says the overhead
vanishes right of the hiding gap G* = [V/R - T0]+, drawn as a white curve: cells right of it
that are still warm are where the model is wrong. One panel per K; peer stores only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from xstage_bench.figures import common
from xstage_bench.model.laws import hiding_gap

STUDY = "gap_sweep"
METRIC = "t_iss_slowest_us"


def _edges(centers: np.ndarray) -> np.ndarray:
    """Cell edges halfway between sorted centers, the outer ones mirrored."""
    mid = (centers[1:] + centers[:-1]) / 2
    if centers.size == 1:
        return np.array([centers[0] - 0.5, centers[0] + 0.5])
    return np.concatenate([[2 * centers[0] - mid[0]], mid, [2 * centers[-1] - mid[-1]]])


def plot(dataset_dir: Path) -> Figure:
    doc = common.raw_doc(dataset_dir, f"microbench:{STUDY}")
    model = common.model_doc(dataset_dir)
    df = common.records_frame(doc)
    ok = common.ok_rows(df, dataset_dir, f"microbench/{STUDY}.json", (METRIC,))
    ok = ok[ok["dest"] == "peer"]
    if ok.empty:
        raise common.NoDataError(
            f"dataset '{dataset_dir.name}': microbench/{STUDY}.json has no ok peer record"
        )
    if common.t0_us(model, 1, 1.0) is None:
        raise common.NoDataError(
            f"dataset '{dataset_dir.name}': {dataset_dir / 'model/burst_gap.json'} has no fitted "
            "T0 (t0_fixed_us, issue_rate_per_sm_GBps), needed for the overhead"
        )
    R = common.drain_rate(model)
    Ks = sorted(int(k) for k in ok["K"].unique())

    fig, axes = common.new_figure(1, len(Ks), width=5.5, height=4.0)
    for ax, K in zip(axes[0], Ks, strict=True):
        rows = ok[ok["K"] == K].copy()
        rows["overhead"] = rows[f"{METRIC}_median"] - common.t0_us(model, K, rows["V"])
        grid = rows.pivot_table(index="V", columns="gap_us", values="overhead", aggfunc="first")
        gaps = grid.columns.to_numpy(float)
        sizes = grid.index.to_numpy(float)
        # V is swept geometrically, so cells are laid out on log2(V).
        mesh = ax.pcolormesh(
            _edges(gaps),
            2 ** _edges(np.log2(sizes)),
            np.ma.masked_invalid(grid.to_numpy(float)),
            cmap="magma",
            shading="flat",
        )
        fig.colorbar(mesh, ax=ax, label="t_iss - T0 (us)")
        if R is not None:
            V = np.geomspace(sizes.min(), sizes.max(), 200)
            ax.plot(
                hiding_gap(T0=common.t0_us(model, K, V), V=V, R=R),
                V,
                color="white",
                linewidth=1.5,
                label="G* = [V/R - T0]+",
            )
            ax.legend(fontsize=6, loc="lower right")
        ax.set_xlim(_edges(gaps)[0], _edges(gaps)[-1])
        ax.set_yscale("log", base=2)
        common.byte_ticks(ax.yaxis, sizes)
        ax.set_xlabel("gap G (us)")
        ax.set_ylabel("burst size V")
        ax.set_title(f"K={K}; T_iss = slowest producer's own store loop", fontsize=8)
    notes = [common.failure_note(df), "blank cells: no ok measurement"]
    if R is None:
        notes.append("G* curve omitted: R was not fitted")
    return common.finish_figure(
        fig,
        "Issue overhead over burst size and gap",
        common.doc_label(dataset_dir, doc),
        notes,
    )
