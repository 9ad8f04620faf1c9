"""The one timing module: the stopping rules, CUDA-event timers, paired rounds.

Every experiment that times something on a GPU goes through here, so warm-up, repetition,
the noise-based stopping rule and the L2 flush are decided once (the nvbench habit).

`measure` is pure Python and takes any `run_once() -> microseconds`; the CUDA timers build
such a callable. torch is imported inside the functions that need it, so this module loads
on machines without torch (CI) and fails only when a CUDA timer is actually asked for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields

import numpy as np

from xstage_bench.data import stats

STABLE = "stable"
MAX_REPS = "max_reps"
BUDGET = "budget"


class TimingError(RuntimeError):
    """A timer cannot run here (no torch, no CUDA) or a sample is not a usable time."""


NOT_IN_TIMING_BLOCK = ("host_lead",)


@dataclass(frozen=True)
class TimingPolicy:
    """How long to keep repeating: `config.yaml`'s `timing` block."""

    warmup: int
    min_reps: int
    max_reps: int
    target_rel_iqr: float
    budget_s: float
    flush_l2: bool
    # Seconds more per paired set to spend on rounds while a compared ratio's CI reaches
    # beyond stats.NOISY_HALF_WIDTH (issue 26: a noisy point is measured again, within a
    # budget, before it is flagged); 0 turns it off.
    noisy_budget_s: float = 0.0
    # Keep the GPU busy while the host enqueues each timed call (HostLead): the events then
    # time the GPU's work, not the host's. Set by the experiments that ask for it
    # (megamoe.host_lead), not a key of the timing block.
    host_lead: bool = False

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"timing.warmup must be >= 0, got {self.warmup}")
        if self.min_reps < 1:
            raise ValueError(f"timing.min_reps must be >= 1, got {self.min_reps}")
        if self.max_reps < self.min_reps:
            raise ValueError(
                f"timing.max_reps must be >= timing.min_reps ({self.min_reps}), got {self.max_reps}"
            )
        if not self.target_rel_iqr > 0:
            raise ValueError(f"timing.target_rel_iqr must be > 0, got {self.target_rel_iqr}")
        if not self.budget_s > 0:
            raise ValueError(f"timing.budget_s must be > 0, got {self.budget_s}")
        if not self.noisy_budget_s >= 0:
            raise ValueError(f"timing.noisy_budget_s must be >= 0, got {self.noisy_budget_s}")
        if not isinstance(self.host_lead, bool):
            raise ValueError(f"host_lead must be true or false, got {self.host_lead!r}")

    @classmethod
    def from_config(cls, timing: Mapping) -> TimingPolicy:
        """Build from `cfg["timing"]`; a missing or unknown key is named in the error (keys
        with a default, like noisy_budget_s, may be left out)."""
        names = [f.name for f in fields(cls) if f.name not in NOT_IN_TIMING_BLOCK]
        optional = {f.name for f in fields(cls) if f.default is not MISSING}
        missing = [n for n in names if n not in timing and n not in optional]
        unknown = sorted(set(timing) - set(names))
        if missing:
            raise ValueError(f"timing config: missing key 'timing.{missing[0]}'")
        if unknown:
            raise ValueError(f"timing config: unknown key 'timing.{unknown[0]}'")
        return cls(**{n: timing[n] for n in names if n in timing})


class Samples(list):
    """The timed samples (a plain list of floats, in the caller's unit) plus why timing stopped.

    A list subclass so callers can pass it straight to `results.ok_record`; the extra
    attributes say how the list came to be: `stop_reason` is one of STABLE (n >= min_reps
    and the relative IQR reached the target), MAX_REPS or BUDGET; `warmup` is how many
    calls were discarded; `elapsed_s` the wall-clock time of the timed repetitions.
    """

    def __init__(self, values: list[float], *, stop_reason: str, warmup: int, elapsed_s: float):
        super().__init__(values)
        self.stop_reason = stop_reason
        self.warmup = warmup
        self.elapsed_s = elapsed_s


def relative_iqr(samples: list[float]) -> float:
    """(q3 - q1) / median, the same definition as `stats.summarize`'s rel_iqr."""
    q1, median, q3 = np.quantile(np.asarray(samples, dtype=float), [0.25, 0.5, 0.75])
    spread = q3 - q1
    if median == 0:
        # All-zero samples are perfectly stable; any spread around a zero median is not.
        return 0.0 if spread == 0 else float("inf")
    return float(spread / abs(median))


def measure(
    run_once: Callable[[], float],
    policy: TimingPolicy,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> Samples:
    """Warm up, then repeat `run_once` until the samples are stable, numerous or too costly.

    Stops when n >= min_reps and the relative IQR <= target_rel_iqr (STABLE), when
    n == max_reps (MAX_REPS), or when n >= min_reps and `budget_s` of `clock` time has
    passed since the warm-up ended (BUDGET; the budget covers the timed repetitions, the
    warm-up is a fixed count). min_reps samples are always taken: a spread and a CI from
    two or three samples would mean little, so the budget only cuts a noisy point short.
    """
    for _ in range(policy.warmup):
        run_once()
    samples: list[float] = []
    start = clock()
    while True:
        value = float(run_once())
        if not np.isfinite(value) or value < 0:
            raise TimingError(f"run_once returned {value!r}, not a finite non-negative time")
        samples.append(value)
        elapsed = clock() - start
        n = len(samples)
        if n >= policy.min_reps and relative_iqr(samples) <= policy.target_rel_iqr:
            reason = STABLE
        elif n >= policy.max_reps:
            reason = MAX_REPS
        elif n >= policy.min_reps and elapsed >= policy.budget_s:
            reason = BUDGET
        else:
            continue
        return Samples(samples, stop_reason=reason, warmup=policy.warmup, elapsed_s=elapsed)


def paired_order(arms: Sequence[str], round_index: int) -> list[str]:
    """The order the arms run in one round: as given in even rounds, reversed in odd ones
    (A B, B A, A B, ...), so that neither arm always runs right after the other."""
    return list(arms) if round_index % 2 == 0 else list(reversed(arms))


def measure_paired(
    run_onces: Mapping[str, Callable[[], float]],
    policy: TimingPolicy,
    *,
    ratios: Sequence[tuple[str, str]] = (),
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Samples]:
    """Time several arms (what a ratio compares) in rounds, interleaved in time.

    Each round runs every arm once, in `paired_order`, so sample i of every arm comes from
    round i and a ratio of two arms is a ratio of samples taken seconds apart, under the
    same clocks and heat. Warm-up is `policy.warmup` rounds. Stops when every arm is
    stable (n >= min_reps and each relative IQR <= target: STABLE), at max_reps rounds
    (MAX_REPS), or when n >= min_reps and `budget_s` per arm has passed (BUDGET).

    `ratios` names what the caller compares, (numerator arm, denominator arm). When one of
    them is noisy at the stop (its paired CI reaches beyond stats.NOISY_HALF_WIDTH), the
    point is measured again: more rounds, within `noisy_budget_s` (and a round cap), until
    no ratio is noisy (see `NoisyRemeasure`). Every arm's Samples carry the same stop
    reason, `rounds` (the round of each sample) and `remeasure` (None without ratios).
    """
    arms = list(run_onces)
    if not arms:
        raise ValueError("measure_paired needs at least one arm")
    unknown = sorted({a for pair in ratios for a in pair} - set(arms))
    if unknown:
        raise ValueError(f"measure_paired: ratio arm(s) {unknown} are not among {arms}")
    for r in range(policy.warmup):
        for arm in paired_order(arms, r):
            run_onces[arm]()
    rounds = _Rounds(run_onces, arms)
    start = clock()
    budget = policy.budget_s * len(arms)
    while True:
        rounds.run_one()
        n, elapsed = rounds.n, clock() - start
        stable = all(relative_iqr(v) <= policy.target_rel_iqr for v in rounds.samples.values())
        if n >= policy.min_reps and stable:
            reason = STABLE
        elif n >= policy.max_reps:
            reason = MAX_REPS
        elif n >= policy.min_reps and elapsed >= budget:
            reason = BUDGET
        else:
            continue
        break
    remeasure = NoisyRemeasure.run(rounds, ratios, policy, clock) if ratios else None
    elapsed = clock() - start
    out = {}
    for arm, values in rounds.samples.items():
        out[arm] = Samples(values, stop_reason=reason, warmup=policy.warmup, elapsed_s=elapsed)
        out[arm].rounds = list(range(rounds.n))
        out[arm].remeasure = remeasure
    return out


class _Rounds:
    """The samples of paired rounds so far; `run_one` adds a round."""

    def __init__(self, run_onces: Mapping[str, Callable[[], float]], arms: list[str]):
        self.run_onces, self.arms = run_onces, arms
        self.samples: dict[str, list[float]] = {arm: [] for arm in arms}

    @property
    def n(self) -> int:
        return len(self.samples[self.arms[0]])

    def run_one(self) -> None:
        for arm in paired_order(self.arms, self.n):
            value = float(self.run_onces[arm]())
            if not np.isfinite(value) or value < 0:
                raise TimingError(f"{arm}: run_once returned {value!r}, not a finite time")
            self.samples[arm].append(value)


# How many more rounds than max_reps a noisy point may get: the budget in seconds is the
# real bound, this one only keeps a record of short rounds from growing without end.
NOISY_MAX_ROUNDS_FACTOR = 4


@dataclass(frozen=True)
class NoisyRemeasure:
    """What measuring a noisy point again did: the rounds it added (0: no ratio was noisy
    at the stop), the seconds they took, and each compared ratio's paired CI at the end
    (stats.ratio_ci with its numerator and denominator arm and `noisy`; a ratio still noisy
    is flagged so by the report, as every ratio is, from its CI)."""

    half_width: float
    budget_s: float
    max_rounds: int
    rounds_added: int
    elapsed_s: float
    ratios: list[dict]

    @property
    def still_noisy(self) -> int:
        return sum(found["noisy"] for found in self.ratios)

    @classmethod
    def run(cls, rounds: _Rounds, ratios, policy: TimingPolicy, clock) -> NoisyRemeasure:
        """Add rounds while a ratio is noisy, checked every min_reps rounds (a bootstrap
        per round would cost more than a short round), within `noisy_budget_s` and
        NOISY_MAX_ROUNDS_FACTOR x max_reps more rounds."""
        start, first_n = clock(), rounds.n
        max_rounds = NOISY_MAX_ROUNDS_FACTOR * policy.max_reps
        found = _ratio_cis(rounds.samples, ratios)
        while any(f["noisy"] for f in found):
            spent = clock() - start >= policy.noisy_budget_s
            if spent or rounds.n - first_n + policy.min_reps > max_rounds:
                break
            for _ in range(policy.min_reps):
                rounds.run_one()
            found = _ratio_cis(rounds.samples, ratios)
        return cls(
            stats.NOISY_HALF_WIDTH,
            policy.noisy_budget_s,
            max_rounds,
            rounds.n - first_n,
            clock() - start,
            found,
        )

    def as_extra(self) -> dict:
        """The raw record's `extra.paired.remeasure`."""
        return {
            "rule": "while a compared ratio's paired 95% CI reaches further than "
            f"+-{self.half_width:.0%} from it, more rounds (checked every min_reps rounds), "
            f"within {self.budget_s:g} s and {self.max_rounds} rounds",
            "rounds_added": self.rounds_added,
            "elapsed_s": self.elapsed_s,
            "ratios": self.ratios,
            "still_noisy": self.still_noisy,
        }


def _ratio_cis(samples: Mapping[str, list[float]], ratios) -> list[dict]:
    found = []
    for numerator, denominator in ratios:
        ci = stats.ratio_ci(samples[numerator], samples[denominator], paired=True)
        noisy = stats.is_noisy(ci["ratio"], ci["ci_low"], ci["ci_high"])
        found.append({"numerator": numerator, "denominator": denominator, **ci, "noisy": noisy})
    return found


def paired_extra(arms: Sequence[str], arm: str, samples: Samples) -> dict:
    """What a record of one arm says about its pairing (raw records keep it in extra):
    the arms measured with it, and that its sample i ran in round i, with the order; with
    compared ratios, what measuring it again for noise did (`remeasure`)."""
    extra = {
        "arms": list(arms),
        "arm": arm,
        "rounds": len(samples),
        "order": "round i runs the arms as listed when i is even, reversed when odd; "
        "sample i of every arm is from round i",
        "position": [paired_order(arms, i).index(arm) for i in range(len(samples))],
    }
    remeasure = getattr(samples, "remeasure", None)
    if remeasure is not None:
        extra["remeasure"] = remeasure.as_extra()
    return extra


def measure_fixed(
    run_once: Callable[[], float],
    policy: TimingPolicy,
    *,
    agree: Callable[[int], int] = lambda n: n,
) -> list[float]:
    """Warm up, then a fixed count of `run_once` sized from the first timed call so that
    the repetitions fit `budget_s` (clipped to min_reps..max_reps).

    For ranks that time one collective call together and so must all run the same count
    (DeepGEMM's worker pair): `agree(n)` returns the count every rank uses (rank 0's,
    broadcast). The noise-based stopping rule of `measure` cannot serve there: each rank
    would stop at its own count.
    """
    for _ in range(policy.warmup):
        run_once()
    first = run_once()
    fit = policy.budget_s * 1e6 / max(first, 1.0)
    n = agree(int(np.clip(fit, policy.min_reps, policy.max_reps)))
    return [first] + [run_once() for _ in range(n - 1)]


def host_timer(fn: Callable[[], object]) -> Callable[[], float]:
    """A `run_once` for work that is synchronous on the host (the CPU tests of the GPU
    code): wall-clock microseconds around `fn`. Never a GPU measurement."""

    def run_once() -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6

    return run_once


def _cuda_torch():
    """torch, checked to have a usable CUDA device; a clear TimingError otherwise."""
    try:
        import torch
    except ImportError:
        raise TimingError("CUDA timing needs torch, which is not installed here") from None
    if not torch.cuda.is_available():
        raise TimingError(
            "CUDA timing needs a CUDA device, but torch.cuda.is_available() is False "
            "(no GPU or no driver on this machine)"
        )
    return torch


def l2_flusher(torch, device: int) -> Callable[[], None]:
    """Overwrite a buffer exactly the size of the device's L2, so the timed call starts cold."""
    size = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    if size <= 0:
        raise TimingError(f"cannot flush L2: torch reports no L2_cache_size for cuda:{device}")
    buffer = torch.empty(size, dtype=torch.uint8, device=torch.device("cuda", device))
    return buffer.zero_


class HostLead:
    """Keeps the GPU busy while the host enqueues a timed call, so that the events around
    it time the GPU's work and not the host's (our eager MegaMoE layer took 200-340 us to
    enqueue, and the GPU waited for most of it inside the timed region: kernels/ab).

    Before each start event a sleep kernel runs: FIRST_US the first time, then twice the
    longest enqueue of the last few calls plus MARGIN_US. Whether that was enough is
    checked, not assumed: a start event already complete when the host has finished
    enqueueing the call means the GPU may have idled waiting for it, and such calls are
    counted (`as_extra`). The sleep is outside the timed region and touches no memory,
    so an L2 flushed before it stays flushed."""

    FIRST_US = 1000.0
    MARGIN_US = 50.0
    RECENT = 8  # calls whose longest enqueue sets the next sleep
    # torch.cuda._sleep counts SM cycles; 2 GHz is at or above an H200's top clock, so a
    # sleep lasts at least as long as asked.
    CYCLES_PER_US = 2000

    def __init__(self) -> None:
        self.enqueue_us: list[float] = []
        self.waited = 0

    def sleep_us(self) -> float:
        if not self.enqueue_us:
            return self.FIRST_US
        return 2 * max(self.enqueue_us[-self.RECENT :]) + self.MARGIN_US

    def before_start(self, torch) -> None:
        torch.cuda._sleep(int(self.sleep_us() * self.CYCLES_PER_US))

    def after_enqueue(self, start_event, enqueue_us: float) -> None:
        self.enqueue_us.append(enqueue_us)
        if start_event.query():
            self.waited += 1

    def as_extra(self) -> dict:
        """The record's facts: the host's enqueue time, and how many calls the GPU may
        have waited for it in."""
        return {
            "host_enqueue_us": float(np.median(self.enqueue_us)) if self.enqueue_us else None,
            "gpu_waited_for_host": self.waited,
            "host_lead_calls": len(self.enqueue_us),
        }


def host_lead(policy: TimingPolicy) -> HostLead | None:
    """A HostLead where the policy asks for one."""
    return HostLead() if policy.host_lead else None


def lead_facts(lead: HostLead | None) -> dict:
    """A record's host-lead facts (HostLead.as_extra), or {} where there was no lead."""
    return lead.as_extra() if lead is not None else {}


def cuda_event_timer(
    fn: Callable[[], None],
    *,
    device: int,
    flush_l2: bool,
    stream=None,
    setup: Callable[[], None] | None = None,
    lead: HostLead | None = None,
) -> Callable[[], float]:
    """A `run_once` for `measure`: one call of `fn` between two CUDA events, in microseconds.

    `fn` must enqueue its work on torch's current stream (it is made current here). The L2
    flush runs on the same stream before the start event, so it is ordered before `fn`
    but outside the timed region; so does `setup` (after the flush), for untimed work each
    repetition needs (refilling inputs, a barrier between ranks), and then `lead`'s sleep.
    """
    torch = _cuda_torch()
    with torch.cuda.device(device):
        stream = stream if stream is not None else torch.cuda.current_stream(device)
        flush = l2_flusher(torch, device) if flush_l2 else None
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)

    def run_once() -> float:
        with torch.cuda.device(device), torch.cuda.stream(stream):
            if flush is not None:
                flush()
            if setup is not None:
                setup()
            if lead is not None:
                lead.before_start(torch)
            start.record(stream)
            enqueue_start = time.perf_counter()
            fn()
            if lead is not None:
                lead.after_enqueue(start, (time.perf_counter() - enqueue_start) * 1e6)
            end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) * 1000.0

    return run_once


def slowest_rank_us(events: list, rounds: int) -> list[float]:
    """Per timed call of the last `rounds` (the warm-up calls are recorded first), the
    slowest rank's microseconds between its (start, end) pair: CUDA events, or anything with
    their elapsed_time in ms (host stamps on the CPU)."""
    return [
        max(start.elapsed_time(end) * 1000.0 for start, end in ranks) for ranks in events[-rounds:]
    ]
