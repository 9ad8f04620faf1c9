"""Raw microbench records sorted into the roles of the Burst-Gap fit.

The laws describe K producers that burst together. On a GPU, producers that run free
drift apart (by up to ~500 us within a launch on 2x H200), so only aligned bursts test
the laws as stated: records with a grid barrier before every burst (sync = barrier) and
drain probes (whose kernel always meets at a barrier). Where a dataset has aligned
records of a role, only those are fitted and the free-running ones are validated apart;
where it has none (a simulated grid without barrier studies), every record is fitted.

Drain probes are validated apart too: their kernel has its own fixed cost per burst (a
64 KiB burst issues in ~0.1 us there, ~0.26 us in the burst-train kernel on H200), so
they would bias T0 toward a kernel that none of the other studies runs.

Zero-gap periods, which give R, come from the aggregate issue rate where a record has it
(V / issue_rate: bytes issued per unit time while every producer is steady, which does
not depend on how the producers are aligned) and from the per-producer period otherwise
(the simulator writes only period_us).

Periodic records are fitted on the time the laws call their issue time: for aligned ones
the sender-visible issue time (measured, or derived from the period in older runs), for
free-running ones the store loop (sender_visible.py says which and why). Each record
carries the name of its metric, and the model file says how many records took which.

Each store path is fitted on its own (`load(raw_paths, path)`): only that path's records
of the reference store configuration (16-byte stores, rewriting the same lines, one far
end, the default kernel's next operation) enter its fit; local-control, other-path and
other-store records stay for the figures. Records written before paths existed are the
peer path (storepath.point_path). The ceilings of the path measured in the same run are
collected for the R check, and for the host path the host link's line rate from the raw
files' environment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from xstage_bench.data import storepath
from xstage_bench.data.results import FAILED_STATUSES, RawResultError, read_raw
from xstage_bench.model import sender_visible

# next_op "none": the default kernel; the next-operation study's records never enter a fit.
REFERENCE_STORES = {"dest": "peer", "width": 16, "pattern": "same", "peers": 1, "next_op": "none"}
BURST_KINDS = ("periodic", "isolated", "drain_probe")


def reference_stores(path: str) -> dict:
    """The store configuration a path's fit uses: REFERENCE_STORES with the path as dest."""
    return {**REFERENCE_STORES, "dest": path}


ROLES = ("zero_gap", "periodic", "isolated")  # what the parameters are fitted to
NOT_FITTED_KINDS = ("drain_probe",)  # validated apart (see the module docstring)
ISOLATED_KINDS = ("isolated", "drain_probe")  # one burst on an empty path: the isolated law


@dataclass(frozen=True)
class Recs:
    """Records of one role as arrays: K, V, B per producer, gap, and a value per record."""

    ids: tuple[str, ...]
    study: tuple[str, ...]
    kind: tuple[str, ...]
    sync: tuple[str, ...]  # the point's sync axis (free | barrier)
    aligned: np.ndarray  # bool: the producers started each burst together
    K: np.ndarray
    V: np.ndarray
    B: np.ndarray
    G: np.ndarray
    y: np.ndarray  # per-record median of the role's metric
    samples: tuple[np.ndarray, ...]
    series: tuple[str, ...]  # the record's point without its gap (one curve over G)
    metric: tuple[str, ...]  # what y is, per record (sender_visible.py for periodic ones)
    loop: np.ndarray  # per-record median store loop, t_iss_slowest_us (NaN where none)
    # ceil(K / SMs): how many producers share an SM; None (one each) where the SM count
    # is unknown
    waves: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, idx, y: np.ndarray | None = None) -> Recs:
        idx = np.asarray(idx, dtype=int)

        def pick(seq: tuple) -> tuple:
            return tuple(seq[i] for i in idx)

        return Recs(
            pick(self.ids),
            pick(self.study),
            pick(self.kind),
            pick(self.sync),
            self.aligned[idx],
            self.K[idx],
            self.V[idx],
            self.B[idx],
            self.G[idx],
            self.y[idx] if y is None else y,
            pick(self.samples),
            pick(self.series),
            pick(self.metric),
            self.loop[idx],
            None if self.waves is None else self.waves[idx],
        )

    def where(self, mask) -> Recs:
        return self.take(np.flatnonzero(mask))


def concat(a: Recs, b: Recs) -> Recs:
    return Recs(
        a.ids + b.ids,
        a.study + b.study,
        a.kind + b.kind,
        a.sync + b.sync,
        *(np.concatenate([getattr(a, k), getattr(b, k)]) for k in ("aligned", *"KVBGy")),
        a.samples + b.samples,
        a.series + b.series,
        a.metric + b.metric,
        np.concatenate([a.loop, b.loop]),
        None if a.waves is None and b.waves is None else np.concatenate([waves(a), waves(b)]),
    )


def waves(recs: Recs) -> np.ndarray:
    """Producers per SM of each record's burst, ceil(K / SMs): 1 where the SM count is
    unknown."""
    return np.ones(len(recs)) if recs.waves is None else recs.waves


def plateau(periodic: Recs, R: float) -> Recs:
    """Periodic records whose gap drains the whole burst (G >= V/R): each meets an empty path."""
    return periodic.where(periodic.G >= periodic.V / R)


def is_aligned(point: dict) -> bool:
    return point.get("sync") == "barrier" or point["kind"] == "drain_probe"


ZERO_GAP_METRIC = {"issue_rate": "V/issue_rate_GBps", "period": "period_us"}


def zero_gap_samples(record: dict) -> tuple[np.ndarray, str]:
    """A zero-gap record's period samples (us) and their source: V/issue_rate or period_us."""
    rates = record["samples"].get("issue_rate_GBps") or []
    if rates:
        # GB/s is bytes per ns: V / (rate * 1e3) is microseconds.
        return record["point"]["V"] / (np.asarray(rates, dtype=float) * 1e3), "issue_rate"
    return np.asarray(record["samples"]["period_us"], dtype=float), "period"


def recs_from(records: list[dict], samples: list[np.ndarray], metrics: list[str]) -> Recs:
    pts = [r["point"] for r in records]
    return Recs(
        ids=tuple(r["id"] for r in records),
        study=tuple(p.get("study", "") for p in pts),
        kind=tuple(p["kind"] for p in pts),
        sync=tuple(p.get("sync", "free") for p in pts),
        aligned=np.array([is_aligned(p) for p in pts], dtype=bool),
        K=np.array([p["K"] for p in pts], dtype=float),
        V=np.array([p["V"] for p in pts], dtype=float),
        B=np.array([p["B"] for p in pts], dtype=float),
        G=np.array([p.get("gap_us", 0.0) for p in pts], dtype=float),
        y=np.array([np.median(s) for s in samples]),
        samples=tuple(samples),
        series=tuple(
            f"{p.get('study', '')}/K={p['K']}/V={p['V']}/sync={p.get('sync')}/"
            f"gap_mode={p.get('gap_mode')}"
            for p in pts
        ),
        metric=tuple(metrics),
        loop=np.array(
            [np.median(r["samples"].get("t_iss_slowest_us") or [np.nan]) for r in records]
        ),
    )


@dataclass(frozen=True)
class FitData:
    zero_gap: Recs  # periodic at G = 0, metric V/issue_rate or period_us
    periodic: Recs  # every periodic record: sender-visible time or store loop (Recs.metric)
    isolated: Recs  # isolated bursts and drain probes, metric t_iss_slowest_us
    period: Recs | None = None  # periodic records, metric period_us: validated, not fitted


@dataclass(frozen=True)
class Loaded:
    fit: FitData  # what the parameters are fitted to (aligned records where there are any)
    apart: FitData  # records validated apart, never fitted (free-running ones)
    fit_set: dict  # per role: "aligned" or "all (no aligned records)"; drain probes never
    zero_gap_sources: dict  # how many zero-gap periods came from issue_rate, from period_us
    backend: str
    counts: dict
    sm_count: int | None  # from the raw files' environment, for a profile without a base
    ceilings: dict  # the path's ceilings of the same run: method -> {median_GBps, n}
    path: str = storepath.PEER
    host_link: dict | None = None  # environment host_links[0] (kind, gen, width, line rate)
    visible: dict | None = None  # aligned periodic records' metric (sender_visible.describe)


def _is_reference(point: dict, path: str) -> bool:
    stores = reference_stores(path)
    return all(point.get(k, v) == v for k, v in stores.items())


def _split(recs: Recs, aligned_only: bool) -> tuple[Recs, Recs]:
    """(fitted, validated apart) records of one role."""
    fitted = ~np.isin(recs.kind, NOT_FITTED_KINDS)
    if aligned_only:
        fitted &= recs.aligned
    return recs.where(fitted), recs.where(~fitted)


def _sort(
    r: dict,
    path: str,
    counts: dict,
    periodic: list[dict],
    isolated: list[dict],
    ceilings: dict[str, list[float]],
) -> None:
    """Count one record, or put it in the periodic or isolated list `path` is fitted from."""
    point = r["point"]
    where = storepath.point_path(point)
    if where not in (path, storepath.LOCAL):
        counts["other_paths"] += 1
    elif r["status"] != "ok":
        counts["failed"][r["status"]] += 1
    elif point["kind"] == "ceiling":
        if where == path:
            counts["ceiling"] += 1
            if r["samples"].get("bandwidth_GBps"):
                ceilings.setdefault(point["method"], []).extend(r["samples"]["bandwidth_GBps"])
    elif where == storepath.LOCAL:
        counts["local"] += 1
    elif not _is_reference(point, path):
        counts["other_stores"] += 1
    else:
        if not r["samples"].get("t_iss_slowest_us"):
            raise ValueError("no t_iss_slowest_us samples")
        counts["used"] += 1
        counts["aligned"] += int(is_aligned(point))
        (periodic if point["kind"] == "periodic" else isolated).append(r)


class FitInputError(ValueError):
    """Raw files the fit cannot take together (not microbench, mixed backends); the
    message names them."""


def read_docs(raw_paths: list[str]) -> dict[str, dict]:
    """The raw microbench files, validated; files of two backends are never fitted together."""
    docs = {}
    for path in raw_paths:
        doc = read_raw(path)
        if doc["experiment"] != "microbench":
            raise FitInputError(f"{path}: experiment '{doc['experiment']}' is not microbench")
        docs[str(path)] = doc
    backends = {name: doc["backend"] for name, doc in docs.items()}
    if len(set(backends.values())) > 1:
        raise FitInputError(
            f"raw files from different backends cannot be fitted together: {backends}"
        )
    return docs


def paths_in(docs: dict[str, dict]) -> list[str]:
    """The store paths the files measured (bursts or ceilings, ok or not), peer first;
    [peer] where they name none (a fit then says what is missing)."""
    found = {
        storepath.point_path(r["point"])
        for doc in docs.values()
        for r in doc["records"]
        if r["point"].get("kind") in (*BURST_KINDS, "ceiling")
    }
    return [p for p in storepath.PATHS if p in found] or [storepath.PEER]


def _host_link(docs: dict[str, dict]) -> dict | None:
    for doc in docs.values():
        links = doc["environment"].get("host_links") or []
        if links and links[0]:
            return links[0]
    return None


def load(raw_paths: list[str] | dict[str, dict], path: str = storepath.PEER) -> Loaded:
    """Read raw microbench files (or the documents read_docs gave); sort the records of
    `path` into the fit's roles and count the rest."""
    docs = raw_paths if isinstance(raw_paths, dict) else read_docs(raw_paths)
    counts = {
        "used": 0,
        "aligned": 0,
        "local": 0,
        "other_stores": 0,
        "other_paths": 0,
        "ceiling": 0,
        "failed": dict.fromkeys(FAILED_STATUSES, 0),
    }
    periodic, isolated, sm_count = [], [], None
    ceilings: dict[str, list[float]] = {}
    for name, doc in docs.items():
        env = doc["environment"]
        sm_count = (
            sm_count
            or env.get("hardware_profile", {}).get("sm_count")
            or next((g["sm_count"] for g in env.get("gpus", [])), None)
        )
        for r in doc["records"]:
            try:
                _sort(r, path, counts, periodic, isolated, ceilings)
            except (KeyError, TypeError, ValueError) as e:
                raise RawResultError(f"{name}: record '{r['id']}': {type(e).__name__}: {e}") from e
    zero_gap = [
        r
        for r in periodic
        if r["point"].get("gap_us", 0.0) == 0.0
        and (r["samples"].get("period_us") or r["samples"].get("issue_rate_GBps"))
    ]
    zg = [zero_gap_samples(r) for r in zero_gap]
    sources = {"issue_rate": 0, "period": 0}
    for _, source in zg:
        sources[source] += 1
    zero_gap_recs = recs_from(zero_gap, [s for s, _ in zg], [ZERO_GAP_METRIC[m] for _, m in zg])
    periodic_recs, visible = _periodic(periodic, zero_gap_recs)

    def metric(records: list[dict], name: str) -> Recs:
        return recs_from(
            records,
            [np.asarray(r["samples"][name], dtype=float) for r in records],
            [name] * len(records),
        )

    roles = {
        "zero_gap": zero_gap_recs,
        "periodic": periodic_recs,
        "isolated": metric(isolated, sender_visible.STORE_LOOP),
        "period": metric([r for r in periodic if r["samples"].get("period_us")], "period_us"),
    }
    if sm_count:
        roles = {
            role: replace(recs, waves=np.ceil(recs.K / sm_count)) for role, recs in roles.items()
        }
    fit, apart, fit_set = {}, {}, {}
    for role, recs in roles.items():
        eligible = recs.where(~np.isin(recs.kind, NOT_FITTED_KINDS))
        aligned_only = bool(eligible.aligned.any())
        fit[role], apart[role] = _split(recs, aligned_only)
        fit_set[role] = "aligned" if aligned_only else "all (no aligned records)"
    return Loaded(
        fit=FitData(**fit),
        apart=FitData(**apart),
        fit_set=fit_set,
        zero_gap_sources=sources,
        backend=next(iter(docs.values()))["backend"] if docs else "none",
        counts=counts,
        sm_count=sm_count,
        ceilings={
            method: {"median_GBps": float(np.median(v)), "n": len(v)}
            for method, v in sorted(ceilings.items())
        },
        path=path,
        host_link=_host_link(docs),
        visible=visible,
    )


def _periodic(periodic: list[dict], zero_gap: Recs) -> tuple[Recs, dict]:
    """Periodic records on the sender-visible issue time where they are aligned
    (sender_visible.py) and the store loop where they run free, and what the model file
    says of it. R0, the fastest zero-gap drain, tells which gaps drained their burst."""
    R0 = float(np.max(zero_gap.V / zero_gap.y)) if len(zero_gap) else None
    aligned = [r for r in periodic if is_aligned(r["point"])]
    cost = sender_visible.barrier_cost(aligned, R0)
    pairs = [
        sender_visible.samples(r, cost)
        if is_aligned(r["point"])
        else (np.asarray(r["samples"]["t_iss_slowest_us"], dtype=float), sender_visible.STORE_LOOP)
        for r in periodic
    ]
    metrics = [m for _, m in pairs]
    described = sender_visible.describe(
        cost, [m for r, m in zip(periodic, metrics, strict=True) if is_aligned(r["point"])]
    )
    return recs_from(periodic, [s for s, _ in pairs], metrics), described
