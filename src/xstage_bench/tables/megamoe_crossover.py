"""tab-megamoe-crossover: the emulated sweep per (shape, X, f): both schedules' times, the
speedup with its CI-derived range, and the mechanism beside it: each schedule's Linear-2
waits for inputs (p90) and remote-store spans (median) from one traced run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from xstage_bench import layout
from xstage_bench.analysis import frames, labels, megamoe
from xstage_bench.hardware import load_profile
from xstage_bench.sim.emulated import compare_emulated
from xstage_bench.tables.common import Table

# Written by the fit beside layout.MODEL_JSON (one rule makes both), so declaring the model
# file as this table's input makes the DAG wait for the profile too.
PROFILE_READ = layout.MODEL_PROFILE
MECHANISM = {"extra_wait_us_p90": "wait_p90_us", "extra_store_span_us_median": "span_us"}


def simulated_speedups(dataset_dir: Path, doc: dict) -> pd.DataFrame | None:
    """The simulator's interleaved/expert-wave speedup at every emulated point, from the
    profile fitted to this dataset's microbenchmarks; None without a fit."""
    profile = dataset_dir / PROFILE_READ
    if not profile.exists():
        return None
    compared = compare_emulated(
        doc["records"], load_profile(profile), megamoe_config=doc["config"].get("megamoe")
    )
    compared = megamoe.remote_fraction_labels(compared)
    return compared.rename(
        columns={
            "emulated_tflops": "X_tflops",
            "remote_fraction": "f",
            "predicted_speedup": "sim_speedup",
            "error": "sim_error",
        }
    )[["shape", "X_tflops", "f", "sim_speedup", "sim_error"]]


def build(dataset_dir: Path) -> Table:
    doc, speedups = megamoe.emulated_sweep(dataset_dir)
    keys = ["shape", "emulated_tflops", "remote_fraction"]
    df = megamoe.remote_fraction_labels(frames.records_frame(doc))
    ok = df[df["status"] == "ok"]
    mechanism = ok.pivot_table(
        index=keys, columns="schedule", values=list(MECHANISM), aggfunc="first", sort=False
    )
    mechanism.columns = [f"{sched}_{MECHANISM[col]}" for col, sched in mechanism.columns]
    columns = ["wave_us", "interleaved_us", "speedup", "speedup_low", "speedup_high"]
    if "wave_equivalent_tflops" in speedups.columns:
        columns.insert(0, "wave_equivalent_tflops")
    frame = speedups[[*keys, *columns]]
    frame = frame.merge(mechanism.reset_index(), on=keys, how="left")
    frame = frame.rename(columns={"emulated_tflops": "X_tflops", "remote_fraction": "f"})
    notes = [
        "emulated: measured on GPUs, every tile's MMA replaced by a wait for its FLOPs at X "
        "TFLOP/s per GPU; f = share of combine rows stored into another GPU (0: the "
        "local-store control; natural: routing's own).",
        "speedup = expert-wave time / interleaved time (medians); low/high: the ratio at the "
        "extremes of the two medians' 95% CIs.",
        "wave_equivalent_tflops: useful FLOPs per GPU over the expert-wave time, the rate "
        "actually achieved (below X: padding rows, epilogues, combine and tail).",
        "wait_p90_us: 90th percentile of the Linear-2 tiles' wait for their row block; "
        "span_us: median remote-store span per Linear-2 tile (one traced run each).",
        frames.failure_note(frames.records_frame(doc), "left out"),
    ]
    predicted = simulated_speedups(dataset_dir, doc)
    if predicted is not None:
        frame = frame.merge(predicted, on=["shape", "X_tflops", "f"], how="left")
        errors = frame["sim_error"].abs().dropna()
        notes.append(
            f"sim_speedup: the simulator playing the same tile lists and routing at the same X "
            f"with this dataset's fitted store path ({PROFILE_READ}), kernel time only; "
            f"median |error| {errors.median():.1%} over {len(errors)} points."
        )
    marker = megamoe.crossover_rate_tflops(dataset_dir)
    if marker:
        notes.append(
            f"the paper's compute-to-drain ratio corresponds to X = {marker[0]:.0f} TFLOP/s "
            f"here ({marker[1]})."
        )
    return Table(
        pd.DataFrame(frame),
        "MegaMoE with compute emulated: schedules over compute rate and remote fraction",
        labels.doc_label(dataset_dir, doc) + " (emulated compute)",
        notes,
    )
