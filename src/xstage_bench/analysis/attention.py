"""Ulysses attention sweeps as frames."""

from __future__ import annotations

import pandas as pd

from xstage_bench.analysis.frames import records_frame


def with_ranks(df: pd.DataFrame) -> pd.DataFrame:
    """Where a sweep also ran at an emulated world size (attention/emulation.py): `ranks`,
    the P each row stands for (the emulated one, else world_size), and `emulated`. Frames
    of sweeps without one are returned as they are."""
    if "emulated_world_size" not in df.columns:
        return df
    emulated = df["emulated_world_size"].notna()
    ranks = df["emulated_world_size"].where(emulated, df["world_size"]).astype(int)
    return df.assign(ranks=ranks, emulated=emulated)


def serial_over_fused(doc: dict) -> pd.DataFrame:
    """Per (backend, world_size, [ranks, emulated,] heads, seq_len): serial and fused times
    and their ratio, for both the sender-visible and the completion clock (ok records only)."""
    df = with_ranks(records_frame(doc))
    if df.empty:
        return df
    ok = df[(df["status"] == "ok") & df["mode"].isin(["serial", "fused"])]
    keys = [
        k
        for k in ("backend", "world_size", "ranks", "emulated", "heads", "seq_len")
        if k in df.columns
    ]
    out = None
    for clock in ("sender", "completion"):
        column = f"{clock}_us_median"
        if column not in ok.columns:
            continue
        wide = ok.pivot_table(index=keys, columns="mode", values=column, aggfunc="first")
        if not {"serial", "fused"} <= set(wide.columns):
            continue
        wide = wide[["serial", "fused"]].rename(
            columns={"serial": f"serial_{clock}_us", "fused": f"fused_{clock}_us"}
        )
        wide[f"speedup_{clock}"] = wide[f"serial_{clock}_us"] / wide[f"fused_{clock}_us"]
        out = wide if out is None else out.join(wide, how="outer")
    if out is None:
        return pd.DataFrame(columns=keys)
    return out.reset_index().sort_values(keys, ignore_index=True)
