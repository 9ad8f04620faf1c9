import numpy as np
import pytest

from xstage_bench.data.stats import FASTER, SLOWER, TIE, ratio_ci


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
