"""The read views: a job, a queue's counts and counters, pages of its sets, the queues.

Each is a ``Read``: the keyed commands to send in one MULTI/EXEC (one slot,
so a cluster node serves it whole), built from the server's clock read just
before, and how to read their replies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic

from .calls import JobId, T, keys_of, positive_int, text, wire


@dataclass(frozen=True)
class JobInfo:
    """One job as its row and the queue's sets said at one instant (``server_time``, ms).

    Times are server ms.  ``lease_deadline``/``lease_left_ms`` while the job
    is active (negative time left: the lease lapsed and a sweep will take
    it); ``due_at`` while it waits with a pending score in the future (a
    delayed job); ``dead_at`` while it is in the dead set; ``expires_at`` when
    the row has a retention expiry.  ``payload`` only when asked for
    (``payload_size`` always).  Fields that are absent or not integers read
    as None (0 for the counters).
    """

    queue: str
    id: str
    state: str
    attempts: int
    tries: int
    retries: int
    stalled: int
    last_error: str | None
    cancel_requested: bool
    cancel_reason: str | None
    enqueued_at: int | None
    claimed_at: int | None
    finished_at: int | None
    lease_deadline: int | None
    lease_left_ms: int | None
    due_at: int | None
    dead_at: int | None
    expires_at: int | None
    payload_size: int
    payload: bytes | None
    checkpoint_size: int | None
    checkpoint_at: int | None
    checkpoint_attempt: int | None
    server_time: int


@dataclass(frozen=True)
class QueueCounts:
    """A queue's numbers at one instant (``server_time``, ms).

    ``pending`` is claimable now, ``delayed`` waits for a later time;
    ``lapsed`` of the ``active`` are past their lease (a sweep takes them);
    ``failed`` is the dead-lettered metric (every death ever, not the dead
    set's size).
    """

    pending: int
    delayed: int
    active: int
    lapsed: int
    dead: int
    paused: bool
    failed: int
    server_time: int


@dataclass(frozen=True)
class DeadJob:
    """A job in the dead set: when it died (server ms), why, and its counters."""

    id: str
    died_at: int
    last_error: str | None
    attempts: int
    tries: int
    retries: int
    stalled: int


@dataclass(frozen=True)
class Read(Generic[T]):
    """Commands of one queue to run in one MULTI/EXEC after reading the server clock."""

    key: str
    build: Callable[[int], list[tuple[Any, ...]]]
    parse: Callable[[int, list[Any]], T]


def _int(value: Any, default: int | None = None) -> int | None:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _count(value: Any) -> int:
    result = _int(value, 0)
    assert result is not None
    return result


def _opt_text(value: Any) -> str | None:
    return None if value is None else text(value)


JOB_FIELDS = (
    "state", "attempts", "tries", "retries", "stalled", "last_error", "cancel_requested",
    "enqueued_at", "claimed_at", "finished_at", "checkpoint_at", "checkpoint_attempt",
)  # fmt: skip


def job_info(queue: str, job_id: JobId, with_payload: bool = False) -> Read[JobInfo | None]:
    keys, wid = keys_of(queue), wire(job_id)
    row = keys.job(wid)
    fields = (*JOB_FIELDS, "payload") if with_payload else JOB_FIELDS

    def build(now: int) -> list[tuple[Any, ...]]:
        return [
            ("EXISTS", row),
            ("HMGET", row, *fields),
            ("HSTRLEN", row, "payload"),
            ("HEXISTS", row, "checkpoint"),
            ("HSTRLEN", row, "checkpoint"),
            ("ZSCORE", keys.active, wid),
            ("ZSCORE", keys.pending, wid),
            ("ZSCORE", keys.dead, wid),
            ("PTTL", row),
        ]

    def parse(now: int, replies: list[Any]) -> JobInfo | None:
        exists, values, payload_size, has_checkpoint, checkpoint_size, active, pending, dead, pttl = replies
        if not exists:
            return None
        v = dict(zip(fields, values, strict=True))
        deadline = None if active is None else int(float(active))
        due = None if pending is None or float(pending) <= now else int(float(pending))
        cancel = v["cancel_requested"]
        return JobInfo(
            queue=queue,
            id=text(wid),
            state=text(v["state"] or b""),
            attempts=_count(v["attempts"]),
            tries=_count(v["tries"] if v["tries"] is not None else v["attempts"]),
            retries=_count(v["retries"]),
            stalled=_count(v["stalled"]),
            last_error=_opt_text(v["last_error"]),
            cancel_requested=cancel is not None,
            cancel_reason=(text(cancel) or None) if cancel is not None else None,
            enqueued_at=_int(v["enqueued_at"]),
            claimed_at=_int(v["claimed_at"]),
            finished_at=_int(v["finished_at"]),
            lease_deadline=deadline,
            lease_left_ms=None if deadline is None else deadline - now,
            due_at=due,
            dead_at=None if dead is None else int(float(dead)),
            expires_at=now + int(pttl) if int(pttl) >= 0 else None,
            payload_size=int(payload_size),
            payload=None if not with_payload else wire(v["payload"] or b""),
            checkpoint_size=int(checkpoint_size) if has_checkpoint else None,
            checkpoint_at=_int(v["checkpoint_at"]),
            checkpoint_attempt=_int(v["checkpoint_attempt"]),
            server_time=now,
        )

    return Read(keys.pending, build, parse)


def counts(queue: str) -> Read[QueueCounts]:
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        return [
            ("ZCARD", keys.pending),
            ("ZCOUNT", keys.pending, "-inf", now),
            ("ZCARD", keys.active),
            ("ZCOUNT", keys.active, "-inf", f"({now}"),
            ("ZCARD", keys.dead),
            ("HEXISTS", keys.meta, "paused"),
            ("HGET", keys.metrics_failed, "count"),
        ]

    def parse(now: int, replies: list[Any]) -> QueueCounts:
        waiting, ready, active, lapsed, dead, paused, failed = replies
        return QueueCounts(
            pending=int(ready),
            delayed=int(waiting) - int(ready),
            active=int(active),
            lapsed=int(lapsed),
            dead=int(dead),
            paused=bool(paused),
            failed=_count(failed),
            server_time=now,
        )

    return Read(keys.pending, build, parse)


def _pairs(reply: Any) -> list[tuple[bytes, float]]:
    """ZRANGE ... WITHSCORES as (member, score) pairs, from RESP2's flat list or RESP3's pairs."""
    if reply and isinstance(reply[0], list | tuple):
        return [(wire(m), float(s)) for m, s in reply]
    return [(wire(reply[i]), float(reply[i + 1])) for i in range(0, len(reply), 2)]


DEAD_FIELDS = ("last_error", "attempts", "tries", "retries", "stalled")


def dead_page(queue: str, offset: int, count: int) -> Read[list[tuple[bytes, int]]]:
    """The ids and death times of one page of the dead set, oldest first."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, got {offset!r}")
    positive_int("count", count)
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        return [("ZRANGE", keys.dead, offset, offset + count - 1, "WITHSCORES")]

    def parse(now: int, replies: list[Any]) -> list[tuple[bytes, int]]:
        return [(m, int(s)) for m, s in _pairs(replies[0])]

    return Read(keys.dead, build, parse)


def dead_rows(queue: str, page: list[tuple[bytes, int]]) -> Read[list[DeadJob]]:
    """The rows of a page of dead ids; ids that left the dead set meanwhile are left out."""
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = []
        for wid, _ in page:
            commands.append(("ZSCORE", keys.dead, wid))
            commands.append(("HMGET", keys.job(wid), *DEAD_FIELDS))
        return commands

    def parse(now: int, replies: list[Any]) -> list[DeadJob]:
        jobs = []
        for i, _ in enumerate(page):
            score, values = replies[2 * i], replies[2 * i + 1]
            if score is None:
                continue
            last_error, attempts, tries, retries, stalled = values
            jobs.append(
                DeadJob(
                    id=text(page[i][0]),
                    died_at=int(float(score)),
                    last_error=_opt_text(last_error),
                    attempts=_count(attempts),
                    tries=_count(tries if tries is not None else attempts),
                    retries=_count(retries),
                    stalled=_count(stalled),
                )
            )
        return jobs

    return Read(keys.dead, build, parse)


# -- the operator's views: active and waiting jobs, the queues, shared counters ----


@dataclass(frozen=True)
class ActiveJob:
    """A job in the active set: its lease (server ms) and what its row says about it.

    ``lease_left_ms`` is negative once the lease has lapsed (a sweep will
    take the job).  ``cancel_requested`` is True once a cancel was asked
    for (``cancel_reason`` is its reason, None when none was given).
    """

    id: str
    lease_deadline: int
    lease_left_ms: int
    claimed_at: int | None
    enqueued_at: int | None
    attempts: int
    tries: int
    stalled: int
    cancel_requested: bool
    cancel_reason: str | None


@dataclass(frozen=True)
class PendingJob:
    """A job in the pending set, in claim order: when it is (or was) due, and its counters.

    ``due_at`` is its pending score (server ms): the enqueue time, a delayed
    job's due time, or 0 for a job put back at the head of the queue (by a
    sweep or a release).  ``delayed`` is True while ``due_at`` is in the
    future.  ``waiting_ms`` is how long it has been claimable: now minus
    ``due_at`` (for a job at the head, minus its last claim or its enqueue
    time), 0 while delayed.
    """

    id: str
    due_at: int
    delayed: bool
    waiting_ms: int
    enqueued_at: int | None
    claimed_at: int | None
    attempts: int
    tries: int
    retries: int
    cancel_requested: bool


COUNTER_FIELDS = ("claimed", "completed", "failed", "cancelled", "released", "recovered", "lease_lost")
"""The fields of ``<base>metrics:counts``, the counters workers and reapers share through Redis."""


@dataclass(frozen=True)
class QueueCounters:
    """A queue's shared counters (totals since they were first written), at ``server_time``.

    ``dead_lettered`` is the module's own count of deaths (``<base>metrics:failed``);
    the others are added by the workers and reapers that run with
    ``echomq.metrics.Metrics`` (``<base>metrics:counts``): jobs claimed,
    completed, failed (a handler raised: retried or dead), ended cancelled,
    given back (released), recovered by a sweep, and leases the holder lost.
    """

    claimed: int
    completed: int
    failed: int
    cancelled: int
    released: int
    recovered: int
    lease_lost: int
    dead_lettered: int
    server_time: int


def counters_key(queue: str) -> str:
    """The hash of the counters workers and reapers share: ``<base>metrics:counts``."""
    return keys_of(queue).base + "metrics:counts"


def counters(queue: str) -> Read[QueueCounters]:
    keys, key = keys_of(queue), counters_key(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        return [("HMGET", key, *COUNTER_FIELDS), ("HGET", keys.metrics_failed, "count")]

    def parse(now: int, replies: list[Any]) -> QueueCounters:
        values, dead = replies
        shared = {name: _count(v) for name, v in zip(COUNTER_FIELDS, values, strict=True)}
        return QueueCounters(**shared, dead_lettered=_count(dead), server_time=now)

    return Read(keys.pending, build, parse)


def add_counters(queue: str, deltas: dict[str, int]) -> list[tuple[Any, ...]]:
    """The commands that add ``deltas`` (fields of ``COUNTER_FIELDS``) to the shared counters."""
    key = counters_key(queue)
    return [("HINCRBY", key, name, n) for name, n in deltas.items() if n and name in COUNTER_FIELDS]


def _page(queue: str, key: str, offset: int, count: int) -> Read[list[tuple[bytes, int]]]:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, got {offset!r}")
    positive_int("count", count)

    def build(now: int) -> list[tuple[Any, ...]]:
        return [("ZRANGE", key, offset, offset + count - 1, "WITHSCORES")]

    def parse(now: int, replies: list[Any]) -> list[tuple[bytes, int]]:
        return [(m, int(s)) for m, s in _pairs(replies[0])]

    return Read(key, build, parse)


ACTIVE_FIELDS = ("claimed_at", "enqueued_at", "attempts", "tries", "stalled", "cancel_requested")


def active_page(queue: str, offset: int, count: int) -> Read[list[tuple[bytes, int]]]:
    """The ids and lease deadlines of one page of the active set, soonest deadline first."""
    return _page(queue, keys_of(queue).active, offset, count)


def active_rows(queue: str, page: list[tuple[bytes, int]]) -> Read[list[ActiveJob]]:
    """The rows of a page of active ids; ids that left the active set meanwhile are left out."""
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = []
        for wid, _ in page:
            commands.append(("ZSCORE", keys.active, wid))
            commands.append(("HMGET", keys.job(wid), *ACTIVE_FIELDS))
        return commands

    def parse(now: int, replies: list[Any]) -> list[ActiveJob]:
        jobs = []
        for i, (wid, _) in enumerate(page):
            score, values = replies[2 * i], replies[2 * i + 1]
            if score is None:
                continue
            claimed, enqueued, attempts, tries, stalled, cancel = values
            deadline = int(float(score))
            jobs.append(
                ActiveJob(
                    id=text(wid),
                    lease_deadline=deadline,
                    lease_left_ms=deadline - now,
                    claimed_at=_int(claimed),
                    enqueued_at=_int(enqueued),
                    attempts=_count(attempts),
                    tries=_count(tries if tries is not None else attempts),
                    stalled=_count(stalled),
                    cancel_requested=cancel is not None,
                    cancel_reason=(text(cancel) or None) if cancel is not None else None,
                )
            )
        return jobs

    return Read(keys.active, build, parse)


PENDING_FIELDS = ("enqueued_at", "claimed_at", "attempts", "tries", "retries", "cancel_requested")


def pending_page(queue: str, offset: int, count: int) -> Read[list[tuple[bytes, int]]]:
    """The ids and due times of one page of the pending set, in claim order."""
    return _page(queue, keys_of(queue).pending, offset, count)


def pending_rows(queue: str, page: list[tuple[bytes, int]]) -> Read[list[PendingJob]]:
    """The rows of a page of pending ids; ids claimed or cancelled meanwhile are left out."""
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = []
        for wid, _ in page:
            commands.append(("ZSCORE", keys.pending, wid))
            commands.append(("HMGET", keys.job(wid), *PENDING_FIELDS))
        return commands

    def parse(now: int, replies: list[Any]) -> list[PendingJob]:
        jobs = []
        for i, (wid, _) in enumerate(page):
            score, values = replies[2 * i], replies[2 * i + 1]
            if score is None:
                continue
            enqueued, claimed, attempts, tries, retries, cancel = values
            due = int(float(score))
            since = due if due > 0 else (_int(claimed) or _int(enqueued) or now)
            jobs.append(
                PendingJob(
                    id=text(wid),
                    due_at=due,
                    delayed=due > now,
                    waiting_ms=max(0, now - since),
                    enqueued_at=_int(enqueued),
                    claimed_at=_int(claimed),
                    attempts=_count(attempts),
                    tries=_count(tries if tries is not None else attempts),
                    retries=_count(retries),
                    cancel_requested=cancel is not None,
                )
            )
        return jobs

    return Read(keys.pending, build, parse)


QUEUE_SETS = ("pending", "active", "dead")
QUEUES_PATTERN = "emq:{*}:*"


def scan_queues(cursor: int, count: int) -> tuple[Any, ...]:
    """One SCAN step over the sorted sets that look like a queue's (``emq:{Q}:pending|active|dead``)."""
    return ("SCAN", cursor, "MATCH", QUEUES_PATTERN, "COUNT", count, "TYPE", "zset")


def queue_of_key(key: bytes | str) -> str | None:
    """The queue a key found by ``scan_queues`` belongs to, or None when it is not a queue's set."""
    name = text(key)
    if not name.startswith("emq:{"):
        return None
    queue, sep, rest = name[len("emq:{") :].partition("}:")
    if not sep or rest not in QUEUE_SETS or not queue or "{" in queue or "}" in queue:
        return None
    return queue
