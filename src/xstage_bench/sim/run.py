"""Entry points the workflow calls to write simulated raw files (backend "sim").

Each function expands the same grid as the GPU runner, simulates every point from a
hardware profile, and writes one raw document with `write_raw`. The simulators are
deterministic; to give summaries and confidence intervals a spread like a measurement's,
each sample carries seeded multiplicative noise (SimOptions.noise_rel, lognormal so the
median is unbiased). The options and the model assumptions go into the document's
config block, so a reader sees exactly what produced the numbers.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from xstage_bench.data import grid, provenance
from xstage_bench.data.config import ConfigError
from xstage_bench.data.grid import LOCAL_CONTROL
from xstage_bench.data.hardware import HardwareProfile, load_profile
from xstage_bench.data.results import failed_record, ok_record, raw_document, write_raw
from xstage_bench.measurement import environment
from xstage_bench.megamoe.schedule import INTERLEAVED, WAVE
from xstage_bench.sim import megamoe, ulysses, xstage


@dataclass(frozen=True)
class SimOptions:
    """Knobs of a simulated run (recorded in every document it writes)."""

    samples: int = 5  # noisy copies of a deterministic result (megamoe, attention)
    noise_rel: float = 0.01  # standard deviation of the log of the per-sample factor
    seed: int = 0
    start_jitter_us: float = 0.0  # microbench: seeded launch skew of each producer (free sync)
    megamoe_ranks: str = "all"  # megamoe: play every rank, or only the busiest (sim.megamoe)


ASSUMPTIONS = {
    "local_path": f"local stores: {xstage.LOCAL_PATH_FACTOR:g}x the peer drain rate and "
    "capacity of the profile",
    "copy_engine": f"copy-engine ceiling: {xstage.COPY_ENGINE_EFFICIENCY:g}x the line rate "
    "(NVLink for peer, the local drain rate for local)",
    "sm_store_ceiling": "sm_store ceiling: one burst of V from every SM, V over first "
    "start to last byte drained",
    "store_width": "issue rate scales with width/16; pattern and gap_mode are not modelled",
    "peers": "one peer path; points with peers > 1 are unsupported",
    "megamoe": "the kernel's rows (routing.route, routing.dispatch_plan) and tile lists "
    "(schedule.build, num_programs = sm_count), played as the persistent kernel runs them: "
    "programs take list entries in order, a Linear-2 tile waits for its row block's Linear-1 "
    "tiles; tile time = FLOPs (L1 4 BM BN H, L2 2 BM BN I) at matrix_tflops/sm_count (w4a8 "
    "and w8a8 at the fp8 rate, a partial row block costs a full tile); each Linear-2 tile "
    "pushes its block's valid rows x BN bf16: the rows homed on other ranks through the peer "
    "path, then the rest through the local path; kernel time = the slowest rank's (sim "
    "option megamoe_ranks 'all'; 'busiest': the rank with the most compute over the SMs or "
    "remote bytes over R), including its final drain; dispatch and caches not modelled",
    "attention": f"tile time = 4*128*S*D FLOPs at bf16 x {ulysses.ATTENTION_EFFICIENCY:g}; "
    "each tile's epilogue stores 128 x D bf16 (alone: locally; fused: remote share through "
    "the peer path); serial: an All-to-All burst from every SM after the kernel",
    "noise": "each sample x exp(noise_rel * N(0,1)), seeded per point; the schedules of a "
    "megamoe configuration and the modes of an attention shape share their factors",
}


def world_size(config: dict, profile: HardwareProfile) -> int:
    """The configured world size, or the profile's node size when the config says auto."""
    ws = config.get("world_size")
    return ws if isinstance(ws, int) and not isinstance(ws, bool) else profile.world_size


def _rng(options: SimOptions, key: str) -> np.random.Generator:
    """One seeded stream per point, so a point's samples do not depend on grid order."""
    return np.random.default_rng([options.seed, zlib.crc32(key.encode())])


def _noisy(values, rng: np.random.Generator, options: SimOptions) -> list[float]:
    x = np.asarray(values, dtype=float)
    return (x * np.exp(options.noise_rel * rng.standard_normal(x.shape))).tolist()


def _copies(value: float, rng: np.random.Generator, options: SimOptions) -> list[float]:
    return _noisy(np.full(options.samples, value), rng, options)


def _sim_config(profile_path: str, options: SimOptions, **sections) -> dict:
    return {
        "profile": str(profile_path),
        **sections,
        "sim": {**asdict(options), "assumptions": ASSUMPTIONS},
    }


def _write(
    out: str,
    *,
    experiment: str,
    dataset: str,
    env: dict,
    config: dict,
    records: list[dict],
    section: dict,
    study: str | None = None,
) -> None:
    doc = raw_document(
        experiment=experiment,
        backend="sim",
        dataset=dataset,
        environment=environment.finish(env),
        config=config,
        records=records,
        study=study,
        config_sha256=provenance.section_hash(section),
    )
    write_raw(Path(out), doc)


def _start(profile_path: str) -> tuple[HardwareProfile, dict]:
    profile = load_profile(profile_path)
    env = environment.capture(simulated=True, hardware_profile=profile.as_dict())
    return profile, env


def simulate_microbench(
    config: dict,
    profile_path: str,
    study: str,
    dataset: str,
    out: str,
    options: SimOptions | None = None,
) -> None:
    """raw/microbench/<study>.json for one study of config['microbench']."""
    options = options or SimOptions()
    profile, env = _start(profile_path)
    mb = config["microbench"]
    if study not in mb["studies"]:
        raise ConfigError(
            f"microbench study {study!r} is not in config key 'microbench.studies' "
            f"(it has: {', '.join(mb['studies'])})"
        )
    records = []
    for point in grid.microbench_points(mb, study):
        rng = _rng(options, point["id"])
        try:
            samples = xstage.simulate_microbench_point(
                point,
                profile,
                bursts=mb["bursts"],
                warmup_bursts=mb["warmup_bursts"],
                launches=mb["launches"],
                rng=rng,
                start_jitter_us=options.start_jitter_us,
            )
        except xstage.UnsupportedPoint as e:
            records.append(failed_record(point["id"], point, str(e), status="unsupported"))
            continue
        noisy = {name: _noisy(values, rng, options) for name, values in samples.items()}
        records.append(ok_record(point["id"], point, noisy))
    section = {k: mb[k] for k in ("bursts", "warmup_bursts", "launches", "defaults")}
    cfg = _sim_config(
        profile_path, options, microbench={**section, "studies": {study: mb["studies"][study]}}
    )
    _write(
        out,
        experiment="microbench",
        dataset=dataset,
        env=env,
        config=cfg,
        records=records,
        section=provenance.microbench_section(config, study),
        study=study,
    )


def simulate_megamoe(
    config: dict, profile_path: str, dataset: str, out: str, options: SimOptions | None = None
) -> None:
    """raw/megamoe.json: every configuration under every configured schedule."""
    options = options or SimOptions()
    profile, env = _start(profile_path)
    moe = config["megamoe"]
    P = world_size(config, profile)
    leads = megamoe.lead_chooser(moe, profile)
    records = []
    done: dict[tuple, megamoe.MoEResult] = {}
    for point in grid.megamoe_points(moe, P):
        for schedule in moe["schedules"]:
            rid = f"{point['id']}/{schedule}"
            arm = megamoe.arm(point, schedule, moe, profile, leads)
            key = _simulation_key(arm, schedule)
            if key not in done:
                done[key] = megamoe.simulate(
                    arm, moe, profile, schedule, seed=options.seed, ranks=options.megamoe_ranks
                )
            r = done[key]
            records.append(
                ok_record(
                    rid,
                    arm,
                    {"time_us": _copies(r.time_us, _rng(options, point["id"]), options)},
                    extra={
                        "tflops": r.tflops,
                        "nvlink_bytes": r.nvlink_bytes,
                        "nvlink_bytes_per_rank": r.nvlink_bytes_per_rank,
                        "sim_rank": r.rank,
                        "wait_us_median": _median(r.waits_us),
                    },
                )
            )
    _write(
        out,
        experiment="megamoe",
        dataset=dataset,
        env=env,
        config=_sim_config(profile_path, options, world_size=P, megamoe=moe),
        records=records,
        section=provenance.experiment_section(config, "megamoe"),
    )


def _simulation_key(point: dict, schedule: str) -> tuple:
    """What a simulated MegaMoE run depends on: the point but its id, with the precision
    as its matrix rate (W4A8 and W8A8 both run at the FP8 rate: one run serves both)."""
    rest = sorted((k, str(v)) for k, v in point.items() if k not in ("id", "precision"))
    return (*rest, megamoe.PRECISION_RATE[point["precision"]], schedule)


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else 0.0


def _trace_point(moe: dict, P: int) -> dict:
    """The traced configuration: first shape, W8A8, skewed routing, fewest tokens."""
    one = {
        **moe,
        "shapes": moe["shapes"][:1],
        "precisions": ["w8a8"],
        "routings": ["skewed"],
        "tokens_per_rank": [min(moe["tokens_per_rank"])],
    }
    return grid.megamoe_points(one, P)[0]


def simulate_megamoe_trace(
    config: dict, profile_path: str, dataset: str, out: str, options: SimOptions | None = None
) -> None:
    """raw/megamoe_trace.json: store spans and timelines of one configuration, under
    expert waves, interleaved, and a local-store control (expert waves, every store local)."""
    options = options or SimOptions()
    profile, env = _start(profile_path)
    moe = config["megamoe"]
    P = world_size(config, profile)
    point = _trace_point(moe, P)
    leads = megamoe.lead_chooser(moe, profile)
    records = []
    for variant, schedule, local in (
        (WAVE, WAVE, False),
        (INTERLEAVED, INTERLEAVED, False),
        (LOCAL_CONTROL, WAVE, True),
    ):
        rid = f"{point['id']}/{variant}"
        arm = megamoe.arm(point, schedule, moe, profile, leads)
        r = megamoe.simulate(
            arm,
            moe,
            profile,
            schedule,
            local_control=local,
            keep_timeline=True,
            seed=options.seed,
            ranks=options.megamoe_ranks,
        )
        timeline = [
            [prog, kind] + [None if x is None else round(x, 4) for x in stamps]
            for prog, kind, *stamps in r.timeline
        ]
        records.append(
            ok_record(
                rid,
                {**arm, "variant": variant},
                {"store_span_us": _noisy(r.store_spans_us, _rng(options, rid), options)},
                extra={
                    "time_us": r.time_us,
                    "sim_rank": r.rank,
                    "wait_us_median": _median(r.waits_us),
                    "timeline": timeline,
                },
            )
        )
    _write(
        out,
        experiment="megamoe_trace",
        dataset=dataset,
        env=env,
        config=_sim_config(profile_path, options, world_size=P, megamoe=moe),
        records=records,
        section=provenance.experiment_section(config, "megamoe"),
    )


def simulate_attention(
    config: dict, profile_path: str, dataset: str, out: str, options: SimOptions | None = None
) -> None:
    """raw/attention.json: every (mode, heads, seq_len), point backend "sim"."""
    options = options or SimOptions()
    profile, env = _start(profile_path)
    attention = {**config["attention"], "backends": ["sim"]}
    P = world_size(config, profile)
    records = []
    for point in grid.attention_points(attention, P):
        r = ulysses.simulate(point, profile)
        # One factor per sample for both metrics (completion never precedes the sender)
        # and for every mode of a shape (ratios between modes stay the model's).
        shape = f"H={point['heads']}/S={point['seq_len']}/P={P}"
        factor = _copies(1.0, _rng(options, shape), options)
        records.append(
            ok_record(
                point["id"],
                point,
                {
                    "sender_us": [r.sender_us * f for f in factor],
                    "completion_us": [r.completion_us * f for f in factor],
                },
                extra={"tflops": r.tflops},
            )
        )
    _write(
        out,
        experiment="attention",
        dataset=dataset,
        env=env,
        config=_sim_config(profile_path, options, world_size=P, attention=attention),
        records=records,
        section=provenance.experiment_section(config, "attention"),
    )
