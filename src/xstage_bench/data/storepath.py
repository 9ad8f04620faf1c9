"""Store paths: where a kernel's remote stores land, as configs, ids and tables name them.

The X-Stage is the time between a store leaving the SM and it being visible at the far
end. Every experiment names that far end, its *path*:

- `peer`: another GPU's memory over NVLink (or PCIe peer-to-peer): peer windows
  (peer.py: one VMM range, each rank's chunk on its own GPU);
- `host`: the node's host memory over the GPU's host link (PCIe, or NVLink-C2C on Grace
  machines): pinned, mapped host memory, which a kernel reaches through its host pointer
  (unified addressing), or a VMM range whose far chunks are host-NUMA memory, so that an
  unmodified kernel (cuBLAS, FA3, FA4) can take one strided `out` tensor over it.

Beside each path every experiment keeps its local control: the same stores into the
issuing GPU's own memory (`LOCAL`). Configs name the paths as `store_paths` (`auto`: the
host path on one GPU, both on two or more); a study's `dest: remote` means "the far end of
each measured path". The far-end buffers of the host path are measurement/hostmem.py's;
those of the peer path, measurement/peer.py's.
"""

from __future__ import annotations

from collections.abc import Sequence

PEER, HOST = "peer", "host"
PATHS = (PEER, HOST)
LOCAL = "local"  # the local-store control beside every path
REMOTE = "remote"  # config only: one point per measured path
AUTO = "auto"


class StorePathError(ValueError):
    """A config asks for a path this run cannot measure; the message names the key."""


def resolve(requested, world_size: int, key: str = "store_paths") -> list[str]:
    """The paths a run measures: `auto` is the host path on one GPU and both paths on
    two or more; an explicit list is checked against the GPUs this run has."""
    if requested in (None, AUTO):
        return [HOST] if world_size < 2 else [PEER, HOST]
    paths = list(requested)
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise StorePathError(f"config key '{key}': unknown path {unknown[0]!r}; known: {PATHS}")
    if PEER in paths and world_size < 2:
        raise StorePathError(
            f"config key '{key}' asks for 'peer' (another GPU's memory), but this run has "
            f"{world_size} GPU; use 'host' or 'auto'"
        )
    return paths


def destinations(dests: Sequence[str], paths: Sequence[str]) -> list[str]:
    """A study's `dest` values with `remote` expanded into one per path (order kept,
    duplicates dropped): e.g. [remote, local] over [peer, host] -> [peer, host, local]."""
    out: list[str] = []
    for d in dests:
        for concrete in paths if d == REMOTE else [d]:
            if concrete not in out:
                out.append(concrete)
    return out


def path_of(dest: str) -> str:
    """A point's path from its destination: the path itself, or `local` for the control."""
    return dest if dest in PATHS else LOCAL


def point_path(point: dict) -> str:
    """A record's path. Files written before paths existed measured the peer path (their
    microbenchmark points name it as `dest`)."""
    if "path" in point:
        return point["path"]
    return path_of(point["dest"]) if "dest" in point else PEER


def far_end(path: str) -> str:
    """How tables and figures name a path's far end."""
    return {PEER: "peer GPU (NVLink)", HOST: "host memory", LOCAL: "local control"}[path]


# --- the host link ----------------------------------------------------------------------

# PCIe line rate per direction and lane, GB/s, after encoding (gen3+: 128b/130b).
PCIE_LANE_GBps = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def pcie_line_rate_GBps(gen: int, width: int) -> float | None:
    lane = PCIE_LANE_GBps.get(gen)
    return None if lane is None else round(lane * width, 1)
