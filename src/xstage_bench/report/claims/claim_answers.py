"""How one dataset answers each claim of the paper (xstage_bench.report.paper.CLAIMS).

An answer function takes the dataset's files (claim_sources.Sources) and returns an
Answer (the numbers, as printed and as values the verdict compares) or NotMeasured (why
there is no number: which file is absent, which points failed and how). A file that is
present but malformed still stops the render: it is never silently skipped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from xstage_bench.data import layout, stats
from xstage_bench.data.grid import LOCAL_CONTROL
from xstage_bench.megamoe.schedule import INTERLEAVED, WAVE
from xstage_bench.report import paper
from xstage_bench.report.analysis import attention, fitted, labels, megamoe
from xstage_bench.report.claims.claim_sources import Sources


@dataclass(frozen=True)
class Answer:
    """Our number for a claim: `values` are what the verdict compares (several for a range
    or one per head count), `text` what the table prints, `note` how it was obtained."""

    values: tuple[float, ...]
    text: str
    note: str
    ci: tuple[float, float] | None = None  # 95% CI of a single fitted value


@dataclass(frozen=True)
class NotMeasured:
    why: str


Found = Answer | NotMeasured
AnswerFn = Callable[[Sources], Found]


def _noted(src: Sources, experiment: str, note: str) -> str:
    """An answer's note with the setting its records are (one setting per row)."""
    setting = src.settings.get(experiment)
    return f"{setting}: {note}" if setting else note


def _missing(rel: str) -> NotMeasured:
    return NotMeasured(f"the dataset has no {rel}")


def _statuses(records: list[dict]) -> str:
    """'84 failed, 84 unsupported: <first error line>'."""
    counts = Counter(r["status"] for r in records)
    text = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    errors = [r.get("error") for r in records if r.get("error")]
    if errors:
        text += f": {str(errors[0]).splitlines()[0][:140]}"
    return text


# ---------------------------------------------------------------- Burst-Gap parameters


def _no_model(src: Sources) -> NotMeasured | None:
    return _missing(f"fitted model ({layout.MODEL_JSON})") if src.model is None else None


def t0(src: Sources) -> Found:
    if (missing := _no_model(src)) is not None:
        return missing
    B = paper.B200_T0_B_BYTES
    value = fitted.t0_us(src.model, 1, B)  # one producer of B bytes: T0 depends on B only
    if value is None:
        return NotMeasured("the fit gave no T0 (t0_fixed_us, issue_rate_per_sm_GBps)")
    return Answer((float(value),), f"{value:.3g}", "fitted t0_fixed + B/issue_rate, B=32 KiB")


def drain_rate(src: Sources) -> Found:
    if (missing := _no_model(src)) is not None:
        return missing
    value, low, high = fitted.param_ci(src.model["params"].get("R_GBps"))
    if np.isnan(value):
        reason = (src.model["params"].get("R_GBps") or {}).get("reason", "no reason given")
        return NotMeasured(f"the fit gave no R: {reason}")
    ci = None if np.isnan(low) else (low, high)
    return Answer((value,), f"{value:.4g}", "fitted, all K pooled (95% CI in the verdict)", ci)


def _largest_K_capacity(src: Sources) -> tuple[int, dict] | None:
    fitted = [e for e in src.model["per_K"] if (e.get("Q_bytes") or {}).get("value") is not None]
    if not fitted:
        return None
    entry = max(fitted, key=lambda e: e["K"])
    return int(entry["K"]), entry["Q_bytes"]


def _capacity(per_producer: bool) -> AnswerFn:
    def answer(src: Sources) -> Found:
        if (missing := _no_model(src)) is not None:
            return missing
        found = _largest_K_capacity(src)
        if found is None:
            return NotMeasured("no K has a fitted Q (needs the isolated-burst study)")
        K, entry = found
        scale = K * labels.KIB if per_producer else labels.MIB
        value, low, high = (v / scale for v in fitted.param_ci(entry))
        ci = None if np.isnan(low) else (low, high)
        note = f"Q/K at K={K}" if per_producer else f"fitted at K={K} (the largest K fitted)"
        return Answer((value,), f"{value:.3g}", note, ci)

    return answer


# ---------------------------------------------------------------- MegaMoE


def _speedups(src: Sources) -> pd.DataFrame | NotMeasured:
    if src.megamoe is None:
        return _missing(layout.MEGAMOE_RAW)
    # the paper's claims are about natural routing; re-homed rows are a counterpart column
    speedups = megamoe.natural_routing(megamoe.megamoe_speedups(src.megamoe)[0])
    if not len(speedups):
        ours = [r for r in src.megamoe["records"] if r["point"].get("variant", "ours") == "ours"]
        return NotMeasured(f"no configuration with both schedules ok ({_statuses(ours)})")
    return speedups


def moe_stat(stat: str) -> AnswerFn:
    def answer(src: Sources) -> Found:
        speedups = _speedups(src)
        if isinstance(speedups, NotMeasured):
            return speedups
        s = speedups["speedup"]
        value = {
            "geomean": stats.geomean(s),
            "median": s.median(),
            "min": s.min(),
            "max": s.max(),
        }[stat]
        return Answer(
            (float(value),), f"{value:.3f}", _noted(src, "megamoe", f"over {len(s)} configurations")
        )

    return answer


def moe_configs(src: Sources) -> Found:
    speedups = _speedups(src)
    if isinstance(speedups, NotMeasured):
        return speedups
    n = len(speedups)
    return Answer((float(n),), str(n), _noted(src, "megamoe", "with both schedules ok"))


def span_medians(src: Sources, series: str) -> dict[tuple, float]:
    """Per traced configuration: the median per-tile store span of one run (expert_wave,
    interleaved or local_control)."""
    if src.trace is None:
        return {}
    return {
        megamoe.megamoe_config_key(r["point"]): float(np.median(r["samples"]["store_span_us"]))
        for r in src.trace["records"]
        if r["status"] == "ok"
        and megamoe.trace_series(r["point"]) == series
        and r.get("samples", {}).get("store_span_us")
    }


def span_range(series: str) -> AnswerFn:
    def answer(src: Sources) -> Found:
        if src.trace is None:
            return _missing(layout.MEGAMOE_TRACE_RAW)
        medians = list(span_medians(src, series).values())
        if not medians:
            return NotMeasured(f"no ok '{series}' record with store spans in the trace")
        low, high = min(medians), max(medians)
        text = f"{low:.3g}" if f"{low:.3g}" == f"{high:.3g}" else f"{low:.3g}-{high:.3g}"
        note = f"range of per-configuration medians, {len(medians)} configuration(s)"
        return Answer((low, high), text, note)

    return answer


def span_vs_local(src: Sources) -> Found:
    if src.trace is None:
        return _missing(layout.MEGAMOE_TRACE_RAW)
    interleaved = span_medians(src, INTERLEAVED)
    local = span_medians(src, LOCAL_CONTROL)
    gaps = [interleaved[k] - local[k] for k in interleaved.keys() & local.keys()]
    if not gaps:
        return NotMeasured("no configuration traced both interleaved and the local control")
    return Answer((max(gaps),), f"{max(gaps):.3g}", f"largest over {len(gaps)} configuration(s)")


def _ok_times(src: Sources) -> tuple[dict, dict, dict]:
    """Per configuration: our interleaved time, the unfused baseline's time, and the largest
    remote combine bytes of one rank (from our interleaved record)."""
    ours, unfused, remote = {}, {}, {}
    for r in src.megamoe["records"]:
        # natural routing only: re-homed rows answer in their own column
        if r["status"] != "ok" or r["point"].get("remote_fraction", "natural") != "natural":
            continue
        point, key = r["point"], megamoe.megamoe_config_key(r["point"])
        if point.get("variant") == "unfused":
            unfused[key] = r["summary"]["time_us"]["median"]
        elif point.get("variant", "ours") == "ours" and point.get("schedule") == INTERLEAVED:
            ours[key] = r["summary"]["time_us"]["median"]
            extra = r.get("extra") or {}
            per_rank = extra.get("remote_bytes_per_rank") or extra.get("nvlink_bytes_per_rank")
            if per_rank:
                remote[key] = float(max(per_rank))
            elif extra.get("nvlink_bytes") and point.get("world_size"):
                remote[key] = float(extra["nvlink_bytes"]) / point["world_size"]
    return ours, unfused, remote


def _no_unfused(src: Sources) -> NotMeasured:
    tried = [r for r in src.megamoe["records"] if r["point"].get("variant") == "unfused"]
    if not tried:
        return NotMeasured(f"{layout.MEGAMOE_RAW} has no unfused-baseline record")
    return NotMeasured(f"no ok unfused-baseline record ({_statuses(tried)})")


def over_unfused(src: Sources) -> Found:
    if src.megamoe is None:
        return _missing(layout.MEGAMOE_RAW)
    ours, unfused, _ = _ok_times(src)
    ratios = [unfused[k] / ours[k] for k in unfused.keys() & ours.keys()]
    if not ratios:
        return _no_unfused(src)
    value = stats.geomean(np.array(ratios))
    gemms = Counter(
        (r.get("extra") or {}).get("gemm")
        for r in src.megamoe["records"]
        if r["point"].get("variant") == "unfused" and r["status"] == "ok"
    )
    formats = ", ".join(f"{g} {n}" for g, n in sorted(gemms.items()) if g)
    note = f"geomean of unfused / interleaved over {len(ratios)} configuration(s)"
    if formats:
        note += f"; the unfused pipeline's GEMMs: {formats}"
    return Answer((value,), f"{value:.3f}", note)


def completion_coupled_ceiling(src: Sources) -> Found:
    """The completion-coupled model of our fused kernel: the issuer waits for each remote
    store to land, so no drain overlaps compute: T = interleaved time + a rank's remote
    combine bytes / R. Its speedup over the unfused baseline is the ceiling such an issuer
    could reach; a measured speedup above it is drain the issuer did not wait for."""
    if src.megamoe is None:
        return _missing(layout.MEGAMOE_RAW)
    if (missing := _no_model(src)) is not None:
        return NotMeasured(f"needs the fitted R: {missing.why}")
    R = fitted.drain_rate(src.model)
    if R is None:
        return NotMeasured("needs the fitted R; the fit gave none")
    ours, unfused, remote = _ok_times(src)
    keys = unfused.keys() & ours.keys() & remote.keys()
    if not keys:
        if not unfused.keys() & ours.keys():
            return _no_unfused(src)
        return NotMeasured("our records carry no nvlink_bytes (remote combine bytes)")
    coupled = np.array([unfused[k] / (ours[k] + remote[k] / R) for k in keys])
    measured = np.array([unfused[k] / ours[k] for k in keys])
    value, above = stats.geomean(coupled), stats.geomean(measured)
    drain_share = np.median([remote[k] / R / ours[k] for k in keys])
    note = (
        f"unfused / (interleaved + remote combine bytes per rank / R), geomean over "
        f"{len(keys)} configuration(s); measured {above:.3f} is above it (the drain, a median "
        f"{drain_share:.1%} of the kernel time, overlaps work)"
    )
    return Answer((value,), f"{value:.3f}", note)


# ---------------------------------------------------------------- Ulysses


def _ulysses(src: Sources, backends: tuple[str, ...]) -> pd.DataFrame | NotMeasured:
    """Serial-over-fused rows of the first of `backends` that has any."""
    if src.attention is None:
        return _missing(layout.ATTENTION_RAW)
    frame = attention.serial_over_fused(src.attention)
    if "speedup_sender" in frame.columns:
        frame = frame[frame["speedup_sender"].notna()]
        for backend in backends:
            if (frame["backend"] == backend).any():
                return frame[frame["backend"] == backend]
    tried = [r for r in src.attention["records"] if r["point"].get("backend") in backends]
    if not tried:
        held = sorted({str(r["point"].get("backend")) for r in src.attention["records"]})
        return NotMeasured(f"no {' or '.join(backends)} record (backends here: {', '.join(held)})")
    return NotMeasured(
        f"no ok serial and fused pair for {' or '.join(backends)} ({_statuses(tried)})"
    )


def uly_max(*backends: str) -> AnswerFn:
    def answer(src: Sources) -> Found:
        rows = _ulysses(src, backends)
        if isinstance(rows, NotMeasured):
            return rows
        best = rows.loc[rows["speedup_sender"].idxmax()]
        note = _noted(
            src,
            "attention",
            f"{best['backend']} at S={int(best['seq_len'])}, {int(best['heads'])} heads",
        )
        return Answer((float(best["speedup_sender"]),), f"{best['speedup_sender']:.3f}", note)

    return answer


def uly_at(seq_len: int, *backends: str) -> AnswerFn:
    def answer(src: Sources) -> Found:
        rows = _ulysses(src, backends)
        if isinstance(rows, NotMeasured):
            return rows
        backend = rows["backend"].iloc[0]
        rows = rows[rows["seq_len"] == seq_len]
        if rows.empty:
            return NotMeasured(f"{backend} was not run at S={seq_len}")
        values = tuple(float(v) for v in rows["speedup_sender"])
        heads = ", ".join(str(int(h)) for h in rows["heads"])
        return Answer(
            values,
            ", ".join(f"{v:.3f}" for v in values),
            _noted(src, "attention", f"{backend}, sender-visible, heads {heads}"),
        )

    return answer


def _answers(*attention_backends: str) -> dict[str, AnswerFn]:
    return {
        "bg.T0": t0,
        "bg.R": drain_rate,
        "bg.Q": _capacity(per_producer=False),
        "bg.Q_per_producer": _capacity(per_producer=True),
        "moe.configs": moe_configs,
        "moe.geomean": moe_stat("geomean"),
        "moe.max": moe_stat("max"),
        "moe.median": moe_stat("median"),
        "moe.min": moe_stat("min"),
        "moe.span_wave": span_range(WAVE),
        "moe.span_interleaved": span_range(INTERLEAVED),
        "moe.span_vs_local": span_vs_local,
        "moe.over_unfused": over_unfused,
        "moe.completion_coupled_ceiling": completion_coupled_ceiling,
        "uly.fa3_max": uly_max(*attention_backends),
        "uly.fa4_max": uly_max("fa4"),
        **{f"uly.fa3_S={s}": uly_at(s, *attention_backends) for s in paper.FA3_ULYSSES_SPEEDUP},
    }


# Every claim of paper.CLAIMS, answered from a measured dataset.
MEASURED: Mapping[str, AnswerFn] = _answers("fa3")
# The simulator models one attention kernel (backend 'sim'): in a simulated dataset it
# answers the FA3 claims, the paper's table. FA4 has no simulated counterpart.
SIMULATED: Mapping[str, AnswerFn] = _answers("fa3", "sim")


def answers_for(src: Sources) -> Mapping[str, AnswerFn]:
    return SIMULATED if src.simulated else MEASURED
