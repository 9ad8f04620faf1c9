"""`xstage`: the harness's command line. The Snakefile is the main entry; this is for
checking inputs and running one piece by hand."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from xstage_bench.data.compare import DEFAULT_TOLERANCE, CompareError
from xstage_bench.data.config import ConfigError, load_config
from xstage_bench.data.results import FAILED_STATUSES, OK, RawResultError, read_raw


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
    from xstage_bench.report import readme_results

    block = readme_results.section(args.results)
    if not args.write:
        print(block)
        return 0
    text = args.readme.read_text()
    args.readme.write_text(readme_results.replace_in(text, block))
    print(f"{args.readme}: generated results block written")
    return 0


def _validate(args: argparse.Namespace) -> int:
    load_config(args.config)
    print(f"{args.config}: valid")
    return 0


def _check(args: argparse.Namespace) -> int:
    for path in args.raw:
        doc = read_raw(path)
        statuses = Counter(r["status"] for r in doc["records"])
        not_ok = sum(statuses[s] for s in FAILED_STATUSES)
        print(
            f"{path}: valid, {doc['experiment']} ({doc['backend']}), "
            f"{len(doc['records'])} records, {statuses[OK]} ok, {not_ok} not ok"
            + "".join(f", {statuses[s]} {s}" for s in FAILED_STATUSES if statuses[s])
        )
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from xstage_bench.sim import run

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


def _render(args: argparse.Namespace) -> int:
    from xstage_bench.report.render import render_product

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

    p = sub.add_parser("validate", help="validate a configuration file")
    p.add_argument("config")
    p.set_defaults(func=_validate)

    p = sub.add_parser("check", help="validate raw result files")
    p.add_argument("raw", nargs="+")
    p.set_defaults(func=_check)

    p = sub.add_parser("simulate", help="write one simulated raw file")
    p.add_argument("experiment", choices=["microbench", "megamoe", "megamoe_trace", "attention"])
    p.add_argument("--config", default="config.yaml")
    p.add_argument("--profile", required=True, help="hardware profile (config/hardware/*.yaml)")
    p.add_argument("--dataset", required=True)
    p.add_argument("--study", help="microbench study name")
    p.add_argument("--out", required=True)
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
        "readme", help="print the README's results section, generated from results/ref-*"
    )
    p.add_argument("--write", action="store_true", help="replace README.md's generated block")
    p.add_argument("--readme", type=Path, default=Path("README.md"))
    p.add_argument("--results", type=Path, default=Path("results"))
    p.set_defaults(func=_readme)

    p = sub.add_parser("render", help="render one figure or table of a dataset")
    p.add_argument("name", help="e.g. fig-drain or tab-megamoe")
    p.add_argument("dataset_dir", help="results/<dataset>")
    p.add_argument("out", help="output .pdf (figures) or .csv (tables)")
    p.set_defaults(func=_render)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, RawResultError, CompareError, OSError) as e:  # each names its file
        print(f"xstage: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
