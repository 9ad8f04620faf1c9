"""fig-store-span-cdf: distribution of the per-tile far-end store span, per store path.

Per path, left: one distribution per run (expert waves, interleaved, and the local-store
control, the floor: on the peer path its own run, on the host path the share f = 0), the
traced configurations aggregated with equal weight (the mean of their ECDFs), so three
curves instead of one per configuration. Right: the per-configuration detail, each
configuration's median span per run, the number the paper quotes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from xstage_bench.data import layout, storepath
from xstage_bench.data.grid import LOCAL_CONTROL, fraction_label
from xstage_bench.megamoe.schedule import INTERLEAVED, SCHEDULES, WAVE
from xstage_bench.report.analysis import frames, labels, load, megamoe
from xstage_bench.report.figures import common

METRIC = "store_span_us"
SERIES = {  # run -> (colour, marker, line style); the control is dashed and its markers
    # small, so a schedule lying on the floor stays visible under it
    WAVE: ("tab:orange", "o", "-"),
    INTERLEAVED: ("tab:blue", "s", "-"),
    LOCAL_CONTROL: ("0.2", "D", "--"),
}
MARKER_SIZE = {WAVE: 90, INTERLEAVED: 60, LOCAL_CONTROL: 22}
TAIL = 0.995  # the CDF's x axis ends at this quantile of all spans (the longest tail noted)
LABEL = {
    **{name: SCHEDULES[name].label for name in (WAVE, INTERLEAVED)},
    LOCAL_CONTROL: "local-store control",
}
Spans = dict[str, dict[str, np.ndarray]]  # run -> configuration name -> sorted samples


def _spans(doc: dict) -> dict[str, Spans]:
    """path -> run -> configuration name -> its sorted span samples (ok records only)."""
    spans: dict[str, Spans] = {}
    for record in doc["records"]:
        point = record["point"]
        series = megamoe.trace_series(point)
        samples = (record.get("samples") or {}).get(METRIC)
        far = series == LOCAL_CONTROL or megamoe.stores_far(point)  # f = 0: all local
        if record["status"] == "ok" and series in SERIES and samples and far:
            path = storepath.point_path(point)
            by_run = spans.setdefault(path, {s: {} for s in SERIES})
            name = _short_name(point, control=series == LOCAL_CONTROL)
            by_run[series][name] = np.sort(np.asarray(samples, dtype=float))
    return {p: spans[p] for p in megamoe.ordered_paths(spans)}


def _short_name(point: dict, control: bool = False) -> str:
    """'glm-5.2\nw8a8, skewed, T=1024' (the world size is the dataset's); a share f set on
    a schedule's run is named, the control's (f = 0) is not, so that it sits on the row of
    the configuration it is the floor of."""
    tokens = point.get("tokens_per_rank")
    rest = [point.get("precision"), point.get("routing")] + ([f"T={tokens}"] if tokens else [])
    if not control and "remote_fraction" in point:
        rest.append(f"f={fraction_label(point['remote_fraction'])}")
    return f"{point.get('shape')}\n" + ", ".join(str(r) for r in rest if r)


def _row_of(name: str, configs: list[str]) -> list[int]:
    """The detail panel's rows a configuration name is drawn at: its own, or, for a
    control named without its share, every row of the configuration at some share."""
    if name in configs:
        return [configs.index(name)]
    return [i for i, c in enumerate(configs) if c.startswith(name + ", f=")]


def _mean_ecdf(samples: list[np.ndarray], grid: np.ndarray) -> np.ndarray:
    """The configurations' ECDFs averaged on `grid`: each configuration weighs the same."""
    return np.mean([np.searchsorted(s, grid, side="right") / s.size for s in samples], axis=0)


def plot(dataset_dir: Path) -> Figure:
    doc = load.raw_doc(dataset_dir, layout.MEGAMOE_TRACE_RAW)
    per_path = _spans(doc)
    if not per_path:
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_TRACE_RAW} has no ok record with "
            f"'{METRIC}' samples for {', '.join(SERIES)}"
        )
    fig, axes = common.new_figure(len(per_path), 2, width=6.0, height=4.6)
    handles: list = []
    notes = []
    for row, (path, spans) in enumerate(per_path.items()):
        handles += _plot_path(axes[row], path, spans, notes)
    notes.append("left: the traced configurations' distributions averaged, each weighted equally")
    notes.append(frames.failure_note(frames.records_frame(doc)))
    return common.finish_figure(
        fig,
        "MegaMoE per-tile far-end store span, " + megamoe.paths_text(per_path),
        labels.doc_label(dataset_dir, doc),
        notes,
        legend=handles,
    )


def _plot_path(axes, path: str, spans: Spans, notes: list) -> list[Line2D]:
    """One path's CDF and per-configuration panels; returns its legend entries."""
    cdf_ax, detail_ax = axes
    named = {name for s in (WAVE, INTERLEAVED) for name in spans[s]}
    configs = sorted(named | {n for n in spans[LOCAL_CONTROL] if not _row_of(n, sorted(named))})
    every = np.concatenate([v for by_config in spans.values() for v in by_config.values()])
    grid = np.linspace(every.min(), every.max(), 2000)
    handles = []
    for series, (color, marker, style) in SERIES.items():
        if not spans[series]:
            continue
        samples = list(spans[series].values())
        cdf_ax.step(
            grid, _mean_ecdf(samples, grid), where="post", color=color, linestyle=style, lw=2
        )
        medians = [float(np.median(v)) for v in samples]
        low, high = min(medians), max(medians)
        text = f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"
        handles.append(
            Line2D(
                [],
                [],
                color=color,
                marker=marker,
                linestyle=style,
                linewidth=2,
                label=f"{path}, {LABEL[series]}: medians {text} us",
            )
        )
        for name, median in zip(spans[series], medians, strict=True):
            rows = _row_of(name, configs)
            detail_ax.scatter(
                [median] * len(rows),
                rows,
                color=color,
                marker=marker,
                s=MARKER_SIZE[series],
                zorder=3,
            )
    right = float(np.quantile(every, TAIL))
    cdf_ax.set_xlim(every.min() - 0.02 * (right - every.min()), right)
    cdf_ax.set_xlabel(f"store span into {storepath.far_end(path)}\nof one Linear-2 tile (us)")
    cdf_ax.set_ylabel("fraction of tiles")
    cdf_ax.set_title(
        f"{path} path: {len(configs)} traced configuration(s)",
        fontsize=common.PANEL_TITLE_FONT,
    )
    detail_ax.set_yticks(range(len(configs)), configs)
    detail_ax.tick_params(axis="y", labelsize=9)
    detail_ax.set_ylim(len(configs) - 0.5, -0.5)
    detail_ax.xaxis.set_major_locator(MaxNLocator(4))  # few ticks: the range can be tiny
    detail_ax.set_xlabel("median span (us)")
    detail_ax.set_title(f"{path} path: median span", fontsize=common.PANEL_TITLE_FONT)
    notes.append(
        f"{path} path: x axis to the {TAIL:.1%} quantile of all spans ({right:.2f} us); "
        f"the longest span is {every.max():.2f} us"
    )
    missing = [LABEL[s] for s in SERIES if not spans[s]]
    if missing:
        notes.append(f"{path} path: no data for " + ", ".join(missing))
    return handles
