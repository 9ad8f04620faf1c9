"""Checks of the fitted Burst-Gap model: does the data agree with what the model assumes?

Each check is {"passed": bool | None, "detail": str}; passed is None where the data cannot
answer the question, and the detail always carries the numbers behind the verdict. A
check's name states the claim it tests, so passed = False means the claim is false here.
"""

from __future__ import annotations

import numpy as np

from xstage_bench.data import storepath
from xstage_bench.model import sender_visible
from xstage_bench.model.document import ceiling_rates, line_rate
from xstage_bench.model.records import Recs, plateau

MiB = float(1 << 20)
SPLIT_CI_FLOOR = 0.01  # a K/B split's R interval is at least +-1% (clock and timer noise)
PLATEAU_TOLERANCE = 0.05  # issue time may vary 5% over the plateau gaps,
PLATEAU_FLOOR_US = 0.064  # or two ticks of the 32 ns %globaltimer, whichever is larger
KNEE_TOLERANCE = 0.10  # a K's knee interval is at least +-10% (few bursts beyond a knee)
CEILING_TOLERANCE = 0.10  # R within 10% of the SM-store ceiling of its path
LINE_NAME = {storepath.PEER: "NVLink", storepath.HOST: "host link"}
NO_LINE_RATE = {
    storepath.PEER: "no line rate (the fit had no base profile)",
    storepath.HOST: "no host link line rate in the raw files' environment "
    "(host_links[0].line_rate_GBps; files older than the host path have none)",
}
TARGET_MEDIAN_ERROR = 0.05  # the held-out median |relative error| the model should reach
TARGET_P90_ERROR = 0.25  # and its 90th percentile (issue #52)
STALL_MARGIN = 1.2  # the steady-train law must exceed the isolated law by 20% to count
STALL_CARRIED = 0.8  # the sender sees the stall if its visible time is 80% of the predicted


def _check(passed: bool | None, detail: str) -> dict:
    """passed is None where the data cannot answer the question; the detail says why."""
    return {"passed": None if passed is None else bool(passed), "detail": detail}


def not_evaluated(why: str) -> dict:
    return _check(None, f"not evaluated: {why}")


def _ci(entry: dict, floor: float = 0.0) -> tuple[float, float]:
    """A parameter block's interval, at least +-floor of its value (the value alone where
    the bootstrap gave none)."""
    v = entry["value"]
    lo = entry["ci_low"] if entry.get("ci_low") is not None else v
    hi = entry["ci_high"] if entry.get("ci_high") is not None else v
    return min(lo, v * (1 - floor)), max(hi, v * (1 + floor))


def split_consistency(per_K: list[dict]) -> dict:
    """Do the K/B splits drain at one R? Each K's R is the slope of its zero-gap periods
    over V (period = V/R + c, stages.slope_R), so a fixed cost per burst (c) does not count
    as a slower drain; the splits agree where their intervals (at least +-1%) overlap."""
    fitted = [k for k in per_K if k["R_GBps"]["value"] is not None]
    if len(fitted) < 2:
        return not_evaluated("R's slope fitted for fewer than two K/B splits")
    cis = [_ci(k["R_GBps"], SPLIT_CI_FLOOR) for k in fitted]
    rates = np.array([k["R_GBps"]["value"] for k in fitted])
    spread = (rates.max() - rates.min()) / np.median(rates)
    listing = "; ".join(
        f"K={k['K']}: {k['R_GBps']['value']:.1f} ({_interval(k['R_GBps'])})"
        + _intercept(k.get("period_intercept_us"))
        for k in fitted
    )
    agree = max(lo for lo, _ in cis) <= min(hi for _, hi in cis)
    verdict = "agree within" if agree else "disagree beyond"
    return _check(
        agree,
        f"{len(fitted)} K/B splits' slopes {verdict} their CIs (at least +-"
        f"{SPLIT_CI_FLOOR:.0%}), spread {spread:.1%}; R in GB/s (95% CI): {listing}",
    )


def _interval(entry: dict) -> str:
    if entry.get("ci_low") is None:
        return "no CI"
    return f"{entry['ci_low']:.1f}-{entry['ci_high']:.1f}"


def _intercept(entry: dict | None) -> str:
    if not entry or entry.get("value") is None:
        return ""
    return f", c {entry['value']:+.2f} us"


def t0_plateau_flat(periodic: Recs, R: float | None, Q: np.ndarray | None) -> dict:
    """Is the issue time flat over the gaps that drain the whole burst, on the series whose
    bursts fit the capacity (V <= Q(K), Q the law's capacity per record)? A burst beyond
    it stalls even on an empty path, so its plateau is the isolated stall, not T0.

    The issue time is the record's own metric where it is measured (the sender-visible
    time or, free-running, the store loop); where it is derived from the period it carries
    the barrier's alignment wait, which grows with G and is not T0, so the store loop is
    judged instead (the hold is outside it, but on a drained path there is none).
    """
    if R is None or Q is None:
        return not_evaluated("no R" if R is None else "no capacity (Q)")
    fits = periodic.where(periodic.V <= Q)
    plat = plateau(fits, R)
    y = np.where(np.asarray(plat.metric) == sender_visible.DERIVED, plat.loop, plat.y)
    spreads = []
    for name in sorted(set(plat.series)):
        mine = y[[s == name for s in plat.series]]
        if mine.size >= 2:
            # (excess over the tolerance, relative spread, absolute spread, series, gaps)
            rel, width = (mine.max() - mine.min()) / np.median(mine), mine.max() - mine.min()
            excess = min(rel - PLATEAU_TOLERANCE, width - PLATEAU_FLOOR_US)
            spreads.append((excess, rel, width, name, mine.size))
    if not spreads:
        return not_evaluated(
            "no series whose bursts fit the capacity has two gaps beyond V/R "
            f"({len(set(periodic.series)) - len(set(fits.series))} series have V above Q(K))"
        )
    excess, rel, width, name, n = max(spreads)
    derived = int(np.sum(np.asarray(plat.metric) == sender_visible.DERIVED))
    on = f"; {derived} derived records judged on their store loop" if derived else ""
    return _check(
        excess <= 0,
        f"{len(spreads)} series with V <= Q(K); the least flat spreads {rel:.1%} "
        f"({width * 1e3:.0f} ns) over the plateau ({name}, {n} gaps); tolerance "
        f"{PLATEAU_TOLERANCE:.0%} or {PLATEAU_FLOOR_US * 1e3:.0f} ns (two timer ticks), "
        f"whichever is larger{on}",
    )


def backpressure_mask(periodic: Recs, T0, periodic_law, isolated_law) -> np.ndarray:
    """Aligned periodic records where the steady-train law predicts backpressure that an
    isolated burst of the same size would not meet (both laws against STALL_MARGIN x T0)."""
    return (
        periodic.aligned & (isolated_law <= STALL_MARGIN * T0) & (periodic_law > STALL_MARGIN * T0)
    )


def _metrics(recs: Recs) -> str:
    names = list(recs.metric)
    return ", ".join(f"{names.count(m)} {m}" for m in sorted(set(names)))


def stall_visible_to_sender(periodic: Recs, T0, periodic_law, isolated_law) -> dict:
    """Where the steady-train law max(T0, V/R - G) predicts backpressure that an isolated
    burst of the same size would not meet, does the sender see it: does the aligned
    producer's sender-visible issue time (its store loop plus what its next memory
    operation waited, sender_visible.py) carry STALL_CARRIED of the predicted time?

    T0, periodic_law and isolated_law are the fitted laws' times for the periodic records
    (the isolated law with the capacity law's Q(K)). The share of that time spent in the
    store loop is a hardware finding (store_loop_share), not this check's verdict.
    """
    mask = backpressure_mask(periodic, T0, periodic_law, isolated_law)
    if not mask.any():
        return not_evaluated(
            "no aligned periodic record where the steady-train law predicts backpressure "
            "and an isolated burst of the same size none"
        )
    recs, law = periodic.where(mask), periodic_law[mask]
    carried = recs.y / law
    low = int(np.argmin(carried))
    loop = np.nanmedian(recs.loop / recs.y)
    return _check(
        np.median(carried) >= STALL_CARRIED,
        f"{len(recs)} aligned periodic records whose burst fits the capacity but not the "
        f"gap (max(T0, V/R - G) over {STALL_MARGIN:g} x T0; {_metrics(recs)}): the "
        f"sender-visible time came to a median {np.median(carried):.0%} of the predicted "
        f"issue time (needs {STALL_CARRIED:.0%}; lowest: K={recs.K[low]:g}, "
        f"V={recs.V[low] / MiB:.0f} MiB, G={recs.G[low]:g} us: {recs.y[low]:.2f} of "
        f"{law[low]:.2f} us); the store loop took a median {loop:.0%} of it "
        "(store_loop_share)",
    )


def store_loop_share(periodic: Recs, mask: np.ndarray) -> dict:
    """A hardware finding, not a check: per K, the median share of the sender-visible time
    that the store loop took, over the aligned records where the laws predict backpressure
    (`mask`, backpressure_mask). Near 1 the stall is in the loop; near 0 it lands on the
    next memory operation (issue #52: host, K = 132, V = 2 MiB, G = 0: 1%)."""
    recs = periodic.where(mask)
    share = recs.loop / recs.y
    return {
        "per_K": {str(int(K)): float(np.nanmedian(share[recs.K == K])) for K in np.unique(recs.K)},
        "n": len(recs),
        "metrics": _metrics(recs) if len(recs) else "",
        "what": "median t_iss_slowest / sender-visible time over the aligned periodic "
        "records whose steady-train law predicts backpressure (the stall check's records)",
    }


def capacity_law_explains_isolated(per_K: list[dict], law_Q: dict[int, float], law: str) -> dict:
    """Does the chosen capacity law, Q(K) = min(S + K q, C), meet each K's own knee? Each
    K's Q is fitted on its isolated bursts alone; the law passes where it lies inside every
    knee's interval (at least +-KNEE_TOLERANCE). With fewer than two K any law meets the
    knees, so nothing is tested."""
    knees = [k for k in per_K if k["Q_bytes"]["value"] is not None and k["K"] in law_Q]
    if len(knees) < 2:
        return not_evaluated("a knee Q fitted for fewer than two K")
    parts, off = [], []
    for k in knees:
        lo, hi = _ci(k["Q_bytes"], KNEE_TOLERANCE)
        Q = law_Q[k["K"]]
        line = (
            f"K={k['K']}: knee {k['Q_bytes']['value'] / MiB:.2f} MiB "
            f"({lo / MiB:.2f}-{hi / MiB:.2f}), law {Q / MiB:.2f}"
        )
        parts.append(line)
        if not lo <= Q <= hi:
            off.append(line)
    head = (
        f"the {law} law meets every K's knee within its CI (at least +-{KNEE_TOLERANCE:.0%})"
        if not off
        else f"the {law} law misses {len(off)} of {len(knees)} K's knees beyond their CIs "
        f"(at least +-{KNEE_TOLERANCE:.0%})"
    )
    return _check(not off, f"{head}: " + "; ".join(parts))


def r_matches_ceiling(R: dict, ceilings: dict) -> dict:
    """Is the fitted R within CEILING_TOLERANCE of the SM-store ceiling of its path, measured
    in the same run? `ceilings` is one path's block (fit._ceilings; files older than paths
    hold the peer's)."""
    path = ceilings.get("path", storepath.PEER)
    rates = ceiling_rates(ceilings, path)
    sm_store = rates.get("sm_store")
    far = storepath.far_end(path)
    if R.get("value") is None or sm_store is None:
        missing = (
            "no fitted R" if R.get("value") is None else f"no SM-store ceiling record to {far}"
        )
        return _check(None, f"not evaluated: {missing}")
    off = R["value"] / sm_store - 1
    others = ", ".join(f"{m} {v:.0f}" for m, v in rates.items() if m != "sm_store")
    line = line_rate(ceilings, path)
    detail = (
        f"R = {R['value']:.0f} GB/s (95% CI {R['ci_low'] or float('nan'):.0f}-"
        f"{R['ci_high'] or float('nan'):.0f}) vs the SM-store ceiling to {far}, "
        f"{sm_store:.0f} GB/s: "
        f"{off:+.1%} (tolerance {CEILING_TOLERANCE:.0%})"
    )
    if others:
        detail += f"; other {path} ceilings: {others} GB/s"
    if line:
        detail += f"; {LINE_NAME[path]} line rate {line:.0f} GB/s"
    return _check(abs(off) <= CEILING_TOLERANCE, detail)


def r_within_line_rate(
    R: dict, per_K: list[dict], line_rate_GBps: float | None, path: str = storepath.PEER
) -> dict:
    """No drain rate, pooled or per K, may exceed the line rate of its path's link."""
    if line_rate_GBps is None:
        return _check(None, f"not evaluated: {NO_LINE_RATE[path]}")
    values = [("pooled", R.get("value"))] + [(f"K={k['K']}", k["R_GBps"]["value"]) for k in per_K]
    values = [(name, v) for name, v in values if v is not None]
    if not values:
        return _check(None, "not evaluated: no fitted R")
    above = [f"{name}: {v:.0f}" for name, v in values if v > line_rate_GBps]
    listing = ", ".join(f"{name}: {v:.0f}" for name, v in values)
    link = LINE_NAME[path]
    if above:
        return _check(
            False,
            f"R above the {line_rate_GBps:.0f} GB/s {link} line rate (impossible): "
            + ", ".join(above),
        )
    return _check(
        True,
        f"every R at or below the {line_rate_GBps:.0f} GB/s {link} line rate: {listing} GB/s",
    )


def _group_line(name: str, g: dict) -> str:
    line = f"{name} {g['median_abs_rel_error']:.0%} (n={g['n']})"
    if g["all"]["n"] > g["n"]:
        line += f", all records {g['all']['median_abs_rel_error']:.0%} (n={g['all']['n']})"
    return line


def heldout_error_within_target(shared: dict, laws: dict[str, dict], fit_set: dict) -> dict:
    """Does the model (the chosen capacity law) predict held-out records of the fit set
    within both targets, median and p90 |relative error|? shared holds the chosen law's
    summaries (validation.summaries), laws each variant's held-out summary.

    The detail says by how much each target is met or missed, per metric, which aligned
    study/sync groups miss the median target, how each capacity variant does, and how the
    free-running records (validated apart) fare.
    """
    s = shared["validation_summary"]
    if not s["n"]:
        return not_evaluated("no held-out record was predicted")
    median, p90 = s["median_abs_rel_error"], s["p90_abs_rel_error"]
    what = "aligned" if "aligned" in fit_set.values() else "all"
    by_metric = ", ".join(
        f"{m} {v['median_abs_rel_error']:.1%} (n={v['n']})"
        for m, v in shared["validation_by_metric"].items()
        if v["n"]
    )
    parts = [
        f"held-out median |err| {median:.1%} vs target {TARGET_MEDIAN_ERROR:.0%}: "
        f"{_by(median, TARGET_MEDIAN_ERROR)}; p90 {p90:.1%} vs target "
        f"{TARGET_P90_ERROR:.0%}: {_by(p90, TARGET_P90_ERROR)} (n={s['n']} {what} records; "
        f"{by_metric})"
    ]
    groups = shared["validation_by_group"]
    over = [
        _group_line(name, g)
        for name, g in groups.items()
        if "/barrier:" in name
        and g["n"]
        and max(g["median_abs_rel_error"], g["all"]["median_abs_rel_error"]) > TARGET_MEDIAN_ERROR
    ]
    if over and what == "aligned":
        parts.append("aligned groups above target (held-out, then all records): " + "; ".join(over))
    variants = [
        f"{law} {v['median_abs_rel_error']:.1%} / {v['p90_abs_rel_error']:.1%}"
        for law, v in laws.items()
        if v["n"]
    ]
    if variants:
        parts.append(
            "capacity variants on this split, held-out median / p90: " + ", ".join(variants)
        )
    free = shared["validation_summary_free"]
    if free["n"]:
        parts.append(
            f"free-running records (never fitted): median |err| "
            f"{free['median_abs_rel_error']:.1%}, p90 {free['p90_abs_rel_error']:.1%} "
            f"(n={free['n']})"
        )
    return _check(median <= TARGET_MEDIAN_ERROR and p90 <= TARGET_P90_ERROR, "; ".join(parts))


def _by(value: float, target: float) -> str:
    if value <= target:
        return f"met by {(target - value) * 100:.1f} points"
    return f"missed by {(value - target) * 100:.1f} points"
