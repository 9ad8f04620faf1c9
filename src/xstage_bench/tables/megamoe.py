"""tab-megamoe: the interleaved-over-expert-wave speedup, overall and per group, beside the
paper's 84-configuration summary."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from xstage_bench import layout, paper
from xstage_bench.figures import common
from xstage_bench.tables.common import Table


def speedup_stats(speedup: pd.Series) -> dict:
    return {
        "n": len(speedup),
        "geomean": common.geomean(speedup),
        "median": float(speedup.median()),
        "min": float(speedup.min()),
        "max": float(speedup.max()),
    }


def build(dataset_dir: Path) -> Table:
    doc = common.raw_doc(dataset_dir, layout.MEGAMOE_RAW)
    speedups, incomplete = common.megamoe_speedups(doc)
    if speedups.empty:
        raise common.NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_RAW} has no configuration with ok "
            "expert_wave and interleaved records (variant absent or 'ours')"
        )
    rows = [
        {
            "group": "overall",
            "value": "all",
            **speedup_stats(speedups["speedup"]),
            "paper_geomean": paper.MEGAMOE_GEOMEAN,
            "paper_median": paper.MEGAMOE_MEDIAN,
            "paper_min": paper.MEGAMOE_MIN,
            "paper_max": paper.MEGAMOE_MAX,
        }
    ]
    for group in common.MEGAMOE_GROUPS:
        for value, part in speedups.groupby(group, sort=True):
            rows.append({"group": group, "value": value, **speedup_stats(part["speedup"])})
    frame = pd.DataFrame(rows)  # the paper's columns are filled on the overall row only
    notes = [
        "speedup = expert-wave kernel time / interleaved kernel time (medians), our kernel "
        "(variant absent or 'ours').",
        f"paper: {paper.MEGAMOE_CONFIGS} configurations on a {paper.B200}; geomean and max "
        "from the abstract, median and min (summary).",
    ]
    notes.append(common.failure_note(common.records_frame(doc), "left out"))
    if len(incomplete):
        notes.append(
            f"{len(incomplete)} configuration(s) lack an ok time for both schedules "
            "and are left out"
        )
    return Table(
        frame,
        "MegaMoE interleaved vs expert-wave speedup",
        common.doc_label(dataset_dir, doc),
        notes,
    )
