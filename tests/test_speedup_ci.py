"""Ratio CIs (analysis/speedup_ci.py): a configuration's speedup with stats.ratio_ci and
the noisy flag, and the headlines' two-level bootstrap over configurations and samples."""

import numpy as np
import pytest

from xstage_bench.data import stats
from xstage_bench.data.stats import NOISY_HALF_WIDTH, is_noisy
from xstage_bench.report.analysis.speedup_ci import RatioSamples, headline_ci


def drifting(base: float, drift: np.ndarray, own: float, rng) -> np.ndarray:
    return base * drift * (1 + own * rng.standard_normal(drift.size))


def test_paired_rounds_cancel_a_drift_both_arms_share():
    rng = np.random.default_rng(1)
    drift = 1 + 0.05 * rng.standard_normal(15)
    wave, interleaved = drifting(110, drift, 0.001, rng), drifting(100, drift, 0.001, rng)
    paired = RatioSamples.of(wave, interleaved, paired=True).ci()
    unpaired = RatioSamples.of(wave, interleaved, paired=False).ci()
    assert paired["ratio"] == pytest.approx(1.1, rel=0.01)
    assert paired["verdict"] == stats.FASTER and not paired["noisy"]
    assert paired["ci_high"] - paired["ci_low"] < 0.2 * (unpaired["ci_high"] - unpaired["ci_low"])
    assert unpaired["noisy"]  # the drift alone spreads an unpaired ratio beyond +-3%


def test_paired_samples_of_unequal_count_fall_back_to_unpaired():
    assert not RatioSamples.of([1.0, 2.0, 3.0], [1.0, 2.0], paired=True).paired


def test_noisy_is_a_ci_reaching_beyond_the_half_width_on_either_side():
    assert not is_noisy(1.0, 1.0 - NOISY_HALF_WIDTH * 0.99, 1.0)
    assert is_noisy(1.0, 1.0, 1.0 + NOISY_HALF_WIDTH * 1.01)
    assert is_noisy(2.0, 2.0 - 2.0 * NOISY_HALF_WIDTH * 1.01, 2.0)


def test_headline_of_exact_configurations_has_the_spread_of_the_configurations_only():
    points = [RatioSamples.of([r] * 5, [1.0] * 5, paired=True) for r in (1.0, 1.1, 1.2, 1.3)]
    value, low, high = headline_ci(points, "geomean")
    assert value == pytest.approx(stats.geomean([1.0, 1.1, 1.2, 1.3]))
    assert 1.0 <= low < value < high <= 1.3  # resampling configurations moves it
    same = [RatioSamples.of([1.1] * 5, [1.0] * 5, paired=True)] * 4
    assert headline_ci(same, "median") == pytest.approx((1.1, 1.1, 1.1))


def test_headline_of_one_configuration_is_its_own_sampling_spread():
    rng = np.random.default_rng(2)
    point = RatioSamples.of(1.1 + 0.05 * rng.standard_normal(30), [1.0] * 30, paired=False)
    value, low, high = headline_ci([point], "median")
    own = point.ci()
    assert value == pytest.approx(own["ratio"])
    assert low == pytest.approx(own["ci_low"], abs=0.01)
    assert high == pytest.approx(own["ci_high"], abs=0.01)


def test_a_headline_needs_a_configuration():
    with pytest.raises(ValueError, match="at least one configuration"):
        headline_ci([], "geomean")


def test_the_headline_ci_is_the_middle_95_percent_of_the_replicates():
    # Exact configurations with ratios 1, 1 and 4: each replicate draws 3 of them, k of
    # which are the 4 (k ~ Binomial(3, 1/3)), so the geomean is 4^(k/3). P(k = 3) = 1/27
    # = 3.7% > 2.5%: the 97.5% quantile is 4; a 90% interval would stop at 4^(2/3).
    points = [RatioSamples.of([r] * 5, [1.0] * 5, paired=True) for r in (1.0, 1.0, 4.0)]
    value, low, high = headline_ci(points, "geomean")
    assert value == pytest.approx(4 ** (1 / 3))
    assert (low, high) == pytest.approx((1.0, 4.0))


def test_a_pair_is_in_the_same_rounds_only_when_each_names_the_other():
    from xstage_bench.report.analysis.megamoe import in_same_rounds

    def record(rid, arms):
        return {"id": rid, "extra": {"paired": {"arms": arms}}}

    both = ["c/expert_wave", "c/interleaved"]
    assert in_same_rounds(record("c/expert_wave", both), record("c/interleaved", both))
    # the interleaved arm was timed again in other rounds: no longer paired with this wave
    again = ["c/interleaved", "c/interleaved/lead=0"]
    assert not in_same_rounds(record("c/expert_wave", both), record("c/interleaved", again))
    assert not in_same_rounds({"id": "c/expert_wave"}, {"id": "c/interleaved"})
