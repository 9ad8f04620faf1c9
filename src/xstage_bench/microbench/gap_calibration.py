"""The compute gap's calibration: the line of FMA-loop iterations against nanoseconds
that bench.py measures, checked to be a line, and the iterations a gap in microseconds
is read off it.

This module exists because a sweep's gaps are set in iterations, not in time: every gap
of a point goes through this line, and it is known only where it was measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from xstage_bench.microbench.errors import MicrobenchError, PointUnsupported

GAP_LINEARITY_TOLERANCE = 0.05  # calibrated gaps of >= 5 us must sit within 5% of the line
GAP_LINEARITY_FLOOR_NS = 5000.0
GAP_EXTRAPOLATION = 1.25  # a gap may exceed the longest calibrated one by at most 25%


def fit_gap_calibration(iters: Sequence[int], ns: Sequence[float]) -> dict:
    """Least-squares ns = fixed + per_iter * iters.

    A non-increasing fit is an error, and so is one that is not a line: every calibrated
    gap of GAP_LINEARITY_FLOOR_NS or more must sit within GAP_LINEARITY_TOLERANCE of it
    (the gaps of a sweep are read off this line, up to hundreds of microseconds).
    """
    x, y = np.asarray(iters, float), np.asarray(ns, float)
    per_iter, fixed = np.polyfit(x, y, 1)
    if per_iter <= 0:
        raise MicrobenchError(f"gap calibration is not increasing in iterations: {list(ns)} ns")
    long = y >= GAP_LINEARITY_FLOOR_NS
    residual = np.abs(fixed + per_iter * x - y)[long] / y[long]
    worst = float(residual.max()) if residual.size else 0.0
    if worst > GAP_LINEARITY_TOLERANCE:
        raise MicrobenchError(
            f"gap calibration is not linear in iterations: a calibrated gap is {worst:.1%} "
            f"off the fitted line (tolerance {GAP_LINEARITY_TOLERANCE:.0%}); "
            f"iters {list(map(int, iters))}, ns {list(ns)}"
        )
    return {
        "ns_per_iter": float(per_iter),
        "fixed_ns": float(fixed),
        "iters": [int(i) for i in iters],
        "ns": [float(v) for v in ns],
        "max_rel_residual": worst,
        "longest_calibrated_us": float(y.max()) / 1e3,
    }


def gap_iterations(calibration: Mapping, gap_us: float) -> int:
    """FMA iterations whose calibrated duration is closest to gap_us (0 for no gap).

    A gap beyond GAP_EXTRAPOLATION times the longest calibrated one is refused: the line is
    known only where it was measured.
    """
    if gap_us <= 0:
        return 0
    longest = calibration.get("longest_calibrated_us", max(calibration["ns"]) / 1e3)
    if gap_us > GAP_EXTRAPOLATION * longest:
        raise PointUnsupported(
            f"gap {gap_us:g} us is beyond the calibrated compute gaps (longest {longest:.0f} "
            f"us; GAP_CALIBRATION_ITERS in microbench/launch.py reaches it)"
        )
    iters = (gap_us * 1e3 - calibration["fixed_ns"]) / calibration["ns_per_iter"]
    return max(0, round(iters))
