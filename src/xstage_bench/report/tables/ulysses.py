"""tab-ulysses: fused over serial speedup per setting (store path, P, emulated or not),
backend, heads and sequence length, with a bootstrap CI and a verdict, on both clocks
(sender-visible, completion); beside the paper's FA3 table at its own P; and per setting
the headlines (maximum, geomean with CIs) with the win/loss/tie counts beside them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xstage_bench.data import layout, storepath
from xstage_bench.report import paper
from xstage_bench.report.analysis import attention, frames, labels, load
from xstage_bench.report.tables.common import MAIN, Columns, Table

PAPER_BACKEND = "fa3"
HEADLINE_TITLE = "Headlines per setting (sender-visible clock)"
BESIDE_TITLE = "Attention alone: each backend beside FA3"
COLUMNS = [
    "setting",
    "path",
    "ranks",
    "emulated",
    "world_size",
    "backend",
    "heads",
    "seq_len",
    "serial_sender_us",
    "fused_sender_us",
    "speedup_sender",
    "speedup_sender_ci_low",
    "speedup_sender_ci_high",
    "verdict_sender",
    "serial_completion_us",
    "fused_completion_us",
    "speedup_completion",
    "speedup_completion_ci_low",
    "speedup_completion_ci_high",
    "verdict_completion",
    "paired",
]
PATH_NOTES = {
    storepath.PEER: "peer path: serial = attention, the yunchang pack, NCCL all_to_all_single "
    "and the unpack; completion = a system-scope fence and a cross-rank barrier on the GPUs. "
    "Emulated: two GPUs play ranks 0 and P-1 of a P-GPU node (H/P heads each, (P-1)/P of the "
    "output over NVLink, the serial All-to-All moving the same rows); NVLink contention among "
    "P GPUs is not emulated.",
    storepath.HOST: "host path: one GPU plays rank 0 of a P-GPU node (H/P heads), host memory "
    "the other P-1 owners: (P-1)/P of its output goes over the host link; serial = attention, "
    "the pack and a copy-engine D2H copy (the receivers' unpack is the far end's, not timed); "
    "completion = a system-scope fence after the GPU's work. Emulated where P is not the "
    "number of GPUs; what the other ranks would send to this one is not emulated.",
}


def _headline_text(row) -> str:
    return (
        f"{row['backend']}, {row['setting']}: max {row['max']:.3f}x "
        f"(CI {row['max_ci_low']:.3f}-{row['max_ci_high']:.3f}, {row['max_at']}), "
        f"geomean {row['geomean']:.3f}x (CI {row['geomean_ci_low']:.3f}-"
        f"{row['geomean_ci_high']:.3f}); fused faster {row['faster']}, slower {row['slower']}, "
        f"tie {row['tie']} of {row['configurations']}"
    )


def _beside_notes(beside, host_lead: bool) -> list[str]:
    """Per backend: its share of FA3's TFLOP/s over the shapes, attention alone."""
    clocks = (
        "the sweep kept the GPU busy while the host enqueued each timed call "
        "(attention.host_lead), so these are GPU times; host enqueue = the host's median "
        "time to enqueue one call"
        if host_lead
        else "no host lead: a timed call's time includes whatever of its host enqueue "
        "outlasts the L2 flush before it"
    )
    notes = [
        f"attention alone beside {PAPER_BACKEND} (section below): share = {PAPER_BACKEND}'s "
        "median time / the backend's (its TFLOP/s over FA3's), 95% bootstrap CI, paired where "
        f"the two were timed in one set of rounds; {clocks}."
    ]
    for backend, rows in beside.groupby("backend"):
        share = rows[f"share_of_{PAPER_BACKEND}"]
        notes.append(
            f"{backend} alone: {share.min():.3f}-{share.max():.3f} of {PAPER_BACKEND}'s "
            f"TFLOP/s (median {share.median():.3f}); at least 0.95 on "
            f"{int((share >= 0.95).sum())} of {len(rows)} shapes, CI above 1 on "
            f"{int((rows[f'share_of_{PAPER_BACKEND}_ci_low'] > 1).sum())}"
        )
    return notes


def build(dataset_dir: Path) -> Table:
    doc = load.raw_doc(dataset_dir, layout.ATTENTION_RAW)
    frame = attention.serial_over_fused(doc)
    if "speedup_sender" not in frame.columns or frame["speedup_sender"].notna().sum() == 0:
        raise load.NoDataError(
            f"dataset '{dataset_dir.name}': {layout.ATTENTION_RAW} has no (backend, heads, S) "
            "with ok serial and fused sender_us records"
        )
    frame = frame[[c for c in COLUMNS if c in frame.columns]]
    # the paper's FA3 numbers (8 GPUs) beside our FA3 rows of the same P only
    is_fa3 = (frame["backend"] == PAPER_BACKEND) & (frame["ranks"] == paper.PAPER_GPUS)
    for i, column in enumerate(("paper_serial_us", "paper_fused_us")):
        frame[column] = [
            paper.FA3_ULYSSES_US[s][i] if fa3 and s in paper.FA3_ULYSSES_US else np.nan
            for s, fa3 in zip(frame["seq_len"], is_fa3, strict=True)
        ]
    frame["paper_speedup"] = [
        paper.FA3_ULYSSES_SPEEDUP.get(s, np.nan) if fa3 else np.nan
        for s, fa3 in zip(frame["seq_len"], is_fa3, strict=True)
    ]
    heads = attention.headlines(doc)
    paired = bool(frame["paired"].all())
    notes = [
        "speedup = serial time / fused time (medians); sender = this GPU's work for the mode "
        "is done, completion = every row can be read where it landed. One setting per row: "
        "path, P (ranks), emulated or not.",
        "CI: 95% bootstrap of the ratio of medians, "
        + (
            "paired (the modes were timed together in rounds, which are resampled together)"
            if paired
            else "paired where the records were timed together in rounds (paired = yes), "
            "else each side resampled on its own (paired = no: samples taken at other times)"
        )
        + "; verdict: faster (fused; CI above 1), slower (CI below 1), tie (CI spans 1).",
        f"paper: FA3 table (summary) on {paper.PAPER_GPUS} GPUs, heads not stated, beside our "
        f"FA3 rows at P={paper.PAPER_GPUS}; maximum sender-visible speedup FA3 1.43x, FA4 1.42x "
        "(abstract).",
        *(PATH_NOTES[p] for p in storepath.PATHS if (frame["path"] == p).any()),
        "headlines (sender): the maximum with its own configuration's CI; the geomean over "
        "configurations with a two-level bootstrap CI (configurations and their samples).",
        *(_headline_text(row) for _, row in heads.iterrows()),
        frames.failure_note(frames.records_frame(doc), "left out"),
    ]
    sections = []
    if not heads.empty:
        sections.append((HEADLINE_TITLE, heads))
    beside = attention.alone_beside(doc, PAPER_BACKEND)
    if not beside.empty:
        notes.extend(_beside_notes(beside, attention.timed_with_host_lead(doc)))
        sections.append((BESIDE_TITLE, beside))
    return Table(
        frame.reset_index(drop=True),
        "Ulysses attention: fused vs serial All-to-All",
        labels.doc_label(dataset_dir, doc),
        notes,
        sections,
        MARKDOWN_COLUMNS,
    )


# How the Markdown copy splits the wide frames (the CSV keeps every column).
_SETTING = ("setting", ("path", "ranks", "emulated", "world_size"))
MARKDOWN_COLUMNS = {
    MAIN: Columns(
        ("setting", "backend", "heads", "seq_len"),
        (
            (
                "sender-visible time",
                ("serial_sender_us", "fused_sender_us", "speedup_sender", "verdict_sender"),
            ),
            (
                "completion time",
                ("serial_completion_us", "fused_completion_us", "speedup_completion")
                + ("verdict_completion", "paired"),
            ),
            (
                "beside the paper",
                ("serial_sender_us", "fused_sender_us", "speedup_sender")
                + ("paper_serial_us", "paper_fused_us", "paper_speedup"),
            ),
            _SETTING,
        ),
    ),
    HEADLINE_TITLE: Columns(
        ("setting", "backend"),
        (
            (
                "speedups",
                ("configurations", "paired", "max", "max_at", "geomean", "faster", "slower")
                + ("tie",),
            ),
            _SETTING,
        ),
    ),
    BESIDE_TITLE: Columns(
        ("setting", "heads", "seq_len", "backend"),
        (
            ("TFLOP/s", ("tflops", "fa3_tflops", "share_of_fa3", "paired")),
            ("host side", ("host_enqueue_us", "fa3_host_enqueue_us", "gpu_waited_for_host")),
            _SETTING,
        ),
    ),
}
