"""What every figure shares: panels, titles, notes, the 'simulated' stamp, axis ticks and
saving. What a figure shows comes from the analysis layer (xstage_bench.report.analysis), which
the tables read too.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # renderers run headless (CI, Snakemake jobs); set before pyplot loads

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.artist import Artist  # noqa: E402
from matplotlib.axis import Axis  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    FixedLocator,
    FuncFormatter,
    LogLocator,
    NullFormatter,
    NullLocator,
)

from xstage_bench.report.analysis.labels import fmt_bytes  # noqa: E402

DPI = 100
# Text sizes (points) chosen for reading at report size, where a figure shows about as
# wide as a laptop screen: tick labels follow the seaborn theme below.
TITLE_FONT = 13
PANEL_TITLE_FONT = 10.5
LEGEND_FONT = 9.5
NOTE_FONT = 9
NOTE_LINE_IN = 0.17  # height of one line of notes, in inches
# The widest a figure is drawn, legend included: the report's summary column shows about
# 1190 CSS px at a 1400 px window, where a figure of this width shows its 9-pt notes at
# 8 pt (9 * 1190 / (96 * 13.9)); wider figures get narrower panels, not smaller text.
MAX_WIDTH_IN = 13.5

sns.set_theme(style="whitegrid", context="paper", font_scale=1.3)


def error_bars(rows: pd.DataFrame, metric: str) -> np.ndarray:
    """Asymmetric error bars (median to CI bounds) for matplotlib's errorbar."""
    median = rows[f"{metric}_median"].to_numpy(float)
    low = rows[f"{metric}_ci_low"].to_numpy(float)
    high = rows[f"{metric}_ci_high"].to_numpy(float)
    return np.vstack([np.clip(median - low, 0, None), np.clip(high - median, 0, None)])


def new_figure(
    nrows: int = 1, ncols: int = 1, *, width: float = 5.0, height: float = 3.6, **kwargs
) -> tuple[Figure, np.ndarray]:
    """A figure of nrows x ncols panels of about width x height inches each."""
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kwargs
    )
    return fig, axes


def _wrap(notes: list[str | None], width_in: float) -> list[str]:
    """Notes wrapped to the figure's width (never cut): one list entry per printed line."""
    chars = max(40, int(width_in * 72 / (NOTE_FONT * 0.6)))
    return [line for n in notes if n for line in textwrap.wrap(n, chars, subsequent_indent="  ")]


STAMP_ZORDER = 100  # above every artist a figure draws (matplotlib's legend is 5)


def _stamp_simulated(fig: Figure) -> None:
    """A faint 'simulated' across every panel, over the data (faint enough to read it
    through; behind it, bars and filled areas would hide it): the plot itself says so."""
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>" or not ax.get_visible() or not ax.axison:
            continue
        ax.text(
            0.5,
            0.5,
            "SIMULATED",
            transform=ax.transAxes,
            ha="center",
            va="center",
            rotation=20,
            fontsize=26,
            fontweight="bold",
            color="tab:purple",
            alpha=0.13,
            zorder=STAMP_ZORDER,
        )


def _panel_width_in(ax, panels_in: float) -> float:
    """The width of `ax`, in inches, when its grid's columns share `panels_in` (a panel
    spanning several columns gets their width)."""
    spec = ax.get_subplotspec()
    if spec is None:
        return panels_in
    return panels_in * len(spec.colspan) / spec.get_gridspec().ncols


def _wrap_panel_text(fig: Figure, panels_in: float) -> None:
    """Panel titles and x labels wrapped to a narrowed panel's width (never overlapping),
    the panels sharing `panels_in` inches across."""
    for ax in fig.axes:
        panel_in = _panel_width_in(ax, panels_in)
        for get, put in ((ax.get_title, ax.set_title), (ax.get_xlabel, ax.set_xlabel)):
            text = get()
            if not text:
                continue
            size = (ax.title if get == ax.get_title else ax.xaxis.label).get_fontsize()
            chars = max(12, int(panel_in * 72 / (size * 0.55)))
            parts = text.split("\n")
            wrapped = (textwrap.wrap(part, chars, break_on_hyphens=False) for part in parts)
            lines = [line for part in wrapped for line in part or [""]]
            put("\n".join(lines))


def finish_figure(
    fig: Figure,
    title: str,
    label: str,
    notes: list[str | None],
    legend: list[Artist] | None = None,
) -> Figure:
    """Title with the dataset label on its own line, notes at the bottom (wrapped, never
    cut), optionally one legend right of the panels, level with the top of the data (it
    hides none), and 'SIMULATED' inside every panel of a simulated dataset."""
    fig.suptitle(f"{title}\n{label}", fontsize=TITLE_FONT)
    if "(simulated" in label:  # dataset_label marks every simulated dataset so
        _stamp_simulated(fig)
    width, height = fig.get_size_inches()
    legend_in = 0.0
    handle = None
    if legend:
        handle = fig.legend(handles=legend, loc="upper left", fontsize=LEGEND_FONT, frameon=False)
        extent = handle.get_window_extent(fig.canvas.get_renderer())
        legend_in = extent.width / fig.dpi + 0.2
    total = min(width + legend_in, MAX_WIDTH_IN)  # the panels keep their size where they fit
    fig.set_size_inches(total, height)
    right = (total - legend_in) / total
    if total < width + legend_in:
        _wrap_panel_text(fig, total - legend_in)
    lines = _wrap(notes, fig.get_size_inches()[0])
    notes_in = 0.25 + NOTE_LINE_IN * len(lines)
    fig.set_size_inches(fig.get_size_inches()[0], height + notes_in)  # panels keep their size
    if lines:
        fig.text(
            0.01, 0.005, "\n".join(lines), fontsize=NOTE_FONT, va="bottom", ha="left", color="0.25"
        )
    fig.tight_layout(rect=(0, notes_in / (height + notes_in), right, 1))
    if handle is not None:
        top = max(ax.get_position().y1 for ax in fig.axes)
        handle.set_bbox_to_anchor((right, top), transform=fig.transFigure)
    return fig


def save_figure(fig: Figure, out: Path) -> None:
    """Write the figure as `out` (PDF) and as PNG next to it, then free it.

    The PDF carries no creation date, so re-rendering the same data gives the same bytes
    (a fresh clone that re-renders a committed reference leaves its tree clean).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"CreationDate": None})
    fig.savefig(out.with_suffix(".png"), dpi=DPI)
    plt.close(fig)


def no_data_panel(ax, title: str, reason: str, width_chars: int) -> None:
    """A panel that says "no data" and why, in place of a plot (a path whose fit has
    nothing to draw), with the title the plotted panel would have."""
    ax.text(
        0.5,
        0.5,
        textwrap.fill(f"no data: {reason}", width_chars),
        ha="center",
        va="center",
        fontsize=NOTE_FONT,
        transform=ax.transAxes,
    )
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=PANEL_TITLE_FONT)


def byte_ticks(axis: Axis, values: np.ndarray) -> None:
    """Ticks at the measured sizes, labelled '256 KiB', '4 MiB' (log axes in bytes)."""
    labelled: dict[str, float] = {}
    for v in np.unique(np.asarray(values, dtype=float)):
        labelled.setdefault(fmt_bytes(v), v)  # K*B rounding gives near-equal sizes one tick
    axis.set_major_locator(FixedLocator(list(labelled.values())))
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt_bytes(v)))
    axis.set_minor_locator(NullLocator())


DECADE_TICKS = 12  # every decade labelled, up to this many


class PlainLogLocator(LogLocator):
    """Ticks at 1, 2, 5 x 10^n, or at the decades alone where the axis spans too many for
    those to fit. matplotlib's LogLocator with subs takes itself for a minor locator once it
    would skip decades and returns no tick at all: ref-h200x1's fig-issue-vs-gap, 0.2 to
    7000 us, had bare y axes."""

    def __init__(self) -> None:
        super().__init__(base=10, subs=(1.0, 2.0, 5.0))

    def tick_values(self, vmin: float, vmax: float) -> np.ndarray:
        ticks = super().tick_values(vmin, vmax)
        if ticks.size:
            return ticks
        return LogLocator(base=10, numticks=DECADE_TICKS).tick_values(vmin, vmax)


def plain_log_ticks(axis: Axis) -> None:
    """Log-axis labels as plain numbers at 1, 2, 5 x 10^n rather than powers of ten."""
    axis.set_major_locator(PlainLogLocator())
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def marker_fill(sync: str, color) -> dict:
    """Marker face for a sync mode: filled for barrier, hollow for free."""
    return {"markerfacecolor": color if sync == "barrier" else "none", "markeredgecolor": color}
