"""A pair (P) of worker processes for a baseline that needs one process per GPU.

DeepGEMM (symmetric memory) and FlashInfer (NVSHMEM) exchange tokens between processes,
while our runner drives every GPU from one process. So such a baseline runs in worker
processes of its own, one rank each, spawned on first use, joined over NCCL (NVLink
multicast off: workers.launcher.SAFE_ENV) and kept for the sweep. The runner sends them one
configuration at a time and waits a bounded time for the answer: a hang or a crash kills
the pair and fails the point, and the next point starts a fresh pair.

What a baseline provides is a `Task`: its job function (run on every rank, returning a
result with an `error` field, which a raised exception fills instead), what its workers
set up before they import torch, and the environment they run in.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from xstage_bench.measurement.workers.launcher import SAFE_ENV, free_port


@dataclass(frozen=True)
class Task:
    """What the workers of one baseline run (module-level callables: they are pickled)."""

    name: str  # says whose workers failed, in the runner's messages
    run_job: Callable  # (job, rank, group) -> result with an `error` field
    result_type: Callable  # result_type(error=text): a job that raised
    prepare: Callable[[], object] = lambda: None  # before torch is imported (site dirs)
    env: dict = field(default_factory=dict)  # set in the workers, over SAFE_ENV
    env_defaults: dict = field(default_factory=dict)  # set only where the user has not


STEPS_ENV = "XSTAGE_WORKER_STEPS"  # a folder where each worker notes the step it is in


def announce_step(name: str) -> None:
    """Note the step this worker process starts, so that a crash (a segfault leaves no
    exception) is reported with the step it happened in."""
    folder = os.environ.get(STEPS_ENV)
    if folder:
        Path(folder, str(os.getpid())).write_text(name)


def last_step(folder: str, pid: int | None) -> str | None:
    path = Path(folder, str(pid))
    return path.read_text() if pid is not None and path.exists() else None


class WorkerPair:
    """One worker process per rank running `task`, started on first use."""

    def __init__(self, task: Task, world_size: int, timeout_s: float):
        self.task = task
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.procs: list = []
        self.jobs: list = []
        self.results = None
        self.steps: str | None = None  # the folder of the workers' step notes

    def _start(self) -> None:
        import multiprocessing as mp

        os.environ.update(SAFE_ENV)  # inherited by the spawned workers
        self.steps = tempfile.mkdtemp(prefix="xstage-worker-steps-")
        os.environ[STEPS_ENV] = self.steps
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.jobs = [ctx.Queue() for _ in range(self.world_size)]
        port = free_port()
        self.procs = [
            ctx.Process(
                target=serve,
                args=(self.task, rank, self.world_size, port, self.jobs[rank], self.results),
                daemon=True,
            )
            for rank in range(self.world_size)
        ]
        for p in self.procs:
            p.start()

    def run(self, job: dict, timeout_s: float | None = None) -> list:
        """Run one configuration on every rank (job["tokens"][rank] goes to that rank);
        the results in rank order. A timeout or a dead worker raises TimeoutError or
        RuntimeError after killing the pair."""
        if not self.procs:
            self._start()
        for rank, q in enumerate(self.jobs):
            q.put({**job, "tokens": job["tokens"][rank]})
        waited = timeout_s or self.timeout_s
        deadline = time.monotonic() + waited
        got: dict = {}
        while len(got) < self.world_size:
            try:
                rank, result = self.results.get(timeout=1.0)
                got[rank] = result
                continue
            except queue.Empty:
                pass
            dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
            if dead:
                codes = [self.procs[r].exitcode for r in dead]
                steps = {last_step(self.steps, self.procs[r].pid) for r in dead} - {None}
                self.close()
                where = f" in step {', '.join(repr(s) for s in sorted(steps))}" if steps else ""
                raise RuntimeError(
                    f"{self.task.name} worker(s) {dead} died (exit codes {codes}){where}"
                )
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"{self.task.name} workers gave no answer within {waited:.0f} s")
        return [got[r] for r in range(self.world_size)]

    def close(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
        self.procs = []
        if self.steps:  # the workers' step notes go with them
            shutil.rmtree(self.steps, ignore_errors=True)
            self.steps = None


def serve(task: Task, rank: int, world: int, port: int, jobs, results) -> None:
    """A worker process: join the group, then run jobs until killed."""
    os.environ.update({**SAFE_ENV, **task.env})
    for key, value in task.env_defaults.items():
        os.environ.setdefault(key, value)
    task.prepare()
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        device_id=torch.device("cuda", rank),
    )
    group = dist.group.WORLD
    while True:
        job = jobs.get()
        try:
            result = task.run_job(job, rank, group)
        except Exception as e:  # a library's host checks arrive here, on every rank alike
            result = task.result_type(error=f"{type(e).__name__}: {str(e).strip()[:1500]}")
        torch.cuda.empty_cache()
        results.put((rank, result))


def time_collective(call, policy: dict, device, refill=None) -> tuple[list[float], dict]:
    """Per repetition: the inputs refilled (`refill`, if any), L2 flushed, the ranks meet
    at a barrier (all untimed), then CUDA events around one `call`. A fixed count, the
    same on every rank (timing.measure_fixed, rank 0's count); a sample is the slowest
    rank's time. Also the host lead's facts (timing.HostLead, where the policy asks for
    one; {} otherwise): the slowest rank's enqueue, the waits of every rank."""
    import torch
    import torch.distributed as dist

    from xstage_bench.measurement import timing

    policy = timing.TimingPolicy(**policy)
    flush = timing.l2_flusher(torch, device.index) if policy.flush_l2 else None
    lead = timing.host_lead(policy)

    def setup() -> None:
        if refill is not None:
            refill()
        if flush is not None:
            flush()
        dist.barrier()

    def agree(n: int) -> int:
        box = [n]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    run_once = timing.cuda_event_timer(
        call, device=device.index, flush_l2=False, setup=setup, lead=lead
    )
    mine = timing.measure_fixed(run_once, policy, agree=agree)
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, (mine, timing.lead_facts(lead)))
    times = [float(max(v)) for v in zip(*(t for t, _ in every), strict=True)]
    return times, combined_leads([extra for _, extra in every])


def combined_leads(per_rank: list[dict]) -> dict:
    """Every rank's HostLead facts as one record's: the slowest enqueue, all the waits."""
    if not per_rank or not per_rank[0]:
        return {}
    return {
        "host_enqueue_us": max(e["host_enqueue_us"] for e in per_rank),
        "gpu_waited_for_host": sum(e["gpu_waited_for_host"] for e in per_rank),
        "host_lead_calls": max(e["host_lead_calls"] for e in per_rank),
    }
