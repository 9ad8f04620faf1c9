"""The compute-emulated MegaMoE sweep (the kernel with its compute replaced by calibrated
waits, megamoe/emulated.py) as a frame: expert-wave over interleaved per path, shape,
emulated rate and share f; and the rate X at which a path reaches the paper's
compute-to-drain ratio, from the dataset's fitted drain rate R.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from xstage_bench.data import layout, storepath
from xstage_bench.megamoe.schedule import COMPARED, INTERLEAVED, WAVE
from xstage_bench.report import paper
from xstage_bench.report.analysis import fitted
from xstage_bench.report.analysis.load import NoDataError, optional_model_doc, raw_doc
from xstage_bench.report.analysis.megamoe import (
    LAYER,
    config_fields,
    ordered_paths,
    ratio_columns,
)

EMULATED_KEYS = (
    "path",
    "shape",
    "tokens_per_rank",
    "world_size",
    "emulated_tflops",
    "remote_fraction",
)


def emulated_speedups(doc: dict) -> pd.DataFrame:
    """Per (path, shape, X, f) of the emulated sweep: expert-wave over interleaved time in
    each metric the records have (ratio_columns: medians, ratio, CI, verdict, noisy), and
    the rate the expert-wave run achieved (`wave_equivalent_tflops`) where recorded. On
    the host path f is the host share; 0 is the local control on every path."""
    runs: dict[tuple, dict[str, dict]] = {}
    for record in doc["records"]:
        point = record["point"]
        if record["status"] != "ok" or point.get("schedule") not in COMPARED:
            continue
        if not (record.get("samples") or {}).get(LAYER.sample):
            continue
        fields = {**point, **config_fields(point)}
        key = tuple(fields.get(k) for k in EMULATED_KEYS)
        runs.setdefault(key, {})[point["schedule"]] = record
    rows = []
    for key, found in runs.items():
        if set(found) != set(COMPARED):
            continue
        row = dict(zip(EMULATED_KEYS, key, strict=True))
        achieved = (found[WAVE].get("extra") or {}).get("equivalent_tflops")
        if achieved is not None:
            row["wave_equivalent_tflops"] = float(achieved)
        rows.append({**row, **ratio_columns(found[WAVE], found[INTERLEAVED])})
    if not rows:
        return pd.DataFrame(
            columns=[*EMULATED_KEYS, "speedup", "speedup_ci_low", "speedup_ci_high"]
        )
    frame = pd.DataFrame(rows)
    # per path and shape (in the order measured), by rate, then share: a table per rate
    order = {k: list(dict.fromkeys(frame[k])) for k in ("shape", "remote_fraction")}
    order["path"] = ordered_paths(frame["path"])
    rank = {f"_{k}": frame[k].map({v: i for i, v in enumerate(o)}) for k, o in order.items()}
    frame = frame.assign(**rank).sort_values(
        ["_path", "_shape", "emulated_tflops", "_remote_fraction"], kind="stable"
    )
    return frame.drop(columns=list(rank)).reset_index(drop=True)


def emulated_sweep(dataset_dir: Path) -> tuple[dict, pd.DataFrame]:
    """The dataset's emulated MegaMoE document and emulated_speedups of it; NoDataError
    when no point has both schedules ok."""
    doc = raw_doc(dataset_dir, layout.MEGAMOE_EMULATED_RAW)
    speedups = emulated_speedups(doc)
    if speedups.empty:
        raise NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_EMULATED_RAW} has no point with "
            f"ok {WAVE} and {INTERLEAVED} records"
        )
    return doc, speedups


def path_drain_rate_GBps(model: dict, path: str) -> float | None:
    """The drain rate R fitted for `path` (model.document.path_fit: the top-level fit, or
    the path's part of `other_paths`); None where the model did not fit that path."""
    from xstage_bench.model.document import ModelFileError, path_fit

    try:
        return fitted.param(path_fit(model, path), "R_GBps")
    except ModelFileError:
        return None


def crossover_rate_tflops(
    dataset_dir: Path, path: str = storepath.PEER
) -> tuple[float, str] | None:
    """(X at the paper's compute-to-drain ratio, the R it used) for `path`, from the
    dataset's model; None without a fitted R for that path."""
    model = optional_model_doc(dataset_dir)
    r = path_drain_rate_GBps(model, path) if model else None
    if r is None:
        return None
    return paper.PAPER_FLOP_PER_BYTE * r * 1e9 / 1e12, f"R = {r:.0f} GB/s"
