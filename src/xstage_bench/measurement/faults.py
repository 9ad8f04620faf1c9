"""Deliberate faults, to show on a real machine that failures are recorded, not hidden.

Off unless XSTAGE_INJECT_FAULT is set, e.g. "wrong:gap_us=10/;raise:V=4194304/;hang:K=33/":
each entry is `<kind>:<substring of a point id>`. Kinds:
  wrong  the kernel writes a pattern other than the one the check expects (a wrong variant)
  raise  the measurement raises before it starts
  hang   the measurement never returns, so the sweep's watchdog must end it
  crash  the measuring process dies on the spot, as after a segfault (exit code 70): a
         multi-process runner records the point failed and resumes in fresh processes
"""

from __future__ import annotations

import os

ENV = "XSTAGE_INJECT_FAULT"
KINDS = ("wrong", "raise", "hang", "crash")
CRASH_EXIT_CODE = 70  # EX_SOFTWARE


def _entries() -> list[tuple[str, str]]:
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return []
    entries = []
    for item in spec.split(";"):
        kind, sep, pattern = item.partition(":")
        if not sep or kind not in KINDS or not pattern:
            raise ValueError(
                f"{ENV}: '{item}' is not '<kind>:<point id substring>' with kind one of {KINDS}"
            )
        entries.append((kind, pattern))
    return entries


def injected(kind: str, point_id: str) -> bool:
    """Whether the fault `kind` is asked for at this point."""
    return any(k == kind and pattern in point_id for k, pattern in _entries())


def apply_before_measure(point_id: str) -> None:
    """The 'raise', 'hang' and 'crash' faults, for a runner to call before it measures a
    point."""
    if injected("crash", point_id):
        import sys

        sys.stderr.write(f"injected fault ({ENV}): crash at {point_id}\n")
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)
    if injected("raise", point_id):
        raise RuntimeError(f"injected fault ({ENV}) at {point_id}")
    if injected("hang", point_id):
        import time

        while True:  # only the watchdog ends this
            time.sleep(1.0)
