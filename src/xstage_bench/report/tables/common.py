"""What every table shares: a frame with its title and notes, written as CSV and Markdown.

The CSV holds only the main frame's data, every column (for other programs). The Markdown
copy is for reading: the title with the dataset label (measured GPU or "simulated"), the
first few notes, the main frame and any further sections, then the rest of the notes as the
table's caption. A frame wider than a reader can compare across (MAX_COLUMNS) is shown in
parts (`Columns`), each a value beside its confidence interval in one cell.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from xstage_bench.data.results import atomic_write_text

MAX_COLUMNS = 12  # the most columns a Markdown table shows: about a screen's width
LEAD_NOTES = 3  # notes before the data; the rest follow it as the caption
MAIN = ""  # the main frame's key in Table.columns (a section's is its title)
CI_CELL_NOTE = (
    "a cell 'v (lo–hi)' is a value and its confidence interval, the CSV's columns of the "
    "value and its _ci_low and _ci_high"
)


@dataclass(frozen=True)
class Columns:
    """How the Markdown copy shows a frame too wide to read whole: in parts, each `keys`
    (the columns that name a row) and then the columns a reader compares in that part,
    under the part's title. A column's confidence interval follows it. Columns a frame
    lacks are left out; every column of the frame must be in some part."""

    keys: tuple[str, ...]
    parts: tuple[tuple[str, tuple[str, ...]], ...]


@dataclass
class Table:
    frame: pd.DataFrame
    title: str
    label: str  # the dataset label: measured GPU(s) or "(simulated ...)"
    # the first LEAD_NOTES lead the Markdown copy; the rest follow the data as its caption
    notes: list[str] = field(default_factory=list)
    # further (title, frame) sections, written after the main frame in the Markdown copy
    sections: list[tuple[str, pd.DataFrame]] = field(default_factory=list)
    # how a wide frame is split in the Markdown copy: MAIN or a section's title -> Columns
    columns: dict[str, Columns] = field(default_factory=dict)


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


_CI_LOW = re.compile(r"^(?P<stem>.*?)[_ ]?(?:ci_low|CI low)$")


def _ci_columns(frame: pd.DataFrame) -> dict[str, tuple[str, str, str | None]]:
    """Each confidence interval of the frame: low column -> (low, high, value column or
    None). The value is the column the interval's stem names ('geomean' for
    'geomean_ci_low', 'layer time speedup' for 'layer time CI low', 'ratio' for 'ci_low')."""
    out = {}
    for low in frame.columns:
        match = _CI_LOW.match(str(low))
        if not match:
            continue
        high = str(low).replace("ci_low", "ci_high").replace("CI low", "CI high")
        if high not in frame.columns:
            continue
        stem = match["stem"]
        candidates = (stem, f"{stem}_speedup", f"{stem} speedup") if stem else ("ratio", "speedup")
        value = next((c for c in candidates if c in frame.columns), None)
        out[low] = (low, high, value)
    return out


def _with_cis(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with each value and its CI in one cell, 'v (lo–hi)', headed 'value (CI)';
    an interval without its value becomes one 'lo–hi' column."""
    cis = _ci_columns(frame)
    if not cis:
        return frame
    out = {}
    merged = {c for low, high, value in cis.values() for c in (low, high, value) if c}
    by_value = {value: (low, high) for low, high, value in cis.values() if value}
    for column in frame.columns:
        if column in by_value:
            low, high = by_value[column]
            out[f"{column} (CI)"] = [
                _value_ci(v, lo, hi)
                for v, lo, hi in zip(frame[column], frame[low], frame[high], strict=True)
            ]
        elif column in cis and cis[column][2] is None:
            low, high, _ = cis[column]
            out[f"{low.removesuffix('_low').removesuffix(' low')}"] = [
                _value_ci(None, lo, hi) for lo, hi in zip(frame[low], frame[high], strict=True)
            ]
        elif column not in merged:
            out[column] = list(frame[column])
    return pd.DataFrame(out)


def _value_ci(value, low, high) -> str:
    interval = (
        f"{format_cell(low)}–{format_cell(high)}" if format_cell(low) and format_cell(high) else ""
    )
    if value is None:
        return interval
    shown = format_cell(value)
    return f"{shown} ({interval})" if shown and interval else shown


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (pandas' to_markdown needs tabulate; not a dependency)."""
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = [
        "| " + " | ".join(format_cell(v) for v in row) + " |"
        for row in frame.itertuples(index=False, name=None)
    ]
    return "\n".join([header, rule, *rows])


def split(frame: pd.DataFrame, columns: Columns | None) -> list[tuple[str, pd.DataFrame]]:
    """The frame as the Markdown copy shows it: (part title, frame) per part, each with
    its values and CIs in one cell; the whole frame as one untitled part without `columns`.
    ValueError names a column no part shows."""
    if columns is None:
        return [("", _with_cis(frame))]
    cis = _ci_columns(frame)
    follows = {value: (low, high) for low, high, value in cis.values() if value}
    keys = [c for c in columns.keys if c in frame.columns]
    parts, shown = [], set(keys)
    for title, wanted in columns.parts:
        chosen = [c for c in wanted if c in frame.columns and c not in keys]
        if not chosen:
            continue
        chosen = list(dict.fromkeys(chosen + [ci for c in chosen for ci in follows.get(c, ())]))
        shown |= set(chosen)
        parts.append((title, _with_cis(frame[keys + chosen])))
    missing = [str(c) for c in frame.columns if c not in shown]
    if missing:
        raise ValueError(f"column(s) {', '.join(missing)} in no part of the Markdown copy")
    return parts


def markdown(table: Table) -> str:
    """The Markdown copy: title, label, the leading notes, every frame (split where it is
    too wide), then the rest of the notes as the caption. ValueError names a frame that
    shows more than MAX_COLUMNS columns."""
    notes = [n for n in table.notes if n]
    lines = [f"# {table.title}", "", table.label]
    if notes[:LEAD_NOTES]:
        lines += ["", *(f"- {n}" for n in notes[:LEAD_NOTES])]
    merged = False
    for heading, frame in [(MAIN, table.frame), *table.sections]:
        try:
            parts = split(frame, table.columns.get(heading))
        except ValueError as e:
            raise ValueError(f"{table.title!r}, {heading or 'main frame'}: {e}") from None
        for part_title, part in parts:
            if len(part.columns) > MAX_COLUMNS:
                raise ValueError(
                    f"{table.title!r}, {heading or 'main frame'}: {len(part.columns)} columns "
                    f"in Markdown, more than {MAX_COLUMNS}; split it by what a reader compares "
                    "(tables.common.Columns)"
                )
            merged |= any(str(c).endswith(" (CI)") for c in part.columns)
            title = ": ".join(t for t in (heading, part_title) if t)
            lines += ["", f"## {title}"] if title else []
            lines += ["", to_markdown(part)]
    caption = notes[LEAD_NOTES:] + ([CI_CELL_NOTE] if merged else [])
    if caption:
        lines += ["", "## Notes", "", *(f"- {n}" for n in caption)]
    return "\n".join(lines) + "\n"


def write_table(table: Table, out: Path) -> None:
    """Write `out` (CSV) and the Markdown copy next to it (.md), each atomically."""
    out = Path(out)
    text = markdown(table)  # before any write: a table that cannot be shown writes nothing
    atomic_write_text(out, table.frame.to_csv(index=False))
    atomic_write_text(out.with_suffix(".md"), text)
