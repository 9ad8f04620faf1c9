"""Summary statistics for timing samples: median, interquartile range, bootstrap CI.

One place so that every experiment (measured or simulated) summarizes the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 1000


def bootstrap_median_ci(
    samples: Sequence[float], confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the median; a fixed seed keeps summaries reproducible."""
    x = np.asarray(samples, dtype=float)
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(x, size=(BOOTSTRAP_RESAMPLES, x.size), replace=True), axis=1)
    alpha = (1.0 - confidence) / 2.0
    return float(np.quantile(medians, alpha)), float(np.quantile(medians, 1.0 - alpha))


def summarize(samples: Sequence[float]) -> dict:
    """Median, quartiles, relative IQR and a bootstrap CI of the median."""
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("cannot summarize an empty list of samples")
    if not np.all(np.isfinite(x)):
        raise ValueError("samples contain NaN or infinity")
    q1, median, q3 = np.quantile(x, [0.25, 0.5, 0.75])
    ci_low, ci_high = bootstrap_median_ci(x)
    return {
        "n": int(x.size),
        "median": float(median),
        "q1": float(q1),
        "q3": float(q3),
        "rel_iqr": float((q3 - q1) / median) if median != 0 else None,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "min": float(x.min()),
        "max": float(x.max()),
    }


def summarize_all(samples: dict[str, Sequence[float]]) -> dict[str, dict]:
    """Summaries for every metric that has samples."""
    return {name: summarize(values) for name, values in samples.items() if len(values) > 0}


def geomean(values: Sequence[float]) -> float:
    """Geometric mean (of ratios or speedups; every value must be positive)."""
    return float(np.exp(np.mean(np.log(np.asarray(values, dtype=float)))))


# A ratio whose 95% CI reaches further than this share from its value on either side is
# `noisy`: its verdict may be a tie for want of samples, and an extreme taken over many
# such points says more about noise than about what is compared (issue 26, item 2). The
# paired timing measures such a point again (timing.NoisyRemeasure); the report flags it.
NOISY_HALF_WIDTH = 0.03


def is_noisy(ratio: float, ci_low: float, ci_high: float) -> bool:
    """Whether a ratio's CI reaches further than NOISY_HALF_WIDTH from it on either side."""
    return bool(max(ratio - ci_low, ci_high - ratio) > NOISY_HALF_WIDTH * ratio)


# A ratio's verdict: its CI excludes 1 (faster or slower), or it does not (tie).
FASTER, SLOWER, TIE = "faster", "slower", "tie"


def ratio_ci(
    numerator: Sequence[float],
    denominator: Sequence[float],
    *,
    paired: bool,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict:
    """The ratio of two medians with a bootstrap CI and a verdict.

    paired: the samples come in rounds (timing.measure_paired), sample i of each from
    round i; rounds are resampled together, so drift common to both arms cancels. Else
    each side is resampled on its own (samples taken at different times). The verdict
    says whether the CI lies above 1 (`faster`: the denominator takes less time, for a
    ratio of times numerator/denominator), below 1 (`slower`) or spans it (`tie`).
    """
    a = np.asarray(numerator, dtype=float)
    b = np.asarray(denominator, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("a ratio needs samples on both sides")
    if paired and a.size != b.size:
        raise ValueError(f"paired samples must match in count, got {a.size} and {b.size}")
    rng = np.random.default_rng(seed)
    if paired:
        idx = rng.integers(0, a.size, size=(BOOTSTRAP_RESAMPLES, a.size))
        boot = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    else:
        ia = rng.integers(0, a.size, size=(BOOTSTRAP_RESAMPLES, a.size))
        ib = rng.integers(0, b.size, size=(BOOTSTRAP_RESAMPLES, b.size))
        boot = np.median(a[ia], axis=1) / np.median(b[ib], axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = float(np.quantile(boot, alpha)), float(np.quantile(boot, 1.0 - alpha))
    verdict = FASTER if low > 1.0 else SLOWER if high < 1.0 else TIE
    return {
        "ratio": float(np.median(a) / np.median(b)),
        "ci_low": low,
        "ci_high": high,
        "verdict": verdict,
        "paired": paired,
        "n": int(min(a.size, b.size)),
    }
