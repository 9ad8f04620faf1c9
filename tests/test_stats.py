import numpy as np
import pytest

from xstage_bench.data.stats import (
    FASTER,
    NOISY_HALF_WIDTH,
    SLOWER,
    TIE,
    is_noisy,
    ratio_ci,
    summarize,
    summarize_all,
)


def test_paired_ratio_cancels_drift_that_unpaired_cannot():
    # Both arms drift together by 20% over the rounds; b is 2% faster in every round.
    drift = np.linspace(1.0, 1.2, 40)
    a, b = 100.0 * drift, 98.0 * drift
    paired = ratio_ci(a, b, paired=True)
    unpaired = ratio_ci(a, b, paired=False)
    assert paired["verdict"] == FASTER and paired["ci_low"] > 1.01
    assert unpaired["verdict"] == TIE  # the drift swamps 2% without the pairing
    assert paired["ratio"] == pytest.approx(np.median(a) / np.median(b))


def test_ratio_verdicts_and_bad_input():
    assert ratio_ci([1.0] * 5, [2.0] * 5, paired=True)["verdict"] == SLOWER
    with pytest.raises(ValueError, match="match in count"):
        ratio_ci([1.0, 2.0], [1.0], paired=True)
    with pytest.raises(ValueError, match="both sides"):
        ratio_ci([], [1.0], paired=False)


def test_unpaired_ratio_counts_the_smaller_side():
    # n is what the CI rests on: the side with fewer samples bounds it.
    assert ratio_ci([1.0] * 3, [1.0] * 7, paired=False)["n"] == 3
    assert ratio_ci([1.0] * 7, [1.0] * 3, paired=False)["n"] == 3


def test_a_ci_exactly_at_the_half_width_is_not_noisy():
    # "further than" 3%: a CI reaching exactly 3.0 from 100.0 is not noisy, past it is.
    assert NOISY_HALF_WIDTH * 100.0 == 3.0  # exact in binary, so the boundary is sharp
    assert not is_noisy(100.0, 97.0, 103.0)
    assert is_noisy(100.0, 96.9, 100.0) and is_noisy(100.0, 100.0, 103.1)


def test_summarize_refuses_what_it_cannot_summarize_and_skips_empty_metrics():
    with pytest.raises(ValueError, match="empty"):
        summarize([])
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="NaN or infinity"):
            summarize([1.0, bad])
    out = summarize_all({"time_us": [1.0, 3.0, 2.0], "kernel_us": []})
    assert list(out) == ["time_us"]
    # quartiles by linear interpolation over 1, 2, 3: 1.5 and 2.5
    assert out["time_us"]["q1"] == 1.5 and out["time_us"]["q3"] == 2.5
    assert out["time_us"]["rel_iqr"] == pytest.approx(0.5)
