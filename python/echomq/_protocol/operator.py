"""The operator's verbs: retention, retry, purge, pause and resume, obliterate and forget.

Builders of ``Call``s (``calls.py``) for EMQ.RETENTION, RETRY, RETRYDEAD,
PURGE, PAUSE, RESUME, OBLITERATE and FORGET, and the SCAN steps a whole
queue's end takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .calls import Call, JobId, _check_gone, keys_of, positive_int, wire

# -- the operator's verbs (issue 13) ---------------------------------------------
# Retention, job status, retry, purge, pause/resume, obliterate.  The reads
# that need several commands are a ``Read``: the keyed commands to send in one
# MULTI/EXEC (one slot, so a cluster node serves it whole), built from the
# server's clock read just before, and how to read their replies.

KEEP_FOREVER = -1
"""A retention of -1: the finished rows are kept until deleted."""


@dataclass(frozen=True)
class Retention:
    """How long a queue keeps its finished rows, in ms (``KEEP_FOREVER`` = -1; 0 = not at all).

    Defaults: done rows an hour, cancelled rows a day, dead rows until
    retried or purged.
    """

    done_ms: int = 3_600_000
    cancelled_ms: int = 86_400_000
    dead_ms: int = KEEP_FOREVER


@dataclass(frozen=True)
class RetryDeadResult:
    """One EMQ.RETRYDEAD (or all of ``retry_dead``): jobs retried, and members dropped.

    ``dropped`` left the dead set without a retry: their row was gone or
    was not dead (the set was wrong about them).
    """

    retried: int = 0
    dropped: int = 0


@dataclass(frozen=True)
class ObliterateResult:
    """What ``obliterate`` deleted: members of the three sets (with their rows), and finished rows."""

    removed: int = 0
    forgotten: int = 0


def retention_ms(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (ms, or -1 to keep forever), not {type(value).__name__}")
    if value < KEEP_FOREVER or value > 2**53:
        raise ValueError(f"{name} must be -1 (keep forever) or from 0 to 2**53 ms, got {value}")
    return value


def _retention(call: Call[Retention], reply: Any) -> Retention:
    done, cancelled, dead = (int(v) for v in reply)
    return Retention(done, cancelled, dead)


def retention(
    queue: str, done_ms: int | None = None, cancelled_ms: int | None = None, dead_ms: int | None = None
) -> Call[Retention]:
    keys = keys_of(queue)
    args: tuple[Any, ...] = ("EMQ.RETENTION", keys.pending, keys.base)
    for option, name, value in (
        ("DONE", "done_ms", done_ms),
        ("CANCELLED", "cancelled_ms", cancelled_ms),
        ("DEAD", "dead_ms", dead_ms),
    ):
        if value is not None:
            args += (option, retention_ms(name, value))
    return Call(args, _retention, queue)


def _retried(call: Call[None], reply: Any) -> None:
    _check_gone(call, reply)


def retry(queue: str, job_id: JobId) -> Call[None]:
    keys, wid = keys_of(queue), wire(job_id)
    return Call(("EMQ.RETRY", keys.dead, keys.pending, keys.base, wid), _retried, queue, wid)


def _retry_dead_result(call: Call[RetryDeadResult], reply: Any) -> RetryDeadResult:
    retried, dropped = reply
    return RetryDeadResult(int(retried), int(dropped))


def retry_dead(queue: str, limit: int, until: int | None = None) -> Call[RetryDeadResult]:
    positive_int("limit", limit)
    keys = keys_of(queue)
    args: tuple[Any, ...] = ("EMQ.RETRYDEAD", keys.dead, keys.pending, keys.base, limit)
    if until is not None:
        args += ("UNTIL", int(until))
    return Call(args, _retry_dead_result, queue)


def _integer(call: Call[int], reply: Any) -> int:
    return int(reply)


def purge_dead(queue: str, limit: int, until: int | None = None) -> Call[int]:
    positive_int("limit", limit)
    keys = keys_of(queue)
    args: tuple[Any, ...] = ("EMQ.PURGE", keys.dead, keys.base, limit)
    if until is not None:
        args += ("UNTIL", int(until))
    return Call(args, _integer, queue)


def _changed(call: Call[bool], reply: Any) -> bool:
    return bool(reply == 1)


def pause(queue: str) -> Call[bool]:
    keys = keys_of(queue)
    return Call(("EMQ.PAUSE", keys.pending, keys.base), _changed, queue)


def resume(queue: str) -> Call[bool]:
    keys = keys_of(queue)
    return Call(("EMQ.RESUME", keys.pending, keys.base), _changed, queue)


def _obliterated(call: Call[tuple[int, int]], reply: Any) -> tuple[int, int]:
    removed, remaining = reply
    return int(removed), int(remaining)


def obliterate(queue: str, limit: int, force: bool) -> Call[tuple[int, int]]:
    """One bounded step: (members removed with their rows, members left)."""
    positive_int("limit", limit)
    keys = keys_of(queue)
    args: tuple[Any, ...] = ("EMQ.OBLITERATE", keys.active, keys.pending, keys.dead, keys.base, limit)
    return Call((*args, "FORCE") if force else args, _obliterated, queue)


def forget(queue: str, job_ids: Sequence[JobId]) -> Call[int]:
    """Delete the rows of these ids that are done or cancelled; how many were."""
    if not job_ids:
        raise ValueError("forget needs at least one job id")
    keys = keys_of(queue)
    return Call(("EMQ.FORGET", keys.pending, keys.base, *(wire(i) for i in job_ids)), _integer, queue)


def forget_steps(queue: str, job_ids: Sequence[JobId], limit: int) -> list[Call[int]]:
    """``forget`` in calls of at most ``limit`` ids each (SCAN may find more keys than its COUNT)."""
    positive_int("limit", limit)
    return [forget(queue, job_ids[k : k + limit]) for k in range(0, len(job_ids), limit)]


def _glob_escape(value: str) -> str:
    return "".join("\\" + c if c in "\\*?[]" else c for c in value)


def rows_pattern(queue: str) -> str:
    """The SCAN MATCH pattern of a queue's job rows."""
    return _glob_escape(keys_of(queue).base) + "job:*"


def scan_rows(queue: str, cursor: int, count: int) -> tuple[Any, ...]:
    """One SCAN step over the queue's job rows."""
    return ("SCAN", cursor, "MATCH", rows_pattern(queue), "COUNT", count)


def scan_reply(reply: Any) -> tuple[int, list[bytes]]:
    """SCAN's (cursor, keys); redis-py's cluster client answers ({node: cursor}, keys)."""
    cursor, keys = reply
    if isinstance(cursor, dict):
        (cursor,) = cursor.values()
    return int(cursor), [wire(k) for k in keys]


def row_id(queue: str, key: bytes | str) -> bytes:
    """The job id of a row key that SCAN found."""
    prefix = keys_of(queue).base.encode() + b"job:"
    raw = key if isinstance(key, bytes) else key.encode("utf-8", "surrogateescape")
    return raw[len(prefix) :]
