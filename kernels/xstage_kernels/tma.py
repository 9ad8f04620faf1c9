"""What a device can run: TMA loads (both kernels ask), and the warp-specialized Gluon
kernels (megamoe_ws.py, flash_ws.py), which issue Hopper's warpgroup MMA."""


def available(t) -> bool:
    """TMA loads on sm_90 and later, and under the interpreter (the CPU tests)."""
    if t.device.type != "cuda":
        return True
    import torch

    return torch.cuda.get_device_capability(t.device)[0] >= 9


def warpgroup_mma(device) -> bool:
    """Whether `device` runs the warp-specialized kernels: a Hopper GPU (sm_90). wgmma is
    Hopper's alone (Blackwell's tensor cores take tcgen05), so a later GPU runs the plain
    Triton kernels, which Triton compiles for it."""
    if getattr(device, "type", "cuda") != "cuda":
        return False
    import torch

    return torch.cuda.get_device_capability(device)[0] == 9


def first_gpu_runs_warpgroup_mma() -> bool:
    """Whether this process's GPUs run the warp-specialized kernels (its first GPU: a job's
    GPUs are of one kind), for naming the kernels that ran. True where CUDA shows no GPU, so
    a run planned on a login node or in CI names what a Hopper node runs."""
    import torch

    if not torch.cuda.is_available():
        return True
    return warpgroup_mma(torch.device("cuda", 0))
