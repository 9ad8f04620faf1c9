"""What a reader cannot read in a figure (issue 56): shared by the tests of the synthetic
figures (test_readable_products) and of the committed ones (test_committed_products)."""

from xstage_bench.report.figures.common import NOTE_FONT

MAX_TITLE_LINES = 2


def _labels(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels() if t.get_visible() and t.get_text().strip()]


def unreadable(fig) -> list[str]:
    """What a reader cannot read in `fig`: an axis of a panel with data whose ticks are
    unlabelled (a shared axis counts as labelled where a panel it is shared with is; a
    colorbar's short side has no scale), a panel title of more than two lines, text smaller
    than the notes' (below it, the report's width shows it under 8 pt: fig-megamoe-lead's
    8-pt labels read 7.9 pt in the browser test)."""
    fig.canvas.draw()
    problems = [
        f"'{a.get_text()[:30]}' at {a.get_fontsize():g} pt"
        for a in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_fontsize"))
        if a.get_visible() and a.get_text().strip() and a.get_fontsize() < NOTE_FONT
    ]
    for ax in fig.axes:
        name = " ".join(ax.get_title().split()) or ax.get_label() or "untitled panel"
        lines = ax.get_title().split("\n")
        if len(lines) > MAX_TITLE_LINES:
            problems.append(f"'{name}': a title of {len(lines)} lines")
        if not (ax.get_visible() and ax.axison and ax.has_data()):
            continue
        colorbar = getattr(ax, "_colorbar", None)
        for letter, shared in (("x", ax.get_shared_x_axes()), ("y", ax.get_shared_y_axes())):
            if colorbar is not None and letter != (
                "y" if colorbar.orientation == "vertical" else "x"
            ):
                continue
            if not any(_labels(getattr(s, f"{letter}axis")) for s in shared.get_siblings(ax)):
                problems.append(f"'{name}': no tick labels on its {letter} axis")
    return problems
