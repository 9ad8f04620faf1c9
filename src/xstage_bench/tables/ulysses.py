"""tab-ulysses: fused over serial speedup per backend, heads and sequence length, on both
clocks (sender-visible, completion), beside the paper's FA3 table."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xstage_bench import layout, paper
from xstage_bench.analysis import attention, frames, labels, load
from xstage_bench.tables.common import Table

PAPER_BACKEND = "fa3"


def build(dataset_dir: Path) -> Table:
    doc = load.raw_doc(dataset_dir, layout.ATTENTION_RAW)
    frame = attention.serial_over_fused(doc)
    if "speedup_sender" not in frame.columns or frame["speedup_sender"].notna().sum() == 0:
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': {layout.ATTENTION_RAW} has no (backend, heads, S) "
            "with ok serial and fused sender_us records"
        )
    is_fa3 = frame["backend"] == PAPER_BACKEND
    for i, column in enumerate(("paper_serial_us", "paper_fused_us")):
        frame[column] = [
            paper.FA3_ULYSSES_US[s][i] if fa3 and s in paper.FA3_ULYSSES_US else np.nan
            for s, fa3 in zip(frame["seq_len"], is_fa3, strict=True)
        ]
    frame["paper_speedup"] = [
        paper.FA3_ULYSSES_SPEEDUP.get(s, np.nan) if fa3 else np.nan
        for s, fa3 in zip(frame["seq_len"], is_fa3, strict=True)
    ]
    best = frame.groupby("backend")["speedup_sender"].max()
    notes = [
        "speedup = serial time / fused time (medians); sender = the attention kernel returns, "
        "completion = every rank can read its result.",
        "paper: FA3 table (summary) on 8 GPUs, heads not stated; maximum sender-visible speedup "
        "FA3 1.43x, FA4 1.42x (abstract).",
        "our maximum sender-visible speedup: "
        + ", ".join(f"{b} {v:.3f}x" for b, v in best.items()),
        frames.failure_note(frames.records_frame(doc), "left out"),
    ]
    return Table(
        frame,
        "Ulysses attention: fused vs serial All-to-All",
        labels.doc_label(dataset_dir, doc),
        notes,
    )
