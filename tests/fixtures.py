"""SYNTHETIC datasets for the figure and table tests, built in a test's tmp_path.

Nothing here is a measurement: the numbers come from the Burst-Gap laws with made-up
parameters (TRUTH) and a little seeded noise, the environment says host
'synthetic-test-fixture', and every file goes through results.write_raw (schema-valid).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from xstage_bench.data import grid, layout
from xstage_bench.data.results import failed_record, ok_record, raw_document, write_raw
from xstage_bench.model import laws
from xstage_bench.model.capacity import LAWS
from xstage_bench.report import products

# A simulated dataset: the experiments the simulator makes, every study a product reads.
SIMULATED_HOLDING = products.Holding.of(
    layout.SIMULATED_EXPERIMENTS,
    sorted(
        {
            r.split(":", 1)[1]
            for p in products.PRODUCTS.values()
            for r in p.reads
            if r.startswith("microbench:")
        }
    ),
)

MIB = 1 << 20
TRUTH = {"t0_fixed_us": 0.1, "issue_rate_per_sm_GBps": 60.0, "R_GBps": 365.0, "Q_bytes": 2.0 * MIB}
WINDOW_Q = 16 * 1024  # the per-producer window variant's q, bytes
CAPPED_AT = 100  # the capped variant's ceiling: its line's capacity at this K
CEILINGS = {"sm_store": 366.0, "copy_engine": 392.0}  # peer ceilings in the model file, GB/s
LINE_RATE = 450.0
LOCAL_SCALE = 10.0  # the local path: 10x the rate and the capacity
# The host path (pinned host memory over PCIe): its own R and Q, the same issuer (T0).
HOST_TRUTH = {**TRUTH, "R_GBps": 52.0, "Q_bytes": 1.0 * MIB}
HOST_CEILINGS = {"sm_store": 52.5, "copy_engine": 55.0}
HOST_LINE_RATE = 63.0
PATH_TRUTH = {"peer": TRUTH, "host": HOST_TRUTH}
GPU = "NVIDIA H200"

# The axes a microbench point takes when its study does not set them (as config.yaml).
MICROBENCH_DEFAULTS = {
    "width": 16,
    "dest": "peer",
    "pattern": "same",
    "peers": 1,
    "sync": "free",
    "gap_mode": "compute",
}

MICROBENCH = {
    "bursts": 8,
    "warmup_bursts": 2,
    "launches": 2,
    "defaults": {**MICROBENCH_DEFAULTS, "dest": "remote"},  # one point per store path
    "studies": {
        "gap_sweep": {
            "kind": "periodic",
            "K": [132],
            "V": [1 * MIB, 4 * MIB],
            "gap_us": [0, 5, 10, 20],
            "dest": ["remote", "local"],
        },
        "gap_sweep_barrier": {
            "kind": "periodic",
            "K": [132],
            "V": [1 * MIB, 4 * MIB],
            "gap_us": [0, 5, 10, 20],
            "sync": ["barrier"],
        },
        "drain": {
            "kind": "periodic",
            "K": [66, 132],
            "V": [2 * MIB, 4 * MIB, 8 * MIB],
            "gap_us": [0],
            "sync": ["free", "barrier"],
        },
        "isolated": {
            "kind": "isolated",
            "K": [66, 132],
            "V": [256 * 1024, 1 * MIB, 4 * MIB, 8 * MIB],
            "dest": ["remote", "local"],
        },
        "next_op": {
            "kind": "periodic",
            "K": [132],
            "V": [1 * MIB, 4 * MIB],
            "gap_us": [100],
            "next_op": ["none", "load", "atomic", "fence"],
            "dest": ["remote", "local"],
        },
    },
}
# The next operations the synthetic data holds at until the burst has drained.
WAITING_OPS = ("atomic", "fence")
MEGAMOE = {
    "shapes": [
        {"name": "dit-moe-g-16e2a", "H": 1408, "I": 5632, "E": 16, "topk": 2},
        {"name": "glm-5.2", "H": 6144, "I": 2048, "E": 256, "topk": 8},
    ],
    "precisions": ["w4a8", "w8a8"],
    "routings": ["balanced", "skewed"],
    "tokens_per_rank": [1024],
}
ATTENTION = {
    "seq_lens": [8192, 16384, 32768],
    "heads": [24],
    "head_dim": 128,
    "batch": 1,
    "backends": ["fa3", "triton"],
    "modes": ["alone", "serial", "fused"],
}
WORLD_SIZE = 2

# Our MegaMoE kernel's keys for the tiny configurations run under the Triton interpreter.
# A tiny MoE configuration's fixed part; a test adds its routing, tokens and ranks.
TINY_POINT = {"shape": "tiny", "H": 256, "I": 256, "E": 4, "topk": 2, "precision": "w8a8"}
TINY_MOE = {
    "skew_zipf": 1.2,
    "block_m": 128,
    "block_n": 128,
    "lead_rows": 0,
    "schedules": ["expert_wave", "interleaved"],
}


def tiny_cpu_measurer(world: int, check_tokens: int = 24):
    """Our MegaMoE measurer on `world` CPU ranks, one untimed-rule repetition per arm."""
    import torch

    from xstage_bench.measurement import timing
    from xstage_bench.megamoe.ours.measurer import MoEMeasurer

    policy = timing.TimingPolicy(0, 1, 1, 1.0, 1.0, False)
    return MoEMeasurer(
        dict(TINY_MOE), policy, [torch.device("cpu")] * world, check_tokens=check_tokens
    )


def environment(simulated: bool, paths: tuple[str, ...] = ("peer",)) -> dict:
    env = {
        "host": "synthetic-test-fixture",
        "python": "3.11",
        "packages": {},
        "git": {"sha": None, "dirty": None},
        "started_at": "2026-01-01T00:00:00Z",
        "finished_at": "2026-01-01T00:00:01Z",
        "simulated": simulated,
    }
    if simulated:
        env["hardware_profile"] = {"name": "synthetic profile"}
    else:
        gpus = 2 if "peer" in paths else 1
        env["gpus"] = [{"index": i, "name": GPU, "sm_count": 132} for i in range(gpus)]
        if "host" in paths:
            link = {"kind": "pcie", "gen": 5, "width": 16, "line_rate_GBps": HOST_LINE_RATE}
            env["host_links"] = [{"gpu": GPU, **link}] * gpus
    return env


def _noisy(value: float, rng: np.random.Generator, n: int = 5) -> list[float]:
    return list(float(value) * (1 + 0.01 * rng.standard_normal(n)))


def _write(
    ds: Path,
    rel: str,
    experiment: str,
    records: list[dict],
    *,
    study: str | None = None,
    paths: tuple[str, ...] = ("peer",),
) -> Path:
    backend = "sim" if layout.is_simulated_dataset(ds.name) else "cuda"
    doc = raw_document(
        experiment=experiment,
        backend=backend,
        dataset=ds.name,
        environment=environment(backend == "sim", paths),
        config={},
        records=records,
        study=study,
    )
    path = ds / rel
    write_raw(path, doc)
    return path


def _t0(K: int, V: float) -> float:
    return TRUTH["t0_fixed_us"] + (V / K) / laws.gbps_to_bytes_per_us(
        TRUTH["issue_rate_per_sm_GBps"]
    )


def _path(dest: str) -> tuple[float, float]:
    truth = PATH_TRUTH.get(dest, TRUTH)
    scale = LOCAL_SCALE if dest == "local" else 1.0
    return laws.gbps_to_bytes_per_us(truth["R_GBps"]) * scale, truth["Q_bytes"] * scale


def write_microbench(
    ds: Path, study: str, *, fail_last: bool = False, paths: tuple[str, ...] = ("peer",)
) -> Path:
    """One study of MICROBENCH from the laws, its remote points on each of `paths` (peer:
    TRUTH, host: HOST_TRUTH); fail_last turns the last point into a timeout."""
    rng = np.random.default_rng(len(study))
    points = grid.microbench_points(MICROBENCH, study, paths)
    records = []
    for p in points:
        T0 = _t0(p["K"], p["V"])
        R, Q = _path(p["dest"])
        if p["kind"] == "periodic":
            t_iss = float(laws.issue_time(T0, p["gap_us"], p["V"], R))
            period = float(laws.period(T0, p["gap_us"], p["V"], R))
            if p.get("next_op") in WAITING_OPS:  # held until drained, then the whole gap
                period = max(T0, p["V"] / R) + p["gap_us"]
            samples = {
                "t_iss_slowest_us": _noisy(t_iss, rng),
                "t_iss_window_us": _noisy(1.3 * t_iss + 0.2, rng),
                "period_us": _noisy(period, rng),
            }
            if p["sync"] == "barrier":  # aligned producers: the aggregate rate is measured
                samples["issue_rate_GBps"] = _noisy(R / 1e3, rng, 2)
        else:
            t_iss = float(laws.isolated_issue_time(T0, p["V"], Q, R))
            samples = {
                "t_iss_slowest_us": _noisy(t_iss, rng),
                "t_iss_window_us": _noisy(1.3 * t_iss + 0.2, rng),
            }
        records.append(ok_record(p["id"], p, samples, throttled=False))
    if fail_last:
        last = points[-1]
        records[-1] = failed_record(last["id"], last, "kernel timed out", status="timeout")
    return _write(ds, layout.microbench_raw(study), "microbench", records, study=study, paths=paths)


def _param(value: float | None) -> dict:
    if value is None:
        return {"value": None, "ci_low": None, "ci_high": None}
    return {"value": value, "ci_low": value * 0.98, "ci_high": value * 1.02}


def _validation_row(p: dict, metric: str, measured: float, predicted: float, **flags) -> dict:
    return {
        "id": p["id"],
        "study": p["study"],
        "kind": p["kind"],
        "K": p["K"],
        "V": p["V"],
        "gap_us": p["gap_us"],
        "dest": p["dest"],
        "path": p["path"],
        "sync": p["sync"],
        "aligned": p["sync"] == "barrier",
        "metric": metric,
        "measured_us": measured,
        "predicted_us": predicted,
        "rel_error": (predicted - measured) / measured,
        **{f"predicted_{law}_us": predicted for law in LAWS},
        **{f"rel_error_{law}": (predicted - measured) / measured for law in LAWS},
        **flags,
    }


def _summary(rows: list[dict]) -> dict:
    errors = np.abs([v["rel_error"] for v in rows])
    return {
        "n": len(rows),
        "median_abs_rel_error": float(np.median(errors)),
        "p90_abs_rel_error": float(np.quantile(errors, 0.9)),
    }


def _model_block(path: str, checks_pass: bool) -> dict:
    """One store path's fit as the fitter writes it, with that path's true parameters,
    fitted to the aligned gap sweep (a third held out); the free one is validated apart."""
    truth = PATH_TRUTH[path]
    validation = []
    R, _ = _path(path)
    for study, in_fit in (("gap_sweep_barrier", True), ("gap_sweep", False)):
        for i, p in enumerate(grid.microbench_points(MICROBENCH, study, (path,))):
            if p["dest"] != path:
                continue
            T0 = _t0(p["K"], p["V"])
            flags = {"in_fit_set": in_fit, "held_out": i % 3 == 0 or not in_fit}
            predicted = float(laws.issue_time(T0, p["gap_us"], p["V"], R))
            measured = predicted * (1.04 if i % 2 else 0.97)
            validation.append(_validation_row(p, "t_iss_slowest_us", measured, predicted, **flags))
            predicted = float(laws.period(T0, p["gap_us"], p["V"], R))
            validation.append(_validation_row(p, "period_us", predicted * 1.02, predicted, **flags))
    fit_held = [v for v in validation if v["in_fit_set"] and v["held_out"]]
    window = WINDOW_Q * truth["Q_bytes"] / TRUTH["Q_bytes"]
    if path == "peer":
        ceilings = {"peer_GBps": CEILINGS, "nvlink_line_rate_GBps": LINE_RATE}
    else:
        ceilings = {"host_GBps": HOST_CEILINGS, "host_line_rate_GBps": HOST_LINE_RATE}
    laws_summary = {law: {**_summary(fit_held), "folds": 5} for law in LAWS}
    return {
        "path": path,
        "params": _law_params(truth, truth["Q_bytes"], 0.0),
        "capacity_law": {
            "law": "min(S + K q, C)",
            "chosen": "shared",
            "chosen_by": "the least held-out median |error| of the isolated bursts",
            "K_ref": 132,
            "heldout": laws_summary,
            "heldout_all_records": laws_summary,
        },
        "per_K": [
            {
                "K": K,
                "R_GBps": _param(truth["R_GBps"]),
                "Q_bytes": _param(truth["Q_bytes"] * K / 132),
                "T0_us": _param(_t0(K, 4 * MIB)),
            }
            for K in (66, 132)
        ],
        "fit_set": {"zero_gap": "aligned", "periodic": "aligned", "isolated": "all"},
        "ceilings": {"path": path, **ceilings},
        "validation": validation,
        "validation_summary": _summary(fit_held),
        "validation_summary_free": _summary([v for v in validation if not v["in_fit_set"]]),
        "validation_by_metric": {
            m: _summary([v for v in fit_held if v["metric"] == m])
            for m in ("period_us", "t_iss_slowest_us")
        },
        "worst_heldout": [
            {k: v[k] for k in ("id", "metric", "K", "V", "gap_us", "measured_us", "predicted_us")}
            | {"rel_error": v["rel_error"]}
            for v in sorted(fit_held, key=lambda v: -abs(v["rel_error"]))[:2]
        ],
        "findings": {
            "store_loop_share": {
                "per_K": {"132": 0.02},
                "n": 3,
                "metrics": "3 t_vis_slowest_us",
                "what": "median t_iss_slowest / sender-visible time",
            }
        },
        "variants": {
            "shared": {"params": _law_params(truth, truth["Q_bytes"], 0.0)},
            "window": {"params": _law_params(truth, 0.0, window)},
            "shared_plus_window": {"params": _law_params(truth, truth["Q_bytes"] / 2, window / 2)},
            "capped": {
                "params": _law_params(
                    truth,
                    truth["Q_bytes"] / 2,
                    window / 2,
                    truth["Q_bytes"] / 2 + CAPPED_AT * window / 2,
                )
            },
        },
        "checks": {
            "split_consistency": {"passed": True, "detail": "R agrees across K/B splits"},
            "t0_plateau_flat": {"passed": checks_pass, "detail": "slope 0.001 us/us"},
            "capacity_law_explains_isolated": {
                "passed": True,
                "detail": "the shared law meets every K's knee",
            },
        },
    }


def _law_params(truth: dict, S: float, q: float, C: float | None = None) -> dict:
    """A capacity variant's params (Q at K = 132, the largest K fitted) with the truth's
    T0 and R; C None: no ceiling, null with its reason as the fitter writes it."""
    ceiling = {**_param(None), "reason": "no ceiling in this law"} if C is None else _param(C)
    return {
        **{name: _param(v) for name, v in truth.items() if name != "Q_bytes"},
        "Q_bytes": _param(min(S + 132 * q, C or math.inf)),
        "S_bytes": _param(S),
        "q_bytes": _param(q),
        "C_bytes": ceiling,
    }


def write_model(ds: Path, *, checks_pass: bool = True, paths: tuple[str, ...] = ("peer",)) -> Path:
    """A model/burst_gap.json as the fitter writes it, one fit per store path in `paths`
    (the first at the top level, as model/document.py lays it out)."""
    blocks = {path: _model_block(path, checks_pass) for path in paths}
    model = {
        "dataset": ds.name,
        "backend": "sim" if layout.is_simulated_dataset(ds.name) else "cuda",
        "sources": [f"results/{ds.name}/{layout.microbench_raw(s)}" for s in MICROBENCH["studies"]],
        "paths": list(paths),
        **blocks[paths[0]],
    }
    if len(paths) > 1:
        model["other_paths"] = {path: blocks[path] for path in paths[1:]}
    path = ds / layout.MODEL_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model))
    return path


def megamoe_configs() -> list[dict]:
    return grid.megamoe_points(MEGAMOE, WORLD_SIZE)


def write_megamoe(
    ds: Path,
    speedups: list[float] | None = None,
    baselines: bool = False,
    flashinfer: str | None = None,
) -> Path:
    """expert_wave at 100 us and interleaved at 100/speedup us (three identical samples, so
    medians are exact), plus one unsupported 'deepgemm' record; with `baselines`, per
    configuration the unfused pipeline at 200 us and, for w8a8 (w4a8: unsupported),
    DeepGEMM's wave at 120 us and L2-lag at 100 us. With flashinfer="ok", FlashInfer at
    90 us for w8a8 (w4a8: unsupported); "unsupported": every FlashInfer point unsupported."""
    configs = megamoe_configs()
    speedups = speedups or [0.95 + 0.05 * i for i in range(len(configs))]
    records = []

    def ok(record_id: str, point: dict, time_us: float) -> dict:
        extra = {"tflops": 1.0, "nvlink_bytes": 1 << 20}
        return ok_record(record_id, point, {"time_us": [time_us] * 3}, extra=extra)

    for config, speedup in zip(configs, speedups, strict=False):
        for schedule, time_us in (("expert_wave", 100.0), ("interleaved", 100.0 / speedup)):
            records.append(
                ok(f"{config['id']}/{schedule}", {**config, "schedule": schedule}, time_us)
            )
        if not baselines:
            continue
        point = {**config, "variant": "unfused", "schedule": "unfused"}
        records.append(ok(f"{config['id']}/unfused", point, 200.0))
        for schedule, time_us in (("expert_wave", 120.0), ("interleaved", 100.0)):
            point = {**config, "variant": "deepgemm", "schedule": schedule}
            record_id = f"{config['id']}/deepgemm/{schedule}"
            if config["precision"] == "w8a8":
                records.append(ok(record_id, point, time_us))
            else:
                records.append(failed_record(record_id, point, "FP8 only", status="unsupported"))
        if flashinfer:
            records.append(_flashinfer_record(config, flashinfer == "ok"))
    if not baselines:
        first = configs[0]
        records.append(
            failed_record(
                f"{first['id']}/deepgemm/interleaved",
                {**first, "schedule": "interleaved", "variant": "deepgemm"},
                "deep_gemm not importable",
                status="unsupported",
            )
        )
    return _write(ds, layout.MEGAMOE_RAW, "megamoe", records)


# The host path on one GPU (issue 25, item 3): host shares f (0: the local control), the
# lead map's leads (the main grid's interleaved arm asks for MAIN_LEAD) and what each
# lead leaves of the expert waves' backpressure. Known by construction: kernel time
# under expert waves 80 (1 + 0.5 f) us, interleaved 80 (1 + 0.5 f LEAD_LOSS[lead]) us;
# the layer adds 20 us (barrier and reduction) to both.
HOST_FRACTIONS = (0.0, 0.25, 0.5)
MAIN_LEAD = 256
SWEPT_LEADS = (0, 1024, 4096, "auto")
AUTO_LEAD_ROWS = 512  # what the model's auto resolves to (not a swept lead)
LEAD_LOSS = {0: 0.8, 256: 0.6, 512: 0.5, 1024: 0.4, 4096: 0.7}
HOST_ROUNDS = 9
LAYER_EXTRA_US = 20.0


def host_config_id(config: dict, f: float) -> str:
    return f"{config['id']}/path=host/f={f:g}"


def host_kernel_us(f: float, lead: int | None) -> float:
    """Kernel time of expert waves (lead None) or of interleaving with `lead` rows."""
    return 80.0 * (1 + 0.5 * f * (1.0 if lead is None else LEAD_LOSS[lead]))


def host_configs() -> list[tuple[dict, float]]:
    """(configuration at world size 1, host share) of the host fixture's main grid."""
    return [
        ({**c, "path": "host", "remote_fraction": f}, f)
        for c in grid.megamoe_points(MEGAMOE, 1)
        for f in HOST_FRACTIONS
    ]


def in_lead_map(config: dict) -> bool:
    """The lead map: w8a8, balanced routing, every shape and share."""
    return config["precision"] == "w8a8" and config["routing"] == "balanced"


def noisy_host_config(config: dict, f: float) -> bool:
    """One configuration whose rounds are noisy on their own (not a drift both share)."""
    return (
        config["shape"] == MEGAMOE["shapes"][0]["name"]
        and config["precision"] == "w4a8"
        and (config["routing"] == "skewed" and f == 0.5)
    )


def throttled_host_config(config: dict, f: float) -> bool:
    """The configuration whose interleaved record is flagged throttled: the largest f of
    the second shape, w4a8 balanced (its speedup is among the largest)."""
    return (
        config["shape"] == MEGAMOE["shapes"][1]["name"]
        and config["precision"] == "w4a8"
        and config["routing"] == "balanced"
        and f == HOST_FRACTIONS[-1]
    )


def write_megamoe_host(ds: Path, *, paired: bool = True) -> Path:
    """The host path's MegaMoE sweep on one GPU, as wt-moe's runner records it: per
    configuration and host share the two schedules timed in HOST_ROUNDS paired rounds
    (each round drifts both arms by the same few percent, so only a paired CI is narrow),
    and, for the lead map's configurations, interleaved arms per swept lead in the same
    rounds. paired=False writes the same samples without extra.paired."""
    rng = np.random.default_rng(25)
    records = []
    for config, f in host_configs():
        cid = host_config_id(config, f)
        arms = {"expert_wave": (None, None), "interleaved": (MAIN_LEAD, MAIN_LEAD)}
        if in_lead_map(config):
            for lead in SWEPT_LEADS:
                resolved = AUTO_LEAD_ROWS if lead == "auto" else lead
                arms[f"interleaved/lead={lead}"] = (lead, resolved)
        ids = [f"{cid}/{name}" for name in arms]
        drift = 1 + 0.04 * rng.standard_normal(HOST_ROUNDS)
        own = 0.08 if noisy_host_config(config, f) else 0.0005
        for (name, (requested, resolved)), record_id in zip(arms.items(), ids, strict=True):
            kernel = (
                host_kernel_us(f, resolved) * drift * (1 + own * rng.standard_normal(HOST_ROUNDS))
            )
            samples = {"time_us": kernel + LAYER_EXTRA_US, "kernel_us": kernel}
            point = {**config, "id": record_id, "schedule": name.split("/")[0]}
            if requested is not None:
                point.update(lead_rows=resolved, lead_rows_requested=requested)
            if "lead=" in name:
                point["lead_sweep"] = True
            extra = {
                "tflops": 1e3 / float(np.median(samples["time_us"])),
                "tflops_kernel": 1e3 / float(np.median(kernel)),
                "host_bytes": int(f * (1 << 24)),
                "remote_bytes": int(f * (1 << 24)),
                "stop_reason": "rounds",
            }
            if paired:
                extra["paired"] = {
                    "arms": ids,
                    "arm": record_id,
                    "rounds": HOST_ROUNDS,
                    "order": "round i runs the arms as listed when i is even, reversed when odd",
                    "position": [
                        (ids if i % 2 == 0 else ids[::-1]).index(record_id)
                        for i in range(HOST_ROUNDS)
                    ],
                }
            throttled = name == "interleaved" and throttled_host_config(config, f)
            records.append(ok_record(record_id, point, samples, extra=extra, throttled=throttled))
    return _write(ds, layout.MEGAMOE_RAW, "megamoe", records)


def write_megamoe_trace_host(ds: Path, *, peer_too: bool = False) -> Path:
    """The host path's trace of one configuration at f = 0.25: both schedules (store
    spans 9 and 3.7 us) and the f = 0 control (0.3 us below interleaved), which the host
    path writes as its share 0 rather than as a variant. peer_too: after
    write_megamoe_trace's peer records (as records before paths: no `path`)."""
    config = {**grid.megamoe_points(MEGAMOE, 1)[0], "path": "host"}
    records = read_json(write_megamoe_trace(ds))["records"] if peer_too else []
    for name, f in (("expert_wave", 0.25), ("interleaved", 0.25), ("expert_wave", 0.0)):
        control = f == 0.0
        timeline, spans = _timeline(8, wave=name == "expert_wave" and not control)
        if control:
            spans = [s - 0.3 for s in _timeline(8, wave=False)[1]]
        point = {**config, "remote_fraction": f, "schedule": name}
        if name == "interleaved":
            point.update(lead_rows=MAIN_LEAD, lead_rows_requested=MAIN_LEAD)
        record_id = f"{host_config_id(config, f)}/{name}"
        records.append(
            ok_record(record_id, point, {"store_span_us": spans}, extra={"timeline": timeline})
        )
    return _write(ds, layout.MEGAMOE_TRACE_RAW, "megamoe_trace", records)


def add_path_drain_rate(ds: Path, path: str, r_gbps: float) -> None:
    """Give the dataset's model a per-path part with its own R."""
    model_path = ds / layout.MODEL_JSON
    model = json.loads(model_path.read_text())
    block = _model_block(path, True)
    block["params"]["R_GBps"] = _param(r_gbps)
    if path == model.get("path", "peer"):
        model["params"]["R_GBps"] = _param(r_gbps)
    else:
        model["paths"] = [*model.get("paths", [model.get("path", "peer")]), path]
        model.setdefault("other_paths", {})[path] = block
    model_path.write_text(json.dumps(model))


def _flashinfer_record(config: dict, ok: bool) -> dict:
    point = {**config, "variant": "flashinfer", "schedule": "flashinfer"}
    record_id = f"{config['id']}/flashinfer"
    if ok and config["precision"] == "w8a8":
        extra = {
            "tflops": 1.0,
            "flashinfer_version": "0.7.4",
            "flashinfer_backend": "sm90_fp8_fp8_bf16_pull_cutedsl",
            "format": "FP8 e4m3, 1x128 activation and 128x128 weight block scales",
            "forward_us": 110.0,
        }
        return ok_record(record_id, point, {"time_us": [90.0] * 3}, extra=extra)
    why = "FP8 x FP8 only" if config["precision"] != "w8a8" else "no GPU"
    return failed_record(record_id, point, why, status="unsupported")


def write_megamoe_per_gpu(ds: Path, scale: dict[str, float] | None = None) -> Path:
    """The per-GPU path's run of write_megamoe's configurations (our schedules only): the
    same times, multiplied by scale[id] where given; one point recorded failed."""
    source = read_json(ds / layout.MEGAMOE_RAW)
    records = []
    for r in source["records"]:
        if r["status"] != "ok" or r["point"].get("variant"):
            continue
        factor = (scale or {}).get(r["id"], 1.0)
        times = [t * factor for t in r["samples"]["time_us"]]
        records.append(ok_record(r["id"], r["point"], {"time_us": times}))
    last = records.pop()
    records.append(failed_record(last["id"], last["point"], "check: rank 1: timed out"))
    path = _write(ds, layout.MEGAMOE_PER_GPU_RAW, "megamoe", records)
    doc = read_json(path)
    doc["environment"]["git"] = {"sha": "f" * 40, "dirty": False}
    write_raw(path, doc)
    return path


EMULATED_RATES = (500.0, 2000.0, 4500.0)
EMULATED_FRACTIONS = (0.0, "natural", 0.875)


HOST_EMULATED_FRACTIONS = (0.0, 0.25, 1.0)


def write_megamoe_emulated(
    ds: Path, paths: tuple[str, ...] = ("peer",), deepgemm: bool = False
) -> Path:
    """The emulated sweep of one shape: compute time 1e6/X us; expert waves lose
    0.3 f X/4500 of it to backpressure, interleaving 0.05 f, DeepGEMM's interleaving
    (deepgemm: a third schedule) 0.1 f (the local control, f = 0, loses nothing); waits and
    spans in the extras. The peer path as records before paths wrote it (no `path`), the
    host path over HOST_EMULATED_FRACTIONS with `path=host`."""
    shape = MEGAMOE["shapes"][0]
    records = []
    for path in paths:
        records += _emulated_records(shape, path, deepgemm)
    return _write(ds, layout.MEGAMOE_EMULATED_RAW, "megamoe_emulated", records)


def _emulated_records(shape: dict, path: str, deepgemm: bool) -> list[dict]:
    records = []
    host = path == "host"
    for fraction in HOST_EMULATED_FRACTIONS if host else EMULATED_FRACTIONS:
        f = 0.5 if fraction == "natural" else fraction
        for rate in EMULATED_RATES:
            compute = 1e6 / rate
            times = {
                "expert_wave": compute * (1 + 0.3 * f * rate / 4500),
                "interleaved": compute * (1 + 0.05 * f),
            }
            if deepgemm:
                times["deepgemm_interleaved"] = compute * (1 + 0.1 * f)
            for sched, t in times.items():
                label = "natural" if fraction == "natural" else f"{fraction:g}"
                point = {
                    "shape": shape["name"],
                    **{k: v for k, v in shape.items() if k != "name"},
                    "precision": "w8a8",
                    "routing": "balanced",
                    "tokens_per_rank": 4096,
                    "world_size": WORLD_SIZE,
                    "emulated_tflops": rate,
                    "remote_fraction": fraction,
                    "schedule": sched,
                }
                rid = f"{shape['name']}/T=4096/P=2/X={rate:g}/f={label}/{sched}"
                if host:
                    point["path"] = "host"
                    rid = f"{shape['name']}/T=4096/P=2/X={rate:g}/path=host/f={label}/{sched}"
                extra = {
                    "wait_us_p90": 0.1,
                    "store_span_us_median": 3.0 + 5.0 * f,
                    "equivalent_tflops": 0.5 * 1e6 / t,  # half the nominal rate, and less
                }
                records.append(ok_record(rid, point, {"time_us": [t] * 3}, extra=extra))
    return records


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def _timeline(programs: int, wave: bool) -> tuple[list[list], list[float]]:
    rows, spans = [], []
    for p in range(programs):
        t = 0.0
        for tile in range(3):
            rows.append([p, "L1", t, t + 4.0, None, None])
            t += 4.0
            span = 9.0 if wave else 3.7
            rows.append([p, "L2", t, t + 3.0, t + 2.5, t + 2.5 + span])
            spans.append(span + 0.1 * tile)
            t += 3.0
    return rows, spans


def write_megamoe_trace(ds: Path) -> Path:
    """expert_wave (9 us spans), interleaved (3.7 us) and the local control (0.3 us below
    interleaved), written as the simulator does: the control is variant 'local_control'."""
    config = megamoe_configs()[0]
    runs = {
        "expert_wave": {"schedule": "expert_wave"},
        "interleaved": {"schedule": "interleaved"},
        "local_control": {"schedule": "expert_wave", "variant": "local_control"},
    }
    records = []
    for name, run in runs.items():
        timeline, spans = _timeline(8, wave=name == "expert_wave")
        if name == "local_control":
            spans = [s - 0.3 for s in _timeline(8, wave=False)[1]]
        records.append(
            ok_record(
                f"{config['id']}/{name}",
                {**config, **run},
                {"store_span_us": spans},
                extra={"timeline": timeline},
            )
        )
    return _write(ds, layout.MEGAMOE_TRACE_RAW, "megamoe_trace", records)


def write_attention(ds: Path) -> Path:
    rng = np.random.default_rng(7)
    records = []
    for p in grid.attention_points(ATTENTION, WORLD_SIZE):
        alone = 200.0 * (p["seq_len"] / 8192) ** 2
        sender = {"alone": alone, "serial": alone * 1.3, "fused": alone * 1.05}[p["mode"]]
        samples = {"sender_us": _noisy(sender, rng), "completion_us": _noisy(sender * 1.02, rng)}
        records.append(ok_record(p["id"], p, samples, extra={"tflops": 500.0}))
    return _write(ds, layout.ATTENTION_RAW, "attention", records)


def write_attention_paths(
    ds: Path,
    gains: dict[tuple[str, int], float],
    *,
    paired: bool = True,
    world_size: int = 2,
    rounds: int = 12,
    seed: int = 11,
    alone_time: dict[str, float] | None = None,
) -> Path:
    """Attention records on both store paths (peer on 2 GPUs; host at P = 2 and 8), fa3
    and triton, S = 8K and 16K: serial = fused x gains[(path, P)] with a drift common to
    each round (the GPU's clock), so a paired ratio is tight and an unpaired one is wide;
    alone takes alone_time[backend] (default 1) x 0.95 x fused.
    `paired`: the records of one (path, P, S) carry one extra.paired group, as the runner
    writes them; else no pairing (as in files written before it)."""
    from xstage_bench.measurement import timing

    rng = np.random.default_rng(seed)
    attention = {**ATTENTION, "seq_lens": [8192, 16384], "host_world_sizes": [2, 8]}
    paths = ["host"] if world_size == 1 else ["peer", "host"]
    points = grid.attention_points(attention, world_size, paths)
    groups: dict[tuple, list[dict]] = {}
    for p in points:
        size = p.get("emulated_world_size", p["world_size"])
        groups.setdefault((p["path"], size, p["heads"], p["seq_len"]), []).append(p)
    records = []
    for n, ((path, size, _, seq), members) in enumerate(groups.items()):
        drift = 1 + 0.05 * rng.standard_normal(rounds)  # common to every arm of a round
        arms = [f"{p['backend']}/{p['mode']}" for p in members]
        for p in members:
            fused = 100.0 * (seq / 8192) ** 2
            time = {
                "alone": fused * 0.95 * (alone_time or {}).get(p["backend"], 1.0),
                "fused": fused,
                "serial": fused * gains[(path, size)],
            }[p["mode"]]
            noise = 1 + 0.002 * rng.standard_normal(rounds)
            sender = list(time * drift * noise)
            extra = {"tflops": 500.0}
            if paired:
                samples = timing.Samples(sender, stop_reason="stable", warmup=0, elapsed_s=1.0)
                arm = f"{p['backend']}/{p['mode']}"
                extra["paired"] = {**timing.paired_extra(arms, arm, samples), "group": f"g{n}"}
            else:
                rng.shuffle(sender)  # taken at other times: no round matches another's
            completion = [t * 1.02 for t in sender]
            records.append(
                ok_record(
                    p["id"], p, {"sender_us": sender, "completion_us": completion}, extra=extra
                )
            )
    return _write(ds, layout.ATTENTION_RAW, "attention", records)


def make_dataset(
    root: Path,
    name: str = "sim-fixture",
    *,
    megamoe: bool = True,
    attention: bool = True,
    model: bool = True,
    paths: tuple[str, ...] = ("peer",),
    playback: bool = False,
) -> Path:
    """A complete synthetic dataset (every product renders from it), its microbenchmarks
    on each store path of `paths`; the gap_sweep's last point is a failed (timeout) record.
    playback: also the rule play_megamoe's file (2 s), which the playback's products read."""
    ds = root / name
    for study in MICROBENCH["studies"]:
        write_microbench(ds, study, fail_last=study == "gap_sweep", paths=paths)
    if model:
        write_model(ds, paths=paths)
    if megamoe:
        write_megamoe(ds)
        write_megamoe_trace(ds)
    if attention:
        write_attention(ds)
    if playback:
        from xstage_bench.report.analysis.megamoe_playback import write_playback

        write_playback(ds)
    return ds


ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ("Snakefile", "workflow", "profiles", "config.yaml", "config", "kernels", "envs")


def copy_workflow(dest: Path, names: tuple[str, ...] = WORKFLOW_FILES) -> Path:
    """The workflow without any results, for a test that runs Snakemake in `dest`."""
    for name in names:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / name)
    return dest


HAVE_TORCH_TRITON = all(importlib.util.find_spec(m) for m in ("torch", "triton"))


def random_routing(seed: int, name: str, most_experts_per_rank: int) -> tuple[dict, list]:
    """A random routing's point (one, two or four ranks, balanced or skewed) and every home
    rank's expert ids (routing.route), seeded."""
    from xstage_bench.megamoe import routing

    rng = np.random.default_rng(seed)
    ranks = int(rng.choice([1, 2, 4]))
    E = ranks * int(rng.integers(1, most_experts_per_rank + 1))
    point = {
        "shape": f"{name}-{seed}",
        "E": E,
        "topk": int(rng.integers(1, min(E, 4) + 1)),
        "tokens_per_rank": int(rng.integers(1, 1500)),
        "world_size": ranks,
        "routing": str(rng.choice(["balanced", "skewed"])),
    }
    return point, [routing.route(point, 1.2, r, seed=seed)[0] for r in range(ranks)]


def interpreted_modules(monkeypatch, *names: str):
    """Yield the kernel modules `names` decorated under TRITON_INTERPRET=1, restored
    afterwards (a fixture's body: `yield from interpreted_modules(...)`).

    triton.jit reads the variable when it decorates, triton's own library functions too,
    so triton must first be imported with it set (the kernel test modules import no triton
    at collection; the attention tests' fixture sets it the same way).
    """
    if not HAVE_TORCH_TRITON:
        pytest.skip("torch and triton not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.zeros, InterpretedFunction):
        pytest.skip("triton was imported before TRITON_INTERPRET was set in this process")
    modules = []
    for name in names:
        fresh = name not in sys.modules
        modules.append(importlib.import_module(name))
        if not fresh:
            importlib.reload(modules[-1])
    yield modules
    monkeypatch.delenv("TRITON_INTERPRET")
    for module in modules:
        importlib.reload(module)


@pytest.fixture
def interpreted_kernel(monkeypatch):
    """The MoE kernel module decorated under TRITON_INTERPRET=1, restored afterwards (a test
    module imports this fixture by name)."""
    for (kernel,) in interpreted_modules(monkeypatch, "xstage_kernels.megamoe"):
        yield kernel


def interpreted_forward(prob, name: str) -> None:
    """prob.forward(name) under the Triton interpreter, skipping the test where it cannot
    run: it passes scalars as 1-element arrays, which numpy >= 2.4 refuses as a loop bound."""
    try:
        prob.forward(name)
    except Exception as e:  # triton.runtime.errors.InterpreterError
        if "0-dimensional" in str(e):
            pytest.skip(f"the Triton interpreter cannot run with this numpy: {e}")
        raise
