"""Where the warps of our kernel stall, from Nsight Compute's source page (SASS, CSV):

    ncu --kernel-name _fused_moe_ws --launch-count 1 --section WarpStateStats \
        --section SourceCounters --page source --print-source sass --csv \
        python3 kernels/ab/check_once.py ... > src.csv
    python3 kernels/ab/ncu_stalls.py src.csv[.gz]

Prints the stall reasons over all samples, the samples by how often an instruction ran
(the loops of a kernel: an instruction run once per step of every tile, per tile, per
CTA), by kind of instruction, and the instructions with the most samples, each with its
index in the SASS listing (to read around it in the same file).
"""

import collections
import csv
import gzip
import io
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read_rows(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    return list(csv.DictReader(io.StringIO("\n".join(lines[header:]))))


def count(row: dict, key: str) -> int:
    value = row.get(key) or "0"
    return int(value) if value.isdigit() else 0


def kind(row: dict) -> str:
    """A coarse class of the instruction: what a sample there waits for."""
    words = row["Source"].split()
    op = words[1] if words[0].startswith("@") else words[0]
    n = count(row, SAMPLES)
    if op == "NOP" and count(row, EXECUTED) < 1000:
        return "idle warps (padding, exit)"
    if op.startswith("WARPGROUP.DEPBAR"):
        return "wgmma wait"
    if op.startswith(("QGMMA", "HGMMA", "WARPGROUP.ARRIVE")):
        return "wgmma issue"
    if op == "BRA" and count(row, "stall_long_sb") > n / 2:
        return "mbarrier wait (try_wait loop)"
    if count(row, "stall_long_sb") > n / 2:
        return "first use of a loaded value"
    return op.split(".")[0]


def main(path: str) -> None:
    rows = read_rows(path)
    reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    total = sum(count(r, SAMPLES) for r in rows)
    page = path.rsplit("/", 1)[-1]
    print(f"{page}: {len(rows)} SASS instructions, {total} samples\n\nstall reason")
    by_reason = collections.Counter({k: sum(count(r, k) for r in rows) for k in reasons})
    for reason, n in by_reason.most_common(8):
        print(f"  {reason:32s}{n:9d} {n / total:6.1%}")
    for title, key in (
        ("times run (per warp: steps, tiles, CTAs)", lambda r: count(r, EXECUTED)),
        ("kind of instruction", kind),
    ):
        print(f"\nsamples by {title}")
        groups = collections.Counter()
        for r in rows:
            groups[key(r)] += count(r, SAMPLES)
        for group, n in groups.most_common(12):
            print(f"  {str(group):32s}{n:9d} {n / total:6.1%}")
    print("\ninstructions with the most samples (index in the listing)")
    top = sorted(range(len(rows)), key=lambda i: -count(rows[i], SAMPLES))[:25]
    for i in top:
        r = rows[i]
        n = count(r, SAMPLES)
        main_reason = max(reasons, key=lambda k: count(r, k))
        print(
            f"  {i:5d} {n:7d} {n / total:6.1%} {main_reason:16s} run {count(r, EXECUTED):8d}  "
            f"{r['Source'].strip()[:64]}"
        )


if __name__ == "__main__":
    main(sys.argv[1])
