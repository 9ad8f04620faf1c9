"""What a run checks before any work beyond the config's own validation, in one place: the
Snakefile (common.smk) and `xstage validate` call the same checks, so a config that
validate calls valid is not refused by a run on the same machine.

- Hardware profiles (`datasets.simulated`): each file loads (hardware.load_profile). Paths
  in a config are relative to the working directory: a missing profile is named with it,
  and with the fix where the workflow's folder holds the file (seen: `snakemake -s
  ../Snakefile` from a subdirectory reported a missing config/hardware/h200.yaml only).
- World sizes: under `world_size: auto` a simulated dataset is made at its profile's node
  size (sim/run.py's world_size) and a measurement at the GPUs found here, gpu_ids' count
  or a CPU test's two ranks; what must divide over the ranks (config.check_world_size) is
  checked at each (seen: E and heads that do not divide passed, then failed inside a job).
- References (`datasets.reference`): a name not in results/ but close to a dataset there
  is a typo (a reference missing from a checkout is only skipped).
- `measure_device: cpu` runs the measuring rules under torch and Triton's interpreter:
  this Python must have both (envs/cpu.txt has neither). Not the config's fault: a run
  stops before any job, a dry run and `xstage validate` say so and go on.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from pathlib import Path

from xstage_bench.data.config import ConfigError, check_world_size
from xstage_bench.data.hardware import HardwareProfile, load_profile
from xstage_bench.measurement.machine import GpuProbe

RESULTS = Path("results")
CPU_TEST_RANKS = 2  # gloo ranks of a CPU test when world_size is auto and no gpu_ids
CPU_TEST_MODULES = ("torch", "triton")
KERNELS_ENV = (
    "python3 -m venv .venv-kernels && .venv-kernels/bin/pip install -r envs/kernels-cpu.txt "
    "&& .venv-kernels/bin/pip install --no-deps -e ."
)


def is_cpu_test(config: dict) -> bool:
    """measure_device cpu: the measuring rules run on the CPU, a test of the harness."""
    return config.get("measure_device", "cuda") == "cpu" and config["measure"] != "never"


def measured_world_size(config: dict, gpus: GpuProbe | None) -> int | None:
    """The ranks a run of `config` measures with here: the config's integer; under 'auto'
    gpu_ids' count, a CPU test's CPU_TEST_RANKS, or the GPUs found (`gpus`: probe_gpus()'s,
    None where the run probes none); None where it measures nothing here."""
    if config["world_size"] != "auto":
        return config["world_size"]
    if config.get("gpu_ids"):
        return len(config["gpu_ids"])
    if is_cpu_test(config):
        return CPU_TEST_RANKS
    if gpus is not None and gpus.can_measure and config["measure"] in ("auto", "always"):
        return gpus.count
    return None


def measured_ranks(config: dict, world_size: int) -> str:
    """What `world_size: auto` resolved to for a measurement, in words."""
    if config.get("gpu_ids"):
        return f"the {world_size} GPUs of gpu_ids"
    if is_cpu_test(config):
        return f"a CPU test's {world_size} ranks"
    return f"the {world_size} GPUs here"


def check_measured_world_size(config: dict, world_size: int) -> None:
    """What `world_size: auto` resolves to for a measurement, checked as an integer is."""
    if config["world_size"] != "auto":
        return  # validate_config checked it
    try:
        check_world_size(config, world_size)
    except ConfigError as e:
        words = measured_ranks(config, world_size)
        raise ConfigError(f"{e} (world_size 'auto': {words})") from None


def _missing_profile(dataset: str, path: str, workflow_dir: Path | None) -> str:
    here = Path.cwd()
    said = (
        f"config key 'datasets.simulated.{dataset}': hardware profile {path} not found in the "
        f"working directory {here} (paths in a config are relative to it)"
    )
    if workflow_dir is not None and Path(workflow_dir).resolve() != here.resolve():
        if (Path(workflow_dir) / path).is_file():
            folder = Path(workflow_dir).resolve()
            said += f"; the workflow's folder has it: run from there (cd {folder})"
    return said


def simulated_profiles(
    config: dict, workflow_dir: Path | None = None
) -> dict[str, HardwareProfile]:
    """Each simulated dataset's hardware profile, loaded; a missing or bad one is a
    ConfigError naming the key (`workflow_dir`: where a missing one may be instead)."""
    profiles = {}
    for dataset, path in config["datasets"]["simulated"].items():
        if not Path(path).is_file():
            raise ConfigError(_missing_profile(dataset, path, workflow_dir))
        try:
            profiles[dataset] = load_profile(path)
        except ConfigError as e:
            raise ConfigError(f"config key 'datasets.simulated.{dataset}': {e}") from None
    return profiles


def check_simulated_world_sizes(config: dict, profiles: dict[str, HardwareProfile]) -> None:
    """Under world_size 'auto', each simulated dataset at its profile's node size."""
    if config["world_size"] != "auto":
        return  # validate_config checked the integer every dataset is made at
    for dataset, profile in profiles.items():
        try:
            check_world_size(config, profile.world_size)
        except ConfigError as e:
            path = config["datasets"]["simulated"][dataset]
            raise ConfigError(
                f"{e} (world_size 'auto': dataset '{dataset}' is simulated at the "
                f"{profile.world_size} GPUs of {path}'s node)"
            ) from None


def misspelled_reference(config: dict, results: Path = RESULTS) -> str | None:
    """A reference name that is not in `results` but close to a dataset there that the
    config does not name: a typo, which would otherwise only be skipped."""
    reference = config["datasets"]["reference"]
    there = sorted(p.name for p in results.glob("*") if p.is_dir() and p.name not in reference)
    for name in reference:
        close = difflib.get_close_matches(name, there, n=1, cutoff=0.8)
        if not (results / name).is_dir() and close:
            return (
                f"config key 'datasets.reference': '{name}' is not in {results}/ "
                f"(did you mean '{close[0]}'?)"
            )
    return None


def cpu_test_problem(config: dict) -> str | None:
    """What a CPU test needs that this Python lacks, with what to install, or None."""
    if not is_cpu_test(config):
        return None
    missing = [m for m in CPU_TEST_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (
        "config key 'measure_device': 'cpu' runs the measuring rules under torch and "
        f"Triton's interpreter, and this Python ({sys.executable}) has no "
        f"{' and no '.join(missing)}. envs/cpu.txt renders and simulates only; install "
        f"envs/kernels-cpu.txt in an environment of its own ({KERNELS_ENV}) and run "
        "snakemake from it (.venv-kernels/bin/snakemake)"
    )


def check_before_work(
    config: dict, workflow_dir: Path | None = None, results: Path = RESULTS
) -> dict[str, HardwareProfile]:
    """The checks above of the config and the files it names (not of this machine's GPUs
    or this Python: cpu_test_problem); raises ConfigError for the first problem. Returns
    the simulated datasets' profiles."""
    profiles = simulated_profiles(config, workflow_dir)
    check_simulated_world_sizes(config, profiles)
    typo = misspelled_reference(config, results)
    if typo:
        raise ConfigError(typo)
    return profiles
