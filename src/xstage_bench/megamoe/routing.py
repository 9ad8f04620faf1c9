"""Which experts each token goes to, and where every routed row lands (numpy only).

Expert parallelism over P ranks: rank q holds global experts [q E/P, (q+1) E/P). Every
rank is also a home rank with T tokens of its own; each token picks top-k distinct
experts. The rows (token, k) routed to rank q are laid out expert-major, each local
expert's rows padded up to a multiple of block_m, so that a row block belongs to one
expert (the layout DeepGEMM's grouped GEMMs call "contiguous"). A row's destination is
its home rank's combine buffer, slot t * topk + k.

Routing is seeded by the shape, the token count and the world size (not the precision),
so both precisions and both schedules of a shape see the same tokens and experts.

The remote fraction f is the share of a home rank's (token, k) rows whose expert lives on
another rank, so that their outputs cross NVLink in the combine. Left "natural", routing
spreads experts over all ranks and f is about (P-1)/P (1/2 on 2 GPUs, 7/8 on 8). A number
re-homes rows to carry another node's per-GPU traffic on this one (7/8 on 2 GPUs): a
seeded choice of exactly round(f T topk) of the rank's rows is routed among the other
ranks' experts, the rest among its own, by the same balanced or skewed rule restricted to
those experts. Expert loads stay balanced across ranks, since every rank does the same.

On the host store path (storepath.HOST) the remote fraction is a *host share* instead, and
routing stays natural: a seeded choice of exactly round(f T) of each home rank's tokens
(`host_tokens`) have all their top-k combine rows stored into that home rank's combine
buffer in host memory, the rest into its GPU's. The choice is seeded by the shape, the
token count, the world size, the routing and the home rank, not by f: a smaller share's
tokens are a subset of a larger one's.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from xstage_bench.data.grid import NATURAL
from xstage_bench.megamoe.quant import bf16_round

ROUTINGS = ("balanced", "skewed")


def _rng(seed: int, *parts: object) -> np.random.Generator:
    key = "/".join(str(p) for p in parts)
    return np.random.default_rng([seed, zlib.crc32(key.encode())])


def route(
    point: dict, skew_zipf: float, home_rank: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(expert ids (T, topk) int64, combine weights (T, topk) float32) of one home rank.

    balanced: the T*topk (token, k) pairs go round-robin over a seeded permutation of the
    experts, so every expert gets T*topk/E rows (+-1) from every home rank. skewed: each
    token draws topk distinct experts with probability proportional to Zipf(skew_zipf)
    weights over a seeded expert order shared by all ranks (the same experts are hot
    everywhere), by the Gumbel-top-k trick. Combine weights are a softmax of normal draws,
    rounded to bf16 so that a bf16 combine multiplies them exactly.
    """
    T, topk, E, P = point["tokens_per_rank"], point["topk"], point["E"], point["world_size"]
    routing = point["routing"]
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    if not 0 < topk <= E:
        raise ValueError(f"topk must be in [1, E={E}], got {topk}")
    order = _rng(seed, point["shape"], "experts").permutation(E)
    rng = _rng(seed, point["shape"], f"T={T}", f"P={P}", routing, f"home={home_rank}")
    fraction = point.get("remote_fraction", NATURAL)
    if fraction != NATURAL:
        ids = _route_with_remote_fraction(point, float(fraction), order, home_rank, skew_zipf, rng)
    elif routing == "balanced":
        pair = home_rank * T * topk + np.arange(T * topk)
        ids = order[pair % E].reshape(T, topk)
    else:
        log_w = -skew_zipf * np.log(np.arange(1, E + 1, dtype=np.float64))
        keys = log_w[np.argsort(order)] + rng.gumbel(size=(T, E))  # expert order[i] has rank i
        ids = np.argpartition(-keys, topk - 1, axis=1)[:, :topk]
    logits = rng.standard_normal((T, topk))
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights = bf16_round((weights / weights.sum(axis=1, keepdims=True)).astype(np.float32))
    return ids.astype(np.int64), weights


def host_tokens(point: dict, fraction: float, home_rank: int, seed: int = 0) -> np.ndarray:
    """The sorted indices of one home rank's host-homed tokens: exactly round(f T) of its
    T tokens, a seeded choice (see module doc); none at f = 0, all at f = 1."""
    T = point["tokens_per_rank"]
    fraction = float(fraction)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(
            f"host share (remote_fraction on the host path) must be in [0, 1], got {fraction}"
        )
    parts = (point["shape"], f"T={T}", f"P={point['world_size']}", point["routing"])
    rng = _rng(seed, *parts, f"home={home_rank}", "host")
    return np.sort(rng.permutation(T)[: round(fraction * T)])


def _route_with_remote_fraction(
    point: dict,
    fraction: float,
    order: np.ndarray,
    home_rank: int,
    skew_zipf: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Expert ids (T, topk) with exactly round(fraction T topk) rows on other ranks."""
    T, topk, E, P = point["tokens_per_rank"], point["topk"], point["E"], point["world_size"]
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"remote_fraction must be in [0, 1] or 'natural', got {fraction}")
    local = E // P
    mine = order // local == home_rank  # order[i] lives on this rank
    groups = {False: order[mine], True: order[~mine]}  # local experts, remote experts
    remote = np.zeros(T * topk, dtype=bool)
    remote[rng.permutation(T * topk)[: round(fraction * T * topk)]] = True
    remote = remote.reshape(T, topk)
    for is_remote, experts in groups.items():
        need = np.count_nonzero(remote == is_remote, axis=1).max(initial=0)
        if need > len(experts):
            where = "other ranks'" if is_remote else "its own"
            raise ValueError(
                f"remote_fraction {fraction}: a token needs {need} distinct experts on "
                f"{where} ranks, which hold {len(experts)} (E={E}, P={P}, topk={topk})"
            )
    ids = np.empty((T, topk), dtype=np.int64)
    if point["routing"] == "balanced":
        # Each group's rows take its experts round-robin: a token's picks in a group are
        # consecutive, hence distinct; every home rank starts at its own offset.
        for is_remote, experts in groups.items():
            rows = np.flatnonzero(remote.ravel() == is_remote)
            turn = home_rank * T * topk + np.arange(len(rows))
            ids.ravel()[rows] = experts[turn % len(experts)]
        return ids
    log_w = -skew_zipf * np.log(np.arange(1, E + 1, dtype=np.float64))
    keys = log_w[np.argsort(order)] + rng.gumbel(size=(T, E))
    for is_remote, experts in groups.items():
        # Gumbel-top-k over the group: each token's n best experts in it, distinct.
        sub = keys[:, experts]
        ranked = experts[np.argsort(-sub, axis=1)]
        n = np.count_nonzero(remote == is_remote, axis=1)
        for t in np.flatnonzero(n):
            ids[t, remote[t] == is_remote] = ranked[t, : n[t]]
    return ids


@dataclass(frozen=True)
class RankRows:
    """The rows one expert rank receives, in its padded expert-major layout.

    Padding rows have home = token = slot = -1. blocks_* describe the block_m row blocks.
    """

    rank: int
    block_m: int
    expert_rows: np.ndarray  # (E/P,) rows per local expert
    home: np.ndarray  # (padded_rows,) home rank of each row
    token: np.ndarray  # (padded_rows,) token index on its home rank
    slot: np.ndarray  # (padded_rows,) t * topk + k in the home rank's combine buffer
    block_expert: np.ndarray  # (blocks,) local expert of each row block
    block_rows: np.ndarray  # (blocks,) valid rows in each row block

    @property
    def padded_rows(self) -> int:
        return len(self.home)

    @property
    def rows(self) -> int:
        return int(self.expert_rows.sum())

    @property
    def blocks(self) -> int:
        return len(self.block_rows)

    def remote_rows(self) -> int:
        """Rows whose home is another rank: their outputs cross NVLink in the combine."""
        return int(np.count_nonzero((self.home >= 0) & (self.home != self.rank)))


def dispatch_plan(ids: list[np.ndarray], E: int, block_m: int) -> list[RankRows]:
    """Where every (home rank, token, k) row lands on its expert's rank: one RankRows per
    rank, rows sorted by (local expert, home, token, k) and padded per expert."""
    P = len(ids)
    if E % P:
        raise ValueError(f"E={E} experts do not divide over {P} ranks")
    local = E // P
    topk = ids[0].shape[1]
    home = np.concatenate([np.full(i.size, r) for r, i in enumerate(ids)])
    token = np.concatenate([np.repeat(np.arange(i.shape[0]), topk) for i in ids])
    k = np.concatenate([np.tile(np.arange(topk), i.shape[0]) for i in ids])
    expert = np.concatenate([i.ravel() for i in ids])
    plans = []
    for q in range(P):
        mine = np.flatnonzero(expert // local == q)
        order = mine[np.lexsort((k[mine], token[mine], home[mine], expert[mine] % local))]
        e_local = expert[order] % local
        counts = np.bincount(e_local, minlength=local)
        padded = -(-counts // block_m) * block_m
        start = np.concatenate([[0], np.cumsum(padded)[:-1]])
        first = np.concatenate([[0], np.cumsum(counts)[:-1]])
        pos = start[e_local] + np.arange(len(order)) - first[e_local]
        n = int(padded.sum())
        h_, t_, s_ = (np.full(n, -1, dtype=np.int64) for _ in range(3))
        h_[pos], t_[pos], s_[pos] = home[order], token[order], token[order] * topk + k[order]
        blocks_per = padded // block_m
        block_expert = np.repeat(np.arange(local), blocks_per)
        block_rows = np.concatenate(
            [
                np.minimum(block_m, c - block_m * np.arange(b))
                for c, b in zip(counts, blocks_per, strict=True)
            ]
            or [np.zeros(0, dtype=np.int64)]
        ).astype(np.int64)
        plans.append(
            RankRows(q, block_m, counts, h_, t_, s_, block_expert, block_rows.astype(np.int64))
        )
    return plans


def host_rows(plan: RankRows, host_homed: np.ndarray | None) -> np.ndarray:
    """Which of an expert rank's rows belong to host-homed tokens (host_homed: (P, T) bool
    of every home rank's tokens, or None: none)."""
    if host_homed is None:
        return np.zeros(plan.padded_rows, dtype=bool)
    return (plan.home >= 0) & host_homed[np.maximum(plan.home, 0), np.maximum(plan.token, 0)]


def peer_rows(plan: RankRows, host_homed: np.ndarray | None = None) -> np.ndarray:
    """Which of an expert rank's rows it stores into a peer GPU: another home rank's
    tokens that are not host-homed."""
    return (plan.home >= 0) & (plan.home != plan.rank) & ~host_rows(plan, host_homed)


def row_destinations(
    plan: RankRows,
    comb_offsets: np.ndarray,
    H: int,
    host_offsets: np.ndarray | None = None,
    host_homed: np.ndarray | None = None,
    *,
    pad: int,
) -> np.ndarray:
    """int64 element offset of each row's destination from this rank's combine buffer:
    its home rank's combine buffer (comb_offsets[home]) or, for a host-homed token, that
    home rank's host buffer (host_offsets[home]), plus its slot t * topk + k times H; `pad`
    (the kernel's PAD_DST) for padding rows. Offsets are int64 end to end: host and device
    addresses are far apart (negative, or beyond 2^31 elements)."""
    valid = plan.home >= 0
    home = np.maximum(plan.home, 0)
    base = np.asarray(comb_offsets, dtype=np.int64)[home]
    if host_homed is not None:
        on_host = host_rows(plan, host_homed)
        base = np.where(on_host, np.asarray(host_offsets, dtype=np.int64)[home], base)
    dst = np.where(valid, base + plan.slot.astype(np.int64) * H, np.int64(pad))
    return dst.astype(np.int64)
