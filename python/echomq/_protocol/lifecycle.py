"""The lifecycle verbs: a job enters (ENQUEUE), is claimed, kept, and ended by its holder.

Builders of ``Call``s (``calls.py``) for EMQ.ENQUEUE(MANY), CLAIM,
COMPLETECLAIM, EXTEND, CHECKPOINT, COMPLETE, FAIL, RELEASE, CANCEL and SWEEP,
and the values their replies become.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from ..cancel import Cancellation
from ..keyspace import QueueKeys
from .calls import (
    Call,
    CancelOutcome,
    EnqueueItem,
    FailOutcome,
    JobId,
    ReleaseOutcome,
    _check_gone,
    _none_unless_gone,
    check_token,
    data,
    keys_of,
    lease,
    message,
    ms_int,
    new_id,
    new_request_id,
    payload_bytes,
    positive_int,
    priority_args,
    raise_mapped,
    text,
    traceback_bytes,
    when_args,
    wire,
)
from .deps import OnParentFailure, after_args
from .groups import group_args
from .unique import Enqueued, enqueued, unique_args


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did, each list in processing order (oldest deadline first).

    ``recovered`` went back to pending, ``dead`` were dead-lettered at
    max-stalled stalls, ``cancelled`` had a cancel request and ended
    cancelled; ``expired`` counts dead rows removed past the queue's dead
    retention.
    """

    recovered: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    expired: int = 0

    def __len__(self) -> int:
        """The lapsed jobs this sweep took (recovered, dead or cancelled)."""
        return len(self.recovered) + len(self.dead) + len(self.cancelled)


@dataclass(frozen=True)
class Job:
    """A claimed job.

    ``token`` is the holder's fencing token, fresh for every claim (an
    opaque string: the claim's number and a random part); ``attempt`` is
    this claim's number within the job's retry budget (1 on a first run);
    ``resume_state`` is the state the job's last checkpoint stored, or None.
    """

    queue: str
    id: str
    token: str
    payload: bytes
    attempt: int = 1
    resume_state: bytes | None = None


class ExtendOutcome(enum.Enum):
    """What one extension of ``Client.extend_many`` did."""

    OK = "ok"
    """The lease now ends at server-now + ``lease_ms``."""
    GONE = "gone"
    """The job row no longer exists (``extend`` would raise ``JobGone``)."""
    STALE = "stale"
    """Another attempt holds the job, or it is no longer active (``StaleToken``)."""


def _requested_cancel(call: Call[Cancellation | None], reply: Any) -> Cancellation | None:
    _check_gone(call, reply)
    reason = reply[1]
    return None if reason is None else Cancellation(text(reason) or None)


def _sweep_result(call: Call[SweepResult], reply: Any) -> SweepResult:
    recovered, dead, cancelled, expired = reply
    return SweepResult(
        [text(i) for i in recovered], [text(i) for i in dead], [text(i) for i in cancelled], int(expired)
    )


def _enqueued_id(call: Call[Enqueued], reply: Any) -> Enqueued:
    return enqueued(call.job_id, reply)


def _enqueued_ids(call: Call[list[str]], reply: Any) -> list[str]:
    count = int(call.args[3])
    return [text(call.args[4 + 2 * i]) for i in range(count)]


def _claimed(call: Call[list[Job]], reply: Any) -> list[Job]:
    if reply is None:
        return []
    return [
        Job(call.queue, text(jid), text(token), data("payload", payload), int(attempt), state)
        for jid, token, payload, attempt, state in reply
    ]


@dataclass(frozen=True)
class CompletedAndClaimed:
    """EMQ.COMPLETECLAIM's answer: whether the completed job's row was gone (:-1), and the jobs claimed."""

    gone: bool
    jobs: list[Job]


def _completed_and_claimed(call: Call[CompletedAndClaimed], reply: Any) -> CompletedAndClaimed:
    done, claimed = reply
    return CompletedAndClaimed(done == -1, _claimed(call, claimed))  # type: ignore[arg-type]


def _fail_outcome(call: Call[FailOutcome], reply: Any) -> FailOutcome:
    _check_gone(call, reply)
    outcome = text(reply)
    if outcome == "dead":
        return "dead"
    return "cancelled" if outcome == "cancelled" else "pending"


def _cancel_outcome(call: Call[CancelOutcome], reply: Any) -> CancelOutcome:
    _check_gone(call, reply)
    outcome = text(reply)
    if outcome == "cancelled":
        return "cancelled"
    return "requested" if outcome == "requested" else "finished"


# -- the commands ----------------------------------------------------------------


def extend(queue: str, job_id: JobId, token: str, lease_ms: int) -> Call[None]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    lease("lease_ms", lease_ms)
    args = ("EMQ.EXTEND", keys.active, keys.job(wid), wid, tok, lease_ms)
    return Call(args, _none_unless_gone, queue, wid)


def extend_outcome(call: Call[None], reply: Any) -> ExtendOutcome:
    """One pipelined EXTEND's reply (or the ResponseError in its place) as an outcome."""
    if reply == 1:
        return ExtendOutcome.OK
    if reply == -1:
        return ExtendOutcome.GONE
    if isinstance(reply, ResponseError):
        if str(reply).startswith("EMQSTALE"):
            return ExtendOutcome.STALE
        raise_mapped(reply, call)
    if isinstance(reply, BaseException):
        raise reply
    raise TypeError(f"unexpected EMQ.EXTEND reply {reply!r}")


def extend_batch(queue: str, jobs: Iterable[tuple[JobId, str]], lease_ms: int) -> list[Call[None]]:
    """One EXTEND per (job_id, token), every argument checked before any is sent."""
    calls = []
    for pair in jobs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"jobs must be (job_id, token) pairs, got {pair!r}")
        calls.append(extend(queue, pair[0], pair[1], lease_ms))
    return calls


def checkpoint(
    queue: str,
    job_id: JobId,
    token: str,
    lease_ms: int,
    state: bytes | None = None,
    progress: bytes | str | None = None,
) -> Call[Cancellation | None]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    lease("lease_ms", lease_ms)
    args: tuple[Any, ...] = ("EMQ.CHECKPOINT", keys.active, keys.job(wid), wid, tok, lease_ms)
    if state is not None:
        if not isinstance(state, bytes | bytearray | memoryview):
            raise TypeError(f"state must be bytes, not {type(state).__name__}")
        args += ("STATE", bytes(state))
    if progress is not None:
        args += ("PROGRESS", data("progress", progress))
    return Call(args, _requested_cancel, queue, wid)


def sweep(queue: str, max_stalled: int, limit: int) -> Call[SweepResult]:
    keys = keys_of(queue)
    positive_int("max_stalled", max_stalled)
    positive_int("limit", limit)
    args = ("EMQ.SWEEP", keys.active, keys.pending, keys.dead, keys.base, max_stalled, limit)
    return Call(args, _sweep_result, queue)


def enqueue(
    queue: str,
    payload: bytes | str,
    job_id: JobId | None,
    delay_ms: int | None = None,
    run_at_ms: int | None = None,
    priority: int | None = None,
    unique_key: str | bytes | None = None,
    unique_for_ms: int | None = None,
    replace: bool = False,
    group: str | None = None,
    after: Iterable[JobId] | None = None,
    on_parent_failure: OnParentFailure | None = None,
    missing_ok: bool = False,
) -> Call[Enqueued]:
    keys = keys_of(queue)
    body = payload_bytes(payload)
    when = (*when_args(delay_ms, run_at_ms), *priority_args(priority), *group_args(group))
    unique = unique_args(unique_key, unique_for_ms, replace)
    wid = wire(job_id) if job_id is not None else new_id()
    deps = after_args(after, on_parent_failure, missing_ok, wid)
    # AFTER takes every argument after it: it comes last, after REQ
    args = ("EMQ.ENQUEUE", keys.pending, keys.base, wid, body, *when, *unique, "REQ", new_request_id(), *deps)
    return Call(args, _enqueued_id, queue, wid)


MAX_ENQUEUE_MANY = 10_000
"""The most jobs one EMQ.ENQUEUEMANY takes (the server's bound); enqueue_many sends chunks of it."""


def enqueue_many(
    queue: str,
    items: Iterable[EnqueueItem],
    delay_ms: int | None = None,
    chunk: int = MAX_ENQUEUE_MANY,
    priority: int | None = None,
    group: str | None = None,
) -> list[Call[list[str]]]:
    """One EMQ.ENQUEUEMANY per ``chunk`` jobs (each all or nothing), every item checked first.

    An item is a payload (the job gets a new id) or a ``(job_id, payload)``
    pair.  Ids must be distinct across the whole input (``ValueError``):
    two chunks cannot see each other's ids.  Every job gets the same delay,
    priority and group.
    """
    keys = keys_of(queue)
    when = (*when_args(delay_ms, None), *priority_args(priority), *group_args(group))
    positive_int("chunk", chunk)
    jobs: list[tuple[bytes, bytes]] = []
    seen: set[bytes] = set()
    for item in items:
        if isinstance(item, tuple):
            if len(item) != 2:
                raise ValueError(f"an enqueue_many item must be a payload or (job_id, payload), got {item!r}")
            wid, body = wire(item[0]), payload_bytes(item[1])
            if wid in seen:
                raise ValueError(f"job id {text(wid)!r} appears twice in enqueue_many")
            seen.add(wid)
        else:
            wid, body = new_id(), payload_bytes(item)
        jobs.append((wid, body))
    size = min(chunk, MAX_ENQUEUE_MANY)
    return [_many_call(queue, keys, jobs[k : k + size], when) for k in range(0, len(jobs), size)]


def _many_call(
    queue: str, keys: QueueKeys, jobs: list[tuple[bytes, bytes]], when: tuple[Any, ...]
) -> Call[list[str]]:
    flat = [x for job in jobs for x in job]
    args = ("EMQ.ENQUEUEMANY", keys.pending, keys.base, len(jobs), *flat, *when, "REQ", new_request_id())
    return Call(args, _enqueued_ids, queue)


def enqueue_many_halves(call: Call[list[str]]) -> list[Call[list[str]]]:
    """A refused ENQUEUEMANY (``over_max_limit``) as two calls of half its jobs, each with a new REQ.

    The server's ``emq.max-limit`` may be set below the 10,000 the client
    sends: it refuses the call whole, so halving until it fits loses nothing
    (each half is all or nothing on its own).
    """
    count = int(call.args[3])
    if count < 2:
        raise ValueError("a one-job ENQUEUEMANY cannot be split")
    jobs = [(call.args[4 + 2 * i], call.args[5 + 2 * i]) for i in range(count)]
    when = tuple(call.args[4 + 2 * count : -2])  # the options but REQ
    keys = keys_of(call.queue)
    half = count // 2
    return [_many_call(call.queue, keys, jobs[:half], when), _many_call(call.queue, keys, jobs[half:], when)]


def claim(
    queue: str, lease_ms: int, count: int = 1, block_ms: int | None = None, request_id: bytes | None = None
) -> Call[list[Job]]:
    """Up to ``count`` jobs, each with its payload: one round trip (waiting up to ``block_ms`` for one)."""
    keys = keys_of(queue)
    lease("lease_ms", lease_ms)
    positive_int("count", count)
    args: tuple[Any, ...] = ("EMQ.CLAIM", keys.pending, keys.active, keys.base, lease_ms)
    if count != 1:
        args += ("COUNT", count)
    if block_ms is not None:
        args += ("BLOCK", ms_int("block_ms", block_ms))
    return Call((*args, "REQ", request_id or new_request_id()), _claimed, queue)


def complete_claim(
    queue: str, job_id: JobId, token: str, lease_ms: int, count: int = 1, result: bytes | str | None = None
) -> Call[CompletedAndClaimed]:
    """COMPLETE ``job_id`` (with its ``result``), then CLAIM up to ``count`` jobs, one command.

    The claim's REQ is the call's last argument (``request_id_of``): a claim
    sent with it answers the jobs this call took, should its reply be lost.
    """
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    lease("lease_ms", lease_ms)
    positive_int("count", count)
    args: tuple[Any, ...] = ("EMQ.COMPLETECLAIM", keys.active, keys.job(wid), keys.pending, wid, tok)
    args += (lease_ms,)
    if count != 1:
        args += ("COUNT", count)
    if result is not None:
        args += ("RESULT", data("result", result))
    return Call((*args, "REQ", new_request_id()), _completed_and_claimed, queue, wid)


def request_id_of(call: Call[Any]) -> bytes:
    """The REQ a call carries (its last argument)."""
    rid = call.args[-1]
    assert call.args[-2] == "REQ" and isinstance(rid, bytes)
    return rid


def complete(queue: str, job_id: JobId, token: str, result: bytes | str | None = None) -> Call[None]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    args: tuple[Any, ...] = ("EMQ.COMPLETE", keys.active, keys.job(wid), wid, tok)
    if result is not None:
        args += ("RESULT", data("result", result))
    return Call(args, _none_unless_gone, queue, wid)


def fail(
    queue: str,
    job_id: JobId,
    token: str,
    error: str,
    max_attempts: int,
    delay_ms: int | None = None,
    traceback: str | None = None,
    dead: bool = False,
) -> Call[FailOutcome]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    text_bytes = message("error", error)
    positive_int("max_attempts", max_attempts)
    options: tuple[Any, ...] = () if delay_ms is None else ("DELAY", ms_int("delay_ms", delay_ms))
    if traceback is not None:
        options += ("TRACE", traceback_bytes(traceback))
    if not isinstance(dead, bool):
        raise TypeError(f"dead must be a bool, not {type(dead).__name__}")
    if dead:
        options += ("DEAD",)
    args: tuple[Any, ...] = ("EMQ.FAIL", keys.active, keys.pending, keys.dead, keys.base, wid, tok)
    args += (max_attempts, text_bytes, *options)
    return Call(args, _fail_outcome, queue, wid)


def _release_outcome(call: Call[ReleaseOutcome], reply: Any) -> ReleaseOutcome:
    _check_gone(call, reply)
    return "cancelled" if text(reply) == "cancelled" else "pending"


def release(queue: str, job_id: JobId, token: str, backoff_ms: int = 0) -> Call[ReleaseOutcome]:
    """RELEASE; with ``backoff_ms`` > 0 the same command backs the queue off (a handler's 429)."""
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    args: tuple[Any, ...] = ("EMQ.RELEASE", keys.active, keys.pending, keys.base, wid, tok)
    if backoff_ms:
        args += ("BACKOFF", backoff_ms)
    return Call(args, _release_outcome, queue, wid)


def cancel(queue: str, job_id: JobId, reason: str | None) -> Call[CancelOutcome]:
    keys, wid = keys_of(queue), wire(job_id)
    text_bytes = message("reason", reason, optional=True)
    return Call(("EMQ.CANCEL", keys.pending, keys.base, wid, text_bytes), _cancel_outcome, queue, wid)
