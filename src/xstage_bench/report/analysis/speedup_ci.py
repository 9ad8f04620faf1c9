"""Confidence intervals on ratios of times: one configuration's speedup (stats.ratio_ci),
the headlines over many configurations (geomean, median) by a two-level bootstrap, and
which points are too noisy for their ratio to say much.

A headline's uncertainty has two sources: which configurations were measured (the grid
is a sample of the ones a user could run) and each configuration's own timing noise. The
two-level bootstrap resamples both: configurations with replacement, and within each its
paired rounds (timing.measure_paired: rounds resampled together, so drift common to both
schedules cancels) or, for samples taken at different times, each side on its own.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from xstage_bench.data import stats
from xstage_bench.data.stats import is_noisy

CONFIDENCE = 0.95


@dataclass(frozen=True, eq=False)
class RatioSamples:
    """The two sides of a ratio of medians (numerator / denominator: for a speedup, the
    baseline's time over the candidate's) and whether sample i of both is from round i."""

    numerator: np.ndarray
    denominator: np.ndarray
    paired: bool

    @classmethod
    def of(cls, numerator: Sequence[float], denominator: Sequence[float], paired: bool):
        a = np.asarray(numerator, dtype=float)
        b = np.asarray(denominator, dtype=float)
        return cls(a, b, paired and a.size == b.size)

    @property
    def ratio(self) -> float:
        return float(np.median(self.numerator) / np.median(self.denominator))

    def ci(self) -> dict:
        """stats.ratio_ci of the two sides: ratio, ci_low, ci_high, verdict, paired, n,
        and `noisy` (the CI reaches further than NOISY_HALF_WIDTH from the ratio)."""
        found = stats.ratio_ci(self.numerator, self.denominator, paired=self.paired)
        return {**found, "noisy": is_noisy(found["ratio"], found["ci_low"], found["ci_high"])}

    @cached_property
    def boot(self) -> np.ndarray:
        """stats.BOOTSTRAP_RESAMPLES replicates of the ratio, seeded by the samples
        themselves: the same for every headline the configuration is part of, and
        computed once."""
        seed = zlib.crc32(self.numerator.tobytes() + self.denominator.tobytes())
        return self.replicates(stats.BOOTSTRAP_RESAMPLES, np.random.default_rng(seed))

    def replicates(self, resamples: int, rng: np.random.Generator) -> np.ndarray:
        """`resamples` bootstrap replicates of the ratio of medians, resampled as
        stats.ratio_ci does (rounds together when paired, else each side alone)."""
        a, b = self.numerator, self.denominator
        if self.paired:
            idx = rng.integers(0, a.size, size=(resamples, a.size))
            return np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
        ia = rng.integers(0, a.size, size=(resamples, a.size))
        ib = rng.integers(0, b.size, size=(resamples, b.size))
        return np.median(a[ia], axis=1) / np.median(b[ib], axis=1)


def _median(values: np.ndarray) -> np.ndarray:
    return np.median(values, axis=-1)


def _geomean(values: np.ndarray) -> np.ndarray:
    return np.exp(np.mean(np.log(values), axis=-1))


HEADLINES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "geomean": _geomean,
    "median": _median,
}


def headline_ci(
    points: Sequence[RatioSamples], stat: str, *, seed: int = 0
) -> tuple[float, float, float]:
    """(value, ci_low, ci_high) of a headline ('geomean' or 'median') of the points'
    ratios: the value over their ratios of medians, the CI by the two-level bootstrap
    (configurations resampled with replacement, then within each its rounds or samples).
    """
    if not points:
        raise ValueError("a headline needs at least one configuration")
    reduce = HEADLINES[stat]
    value = float(reduce(np.array([p.ratio for p in points])))
    rng = np.random.default_rng(seed)
    # One column of within-configuration replicates per configuration, then per
    # replicate a resample of the configurations, each contributing its own replicate.
    within = np.stack([p.boot for p in points], axis=1)
    resamples = within.shape[0]
    chosen = rng.integers(0, len(points), size=(resamples, len(points)))
    replicate = np.arange(resamples)[:, None]
    values = reduce(within[replicate, chosen])
    alpha = (1.0 - CONFIDENCE) / 2.0
    return value, float(np.quantile(values, alpha)), float(np.quantile(values, 1.0 - alpha))
