"""tab-claims: every quantitative claim of the paper (xstage_bench.report.paper), this dataset's
number beside it with its 95% CI ('1.045 (1.039–1.051)'), and a verdict computed from the
data and the CI (claims.verdicts): reproduced, differs (with the measured reason), tie (the
CI straddles the criterion's threshold) or not measured (with why). Counterpart columns
(claims.counterparts) put a simulated or emulated source's number beside ours. The notes
name every row shown without a CI and why (claim_answers.Answer.no_ci).

It renders from whatever the dataset holds: a file that is absent makes its claims "not
measured"; a file that is present but malformed still stops the render.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from xstage_bench.report import paper
from xstage_bench.report.analysis import labels
from xstage_bench.report.claims import claim_answers, verdicts
from xstage_bench.report.claims.claim_answers import Answer, Found, NotMeasured
from xstage_bench.report.claims.claim_sources import Sources
from xstage_bench.report.claims.counterparts import COUNTERPARTS, Counterpart, shown_beside
from xstage_bench.report.tables.common import MAIN, Columns, Table

NOT_MEASURED = verdicts.NOT_MEASURED
NOT_ANSWERED = "n/a"  # a counterpart cell where that source has no number
COLUMNS = (
    "claim",
    "topic",
    "statement",
    "paper",
    "unit",
    "paper_source",
    "ours",
    "verdict",
    "why",
    "criterion",
    "ours_note",
    "ours_kind",
)


def _counterpart_cells(counterpart: Counterpart, src: Sources | None, found: Found | None) -> dict:
    note_column = f"{counterpart.column} note"
    if src is None:
        return {counterpart.column: NOT_ANSWERED, note_column: "source not present"}
    if found is None:
        return {counterpart.column: NOT_ANSWERED, note_column: "no counterpart for this claim"}
    if isinstance(found, NotMeasured):
        return {counterpart.column: NOT_ANSWERED, note_column: found.why}
    return {counterpart.column: found.text, note_column: found.note}


def _counterpart_answer(
    counterpart: Counterpart, src: Sources | None, claim_id: str
) -> Found | None:
    answer = counterpart.answers.get(claim_id)
    return None if src is None or answer is None else answer(src)


@dataclass
class Shown:
    """What the notes say about the rows' CIs: per claim, why a measured value shown in it
    (ours or a measured counterpart's) has no CI; and which columns hold simulated values
    (shown without CIs)."""

    no_ci: dict[str, set[str]] = field(default_factory=dict)
    simulated: list[str] = field(default_factory=list)

    def add(self, claim_id: str, src: Sources | None, found: Found | None, column: str) -> None:
        if src is not None and src.simulated:
            if column not in self.simulated and isinstance(found, Answer):
                self.simulated.append(column)
        elif isinstance(found, Answer) and found.no_ci:
            self.no_ci.setdefault(claim_id, set()).add(found.no_ci)

    def notes(self) -> list[str]:
        notes = []
        by_reason: dict[str, list[str]] = {}
        for claim_id, reasons in self.no_ci.items():
            for why in sorted(reasons):
                by_reason.setdefault(why, []).append(claim_id)
        if by_reason:
            rows = "; ".join(f"{', '.join(c)} ({why})" for why, c in by_reason.items())
            notes.append(f"rows whose measured values have no CI, and why: {rows}.")
        if self.simulated:
            notes.append(
                f"simulated values ({', '.join(self.simulated)}) are shown without CIs: the "
                "simulator's spread is no measurement's noise; a simulated row's verdict "
                "judges the value alone."
            )
        return notes


def rows(dataset_dir: Path) -> tuple[Sources, pd.DataFrame, Shown]:
    src = Sources.load(dataset_dir)
    answers = claim_answers.answers_for(src)
    setting = verdicts.Setting.of(src)
    kind = "simulated" if src.simulated else "measured"
    others = [(c, c.sources(dataset_dir)) for c in shown_beside(src.simulated, COUNTERPARTS)]
    shown = Shown()
    out = []
    for claim in paper.CLAIMS:
        found = (
            NotMeasured("a CPU test of the harness (measure_device: cpu), not a measurement")
            if src.cpu_test
            else answers[claim.id](src)
        )
        shown.add(claim.id, src, found, "ours")
        verdict = verdicts.judge(claim, found, setting)
        row = {
            "claim": claim.id,
            "topic": claim.topic,
            "statement": claim.statement,
            "paper": claim.paper_text(),
            "unit": claim.unit,
            "paper_source": claim.provenance,
            "ours": found.text if isinstance(found, Answer) else NOT_MEASURED,
            "verdict": verdict.verdict,
            "why": verdict.why,
            "criterion": verdict.criterion,
            "ours_note": found.note if isinstance(found, Answer) else "",
            "ours_kind": kind if isinstance(found, Answer) else "",
        }
        for counterpart, other in others:
            theirs = _counterpart_answer(counterpart, other, claim.id)
            shown.add(claim.id, other, theirs, f"'{counterpart.column}'")
            row.update(_counterpart_cells(counterpart, other, theirs))
        out.append(row)
    return src, pd.DataFrame(out), shown


def _dataset_label(dataset_dir: Path, src: Sources) -> str:
    for doc in (src.megamoe, src.attention, src.trace):
        if doc is not None:
            return labels.doc_label(dataset_dir, doc)
    if src.model is not None:
        return labels.model_label(dataset_dir, src.model)
    return labels.dataset_label(dataset_dir, None, None)


def build(dataset_dir: Path) -> Table:
    src, frame, shown = rows(dataset_dir)
    counts = frame["verdict"].value_counts()
    tally = ", ".join(f"{counts.get(v, 0)} {v}" for v in verdicts.VERDICTS)
    notes = [
        f"verdicts: {tally}; computed from the data (criterion per row).",
        "cells: a value and its 95% CI, '1.045 (1.039–1.051)' (one per head count where a "
        "row has several); a value without one is shown alone.",
        f"verdicts read the CI: {verdicts.REPRODUCED} when the whole CI meets the row's "
        f"criterion, {verdicts.DIFFERS} when a whole CI misses it, {verdicts.TIE} when a CI "
        "straddles its threshold (an edge of the tolerance band, the bound); a value without "
        "a CI is judged by itself.",
        "CIs as the other tables compute them, from the raw samples: MegaMoE geomean and "
        "median by the two-level bootstrap over configurations and their rounds or samples "
        "(tab-megamoe), min and max that configuration's own ratio CI; the ratios over the "
        "unfused baseline, the completion-coupled ceiling and the drain share by the same "
        "bootstrap (the latter two with R at its fitted value); Ulysses each configuration's "
        "serial/fused CI (tab-ulysses); R and Q the model's bootstrap CIs "
        "(model/burst_gap.json); T0 tab-burst-gap-params' pooled interval, the ends of the "
        "t0_fixed and issue-rate CIs combined (a conservative bound, not a bootstrap CI).",
        *shown.notes(),
        "paper numbers belong to the paper's hardware: "
        + "; ".join(sorted({c.context for c in paper.CLAIMS if not c.bar}))
        + ".",
        "(summary): from a secondary summary of the paper, not its PDF.",
        BAR_NOTE,
    ]
    notes += [
        f"'{c.column}': the same claims answered by {c.kind} data, beside ours; "
        f"{NOT_ANSWERED} where that source has no number (its note says why)."
        for c in shown_beside(src.simulated, COUNTERPARTS)
    ]
    return Table(
        frame,
        "The paper's quantitative claims, with ours beside them and a verdict",
        _dataset_label(dataset_dir, src),
        notes,
        columns={MAIN: markdown_columns()},
    )


BAR_NOTE = (
    f"bar ({paper.MODEL_BAR}): the abstract says the Burst-Gap model accurately predicts and "
    "guided the kernels, with no number; these rows' paper column holds the bar the project "
    "set (<= at most, >= at least), not a number of the paper. Their CIs: a percentile "
    "bootstrap over the held-out records or the played arms; over the lead map's points the "
    "headlines' two-level bootstrap (points resampled, each arm's speedup from its own "
    "replicates); the count of checks has none."
)


def markdown_columns() -> Columns:
    """How the Markdown copy splits the frame (the CSV keeps every column): ours beside the
    paper, why each verdict, the other datasets' answers and their notes, the sources."""
    others = tuple(c.column for c in COUNTERPARTS)
    return Columns(
        ("claim",),
        (
            ("ours beside the paper", ("statement", "paper", "unit", "ours", "verdict")),
            ("why each verdict", ("verdict", "criterion", "why")),
            ("beside the other datasets", ("paper", "unit", "ours", *others)),
            ("the other datasets' notes", tuple(f"{c} note" for c in others)),
            ("sources", ("topic", "paper_source", "ours_note", "ours_kind")),
        ),
    )
