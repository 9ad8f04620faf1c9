"""The fused MoE kernel (MegaMoE), simulated: the kernel's own tile lists and routing
against the X-Stage path of a hardware profile.

The play itself is megamoe/playback.py (the tile list, the row-block counters, the far
and near store paths, the hold); here the tiles last their FLOPs at the profile's matrix
rate on every SM (an L1 tile 4 BM BN H, an L2 tile 2 BM BN I; a partial row block costs a
full tile, as on Tensor Cores) and the paths are the profile's: the far path (peer: fixed
overhead T0, capacity Q, drain R, so a full path stalls the program), and the local path
after it (sim/xstage.py: LOCAL_PATH_FACTOR x R and Q). A tile's stores are timed until
they are issued: the hold (a program waiting for its stores to drain) is off here. The
remote share is the plan's own count per row block, so a remote fraction (routing.py)
changes it tile by tile. An interleaved point's lead is its own (`arm`: 'auto' chosen by
lead.py through the profile's peer path).

The kernel ends when its slowest rank ends (the GPU runner times every rank), so by
default every rank is played and the slowest one reported. Ranks differ even under
balanced routing: a row more or less per expert moves block and wave boundaries, which
changed the slowest rank's time by up to 6% against the busiest rank's (8 GPUs, B200
profile). ranks="busiest" plays only the rank with the larger of its compute over the
programs and its remote bytes over R: cheaper (3x on 8 GPUs), within 1.2% on 2 GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from xstage_bench.data import storepath
from xstage_bench.data.hardware import HardwareProfile
from xstage_bench.megamoe import schedule
from xstage_bench.megamoe.ours.lead import LeadChooser
from xstage_bench.megamoe.playback import OUTPUT_BYTES, Rates, dispatch, play_kernel
from xstage_bench.sim.xstage import path_params

PRECISION_RATE = {"w4a8": "fp8", "w8a8": "fp8", "bf16": "bf16"}  # W4A8 expands to FP8 MMA


@dataclass
class MoEResult:
    time_us: float
    tflops: float  # useful FLOPs per GPU / time_us
    nvlink_bytes: int  # all ranks, as the GPU runner records it
    nvlink_bytes_per_rank: list[int]
    rank: int  # the rank simulated
    tiles: np.ndarray  # the tile list it played (schedule.build's)
    store_spans_us: list[float] = field(default_factory=list)  # one per Linear-2 tile
    waits_us: list[float] = field(default_factory=list)  # one per Linear-2 tile: start - taken
    # In list order: [program, "L1"|"L2", taken_us, end_us, store_start_us|None,
    # store_end_us|None], the GPU runner's trace rows (an L2 tile ends with its stores).
    timeline: list[list] = field(default_factory=list)


def matrix_rate(profile: HardwareProfile, precision: str) -> float:
    """The profile's per-GPU matrix rate (TFLOP/s) a precision's tiles run at."""
    kind = PRECISION_RATE[precision]
    rate = profile.matrix_tflops.get(kind)
    if not rate:
        raise ValueError(f"profile '{profile.name}' has no matrix_tflops.{kind}")
    return rate


def lead_chooser(megamoe: dict, profile: HardwareProfile) -> LeadChooser:
    """Leads 'auto' as the simulator resolves them (lead.py): through the profile's own
    peer path, the one its kernel plays against."""
    peer = {storepath.PEER: path_params(profile, "peer")}
    return LeadChooser.of_paths(megamoe, peer, profile.sm_count)


def arm(
    point: dict, schedule_name: str, megamoe: dict, profile: HardwareProfile, leads: LeadChooser
) -> dict:
    """A configuration's point under one schedule, as simulated: an interleaved one with
    its lead, as the GPU runner records it ('auto' at the profile's matrix rate)."""
    scheduled = {**point, "schedule": schedule_name}
    if schedule_name != schedule.INTERLEAVED:
        return scheduled
    requested = megamoe.get("lead_rows", 0)
    rate = matrix_rate(profile, point["precision"])
    rows = leads.resolve(requested, point, tflops=rate)
    return {**scheduled, "lead_rows": rows, "lead_rows_requested": requested}


def simulate(
    point: dict,
    megamoe: dict,
    profile: HardwareProfile,
    schedule_name: str,
    *,
    local_control: bool = False,
    keep_timeline: bool = False,
    seed: int = 0,
    ranks: str = "all",
    hold: bool = False,
) -> MoEResult:
    """One configuration under one schedule, at the profile's matrix rate on every SM;
    local_control sends every store through the local path. hold: playback.play's (off:
    the simulated datasets time a tile's stores until they are issued, as they always did;
    the fitted-drain playback of report/analysis/megamoe_playback.py holds by default)."""
    return simulate_at_rate(
        point,
        megamoe,
        profile,
        schedule_name,
        tflops=matrix_rate(profile, point["precision"]),
        num_programs=profile.sm_count,
        local_control=local_control,
        keep_timeline=keep_timeline,
        seed=seed,
        ranks=ranks,
        hold=hold,
    )


def simulate_at_rate(
    point: dict,
    megamoe: dict,
    profile: HardwareProfile,
    schedule_name: str,
    *,
    tflops: float,
    num_programs: int,
    local_control: bool = False,
    keep_timeline: bool = False,
    seed: int = 0,
    ranks: str = "all",
    hold: bool = False,
) -> MoEResult:
    """One configuration under one schedule with num_programs programs sharing a per-GPU
    compute rate of `tflops` (TFLOP/s); the store paths are the profile's."""
    block_m, block_n = megamoe.get("block_m", 128), megamoe.get("block_n", 128)
    H, I = point["H"], point["I"]  # noqa: E741 (the paper's name for the expert width)
    plans = dispatch(point, megamoe, seed)
    rates = Rates.at(point, block_m, block_n, tflops, num_programs)
    kernel = play_kernel(
        point,
        megamoe,
        schedule_name,
        rates,
        path_params(profile, "peer"),
        path_params(profile, "local"),
        hold=hold,
        local_control=local_control,
        seed=seed,
        ranks=ranks,
    )
    work, tiles, played = kernel.work, kernel.tiles, kernel.played
    nvlink = [0 if local_control else rows.remote_rows() * H * OUTPUT_BYTES for rows in plans]
    useful_per_gpu = 6.0 * H * I * sum(rows.rows for rows in plans) / len(plans)
    l2 = tiles[:, 0] == schedule.L2
    return MoEResult(
        time_us=played.time_us,
        tflops=useful_per_gpu / played.time_us / 1e6,  # FLOP/us -> TFLOP/s
        nvlink_bytes=int(sum(nvlink)),
        nvlink_bytes_per_rank=nvlink,
        rank=work.rank,
        tiles=tiles,
        store_spans_us=(played.end - played.store_start)[l2].tolist(),
        waits_us=(played.start - played.taken)[l2].tolist(),
        timeline=played.timeline(tiles) if keep_timeline else [],
    )
