"""How one dataset answers each claim of the paper (xstage_bench.report.paper.CLAIMS).

An answer function takes the dataset's files (claim_sources.Sources) and returns an
Answer (the numbers, as printed and as values the verdict compares, each with its 95% CI
where one exists) or NotMeasured (why there is no number: which file is absent, which
points failed and how). A file that is present but malformed still stops the render: it
is never silently skipped.

The CIs are the other tables' own, from the raw samples: MegaMoE headlines by
tables.megamoe.speedup_summary (speedup_ci.headline_ci), ratios over the unfused baseline
by the same bootstrap, Ulysses rows by analysis.attention, T0, R and Q from the model
document as tab-burst-gap-params reads them. A value without a CI says why (`no_ci`); a
simulated source's values carry none (the simulator's spread is no measurement's noise).

The model's verdicts (paper.MODEL_CLAIMS, bars of issue 52) read the model's checks and
held-out records, the MegaMoE playback (model/megamoe_playback.json) and the lead map's
measured auto arms; their error quantiles carry a percentile bootstrap CI over the records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from xstage_bench.data import layout, stats, storepath
from xstage_bench.data.grid import LOCAL_CONTROL
from xstage_bench.megamoe.schedule import INTERLEAVED, WAVE
from xstage_bench.model.validation import fit_held_out
from xstage_bench.report import paper
from xstage_bench.report.analysis import (
    attention,
    fitted,
    labels,
    megamoe,
    megamoe_lead,
    megamoe_playback,
)
from xstage_bench.report.analysis.load import NoDataError
from xstage_bench.report.analysis.megamoe_playback import CALIBRATION
from xstage_bench.report.analysis.speedup_ci import CONFIDENCE, RatioSamples, headline_ci
from xstage_bench.report.claims.claim_sources import Sources
from xstage_bench.report.tables.burst_gap_params import _pooled_t0 as pooled_t0
from xstage_bench.report.tables.megamoe import speedup_summary
from xstage_bench.report.tables.model_checks import CHECK_RESULT

CI = tuple[float, float]
SIMULATED_NO_CI = "simulated: the simulator's spread is no measurement's noise"


@dataclass(frozen=True)
class Answer:
    """Our number for a claim: `values` are what the verdict compares (several for a range
    or one per head count), `text` what the table prints, `note` how it was obtained;
    `cis` the 95% CI of each value, or none and `no_ci` saying why."""

    values: tuple[float, ...]
    text: str
    note: str
    cis: tuple[CI, ...] = ()
    no_ci: str = ""
    # The MegaMoE setting its records are where it is not the claims' own (the baselines
    # run at the host path's f = 0): the row's reason names this one.
    setting: str = ""

    def __post_init__(self) -> None:
        if self.cis and len(self.cis) != len(self.values):
            raise ValueError(f"{len(self.cis)} CIs for {len(self.values)} values")
        if not self.cis and not self.no_ci:
            raise ValueError(f"answer {self.text!r} has no CI and does not say why (no_ci)")


@dataclass(frozen=True)
class NotMeasured:
    why: str


Found = Answer | NotMeasured
AnswerFn = Callable[[Sources], Found]


def with_ci(value: float, ci: CI | None, fmt: str) -> str:
    """'1.045 (1.039–1.051)': a value and its 95% CI in one format; the value alone
    without a CI."""
    text = f"{value:{fmt}}"
    return text if ci is None else f"{text} ({ci[0]:{fmt}}–{ci[1]:{fmt}})"


def answer_of(
    src: Sources,
    values: tuple[float, ...],
    cis: tuple[CI, ...],
    fmt: str,
    note: str,
    no_ci: str = "",
) -> Answer:
    """An Answer printing each value with its CI (`with_ci`, comma-separated); a simulated
    source's CIs are left out, its values printed alone."""
    if src.simulated:
        cis, no_ci = (), SIMULATED_NO_CI
    elif cis:
        no_ci = ""
    shown = cis or (None,) * len(values)
    text = ", ".join(with_ci(v, ci, fmt) for v, ci in zip(values, shown, strict=True))
    return Answer(tuple(float(v) for v in values), text, note, cis, no_ci)


def _ci_of(low: float, high: float) -> tuple[CI, ...]:
    """(low, high) as one value's CIs; none where the source gave none (NaN)."""
    return () if np.isnan(low) or np.isnan(high) else ((float(low), float(high)),)


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

NO_FIT_CI = "the fit gave no CI (no bootstrap replicate determined it)"


def _no_model(src: Sources) -> NotMeasured | None:
    return _missing(f"fitted model ({layout.MODEL_JSON})") if src.model is None else None


def t0(src: Sources) -> Found:
    """T0 of one producer of B = 32 KiB (it depends on B only), with tab-burst-gap-params'
    pooled interval: the ends of the t0_fixed and issue-rate CIs combined."""
    if (missing := _no_model(src)) is not None:
        return missing
    if fitted.t0_us(src.model, 1, paper.B200_T0_B_BYTES) is None:
        return NotMeasured("the fit gave no T0 (t0_fixed_us, issue_rate_per_sm_GBps)")
    value, low, high = pooled_t0(src.model["params"])
    note = "fitted t0_fixed + B/issue_rate, B=32 KiB"
    return answer_of(src, (value,), _ci_of(low, high), ".3g", note, NO_FIT_CI)


def drain_rate(src: Sources) -> Found:
    if (missing := _no_model(src)) is not None:
        return missing
    value, low, high = fitted.param_ci(src.model["params"].get("R_GBps"))
    if np.isnan(value):
        reason = (src.model["params"].get("R_GBps") or {}).get("reason", "no reason given")
        return NotMeasured(f"the fit gave no R: {reason}")
    return answer_of(src, (value,), _ci_of(low, high), ".4g", "fitted, all K pooled", NO_FIT_CI)


def _largest_K_capacity(src: Sources) -> tuple[int, dict, str] | None:
    """(K, Q's parameter block, where it comes from): the capacity law's Q at the largest K
    its isolated bursts measured (params.Q_bytes), or in files written before the law the
    Q fitted to the largest K alone."""
    law = src.model.get("capacity_law")
    pooled = src.model["params"].get("Q_bytes") or {}
    if law and law.get("K_ref") and pooled.get("value") is not None:
        capped = fitted.param(src.model, "C_bytes") is not None  # a ceiling the law has
        form = "min(S + K q, C)" if capped else "S + K q"
        return int(law["K_ref"]), pooled, f"the capacity law {form} ({law['chosen']})"
    per_K = [e for e in src.model["per_K"] if (e.get("Q_bytes") or {}).get("value") is not None]
    if not per_K:
        return None
    entry = max(per_K, key=lambda e: e["K"])
    return int(entry["K"]), entry["Q_bytes"], "fitted"


def _capacity(per_producer: bool) -> AnswerFn:
    def answer(src: Sources) -> Found:
        if (missing := _no_model(src)) is not None:
            return missing
        found = _largest_K_capacity(src)
        if found is None:
            return NotMeasured("no K has a fitted Q (needs the isolated-burst study)")
        K, entry, source = found
        scale = K * labels.KIB if per_producer else labels.MIB
        value, low, high = (v / scale for v in fitted.param_ci(entry))
        note = (
            f"Q/K at K={K}, Q from {source}"
            if per_producer
            else f"{source} at K={K} (the largest K fitted)"
        )
        return answer_of(src, (value,), _ci_of(low, high), ".3g", note, NO_FIT_CI)

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
    """A headline (geomean, median) with its two-level bootstrap CI, or an extreme (min,
    max) with its own configuration's CI: tab-megamoe's speedup_summary (layer time)."""

    def answer(src: Sources) -> Found:
        speedups = _speedups(src)
        if isinstance(speedups, NotMeasured):
            return speedups
        summary = speedup_summary(speedups, megamoe.LAYER)
        ci = _ci_of(summary[f"{stat}_ci_low"], summary[f"{stat}_ci_high"])
        note = _noted(src, "megamoe", f"over {summary['n']} configurations")
        return answer_of(src, (summary[stat],), ci, ".3f", note)

    return answer


CONFIG_COUNT_NO_CI = "a count of the grid's configurations, not an estimate"


def moe_configs(src: Sources) -> Found:
    speedups = _speedups(src)
    if isinstance(speedups, NotMeasured):
        return speedups
    n = len(speedups)
    note = _noted(src, "megamoe", "with both schedules ok")
    return Answer((float(n),), str(n), note, no_ci=CONFIG_COUNT_NO_CI)


def span_medians(src: Sources, series: str) -> dict[tuple, float]:
    """Per traced configuration: the median per-tile store span of one run (expert_wave,
    interleaved or local_control; a schedule's run only where its rows crossed the path)."""
    if src.trace is None:
        return {}
    return {
        megamoe.megamoe_config_key(r["point"]): float(np.median(r["samples"]["store_span_us"]))
        for r in src.trace["records"]
        if r["status"] == "ok"
        and megamoe.trace_series(r["point"]) == series
        and (series == LOCAL_CONTROL or megamoe.stores_far(r["point"]))
        and r.get("samples", {}).get("store_span_us")
    }


SPAN_NO_CI = "store spans are medians of one traced run each; no table computes a CI for them"


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
        return Answer((low, high), text, note, no_ci=SPAN_NO_CI)

    return answer


def span_vs_local(src: Sources) -> Found:
    if src.trace is None:
        return _missing(layout.MEGAMOE_TRACE_RAW)
    interleaved = span_medians(src, INTERLEAVED)
    local = span_medians(src, LOCAL_CONTROL)
    gaps = [interleaved[k] - local[k] for k in interleaved.keys() & local.keys()]
    if not gaps:
        return NotMeasured("no configuration traced both interleaved and the local control")
    note = f"largest over {len(gaps)} configuration(s)"
    return Answer((max(gaps),), f"{max(gaps):.3g}", note, no_ci=SPAN_NO_CI)


@dataclass(frozen=True)
class BaselinePair:
    """One configuration at natural routing: our interleaved record, the unfused
    baseline's, and the largest remote combine bytes of one rank (None: not recorded)."""

    ours: dict
    unfused: dict
    remote_bytes: float | None

    def samples(self) -> tuple[np.ndarray, np.ndarray]:
        """Layer times (us) of the unfused baseline and of ours."""
        return (
            np.asarray(self.unfused["samples"]["time_us"], dtype=float),
            np.asarray(self.ours["samples"]["time_us"], dtype=float),
        )

    @property
    def paired(self) -> bool:
        return megamoe.in_same_rounds(self.unfused, self.ours)


def _remote_bytes(record: dict) -> float | None:
    extra = record.get("extra") or {}
    per_rank = extra.get("remote_bytes_per_rank") or extra.get("nvlink_bytes_per_rank")
    if per_rank:
        return float(max(per_rank))
    if extra.get("nvlink_bytes") and record["point"].get("world_size"):
        return float(extra["nvlink_bytes"]) / record["point"]["world_size"]
    return None


def _natural_ok(record: dict) -> bool:
    # natural routing only: re-homed rows answer in their own column
    point = record["point"]
    return (
        record["status"] == "ok"
        and point.get("remote_fraction", "natural") == "natural"
        and bool((record.get("samples") or {}).get("time_us"))
    )


# Where the baselines run on the host path (megamoe.points): its f = 0 control.
HOST_BASELINE_SETTING = "host path, f = 0 (the local control, where the baselines run)"


def _at_baselines(src: Sources, answer: Found) -> Found:
    """`answer` (of records where the baselines run) saying so on the host path: its note
    and its setting name the f = 0 control, not the claims' own host share."""
    if src.path != storepath.HOST:
        return answer
    if isinstance(answer, NotMeasured):
        return NotMeasured(f"{HOST_BASELINE_SETTING}: {answer.why}")
    return replace(
        answer, note=f"{HOST_BASELINE_SETTING}: {answer.note}", setting=HOST_BASELINE_SETTING
    )


def _baseline_records(src: Sources) -> list[dict]:
    """The records where the baselines run (Sources.baselines; a Sources made by hand
    without them: the claims' own records)."""
    return (src.baselines if src.baselines is not None else src.megamoe)["records"]


def _baseline_pairs(src: Sources) -> list[BaselinePair]:
    """Per configuration with an ok interleaved record of ours and an ok unfused one, in
    the records' order (the bootstrap resamples configurations by position)."""
    ours, unfused = {}, {}
    for r in _baseline_records(src):
        if not _natural_ok(r):
            continue
        point, key = r["point"], megamoe.megamoe_config_key(r["point"])
        if point.get("variant") == "unfused":
            unfused[key] = r
        elif point.get("variant", "ours") == "ours" and point.get("schedule") == INTERLEAVED:
            ours[key] = r
    return [BaselinePair(r, unfused[k], _remote_bytes(r)) for k, r in ours.items() if k in unfused]


def _no_unfused(src: Sources) -> NotMeasured:
    tried = [r for r in _baseline_records(src) if r["point"].get("variant") == "unfused"]
    if not tried:
        return NotMeasured(f"{layout.MEGAMOE_RAW} has no unfused-baseline record")
    return NotMeasured(f"no ok unfused-baseline record ({_statuses(tried)})")


def _geomean_over_unfused(pairs: list[BaselinePair]) -> tuple[float, float, float]:
    """Geomean of unfused / interleaved with its two-level bootstrap CI."""
    return headline_ci([RatioSamples.of(*p.samples(), p.paired) for p in pairs], "geomean")


def over_unfused(src: Sources) -> Found:
    return _at_baselines(src, _over_unfused(src))


def _over_unfused(src: Sources) -> Found:
    if src.megamoe is None:
        return _missing(layout.MEGAMOE_RAW)
    pairs = _baseline_pairs(src)
    if not pairs:
        return _no_unfused(src)
    value, low, high = _geomean_over_unfused(pairs)
    gemms = Counter((p.unfused.get("extra") or {}).get("gemm") for p in pairs)
    formats = ", ".join(f"{g} {n}" for g, n in sorted(gemms.items()) if g)
    note = f"geomean of unfused / interleaved over {len(pairs)} configuration(s)"
    if formats:
        note += f"; the unfused pipeline's GEMMs: {formats}"
    return answer_of(src, (value,), _ci_of(low, high), ".3f", note)


def completion_coupled_ceiling(src: Sources) -> Found:
    """The completion-coupled model of our fused kernel: the issuer waits for each remote
    store to land, so no drain overlaps compute: T = interleaved time + a rank's remote
    combine bytes / R. Its speedup over the unfused baseline is the ceiling such an issuer
    could reach; a measured speedup above it is drain the issuer did not wait for.

    CIs: the same bootstrap as the headlines, over configurations and each one's samples,
    with R held at its fitted value (its own CI is not carried into them)."""
    return _at_baselines(src, _completion_coupled_ceiling(src))


def _completion_coupled_ceiling(src: Sources) -> Found:
    if src.megamoe is None:
        return _missing(layout.MEGAMOE_RAW)
    if (missing := _no_model(src)) is not None:
        return NotMeasured(f"needs the fitted R: {missing.why}")
    R = fitted.drain_rate(src.model)
    if R is None:
        return NotMeasured("needs the fitted R; the fit gave none")
    pairs = _baseline_pairs(src)
    if not pairs:
        return _no_unfused(src)
    pairs = [p for p in pairs if p.remote_bytes is not None]
    if not pairs:
        return NotMeasured("our records carry no nvlink_bytes (remote combine bytes)")
    if not any(p.remote_bytes for p in pairs):
        return NotMeasured(
            "no combine row leaves the GPU where the baselines run, so there is no drain "
            "for the completion-coupled model to add"
        )
    coupled, drains = [], []
    for p in pairs:
        unfused, ours = p.samples()
        drain_us = p.remote_bytes / R
        coupled.append(RatioSamples.of(unfused, ours + drain_us, p.paired))
        drains.append(RatioSamples.of([drain_us], ours, paired=False))
    value, low, high = headline_ci(coupled, "geomean")
    above = _geomean_over_unfused(pairs)
    share = headline_ci(drains, "median")
    measured = with_ci(above[0], None if src.simulated else above[1:], ".3f")
    drain = with_ci(share[0], None if src.simulated else share[1:], ".1%")
    note = (
        f"unfused / (interleaved + remote combine bytes per rank / R), geomean over "
        f"{len(pairs)} configuration(s); measured {measured} is above it (the drain, a "
        f"median {drain} of our interleaved layer time, overlaps work)"
    )
    return answer_of(src, (value,), _ci_of(low, high), ".3f", note)


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


def _sender_cis(rows: pd.DataFrame) -> tuple[CI, ...]:
    """Each row's sender-visible speedup CI (analysis.attention.serial_over_fused)."""
    lows, highs = rows["speedup_sender_ci_low"], rows["speedup_sender_ci_high"]
    return tuple((float(lo), float(hi)) for lo, hi in zip(lows, highs, strict=True))


def uly_max(*backends: str) -> AnswerFn:
    """The largest sender-visible speedup, with its own configuration's CI (as
    tab-ulysses' headlines)."""

    def answer(src: Sources) -> Found:
        rows = _ulysses(src, backends)
        if isinstance(rows, NotMeasured):
            return rows
        best = rows.loc[[rows["speedup_sender"].idxmax()]]
        note = _noted(
            src,
            "attention",
            f"{best['backend'].iloc[0]} at S={int(best['seq_len'].iloc[0])}, "
            f"{int(best['heads'].iloc[0])} heads",
        )
        values = (float(best["speedup_sender"].iloc[0]),)
        return answer_of(src, values, _sender_cis(best), ".3f", note)

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
        note = _noted(src, "attention", f"{backend}, sender-visible, heads {heads}")
        return answer_of(src, values, _sender_cis(rows), ".3f", note)

    return answer


# ---------------------------------------------------------------- the model's verdicts
#
# The bars of issue 52 (paper.MODEL_CLAIMS): the same numbers as tab-model-checks,
# tab-megamoe-playback and tab-megamoe-lead, read from the same files the same way.

CHECKS_NO_CI = "a count of the model's checks, each passed or not by its own criterion"
LEAD_NO_CI = "no point of the lead map has auto and every swept lead, which its CI resamples"
BOOTSTRAP_SEED = 0  # a render is reproducible to the byte
PERCENT = 100.0  # error quantiles and shares of points are shown in percent


def model_checks(src: Sources) -> Found:
    """The model's checks that pass, 'k of n' (tab-model-checks' check rows): one the data
    could not answer (not evaluated) is no pass."""
    if (missing := _no_model(src)) is not None:
        return missing
    checks = src.model.get("checks") or {}
    if not checks:
        return NotMeasured(f"{layout.MODEL_JSON} holds no check")
    passed = sum(1 for c in checks.values() if c["passed"])
    text = f"{passed} of {len(checks)}"
    return Answer((passed / len(checks),), text, _checks_note(checks), no_ci=CHECKS_NO_CI)


def _checks_note(checks: dict) -> str:
    """'FAILED: a, b; not evaluated: c', or that every check passed."""
    parts = []
    for result in (CHECK_RESULT[False], CHECK_RESULT[None]):
        names = [n for n, c in checks.items() if CHECK_RESULT[c["passed"]] == result]
        if names:
            parts.append(f"{result}: {', '.join(names)}")
    return "; ".join(parts) or "every check passed"


def quantile_with_ci(errors: np.ndarray, q: float) -> tuple[float, float, float]:
    """The q-quantile of `errors` with its 95% percentile-bootstrap CI over the records
    (resampled with replacement, stats.BOOTSTRAP_RESAMPLES times, a fixed seed)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws = rng.integers(0, errors.size, size=(stats.BOOTSTRAP_RESAMPLES, errors.size))
    low, high = _percentile_ci(np.quantile(errors[draws], q, axis=1))
    return float(np.quantile(errors, q)), low, high


def _error_answer(src: Sources, errors: np.ndarray, q: float, note: str) -> Answer:
    """An |error| quantile in percent with its bootstrap CI."""
    value, low, high = (PERCENT * v for v in quantile_with_ci(errors, q))
    return answer_of(src, (value,), ((low, high),), ".1f", note)


def heldout_errors(model: dict) -> np.ndarray:
    """|relative error| of the fit set's held-out records under the chosen capacity law:
    the records of validation_summary (tab-model-checks' 'fit set, held out' row)."""
    return np.abs([r["rel_error"] for r in fit_held_out(model.get("validation") or [])])


def heldout_error(q: float) -> AnswerFn:
    """The held-out |relative error|'s q-quantile, with its bootstrap CI over the records."""

    def answer(src: Sources) -> Found:
        if (missing := _no_model(src)) is not None:
            return missing
        errors = heldout_errors(src.model)
        if not errors.size:
            return NotMeasured(f"{layout.MODEL_JSON} holds no held-out record of the fit set")
        law = (fitted.capacity_law(src.model) or {}).get("chosen", "shared Q")
        note = f"{errors.size} held-out records of the fit set, capacity law {law}"
        free = src.model.get("validation_summary_free") or {}
        if free.get("n"):
            note += (
                f"; the free-running records (never fitted): median "
                f"{free['median_abs_rel_error']:.1%}, p90 {free['p90_abs_rel_error']:.1%} "
                f"(n={free['n']})"
            )
        return _error_answer(src, errors, q, note)

    return answer


def playback_errors(src: Sources) -> np.ndarray | NotMeasured:
    """|predicted / measured - 1| with the hold of every predicted arm on the path (the
    calibration arms apart), as tab-megamoe-playback's 'every arm' row."""
    if not (src.dataset_dir / layout.MEGAMOE_PLAYBACK).exists():
        return _missing(f"MegaMoE playback ({layout.MEGAMOE_PLAYBACK})")
    try:
        played = megamoe_playback.read_playback(src.dataset_dir)
    except NoDataError as e:  # made from another raw file or model: it says how to remake it
        return NotMeasured(str(e))
    arms = megamoe_playback.played_arms(played)
    predicted = arms[(arms["path"] == src.path) & (arms["calibration"] != CALIBRATION)]
    if predicted.empty:
        return NotMeasured(f"{layout.MEGAMOE_PLAYBACK} predicts no arm on the {src.path} path")
    return predicted["error_hold"].abs().to_numpy(dtype=float)


def playback_error(q: float) -> AnswerFn:
    """The playback's |error| q-quantile, with its bootstrap CI over the arms."""

    def answer(src: Sources) -> Found:
        errors = playback_errors(src)
        if isinstance(errors, NotMeasured):
            return errors
        note = f"{errors.size} arms predicted with the hold, the calibration arms apart"
        return _error_answer(src, errors, q, note)

    return answer


@dataclass(frozen=True)
class LeadScore:
    """megamoe_lead.auto_score of the measured auto arms over the lead map, the metric its
    speedups are in, and the CIs of the share within the best and of auto's mean over the
    best constant lead's (None where no point has auto and every swept lead)."""

    score: dict
    metric: megamoe.Metric
    resolved: str  # what auto resolved to in the run: 'resolved to 0 rows at 18 points'
    share_ci: CI | None
    versus_ci: CI | None


def lead_score(src: Sources) -> LeadScore | NotMeasured:
    """auto as the run resolved it against the best swept lead and the best constant lead
    (tab-megamoe-lead's score section), over the lead map on the path."""
    if src.lead_map is None:
        return _missing(layout.MEGAMOE_RAW)
    leads = megamoe_lead.lead_speedups(src.lead_map)
    if leads.empty:
        return NotMeasured(
            f"{layout.MEGAMOE_RAW} has no lead map on the {src.path} path (no lead_sweep arm "
            "beside an ok expert-wave record)"
        )
    metric = megamoe_lead.lead_metric(leads)
    best = megamoe_lead.best_and_auto(leads, metric)
    for column, what in (
        ("auto_speedup", "auto arm (lead_rows: auto)"),
        ("best_speedup", "swept numeric lead"),
    ):
        if column not in best.columns:
            return NotMeasured(f"the lead map has no ok {what}")
    constants = megamoe_lead.constant_leads(leads, metric)
    score = megamoe_lead.auto_score(best["auto_speedup"], best["best_speedup"], constants)
    if not score["points"]:
        return NotMeasured("no point of the lead map has both auto and a swept lead ok")
    share_ci, versus_ci = _lead_cis(leads, metric)
    return LeadScore(score, metric, _resolved(best["auto_lead_rows"]), share_ci, versus_ci)


def _resolved(rows: pd.Series) -> str:
    """'resolved to 0 rows at 17 points, 1024 rows at 1 points': the rows auto ran with."""
    counts = Counter(int(r) for r in rows.dropna()).most_common()
    if not counts:
        return "the rows it resolved to not recorded"
    return "resolved to " + ", ".join(f"{lead} rows at {n} points" for lead, n in counts)


def _lead_cis(leads: pd.DataFrame, metric: megamoe.Metric) -> tuple[CI | None, CI | None]:
    """95% CIs of the share of points where auto is within WITHIN_BEST of the best swept
    lead and of auto's mean speedup over the best constant lead's, by the headlines'
    two-level bootstrap (speedup_ci.headline_ci): the points where auto and every swept
    lead ran resampled with replacement, each arm's speedup there one of its own
    replicates. (None, None) where no point has them all."""
    arms = _arms_per_point(leads, metric)
    if not arms:
        return None, None
    auto = np.stack([a[megamoe_lead.AUTO].boot for a in arms], axis=1)  # replicate x point
    swept = [lead for lead in arms[0] if lead != megamoe_lead.AUTO]
    constant = np.stack([np.stack([a[lead].boot for a in arms], axis=1) for lead in swept])
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    chosen = rng.integers(0, len(arms), size=auto.shape)
    replicate = np.arange(auto.shape[0])[:, None]
    auto, constant = auto[replicate, chosen], constant[:, replicate, chosen]
    within = auto >= (1 - megamoe_lead.WITHIN_BEST) * constant.max(axis=0)
    versus = auto.mean(axis=1) / constant.mean(axis=2).max(axis=0)
    return _percentile_ci(PERCENT * within.mean(axis=1)), _percentile_ci(versus)


def _arms_per_point(leads: pd.DataFrame, metric: megamoe.Metric) -> list[dict]:
    """Per point of the lead map where auto and every swept numeric lead ran: lead label ->
    its speedup's RatioSamples, the swept leads in one order."""
    numeric = leads["swept"] & ~leads["auto"] & leads["lead"].str.isdigit()
    swept = sorted(set(leads.loc[numeric, "lead"]), key=int)
    wanted = [megamoe_lead.AUTO, *swept]
    points = []
    for _, part in leads.groupby(megamoe_lead.config_keys(leads), sort=False, dropna=False):
        samples = dict(zip(part["lead"], part[metric.column("samples")], strict=True))
        if swept and all(isinstance(samples.get(lead), RatioSamples) for lead in wanted):
            points.append({lead: samples[lead] for lead in wanted})
    return points


def _percentile_ci(replicates: np.ndarray) -> CI:
    low, high = np.quantile(replicates, [(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2])
    return float(low), float(high)


def lead_auto_within(src: Sources) -> Found:
    found = lead_score(src)
    if isinstance(found, NotMeasured):
        return found
    n = found.score["points"]
    k = found.score[f"within {megamoe_lead.WITHIN_BEST:.0%} of best"]
    note = f"measured auto arms ({found.resolved}), {found.metric.name} speedups"
    cis = () if found.share_ci is None else (found.share_ci,)
    answer = answer_of(src, (PERCENT * k / n,), cis, ".1f", note, LEAD_NO_CI)
    return replace(answer, text=f"{answer.text}: {k} of {n} points")


def lead_auto_vs_constant(src: Sources) -> Found:
    found = lead_score(src)
    if isinstance(found, NotMeasured):
        return found
    score = found.score
    if "best constant lead" not in score:
        return NotMeasured("no swept lead was measured at every point of the lead map")
    note = (
        f"measured auto arms: mean {found.metric.name} speedup {score['mean speedup']:.3f} over "
        f"{score['points']} points vs lead {score['best constant lead']}'s "
        f"{score['its mean speedup']:.3f}, the best constant lead"
    )
    cis = () if found.versus_ci is None else (found.versus_ci,)
    return answer_of(src, (score["mean / best constant's"],), cis, ".3f", note, LEAD_NO_CI)


MODEL_ANSWERS: Mapping[str, AnswerFn] = {
    "model.checks": model_checks,
    "model.heldout_median": heldout_error(0.5),
    "model.heldout_p90": heldout_error(0.9),
    "model.playback_median": playback_error(0.5),
    "model.playback_p90": playback_error(0.9),
    "model.lead_auto_within": lead_auto_within,
    "model.lead_auto_vs_constant": lead_auto_vs_constant,
}


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
        **MODEL_ANSWERS,
    }


# Every claim of paper.CLAIMS, answered from a measured dataset.
MEASURED: Mapping[str, AnswerFn] = _answers("fa3")
# The simulator models one attention kernel (backend 'sim'): in a simulated dataset it
# answers the FA3 claims, the paper's table. FA4 has no simulated counterpart.
SIMULATED: Mapping[str, AnswerFn] = _answers("fa3", "sim")


def answers_for(src: Sources) -> Mapping[str, AnswerFn]:
    return SIMULATED if src.simulated else MEASURED
