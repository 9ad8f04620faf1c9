"""Checks of a launcher's tensor arguments, for what a kernel cannot check itself: a wrong
dtype, shape or stride is read as raw words on the device, silently."""

from __future__ import annotations


def check_tensor(
    t, name: str, dtypes: tuple, *, ndim: int | None = None, shape=None, step_major=False
) -> None:
    """ValueError naming `name` unless t is a contiguous tensor of one of `dtypes` with
    this shape (or number of dimensions); step_major: or the transpose of one."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must be {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must be {tuple(shape)}, got {tuple(t.shape)}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got {tuple(t.shape)}")
    if not (t.is_contiguous() or (step_major and t.t().is_contiguous())):
        what = "contiguous or the transpose of a contiguous tensor" if step_major else "contiguous"
        raise ValueError(f"{name} must be {what}")


def same_device(ref, **tensors) -> None:
    """ValueError naming the first of `tensors` not on ref's device."""
    for name, t in tensors.items():
        if t.device != ref.device:
            raise ValueError(f"{name} is on {t.device}, not {ref.device}")
