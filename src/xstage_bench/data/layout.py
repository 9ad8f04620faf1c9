"""Where a dataset's files live: raw files per experiment, the fitted model, and which
final raw files a dataset has on disk. What each figure and table reads is products.py's.
"""

from __future__ import annotations

import re
from pathlib import Path

MODEL_JSON = "model/burst_gap.json"
MODEL_PROFILE = "model/profile.yaml"
# The fused kernel's arms played through the fitted drain (report/analysis/megamoe_playback):
# made once per dataset from raw/megamoe.json and the model, read by its figure and table.
MEGAMOE_PLAYBACK = "model/megamoe_playback.json"


MICROBENCH_DIR = "raw/microbench"


def microbench_raw(study: str) -> str:
    return f"{MICROBENCH_DIR}/{study}.json"


MEGAMOE_RAW = "raw/megamoe.json"
MEGAMOE_TRACE_RAW = "raw/megamoe_trace.json"
# Our kernel measured again with one process per GPU (megamoe/distributed.py), to compare
# with MEGAMOE_RAW's single process; made only where measured_experiments asks for it.
MEGAMOE_PER_GPU_RAW = "raw/megamoe_per_gpu.json"
ATTENTION_RAW = "raw/attention.json"
# The compute-emulated MegaMoE sweep (megamoe/emulated.py): measured on GPUs with each
# tile's MMA replaced by a calibrated wait; made only where measured_experiments asks.
MEGAMOE_EMULATED_RAW = "raw/megamoe_emulated.json"
# Each experiment's raw files; a dataset holds the experiment when its first file is there.
EXPERIMENT_FILES = {
    "megamoe": (MEGAMOE_RAW, MEGAMOE_TRACE_RAW),
    "attention": (ATTENTION_RAW,),
    "megamoe_per_gpu": (MEGAMOE_PER_GPU_RAW,),
    "megamoe_emulated": (MEGAMOE_EMULATED_RAW,),
}
EXPERIMENT_RAW = tuple(f for files in EXPERIMENT_FILES.values() for f in files)
# What the simulator makes of a dataset (sim/run.py)
SIMULATED_EXPERIMENTS = ("microbench", "megamoe", "attention")
ALL_RAW = "raw:*"  # a read of every final raw file the dataset has (tab-noise)
STUDY_NAME = re.compile(r"[a-z0-9_]+")  # as config.schema.json's microbench study names


def resolve(dataset_dir: Path, read: str) -> Path:
    """A dataset-relative read ('microbench:<study>' or a path) as a path."""
    if read.startswith("microbench:"):
        return dataset_dir / microbench_raw(read.split(":", 1)[1])
    return dataset_dir / read


def studies_on_disk(dataset_dir: Path) -> list[str]:
    """Microbench studies with a final raw file. Resume state (<study>.json.partial.json)
    and any other stray name are not studies."""
    return sorted(
        p.stem
        for p in (Path(dataset_dir) / "raw" / "microbench").glob("*.json")
        if STUDY_NAME.fullmatch(p.stem)
    )


def raw_files(dataset_dir: Path) -> list[Path]:
    """Every final raw file the dataset has: what ALL_RAW reads."""
    dataset_dir = Path(dataset_dir)
    files = [dataset_dir / microbench_raw(s) for s in studies_on_disk(dataset_dir)]
    files += [dataset_dir / f for f in EXPERIMENT_RAW if (dataset_dir / f).exists()]
    return sorted(files)


def is_simulated_dataset(name: str) -> bool:
    return name.startswith("sim-")
