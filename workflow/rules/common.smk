# Shared helpers: config validation, the machine's GPUs, datasets and what each one holds.

import json
import os
import shlex
import shutil
import sys
from pathlib import Path

from xstage_bench.run import committed, orphans, preflight, quoted_script, restored
from xstage_bench.run import stale_products
from xstage_bench.data import layout, provenance, storepath
from xstage_bench.data.origins import changed_since_check
from xstage_bench.report import products
from xstage_bench.data.config import (
    ConfigError,
    checked_store_paths,
    extends_source,
    resolve_extends,
    validate_config,
)
from xstage_bench.measurement.machine import asked_gpus_problem, dataset_name, probe_gpus
from xstage_bench.measure import experiment_config, kernel_stamp
from xstage_bench.megamoe.ours.lead import AUTO, needs_model
from xstage_bench.run.runlock import RunLockBusy, hold_run_lock
from xstage_bench.run.stale_lock import clear_stale_locks
from snakemake.exceptions import WorkflowError
from snakemake.io import IOFile

try:
    # `extends` is relative to the config file that names it (config.resolve_extends).
    _source = extends_source(workflow.overwrite_configfiles or ["config.yaml"])
    resolved = dict(resolve_extends(config, _source))
    config.clear()
    config.update(resolved)
    validate_config(config)
except ConfigError as e:
    sys.exit(f"Invalid configuration: {e}")

# A job that fails puts its update() outputs back; the next run remakes them (restored.py).
restored.install()
quoted_script.install()  # a script job runs from a path with a space (quoted_script.py)
DRY_RUN = workflow.output_settings.dryrun

# One run per directory (runlock.py): Snakemake deletes other runs' locks when one ends.
if workflow.is_main_process and not DRY_RUN:
    try:
        RUN_LOCK = hold_run_lock()
    except (RunLockBusy, OSError) as e:
        sys.exit(f"[xstage] {e}")
    orphans.mark_run()  # the jobs of this run record it (orphans.py)

# A run killed with SIGKILL leaves its jobs running and Snakemake's lock behind. Holding the
# run lock, this run is the only one here: it ends the jobs the killed run registered,
# then a lock left with no Snakemake running here is stale, and the same command goes on.
if workflow.is_main_process:
    _orphans = orphans.orphans()
    if _orphans and DRY_RUN:
        print(
            f"[xstage] {len(_orphans)} job(s) of a killed run still run (pids "
            f"{', '.join(str(j.pid) for j in _orphans)}); the next run ends them",
            file=sys.stderr,
        )
    elif _orphans:
        print(
            f"[xstage] ending {len(_orphans)} job(s) a killed run left running: "
            + "; ".join(f"pid {j.pid} ({j.argv[:80]})" for j in _orphans),
            file=sys.stderr,
        )
        orphans.end(_orphans)
    if clear_stale_locks():
        print(
            "[xstage] removed the lock of a Snakemake run that is no longer running",
            file=sys.stderr,
        )

RESULTS = Path("results")
STUDIES = list(config["microbench"]["studies"])
# measure_device "cpu": the measuring rules run on gloo and the Triton interpreter (CI's test
# of the rules), so no GPU is probed and what they write is labelled a test.
DEVICE = config.get("measure_device", "cuda")
CPU_TEST = preflight.is_cpu_test(config)
# "submit": the GPUs are on cluster nodes the executor provides, so nothing is probed here.
PROBE = config["measure"] in ("auto", "always") and not CPU_TEST
GPUS = probe_gpus() if PROBE else None

if PROBE and config["measure"] == "always" and not GPUS.can_measure:
    sys.exit(f"config key 'measure' is 'always' but no measurement is possible: {GPUS.reason}")

MEASURING = CPU_TEST or config["measure"] == "submit" or (PROBE and GPUS.can_measure)
# Where nothing is measured, `auto` stands for 2 (no job uses it then).
WORLD_SIZE = preflight.measured_world_size(config, GPUS) or 2
GPU_IDS = config.get("gpu_ids") or list(range(WORLD_SIZE))
if PROBE and MEASURING:
    _problem = asked_gpus_problem(GPUS, WORLD_SIZE, GPU_IDS, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if _problem:
        sys.exit(f"Invalid configuration: {_problem}")
if not MEASURING:
    MEASURED = None
elif config["datasets"]["measured"] != "auto":
    MEASURED = config["datasets"]["measured"]
elif CPU_TEST:
    MEASURED = "cpu-test"
else:
    # Named by the GPUs this run measures on (two of an 8-GPU node: <gpu>x2), not the node's.
    MEASURED = dataset_name([GPUS.names[i] for i in GPU_IDS])


def store_paths():
    """The store paths this run measures (storepath.py): the config's, resolved for the GPUs
    it measures on; `auto` leaves out the peer path where those GPUs lack peer access."""
    no_peer = GPUS.peer_problem(GPU_IDS) if PROBE and MEASURING else None
    if no_peer and config.get("store_paths", "auto") == "auto":
        return [storepath.HOST]
    if no_peer and storepath.PEER in config.get("store_paths", []):
        raise ConfigError(f"config key 'store_paths' asks for 'peer', but {no_peer}")
    return checked_store_paths(config, WORLD_SIZE)


try:
    # Resolved once here, so every measuring job (and its rerun check) sees the same list.
    config["store_paths"] = store_paths()
except ConfigError as e:
    sys.exit(f"Invalid configuration: {e}")
try:
    if MEASURING:
        # validate_config checked an integer world_size; what `auto` resolves to, only now.
        preflight.check_measured_world_size(config, WORLD_SIZE)
    if workflow.is_main_process:
        # The files and datasets the config names, the world size of each simulated
        # dataset: as `xstage validate` checks them (preflight.py).
        preflight.check_before_work(config, Path(workflow.basedir), RESULTS)
except ConfigError as e:
    sys.exit(f"Invalid configuration: {e}")
if workflow.is_main_process and (_missing := preflight.cpu_test_problem(config)):
    if not DRY_RUN:
        sys.exit(f"[xstage] {_missing}")
    print(f"[xstage] a run would stop here: {_missing}", file=sys.stderr)
# Measuring rules run `python -m xstage_bench.measure` (see that module for why not a
# `script:`): this interpreter, or the rule's conda environment's with --use-conda.
USE_CONDA = any("conda" in str(m).lower() for m in workflow.deployment_settings.deployment_method)
PYTHON = "python" if USE_CONDA else shlex.quote(sys.executable)
MEASURE = f"{PYTHON} -m xstage_bench.measure"
MEASURE_ARGS = (
    "--dataset {wildcards.dataset} --log {log:q} --config-json {params.config:q} "
    f"--gpu-ids {','.join(map(str, GPU_IDS))} --device {DEVICE}"
)


def measure_config(experiment):
    """The config a measuring job is given, as a param, so that a change reruns it."""
    return json.dumps(experiment_config(config, experiment), sort_keys=True)


SIMULATED = config["datasets"]["simulated"]
CONDA_ENV = "../../envs/xstage.yaml"
REFERENCE = config["datasets"]["reference"]
REFERENCE_CHECK = "logs/raw-check.txt"


def changed_reference_raw(dataset):
    """A committed reference's raw files that are not what its check read (origins.py):
    its figures and tables were made from other data (a raw file replaced or damaged).
    Without a listing none is known to be checked: every raw file (a failed check puts
    the listing back, see check_reference, so only a listing deleted by hand is missing)."""
    check = RESULTS / dataset / REFERENCE_CHECK
    if not check.exists():
        return [str(p.relative_to(RESULTS / dataset)) for p in layout.raw_files(RESULTS / dataset)]
    return changed_since_check(RESULTS / dataset, check.read_text())


# Checked once per run (hashing the raw files takes a fraction of a second). CHANGED_READS:
# those files, and the model of a reference whose microbenchmarks changed (it is refit).
CHANGED_REFERENCES, CHANGED_READS = {}, set()
if workflow.is_main_process:
    for _dataset in REFERENCE:
        _changed = changed_reference_raw(_dataset) if (RESULTS / _dataset).is_dir() else []
        if _changed:
            CHANGED_REFERENCES[_dataset] = _changed
            CHANGED_READS.update(str(RESULTS / _dataset / rel) for rel in _changed)
            if any(str(Path(rel).parent) == layout.MICROBENCH_DIR for rel in _changed):
                CHANGED_READS.add(str(RESULTS / _dataset / layout.MODEL_JSON))
            if CHANGED_READS.intersection(
                str(RESULTS / _dataset / rel) for rel in (layout.MEGAMOE_RAW, layout.MODEL_JSON)
            ):  # the playback is made from both
                CHANGED_READS.add(str(RESULTS / _dataset / layout.MEGAMOE_PLAYBACK))
            _what = (
                f"{', '.join(_changed)} changed since its raw files were checked"
                if (RESULTS / _dataset / REFERENCE_CHECK).exists()
                else f"{REFERENCE_CHECK} is missing, so no raw file is known to be checked"
            )
            print(
                f"[xstage] {RESULTS / _dataset}: {_what}: checking them again and making "
                "what reads them again",
                file=sys.stderr,
            )
# Outputs an earlier run found made from a changed raw file and no run has remade since.
STALE_OUTPUTS = stale_products.pending() if workflow.is_main_process else set()
if STALE_OUTPUTS:
    print(
        f"[xstage] {len(STALE_OUTPUTS)} output(s) made from raw files that changed since are "
        "not remade yet: a run whose targets need one remakes it",
        file=sys.stderr,
    )


def reference_stamp(dataset):
    """No input: forces the check of a reference whose raw files changed, when that check
    is in this run's DAG."""
    if dataset in CHANGED_REFERENCES and workflow.dag is not None:
        workflow.dag.forcefiles.add(str(RESULTS / dataset / REFERENCE_CHECK))
    return []


def as_read_by(output, dataset, paths, reads=None):
    """as_read(dataset, paths), except for the job making `output` when what it reads
    (`reads`, else paths) holds a changed file of a reference (CHANGED_READS), or `output`
    was made from one and not remade since (STALE_OUTPUTS): that job is forced, and its
    inputs are left as they are, so that the forced check (or refit) before it reaches it
    too (Snakemake does not go on through inputs that are all ancient)."""
    changed = CHANGED_READS.intersection(map(str, paths if reads is None else reads))
    if changed or str(output) in STALE_OUTPUTS:
        if workflow.dag is not None:
            workflow.dag.forcefiles.add(str(output))
        return paths
    return as_read(dataset, paths)


# Simulated raw files made from another config section than this run's: path -> what differs.
STALE_SIMULATED = {}


def config_stamp(dataset, name):
    """No input: a simulated raw file whose own config_sha256 is not this config section's
    hash (provenance.simulated_change) is forced, when its job is in this run's DAG (the
    input function runs only then): a dry run lists it and writes nothing, an unrelated
    target leaves it alone, Snakemake's metadata is not needed, and onstart says what
    changed only for the files this run remakes."""
    section = provenance.sections(config)[name]
    for rel in provenance.stamped_files(name):
        raw = RESULTS / dataset / rel
        changed = provenance.simulated_change(raw, name, section)
        if changed is not None and workflow.dag is not None:
            workflow.dag.forcefiles.add(str(raw))
            STALE_SIMULATED[str(raw)] = changed
    return []


def print_remade_simulations():
    remade = {str(f) for job in workflow.dag.needrun_jobs() for f in job.output}
    for raw, changed in STALE_SIMULATED.items():
        if raw in remade and provenance.unreadable_change(changed):
            print(f"[xstage] {raw}: {changed[0]}", file=sys.stderr)
        elif raw in remade:
            print(
                f"[xstage] {raw}: made from another config than this run's "
                f"({'; '.join(changed) or 'its config_sha256 differs'}); remaking it",
                file=sys.stderr,
            )


def refuse_changed_measurements(dataset):
    """A measured raw file is never remade, nor reused, under a config it was not made with
    (compared with the config the raw files record: provenance.measured_changes)."""
    for name, section in provenance.sections(config).items():
        experiment = name.split("-", 1)[0]
        if experiment not in config["measured_experiments"]:
            continue
        changed = provenance.measured_changes(
            RESULTS / dataset, name, section, config["store_paths"], WORLD_SIZE
        )
        if changed:
            sys.exit(
                f"Refusing to go on: dataset '{dataset}' holds raw files measured with "
                f"another config ({'; '.join(changed)}). Measure into a new dataset "
                f"(datasets.measured) or move the old files away."
            )


if MEASURED and workflow.is_main_process:
    refuse_changed_measurements(MEASURED)

# Committed references: their jobs get Snakemake's metadata on the first run that executes
# jobs, and until then a dry run does not warn about them (committed.py).
if workflow.is_main_process:
    committed.quiet_missing_metadata(workflow, REFERENCE)

# A GPU job holds every GPU of this machine, whatever world size it measures at: the `gpu`
# resource defaults to the GPU count and each GPU job asks for all of it, so --cores all never
# runs two GPU jobs at once. On a cluster (submit) a job asks for its world size, on a node
# of its own (--exclusive in the slurm profile).
GPU_JOB = GPUS.count if PROBE and MEASURING else 0 if CPU_TEST else WORLD_SIZE
if PROBE and MEASURING and "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", GPUS.count)


def measuring(experiment):
    """Wildcard constraint of a measuring rule: this run's measured dataset when it measures
    `experiment`, else a name no dataset has (what is on disk is then only read, never remade)."""
    if MEASURED and experiment in config["measured_experiments"]:
        return MEASURED
    return "no-measured-dataset"


def measurement_verdict():
    if config["measure"] == "never":
        return "No measurement: config key 'measure' is 'never'; rendering existing datasets."
    if config["measure"] == "submit":
        return f"Measuring dataset '{MEASURED}' on {WORLD_SIZE} GPUs per job, through the executor."
    if CPU_TEST:
        return (
            f"Testing the measuring rules on the CPU (gloo, Triton interpreter) into "
            f"'{MEASURED}': a test of the harness, not a measurement."
        )
    if not MEASURING:
        return (
            f"No measurement was made on this machine: {GPUS.reason}. Rendering the "
            f"reference and simulated datasets only."
        )
    return (
        f"Measuring dataset '{MEASURED}' on {WORLD_SIZE} x {GPUS.names[GPU_IDS[0]]}, store "
        f"paths {', '.join(config['store_paths'])} "
        f"(experiments: {', '.join(config['measured_experiments'])})."
    )


def print_measurement_verdict():
    print(f"[xstage] {measurement_verdict()}", file=sys.stderr)


def dataset_experiments(dataset):
    """Which experiments a dataset holds: what this run makes, plus what is already there."""
    if dataset in SIMULATED:
        return set(layout.SIMULATED_EXPERIMENTS)
    on_disk = products.Holding.on_disk(RESULTS / dataset).experiments
    if dataset == MEASURED:
        return set(config["measured_experiments"]) | on_disk
    return set(on_disk)


def dataset_studies(dataset):
    """Microbench studies of a dataset: the config's where this run makes them, else those
    already on disk."""
    if dataset in SIMULATED or (
        dataset == MEASURED and "microbench" in config["measured_experiments"]
    ):
        return STUDIES
    return layout.studies_on_disk(RESULTS / dataset)


def dataset_contents(dataset):
    """The contents of a dataset's files that some products need (products.LEAD_SWEEP):
    what this run's config makes where it measures them, else what the files on disk hold."""
    if dataset in SIMULATED:
        return frozenset()
    if dataset == MEASURED and "megamoe" in config["measured_experiments"]:
        return products.contents_of_config(config, config["measured_experiments"])
    return products.contents_on_disk(RESULTS / dataset)


def holding(dataset):
    """What a dataset holds or this run makes of it; its products follow (products.py)."""
    return products.Holding.of(
        dataset_experiments(dataset), dataset_studies(dataset), dataset_contents(dataset)
    )


def dataset_paths(dataset, reads):
    """Dataset-relative reads (products.Product.reads) as this dataset's paths."""
    return [str(RESULTS / dataset / read) for read in holding(dataset).reads(reads)]


def all_raw(dataset):
    """Every raw file a dataset has or will have (for the tables that read everything)."""
    return dataset_paths(dataset, (layout.ALL_RAW,))


def measured_raw_files():
    """The raw files this run's measuring rules write (all_raw lists the traces too)."""
    return all_raw(MEASURED) if MEASURED else []


def product_output(dataset, product, companion=False):
    return str(product.output(RESULTS / dataset, companion))


def datasets():
    names = list(SIMULATED) + list(REFERENCE)
    if MEASURED:
        names.append(MEASURED)
    return names


def dataset_products(dataset):
    """Every figure and table a dataset can give (made now or already there)."""
    if dataset in REFERENCE and not (RESULTS / dataset).is_dir():
        return []
    has = holding(dataset)
    return [product_output(dataset, p) for p in products.PRODUCTS.values() if has.gives(p)]


def dataset_targets(dataset):
    """What a run makes of a dataset: all its products, or, for a reference, the missing."""
    if dataset in REFERENCE and not (RESULTS / dataset).is_dir():
        print(
            f"[xstage] reference dataset '{dataset}' is not in {RESULTS}/: skipped", file=sys.stderr
        )
        return []
    targets = dataset_products(dataset)
    if dataset in CHANGED_REFERENCES:
        return targets + reference_checked(dataset)
    if dataset in REFERENCE:
        # A reference is committed as rendered: a run asks only for what is missing, so a
        # fresh clone's checkout times never remake (and rewrite) it. Name a file to remake it.
        targets = [t for t in targets + reference_checked(dataset) if not Path(t).exists()]
    return targets


def all_targets():
    return built_kernels() + [t for dataset in datasets() for t in dataset_targets(dataset)]


def simulated_profile(wildcards):
    """The hardware profile a simulated dataset is made from (datasets.simulated)."""
    dataset = wildcards.dataset
    if dataset not in SIMULATED:
        makers = [
            p.name for p in sorted(Path("config").glob("*.yaml")) if f"{dataset}:" in p.read_text()
        ]
        hint = f" (--configfile config/{makers[0]} makes it)" if makers else ""
        raise WorkflowError(
            f"dataset '{dataset}' is not in config key 'datasets.simulated' of this run's "
            f"config ({', '.join(SIMULATED) or 'none'}){hint}"
        )
    return SIMULATED[dataset]


# --- build ---

CUDA_SOURCES = sorted(Path("kernels").rglob("*.cu"))
NVCC = shutil.which("nvcc")


def cubin_path(source):
    return f"build/kernels/sm_90/{Path(source).stem}.cubin"


def built_kernels():
    if NVCC is None:
        print(
            "[xstage] nvcc not found: the CUDA kernels were not built (measuring needs them; "
            "rendering does not)",
            file=sys.stderr,
        )
        return []
    return [cubin_path(s) for s in CUDA_SOURCES]


# --- model ---


def megamoe_model(experiment):
    """The dataset's fitted Burst-Gap model, an input of a MegaMoE measuring rule when one of
    its leads is 'auto' (megamoe/ours/lead.py): the microbenchmarks and the fit then run first."""

    def model(wildcards):
        moe = config["megamoe"]
        auto = needs_model(moe) if experiment == "megamoe" else moe.get("lead_rows") == AUTO
        return [str(RESULTS / wildcards.dataset / layout.MODEL_JSON)] if auto else []

    return model


def megamoe_model_arg(experiment):
    """The `--model` option that passes that file to the measuring job (or nothing)."""
    return lambda wildcards: " ".join(
        f"--model {shlex.quote(path)}" for path in megamoe_model(experiment)(wildcards)
    )


def model_raw(dataset):
    """The microbenchmark raw files a dataset's model is fitted to."""
    return [str(RESULTS / dataset / layout.microbench_raw(s)) for s in dataset_studies(dataset)]


def model_inputs(wildcards):
    dataset = wildcards.dataset
    return as_read_by(RESULTS / dataset / layout.MODEL_JSON, dataset, model_raw(dataset))


def playback_inputs(wildcards):
    """The MegaMoE playback's reads: the kernel's arms and the model they are played through."""
    dataset = wildcards.dataset
    files = [str(RESULTS / dataset / rel) for rel in (layout.MEGAMOE_RAW, layout.MODEL_JSON)]
    output = RESULTS / dataset / layout.MEGAMOE_PLAYBACK
    return as_read_by(output, dataset, files + reference_checked(dataset), reads=files)


def model_checked(wildcards):
    """The fit's wait for a reference's check (reference_checked)."""
    dataset = wildcards.dataset
    model = RESULTS / dataset / layout.MODEL_JSON
    return as_read_by(model, dataset, reference_checked(dataset), reads=model_raw(dataset))


# --- figures and tables ---


def as_read(dataset, paths):
    """A reference dataset is committed as rendered: its files count as old, so a fresh
    clone's checkout times never remake (and rewrite) them; a missing one is still made
    (and one that changed: force_if_reads_changed)."""
    return [ancient(p) for p in paths] if dataset in REFERENCE else paths


def product_reads(dataset, product):
    """A figure's or table's declared reads (products.py), of this dataset and of the
    datasets shown beside it."""
    files = dataset_paths(dataset, product.reads)
    if product.counterpart_reads:
        for other in products.counterpart_datasets(dataset, dataset in SIMULATED):
            if other in datasets():
                files += dataset_paths(other, product.counterpart_reads)
    return files


def product_inputs(product):
    """A figure's or table's inputs: exactly its reads, and its reference's check."""

    def inputs(wildcards):
        dataset = wildcards.dataset
        files = product_reads(dataset, product)
        output = product_output(dataset, product)
        return as_read_by(output, dataset, files + reference_checked(dataset), reads=files)

    return inputs


def outputs_made_from_changed_raw():
    """The models, figures and tables on disk made from a reference's raw file that
    changed since its check (CHANGED_READS), directly or through the model."""
    if not CHANGED_READS:
        return []
    outputs = []
    for dataset in CHANGED_REFERENCES:
        if str(RESULTS / dataset / layout.MODEL_JSON) in CHANGED_READS:
            outputs += [RESULTS / dataset / f for f in (layout.MODEL_JSON, layout.MODEL_PROFILE)]
        if str(RESULTS / dataset / layout.MEGAMOE_PLAYBACK) in CHANGED_READS:
            outputs.append(RESULTS / dataset / layout.MEGAMOE_PLAYBACK)
    for dataset in datasets():
        for product in products.PRODUCTS.values():
            if holding(dataset).gives(product) and CHANGED_READS.intersection(
                product_reads(dataset, product)
            ):
                outputs += [product_output(dataset, product, c) for c in (False, True)]
    return [str(p) for p in outputs if Path(p).exists()]


def record_outputs_of_changed_raw():
    """onstart: this run's check of a changed reference rewrites its listing; what was made
    from the old files is recorded until remade (stale_products.py)."""
    stale_products.mark(outputs_made_from_changed_raw())


def reference_checked(dataset):
    """A committed reference's raw-file check (check_reference in report.smk): an input of
    its products, so that every dataset's jobs sit at the same depth of the DAG (the
    report's rule graph lists each rule once). Committed with the reference and read as
    old (as_read), it never remakes what is committed."""
    return [str(RESULTS / dataset / REFERENCE_CHECK)] if dataset in REFERENCE else []


wildcard_constraints:
    dataset=r"[A-Za-z0-9._-]+",
    study=r"[a-z0-9_]+",


# --- report (report.smk) ---

SUMMARY = str(RESULTS / "report" / "summary.html")


def summary_inputs(wildcards):
    figures, tables, raw = [], [], []
    for dataset in datasets():
        for target in dataset_products(dataset):
            if target.endswith(".pdf"):
                figures.append(target[: -len(".pdf")] + ".png")
            elif Path(target).name == "tab-claims.csv":
                tables.append(target)
        raw += all_raw(dataset)
    captions = [f"workflow/report/{p.name}.rst" for p in products.FIGURES]
    inputs = {"figures": figures, "claims": tables, "raw": raw, "captions": captions}
    if REPORTING:
        check_summary_made_from(figures + tables + raw)
    return inputs


# `snakemake --report` shows the summary page the last run made (report_summary): it must be
# of this config's datasets, or the report would name datasets its sections do not show.
REPORTING = workflow.is_main_process and any(
    a == "--report" or a.startswith("--report=") for a in sys.argv
)


def _datasets_of(paths):
    return sorted({Path(p).parts[1] for p in paths if Path(p).parts[:1] == (RESULTS.name,)})


def check_summary_made_from(inputs):
    meta = workflow.persistence.metadata(IOFile(SUMMARY)) if Path(SUMMARY).exists() else None
    if meta is None or not meta.input:
        return
    made, now = _datasets_of(meta.input), _datasets_of(inputs)
    if made != now:
        raise WorkflowError(
            f"{SUMMARY} was made by a run of datasets {', '.join(made)}, this config has "
            f"{', '.join(now)}: build the report with that run's config (after the smoke run: "
            "snakemake --report report.html --configfile config/smoke.yaml), or run this "
            "config first"
        )
