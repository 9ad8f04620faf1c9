"""What a config asks of memory and time, estimated before any work is done, and bounded.

The schema bounds each value alone; their products are what exhaust a machine. A MegaMoE
shape at the schema's maxima (H = I = 65536, E = 4096, topk 64, 262144 tokens) validated,
and `xstage simulate` grew to 18.8 GB before anyone stopped it: its tile list alone is
10^8 entries. `check` estimates, per config key, the three things that grow with it:

- simulator and kernel state: MegaMoE tiles per rank (both the kernel's tile list and the
  simulator's play of it hold every tile; ~2.5 KB each in the simulator, measured);
- bytes one point needs on a GPU: MegaMoE weights and routed rows, attention q/k/v/output
  and their All-to-All buffers;
- time: a lower bound for the whole grid (each point's work at the fastest GPU's rate,
  times its warm-up and minimum repetitions; microbench bursts at NVLink5's line rate),

and raises ConfigError naming the key and the estimate when one passes its limit. The
estimates are deliberately simple (balanced routing, every point at its fastest), so that
a config over a limit is over it on any machine; the limits sit well above config.yaml's
largest grid (tests/test_config.py pins both).
"""

from __future__ import annotations

import math

MAX_TILES_PER_RANK = 1_000_000
SIM_BYTES_PER_TILE = 2_500  # schedule lists and the play's state, measured on config.yaml
SIM_SECONDS_PER_TILE = 20e-6
MAX_DEVICE_BYTES = 288e9  # no GPU holds more (B300: 288 GB)
MAX_HOURS = 24.0  # lower bound of one experiment's time on the fastest hardware
MAX_SIM_HOURS = 2.0  # a simulated dataset's MegaMoE sweep (config.yaml's: about a minute)
FASTEST_DENSE_TFLOPS = {"fp8": 5000.0, "bf16": 2500.0}  # GB200, dense
FASTEST_LINK_GBps = 900.0  # NVLink5 per direction
MAX_POINTS_PER_STUDY = 100_000


class WorkloadError(ValueError):
    """A config whose estimated work passes a limit; the message names the key."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3g} GB"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.3g} h" if seconds >= 3600 else f"{seconds:.3g} s"


def _world(config: dict) -> int:
    """The GPUs work divides over; 'auto' counts as one (the estimate must hold anywhere)."""
    ws = config.get("world_size")
    return ws if isinstance(ws, int) and not isinstance(ws, bool) and ws > 0 else 1


def megamoe_tiles(shape: dict, tokens: int, world_size: int, block_m: int, block_n: int) -> int:
    """Tiles per rank of one MegaMoE configuration under balanced routing: each rank holds
    about tokens x topk routed rows in row blocks of block_m (one partial block per local
    expert), and every block has I/block_n Linear-1 and H/block_n Linear-2 tiles."""
    local_experts = _ceil_div(shape["E"], world_size)
    blocks = _ceil_div(tokens * shape["topk"], block_m) + local_experts
    return blocks * (_ceil_div(shape["I"], block_n) + _ceil_div(shape["H"], block_n))


def megamoe_device_bytes(shape: dict, tokens: int, world_size: int) -> float:
    """One GPU's share of a configuration: its experts' FP8 weights (gate, up, down: 3 H I
    bytes each) and its routed rows (FP8 in, bf16 out: 3 H bytes each)."""
    weights = _ceil_div(shape["E"], world_size) * 3 * shape["H"] * shape["I"]
    return float(weights + tokens * shape["topk"] * 3 * shape["H"])


def _sub_grid_tokens(moe: dict, shape: dict) -> list[tuple[str, int, int]]:
    """(key, index, tokens) of the sub-grids that run `shape` at token counts of their own
    (lead_sweep; per_gpu: every shape unless it names some), bounded as the main grid's.
    Their time is left out of the estimate, which stays a lower bound."""
    found = []
    for key in ("lead_sweep", "per_gpu"):
        sub = moe.get(key) or {}
        names = sub.get("shapes")
        if "tokens_per_rank" in sub and (names is None or shape["name"] in names):
            key = f"megamoe.{key}.tokens_per_rank"
            found += [(key, j, tokens) for j, tokens in enumerate(sub["tokens_per_rank"])]
    return found


def _size_problems(
    i: int, shape: dict, where: str, tokens: int, P: int, block_m: int, block_n: int
) -> list[str]:
    """A MegaMoE configuration's tiles per rank and bytes per GPU over their limits."""
    problems = []
    about = (
        f"{tokens} tokens per rank of shape '{shape['name']}' (megamoe.shapes[{i}]: "
        f"H {shape['H']}, I {shape['I']}, E {shape['E']}, topk {shape['topk']})"
    )
    tiles = megamoe_tiles(shape, tokens, P, block_m, block_n)
    if tiles > MAX_TILES_PER_RANK:
        problems.append(
            f"config key '{where}': {about} make about {tiles:.3g} tiles per rank; the "
            f"kernel's tile list and the simulator hold every one (about "
            f"{_gb(tiles * SIM_BYTES_PER_TILE)} and {_hours(tiles * SIM_SECONDS_PER_TILE)}"
            f" per simulated run): at most {MAX_TILES_PER_RANK:,} (fewer tokens or a "
            "smaller shape)"
        )
    nbytes = megamoe_device_bytes(shape, tokens, P)
    if nbytes > MAX_DEVICE_BYTES:
        problems.append(
            f"config key 'megamoe.shapes[{i}]': {about} need about {_gb(nbytes)} per GPU "
            f"at world_size {P} (FP8 weights and routed rows): at most "
            f"{_gb(MAX_DEVICE_BYTES)}, the largest GPU memory"
        )
    return problems


def _megamoe(config: dict) -> list[str]:
    moe = config["megamoe"]
    P = _world(config)
    block_m, block_n = moe.get("block_m", 128), moe.get("block_n", 128)
    timing = config["timing"]
    calls = timing["warmup"] + timing["min_reps"]
    runs = len(moe.get("schedules", ["expert_wave", "interleaved"])) + len(moe.get("variants", []))
    problems = []
    seconds = sim_seconds = 0.0
    grid_tokens = [("megamoe.tokens_per_rank", i, t) for i, t in enumerate(moe["tokens_per_rank"])]
    emulated = moe.get("emulated") or {}
    names = set(emulated.get("shapes", []))
    for i, shape in enumerate(moe["shapes"]):
        tokens_here = list(grid_tokens)
        if shape["name"] in names and "tokens_per_rank" in emulated:
            tokens_here.append(
                ("megamoe.emulated.tokens_per_rank", None, emulated["tokens_per_rank"])
            )
        for key, j, tokens in tokens_here:
            where = f"{key}[{j}]" if j is not None else key
            problems += _size_problems(i, shape, where, tokens, P, block_m, block_n)
            tiles = megamoe_tiles(shape, tokens, P, block_m, block_n)
            flops = 2 * tokens * shape["topk"] * 3 * shape["H"] * shape["I"]
            seconds += flops / (FASTEST_DENSE_TFLOPS["fp8"] * 1e12) * calls * runs
            sim_seconds += tiles * SIM_SECONDS_PER_TILE * len(moe.get("schedules", [0, 0]))
        for key, j, tokens in _sub_grid_tokens(moe, shape):
            problems += _size_problems(i, shape, f"{key}[{j}]", tokens, P, block_m, block_n)
    fractions = len(moe.get("remote_fractions", [1]))
    seconds *= len(moe["precisions"]) * len(moe["routings"]) * fractions
    sim_seconds *= len(moe["routings"]) * fractions  # the precisions share one simulated run
    if sim_seconds > MAX_SIM_HOURS * 3600:
        problems.append(
            f"config key 'megamoe.shapes': simulating the grid takes about {_hours(sim_seconds)} "
            f"per simulated dataset ({SIM_SECONDS_PER_TILE * 1e6:g} us per tile): at most "
            f"{MAX_SIM_HOURS:g} h"
        )
    if seconds > MAX_HOURS * 3600:
        problems.append(
            f"config key 'megamoe.shapes': the grid's MegaMoE work takes at least "
            f"{_hours(seconds)} at {FASTEST_DENSE_TFLOPS['fp8']:g} dense FP8 TFLOP/s "
            f"({calls} calls per point: timing.warmup + timing.min_reps): at most {MAX_HOURS:g} h"
        )
    return problems


def _attention(config: dict) -> list[str]:
    att = config["attention"]
    P = _world(config)
    timing = config["timing"]
    calls = timing["warmup"] + timing["min_reps"]
    heads, d, batch = max(att["heads"]), att["head_dim"], att["batch"]
    problems = []
    seconds = 0.0
    for i, seq in enumerate(att["seq_lens"]):
        # q, k, v and the output, each before and after the All-to-All: 8 bf16 tensors / P
        nbytes = 8 * batch * seq * heads * d * 2 / P
        if nbytes > MAX_DEVICE_BYTES:
            problems.append(
                f"config key 'attention.seq_lens[{i}]': {seq} tokens x {heads} heads x "
                f"head_dim {d} (batch {batch}) need about {_gb(nbytes)} per GPU at world_size "
                f"{P} for q, k, v, the output and their All-to-All buffers: at most "
                f"{_gb(MAX_DEVICE_BYTES)}, the largest GPU memory"
            )
        flops = 4 * batch * seq * seq * sum(att["heads"]) * d / P
        seconds += flops / (FASTEST_DENSE_TFLOPS["bf16"] * 1e12) * calls
    seconds *= (
        len(att["backends"]) * len(att["modes"]) * (1 + len(att.get("emulated_world_sizes", [])))
    )
    if seconds > MAX_HOURS * 3600:
        problems.append(
            f"config key 'attention.seq_lens': the attention grid takes at least "
            f"{_hours(seconds)} at {FASTEST_DENSE_TFLOPS['bf16']:g} dense bf16 TFLOP/s "
            f"({calls} calls per point): at most {MAX_HOURS:g} h"
        )
    return problems


def _microbench(config: dict) -> list[str]:
    from xstage_bench.data import grid  # the grid the runners expand, as they expand it

    mb = config["microbench"]
    problems = []
    for name, study in mb["studies"].items():
        axes = [v for k, v in study.items() if k in grid.MICROBENCH_AXES and isinstance(v, list)]
        points = math.prod(len(v) for v in axes)
        if points > MAX_POINTS_PER_STUDY:
            problems.append(
                f"config key 'microbench.studies.{name}': {points:,} points (the product of its "
                f"axes): at most {MAX_POINTS_PER_STUDY:,}"
            )
            continue
        seconds = 0.0
        for point in grid.microbench_points(mb, name):
            burst_us = point.get("gap_us", 0.0) + point["V"] / (FASTEST_LINK_GBps * 1e3)
            seconds += mb["launches"] * mb["bursts"] * burst_us * 1e-6
        if seconds > MAX_HOURS * 3600:
            problems.append(
                f"config key 'microbench.studies.{name}': its bursts take at least "
                f"{_hours(seconds)} (launches x bursts x (gap_us + V at {FASTEST_LINK_GBps:g} "
                f"GB/s) per point): at most {MAX_HOURS:g} h"
            )
    return problems


def problems(config: dict) -> list[str]:
    """Every estimate of a schema-valid config that passes its limit, as messages."""
    return _megamoe(config) + _attention(config) + _microbench(config)


def check(config: dict) -> None:
    """Raise WorkloadError with the first estimate over its limit."""
    found = problems(config)
    if found:
        raise WorkloadError(found[0])
