"""One process per GPU: spawn the ranks, join their groups, keep them in lockstep, and
survive a rank that hangs or dies.

An experiment provides a module-level `worker(rank, job)` (spawned, so it must be
importable) that calls `join`, runs its points (rank 0 drives `sweep.run_sweep` and
broadcasts each point through a `Lockstep`; the others follow), and ends with `leave`.
`launch` starts the ranks (one is a world too: a single GPU, groups of one) and, when an
attempt ends early, records the point it died in and resumes the sweep in fresh processes.

Points that a ratio compares can be measured together (`drive(group_of=...)`): when the
first point of a group is asked, rank 0 broadcasts the group's points of this run, every
rank checks them all (`Lockstep.measure_group`), then times those that passed in paired
rounds (`Lockstep.timed_paired`, timing.measure_paired's protocol); the group's other
records are handed to the sweep from a cache as it asks for them. A run that stops inside
a group measures the group's unrecorded points again, together; pairs never span runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from xstage_bench.data import results
from xstage_bench.measurement import log, protocol, sweep
from xstage_bench.measurement.protocol import PointFailed

# Never let NCCL, PyTorch or NVSHMEM use NVLink multicast (DEVICE.md): it can take the
# host's GPUs down for everyone. Exported before any worker starts.
SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
RESTART_EXIT_CODE = 76  # a worker's fabric is unusable (a barrier timed out): start afresh
# Control messages besides points: one timed repetition of an arm, the end of a timing,
# and, while rank 0 works alone (Lockstep.solo), a keep-alive and the end of it.
REP, END, IDLE, SOLO_END = "rep", "end", "idle", "solo-end"

_log = log.get(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def use_gpus(config: dict) -> None:
    """Make the config's `gpu_ids` (if any) the GPUs the spawned ranks see, as 0..P-1."""
    if config.get("gpu_ids"):
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in config["gpu_ids"])


def running_marker(out: Path) -> Path:
    """Where rank 0 notes the point in flight, so a crash can be pinned on it."""
    return out.with_name(out.name + ".running.json")


@dataclass
class Timed:
    """Rank 0's result of Lockstep.timed: the stopping rule's samples of the first time
    and the other times of the same repetitions (one list each)."""

    samples: object  # timing.Samples
    others: list[list[float]]


class ArmFailed(RuntimeError):
    """One arm of a paired timing failed (on some rank); the others can go on without it."""

    def __init__(self, arm: str, error: str):
        super().__init__(f"{arm}: {error}")
        self.arm, self.error = arm, error


class _GroupClocks:
    """The clock samples taken around a whole group, replayed for each of its records
    (protocol.measure_point samples once before its check and once after its timing)."""

    def __init__(self, before, after):
        self._samples = [before, after]

    def sample(self):
        return self._samples.pop(0) if len(self._samples) > 1 else self._samples[0]


def _clock_sampler(fabric):
    if fabric.device_type != "cuda":
        return None
    from xstage_bench.measurement.clocks import ClockSampler

    return ClockSampler(list(range(fabric.world_size)))


class Lockstep:
    """The control channel over the gloo group: rank 0 broadcasts, every rank answers."""

    def __init__(self, fabric):
        self.fabric = fabric
        self.broken = False  # a bounded wait timed out: this fabric cannot be trusted
        self.sampler = _clock_sampler(fabric) if fabric.rank == 0 else None
        self._solo = False

    @contextlib.contextmanager
    def solo(self):
        """Rank 0 works alone inside this block: no other rank takes part in its checks
        and timings (the host path: this GPU and host memory). Its collectives become
        local (`gather` returns its own value, `rep_max` its own times) and each sends
        the other ranks, waiting in `wait_solo`, one IDLE, so that none of their waits
        outlasts the collective timeout however long rank 0 works."""
        if self.fabric.rank != 0:
            raise RuntimeError("only rank 0 works alone; the others wait_solo()")
        self._solo = True
        try:
            yield
        finally:
            self._solo = False
            self.command(SOLO_END)

    def wait_solo(self) -> None:
        """Ranks > 0: wait while rank 0 works alone."""
        while self.command() == IDLE:
            pass

    def measure_point(self, point: dict, check, measure) -> dict | None:
        """protocol.measure_point in lockstep: every rank runs `check` and `measure` (their
        collectives), rank 0 samples the clocks and returns the point's record; the other
        ranks record nothing (None)."""
        if self.fabric.rank == 0:
            return protocol.measure_point(point, check, measure, sampler=self.sampler)
        try:
            measure(check())
        except PointFailed:
            pass  # rank 0 records it
        return None

    def command(self, message=None):
        import torch.distributed as dist

        box = [IDLE if self._solo else message]
        dist.broadcast_object_list(box, src=0, group=self.fabric.ctrl)
        return message if self._solo else box[0]

    def gather(self, value) -> list:
        import torch.distributed as dist

        if self._solo:
            self.command()
            return [value]
        out = [None] * self.fabric.world_size
        dist.all_gather_object(out, value, group=self.fabric.ctrl)
        return out

    def agree(self, fn):
        """Run `fn` on every rank; (value on this rank, first error on any rank or None)."""
        from xstage_bench.measurement.fabric import WaitTimeout

        value, error = None, None
        try:
            value = fn()
        except WaitTimeout as e:
            self.broken = True
            error = f"{type(e).__name__}: {e}"
        except Exception as e:
            error = f"rank {self.fabric.rank}: {type(e).__name__}: {e}"
        errors = [e for e in self.gather(error) if e]
        return value, (errors[0] if errors else None)

    def rep_max(self, rep: Callable[[], tuple[float, ...]], width: int) -> tuple[float, ...]:
        """Run one repetition `rep` (-> `width` times) on every rank; each time's maximum
        over ranks. RuntimeError, naming the rank, when it failed on any rank."""
        import torch
        import torch.distributed as dist

        from xstage_bench.measurement.fabric import WaitTimeout

        error = None
        try:
            values = tuple(rep())
        except Exception as e:
            self.broken = self.broken or isinstance(e, WaitTimeout)
            values = (0.0,) * width
            error = f"rank {self.fabric.rank}: {type(e).__name__}: {e}"
        if self._solo:
            self.command()
            if error:
                raise RuntimeError(error)
            return tuple(float(x) for x in values)
        t = torch.tensor([*values, float(error is not None)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.fabric.ctrl)
        if t[-1] > 0:
            raise RuntimeError(error or "a peer rank failed this repetition")
        return tuple(float(x) for x in t[:-1])

    def timed(
        self, rep: Callable[[], tuple[float, ...]], width: int, policy, *, facts: dict | None
    ) -> Timed | None:
        """Time `rep` on every rank in lockstep: rank 0's stopping rule (timing.measure)
        over the first of its times, rank 0 broadcasting one "rep" per repetition. Rank 0
        gets the result (the other ranks None); PointFailed (correct, with the check's
        `facts`) when the timing failed."""
        from xstage_bench.measurement import timing

        if self.fabric.rank != 0:
            while self.command() == "rep":
                try:
                    self.rep_max(rep, width)
                except RuntimeError:
                    pass  # rank 0 records the failure
            return None
        others: list[tuple[float, ...]] = []

        def run_once() -> float:
            self.command("rep")
            first, *rest = self.rep_max(rep, width)
            others.append(tuple(rest))
            return first

        try:
            samples = timing.measure(run_once, policy)
        except Exception as e:
            status = "timeout" if "WaitTimeout" in str(e) else "failed"
            raise PointFailed(f"timing: {e}", status=status, correct=True, extra=facts) from e
        finally:
            self.command("end")
        rest = [list(col) for col in zip(*others[-len(samples) :], strict=True)]
        return Timed(samples, rest)

    def timed_paired(
        self, reps: dict[str, Callable[[], tuple[float, ...]]], width: int, policy
    ) -> dict[str, Timed | str] | None:
        """Time the arms `reps` (name -> one repetition -> `width` times) together, in
        rounds (timing.measure_paired over the first of their times): rank 0 broadcasts
        each repetition's arm, every rank runs it, each time is the maximum over ranks.

        Rank 0 gets {arm: Timed} for the arms timed to the end and {arm: error} for any
        that failed; an arm that fails is dropped and the others are timed again from
        round 0 without it (their rounds must stay one set), unless the fabric broke,
        which ends them all. The other ranks get None.
        """
        from xstage_bench.measurement import timing

        if self.fabric.rank != 0:
            while (message := self.command()) != END:
                try:
                    self.rep_max(reps[message[1]], width)
                except RuntimeError:
                    pass  # rank 0 records the failure
            return None
        results: dict[str, Timed | str] = {}
        arms = list(reps)
        try:
            while arms:
                rows: dict[str, list[tuple[float, ...]]] = {arm: [] for arm in arms}

                def run_once_of(arm: str, rows=rows) -> Callable[[], float]:
                    def run_once() -> float:
                        self.command((REP, arm))
                        try:
                            first, *rest = self.rep_max(reps[arm], width)
                        except RuntimeError as e:
                            raise ArmFailed(arm, str(e)) from e
                        rows[arm].append(tuple(rest))
                        return first

                    return run_once

                try:
                    samples = timing.measure_paired({a: run_once_of(a) for a in arms}, policy)
                except ArmFailed as failed:
                    results[failed.arm] = failed.error
                    arms.remove(failed.arm)
                    if self.broken:
                        results.update({a: f"not timed: {failed}" for a in arms})
                        arms = []
                    continue
                except Exception as e:  # a time that is not a time (TimingError), ...
                    results.update({a: f"{type(e).__name__}: {e}" for a in arms})
                    break
                for arm, got in samples.items():
                    kept = rows[arm][-len(got) :]  # the warm-up rounds came first
                    results[arm] = Timed(got, [list(c) for c in zip(*kept, strict=True)])
                break
        finally:
            self.command(END)
        return results

    def measure_group(
        self,
        points: list[dict],
        check: Callable[[dict], dict | None],
        time_passed: Callable[[list[tuple[dict, dict | None]]], dict | None],
    ) -> dict[str, dict] | None:
        """Check every point of a group, then time those that passed together: on every
        rank (their collectives); rank 0 returns each point's record by id, the others
        None. `check(point)` gives the record's facts or raises PointFailed (then the
        point is recorded so and never timed); `time_passed([(point, facts), ...])` gives
        rank 0 {id: protocol.Measured or PointFailed}. Every check runs before any timing.
        The clocks are sampled around the whole group: its records carry the same two
        samples (protocol.measure_point builds each record)."""
        before = self.sampler.sample() if self.sampler is not None else None
        outcomes: dict[str, object] = {}
        passed = []
        for point in points:
            try:
                passed.append((point, check(point)))
            except PointFailed as failed:
                outcomes[point["id"]] = failed
        timed = time_passed(passed) if passed else {}
        if self.fabric.rank != 0:
            return None
        outcomes.update(timed)
        after = self.sampler.sample() if self.sampler is not None else None
        records = {}
        for point in points:
            outcome = outcomes[point["id"]]

            def replay(outcome=outcome):
                if isinstance(outcome, PointFailed):
                    raise outcome
                return outcome

            clocks = _GroupClocks(before, after) if self.sampler is not None else None
            records[point["id"]] = protocol.measure_point(
                point, lambda: None, lambda _, replay=replay: replay(), sampler=clocks
            )
        return records

    def follow(self, execute: Callable[[object], object]) -> None:
        """Ranks > 0: execute what rank 0 broadcasts until it sends None."""
        while (message := self.command()) is not None:
            execute(message)


def join(rank: int, job: dict):
    """Join the collective group (NCCL, or gloo on CPU) and a gloo control group, bring
    the communicator up untimed, and return this rank's fabric."""
    import torch
    import torch.distributed as dist

    from xstage_bench.measurement.fabric import CudaFabric, HostFabric

    world, cuda = job["world_size"], job["device_type"] == "cuda"
    timeout = timedelta(seconds=job["collective_timeout_s"])
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        rank=rank,
        world_size=world,
        init_method=f"tcp://127.0.0.1:{job['port']}",
        timeout=timeout,
        device_id=torch.device("cuda", rank) if cuda else None,
    )
    ctrl = dist.new_group(backend="gloo", timeout=timeout) if cuda else dist.group.WORLD
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    warm = torch.zeros(world, device=device)
    dist.all_to_all_single(torch.empty_like(warm), warm)
    fabric_cls = CudaFabric if cuda else HostFabric
    return fabric_cls(
        rank=rank,
        world_size=world,
        run_id=job["run_id"],
        ctrl=ctrl,
        group=dist.group.WORLD,
        wait_timeout_s=job["wait_timeout_s"],
    )


def leave(fabric, release: Callable[[], None] = lambda: None) -> None:
    """Tear down together: wait for the others, free this rank's peer memory (`release`),
    close the fabric and the groups."""
    import torch.distributed as dist

    dist.barrier(group=fabric.ctrl)
    release()
    fabric.close()
    dist.destroy_process_group()


def exit_cleanly() -> None:
    """A worker whose work is done and torn down leaves without interpreter finalization,
    where a native thread still alive at static destruction can abort the process
    (std::terminate, seen on gloo about one run in eight) after every result is written."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def drive(
    state: Lockstep,
    job: dict,
    points: list[dict],
    *,
    experiment: str,
    config: dict,
    refresh: sweep.RefreshRule | None = None,
    group_of: Callable[[dict], Hashable] | None = None,
):
    """Rank 0: run the sweep over `points` into job["out"], broadcasting each point so that
    every rank executes it (`state.execute`), then release the others (None). `refresh`:
    as run_sweep's.

    With `group_of`, the points of this run with one key are measured together: the first
    one asked broadcasts {"group": [points]} and `state.execute` returns every record of
    the group by id; the sweep gets the others from a cache (see the module doc)."""
    from xstage_bench.measurement import environment, faults

    out = Path(job["out"])
    marker = running_marker(out)
    env = environment.capture_measured(job["device_type"])
    env["process_model"] = "one process per GPU (torch.distributed)"
    groups: dict[Hashable, list[dict]] = {}
    cache: dict[str, dict] = {}

    def plan(todo: list[dict]) -> None:
        for point in todo:
            groups.setdefault(group_of(point), []).append(point)

    def measure(point: dict) -> dict:
        if point["id"] in cache:
            return cache.pop(point["id"])
        if state.broken:  # a barrier timed out earlier: this fabric cannot be trusted
            raise SystemExit(RESTART_EXIT_CODE)
        marker.write_text(json.dumps(point))
        faults.apply_before_measure(point["id"])
        if group_of is None:
            state.command(point)
            record = state.execute(point)
        else:
            group = groups.pop(group_of(point), None) or [point]
            message = {"group": group}
            state.command(message)
            records = state.execute(message)
            record = records.pop(point["id"])
            cache.update(records)
        marker.unlink(missing_ok=True)
        return record

    try:
        sweep.run_sweep(
            points,
            measure,
            out,
            experiment=experiment,
            backend="cuda",
            dataset=job["dataset"],
            environment=env,
            config=config,
            point_timeout_s=job["point_timeout_s"],
            refresh=refresh,
            plan=plan if group_of is not None else None,
        )
    finally:
        state.command(None)


def record_crash(out: Path, code: int) -> bool:
    """The workers died inside a point: record that point as failed in the partial file.

    False when no point was running (they died starting up or ending): a rerun would only
    die the same way.
    """
    marker, partial = running_marker(out), sweep.partial_path(out)
    if not marker.exists() or not partial.exists():
        return False
    point = json.loads(marker.read_text())
    marker.unlink()
    doc = results.read_raw(partial)
    if not any(r["id"] == point["id"] for r in doc["records"]):
        doc["records"].append(
            results.failed_record(
                point["id"], point, f"a worker process died (exit code {code}) during this point"
            )
        )
        results.write_raw(partial, doc)
    return True


def run_attempt(worker: Callable, job: dict) -> list[int | None]:
    """Spawn the workers and wait; when one fails, end the others. Exit codes by rank."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(
        worker, args=(job,), nprocs=job["world_size"], join=False, start_method="spawn"
    )
    procs = ctx.processes
    try:
        while True:
            codes = [p.exitcode for p in procs]
            if all(c is not None for c in codes):
                return codes
            if any(c not in (None, 0) for c in codes):
                time.sleep(2.0)  # let the others notice and exit on their own
                return [p.exitcode for p in procs]
            time.sleep(0.2)
    finally:  # also on SIGTERM or Ctrl-C of this process: never leave a worker on a GPU
        for p in procs:
            if p.exitcode is None:
                p.terminate()
                p.join(10)
                if p.exitcode is None:
                    p.kill()
                    p.join()


def launch(
    worker: Callable,
    job: dict,
    out: str | Path,
    *,
    tag: str,
    device_type: str = "cuda",
    wait_timeout_s: float = 60.0,
    max_restarts: int = 5,
) -> None:
    """Run `worker` on `job["world_size"]` ranks until the sweep into `out` is complete.

    Every attempt gets a fresh port and run id; `job` gains out, device_type, the bounded
    waits' timeouts and those. `device_type="cpu"` runs on gloo and the Triton interpreter
    (tests only).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.environ.update(SAFE_ENV)
    if threading.current_thread() is threading.main_thread():
        # A SIGTERM (a job killed by its scheduler) unwinds like Ctrl-C, ending the workers.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if device_type == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    for attempt in range(max_restarts + 1):
        attempt_job = {
            **job,
            "out": str(out),
            "device_type": device_type,
            "port": free_port(),
            "run_id": f"{uuid.uuid4().hex[:8]}a{attempt}",
            "wait_timeout_s": wait_timeout_s,
            "collective_timeout_s": max(2 * wait_timeout_s, 120.0),
        }
        codes = run_attempt(worker, attempt_job)
        if all(c == 0 for c in codes):
            return
        _log.info("[%s] attempt %d: worker exit codes %s", tag, attempt + 1, codes)
        if codes[0] in (sweep.WATCHDOG_EXIT_CODE, RESTART_EXIT_CODE):
            continue  # the point is recorded; resume after it in fresh processes
        if not record_crash(out, next(c for c in codes if c)):
            raise RuntimeError(
                f"{tag} workers failed outside any point (exit codes {codes}); see the log above"
            )
    raise RuntimeError(
        f"{tag} sweep did not finish after {max_restarts + 1} attempts; "
        f"rerun to resume from {sweep.partial_path(out)}"
    )
