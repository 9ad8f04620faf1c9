"""A worker's membership of its world: join the collective group and the control group
(the communicator brought up untimed), leave them together, and exit without the
interpreter's finalization once the work is torn down.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import timedelta


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
