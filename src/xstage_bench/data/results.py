"""Raw result files: build records, write them atomically, read them back validated.

Every raw JSON document in `results/<dataset>/raw/` goes through `write_raw` and
`read_raw`, so a file that exists is complete and valid, and a bad one is named.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import fastjsonschema
import jsonschema
import numpy as np

from xstage_bench.data import rawchecks
from xstage_bench.data.stats import summarize_all

SCHEMA_VERSION = 1
OK = "ok"
FAILED_STATUSES = ("failed", "wrong", "timeout", "unsupported")
# Durations and rates of work done: a zero or negative sample is a broken timer, not a
# fast kernel. Every other metric (skews, measured gaps, fences, spans) is >= 0.
POSITIVE_METRICS = frozenset(
    {
        "t_iss_slowest_us",
        "t_iss_window_us",
        "period_us",
        "visible_us",
        "time_us",
        "kernel_us",
        "sender_us",
        "completion_us",
        "bandwidth_GBps",
        "issue_rate_GBps",
        "t_vis_slowest_us",
    }
)
# Differences of two stamps that are about 0 where nothing happens, so one timer tick either
# way: the barrier's hold beyond its own cost (stamp_metrics.barrier_metrics).
SIGNED_METRICS = frozenset({"hold_us"})


class RawResultError(ValueError):
    """A raw result file (or document about to be written) is malformed."""


@cache
def raw_schema() -> dict:
    text = resources.files("xstage_bench.data").joinpath("schemas/raw.schema.json").read_text()
    return json.loads(text)


@cache
def _schema_accepts():
    """The raw schema compiled to Python code (fastjsonschema), to say quickly whether a
    document is valid: 10 to 30 times faster than jsonschema on the committed files (ref-h200x2's
    trace: 3.0 s against 0.1 s), and every render reads them. It reads draft-07, so the schema's
    $defs are renamed for it (the schema uses nothing else draft-07 lacks: tests/test_results).
    A document it refuses goes to jsonschema, which names the problem and has the last word."""
    text = json.dumps(raw_schema()).replace('"$defs"', '"definitions"')
    schema = json.loads(text.replace("#/$defs/", "#/definitions/"))
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    return fastjsonschema.compile(schema)


def schema_errors(doc: Any) -> list[jsonschema.ValidationError]:
    """Every way `doc` breaks the raw schema (none for a valid one)."""
    try:
        _schema_accepts()(doc)
        return []
    except fastjsonschema.JsonSchemaException:
        return list(jsonschema.Draft202012Validator(raw_schema()).iter_errors(doc))


def _json_path(error: jsonschema.ValidationError) -> str:
    return "/".join(str(p) for p in error.absolute_path) or "(top level)"


def _is_consequence(error: jsonschema.ValidationError) -> bool:
    """An error of an if/then/else branch: it follows from another field's value (an ok
    record needs samples, any other an error text), so that field's own error comes first."""
    return any(part in ("then", "else") for part in error.absolute_schema_path)


def _most_relevant(errors: Iterable[jsonschema.ValidationError]) -> jsonschema.ValidationError:
    """The error to report: a field's own error before a consequence of another's (seen:
    status 'bogus' reported as "'records/0/error': None is not of type 'string'"), then
    the first in the document."""
    return min(errors, key=lambda e: (_is_consequence(e), list(e.absolute_path)))


def validate_raw(doc: Any, source: str, reference: str | None = None) -> None:
    """Raise RawResultError naming `source`, the record and the first problem: the schema,
    then what the schema cannot say (rawchecks.py: summaries recomputed from the samples,
    no empty samples in an ok record, ids against points, one record per point, physical
    bounds from the environment). `reference`: the name of the reference dataset the file
    belongs to, whose files must say they were measured on GPUs (rawchecks.measured_claims)."""
    errors = schema_errors(doc)
    if errors:
        first = _most_relevant(errors)
        raise RawResultError(f"{source}: field '{_json_path(first)}': {first.message}")
    claim = rawchecks.measured_claims(doc, reference) if reference else None
    if claim:
        raise RawResultError(f"{source}: {claim}")
    seen: set[str] = set()
    for record in doc["records"]:
        if record["id"] in seen:
            raise RawResultError(f"{source}: duplicate record id '{record['id']}'")
        seen.add(record["id"])
    duplicate = rawchecks.duplicate_point(doc["records"])
    if duplicate:
        raise RawResultError(f"{source}: {duplicate}")
    bounds = rawchecks.Bounds.of(doc)
    for record in doc["records"]:
        problem = (
            _bad_values(record)
            or rawchecks.empty_samples(record)
            or rawchecks.id_problem(doc["experiment"], record)
        )
        if not problem and bounds is not None and record["status"] == OK:
            problem = rawchecks.bound_problem(bounds, record, POSITIVE_METRICS)
        if problem:
            raise RawResultError(f"{source}: record '{record['id']}': {problem}")


def _bad_values(record: dict) -> str | None:
    """What is physically wrong with a record's samples or summary, or None.

    JSON Schema cannot reject NaN or infinity, and a summary written beside its samples
    can disagree with them; readers plot the summary and fit the samples.
    """
    if record["status"] == OK and record.get("correct") is False:
        return "status 'ok' with correct false: a wrong result is recorded 'wrong'"
    samples = record.get("samples") or {}
    for name, values in samples.items():
        x = np.asarray(values, dtype=float)
        if not np.all(np.isfinite(x)):
            return f"samples '{name}' hold NaN or infinity"
        if name in POSITIVE_METRICS and np.any(x <= 0):
            return f"samples '{name}' hold a value <= 0 ({x.min():g}); a duration or rate is > 0"
        if name not in SIGNED_METRICS and np.any(x < 0):
            return f"samples '{name}' hold a negative value ({x.min():g})"
    for name, summary in (record.get("summary") or {}).items():
        values = samples.get(name)
        if not values:
            return f"summary '{name}' has no samples to come from"
        problem = rawchecks.summary_problem(name, summary, values)
        if problem:
            return problem
    return None


def ok_record(
    record_id: str,
    point: dict,
    samples: dict[str, Sequence[float]],
    *,
    correct: bool | None = None,
    throttled: bool | None = None,
    clocks: dict | None = None,
    extra: dict | None = None,
) -> dict:
    """A successful point: raw samples plus their summary. A wrong result is not a
    success: record it with failed_record(status="wrong", correct=False)."""
    if correct is False:
        raise ValueError(f"point {record_id}: an ok record cannot have correct=False")
    samples = {k: [float(v) for v in vs] for k, vs in samples.items()}
    record = {
        "id": record_id,
        "point": point,
        "status": OK,
        "error": None,
        "correct": correct,
        "samples": samples,
        "summary": summarize_all(samples),
        "throttled": throttled,
    }
    if clocks is not None:
        record["clocks"] = clocks
    if extra is not None:
        record["extra"] = extra
    return record


def failed_record(
    record_id: str,
    point: dict,
    error: str,
    *,
    status: str = "failed",
    correct: bool | None = None,
    extra: dict | None = None,
) -> dict:
    """A point that did not produce a trustworthy number: kept, with the reason."""
    if status not in FAILED_STATUSES:
        raise ValueError(f"status must be one of {FAILED_STATUSES}, got {status!r}")
    record = {
        "id": record_id,
        "point": point,
        "status": status,
        "error": error or "unknown error",
        "correct": correct,
    }
    if extra is not None:
        record["extra"] = extra
    return record


def raw_document(
    *,
    experiment: str,
    backend: str,
    dataset: str,
    environment: dict,
    config: dict,
    records: Iterable[dict],
    study: str | None = None,
    config_sha256: str | None = None,
) -> dict:
    """A raw document; config_sha256 is the hash of the config section that made it
    (provenance.section_hash), where the writer knows that section."""
    doc = {
        "schema": SCHEMA_VERSION,
        "experiment": experiment,
        "backend": backend,
        "dataset": dataset,
        "environment": environment,
        "config": config,
        "records": list(records),
    }
    if study is not None:
        doc["study"] = study
    if config_sha256 is not None:
        doc["config_sha256"] = config_sha256
    return doc


# What to do about a write that failed, by errno: the error names the file and this.
WRITE_FIXES = {
    errno.ENOSPC: "free space on the disk that holds it, then run again",
    errno.EDQUOT: "free space within your disk quota, then run again",
    errno.EACCES: "make its folder writable, then run again",
    errno.EPERM: "make its folder writable (it may be immutable: chattr -i), then run again",
    errno.EROFS: "its file system is read-only: write the results elsewhere",
}


def write_error(e: OSError, path: Path) -> OSError:
    """The same error, naming the file being written and the fix (an OSError from write()
    or fsync() names no file: seen "[Errno 28] No space left on device" and nothing else)."""
    fix = WRITE_FIXES.get(e.errno or -1)
    message = f"cannot write {path}: {e.strerror or e}" + (f" ({fix})" if fix else "")
    error = type(e)(e.errno, message) if e.errno is not None else OSError(message)
    return error


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write through a temporary file in the same directory, fsync, then rename. An error
    names the file and what to do (write_error)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise write_error(e, path) from e
    try:
        # mkstemp makes the file private (0600); results are ordinary files (0666 - umask).
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise write_error(e, path) from e
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_raw(path: str | os.PathLike, doc: dict) -> None:
    """Validate, then write atomically: a reader never sees a partial or invalid file."""
    validate_raw(doc, str(path))
    atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=False) + "\n")


def json_problem(e: json.JSONDecodeError) -> str:
    """Where and what: "Unterminated string starting at line 3, column 9". Some of json's
    messages end in "at" (they precede ": line 3 column 9"), hence the removesuffix."""
    return f"{e.msg.removesuffix(' at')} at line {e.lineno}, column {e.colno}"


def read_raw(path: str | os.PathLike, reference: str | None = None) -> dict:
    """Load and validate one raw file; any problem raises RawResultError naming the file.
    `reference`: see validate_raw."""
    path = Path(path)
    try:
        data = path.read_bytes()
        doc = json.loads(data)
    except FileNotFoundError:
        raise RawResultError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise RawResultError(f"{path}: not valid JSON ({json_problem(e)})") from None
    # A render reads the same files many times (tab-claims: every reference beside it), and
    # the checks take up to a second on a large file: a content once valid is not checked
    # again in this process. Keyed by the bytes, so an edited file is always checked.
    seen = (hashlib.blake2b(data, digest_size=16).digest(), reference)
    if seen not in _VALID_CONTENTS:
        validate_raw(doc, str(path), reference)
        _VALID_CONTENTS.add(seen)
    return doc


_VALID_CONTENTS: set[tuple[bytes, str | None]] = set()  # (digest, reference) read_raw passed
