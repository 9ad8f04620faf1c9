"""Ulysses attention sweeps as frames: per setting and shape, fused over serial with a CI.

A *setting* is one store path (peer, host) at one P, emulated or not (two GPUs playing two
ranks of a P-GPU node on the peer path; one GPU playing rank 0 of a P-GPU node, host
memory the other owners, on the host path). Each row of `serial_over_fused` is one
setting, backend and shape; its speedup is serial time / fused time (medians) with a
bootstrap CI from the two records' samples: paired (rounds resampled together) where the
records were timed in one paired timing (extra.paired.group equal), else each side on its
own (records of older files, or of different runs).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from xstage_bench.data import stats, storepath

CLOCKS = ("sender", "completion")
SETTING = ("path", "backend", "world_size", "ranks", "emulated")
SHAPE = ("heads", "seq_len")


def with_ranks(df: pd.DataFrame) -> pd.DataFrame:
    """`path` (records without one are the peer path), `ranks`, the P each row stands for
    (the emulated one, else world_size), and `emulated`."""
    if df.empty:
        return df
    path = df["path"] if "path" in df.columns else pd.Series(storepath.PEER, index=df.index)
    emulated = (
        df["emulated_world_size"].notna()
        if "emulated_world_size" in df.columns
        else pd.Series(False, index=df.index)
    )
    sizes = df["emulated_world_size"] if "emulated_world_size" in df.columns else df["world_size"]
    ranks = sizes.where(emulated, df["world_size"]).astype(int)
    return df.assign(path=path.fillna(storepath.PEER), ranks=ranks, emulated=emulated)


def setting_label(path: str, ranks: int, emulated: bool, gpus: int) -> str:
    """How a row names its setting: 'peer path, P=8 emulated on 2 GPUs'. The host path
    runs on one GPU whatever the run's count (the others idle meanwhile)."""
    name = f"{path} path, P={int(ranks)}"
    if emulated:
        gpus = 1 if path == storepath.HOST else int(gpus)
        name += f" emulated on {gpus} GPU{'s' if gpus != 1 else ''}"
    return name


def _key(record: dict) -> tuple:
    p = record["point"]
    emulated = "emulated_world_size" in p
    ranks = p["emulated_world_size"] if emulated else p["world_size"]
    return (
        storepath.point_path(p),
        p["backend"],
        p["world_size"],
        int(ranks),
        emulated,
        p["heads"],
        p["seq_len"],
    )


def _paired(a: dict, b: dict) -> bool:
    """Whether two records come from one paired timing (sample i of each from round i)."""
    pa, pb = ((r.get("extra") or {}).get("paired") or {} for r in (a, b))
    return bool(pa.get("group")) and pa.get("group") == pb.get("group")


def mode_pairs(doc: dict) -> list[dict]:
    """Every (setting, shape) with an ok serial and an ok fused record: its key fields,
    both records' samples per clock, and whether they were timed paired."""
    by_key: dict[tuple, dict[str, dict]] = {}
    for record in doc["records"]:
        point = record["point"]
        if record["status"] != "ok" or point.get("mode") not in ("serial", "fused"):
            continue
        by_key.setdefault(_key(record), {})[point["mode"]] = record
    pairs = []
    for key, modes in sorted(by_key.items(), key=lambda kv: tuple(map(str, kv[0]))):
        if set(modes) != {"serial", "fused"}:
            continue
        serial, fused = modes["serial"], modes["fused"]
        pairs.append(
            {
                **dict(zip((*SETTING, *SHAPE), key, strict=True)),
                "paired": _paired(serial, fused),
                "serial": serial.get("samples") or {},
                "fused": fused.get("samples") or {},
            }
        )
    return pairs


def serial_over_fused(doc: dict) -> pd.DataFrame:
    """One row per (path, backend, world_size, ranks, emulated, heads, seq_len): serial and
    fused median times and their ratio with a 95% bootstrap CI and a verdict (faster:
    fused is faster, the CI above 1; slower; tie), for the sender-visible and the
    completion clock, and whether the CI is paired."""
    rows = []
    for pair in mode_pairs(doc):
        row = {k: pair[k] for k in (*SETTING, *SHAPE)}
        row["setting"] = setting_label(
            pair["path"], pair["ranks"], pair["emulated"], pair["world_size"]
        )
        row["paired"] = False
        for clock in CLOCKS:
            serial = pair["serial"].get(f"{clock}_us")
            fused = pair["fused"].get(f"{clock}_us")
            if not serial or not fused:
                continue
            paired = pair["paired"] and len(serial) == len(fused)
            ci = stats.ratio_ci(serial, fused, paired=paired)
            row.update(
                {
                    f"serial_{clock}_us": float(np.median(serial)),
                    f"fused_{clock}_us": float(np.median(fused)),
                    f"speedup_{clock}": ci["ratio"],
                    f"speedup_{clock}_ci_low": ci["ci_low"],
                    f"speedup_{clock}_ci_high": ci["ci_high"],
                    f"verdict_{clock}": ci["verdict"],
                }
            )
            row["paired"] = row["paired"] or paired
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=[*SETTING, "setting", *SHAPE])
    frame = pd.DataFrame(rows)
    return frame.sort_values([*SETTING, *SHAPE], ignore_index=True)


def _boot_ratios(num, den, paired: bool, rng, n_boot: int) -> np.ndarray:
    """Bootstrap ratios of medians (num / den), as stats.ratio_ci resamples them."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    ia = rng.integers(0, a.size, size=(n_boot, a.size))
    ib = ia if paired else rng.integers(0, b.size, size=(n_boot, b.size))
    return np.median(a[ia], axis=1) / np.median(b[ib], axis=1)


def geomean_ci(
    pairs: list[dict], clock: str = "sender", confidence: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(geomean of serial/fused over the configurations, CI low, CI high): a two-level
    bootstrap, the configurations resampled and, within each, its samples (paired rounds
    together where the pair is paired), so the CI carries both sources of spread."""
    rng = np.random.default_rng(seed)
    n_boot = stats.BOOTSTRAP_RESAMPLES
    metric = f"{clock}_us"
    ratios, boots = [], []
    for pair in pairs:
        serial, fused = pair["serial"][metric], pair["fused"][metric]
        paired = pair["paired"] and len(serial) == len(fused)
        ratios.append(np.median(serial) / np.median(fused))
        boots.append(_boot_ratios(serial, fused, paired, rng, n_boot))
    boot = np.log(np.stack(boots))  # (configurations, n_boot)
    pick = rng.integers(0, len(pairs), size=(n_boot, len(pairs)))
    geomeans = np.exp(boot[pick, np.arange(n_boot)[:, None]].mean(axis=1))
    alpha = (1.0 - confidence) / 2.0
    return (
        stats.geomean(ratios),
        float(np.quantile(geomeans, alpha)),
        float(np.quantile(geomeans, 1.0 - alpha)),
    )


def headlines(doc: dict, clock: str = "sender") -> pd.DataFrame:
    """Per setting and backend: the configurations, the maximum speedup (with its own
    CI and where it is), the geomean with a CI over configurations and samples, and how
    many configurations fused is faster, slower or tied on."""
    frame = serial_over_fused(doc)
    column = f"speedup_{clock}"
    if column not in frame.columns:
        return pd.DataFrame()
    metric = f"{clock}_us"
    pairs = [p for p in mode_pairs(doc) if p["serial"].get(metric) and p["fused"].get(metric)]
    rows = []
    for key, rows_of in frame[frame[column].notna()].groupby(list(SETTING), sort=True):
        best = rows_of.loc[rows_of[column].idxmax()]
        mine = [p for p in pairs if tuple(p[k] for k in SETTING) == key]
        gm, gm_low, gm_high = geomean_ci(mine, clock)
        verdicts = rows_of[f"verdict_{clock}"].value_counts()
        rows.append(
            {
                **dict(zip(SETTING, key, strict=True)),
                "setting": best["setting"],
                "configurations": len(rows_of),
                "paired": bool(rows_of["paired"].all()),
                "max": best[column],
                "max_ci_low": best[f"{column}_ci_low"],
                "max_ci_high": best[f"{column}_ci_high"],
                "max_at": f"S={int(best['seq_len'])}, {int(best['heads'])} heads",
                "geomean": gm,
                "geomean_ci_low": gm_low,
                "geomean_ci_high": gm_high,
                "faster": int(verdicts.get(stats.FASTER, 0)),
                "slower": int(verdicts.get(stats.SLOWER, 0)),
                "tie": int(verdicts.get(stats.TIE, 0)),
            }
        )
    return pd.DataFrame(rows)


def timed_with_host_lead(doc: dict) -> bool:
    """Whether the sweep kept the GPU busy while the host enqueued each timed call
    (attention.host_lead in its raw config): its times are GPU time."""
    return bool(doc.get("config", {}).get("attention", {}).get("host_lead"))


def alone_records(doc: dict) -> dict[tuple, dict[str, dict]]:
    """The ok attention-alone records by (path, world size, ranks, emulated, heads,
    seq_len), each a record per backend, in the order of their keys: the sets that
    alone_beside compares."""
    by_key: dict[tuple, dict[str, dict]] = {}
    for record in doc["records"]:
        if record["status"] != "ok" or record["point"].get("mode") != "alone":
            continue
        key = _key(record)
        by_key.setdefault(key[:1] + key[2:], {})[record["point"]["backend"]] = record
    return dict(sorted(by_key.items(), key=lambda kv: tuple(map(str, kv[0]))))


def alone_beside(doc: dict, base: str = "fa3") -> pd.DataFrame:
    """Attention alone, each backend beside `base`: one row per (setting, shape, backend
    other than base) with both TFLOP/s and the backend's share of base's TFLOP/s (base's
    median sender time over the backend's) with a 95% bootstrap CI, paired where the two
    were timed together; the host-lead facts (the host's median enqueue of one call, the
    timed calls the GPU may have waited in) where the sweep had a lead."""
    rows = []
    for key, backends in alone_records(doc).items():
        if base not in backends:
            continue
        path, world_size, ranks, emulated, heads, seq_len = key
        reference = backends[base]
        for name, record in sorted(backends.items()):
            if name == base:
                continue
            mine, theirs = (r["samples"]["sender_us"] for r in (record, reference))
            paired = _paired(record, reference) and len(mine) == len(theirs)
            ci = stats.ratio_ci(theirs, mine, paired=paired)
            extra = record.get("extra") or {}
            rows.append(
                {
                    "setting": setting_label(path, ranks, emulated, world_size),
                    "path": path,
                    "ranks": ranks,
                    "emulated": emulated,
                    "heads": heads,
                    "seq_len": seq_len,
                    "backend": name,
                    "tflops": extra.get("tflops"),
                    f"{base}_tflops": (reference.get("extra") or {}).get("tflops"),
                    f"share_of_{base}": ci["ratio"],
                    f"share_of_{base}_ci_low": ci["ci_low"],
                    f"share_of_{base}_ci_high": ci["ci_high"],
                    "paired": paired,
                    "host_enqueue_us": extra.get("host_enqueue_us"),
                    f"{base}_host_enqueue_us": (reference.get("extra") or {}).get(
                        "host_enqueue_us"
                    ),
                    "gpu_waited_for_host": extra.get("gpu_waited_for_host"),
                }
            )
    if not rows:
        return pd.DataFrame(rows)
    order = ["path", "ranks", "emulated", "heads", "seq_len", "backend"]
    return pd.DataFrame(rows).sort_values(order, ignore_index=True)
