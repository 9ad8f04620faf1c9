"""fig-backpressure-map: issue overhead t_iss - T0 over burst size V and gap G.

Read from the aligned gap sweep (gap_sweep_barrier: a grid barrier before each burst,
the bursts the laws describe) when the dataset has it, else from the free-running
gap_sweep; the title names the study. T0 is the fitted backpressure-free issue time of
each (K, V). Per K, the measured overhead sits beside the model's (the steady-train issue
time with the fitted T0, R and the K's Q), on one colour scale; the white curve is the
hiding gap G* = [V/R - T0]+, right of which the periodic law expects no overhead (only an
isolated burst's stall beyond Q). One pair of rows per store path (peer GPU, host memory)
and K, each with its path's fit; a path whose fit has no T0 (the overhead is measured
against it) gets one panel saying "no data" and the fit's reason. The local control is
not drawn.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure

from xstage_bench.data import storepath
from xstage_bench.model.laws import hiding_gap, issue_time, train_issue_time
from xstage_bench.report.analysis import fitted, frames, labels, load
from xstage_bench.report.figures import common

STUDIES = ("gap_sweep_barrier", "gap_sweep")  # the first one the dataset has
METRIC = "t_iss_slowest_us"
CELL_FONT = 9.5


def _edges(centers: np.ndarray) -> np.ndarray:
    """Cell edges halfway between sorted centers, the outer ones mirrored."""
    mid = (centers[1:] + centers[:-1]) / 2
    if centers.size == 1:
        return np.array([centers[0] - 0.5, centers[0] + 0.5])
    return np.concatenate([[2 * centers[0] - mid[0]], mid, [2 * centers[-1] - mid[-1]]])


def _study(dataset_dir: Path) -> tuple[str, dict]:
    for study in STUDIES[:-1]:
        doc = load.optional_raw_doc(dataset_dir, f"microbench:{study}")
        if doc is not None:
            return study, doc
    return STUDIES[-1], load.raw_doc(dataset_dir, f"microbench:{STUDIES[-1]}")


def _predicted(model: dict, K: int, V: np.ndarray, G: np.ndarray) -> np.ndarray | None:
    """Model overhead on the (V, G) grid: the steady-train issue time minus T0."""
    R = fitted.drain_rate(model)
    if R is None:
        return None
    T0 = fitted.t0_us(model, K, V)[:, None]
    Q = fitted.capacity_for_K(model, K)
    t = (
        issue_time(T0=T0, G=G, V=V[:, None], R=R)
        if Q is None
        else train_issue_time(T0=T0, G=G, V=V[:, None], R=R, Q=Q)
    )
    return t - T0


def _annotate(ax, columns: np.ndarray, sizes: np.ndarray, cells: np.ndarray, norm) -> None:
    """Each cell's value, dark on bright cells and light on dark ones."""
    for i, V in enumerate(sizes):
        for j, x in enumerate(columns):
            if np.isfinite(cells[i, j]):
                color = "k" if norm(cells[i, j]) > 0.6 else "w"
                value = cells[i, j]  # three digits at most: a cell is narrow
                label = (f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}").replace(
                    "-0.0", "0.0"
                )
                ax.text(x, V, label, ha="center", va="center", fontsize=CELL_FONT, color=color)


def _no_T0_reason(model: dict, path: str) -> str | None:
    """Why the model gives `path` no T0 (the fit's own reason), or None where it has one."""
    if path not in fitted.paths(model):
        return f"the model file has no fit for the {path} path"
    params = fitted.for_path(model, path)["params"]
    for name in ("t0_fixed_us", "issue_rate_per_sm_GBps"):  # T0 = t0_fixed + B / issue rate
        entry = params.get(name) or {}
        if entry.get("value") is None:
            return entry.get("reason", "T0 was not fitted")
    return None


def plot(dataset_dir: Path) -> Figure:
    study, doc = _study(dataset_dir)
    model = load.model_doc(dataset_dir)
    df = frames.records_frame(doc)
    ok = frames.ok_rows(df, dataset_dir, f"microbench/{study}.json", (METRIC,))
    paths = frames.remote_paths(ok)
    if not paths:
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': microbench/{study}.json has no ok peer or host record"
        )
    # The overhead needs the path's fitted T0: a path without one gets a panel saying why.
    unfitted = {path: why for path in paths if (why := _no_T0_reason(model, path)) is not None}
    fits = {path: fitted.for_path(model, path) for path in paths if path not in unfitted}
    sync = "barrier" if study == "gap_sweep_barrier" else "free"

    grids = {}
    for path in fits:
        fit = fits[path]
        mine = ok[ok["path"] == path]
        for K in sorted(int(k) for k in mine["K"].unique()):
            rows = mine[mine["K"] == K].copy()
            rows["overhead"] = rows[f"{METRIC}_median"] - fitted.t0_us(fit, K, rows["V"])
            grid = rows.pivot_table(index="V", columns="gap_us", values="overhead", aggfunc="first")
            sizes, gaps = grid.index.to_numpy(float), grid.columns.to_numpy(float)
            grids[path, K] = (sizes, gaps, grid.to_numpy(float), _predicted(fit, K, sizes, gaps))
    values = [g[2] for g in grids.values()] + [g[3] for g in grids.values() if g[3] is not None]
    # A square-root scale, so that sub-microsecond overheads stay visible beside stalls of
    # tens of microseconds; overheads below zero (issue faster than the fitted T0) clip to 0.
    vmax = max((float(np.nanmax(v)) for v in values), default=1.0)
    norm = PowerNorm(0.5, vmin=0.0, vmax=vmax, clip=True)

    # Measured above model, one pair of rows per (path, K): wide panels, so every cell's
    # number has room at a readable size; one row for a path without a T0 (K None).
    rows = [
        row
        for path in paths
        for row in ([(path, None)] if path in unfitted else [k for k in grids if k[0] == path])
    ]
    fig, axes = common.new_figure(
        sum(1 if K is None else 2 for _, K in rows),
        1,
        width=10.5,
        height=2.2 + 0.35 * max((len(g[0]) for g in grids.values()), default=4),
    )
    panel = iter(axes[:, 0])
    no_R = []
    for path, K in rows:
        far = storepath.far_end(path)
        if K is None:
            title = f"{far}: issue overhead t_iss - T0"
            common.no_data_panel(next(panel), title, unfitted[path], 120)
            continue
        fit = fits[path]
        R = fitted.drain_rate(fit)
        sizes, gaps, measured, predicted = grids[path, K]
        # Gaps are swept unevenly (dense near 0), so each gap gets a column of equal width.
        columns = np.arange(gaps.size, dtype=float)
        panels = (("measured", measured), ("model: steady-train law", predicted))
        for ax, (what, cells) in zip((next(panel), next(panel)), panels, strict=True):
            if cells is None:
                ax.set_axis_off()
                ax.set_title(
                    f"{far}, K={K}, {what}: omitted, R was not fitted",
                    fontsize=common.PANEL_TITLE_FONT,
                )
                continue
            mesh = ax.pcolormesh(
                _edges(columns),
                2 ** _edges(np.log2(sizes)),
                np.ma.masked_invalid(cells),
                cmap="magma",
                norm=norm,
                shading="flat",
            )
            _annotate(ax, columns, sizes, cells, norm)
            if R is not None:
                V = np.geomspace(sizes.min(), sizes.max(), 200)
                gstar = hiding_gap(T0=fitted.t0_us(fit, K, V), V=V, R=R)
                inside = gstar <= gaps.max()
                ax.plot(
                    np.interp(gstar[inside], gaps, columns),
                    V[inside],
                    color="white",
                    linewidth=1.5,
                )
            ax.set_xticks(columns, [f"{g:g}" for g in gaps])
            ax.set_yscale("log", base=2)
            common.byte_ticks(ax.yaxis, sizes)
            ax.set_xlabel("gap G (us), one column per measured gap")
            ax.set_ylabel("burst size V")
            ax.set_title(f"{far}, K={K}, {what}", fontsize=common.PANEL_TITLE_FONT)
            fig.colorbar(mesh, ax=ax, label="t_iss - T0 (us)", fraction=0.04, pad=0.01)
        if R is None:
            no_R.append(far)
    notes = [
        f"{study}: {labels.SYNC_LABEL[sync]}"
        + ("" if sync == "barrier" else " (this dataset has no gap_sweep_barrier)"),
        "T_iss = slowest producer's own store loop; T0, R, Q (each path's own) from "
        "model/burst_gap.json; white curve: the hiding gap G* = [V/R - T0]+; blank cells: "
        "no ok measurement",
        frames.failure_note(df),
    ]
    if no_R:
        notes.append(f"G* curve and model panel omitted for {', '.join(no_R)}: R was not fitted")
    return common.finish_figure(
        fig,
        f"Issue overhead over burst size and gap ({study})",
        labels.doc_label(dataset_dir, doc),
        notes,
    )
