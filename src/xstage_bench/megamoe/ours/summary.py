"""What a MegaMoE run's numbers say: the traced runs' per-tile waits, store spans and
timeline, and the short table a finished sweep prints (`print_summary`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from xstage_bench.data.stats import geomean
from xstage_bench.megamoe import schedule
from xstage_bench.megamoe.points import config_id
from xstage_kernels.formats import TRACE_FIELDS

NS_PER_US = 1000.0


def linear2_waits(stamps: list[np.ndarray], tiles: list[np.ndarray]) -> list[float]:
    """Every Linear-2 tile's wait for its row block (ready - taken), all ranks, us."""
    waits: list[float] = []
    for s, t in zip(stamps, tiles, strict=True):
        l2 = t[:, 0] == schedule.L2
        waits += ((s[l2, 2] - s[l2, 1]) / NS_PER_US).tolist()
    return waits


def trace_summary(
    stamps: list[np.ndarray], tiles: list[np.ndarray], keep_timeline: bool
) -> tuple[list[float], dict]:
    """Store spans of every Linear-2 tile (all ranks, us) and the run's facts; with
    keep_timeline, rank 0's [program, L1|L2, start, end, store_start, store_end] rows in
    us from its first tile (store stamps only for Linear-2 tiles)."""
    spans: list[float] = []
    kernel_us = []
    for s, t in zip(stamps, tiles, strict=True):
        if len(s) == 0:
            continue
        l2 = t[:, 0] == schedule.L2
        spans += ((s[l2, 5] - s[l2, 4]) / NS_PER_US).tolist()
        kernel_us.append((s[:, 5].max() - s[:, 1].min()) / NS_PER_US)
    extra: dict = {
        "time_us": float(max(kernel_us)) if kernel_us else 0.0,
        "stamp_fields": list(TRACE_FIELDS),
        "wait_us_median": [
            float(
                np.median((s[t[:, 0] == schedule.L2, 2] - s[t[:, 0] == schedule.L2, 1]) / NS_PER_US)
            )
            if (t[:, 0] == schedule.L2).any()
            else 0.0
            for s, t in zip(stamps, tiles, strict=True)
        ],
    }
    if keep_timeline and len(stamps[0]):
        s, t = stamps[0], tiles[0]
        t0 = s[:, 1].min()

        def us(v):
            return round(float(v - t0) / NS_PER_US, 4)

        extra["timeline"] = [
            [
                int(row[0]),
                "L1" if kind == schedule.L1 else "L2",
                us(row[1]),
                us(row[5]),
                us(row[4]) if kind == schedule.L2 else None,
                us(row[5]) if kind == schedule.L2 else None,
            ]
            for row, kind in zip(s.tolist(), t[:, 0].tolist(), strict=True)
        ]
    return spans, extra


def _median(r: dict | None) -> float | None:
    return r["summary"]["time_us"]["median"] if r is not None and r["status"] == "ok" else None


def print_lead_row(cid: str, recs: dict, wave: dict | None) -> None:
    """One line of the lead map: each swept lead's speedup over expert waves (the
    configuration's own expert-wave arm), and the lead 'auto' chose."""
    base = _median(recs.get("wave") or wave)
    cells = []
    for label, r in recs.items():
        if label == "wave":
            continue
        t = _median(r)
        shown = f"{base / t:.3f}" if base and t else r["status"]
        chosen = (
            f"({r['point']['lead_rows']})" if label == "auto" and "lead_rows" in r["point"] else ""
        )
        cells.append(f"lead={label}{chosen} {shown}")
    print(f"lead map {cid}: " + ", ".join(cells))


def print_summary(out: str | Path, trace_out: str | Path | None = None) -> None:
    """A short table of a raw megamoe file (and its trace file): per configuration our two
    schedules' median times and speedup, the baselines' times, our wave kernel's TFLOP/s;
    then the totals: our speedup and our best time over each baseline's best (geomeans)."""
    from xstage_bench.data.results import read_raw

    doc = read_raw(out)
    by_config: dict[str, dict] = {}
    leads: dict[str, dict] = {}  # the lead map: config id -> {lead label: record}
    for r in doc["records"]:
        if r["point"].get("lead_sweep"):
            cid = config_id(r)
            label = "wave" if r["point"]["schedule"] == schedule.WAVE else r["id"].rsplit("=", 1)[1]
            leads.setdefault(cid, {})[label] = r
            continue
        key = (r["point"].get("variant") or "ours", r["point"]["schedule"])
        cid = config_id({"id": r["id"], "variant": r["point"].get("variant")})
        by_config.setdefault(cid, {})[key] = r
    columns = [
        ("wave us", ("ours", schedule.WAVE)),
        ("inter us", ("ours", schedule.INTERLEAVED)),
        ("unfused", ("unfused", "unfused")),
        ("dg wave", ("deepgemm", schedule.WAVE)),
        ("dg lag", ("deepgemm", schedule.INTERLEAVED)),
        ("fi", ("flashinfer", "flashinfer")),
    ]
    print(
        f"{'configuration':50s} "
        + " ".join(f"{name:>9s}" for name, _ in columns)
        + f" {'speedup':>7s} {'TFLOP/s':>7s} {'rel err':>8s}"
    )
    speedups, ratios = [], {"unfused": [], "deepgemm": [], "flashinfer": []}
    for cid, recs in by_config.items():
        cells = {}
        for name, key in columns:
            r = recs.get(key)
            ok = r is not None and r["status"] == "ok"
            cells[name] = r["summary"]["time_us"]["median"] if ok else None
        shown = [f"{cells[n]:9.1f}" if cells[n] else f"{'-':>9s}" for n, _ in columns]
        speed = (
            cells["wave us"] / cells["inter us"] if cells["wave us"] and cells["inter us"] else None
        )
        if speed:
            speedups.append(speed)
        ours = min((c for c in (cells["wave us"], cells["inter us"]) if c), default=None)
        bases = (
            ("unfused", ["unfused"]),
            ("deepgemm", ["dg wave", "dg lag"]),
            ("flashinfer", ["fi"]),
        )
        for base, names in bases:
            best = min((cells[n] for n in names if cells[n]), default=None)
            if ours and best:
                ratios[base].append(ours / best)
        wave = recs.get(("ours", schedule.WAVE))
        tflops = wave["extra"]["tflops"] if wave and wave["status"] == "ok" else None
        err = max((wave.get("extra") or {}).get("rel_error", [math.nan])) if wave else math.nan
        status = ",".join(sorted({r["status"] for r in recs.values() if r["status"] != "ok"}))
        print(
            f"{cid:50s} {' '.join(shown)} "
            f"{(f'{speed:7.3f}' if speed else '      -')} "
            f"{(f'{tflops:7.0f}' if tflops else '      -')} {err:8.1e} {status}"
        )
    if speedups:
        s = np.asarray(speedups)
        print(
            f"speedup interleaved/wave over {len(s)} configs: geomean "
            f"{geomean(s):.3f} median {np.median(s):.3f} "
            f"min {s.min():.3f} max {s.max():.3f}"
        )
    for base, values in ratios.items():
        if values:
            v = np.asarray(values)
            print(
                f"our best time / {base} best time over {len(v)} configs: geomean "
                f"{geomean(v):.3f} min {v.min():.3f} max {v.max():.3f}"
            )
    for cid, recs in leads.items():
        print_lead_row(cid, recs, by_config.get(cid, {}).get(("ours", schedule.WAVE)))
    if trace_out is not None and Path(trace_out).exists():
        for r in read_raw(trace_out)["records"]:
            spans = (r.get("samples") or {}).get("store_span_us")
            text = (
                (
                    f"store span median {np.median(spans):.2f} us p90 "
                    f"{np.percentile(spans, 90):.2f} us n={len(spans)}"
                )
                if spans
                else ""
            )
            print(f"trace {r['id']}: {r['status']} {text} {r.get('error') or ''}")
