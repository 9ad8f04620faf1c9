"""The harness's progress lines: one `logging` logger tree, `xstage_bench.*`.

Modules log through `logging.getLogger(__name__)`; the lines go, message only, to
whatever `sys.stderr` is when they are written, so a measuring job's tee
(joblog.tee_to) and pytest's capture both see them. `logging.getLogger("xstage_bench")
.setLevel(logging.WARNING)` silences the progress.
"""

from __future__ import annotations

import logging
import sys

ROOT = "xstage_bench"


class _CurrentStderr(logging.StreamHandler):
    """A StreamHandler bound to sys.stderr at each write, not at creation."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; stderr wins
        pass


def _configure() -> logging.Logger:
    logger = logging.getLogger(ROOT)
    if not any(isinstance(h, _CurrentStderr) for h in logger.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


_configure()


def get(name: str) -> logging.Logger:
    """The logger of module `name` (pass __name__)."""
    return logging.getLogger(name)
