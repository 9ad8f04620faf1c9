"""The command-line options that restrict the MegaMoE grid, shared by both process
models' commands (runner.py, distributed.py).
"""

from __future__ import annotations

import argparse
import dataclasses

from xstage_bench.data.config import load_config
from xstage_bench.measurement import timing
from xstage_bench.megamoe.points import CHECK_TOKENS, select


def add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line options that restrict the MegaMoE grid (see `select`)."""
    parser.add_argument("--config", required=True, help="config.yaml")
    parser.add_argument("--dataset", required=True, help="dataset name")
    parser.add_argument("--shapes", help="comma-separated shape names (default: all)")
    parser.add_argument("--precisions", help="comma-separated: w4a8, w8a8, bf16")
    parser.add_argument("--routings", help="comma-separated: balanced, skewed")
    parser.add_argument("--tokens", help="comma-separated tokens per rank")
    parser.add_argument(
        "--check-tokens",
        type=int,
        default=CHECK_TOKENS,
        help="tokens per home rank compared with the reference",
    )


def selected_grid(args: argparse.Namespace) -> tuple[dict, dict]:
    """(config, its megamoe section restricted as the options of add_grid_arguments say)."""
    config = load_config(args.config)

    def split(value):
        return value.split(",") if value else None

    moe = select(
        config["megamoe"],
        split(args.shapes),
        split(args.precisions),
        split(args.routings),
        split(args.tokens),
        split(getattr(args, "variants", None)),
    )
    return config, moe


def megamoe_policy(config: dict, moe: dict) -> timing.TimingPolicy:
    """The timing block's policy with the MegaMoE section's host_lead: every variant's
    timed call starts with the GPU busy, so its events time GPU work (timing.HostLead)."""
    policy = timing.TimingPolicy.from_config(config["timing"])
    return dataclasses.replace(policy, host_lead=bool(moe.get("host_lead", False)))
