"""tab-megamoe's section on how each variant's calls were enqueued: the host's time to
enqueue one timed call and how often the GPU may have waited for it.

A sweep with `megamoe.host_lead` keeps the GPU busy while the host enqueues each timed call
(timing.HostLead), so every variant's time_us is GPU time; its records keep the host's
side (`host_enqueue_us`, `gpu_waited_for_host` of `host_lead_calls`). Our kernel's records
also name how the layer was enqueued (`launch`: replayed CUDA graphs on a GPU).
"""

from __future__ import annotations

import pandas as pd

VARIANT_ORDER = ("ours", "unfused", "gemm_ceiling", "deepgemm", "flashinfer")


def host_side(doc: dict) -> pd.DataFrame:
    """Per variant with ok records that carry the host lead's facts: how its layer was
    launched, its host enqueue time (median and max over records) and the timed calls in
    which the GPU may have waited for the host. Empty for a sweep without the host lead."""
    rows: dict[str, dict] = {}
    for record in doc["records"]:
        extra = record.get("extra") or {}
        if record["status"] != "ok" or extra.get("host_enqueue_us") is None:
            continue
        variant = record["point"].get("variant") or "ours"
        row = rows.setdefault(
            variant,
            {"variant": variant, "launch": set(), "enqueue": [], "calls": 0, "waited": 0},
        )
        row["launch"].add(extra.get("launch", "eager"))
        row["enqueue"].append(extra["host_enqueue_us"])
        row["calls"] += extra["host_lead_calls"]
        row["waited"] += extra["gpu_waited_for_host"]
    order = {v: i for i, v in enumerate(VARIANT_ORDER)}
    return pd.DataFrame(
        [
            {
                "variant": row["variant"],
                "records": len(row["enqueue"]),
                "launch": ", ".join(sorted(row["launch"])),
                "host enqueue us median": pd.Series(row["enqueue"]).median(),
                "host enqueue us max": max(row["enqueue"]),
                "timed calls": row["calls"],
                "calls the GPU may have waited in": row["waited"],
            }
            for row in sorted(rows.values(), key=lambda r: order.get(r["variant"], len(order)))
        ]
    )


def host_side_note() -> str:
    return (
        "host side: every timed call of every variant was enqueued while a sleep kernel kept "
        "the GPU busy (megamoe.host_lead), so the times above are GPU time; host enqueue = "
        "the host's time to enqueue one timed call (per record the median, here the median "
        "and max over records); 'calls the GPU may have waited in' counts timed calls, "
        "warm-up included, whose start event had passed before the host finished enqueueing. "
        "launch: how the variant's layer was enqueued (ours: CUDA graphs replayed, "
        "megamoe/layer/graphs.py; the libraries: their own Python or C++ calls, eager)."
    )
