"""tab-megamoe-crossover: the emulated sweep per (path, shape, X, f): both schedules'
times, the speedup with its 95% bootstrap CI and verdict in both metrics where recorded,
and the mechanism beside it: each schedule's Linear-2 waits for inputs (p90) and far-end
store spans (median) from one traced run; the simulator's prediction where the dataset's
fitted profile describes the path."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from xstage_bench.data import layout, storepath
from xstage_bench.data.hardware import load_profile
from xstage_bench.report.analysis import frames, labels, megamoe, megamoe_emulated
from xstage_bench.report.tables.common import MAIN, Columns, Table
from xstage_bench.sim.emulated import compare_emulated

# Written by the fit beside layout.MODEL_JSON (one rule makes both), so declaring the model
# file as this table's input makes the DAG wait for the profile too.
PROFILE_READ = layout.MODEL_PROFILE
MECHANISM = {"extra_wait_us_p90": "wait_p90_us", "extra_store_span_us_median": "span_us"}
KEYS = ["path", "shape", "emulated_tflops", "remote_fraction"]


def simulated_speedups(dataset_dir: Path, doc: dict, path: str) -> pd.DataFrame | None:
    """The simulator's interleaved/expert-wave speedup at every emulated point of `path`,
    from the profile fitted to this dataset's microbenchmarks; None without a fit."""
    profile = dataset_dir / PROFILE_READ
    if not profile.exists():
        return None
    records = [r for r in doc["records"] if storepath.point_path(r["point"]) == path]
    compared = compare_emulated(
        records, load_profile(profile), megamoe_config=doc["config"].get("megamoe")
    )
    compared = megamoe.remote_fraction_labels(compared).assign(path=path)
    return compared.rename(
        columns={
            "emulated_tflops": "X_tflops",
            "remote_fraction": "f",
            "predicted_speedup": "sim_speedup",
            "error": "sim_error",
        }
    )[["path", "shape", "X_tflops", "f", "sim_speedup", "sim_error"]]


def mechanism(doc: dict) -> pd.DataFrame:
    """Per point: each schedule's wait p90 and median span, from the records' extras."""
    df = megamoe.with_paths(megamoe.remote_fraction_labels(frames.records_frame(doc)))
    ok = df[df["status"] == "ok"]
    values = [c for c in MECHANISM if c in ok.columns]
    if not values:
        return pd.DataFrame(columns=KEYS)
    wide = ok.pivot_table(
        index=KEYS, columns="schedule", values=values, aggfunc="first", sort=False
    )
    wide.columns = [f"{sched}_{MECHANISM[col]}" for col, sched in wide.columns]
    return wide.reset_index()


def build(dataset_dir: Path) -> Table:
    doc, speedups = megamoe_emulated.emulated_sweep(dataset_dir)
    columns = ["wave_us", "interleaved_us", "speedup", "speedup_ci_low", "speedup_ci_high"]
    columns += ["verdict", "noisy"]
    kernel = megamoe.KERNEL
    if kernel.column("speedup") in speedups.columns:
        columns += [
            kernel.column(c)
            for c in ("wave_us", "interleaved_us", "speedup", "speedup_ci_low", "speedup_ci_high")
        ]
        columns += [kernel.column("verdict"), kernel.column("noisy")]
    columns += ["paired", "throttled"]
    if "wave_equivalent_tflops" in speedups.columns:
        columns.insert(0, "wave_equivalent_tflops")
    frame = speedups[[*KEYS, *columns]].merge(mechanism(doc), on=KEYS, how="left")
    frame = frame.rename(columns={"emulated_tflops": "X_tflops", "remote_fraction": "f"})
    paths = megamoe.ordered_paths(speedups["path"])
    notes = [
        "emulated: measured on GPUs, every tile's MMA replaced by a wait for its FLOPs at X "
        "TFLOP/s per GPU; f = on the peer path the share of combine rows stored into "
        "another GPU (natural: routing's own), on the host path the host share (rows stored "
        "into host memory); 0: the local-store control.",
        "paths: " + "; ".join(megamoe.path_title(p) for p in paths) + ".",
        f"speedup = expert-wave time / interleaved time (medians) in the {megamoe.LAYER.label} "
        f"({megamoe.LAYER.sample}); kernel_*: the same in the {megamoe.KERNEL.label} "
        f"({megamoe.KERNEL.sample}) where recorded; CI: 95% bootstrap of the ratio "
        "(stats.ratio_ci, paired where the schedules ran in alternating rounds); noisy: the "
        "CI reaches further than +-3% from the ratio.",
        "wave_equivalent_tflops: useful FLOPs per GPU over the expert-wave time, the rate "
        "actually achieved (below X: padding rows, epilogues, combine and tail).",
        "wait_p90_us: 90th percentile of the Linear-2 tiles' wait for their row block; "
        "span_us: median far-end store span per Linear-2 tile (one traced run each).",
        frames.failure_note(frames.records_frame(doc), "left out"),
    ]
    if paths == [storepath.HOST]:
        notes.append(
            "no sim_speedup: the simulator re-homes rows across GPUs (the peer path's remote "
            "fraction); it does not model the host path's share of tokens stored into host "
            "memory."
        )
    elif len(paths) == 1:
        predicted = simulated_speedups(dataset_dir, doc, paths[0])
        if predicted is not None:
            frame = frame.merge(predicted, on=["path", "shape", "X_tflops", "f"], how="left")
            errors = frame["sim_error"].abs().dropna()
            notes.append(
                f"sim_speedup: the simulator playing the same tile lists and routing at the "
                f"same X with this dataset's fitted store path ({PROFILE_READ}), kernel time "
                f"only; median |error| {errors.median():.1%} over {len(errors)} points."
            )
    else:
        notes.append(
            "no sim_speedup: the sweep covers several paths and the dataset's one fitted "
            f"profile ({PROFILE_READ}) describes one store path."
        )
    for path in paths:
        marker = megamoe_emulated.crossover_rate_tflops(dataset_dir, path)
        if marker:
            notes.append(
                f"{path} path: the paper's compute-to-drain ratio corresponds to X = "
                f"{marker[0]:.0f} TFLOP/s here ({marker[1]}, the path's fitted drain rate)."
            )
    return Table(
        pd.DataFrame(frame),
        "MegaMoE with compute emulated: schedules over compute rate and share f, "
        + megamoe.paths_text(paths),
        labels.doc_label(dataset_dir, doc) + " (emulated compute)",
        notes,
        columns=MARKDOWN_COLUMNS,
    )


# How the Markdown copy splits the frame (the CSV keeps every column).
MARKDOWN_COLUMNS = {
    MAIN: Columns(
        ("path", "shape", "X_tflops", "f"),
        (
            (
                "layer time",
                ("wave_equivalent_tflops", "wave_us", "interleaved_us", "speedup", "verdict")
                + ("noisy", "paired", "throttled"),
            ),
            (
                "kernel time",
                ("kernel_wave_us", "kernel_interleaved_us", "kernel_speedup", "kernel_verdict")
                + ("kernel_noisy", "sim_speedup", "sim_error"),
            ),
            (
                "mechanism (one traced run)",
                ("expert_wave_wait_p90_us", "interleaved_wait_p90_us")
                + ("deepgemm_interleaved_wait_p90_us", "expert_wave_span_us")
                + ("interleaved_span_us", "deepgemm_interleaved_span_us"),
            ),
        ),
    )
}
