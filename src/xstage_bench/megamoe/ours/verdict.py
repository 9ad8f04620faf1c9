"""The one verdict on a checked MegaMoE run, for both process models (one process driving
every GPU: measurer.py; one process per GPU: distributed.py) and the emulated build.

The checks run in this order and the first that fails names the point's error: a
Linear-2 tile's error flag (it timed out waiting for its rows), rows left unwritten (NaN
where the poisoned outputs should have been overwritten), the sampled rows' relative error
against the torch reference, and the output of a later schedule bitwise equal to the
expert-wave output of the same configuration.
"""

from __future__ import annotations

from collections.abc import Sequence

from xstage_bench.megamoe.reference import TOLERANCE

NOT_BITWISE_EQUAL = "output differs bitwise from the expert-wave schedule"


def flagged(flags: Sequence[int]) -> str | None:
    if any(flags):
        return f"a Linear-2 tile timed out waiting for its rows (error flags {flags})"
    return None


def unwritten(ranks: Sequence[int], rows: str = "output rows") -> str | None:
    """Ranks whose `rows` kept a NaN of the poison."""
    return f"{rows} left NaN (unwritten) on ranks {ranks}" if ranks else None


def local_unwritten(ranks: Sequence[int]) -> str | None:
    """Ranks where the local-store control left a row of its sink unwritten."""
    return f"local control left rows unwritten on ranks {ranks}" if ranks else None


def too_far(errors: Sequence[float], tolerance: float) -> str | None:
    """The sampled rows' relative errors (one per rank) against the tolerance."""
    if max(errors) > tolerance:
        return (
            f"relative error vs the torch reference {max(errors):.3g} > "
            f"{tolerance:g} (per rank {[f'{e:.3g}' for e in errors]})"
        )
    return None


def wrong(
    *,
    flags: Sequence[int] = (),
    nan: Sequence[int] = (),
    errors: Sequence[float] | None = None,
    tolerance: float = TOLERANCE,
    bitwise_equal: bool | None = None,
) -> str | None:
    """The first failed check, in the order above, or None; a check whose input is not
    given (errors None, bitwise_equal None) is skipped."""
    return (
        flagged(flags)
        or unwritten(nan)
        or (too_far(errors, tolerance) if errors is not None else None)
        or (NOT_BITWISE_EQUAL if bitwise_equal is False else None)
    )


def of_ranks(facts: list[dict], tolerance: float = TOLERANCE) -> tuple[str | None, dict]:
    """(error or None, the record's check facts) from every rank's check facts (one
    process per GPU: flag, nan, rel_error, checked_tokens, order_error of a device-decided
    arm's claimed order, bitwise_equal if compared)."""
    errors = [f["rel_error"] for f in facts]
    extra: dict = {"rel_error": errors, "checked_tokens_per_rank": facts[0]["checked_tokens"]}
    same = [f["bitwise_equal"] for f in facts if "bitwise_equal" in f]
    if same:
        extra["bitwise_equal_to_expert_wave"] = all(same)
    disorder = next(
        (f"rank {q}: {f['order_error']}" for q, f in enumerate(facts) if f.get("order_error")), None
    )
    if disorder:
        return disorder, extra
    error = wrong(
        flags=[f["flag"] for f in facts],
        nan=[q for q, f in enumerate(facts) if f["nan"]],
        errors=errors,
        tolerance=tolerance,
        bitwise_equal=all(same) if same else None,
    )
    return error, extra
