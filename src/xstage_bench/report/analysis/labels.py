"""How a dataset, a byte count or a series is named in figures and tables: measured GPU(s)
or simulated, sizes in KiB/MiB, sync modes and remote fractions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from xstage_bench.data import layout
from xstage_bench.report.analysis.load import model_environment

MIB = 1 << 20
KIB = 1 << 10
ELEMENT_BYTES = 2  # bf16 activations and outputs (MegaMoE combine, attention output)


def is_simulated(dataset_dir: Path, backend: str | None) -> bool:
    return layout.is_simulated_dataset(dataset_dir.name) or backend == "sim"


def is_cpu_test(environment: dict | None) -> bool:
    """A measuring rule's CPU run (measure_device: cpu): a test of the harness."""
    return (environment or {}).get("device_type", "cuda") != "cuda"


def dataset_label(dataset_dir: Path, backend: str | None, environment: dict | None) -> str:
    """'sim-h200 (simulated, profile H200 (seed))' or 'h200x2: 2x NVIDIA H200'."""
    name = dataset_dir.name
    environment = environment or {}
    if is_simulated(dataset_dir, backend):
        profile = (environment.get("hardware_profile") or {}).get("name")
        return f"{name} (simulated" + (f", profile {profile})" if profile else ")")
    if is_cpu_test(environment):
        return f"{name}: a CPU test of the harness (gloo, Triton interpreter), not a measurement"
    gpus = Counter(g["name"] for g in environment.get("gpus", []))
    if not gpus:
        return f"{name}: measured (GPU not recorded)"
    return f"{name}: " + ", ".join(f"{n}x {gpu}" for gpu, n in gpus.items())


def doc_label(dataset_dir: Path, doc: dict) -> str:
    return dataset_label(dataset_dir, doc["backend"], doc["environment"])


def model_label(dataset_dir: Path, model: dict) -> str:
    return dataset_label(dataset_dir, model["backend"], model_environment(dataset_dir, model))


def fmt_bytes(n: float) -> str:
    """'4 MiB' for 4 MiB and for 4 MiB rounded down to whole stores (V = K*B)."""
    if n >= 0.99 * MIB:
        return f"{round(n / MIB, 2):g} MiB"
    if n >= 0.99 * KIB:
        return f"{round(n / KIB, 1):g} KiB"
    return f"{n:g} B"


# Aligned (barrier) records are drawn filled, free-running ones hollow.
SYNC_LABEL = {"barrier": "aligned (grid barrier before each burst)", "free": "free-running"}


def fraction_name(fraction: str) -> str:
    """How a remote fraction label reads in a legend."""
    if fraction == "natural":
        return "f natural ((P-1)/P)"
    if float(fraction) == 0:
        return "f = 0 (local-store control)"
    return f"f = {fraction}"
