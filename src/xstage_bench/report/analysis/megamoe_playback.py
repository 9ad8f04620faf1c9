"""Does the Burst-Gap model predict the fused kernel? (issue 52, item 4)

Every ok arm of our kernel (a configuration, share f and schedule, with its lead) is played
through its path's fitted drain (megamoe/playback.py: the kernel's own tile list, T0 =
t0_fixed + B / issue rate, Q(K) = min(S + K q, C), drain R; the fit's drain lag is recorded
but not played, lead.PLAYS_DRAIN_LAG), with the hold (a program waits at its next claim until its
own stores drained) and without, and the predicted kernel time is set against the measured one
(the median of kernel_us; time_us where no record has it).

Tile costs are calibrated, never fitted to the arm predicted: one scale of the FLOP-rate
costs (X = megamoe.lead_auto_tflops) per configuration and schedule, set so that the
playback of a calibration arm gives its measured time. The calibration arm is the same
configuration and schedule at its smallest measured share (the same lead where one was
measured, else any: the scale is the kernel's compute rate, the lead only reorders its
tiles), at f = 0 the local control, whose playback has no drain and is exact. Where a
configuration has one share only, the tiles keep the FLOP rate. The calibration arms
themselves are reported apart (CALIBRATION), so no error counted is exact by construction.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from xstage_bench.data import layout, storepath
from xstage_bench.data.grid import NATURAL
from xstage_bench.data.results import atomic_write_text
from xstage_bench.megamoe import playback, schedule
from xstage_bench.megamoe.drain import PathParams
from xstage_bench.megamoe.ours import lead
from xstage_bench.report.analysis import megamoe, megamoe_lead
from xstage_bench.report.analysis.load import NoDataError, model_doc, raw_doc
from xstage_bench.sim.megamoe import PRECISION_RATE

MAIN, LEAD_MAP = "main grid", "lead map"
CONTROL, SHARE, FLOPS = "f = 0 control", "smallest share", "FLOP rate"
CALIBRATION = "calibration arm"
MODES = {"hold": True, "no_hold": False}  # column suffix -> playback's hold
CALIBRATION_TOLERANCE = 1e-3  # a calibration stops once its arm is played within this
CALIBRATION_STEPS = 6
PLAYBACK_KIND = "megamoe_playback"
LISTS_KEPT = 64  # tile lists kept for reuse: every schedule and lead of a few configurations


@dataclass(frozen=True)
class Arm:
    """One measured run of our kernel: its point (lead resolved), where it belongs, and
    its measured time."""

    record: dict
    point: dict
    grid: str
    share: float  # f as a number: (P-1)/P at natural routing on the peer path
    measured_us: float

    @property
    def schedule(self) -> str:
        return self.point["schedule"]

    @property
    def lead(self) -> int | None:
        return self.point.get("lead_rows") if self.schedule == schedule.INTERLEAVED else None

    @property
    def family(self) -> tuple:
        """Its configuration and schedule: the arms one calibration serves."""
        fields = {k: v for k, v in megamoe.megamoe_config_key(self.point) if k != "remote_fraction"}
        return (tuple(sorted(fields.items())), self.schedule)


def share_of(point: dict) -> float:
    """f as a number: the host share, the re-homed fraction, or (P-1)/P where routing
    chose (natural)."""
    f = point.get("remote_fraction", NATURAL)
    if f == NATURAL or f is None:
        return 0.0 if storepath.point_path(point) == storepath.HOST else 1 - 1 / point["world_size"]
    return float(f)


def measured_metric(doc: dict) -> megamoe.Metric:
    """kernel_us where every ok arm of ours has it (what the playback times), else time_us."""
    ours = [r for r in doc["records"] if r["status"] == "ok" and megamoe.is_ours(r["point"])]
    if ours and all((r.get("samples") or {}).get(megamoe.KERNEL.sample) for r in ours):
        return megamoe.KERNEL
    return megamoe.LAYER


def arms_of(doc: dict, metric: megamoe.Metric) -> list[Arm]:
    """Every ok arm of our kernel under a schedule the playback knows, its lead resolved
    (the point's, else the config's: the kernel ran with it)."""
    moe = doc["config"].get("megamoe") or {}
    arms = []
    for record in doc["records"]:
        point = record["point"]
        samples = (record.get("samples") or {}).get(metric.sample)
        if record["status"] != "ok" or not megamoe.is_ours(point) or not samples:
            continue
        if point.get("schedule") not in schedule.SCHEDULES:
            continue
        if point["schedule"] == schedule.INTERLEAVED and "lead_rows" not in point:
            point = {**point, "lead_rows": int(moe.get("lead_rows", 0))}
        grid = LEAD_MAP if point.get("lead_sweep") else MAIN
        arms.append(Arm(record, point, grid, share_of(point), float(np.median(samples))))
    return arms


def calibration_arm(arm: Arm, arms: list[Arm]) -> Arm | None:
    """The arm whose measured time sets `arm`'s tile costs (module doc), or None: its
    configuration and schedule at their smallest share, the same lead and grid first."""
    family = [a for a in arms if a.family == arm.family]
    smallest = min(a.share for a in family)
    if len({a.share for a in family}) == 1:
        return None
    candidates = [a for a in family if a.share == smallest]
    return min(candidates, key=lambda a: (a.lead != arm.lead, a.grid != arm.grid))


class RecentLists(OrderedDict):
    """The tile lists built last (a configuration's arms are played together): a dict
    that forgets its oldest entry past `size`, so a dataset's lists never pile up."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        if len(self) > self.size:
            self.popitem(last=False)


@dataclass
class Player:
    """Plays a dataset's arms through its path's drain, keeping tile lists and scales."""

    megamoe: dict
    far: PathParams
    num_programs: int
    tflops: float
    # the fit's drain lag (fraction, rate ratio) whether or not `far` plays it
    lag_fitted: tuple[float, float] = (0.0, 1.0)
    _lists: dict = field(default_factory=lambda: RecentLists(LISTS_KEPT))
    _scales: dict = field(default_factory=dict)
    _plays: dict = field(default_factory=dict)

    def rates(self, point: dict, scale: float = 1.0) -> playback.Rates:
        block_m, block_n = self.megamoe.get("block_m", 128), self.megamoe.get("block_n", 128)
        rates = playback.Rates.at(point, block_m, block_n, self.tflops, self.num_programs)
        return rates.scaled(scale)

    def time_us(self, arm: Arm, scale: float, hold: bool) -> float:
        """The arm's kernel time played with tile costs `scale` times the FLOP rate's (kept:
        a calibration arm's last play is its prediction)."""
        key = (arm.record["id"], scale, hold if arm.share > 0 else None)
        if key not in self._plays:
            self._plays[key] = playback.play_kernel(
                arm.point,
                self.megamoe,
                arm.schedule,
                self.rates(arm.point, scale),
                self.far,
                hold=hold,
                tile_lists=self._lists,
            ).time_us
        return self._plays[key]

    def scale(self, control: Arm, hold: bool) -> float:
        """The tile-cost scale under which `control` plays in its measured time: exact in
        one step where nothing crosses the path (the play is linear in it: its compute
        alone), else fixed-point steps from there until it plays within
        CALIBRATION_TOLERANCE."""
        key = (control.record["id"], hold if control.share > 0 else None)
        if key not in self._scales:
            compute = playback.play_kernel(
                control.point,
                self.megamoe,
                control.schedule,
                self.rates(control.point),
                self.far,
                local_control=True,
                tile_lists=self._lists,
            ).time_us
            scale = control.measured_us / compute
            if control.share > 0:
                for _ in range(CALIBRATION_STEPS):
                    ratio = control.measured_us / self.time_us(control, scale, hold)
                    if abs(ratio - 1) < CALIBRATION_TOLERANCE:
                        break
                    scale *= ratio
            self._scales[key] = scale
        return self._scales[key]


def player_of(dataset_dir: Path, doc: dict, path: str) -> Player:
    """The dataset's player for one store path: its model's fit of it, its GPU's SM
    count (the kernel's programs), X = megamoe.lead_auto_tflops."""
    model_file = dataset_dir / layout.MODEL_JSON
    try:
        drain = lead.drain_of(model_doc(dataset_dir), path, str(model_file))
    except lead.LeadModelError as e:
        raise NoDataError(f"dataset '{dataset_dir.name}': {e}") from None
    moe = doc["config"].get("megamoe") or {}
    return Player(
        moe,
        drain.path_params(),
        num_programs(doc),
        compute_tflops(doc),
        (drain.lag_fraction, drain.lag_rate_ratio),
    )


def compute_tflops(doc: dict) -> float:
    """X, the rate the tile costs start from where no calibration arm scales them: a
    simulated kernel's own, its profile's matrix rate for its precisions (the simulator runs
    every tile at it; with lead_auto_tflops, sim-b200's arms were predicted 6x too slow),
    else megamoe.lead_auto_tflops, the rate `auto` assumes on a GPU."""
    moe = doc["config"].get("megamoe") or {}
    profile = (doc.get("environment") or {}).get("hardware_profile") or {}
    kinds = {PRECISION_RATE.get(p) for p in moe.get("precisions") or []}
    rates = {(profile.get("matrix_tflops") or {}).get(kind) for kind in kinds}
    if len(rates) == 1 and (rate := rates.pop()):
        return float(rate)
    return float(moe.get("lead_auto_tflops", lead.DEFAULT_TFLOPS))


def num_programs(doc: dict) -> int:
    """The kernel's programs: one per SM of the GPU that ran it (the simulated profile's)."""
    env = doc.get("environment") or {}
    gpus = env.get("gpus") or []
    if gpus and gpus[0].get("sm_count"):
        return int(gpus[0]["sm_count"])
    return int((env.get("hardware_profile") or {}).get("sm_count", lead.DEFAULT_PROGRAMS))


def play_arms(dataset_dir: Path) -> tuple[dict, megamoe.Metric, pd.DataFrame, dict]:
    """(the MegaMoE document, the metric it is read in, one row per arm, the player of each
    path): configuration columns, grid, schedule, lead, f, measured and predicted times with
    and without the hold, their errors (predicted / measured - 1), the calibration and its
    scale. Minutes of CPU on a reference: the rule play_megamoe runs it once per dataset."""
    doc = raw_doc(dataset_dir, layout.MEGAMOE_RAW)
    metric = measured_metric(doc)
    arms = arms_of(doc, metric)
    if not arms:
        raise NoDataError(
            f"dataset '{dataset_dir.name}': {layout.MEGAMOE_RAW} has no ok arm of our kernel"
        )
    players: dict[str, Player] = {}
    rows = []
    for arm in arms:
        path = storepath.point_path(arm.point)
        if path not in players:
            players[path] = player_of(dataset_dir, doc, path)
        rows.append(_row(arm, calibration_arm(arm, arms), players[path]))
    return doc, metric, pd.DataFrame(rows), players


def _digests(dataset_dir: Path) -> dict[str, str]:
    """What the playback is made from, each file's sha256."""
    return {
        rel: hashlib.sha256((dataset_dir / rel).read_bytes()).hexdigest()
        for rel in (layout.MEGAMOE_RAW, layout.MODEL_JSON)
    }


def _player_fields(player: Player) -> dict:
    far = player.far
    return {
        "drain_bytes_per_us": far.drain,
        "t0_fixed_us": far.t0_fixed_us,
        "issue_bytes_per_us": far.issue_rate,
        "capacity_bytes": far.capacity,
        "capacity_per_issuer_bytes": far.capacity_per_issuer,
        "capacity_ceiling_bytes": _ceiling_to_json(far.capacity_ceiling),
        "drain_lag_fraction": far.lag_fraction,  # as played
        "drain_lag_rate_ratio": far.lag_rate_ratio,
        "drain_lag_fitted": _lag_fitted(player),
        "num_programs": player.num_programs,
        "tflops": player.tflops,
    }


def _lag_fitted(player: Player) -> dict:
    """The fit's drain lag and whether the playback plays it (and why not)."""
    fraction, rate_ratio = player.lag_fitted
    played = (player.far.lag_fraction, player.far.lag_rate_ratio) == (fraction, rate_ratio)
    return {
        "fraction": fraction,
        "rate_ratio": rate_ratio,
        "played": played,
        **({} if played else {"why": lead.LAG_NOT_PLAYED}),
    }


def play_dataset(dataset_dir: Path) -> dict:
    """The playback document (layout.MEGAMOE_PLAYBACK): every arm's prediction, each path's
    drain and programs, and the lead rule replayed on the lead map where there is one. A
    model's prediction, computed on the CPU: nothing in it was measured."""
    dataset_dir = Path(dataset_dir)
    doc, metric, predicted, players = play_arms(dataset_dir)
    paths = megamoe.ordered_paths(predicted["path"])
    try:
        _, leads = megamoe_lead.lead_sweep(dataset_dir)
    except NoDataError:
        leads = None
    replayed = pd.DataFrame()
    if leads is not None:
        replayed = replay_auto(doc, leads, megamoe_lead.lead_metric(leads), players[paths[0]])
    return {
        "kind": PLAYBACK_KIND,
        "simulated": "a Burst-Gap model prediction played on the CPU: no GPU ran it",
        "made_from": _digests(dataset_dir),
        "metric": metric.sample,
        "paths": {path: _player_fields(players[path]) for path in paths},
        "arms": _records(predicted),
        "lead_rule": _records(replayed),
    }


def _records(frame: pd.DataFrame) -> list[dict]:
    """A frame's rows as JSON values at full precision (NaN as null)."""

    def value(v):
        v = v.item() if isinstance(v, np.generic) else v
        return None if isinstance(v, float) and np.isnan(v) else v

    return [{k: value(v) for k, v in row.items()} for row in frame.to_dict("records")]


def write_playback(dataset_dir: Path, out: Path | None = None) -> Path:
    """Play the dataset's arms and write the document atomically (the rule's job)."""
    dataset_dir = Path(dataset_dir)
    out = Path(out) if out is not None else dataset_dir / layout.MEGAMOE_PLAYBACK
    atomic_write_text(out, json.dumps(play_dataset(dataset_dir), indent=1) + "\n")
    return out


def read_playback(dataset_dir: Path) -> dict:
    """The dataset's playback document, refused where it was made from another raw file or
    model than the dataset's own (its figure and table would show another run's numbers)."""
    dataset_dir = Path(dataset_dir)
    path = dataset_dir / layout.MEGAMOE_PLAYBACK
    remake = f"remake it: snakemake --cores all {path}"
    if not path.exists():
        raise NoDataError(
            f"dataset '{dataset_dir.name}': no playback: {layout.MEGAMOE_PLAYBACK} does not "
            f"exist ({remake})"
        )
    try:
        played = json.loads(path.read_text())
    except ValueError as e:
        raise NoDataError(f"{path}: not JSON ({e}); {remake}") from None
    if not isinstance(played, dict) or played.get("kind") != PLAYBACK_KIND:
        raise NoDataError(f"{path}: not a playback document (kind != {PLAYBACK_KIND!r}); {remake}")
    changed = [
        rel
        for rel, digest in _digests(dataset_dir).items()
        if (played.get("made_from") or {}).get(rel) != digest
    ]
    if changed:
        raise NoDataError(
            f"{path} was made from another {' and '.join(changed)} than the dataset's: {remake}"
        )
    return played


def predictions(
    dataset_dir: Path, played: dict | None = None
) -> tuple[dict, megamoe.Metric, pd.DataFrame]:
    """(the MegaMoE document, the metric it is read in, one row per arm) as played by the
    rule play_megamoe: `played`, the document read_playback gave, else read here."""
    played = read_playback(dataset_dir) if played is None else played
    doc = raw_doc(dataset_dir, layout.MEGAMOE_RAW)
    metric = {m.sample: m for m in megamoe.METRICS}[played["metric"]]
    return doc, metric, played_arms(played)


def played_arms(played: dict) -> pd.DataFrame:
    """One row per arm of a playback document (read_playback's), as play_arms made it."""
    return pd.DataFrame(played["arms"])


def far_paths(played: dict) -> dict[str, PathParams]:
    """Each path's drain as played (no lag in playbacks written before it, nor where the
    fitted lag is not played: lead.PLAYS_DRAIN_LAG)."""
    return {
        path: PathParams(
            p["t0_fixed_us"],
            p["issue_bytes_per_us"],
            p["drain_bytes_per_us"],
            p["capacity_bytes"],
            p["capacity_per_issuer_bytes"],
            _ceiling_of_json(p.get("capacity_ceiling_bytes")),
            p.get("drain_lag_fraction", 0.0),
            p.get("drain_lag_rate_ratio", 1.0),
        )
        for path, p in played["paths"].items()
    }


def _ceiling_to_json(C: float) -> float | None:
    """A path's ceiling as the document holds it: JSON has no inf, so no ceiling is null."""
    return C if math.isfinite(C) else None


def _ceiling_of_json(value: float | None) -> float:
    """A played path's ceiling: null (or absent, in playbacks written before it) is none."""
    return math.inf if value is None else float(value)


def _row(arm: Arm, control: Arm | None, player: Player) -> dict:
    if control is None:
        calibration = FLOPS
    elif control is arm:
        calibration = CALIBRATION
    else:
        calibration = CONTROL if control.share == 0 else SHARE
    row = {
        **megamoe.config_fields(arm.point),
        "grid": arm.grid,
        "schedule": arm.schedule,
        "lead": megamoe_lead.lead_label(arm.point) if arm.lead is not None else "",
        "lead_rows": arm.lead,
        "f": arm.share,
        "measured_us": arm.measured_us,
        "calibration": calibration,
        "calibrated_on": None if control is None else control.record["id"],
        "id": arm.record["id"],
    }
    for suffix, hold in MODES.items():
        scale = 1.0 if control is None else player.scale(control, hold)
        predicted = player.time_us(arm, scale, hold)
        row[f"tile_scale_{suffix}"] = scale
        row[f"predicted_us_{suffix}"] = predicted
        row[f"error_{suffix}"] = predicted / arm.measured_us - 1.0
    return row


def error_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Median and p90 of |error| with and without the hold: over every predicted arm,
    per grid, per schedule and per grid and schedule; the calibration arms apart."""
    predicted = frame[frame["calibration"] != CALIBRATION]
    parts = [("every arm", "", predicted)]
    parts += [(g, "", p) for g, p in predicted.groupby("grid", sort=False)]
    parts += [("", s, p) for s, p in predicted.groupby("schedule", sort=False)]
    parts += [(g, s, p) for (g, s), p in predicted.groupby(["grid", "schedule"], sort=False)]
    parts.append((CALIBRATION, "", frame[frame["calibration"] == CALIBRATION]))
    rows = []
    for grid, sched, part in parts:
        row = {"arms": grid, "schedule": sched, "n": len(part)}
        for suffix in MODES:
            errors = part[f"error_{suffix}"].abs()
            row[f"median |error| {suffix}"] = float(errors.median()) if len(part) else np.nan
            row[f"p90 |error| {suffix}"] = float(errors.quantile(0.9)) if len(part) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def replay_auto(doc: dict, leads: pd.DataFrame, metric: megamoe.Metric, player: Player):
    """The lead rule (lead.choose: causal, X and the fit, no measured time) run again at
    every point of a measured lead map, its candidates the swept leads: per point the lead
    it picks, that lead's measured speedup and the best swept lead's. The offline check
    of `auto` on a map measured before the rule (issue 52, item 5)."""
    speedup = metric.column("speedup")
    points = {r["id"]: r["point"] for r in doc["records"]}
    rows = []
    for _, part in leads.groupby(megamoe_lead.config_keys(leads), sort=False, dropna=False):
        swept = part[part["swept"] & ~part["auto"] & part["lead"].str.isdigit()]
        if swept.empty:
            continue
        measured = dict(zip(swept["lead"].astype(int), swept[speedup], strict=True))
        point = points[swept["interleaved_id"].iloc[0]]
        choice = lead.choose(
            point,
            player.megamoe,
            player.far,
            tflops=player.tflops,
            num_programs=player.num_programs,
            candidates=tuple(measured),
        )
        best = max(measured, key=measured.get)
        rows.append(
            {
                **{k: part.iloc[0][k] for k in megamoe_lead.config_keys(leads)},
                "replayed_lead": choice.rows,
                "replayed_speedup": measured[choice.rows],
                "best_lead": best,
                "best_speedup": measured[best],
            }
        )
    return pd.DataFrame(rows)
