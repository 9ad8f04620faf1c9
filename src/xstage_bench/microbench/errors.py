"""How a microbenchmark point fails: each error names the raw record status it maps to.

This module exists because every step of a point (its plan, its check, its stamps, its
gap calibration, the GPU half in bench.py) raises these, and the runner turns any of
them into the record's status.
"""

from __future__ import annotations


class MicrobenchError(RuntimeError):
    """A point could not be measured; `status` is the raw record status it maps to."""

    status = "failed"


class PointUnsupported(MicrobenchError):
    status = "unsupported"


class WrongResult(MicrobenchError):
    status = "wrong"


class KernelTimeout(MicrobenchError):
    status = "timeout"
