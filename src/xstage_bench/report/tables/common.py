"""What every table shares: a frame with its title and notes, written as CSV and Markdown.

The CSV holds only the main frame's data (for other programs); the Markdown copy adds the
title with the dataset label (measured GPU or "simulated"), the notes (failed points,
provenance) and any further sections.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from xstage_bench.data.results import atomic_write_text


@dataclass
class Table:
    frame: pd.DataFrame
    title: str
    label: str  # the dataset label: measured GPU(s) or "(simulated ...)"
    notes: list[str] = field(default_factory=list)
    # further (title, frame) sections, written after the main frame in the Markdown copy
    sections: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    # the main frame's columns the Markdown copy shows, to fit a screen (empty: all); the
    # CSV keeps every column
    shown: tuple[str, ...] = ()


def format_cell(value: object) -> str:
    """Numbers to 4 significant digits; missing values as an empty cell."""
    if value is None or value is pd.NA:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (pandas' to_markdown needs tabulate; not a dependency)."""
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = [
        "| " + " | ".join(format_cell(v) for v in row) + " |"
        for row in frame.itertuples(index=False, name=None)
    ]
    return "\n".join([header, rule, *rows])


def write_table(table: Table, out: Path) -> None:
    """Write `out` (CSV) and the Markdown copy next to it (.md), each atomically."""
    out = Path(out)
    atomic_write_text(out, table.frame.to_csv(index=False))
    parts = [f"# {table.title}", "", table.label, ""]
    parts += [f"- {n}" for n in table.notes if n]  # notes first: tables can be long
    parts += ["", to_markdown(table.frame[list(table.shown)] if table.shown else table.frame)]
    for title, frame in table.sections:
        parts += ["", f"## {title}", "", to_markdown(frame)]
    atomic_write_text(out.with_suffix(".md"), "\n".join(parts) + "\n")
