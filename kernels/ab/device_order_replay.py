"""What deciding the interleaved order on the GPU costs: its claims, or the order they realize.

    PYTHONPATH=src:kernels python3 kernels/ab/device_order_replay.py \
        --config config/reference-h200x1.yaml --dataset ab --routings balanced \
        --precisions w4a8,w8a8 --shapes qwen3.5-397b-a17b,hy3-295b-a21b \
        --tokens 1024,4096,16384 --out replay.json

Per configuration (every combine row local), three arms in paired rounds: the interleaved
host list (list mode), the same schedule decided by the kernel's programs (device mode), and
the order that device run realized, replayed as a list (list mode). Each is checked first
(the replay: outputs bit-equal to the list's, no error flag). replay / device is what the
device claims cost with the order held fixed; list / replay what the realized order costs
against the host's. Kernel time (kernel_us), medians of per-round ratios, geomeans last.
With --trace, one traced run of each arm after the timing: per program, the gap from a
tile's last store to the program's next tile taken (`claim_gaps`), where a costlier claim
shows.
"""

import argparse
import json
import statistics

import numpy as np

from xstage_bench.data import stats
from xstage_bench.data.grid import DEVICE, LIST
from xstage_bench.measurement import timing
from xstage_bench.measurement.environment import capture_measured, finish
from xstage_bench.megamoe.kernel_ab import local_configs
from xstage_bench.megamoe.options import add_grid_arguments, megamoe_policy, selected_grid
from xstage_bench.megamoe.ours.measurer import MoEMeasurer
from xstage_bench.megamoe.runner import default_devices, measured_paths

REPLAY = "replay"  # the tile-list key of the realized order
RATIOS = (("list", "device"), ("replay", "device"), ("list", "replay"))
PROGRAM, TAKEN, STORE_END = 0, 1, 5  # columns of a trace (xstage_kernels.formats.TRACE_FIELDS)


def claim_gaps(stamps: np.ndarray) -> dict:
    """Per program, the time (us) from each tile's last store to its next tile taken, over
    every program of a traced run (ns stamps): median, p90 and sum, and the run's span."""
    gaps = []
    for program in np.unique(stamps[:, PROGRAM]):
        rows = stamps[stamps[:, PROGRAM] == program]
        rows = rows[np.argsort(rows[:, TAKEN])]
        gaps.append((rows[1:, TAKEN] - rows[:-1, STORE_END]) / 1e3)
    every = np.concatenate(gaps) if gaps else np.zeros(0)
    span = (stamps[:, STORE_END].max() - stamps[:, TAKEN].min()) / 1e3 if len(stamps) else 0.0
    return {
        "gap_us_median": float(np.median(every)) if every.size else 0.0,
        "gap_us_p90": float(np.percentile(every, 90)) if every.size else 0.0,
        "gap_us_sum": float(every.sum()),
        "span_us": float(span),
        "tiles": int(len(stamps)),
    }


def traced_gaps(prob, key: str) -> dict:
    """claim_gaps of rank 0 in one traced run of tile list `key` (after a traced warm-up,
    which also compiles the traced build)."""
    bufs = prob.trace_buffers(key)
    for _ in range(2):
        for b in bufs:
            b.zero_()
        prob.forward(key, trace=bufs)
        prob.synchronize()
    stamps, _ = prob.traced(key, bufs)
    return claim_gaps(stamps[0].astype(np.int64))


def replay_matches_list(prob, list_key: str) -> bool:
    """Whether the replayed order computes the list's outputs bit for bit, with no error."""
    prob.poison()
    prob.forward(list_key)
    prob.synchronize()
    want = [o.clone() for o in prob.checked_outputs()]
    prob.poison()
    prob.forward(REPLAY)
    prob.synchronize()
    same = all(bool((g == w).all()) for g, w in zip(prob.checked_outputs(), want, strict=True))
    return same and not any(prob.error_flags())


def compare(measurer, policy, device_index, listed: dict, decided: dict, trace=False) -> dict:
    prob = measurer.problem(listed)
    record = {"id": listed["id"], "checks": {}}
    for name, point in (("list", listed), ("device", decided)):
        record["checks"][name] = measurer.check(point)[0]
    keys = {"list": prob.arm(listed), "device": prob.arm(decided), REPLAY: REPLAY}
    for rank in prob.ranks:  # the order the device check's run realized
        rank.tiles[REPLAY] = rank.claimed(keys["device"]).clone()
    record["checks"]["replay_equals_list"] = replay_matches_list(prob, keys["list"])
    events = {name: [] for name in keys}

    def timer(name):
        def run():
            prob.forward(keys[name], kernel_events=events[name], flushers=measurer.flushers)

        lead = timing.host_lead(policy)
        return timing.cuda_event_timer(
            run, device=device_index, flush_l2=policy.flush_l2, lead=lead
        )

    samples = timing.measure_paired({name: timer(name) for name in keys}, policy)
    kernel_us = {n: timing.slowest_rank_us(events[n], len(samples[n])) for n in keys}
    record["kernel_us"] = kernel_us
    for a, b in RATIOS:
        pairs = zip(kernel_us[a], kernel_us[b], strict=True)
        record[f"{a}_over_{b}"] = statistics.median(x / y for x, y in pairs)
    if trace:
        record["trace"] = {name: traced_gaps(prob, keys[name]) for name in ("device", REPLAY)}
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_grid_arguments(parser)
    parser.add_argument("--out", required=True)
    parser.add_argument("--lead", type=int, default=1024, help="interleaved's lead_rows")
    parser.add_argument("--trace", action="store_true", help="also claim_gaps of a traced run")
    args = parser.parse_args()
    config, moe = selected_grid(args)
    devices = default_devices(config, None, "cuda")
    policy = megamoe_policy(config, moe)
    measurer = MoEMeasurer(moe, policy, devices)
    paths = measured_paths(config, 1)
    listed = local_configs(moe, 1, paths, LIST, "interleaved", args.lead)
    decided = local_configs(moe, 1, paths, DEVICE, "interleaved", args.lead)
    doc = {"what": __doc__.split("\n\n")[0], "environment": capture_measured("cuda"), "results": []}
    for point_list, point_device in zip(listed, decided, strict=True):
        record = compare(measurer, policy, devices[0].index, point_list, point_device, args.trace)
        doc["results"].append(record)
        finish(doc["environment"])
        with open(args.out, "w") as f:
            json.dump(doc, f)
        ratios = " ".join(f"{a}/{b} {record[f'{a}_over_{b}']:.3f}" for a, b in RATIOS)
        print(f"{record['id']}: {ratios} checks {record['checks']}", flush=True)
        for name, gaps in record.get("trace", {}).items():
            print(f"   {name} traced: {gaps}", flush=True)
    for a, b in RATIOS:
        values = [r[f"{a}_over_{b}"] for r in doc["results"]]
        print(f"{a}/{b} geomean {stats.geomean(values):.3f}")


if __name__ == "__main__":
    main()
