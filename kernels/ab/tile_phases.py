"""Where our kernel's time goes, tile by tile, from its traced build's stamps.

    PYTHONPATH=src:kernels python3 kernels/ab/tile_phases.py --config config/reference-h200x1.yaml \
        --dataset ab --precisions w8a8 --routings balanced --tokens 16384 --out phases.json

Each selected configuration (expert waves, every combine row local) runs the TRACE build
once after its check. Per tile the build stamps when the producer took it, when its row
block was ready (Linear-2), when both math warpgroups finished its MMAs (mma_done) and
their last store (store_end). On one CTA, the math warpgroups start a tile when they end
the one before, so per tile:

- MMA phase = mma_done - the previous tile's store_end (the CTA's first tile: from the
  earliest take of the launch): its step loops, with the waits for its first slots;
- epilogue = store_end - mma_done (SwiGLU, quantization and the intermediate's stores, or
  the combine stores), during which neither warpgroup issues an MMA;
- tail = the launch's last store_end - the CTA's last store_end.

Every tile of a kind has the same steps (Linear-1: 2 H / 128, Linear-2: I / 128), so
the MMA phase is split by the tiles that waited least: the 10th percentile of a kind's
MMA phase per step is taken as a step's own time, and the rest of each phase as its
per-tile overhead (the first slots' waits, the first scales' loads). The shares of the
CTAs' summed time printed and written are these parts; they are timestamps of a traced
build (two atomics and a few stores a tile more than the timed build), so a development
record, not a dataset.
"""

import json
import sys
from pathlib import Path

import numpy as np

from xstage_bench.data.results import atomic_write_text
from xstage_bench.measurement.environment import capture_measured
from xstage_bench.megamoe import schedule
from xstage_kernels.formats import TRACE_FIELDS

BLOCK = 128
STEADY_PERCENTILE = 10  # of a kind's MMA phase per step: its tiles that waited least


def traced_stamps(measurer, point: dict) -> tuple[np.ndarray, np.ndarray, dict]:
    """(stamps [tile, 6] in ns, tile list [tile, 4], check facts) of rank 0, after the
    check (the warm-up) ran the traced build. A build that fails its check (a diagnostic
    build, --set) is still traced: its facts say it failed."""
    from xstage_bench.measurement.protocol import PointFailed

    prob = measurer.problem(point)
    key = prob.arm(point)
    bufs = [
        measurer.torch.zeros(
            rb.tiles[key].shape[0], len(TRACE_FIELDS), dtype=measurer.torch.int64, device=d
        )
        for rb, d in zip(prob.ranks, measurer.devices, strict=True)
    ]
    try:
        facts = measurer.checked(point, trace=bufs)
    except PointFailed as failed:
        facts = {"check": f"failed ({failed}): timing only"}
    for b in bufs:
        b.zero_()
    prob.forward(key, local=False, trace=bufs)
    prob.synchronize()
    return bufs[0].cpu().numpy(), prob.ranks[0].tiles[key].cpu().numpy(), facts


def phases(stamps: np.ndarray, tiles: np.ndarray, H: int, I: int) -> dict:  # noqa: E741
    """The breakdown above, in us, from one rank's stamps and tile list."""
    us = 1e-3
    program, taken, ready, mma_done, store_end = (
        stamps[:, TRACE_FIELDS.index(name)].astype(np.float64)
        for name in ("program", "taken", "ready", "mma_done", "store_end")
    )
    kind = tiles[:, 0]
    steps = np.where(kind == schedule.L1, 2 * H // BLOCK, I // BLOCK)
    t0, t_end = taken.min(), store_end.max()
    mma = np.zeros(len(tiles))
    tail = []
    programs = np.unique(program)
    for cta in programs:
        mine = np.flatnonzero(program == cta)
        mine = mine[np.argsort(taken[mine])]
        before = np.concatenate([[t0], store_end[mine[:-1]]])
        mma[mine] = mma_done[mine] - before
        tail.append(t_end - store_end[mine[-1]])
    epilogue = store_end - mma_done
    out: dict = {"kernel_us": (t_end - t0) * us, "programs": len(programs)}
    total = out["programs"] * (t_end - t0)
    parts = {"tail": float(np.sum(tail))}
    for k, name in ((schedule.L1, "L1"), (schedule.L2, "L2")):
        sel = kind == k
        if not sel.any():
            continue
        x, y = steps[sel].astype(np.float64), mma[sel]
        slope = float(np.percentile(y / x, STEADY_PERCENTILE))
        parts[f"{name} steps"] = float(slope * x.sum())
        parts[f"{name} per-tile MMA overhead"] = float(y.sum() - slope * x.sum())
        parts[f"{name} epilogue"] = float(epilogue[sel].sum())
        out[name] = {
            "tiles": int(sel.sum()),
            "steps_per_tile": int(np.median(x)),
            "us_per_step": slope * us,
            "mma_phase_us_median": float(np.median(y)) * us,
            "epilogue_us_median": float(np.median(epilogue[sel])) * us,
        }
        if k == schedule.L2:
            out[name]["ready_minus_taken_us_median"] = (
                float(np.median(ready[sel] - taken[sel])) * us
            )
    out["shares"] = {name: value / total for name, value in parts.items()}
    return out


def main(argv) -> int:
    from xstage_bench.measurement import launch_option
    from xstage_kernels import megamoe_ws

    out_path = None
    while "--set" in argv:  # NAME=v: a launch option for every configuration
        at = argv.index("--set")
        try:
            name, value = launch_option.fixed(argv[at + 1], megamoe_ws)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        setattr(megamoe_ws, name, value)
        argv = argv[:at] + argv[at + 2 :]
    if "--out" in argv:
        at = argv.index("--out")
        out_path = Path(argv[at + 1])
        argv = argv[:at] + argv[at + 2 :]
    import one_gpu  # this folder; torch and a GPU

    results = []
    for measurer, point, _ in one_gpu.configurations(argv, __doc__):
        stamps, tiles, facts = traced_stamps(measurer, point)
        got = phases(stamps, tiles, point["H"], point["I"])
        results.append({"id": point["id"], "point": point, "check": facts, **got})
        shares = ", ".join(f"{k} {v:.3f}" for k, v in got["shares"].items())
        per_step = ", ".join(
            f"{k} {got[k]['us_per_step']:.3f} us/step" for k in ("L1", "L2") if k in got
        )
        print(f"{point['id']}: kernel {got['kernel_us']:.1f} us; {per_step}; {shares}", flush=True)
    if out_path is not None:
        doc = {
            "what": "traced build's per-tile phases of our kernel (kernels/ab/tile_phases.py)",
            "environment": capture_measured(),
            "launch_options": {n: getattr(megamoe_ws, n) for n in megamoe_ws.LAUNCH_OPTIONS},
            "results": results,
        }
        atomic_write_text(out_path, json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
