"""Whether a kernel may load by TMA on the device of a tensor."""


def available(t) -> bool:
    """TMA loads on sm_90 and later, and under the interpreter (the CPU tests)."""
    if t.device.type != "cuda":
        return True
    import torch

    return torch.cuda.get_device_capability(t.device)[0] >= 9
