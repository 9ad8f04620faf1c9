"""The seeded inputs of a configuration: each rank's expert weights and home tokens.

Both are seeded by what they depend on (the weights by shape, precision and rank; the
tokens by shape, T, P and home rank), so every configuration of a shape shares its
weights, and every process model (one process driving every GPU, problem.py; one per
GPU, distributed.py) and baseline that rebuilds a rank's inputs gets the same values.
On the host path the remote fraction is a host share, not a re-homing (`host_share`,
`routing_point`).
"""

from __future__ import annotations

import math
import zlib

from xstage_bench.data import grid, storepath
from xstage_bench.megamoe import routing
from xstage_bench.megamoe.quant import (
    INT4_MAX,
    INT4_MIN,
    SCALE_BLOCK,
    check_precision,
    pack_int4,
    quantize_rows,
)
from xstage_bench.megamoe.reference import ExpertWeights, HomeTokens

# standard deviation of integers uniform in [INT4_MIN, INT4_MAX]
INT4_STD = math.sqrt(((INT4_MAX - INT4_MIN + 1) ** 2 - 1) / 12)


def _seed(*parts: object) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode())


def _generator(torch, device, *parts: object):
    gen = torch.Generator(device=device)
    gen.manual_seed(_seed(*parts))
    return gen


def make_expert_weights(point: dict, precision: str, rank: int, device, seed: int = 0):
    """Random weights of one rank's E/P experts in the kernel's storage format.

    Values are normal (bf16, w8a8) or uniform 4-bit integers (w4a8), with block scales
    uniform in [0.5, 1.5] over the fan-in's square root, so activations stay of order one.
    Seeded by shape, precision and rank: every configuration of a shape shares them.
    """
    import torch

    check_precision(precision)
    H, I, E, P = point["H"], point["I"], point["E"], point["world_size"]  # noqa: E741
    local = E // P
    gen = _generator(torch, device, seed, point["shape"], precision, f"rank={rank}")

    def one(n: int, k: int):
        if precision == "bf16":
            w = torch.empty(local, n, k, dtype=torch.bfloat16, device=device)
            for e in range(local):
                w[e] = torch.randn(n, k, generator=gen, device=device) / math.sqrt(k)
            return w, None
        spread = 1.0 if precision == "w8a8" else INT4_STD
        scales = (
            torch.rand(local, n // SCALE_BLOCK, k // SCALE_BLOCK, generator=gen, device=device)
            + 0.5
        ) / (spread * math.sqrt(k))
        if precision == "w8a8":
            w = torch.empty(local, n, k, dtype=torch.float8_e4m3fn, device=device)
            for e in range(local):
                w[e] = torch.randn(n, k, generator=gen, device=device).to(torch.float8_e4m3fn)
        else:
            w = torch.empty(local, n, k // 2, dtype=torch.uint8, device=device)
            for e in range(local):
                ints = torch.randint(INT4_MIN, INT4_MAX + 1, (n, k), generator=gen, device=device)
                w[e] = pack_int4(ints.to(torch.int8))
        return w, scales

    w1, s1 = one(2 * I, H)
    w2, s2 = one(H, I)
    return ExpertWeights(w1, s1, w2, s2)


def host_share(point: dict) -> float:
    """The share of each home rank's tokens whose combine rows go to host memory: the
    point's remote_fraction on the host path ('natural' there is 0), else 0."""
    if storepath.point_path(point) != storepath.HOST:
        return 0.0
    f = point.get("remote_fraction", 0.0)
    return 0.0 if f == grid.NATURAL else float(f)


def routing_point(point: dict) -> dict:
    """The point as routing sees it: on the host path the remote fraction is a host share,
    not a re-homing, so routing stays natural."""
    if storepath.point_path(point) == storepath.HOST:
        return {k: v for k, v in point.items() if k != "remote_fraction"}
    return point


def make_home_tokens(point: dict, precision: str, rank: int, device, seed: int = 0) -> HomeTokens:
    """One home rank's tokens (normal, then FP8-quantized per 128 channels unless bf16),
    their experts and combine weights (routing.route)."""
    import torch

    moe_key = (point["shape"], f"T={point['tokens_per_rank']}", f"P={point['world_size']}")
    gen = _generator(torch, device, seed, *moe_key, f"home={rank}")
    x = torch.randn(point["tokens_per_rank"], point["H"], generator=gen, device=device)
    ids, weights = routing.route(routing_point(point), point["skew_zipf"], rank, seed)
    if precision == "bf16":
        return HomeTokens(x.to(torch.bfloat16), None, ids, weights)
    xq, xs = quantize_rows(x)
    return HomeTokens(xq, xs, ids, weights)
