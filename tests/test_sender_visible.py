"""Which time an aligned periodic record is fitted on (model/sender_visible.py): the
measured sender-visible time where a record has it, else one derived from its period
with the barrier's cost learnt from the drained gaps, else the store loop; and records of
another next operation never enter a fit."""

import numpy as np
import pytest

from xstage_bench.model import sender_visible
from xstage_bench.model.records import load

R0 = 1000.0  # bytes/us: a gap of 2 V / R0 drains a burst twice over


def record(V, G, period, loop, study="gap_sweep_barrier", **extra) -> dict:
    point = {"study": study, "K": 4, "V": V, "gap_us": G, "kind": "periodic", "sync": "barrier"}
    samples = {"period_us": [period] * 3, "t_iss_slowest_us": [loop] * 3, **extra}
    return {"point": point, "samples": samples}


def test_a_measured_sender_visible_time_is_used_as_it_is():
    r = record(1000, 0.0, 5.0, 0.3, t_vis_slowest_us=[1.0, 1.1, 1.2])
    samples, metric = sender_visible.samples(r, sender_visible.barrier_cost([r], R0))
    assert metric == "t_vis_slowest_us" and samples.tolist() == [1.0, 1.1, 1.2]


def test_the_derived_time_is_the_period_less_the_gap_and_the_barriers_cost():
    # The series drains at G >= 2 us; there the barrier costs 0.5 us + 1% of the gap.
    series = [record(1000, G, G + 0.3 + 0.5 + 0.01 * G, 0.3) for G in (2.0, 10.0, 100.0)]
    held = record(1000, 0.0, 1.5, 0.3)  # its period says the sender was held ~0.7 us
    cost = sender_visible.barrier_cost([*series, held], R0)
    assert cost["n_drained"] == 3 and cost["pooled"] == pytest.approx((0.5, 0.01))
    samples, metric = sender_visible.samples(held, cost)
    assert metric == "t_vis_derived_us" and samples == pytest.approx([1.0] * 3)
    # on the drained gaps it is the store loop again: nothing was held there
    samples, _ = sender_visible.samples(series[-1], cost)
    assert samples == pytest.approx([0.3] * 3)
    # never below the store loop, whatever the period
    fast = record(1000, 0.0, 0.1, 0.3)
    assert sender_visible.samples(fast, cost)[0] == pytest.approx([0.3] * 3)


def test_a_series_without_two_drained_gaps_takes_the_pooled_line():
    own = [record(1000, G, G + 0.3 + 2.0, 0.3, study="a") for G in (2.0, 4.0)]
    other = record(1000, 0.0, 3.0, 0.3, study="b")  # no drained gap of its own
    cost = sender_visible.barrier_cost([*own, other], R0)
    assert set(cost["series"]) == {"a/K=4/V=1000"}
    assert sender_visible.samples(other, cost)[0] == pytest.approx([1.0] * 3)  # 3 - 2


def test_without_a_drained_record_the_store_loop_is_kept_and_said():
    lone = record(1000, 0.0, 5.0, 0.3)
    cost = sender_visible.barrier_cost([lone], R0)
    samples, metric = sender_visible.samples(lone, cost)
    assert metric == "t_iss_slowest_us" and samples.tolist() == [0.3] * 3
    block = sender_visible.describe(cost, [metric])
    assert block == {
        "records_per_metric": {"t_vis_slowest_us": 0, "t_vis_derived_us": 0, "t_iss_slowest_us": 1}
    }
    derived = sender_visible.describe(
        sender_visible.barrier_cost([record(1000, 10.0, 10.8, 0.3)], R0), ["t_vis_derived_us"]
    )
    assert "needs a new run" in derived["note"] and derived["barrier_cost"]["drained_records"] == 1


def raw(points_samples) -> dict:
    """One microbench document of ok records (not validated: load takes documents)."""
    records = [
        {"id": f"r{j}", "status": "ok", "point": p, "samples": s}
        for j, (p, s) in enumerate(points_samples)
    ]
    return {"experiment": "microbench", "backend": "cuda", "environment": {}, "records": records}


def test_records_of_another_next_operation_never_enter_a_fit():
    base = {"K": 4, "V": 4096, "B": 1024, "gap_us": 0.0, "kind": "periodic", "dest": "peer"}
    samples = {"t_iss_slowest_us": [1.0], "period_us": [5.0]}
    doc = raw(
        [
            (base, samples),  # written before next_op existed: the default kernel
            ({**base, "next_op": "none"}, samples),
            ({**base, "next_op": "atomic"}, samples),
        ]
    )
    loaded = load({"x.json": doc}, "peer")
    assert loaded.counts["used"] == 2 and loaded.counts["other_stores"] == 1
    assert loaded.fit.periodic.ids == ("r0", "r1")
    assert np.all(loaded.fit.periodic.metric == np.array(["t_iss_slowest_us"] * 2))
