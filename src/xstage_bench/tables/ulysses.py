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
    if "ranks" in frame.columns and (frame["ranks"] == paper.PAPER_GPUS).any():
        is_fa3 = is_fa3 & (frame["ranks"] == paper.PAPER_GPUS)  # beside its own P only
    for i, column in enumerate(("paper_serial_us", "paper_fused_us")):
        frame[column] = [
            paper.FA3_ULYSSES_US[s][i] if fa3 and s in paper.FA3_ULYSSES_US else np.nan
            for s, fa3 in zip(frame["seq_len"], is_fa3, strict=True)
        ]
    frame["paper_speedup"] = [
        paper.FA3_ULYSSES_SPEEDUP.get(s, np.nan) if fa3 else np.nan
        for s, fa3 in zip(frame["seq_len"], is_fa3, strict=True)
    ]
    notes = [
        "speedup = serial time / fused time (medians); sender = the attention kernel returns, "
        "completion = every rank can read its result.",
        f"paper: FA3 table (summary) on {paper.PAPER_GPUS} GPUs, heads not stated; maximum "
        "sender-visible speedup FA3 1.43x, FA4 1.42x (abstract).",
    ]
    if "ranks" in frame.columns:
        notes.append(
            "emulated: two GPUs play ranks 0 and P-1 of a P-GPU node (H/P heads each, (P-1)/P "
            "of the output over NVLink, the serial All-to-All moving the same rows); ranks = "
            "that P. NVLink contention among P GPUs is not emulated."
        )
        groups = frame.groupby(["backend", "ranks", "emulated"])["speedup_sender"].max()
        best = ", ".join(
            f"{b} P={p}{' (emulated)' if e else ''} {v:.3f}x" for (b, p, e), v in groups.items()
        )
    else:
        groups = frame.groupby("backend")["speedup_sender"].max()
        best = ", ".join(f"{b} {v:.3f}x" for b, v in groups.items())
    notes += [
        "our maximum sender-visible speedup: " + best,
        frames.failure_note(frames.records_frame(doc), "left out"),
    ]
    return Table(
        frame,
        "Ulysses attention: fused vs serial All-to-All",
        labels.doc_label(dataset_dir, doc),
        notes,
    )
