"""tab-claims: every quantitative claim of the paper (xstage_bench.paper), with this
dataset's number beside it, or "not measured" where the dataset has no data for it.

It renders from whatever the dataset holds: a file that is absent makes its claims "not
measured"; a file that is present but malformed still stops the render (never silently
skipped).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from xstage_bench import layout, paper
from xstage_bench.figures import common
from xstage_bench.tables.common import Table

NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Sources:
    """The dataset's files that claims are computed from; None where absent."""

    model: dict | None
    megamoe: dict | None
    trace: dict | None
    attention: dict | None

    @classmethod
    def load(cls, dataset_dir: Path) -> Sources:
        return cls(
            model=common.optional_model_doc(dataset_dir),
            megamoe=common.optional_raw_doc(dataset_dir, layout.MEGAMOE_RAW),
            trace=common.optional_raw_doc(dataset_dir, layout.MEGAMOE_TRACE_RAW),
            attention=common.optional_raw_doc(dataset_dir, layout.ATTENTION_RAW),
        )


Ours = tuple[str, str] | None  # (our number as text, how it was obtained) or None


# ---------------------------------------------------------------- Burst-Gap parameters


def _t0(src: Sources) -> Ours:
    if src.model is None:
        return None
    B = paper.B200_T0_B_BYTES
    value = common.t0_us(src.model, 1, B)  # one producer of B bytes: T0 depends on B only
    return None if value is None else (f"{value:.3g}", "fitted t0_fixed + B/issue_rate, B=32 KiB")


def _R(src: Sources) -> Ours:
    value = common.param(src.model, "R_GBps") if src.model else None
    return None if value is None else (f"{value:.4g}", "fitted, all K pooled")


def _largest_K_capacity(src: Sources) -> tuple[int, float] | None:
    if src.model is None:
        return None
    fitted = [e for e in src.model["per_K"] if (e.get("Q_bytes") or {}).get("value") is not None]
    if not fitted:
        return None
    entry = max(fitted, key=lambda e: e["K"])
    return int(entry["K"]), float(entry["Q_bytes"]["value"])


def _Q(src: Sources) -> Ours:
    found = _largest_K_capacity(src)
    if found is None:
        return None
    K, Q = found
    return f"{Q / common.MIB:.3g}", f"fitted at K={K} (the largest K with a fitted Q)"


def _Q_per_producer(src: Sources) -> Ours:
    found = _largest_K_capacity(src)
    if found is None:
        return None
    K, Q = found
    return f"{Q / K / common.KIB:.3g}", f"Q/K at K={K}"


# ---------------------------------------------------------------- MegaMoE


def _speedups(src: Sources) -> pd.DataFrame | None:
    if src.megamoe is None:
        return None
    speedups, _ = common.megamoe_speedups(src.megamoe)
    return speedups if len(speedups) else None


def _moe_stat(stat: str) -> Callable[[Sources], Ours]:
    def ours(src: Sources) -> Ours:
        speedups = _speedups(src)
        if speedups is None:
            return None
        s = speedups["speedup"]
        value = {
            "geomean": common.geomean(s),
            "median": s.median(),
            "min": s.min(),
            "max": s.max(),
        }[stat]
        return f"{value:.3f}", f"over {len(s)} configurations"

    return ours


def _moe_configs(src: Sources) -> Ours:
    speedups = _speedups(src)
    return None if speedups is None else (str(len(speedups)), "with both schedules ok")


def _span_medians(src: Sources, schedule: str) -> dict[tuple, float]:
    """Per configuration: the median per-tile store span of one schedule."""
    if src.trace is None:
        return {}
    return {
        common.megamoe_config_key(r["point"]): float(np.median(r["samples"]["store_span_us"]))
        for r in src.trace["records"]
        if r["status"] == "ok"
        and common.trace_series(r["point"]) == schedule
        and r.get("samples", {}).get("store_span_us")
    }


def _span_range(schedule: str) -> Callable[[Sources], Ours]:
    def ours(src: Sources) -> Ours:
        medians = list(_span_medians(src, schedule).values())
        if not medians:
            return None
        low, high = f"{min(medians):.3g}", f"{max(medians):.3g}"
        return (
            low if low == high else f"{low}-{high}",
            f"range of per-configuration medians, {len(medians)} configuration(s)",
        )

    return ours


def _span_vs_local(src: Sources) -> Ours:
    interleaved = _span_medians(src, "interleaved")
    local = _span_medians(src, "local_control")
    gaps = [interleaved[k] - local[k] for k in interleaved.keys() & local.keys()]
    if not gaps:
        return None
    return f"{max(gaps):.3g}", f"largest over {len(gaps)} configuration(s)"


def _over_unfused(src: Sources) -> Ours:
    if src.megamoe is None:
        return None
    ours_time, unfused_time = {}, {}
    for r in src.megamoe["records"]:
        if r["status"] != "ok":
            continue
        point, key = r["point"], common.megamoe_config_key(r["point"])
        if point.get("variant") == "unfused":
            unfused_time[key] = r["summary"]["time_us"]["median"]
        elif point.get("variant", "ours") == "ours" and point.get("schedule") == "interleaved":
            ours_time[key] = r["summary"]["time_us"]["median"]
    ratios = [unfused_time[k] / ours_time[k] for k in unfused_time.keys() & ours_time.keys()]
    if not ratios:
        return None
    return (
        f"{common.geomean(np.array(ratios)):.3f}",
        f"geomean of unfused / interleaved over {len(ratios)} configuration(s)",
    )


# ---------------------------------------------------------------- Ulysses


def _ulysses(src: Sources) -> pd.DataFrame | None:
    if src.attention is None:
        return None
    frame = common.serial_over_fused(src.attention)
    if "speedup_sender" not in frame.columns:
        return None
    frame = frame[frame["speedup_sender"].notna()]
    return frame if len(frame) else None


def _uly_max(backend: str) -> Callable[[Sources], Ours]:
    def ours(src: Sources) -> Ours:
        frame = _ulysses(src)
        rows = None if frame is None else frame[frame["backend"] == backend]
        if rows is None or rows.empty:
            return None
        best = rows.loc[rows["speedup_sender"].idxmax()]
        return (
            f"{best['speedup_sender']:.3f}",
            f"at S={int(best['seq_len'])}, {int(best['heads'])} heads",
        )

    return ours


def _uly_at(seq_len: int) -> Callable[[Sources], Ours]:
    def ours(src: Sources) -> Ours:
        frame = _ulysses(src)
        rows = (
            None
            if frame is None
            else frame[(frame["backend"] == "fa3") & (frame["seq_len"] == seq_len)]
        )
        if rows is None or rows.empty:
            return None
        text = ", ".join(f"{r.speedup_sender:.3f}" for r in rows.itertuples())
        heads = ", ".join(str(int(h)) for h in rows["heads"])
        return text, f"sender-visible, heads {heads}"

    return ours


# Every claim of paper.CLAIMS, mapped to how this dataset answers it. None: the harness
# has no number for it (the paper's counterfactual model of the unfused baseline).
OURS: dict[str, Callable[[Sources], Ours] | None] = {
    "bg.T0": _t0,
    "bg.R": _R,
    "bg.Q": _Q,
    "bg.Q_per_producer": _Q_per_producer,
    "moe.configs": _moe_configs,
    "moe.geomean": _moe_stat("geomean"),
    "moe.max": _moe_stat("max"),
    "moe.median": _moe_stat("median"),
    "moe.min": _moe_stat("min"),
    "moe.span_wave": _span_range("expert_wave"),
    "moe.span_interleaved": _span_range("interleaved"),
    "moe.span_vs_local": _span_vs_local,
    "moe.over_unfused": _over_unfused,
    "moe.completion_coupled_ceiling": None,
    "uly.fa3_max": _uly_max("fa3"),
    "uly.fa4_max": _uly_max("fa4"),
    **{f"uly.fa3_S={s}": _uly_at(s) for s in paper.FA3_ULYSSES_SPEEDUP},
}


def _dataset_label(dataset_dir: Path, src: Sources) -> str:
    for doc in (src.megamoe, src.attention, src.trace):
        if doc is not None:
            return common.doc_label(dataset_dir, doc)
    if src.model is not None:
        return common.model_label(dataset_dir, src.model)
    return common.dataset_label(dataset_dir, None, None)


def build(dataset_dir: Path) -> Table:
    src = Sources.load(dataset_dir)
    kind = "simulated" if common.is_simulated(dataset_dir, _backend(src)) else "measured"
    rows = []
    for claim in paper.CLAIMS:
        answer = OURS[claim.id]
        found = answer(src) if answer is not None else None
        rows.append(
            {
                "claim": claim.id,
                "topic": claim.topic,
                "statement": claim.statement,
                "paper": claim.paper_text(),
                "paper_source": claim.provenance,
                "ours": found[0] if found else NOT_MEASURED,
                "unit": claim.unit,
                "ours_note": found[1]
                if found
                else ("" if answer is not None else "no counterpart computed by this harness"),
                "ours_kind": kind if found else "",
            }
        )
    notes = [
        "paper numbers belong to the paper's hardware: "
        + "; ".join(sorted({c.context for c in paper.CLAIMS}))
        + ".",
        "(summary): from a secondary summary of the paper, not its PDF.",
    ]
    return Table(
        pd.DataFrame(rows),
        "The paper's quantitative claims, with ours beside them",
        _dataset_label(dataset_dir, src),
        notes,
    )


def _backend(src: Sources) -> str | None:
    for doc in (src.megamoe, src.attention, src.trace, src.model):
        if doc is not None:
            return doc["backend"]
    return None
