"""A verdict per claim, computed from the data: reproduced, differs, tie or not measured.

A criterion (a tolerance band around the paper's value, a bound, a range overlap, a bar
the project set where the paper gives no number) is applied to each value's 95% CI where
the value has one, to the value itself where not: `reproduced` when the whole CI meets it,
`differs` when a whole CI misses it, `tie` when a CI straddles the criterion's threshold
(an edge of the band, the bound), so the data can tell the claim neither reproduced nor
contradicted. `differs` comes with the measured reason: what differs between our setting
and the paper's (link, GPU count, whether the combine backpressures at all), each fact
read from the dataset's files; for a bar, what missed it (the answer's own note).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from xstage_bench.data import storepath
from xstage_bench.data.grid import LOCAL_CONTROL
from xstage_bench.megamoe.schedule import WAVE
from xstage_bench.model.document import LINE_RATE_KEY
from xstage_bench.report import paper
from xstage_bench.report.analysis import frames
from xstage_bench.report.claims.claim_answers import Answer, Found, NotMeasured, span_medians
from xstage_bench.report.claims.claim_sources import Sources, attention_ranks
from xstage_bench.report.paper import Claim

REPRODUCED = "reproduced"
DIFFERS = "differs"
# The 95% CI straddles the criterion's threshold: neither reproduced nor contradicted.
TIE = "tie"
NOT_MEASURED = "not measured"
# A count the grid fixes (the 84 configurations): reported, but no result to reproduce.
NOT_A_RESULT = "not a result"
VERDICTS = (REPRODUCED, DIFFERS, TIE, NOT_MEASURED, NOT_A_RESULT)
# The Burst-Gap parameters a simulated dataset is given (config/hardware/*.yaml), not results.
SIMULATOR_INPUTS = frozenset({"bg.T0", "bg.R", "bg.Q", "bg.Q_per_producer"})

# Tolerances: the Burst-Gap parameters are fits (10%); speedups are ratios of medians,
# whose run-to-run drift is a few percent (5%). A CI is of one run: the tolerance is
# what it must fall within.
PARAMETER_TOLERANCE = 0.10
SPEEDUP_TOLERANCE = 0.05
SPAN_TOLERANCE = 0.10


@dataclass(frozen=True)
class Outcome:
    """What a criterion makes of an answer: REPRODUCED, DIFFERS or TIE, and for a tie
    the threshold the CI straddles ('1.121, the paper's 1.18 less 5%')."""

    verdict: str
    straddled: str = ""


@dataclass(frozen=True)
class Criterion:
    text: str
    test: Callable[[Claim, Answer], Outcome]


def _intervals(answer: Answer) -> list[tuple[float, float]]:
    """Each value's 95% CI, or the value itself (an interval of width 0) where it has none."""
    return list(answer.cis) if answer.cis else [(v, v) for v in answer.values]


def _inside(answer: Answer, low: float, high: float, edges: tuple[str, str]) -> Outcome:
    """Whether every value's interval lies within [low, high] (reproduced), some lies
    wholly outside it (differs), or some straddles an edge (tie; `edges` name them)."""
    spans = _intervals(answer)
    if all(low <= a and b <= high for a, b in spans):
        return Outcome(REPRODUCED)
    if any(b < low or a > high for a, b in spans):
        return Outcome(DIFFERS)
    crossed = []
    for a, b in spans:
        crossed += [edges[0]] if a < low else []
        crossed += [edges[1]] if b > high else []
    return Outcome(TIE, " and ".join(dict.fromkeys(crossed)))


def within(rel: float) -> Criterion:
    def test(claim: Claim, answer: Answer) -> Outcome:
        low, high = claim.value - rel * claim.value, claim.value + rel * claim.value
        paper_value = f"the paper's {claim.paper_text()}"
        edges = (
            f"{low:.4g}, {paper_value} less {rel:.0%}",
            f"{high:.4g}, {paper_value} plus {rel:.0%}",
        )
        return _inside(answer, low, high, edges)

    return Criterion(f"within {rel:.0%}, the whole 95% CI where there is one", test)


def ranges_overlap(rel: float) -> Criterion:
    """On the values (the span answers carry no CI)."""

    def test(claim: Claim, answer: Answer) -> Outcome:
        upper = claim.upper if claim.upper is not None else claim.value
        low, high = claim.value * (1 - rel), upper * (1 + rel)
        overlap = min(answer.values) <= high and max(answer.values) >= low
        return Outcome(REPRODUCED if overlap else DIFFERS)

    return Criterion(f"ranges overlap (paper's widened by {rel:.0%})", test)


AT_MOST = Criterion(
    "at most the paper's bound, the whole 95% CI where there is one",
    lambda c, a: _inside(a, -math.inf, c.value, ("", f"the paper's bound {c.paper_text()}")),
)


def _bar_edge(claim: Claim) -> str:
    return f"{claim.value:g}, the bar of {claim.bar}"


# A bar the project set where the paper gives no number (Claim.bar): a bound either way.
BAR_AT_MOST = Criterion(
    "at most the bar, the whole 95% CI where there is one",
    lambda c, a: _inside(a, -math.inf, c.value, ("", _bar_edge(c))),
)
BAR_AT_LEAST = Criterion(
    "at least the bar, the whole 95% CI where there is one",
    lambda c, a: _inside(a, c.value, math.inf, (_bar_edge(c), "")),
)
EXACT = Criterion(
    "equal",
    lambda c, a: Outcome(REPRODUCED if all(v == c.value for v in a.values) else DIFFERS),
)


def criterion(claim: Claim) -> Criterion:
    if claim.bar:
        return BAR_AT_LEAST if claim.at_least else BAR_AT_MOST
    if claim.at_most:
        return AT_MOST
    if claim.upper is not None:
        return ranges_overlap(SPAN_TOLERANCE)
    if claim.unit == "configs":
        return EXACT
    if claim.topic == "burst_gap":
        return within(PARAMETER_TOLERANCE)
    return within(SPEEDUP_TOLERANCE)


# ---------------------------------------------------------------- the setting, from data

# NVLink generation by compute capability major (Ampere 3, Hopper 4, Blackwell 5).
NVLINK_BY_CAPABILITY = {"8": "NVLink3", "9": "NVLink4", "10": "NVLink5"}


@dataclass(frozen=True)
class Setting:
    """What a dataset ran on, for the reasons: hardware, world sizes, and whether the
    MegaMoE combine backpressured (expert-wave spans against the local-store control)."""

    hardware: str  # 'NVLink4 on 2x NVIDIA H200 (132 SMs, 450 GB/s line rate)'
    path: str  # the store path the answers speak for
    settings: dict  # per experiment, the setting its records are (Sources.settings)
    moe_world: int | None
    attention_world: int | None
    wave_excess_us: float | None  # largest expert-wave minus local-control median span
    local_spans: tuple[float, float] | None  # range of the local control's median spans
    a2a_overhead: dict[int, float]  # per S: serial / alone - 1 (the All-to-All's share)
    simulated_profile: str | None = None  # the hardware profile a simulated dataset ran on

    @classmethod
    def of(cls, src: Sources) -> Setting:
        return cls(
            hardware=_hardware(src),
            path=src.path,
            settings=dict(src.settings),
            moe_world=_world(src.megamoe),
            attention_world=_ranks(src.attention),
            wave_excess_us=_wave_excess(src),
            local_spans=_local_spans(src),
            a2a_overhead=_a2a_overhead(src),
            simulated_profile=_simulated_profile(src),
        )


def _simulated_profile(src: Sources) -> str | None:
    profile = (src.environment() or {}).get("hardware_profile")
    return profile.get("name", "?") if profile else None


def _hardware(src: Sources) -> str:
    environment = src.environment() or {}
    profile = environment.get("hardware_profile")
    if profile:
        facts = [
            f"{profile[key]:g} {unit}"
            for key, unit in (("sm_count", "SMs"), ("drain_rate_GBps", "GB/s drain"))
            if isinstance(profile.get(key), int | float)
        ]
        return f"the simulated profile '{profile.get('name', '?')}' ({', '.join(facts)})"
    gpus = environment.get("gpus") or []
    if not gpus:
        return "GPUs not recorded"
    name, n = Counter(g["name"] for g in gpus).most_common(1)[0]
    first = gpus[0]
    ceilings = (src.model or {}).get("ceilings") or {}
    if src.path == storepath.HOST:
        link = _host_link(environment)
        line = ceilings.get(LINE_RATE_KEY[storepath.HOST])
    else:
        capability = str(first.get("capability", "")).split(".")[0]
        link = NVLINK_BY_CAPABILITY.get(capability, "NVLink")
        line = ceilings.get(LINE_RATE_KEY[storepath.PEER])
    detail = f"{first.get('sm_count', '?')} SMs" + (f", {line:g} GB/s line rate" if line else "")
    return f"{link} on {n}x {name} ({detail})"


def _host_link(environment: dict) -> str:
    """'PCIe Gen5 x16 to host memory' from the environment's host link, if recorded."""
    links = [link for link in environment.get("host_links") or [] if link]
    if not links:
        return "the host link to host memory"
    link = links[0]
    if link.get("kind") == "pcie" and link.get("gen"):
        return f"PCIe Gen{link['gen']} x{link.get('width', '?')} to host memory"
    return f"{link.get('kind', 'the host link')} to host memory"


def _world(doc: dict | None) -> int | None:
    if doc is None:
        return None
    sizes = {r["point"].get("world_size") for r in doc["records"]} - {None}
    if sizes:
        return int(max(sizes))
    configured = doc["config"].get("world_size")
    return configured if isinstance(configured, int) else None


def _ranks(doc: dict | None) -> int | None:
    """The P the attention records stand for (emulated or real)."""
    if doc is None or not doc["records"]:
        return _world(doc)
    return max(attention_ranks(r["point"]) for r in doc["records"])


def _wave_excess(src: Sources) -> float | None:
    wave, local = span_medians(src, WAVE), span_medians(src, LOCAL_CONTROL)
    gaps = [wave[k] - local[k] for k in wave.keys() & local.keys()]
    return max(gaps) if gaps else None


def _local_spans(src: Sources) -> tuple[float, float] | None:
    medians = list(span_medians(src, LOCAL_CONTROL).values())
    return (min(medians), max(medians)) if medians else None


def _a2a_overhead(src: Sources) -> dict[int, float]:
    """Per sequence length, how much the serial All-to-All adds to attention alone (sender
    clock, mean over head counts), for FA3 or else the simulated kernel."""
    if src.attention is None:
        return {}
    frame = frames.records_frame(src.attention)
    frame = frame[frame["status"] == "ok"]
    for backend in ("fa3", "sim"):
        rows = frame[frame["backend"] == backend] if "backend" in frame else frame.iloc[:0]
        if rows.empty or "sender_us_median" not in rows:
            continue
        wide = rows.pivot_table(
            index=["heads", "seq_len"], columns="mode", values="sender_us_median", aggfunc="first"
        )
        if {"alone", "serial"} <= set(wide.columns):
            share = (wide["serial"] / wide["alone"] - 1).groupby("seq_len").mean()
            return {int(s): float(v) for s, v in share.dropna().items()}
    return {}


# ---------------------------------------------------------------- reasons


def _gpus(world: int | None) -> str | None:
    """'P=2 vs 8 GPUs' where the GPU count differs from the paper's, else None."""
    if world is None or world == paper.PAPER_GPUS:
        return None
    return f"P={world} vs {paper.PAPER_GPUS} GPUs"


def _backpressure(setting: Setting) -> str | None:
    if setting.wave_excess_us is None:
        return None
    excess = max(setting.wave_excess_us, 0.0)
    if excess <= paper.CLAIMS_BY_ID["moe.span_vs_local"].value:
        return (
            f"expert-wave store spans match the local-store control (within {excess:.2f} us): "
            "the combine never backpressures, so interleaving has no drain to hide"
        )
    return f"expert-wave store spans exceed the local-store control by up to {excess:.2f} us"


def _remote_share(world: int | None, path: str = storepath.PEER) -> str | None:
    paper_share = f"{paper.PAPER_GPUS - 1}/{paper.PAPER_GPUS}"
    if path == storepath.HOST and world is not None:
        return f"{world - 1}/{world} of the output goes to host memory, not to peer GPUs"
    if world is None or world == paper.PAPER_GPUS:
        return None
    return f"{world - 1}/{world} of the output crosses NVLink vs {paper_share}"


def _facts(claim: Claim, setting: Setting) -> list[str | None]:
    if claim.topic == "burst_gap":
        return [f"{setting.hardware} vs the paper's {paper.PAPER_NODE}"]
    if claim.topic == "ulysses":
        facts = [
            setting.settings.get("attention"),
            _gpus(setting.attention_world),
            _remote_share(setting.attention_world, setting.path),
        ]
        seq_len = int(claim.id.split("=")[1]) if "=" in claim.id else None
        if seq_len in setting.a2a_overhead:
            facts.append(
                f"the serial All-to-All adds {setting.a2a_overhead[seq_len]:.0%} to attention "
                f"alone here at S={seq_len // 1024}K"
            )
        return facts
    facts = [setting.settings.get("megamoe"), _gpus(setting.moe_world)]
    if claim.id.startswith("moe.span") and setting.local_spans is not None:
        low, high = setting.local_spans
        facts.append(f"the local-store control's median spans here are {low:.2f}-{high:.2f} us")
    if claim.id in ("moe.geomean", "moe.max", "moe.median", "moe.min") or claim.id.startswith(
        "moe.span"
    ):
        facts.append(_backpressure(setting))
    return facts


def setting_facts(claim: Claim, setting: Setting) -> str:
    """The facts of our setting that differ from the paper's, '; '-separated."""
    facts = [f for f in _facts(claim, setting) if f]
    if not facts:
        facts = [f"on {setting.hardware}, the same GPU count as the paper"]
    return "; ".join(facts)


def reason(claim: Claim, answer: Answer, setting: Setting) -> str:
    """Why our number differs from the paper's: the facts of our setting that differ."""
    return f"{answer.text} vs {claim.paper_text()} {claim.unit}: {setting_facts(claim, setting)}"


@dataclass(frozen=True)
class Verdict:
    verdict: str
    why: str
    criterion: str


def judge(claim: Claim, found: Found, setting: Setting) -> Verdict:
    rule = criterion(claim)
    if isinstance(found, NotMeasured):
        return Verdict(NOT_MEASURED, found.why, rule.text)
    if found.setting:  # its records are at another setting than the claims' own
        setting = replace(setting, settings={**setting.settings, "megamoe": found.setting})
    if not np.all(np.isfinite(found.values)):
        return Verdict(NOT_MEASURED, "the computed value is not finite", rule.text)
    head = f"{found.text} vs {claim.paper_text()} {claim.unit}"
    if claim.unit == "configs":
        return Verdict(
            NOT_A_RESULT,
            f"{head}: the configuration count is a property of the grid the config asks for, "
            "not something measured",
            rule.text,
        )
    if setting.simulated_profile is not None and claim.id in SIMULATOR_INPUTS:
        return Verdict(
            NOT_A_RESULT,
            f"{head}: T0, R and Q are inputs of the simulated profile "
            f"'{setting.simulated_profile}'; the fit recovering them checks the simulator and "
            "the fitter, it reproduces nothing",
            rule.text,
        )
    if claim.bar:
        return _judge_bar(claim, found, setting, rule, head)
    outcome = rule.test(claim, found)
    if outcome.verdict == REPRODUCED:
        return Verdict(REPRODUCED, f"{head}: {rule.text}", rule.text)
    if outcome.verdict == TIE:
        why = (
            f"{head}: our 95% CI straddles {outcome.straddled}, so the data neither reproduce "
            f"nor contradict the claim; {setting_facts(claim, setting)}"
        )
        return Verdict(TIE, why, rule.text)
    return Verdict(DIFFERS, reason(claim, found, setting), rule.text)


def _judge_bar(
    claim: Claim, found: Answer, setting: Setting, rule: Criterion, head: str
) -> Verdict:
    """A bar the project set (Claim.bar): met, missed or straddled, why in the answer's own
    terms (which checks failed, which records), not the hardware's. On a simulated profile
    nothing is a result: its data come from the Burst-Gap laws the model fits."""
    if setting.simulated_profile is not None:
        return Verdict(
            NOT_A_RESULT,
            f"{head}: the simulated profile '{setting.simulated_profile}' makes its data with "
            "the Burst-Gap laws, so the model meeting a bar there checks the simulator and the "
            "fitter; it reproduces nothing",
            rule.text,
        )
    outcome = rule.test(claim, found)
    if outcome.verdict == REPRODUCED:
        return Verdict(REPRODUCED, f"{head}: {rule.text} ({claim.bar})", rule.text)
    if outcome.verdict == TIE:
        why = (
            f"{head}: our 95% CI straddles {outcome.straddled}, so the data neither meet nor "
            f"miss the bar; {found.note}"
        )
        return Verdict(TIE, why, rule.text)
    return Verdict(DIFFERS, f"{head}: misses the bar of {claim.bar}; {found.note}", rule.text)
