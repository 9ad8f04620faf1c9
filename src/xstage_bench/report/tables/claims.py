"""tab-claims: every quantitative claim of the paper (xstage_bench.report.paper), this dataset's
number beside it, and a verdict computed from the data (tables.verdicts): reproduced,
differs (with the measured reason) or not measured (with why). Counterpart columns
(tables.counterparts) put a simulated or emulated source's number beside ours.

It renders from whatever the dataset holds: a file that is absent makes its claims "not
measured"; a file that is present but malformed still stops the render.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from xstage_bench.report import paper
from xstage_bench.report.analysis import labels
from xstage_bench.report.claims import claim_answers, verdicts
from xstage_bench.report.claims.claim_answers import Answer, NotMeasured
from xstage_bench.report.claims.claim_sources import Sources
from xstage_bench.report.claims.counterparts import COUNTERPARTS, Counterpart
from xstage_bench.report.tables.common import Table

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


def _counterpart_cells(counterpart: Counterpart, src: Sources | None, claim_id: str) -> dict:
    note_column = f"{counterpart.column} note"
    answer = counterpart.answers.get(claim_id)
    if src is None:
        return {counterpart.column: NOT_ANSWERED, note_column: "source not present"}
    if answer is None:
        return {counterpart.column: NOT_ANSWERED, note_column: "no counterpart for this claim"}
    found = answer(src)
    if isinstance(found, NotMeasured):
        return {counterpart.column: NOT_ANSWERED, note_column: found.why}
    return {counterpart.column: found.text, note_column: found.note}


def rows(dataset_dir: Path) -> tuple[Sources, pd.DataFrame]:
    src = Sources.load(dataset_dir)
    answers = claim_answers.answers_for(src)
    setting = verdicts.Setting.of(src)
    kind = "simulated" if src.simulated else "measured"
    others = [(c, c.sources(dataset_dir)) for c in COUNTERPARTS]
    out = []
    for claim in paper.CLAIMS:
        found = (
            NotMeasured("a CPU test of the harness (measure_device: cpu), not a measurement")
            if src.cpu_test
            else answers[claim.id](src)
        )
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
            row.update(_counterpart_cells(counterpart, other, claim.id))
        out.append(row)
    return src, pd.DataFrame(out)


def _dataset_label(dataset_dir: Path, src: Sources) -> str:
    for doc in (src.megamoe, src.attention, src.trace):
        if doc is not None:
            return labels.doc_label(dataset_dir, doc)
    if src.model is not None:
        return labels.model_label(dataset_dir, src.model)
    return labels.dataset_label(dataset_dir, None, None)


def build(dataset_dir: Path) -> Table:
    src, frame = rows(dataset_dir)
    counts = frame["verdict"].value_counts()
    tally = ", ".join(f"{counts.get(v, 0)} {v}" for v in verdicts.VERDICTS)
    notes = [
        f"verdicts: {tally}; computed from the data (criterion per row).",
        "paper numbers belong to the paper's hardware: "
        + "; ".join(sorted({c.context for c in paper.CLAIMS}))
        + ".",
        "(summary): from a secondary summary of the paper, not its PDF.",
    ]
    notes += [
        f"'{c.column}': the same claims answered by {c.kind} data, beside ours; "
        f"{NOT_ANSWERED} where that source has no number (its note says why)."
        for c in COUNTERPARTS
    ]
    return Table(
        frame,
        "The paper's quantitative claims, with ours beside them and a verdict",
        _dataset_label(dataset_dir, src),
        notes,
    )
