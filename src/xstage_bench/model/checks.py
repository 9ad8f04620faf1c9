"""Checks of the fitted Burst-Gap model: does the data agree with what the model assumes?

Each check is {"passed": bool | None, "detail": str}; passed is None where the data cannot
answer the question, and the detail always carries the numbers behind the verdict. A
check's name states the claim it tests, so passed = False means the claim is false here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from xstage_bench.data import storepath
from xstage_bench.data.stats import bootstrap_median_ci
from xstage_bench.model.document import ceiling_rates, line_rate
from xstage_bench.model.records import ISOLATED_KINDS, Recs, plateau

MiB = float(1 << 20)
SPLIT_CI_FLOOR = 0.01  # a K/B split's R interval is at least +-1% (clock and timer noise)
PLATEAU_TOLERANCE = 0.05  # issue time may vary 5% over the plateau gaps,
PLATEAU_FLOOR_US = 0.064  # or two ticks of the 32 ns %globaltimer, whichever is larger
ONE_Q_TOLERANCE = 0.10  # per-K Q within 10% of each other count as one Q
CEILING_TOLERANCE = 0.10  # R within 10% of the SM-store ceiling of its path
LINE_NAME = {storepath.PEER: "NVLink", storepath.HOST: "host link"}
NO_LINE_RATE = {
    storepath.PEER: "no line rate (the fit had no base profile)",
    storepath.HOST: "no host link line rate in the raw files' environment "
    "(host_links[0].line_rate_GBps; files older than the host path have none)",
}
TARGET_MEDIAN_ERROR = 0.05  # the held-out median |relative error| the model should reach
STALL_MARGIN = 1.2  # the steady-train law must exceed the isolated law by 20% to count
STALL_CARRIED = 0.8  # the store loop carries the stall if it takes 80% of the predicted time


def _check(passed: bool | None, detail: str) -> dict:
    """passed is None where the data cannot answer the question; the detail says why."""
    return {"passed": None if passed is None else bool(passed), "detail": detail}


def not_evaluated(why: str) -> dict:
    return _check(None, f"not evaluated: {why}")


def split_consistency(zg: Recs, R: float | None, T0: Callable | None) -> dict:
    """Do the K/B splits of one V drain at one R? Each split's V/period with its CI.

    R in bytes/us; T0(B) the fitted backpressure-free issue time (None: not fitted).
    """
    if R is None:
        return _check(None, "not evaluated: no R")
    drain_bound = zg.V / R > 1.2 * (T0(zg.B) if T0 is not None else 0.0)
    recs = zg.where(drain_bound)
    order = np.argsort(recs.V)
    groups: list[list[int]] = []
    for j in order:  # V within 1% is one V (each split rounds V to K*B)
        if groups and recs.V[j] <= recs.V[groups[-1][0]] * 1.01:
            groups[-1].append(j)
        else:
            groups.append([j])
    lines, bad = [], []
    for g in groups:
        if len(set(recs.K[g])) < 2:
            continue
        lows, highs, parts, rates = [], [], [], []
        for j in g:
            lo, hi = bootstrap_median_ci(recs.samples[j])
            R_j = recs.V[j] / recs.y[j] / 1e3
            lows.append(min(recs.V[j] / hi / 1e3, R_j * (1 - SPLIT_CI_FLOOR)))
            highs.append(max(recs.V[j] / lo / 1e3, R_j * (1 + SPLIT_CI_FLOOR)))
            parts.append(f"K={recs.K[j]:g} ({recs.study[j]}): {R_j:.0f}")
            rates.append(R_j)
        agree = max(lows) <= min(highs)
        spread = (max(rates) - min(rates)) / np.median(rates)
        line = f"V={recs.V[g[0]] / MiB:.0f} MiB ({spread:.0%}): " + ", ".join(parts)
        lines.append(line)
        if not agree:
            bad.append(line)
    if not lines:
        return _check(None, "not evaluated: no V was measured with two K/B splits at G=0")
    if bad:
        return _check(
            False,
            f"{len(bad)} of {len(lines)} V disagree beyond their CIs (GB/s per split, "
            "spread in brackets): " + "; ".join(bad),
        )
    return _check(True, f"{len(lines)} V, every K/B split within CIs (GB/s): " + "; ".join(lines))


def t0_plateau_flat(periodic: Recs, R: float | None) -> dict:
    """Is the issue time flat over the gaps that drain the whole burst?"""
    if R is None:
        return _check(None, "not evaluated: no R")
    plat = plateau(periodic, R)
    spreads = []
    for name in sorted(set(plat.series)):
        y = plat.y[[s == name for s in plat.series]]
        if y.size >= 2:
            # (excess over the tolerance, relative spread, absolute spread, series, gaps)
            rel, width = (y.max() - y.min()) / np.median(y), y.max() - y.min()
            excess = min(rel - PLATEAU_TOLERANCE, width - PLATEAU_FLOOR_US)
            spreads.append((excess, rel, width, name, y.size))
    if not spreads:
        return _check(None, "not evaluated: no series with two gaps beyond V/R")
    excess, rel, width, name, n = max(spreads)
    return _check(
        excess <= 0,
        f"{len(spreads)} series; the least flat spreads {rel:.1%} ({width * 1e3:.0f} ns) over "
        f"the plateau ({name}, {n} gaps); tolerance {PLATEAU_TOLERANCE:.0%} or "
        f"{PLATEAU_FLOOR_US * 1e3:.0f} ns (two timer ticks), whichever is larger",
    )


def stall_in_store_loop(
    periodic: Recs, period: Recs, T0: np.ndarray, periodic_law: np.ndarray, isolated_law: np.ndarray
) -> dict:
    """Where the steady-train law max(T0, V/R - G) predicts backpressure that an isolated
    burst of the same size would not meet, does the store loop of an aligned train stall?

    T0, periodic_law and isolated_law are the fitted laws' times for the periodic records
    (the isolated law with each K's own Q); period (the same records' period_us) shows
    where the time went instead: period - G is the store loop plus the wait before the
    next burst.
    """
    mask = (
        periodic.aligned & (isolated_law <= STALL_MARGIN * T0) & (periodic_law > STALL_MARGIN * T0)
    )
    if not mask.any():
        return not_evaluated(
            "no aligned periodic record where the steady-train law predicts backpressure "
            "and an isolated burst of the same size none"
        )
    recs, law = periodic.where(mask), periodic_law[mask]
    loop = recs.y / law
    low = int(np.argmin(loop))
    detail = (
        f"{len(recs)} aligned periodic records whose burst fits the K's Q but not the gap "
        f"(max(T0, V/R - G) over {STALL_MARGIN:g} x T0): the store loop took a median "
        f"{np.median(loop):.0%} of the predicted issue time (lowest: K={recs.K[low]:g}, "
        f"V={recs.V[low] / MiB:.0f} MiB, G={recs.G[low]:g} us: {recs.y[low]:.2f} of "
        f"{law[low]:.2f} us)"
    )
    periods = dict(zip(period.ids, period.y, strict=True))
    sender = [
        (periods[i] - G) / t for i, G, t in zip(recs.ids, recs.G, law, strict=True) if i in periods
    ]
    carried = np.median(loop) >= STALL_CARRIED
    if sender:
        detail += (
            f"; period - G (store loop plus the wait before the next burst) came to a median "
            f"{np.median(sender):.0%} of it"
        )
        if not carried and np.median(sender) >= STALL_CARRIED:
            detail += (
                ": the backpressure moved out of the store loop into the wait between bursts "
                "(with sync=barrier, the grid barrier), consistent with a barrier that completes "
                "only once the previous burst has drained"
            )
    return _check(carried, detail)


def one_Q(per_K: list[dict]) -> dict:
    """Does one Q explain the isolated bursts of every K, or does Q grow with K?"""
    qs = [(k["K"], k["Q_bytes"]) for k in per_K if k["Q_bytes"]["value"] is not None]
    if len(qs) < 2:
        return _check(None, "not evaluated: Q fitted for fewer than two K")
    values = np.array([q["value"] for _, q in qs])
    lows = [q["ci_low"] if q["ci_low"] is not None else q["value"] for _, q in qs]
    highs = [q["ci_high"] if q["ci_high"] is not None else q["value"] for _, q in qs]
    spread = (values.max() - values.min()) / np.median(values)
    listing = ", ".join(
        f"K={K}: {q['value'] / MiB:.2f} MiB ({q['value'] / K / 1024:.1f} KiB per producer)"
        for K, q in qs
    )
    if max(lows) <= min(highs) or spread <= ONE_Q_TOLERANCE:
        return _check(True, f"one Q within CIs or {ONE_Q_TOLERANCE:.0%}: {listing}")
    grows = bool(np.all(np.diff(values) > 0))
    hint = (
        " Q grows with K: compare the per-producer window (per_producer_Q_fits_better)."
        if grows
        else ""
    )
    return _check(False, f"per-K Q disagree (spread {spread:.0%}): {listing}.{hint}")


def _median_abs(rows: list[dict], key: str) -> tuple[float | None, int]:
    errors = np.abs([r[key] for r in rows if r[key] is not None])
    return (float(np.median(errors)) if errors.size else None), int(errors.size)


def per_producer_Q_fits_better(rows: list[dict]) -> dict:
    """Does a per-producer window (Q = K*q) predict held-out bursts better than one Q?

    Judged on the held-out isolated bursts of the fit set (where Q acts); the detail adds
    every held-out record of the fit set and the free-running ones.
    """
    fit_held = [r for r in rows if r["held_out"] and r["in_fit_set"]]
    scopes = (
        ("isolated bursts", [r for r in fit_held if r["kind"] in ISOLATED_KINDS]),
        ("all fitted records", fit_held),
        ("free-running records", [r for r in rows if not r["in_fit_set"] and not r["aligned"]]),
    )
    parts, verdict = [], None
    for i, (name, scope) in enumerate(scopes):
        shared, n = _median_abs(scope, "rel_error")
        window, _ = _median_abs(scope, "rel_error_window")
        if shared is None or window is None:
            continue
        parts.append(f"{name} (n={n}): shared Q {shared:.1%}, per-producer q {window:.1%}")
        if i == 0:
            verdict = window < shared
    if verdict is None:
        return _check(None, "not evaluated: no held-out isolated burst with both predictions")
    better = "the per-producer window" if verdict else "the shared Q"
    return _check(
        verdict,
        f"{better} fits the held-out isolated bursts better; median |err|: " + "; ".join(parts),
    )


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


def heldout_error_within_target(shared: dict, window: dict, fit_set: dict) -> dict:
    """Does the model (shared Q) predict held-out records of the fit set within the target
    median error? shared and window are the two variants' summaries (validation.summaries).

    The detail says by how much the target is met or missed, per metric, which aligned
    study/sync groups miss it, how the per-producer window does, and how the free-running
    records (validated apart) fare.
    """
    s = shared["validation_summary"]
    if not s["n"]:
        return not_evaluated("no held-out record was predicted")
    median = s["median_abs_rel_error"]
    what = "aligned" if "aligned" in fit_set.values() else "all"
    by_metric = ", ".join(
        f"{m} {v['median_abs_rel_error']:.1%} (n={v['n']})"
        for m, v in shared["validation_by_metric"].items()
        if v["n"]
    )
    verdict = (
        f"met by {(TARGET_MEDIAN_ERROR - median) * 100:.1f} points"
        if median <= TARGET_MEDIAN_ERROR
        else f"missed by {(median - TARGET_MEDIAN_ERROR) * 100:.1f} points"
    )
    parts = [
        f"held-out median |err| {median:.1%} (p90 {s['p90_abs_rel_error']:.1%}, n={s['n']} "
        f"{what} records; {by_metric}) vs target {TARGET_MEDIAN_ERROR:.0%}: {verdict}"
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
    w = window["validation_summary"]
    if w["n"]:
        parts.append(
            f"per-producer window variant: held-out median |err| {w['median_abs_rel_error']:.1%} "
            f"(p90 {w['p90_abs_rel_error']:.1%})"
        )
    free = shared["validation_summary_free"]
    if free["n"]:
        parts.append(
            f"free-running records (never fitted): median |err| "
            f"{free['median_abs_rel_error']:.1%}, p90 {free['p90_abs_rel_error']:.1%} "
            f"(n={free['n']})"
        )
    return _check(median <= TARGET_MEDIAN_ERROR, "; ".join(parts))
