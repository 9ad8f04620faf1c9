"""`xstage`: the harness's command line. The Snakefile is the main entry; this is for
checking inputs and running one piece by hand."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from xstage_bench.data import layout
from xstage_bench.data.compare import DEFAULT_TOLERANCE, CompareError
from xstage_bench.data.config import ConfigError, load_config
from xstage_bench.data.results import (
    FAILED_STATUSES,
    OK,
    RawResultError,
    atomic_write_text,
    read_raw,
)
from xstage_bench.model.document import ModelFileError
from xstage_bench.report.analysis.load import NoDataError


class UsageError(ValueError):
    """An argument the command cannot act on; the message names it and what it takes."""


def _probe(args: argparse.Namespace) -> int:
    from xstage_bench.measurement.machine import dataset_name, probe_gpus

    gpus = probe_gpus()
    print(f"GPUs: {gpus.count} {sorted(set(gpus.names))}")
    if gpus.can_measure:
        paths = ", ".join(gpus.paths)
        print(f"can measure: yes (dataset '{dataset_name(gpus.names)}', store paths: {paths})")
        if gpus.reason:
            print(f"  no peer path: {gpus.reason}")
    else:
        print(f"can measure: no ({gpus.reason})")
    return 0


def _readme(args: argparse.Namespace) -> int:
    from xstage_bench.report import generated_docs

    root = args.readme.parent  # docs/ lies beside the README
    if not args.write:
        for _, block in generated_docs.blocks(root, args.results):
            print(block)
        return 0
    try:
        texts = generated_docs.made(root, args.results)
    except ValueError as e:  # made's only error: a file lacks a block's markers
        raise UsageError(str(e)) from None
    for name, text in texts.items():
        atomic_write_text(root / name, text)
        print(f"{root / name}: generated blocks written")
    return 0


def _workflow_dir(config: Path) -> Path | None:
    """The folder at or above a config file that holds the Snakefile, if any."""
    folder = config.resolve().parent
    return next((d for d in (folder, *folder.parents) if (d / "Snakefile").is_file()), None)


def _measured_world_size(config: dict) -> list[str]:
    """Under world_size 'auto', the world size a measurement here is made at, checked as
    the run checks it (preflight.py); what was and was not checked, in words."""
    from xstage_bench.measurement.machine import probe_gpus
    from xstage_bench.run import preflight

    if config["world_size"] != "auto":
        return []
    probes = config["measure"] in ("auto", "always") and not preflight.is_cpu_test(config)
    gpus = probe_gpus() if probes and not config.get("gpu_ids") else None
    ranks = preflight.measured_world_size(config, gpus)
    if ranks is not None:
        preflight.check_measured_world_size(config, ranks)
        return [f"world_size 'auto': measured at {preflight.measured_ranks(config, ranks)}"]
    if probes:
        return [
            "world_size 'auto': no measured world size checked, as no GPU can measure here: "
            f"{gpus.reason}. A run on GPUs checks their count before any job"
        ]
    return []


def _validate(args: argparse.Namespace) -> int:
    from xstage_bench.run import preflight

    config = load_config(args.config)
    try:
        measured = _measured_world_size(config)  # first, as the run checks it
        profiles = preflight.check_before_work(config, _workflow_dir(Path(args.config)))
    except ConfigError as e:
        raise ConfigError(f"{args.config}: {e}") from None
    notes = []
    if config["world_size"] == "auto" and profiles:
        nodes = ", ".join(f"{d} at {p.world_size}" for d, p in profiles.items())
        notes.append(
            f"world_size 'auto': simulated datasets checked at their nodes' GPUs ({nodes})"
        )
    notes += measured
    missing = preflight.cpu_test_problem(config)
    if missing:
        notes.append(f"a run from this Python stops before any job: {missing}")
    print(f"{args.config}: valid" + "".join(f"\n  {note}" for note in notes))
    return 0


def _raw_files_of(path: Path) -> list[Path]:
    """A file as itself; a dataset folder (results/<dataset>) or its raw/ folder as the
    dataset's final raw files (layout.raw_files: resume state is not a raw file)."""
    if not path.is_dir():
        return [path]
    files = layout.raw_files(path.parent if path.name == "raw" else path)
    if not files:
        raise UsageError(
            f"{path}: a directory with no raw files; name raw files, a dataset folder "
            "(results/<dataset>) or its raw/ folder"
        )
    return files


def _references(config: str | None) -> set[str]:
    """The config's reference datasets (datasets.reference): config.yaml's where none is
    named and the working directory has one."""
    if config is None:
        config = "config.yaml" if Path("config.yaml").is_file() else None
    return set(load_config(config)["datasets"]["reference"]) if config else set()


def _reference_of(path: Path, references: set[str]) -> str | None:
    """The reference dataset a raw file is in (<dataset>/raw/...), or None."""
    for folder in path.resolve().parents:
        if folder.name == "raw":
            return folder.parent.name if folder.parent.name in references else None
    return None


def _check_one(path: Path, references: set[str]) -> None:
    doc = read_raw(path, _reference_of(path, references))
    statuses = Counter(r["status"] for r in doc["records"])
    not_ok = sum(statuses[s] for s in FAILED_STATUSES)
    print(
        f"{path}: valid, {doc['experiment']} ({doc['backend']}), "
        f"{len(doc['records'])} records, {statuses[OK]} ok, {not_ok} not ok"
        + "".join(f", {statuses[s]} {s}" for s in FAILED_STATUSES if statuses[s])
    )


def _check(args: argparse.Namespace) -> int:
    # Every file gets its verdict: one bad file must not hide the state of the rest.
    bad = 0
    references = _references(args.config)
    for path in (f for given in args.raw for f in _raw_files_of(Path(given))):
        try:
            _check_one(path, references)
        except (RawResultError, OSError) as e:
            print(f"xstage: error: {e}", file=sys.stderr)
            bad += 1
    if bad:
        raise UsageError(f"{bad} raw file(s) not valid (named above)")
    return 0


def _holds_simulated_data(path: Path) -> bool:
    """Whether the raw file at `path` says it was simulated (environment.simulated); a
    file that does not parse is not known to be simulated."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    environment = doc.get("environment") if isinstance(doc, dict) else None
    return isinstance(environment, dict) and environment.get("simulated") is True


def _refuse_to_replace_measured(out: Path) -> None:
    """Simulating over a measured raw file would lose measurements no rerun here gives back."""
    if out.exists() and not _holds_simulated_data(out):
        raise UsageError(
            f"--out {out}: the file there is not a simulated raw file (its environment does "
            "not say simulated: true), and simulating would replace it; write to another "
            "path, e.g. results/sim-<name>/raw/..."
        )


def _simulate(args: argparse.Namespace) -> int:
    from xstage_bench.sim import run

    _refuse_to_replace_measured(Path(args.out))
    config = load_config(args.config)
    if args.experiment == "microbench":
        if not args.study:
            raise ConfigError("xstage simulate microbench needs --study")
        run.simulate_microbench(config, args.profile, args.study, args.dataset, args.out)
    else:
        getattr(run, f"simulate_{args.experiment}")(config, args.profile, args.dataset, args.out)
    return 0


def _fit(args: argparse.Namespace) -> int:
    from xstage_bench.model.fit import fit_files

    fit_files(args.raw, args.dataset, args.out_json, args.out_profile, args.base_profile)
    return 0


def _check_product_and_suffix(name: str, out: Path) -> None:
    """A known product, and an output name of its kind: a figure is saved in the format its
    suffix names (a .csv fails inside matplotlib), a table is written as CSV whatever the
    name says (a .pdf would hold CSV)."""
    from xstage_bench.report import products

    if name not in products.PRODUCTS:
        raise UsageError(f"unknown product '{name}'; known: {', '.join(products.PRODUCTS)}")
    is_figure = name in {p.name for p in products.FIGURES}
    kind, suffix, beside = ("figure", ".pdf", ".png") if is_figure else ("table", ".csv", ".md")
    if out.suffix != suffix:
        raise UsageError(
            f"{out}: {name} is a {kind}; its output must end in {suffix} "
            f"(a {beside} copy is written beside it)"
        )


def _render(args: argparse.Namespace) -> int:
    from xstage_bench.report.render import render_product

    _check_product_and_suffix(args.name, Path(args.out))
    render_product(args.name, Path(args.dataset_dir), Path(args.out))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from xstage_bench.data.compare import compare_docs

    comparison = compare_docs(
        read_raw(args.a), read_raw(args.b), metric=args.metric, tolerance=args.tolerance
    )
    print(f"a: {args.a}\nb: {args.b}")
    print("\n".join(comparison.lines()))
    if args.csv:
        comparison.rows.to_csv(args.csv, index=False)
        print(f"per-point rows: {args.csv}")
    summary = comparison.summary()
    return 0 if summary["points"] and summary["agree"] == summary["points"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xstage", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("probe", help="list GPUs and whether this machine can measure").set_defaults(
        func=_probe
    )

    p = sub.add_parser(
        "validate",
        help="validate a configuration file as a run from this directory checks it",
        description="Validate a configuration file: its keys, then what a run from this "
        "directory checks before any work (hardware profiles, reference datasets, the world "
        "size each dataset is made at; under world_size auto, this machine's GPUs).",
    )
    p.add_argument("config")
    p.set_defaults(func=_validate)

    p = sub.add_parser(
        "check",
        help="validate raw result files (exit 2 when any is not valid)",
        description="Validate raw result files and count their records' statuses. Every "
        "file is checked; the exit status is 2 when any is not valid.",
    )
    p.add_argument(
        "raw",
        nargs="+",
        help="raw JSON files; a dataset folder (results/<dataset>) or its raw/ folder "
        "stands for the dataset's raw files",
    )
    p.add_argument(
        "--config",
        help="the config whose datasets.reference are measured whatever their files say "
        "(default: config.yaml, where there is one)",
    )
    p.set_defaults(func=_check)

    p = sub.add_parser("simulate", help="write one simulated raw file")
    p.add_argument("experiment", choices=["microbench", "megamoe", "megamoe_trace", "attention"])
    p.add_argument("--config", default="config.yaml")
    p.add_argument("--profile", required=True, help="hardware profile (config/hardware/*.yaml)")
    p.add_argument("--dataset", required=True)
    p.add_argument("--study", help="microbench study name")
    p.add_argument(
        "--out",
        required=True,
        help="raw JSON to write; refused when it holds a raw file that is not simulated",
    )
    p.set_defaults(func=_simulate)

    p = sub.add_parser("fit", help="fit the Burst-Gap model to microbench raw files")
    p.add_argument("raw", nargs="+")
    p.add_argument("--dataset", required=True)
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-profile", required=True)
    p.add_argument("--base-profile")
    p.set_defaults(func=_fit)

    p = sub.add_parser(
        "compare",
        help="compare two runs of one experiment point by point (exit 1 when any disagrees)",
    )
    p.add_argument("a", help="raw JSON of the first run")
    p.add_argument("b", help="raw JSON of the second run (ratios are b/a)")
    p.add_argument("--metric", help="sample name (default: time_us or sender_us)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help=f"relative (default {DEFAULT_TOLERANCE})",
    )
    p.add_argument("--csv", help="also write the per-point rows here")
    p.set_defaults(func=_compare)

    p = sub.add_parser(
        "readme",
        help="print the generated blocks of README.md and docs/ (claims, nodes, results, "
        "configuration keys, figures and tables)",
    )
    p.add_argument(
        "--write", action="store_true", help="write them into README.md and the docs/ beside it"
    )
    p.add_argument("--readme", type=Path, default=Path("README.md"))
    p.add_argument("--results", type=Path, default=Path("results"))
    p.set_defaults(func=_readme)

    p = sub.add_parser("render", help="render one figure or table of a dataset")
    p.add_argument("name", help="e.g. fig-drain or tab-megamoe")
    p.add_argument("dataset_dir", help="results/<dataset>")
    p.add_argument("out", help="output .pdf (figures) or .csv (tables)")
    p.set_defaults(func=_render)
    return parser


def expected_errors() -> tuple[type[Exception], ...]:
    """Errors of bad input, each naming its file, key or argument; anything else is a bug
    and keeps its traceback. (FitError's module loads scipy, so it is imported only when an
    error has happened, not by every command.)"""
    from xstage_bench.model.records import FitInputError
    from xstage_bench.model.stages import FitError

    return (
        ConfigError,
        RawResultError,
        CompareError,
        NoDataError,
        ModelFileError,
        FitError,
        FitInputError,
        UsageError,
        OSError,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except expected_errors() as e:  # evaluated only once an error is raised
        print(f"xstage: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
