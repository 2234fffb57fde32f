"""The read views: a job, a queue's counts and counters, the queues.

Each is a ``Read``: the keyed commands to send in one MULTI/EXEC (one slot,
so a cluster node serves it whole), built from the server's clock read just
before, and how to read their replies.  Pages of a queue's keys (waiting,
active, dead jobs) are in ``pages.py``.

A queue's keys (docs/reference/keyspace.md): its claimable jobs wait in
lanes -- ``pending`` (a list: priority 0, with tombstones of cancelled jobs
counted in ``meta``'s ``stale``) and ``priority`` (a sorted set: every other
level) -- and jobs not due yet in ``delayed``.  A row keeps a value longer
than 64 bytes (up to 1 KiB) in pieces: ``payload``, ``payload:1``, ...
(``joined`` puts them together).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

from .calls import JobId, T, keys_of, text, wire

PIECE_BYTES, MAX_PIECES = 64, 16
"""A value of 65 to 1024 bytes is stored in pieces of 64 bytes (module/emq_row.h)."""

SEQ_LIMIT = 2**42
"""<base>priority's scores are (level + 1024) * 2**42 + seq (module/emq_core.h)."""


def piece_fields(name: str) -> tuple[str, ...]:
    """The fields a pieced value may take: ``name``, ``name:1``, ... ``name:15``."""
    return (name, *(f"{name}:{i}" for i in range(1, MAX_PIECES)))


def joined(values: Sequence[Any]) -> bytes | None:
    """A value from its fields (``piece_fields`` order, as HMGET answers): None when absent.

    Only a head of exactly 64 bytes has pieces; the pieces run until one is
    missing (or is longer than a piece: not one of ours), as the module reads them.
    """
    head = values[0] if values else None
    if head is None:
        return None
    if len(head) != PIECE_BYTES:
        return _opt_bytes(head)
    parts = [head]
    for piece in values[1:]:
        if piece is None or len(piece) > PIECE_BYTES:
            break
        parts.append(piece)
    return b"".join(_opt_bytes(p) or b"" for p in parts)


def joined_size(lengths: Sequence[Any]) -> int:
    """A value's size from its fields' HSTRLENs (0: absent), as ``joined`` would count it."""
    sizes = [int(n) for n in lengths]
    if not sizes or sizes[0] != PIECE_BYTES:
        return sizes[0] if sizes else 0
    total = sizes[0]
    for n in sizes[1:]:
        if n == 0 or n > PIECE_BYTES:
            break
        total += n
    return total


def priority_level(score: float) -> int:
    """The level of a member of <base>priority, from its score."""
    return int(score) // SEQ_LIMIT - 1024


def level_floor(level: int) -> int:
    """The lowest score of a level in <base>priority."""
    return (level + 1024) * SEQ_LIMIT


@dataclass(frozen=True)
class JobInfo:
    """One job as its row and the queue's keys said at one instant (``server_time``, ms).

    Times are server ms.  ``lease_deadline``/``lease_left_ms`` while the job
    is active (negative time left: the lease lapsed and a sweep will take
    it); ``due_at`` while it waits to be due (a delayed job); ``dead_at``
    while it is in the dead set; ``expires_at`` when the row has a retention
    expiry.  ``payload`` only when asked for (``payload_size`` always).
    ``priority`` is the job's level (smaller runs first; 0 the default);
    ``result`` what COMPLETE stored (``client.complete(..., result=)``),
    ``progress`` the last progress a checkpoint stored (anyone may read it;
    ``checkpoint_size`` is the resume state's, which only the job reads
    back), ``traceback`` the last failure's (``client.fail(...,
    traceback=)``).  Fields that are absent or not integers read as None (0
    for the counters).
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
    priority: int = 0
    result: bytes | None = None
    progress: bytes | None = None
    traceback: str | None = None


@dataclass(frozen=True)
class QueueCounts:
    """A queue's numbers at one instant (``server_time``, ms).

    ``pending`` is claimable now, ``delayed`` waits for a later time;
    ``lapsed`` of the ``active`` are past their lease (a sweep takes them);
    ``failed`` is the dead-lettered metric (every death ever, not the dead
    set's size).  ``by_priority`` splits ``pending`` by level (smaller runs
    first; 0 is the default), the levels that have jobs, at most
    ``MAX_LEVELS_SHOWN`` of them; due jobs not yet moved to their lane
    (``delayed``'s due members) are counted in ``pending``, not there.
    ``stale`` counts the tombstones of cancelled jobs still in the default
    lane (claims drop them).
    """

    pending: int
    delayed: int
    active: int
    lapsed: int
    dead: int
    paused: bool
    failed: int
    server_time: int
    by_priority: dict[int, int] = field(default_factory=dict)
    stale: int = 0


MAX_LEVELS_SHOWN = 100
"""The most levels ``QueueCounts.by_priority`` lists (one more read each, ``SNAPSHOT_TRIES``)."""


@dataclass(frozen=True)
class DeadJob:
    """A job in the dead set: when it died (server ms), why (its traceback too), and its counters."""

    id: str
    died_at: int
    last_error: str | None
    attempts: int
    tries: int
    retries: int
    stalled: int
    traceback: str | None = None


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


def _opt_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return value if isinstance(value, bytes) else text(value).encode("utf-8", "surrogateescape")


def _score(value: Any) -> int | None:
    return None if value is None else int(float(value))


JOB_FIELDS = (
    "state", "attempts", "tries", "retries", "stalled", "last_error", "cancel_requested",
    "enqueued_at", "claimed_at", "finished_at", "checkpoint_at", "checkpoint_attempt",
    "priority", "traceback", "progress",
)  # fmt: skip


def job_info(queue: str, job_id: JobId, with_payload: bool = False) -> Read[JobInfo | None]:
    keys, wid = keys_of(queue), wire(job_id)
    row = keys.job(wid)
    payload_fields, result_fields = piece_fields("payload"), piece_fields("result")

    def build(now: int) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = [
            ("EXISTS", row),
            ("HMGET", row, *JOB_FIELDS),
            ("HMGET", row, *result_fields),
            ("HEXISTS", row, "checkpoint"),
            ("HSTRLEN", row, "checkpoint"),
            ("ZSCORE", keys.active, wid),
            ("ZSCORE", keys.delayed, wid),
            ("ZSCORE", keys.dead, wid),
            ("PTTL", row),
        ]
        if with_payload:
            commands.append(("HMGET", row, *payload_fields))
        else:
            commands += [("HSTRLEN", row, f) for f in payload_fields]
        return commands

    def parse(now: int, replies: list[Any]) -> JobInfo | None:
        exists, values, result, has_checkpoint, checkpoint_size, active, delayed, dead, pttl = replies[:9]
        if not exists:
            return None
        v = dict(zip(JOB_FIELDS, values, strict=True))
        payload = joined(replies[9]) if with_payload else None
        size = len(payload or b"") if with_payload else joined_size(replies[9:])
        deadline = _score(active)
        due = _score(delayed)
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
            due_at=due if due is not None and due > now else None,
            dead_at=_score(dead),
            expires_at=now + int(pttl) if int(pttl) >= 0 else None,
            payload_size=size,
            payload=(payload or b"") if with_payload else None,
            checkpoint_size=int(checkpoint_size) if has_checkpoint else None,
            checkpoint_at=_int(v["checkpoint_at"]),
            checkpoint_attempt=_int(v["checkpoint_attempt"]),
            server_time=now,
            priority=_count(v["priority"]),
            result=joined(result),
            progress=_opt_bytes(v["progress"]),
            traceback=_opt_text(v["traceback"]),
        )

    return Read(keys.pending, build, parse)


@dataclass(frozen=True)
class CountsHint:
    """What one ``counts`` read learned of the queue's shape: the groups that may have a job
    waiting and the chain of priority levels from the lowest.  The next read counts their lanes
    and levels inside its one MULTI and checks, against the same snapshot, that nothing is left
    out (``counts`` answers this hint when something was)."""

    groups: tuple[bytes, ...] = ()
    levels: tuple[int, ...] = ()


SNAPSHOT_TRIES = MAX_LEVELS_SHOWN + 32
"""The most reads ``client.counts`` and ``client.groups`` make before they give up: a read repeats
only when the snapshot found a group or a priority level the read before did not know of, so
``by_priority``'s levels take one read each and each group that appears between two reads one
more."""


def counts(queue: str, hint: CountsHint = CountsHint()) -> Read[QueueCounts | CountsHint]:
    """The counts of one snapshot, or, when the snapshot holds a group or a level ``hint`` does not
    name, the hint to read again with.

    One MULTI reads the queue's lists and sets, the index and the ring of its groups (their
    names), the lane of every group ``hint`` names, and for every level of ``hint`` its count
    and the level after it: the counts are of that one instant when the names cover every
    group of the snapshot and the levels are the chain from the lowest (issue 45: no enqueue,
    claim or release between two reads can make the totals disagree)."""
    keys = keys_of(queue)
    base = keys.base.encode()
    ring, index = keys.base + "groups", keys.base + "groupset"

    def build(now: int) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = [
            ("LLEN", keys.pending),
            ("HGET", keys.meta, "stale"),
            ("ZCARD", keys.priority),
            ("ZCARD", keys.delayed),
            ("ZCOUNT", keys.delayed, "-inf", now),
            ("ZCARD", keys.active),
            ("ZCOUNT", keys.active, "-inf", f"({now}"),
            ("ZCARD", keys.dead),
            ("HEXISTS", keys.meta, "paused"),
            ("HGET", keys.metrics_failed, "count"),
            ("TYPE", ring),
            ("LRANGE", ring, 0, -1),
            ("TYPE", index),
            ("ZRANGE", index, 0, -1),
            _lowest(keys.priority, "-inf"),
        ]
        commands += [("ZCARD", base + b"g:" + g) for g in hint.groups]
        for level in hint.levels:
            floor, ceiling = level_floor(level), level_floor(level + 1)
            commands.append(("ZCOUNT", keys.priority, floor, f"({ceiling}"))
            commands.append(_lowest(keys.priority, ceiling))
        return commands

    def parse(now: int, replies: list[Any]) -> QueueCounts | CountsHint:
        entries, stale, prioritised, delayed, due, active, lapsed, dead, paused, failed = replies[:10]
        names = _group_names(*replies[10:14])
        lanes = dict(zip(hint.groups, (int(n) for n in replies[15 : 15 + len(hint.groups)]), strict=True))
        steps = replies[15 + len(hint.groups) :]
        known = {lv: (int(steps[2 * i]), _first_level(steps[2 * i + 1])) for i, lv in enumerate(hint.levels)}
        tombstones = min(_count(stale), int(entries))
        in_list = int(entries) - tombstones
        chain: list[int] = []
        level, closed = _first_level(replies[14]), True
        while level is not None and len(chain) < MAX_LEVELS_SHOWN - (1 if in_list else 0):
            chain.append(level)
            if level not in known:
                closed = False
                break
            level = known[level][1]
        if not closed or not set(names) <= set(hint.groups):
            return CountsHint(tuple(sorted(set(hint.groups) | set(names))), tuple(chain))
        by_priority = {0: in_list} if in_list else {}
        by_priority.update((level, known[level][0]) for level in chain)
        return QueueCounts(
            pending=in_list + int(prioritised) + int(due) + sum(lanes[g] for g in names),
            delayed=int(delayed) - int(due),
            active=int(active),
            lapsed=int(lapsed),
            dead=int(dead),
            paused=bool(paused),
            failed=_count(failed),
            server_time=now,
            by_priority=dict(sorted(by_priority.items())),
            stale=tombstones,
        )

    return Read(keys.pending, build, parse)


def group_names_commands(queue: str) -> list[tuple[Any, ...]]:
    """The four reads ``_group_names`` parses: the ring ``<base>groups`` and the index
    ``<base>groupset``, each with its type."""
    keys = keys_of(queue)
    ring, index = keys.base + "groups", keys.base + "groupset"
    return [("TYPE", ring), ("LRANGE", ring, 0, -1), ("TYPE", index), ("ZRANGE", index, 0, -1)]


def _group_names(kind: Any, members: Any, index_kind: Any, names: Any) -> list[bytes]:
    """Every group that may have a job waiting, in name order: the index ``<base>groupset`` (every
    group whose hash exists, those a cap or a pause keeps out of the ring included) and the ring
    ``<base>groups`` (its empty name, the ungrouped lanes, left out) (docs/concepts/flow-control.md,
    "Groups")."""
    found = set(names) if text(index_kind) == "zset" else set()
    if text(kind) == "list":
        found |= {m for m in members if m}
    return sorted(m if isinstance(m, bytes) else str(m).encode() for m in found)


def group_names(replies: Sequence[Any]) -> list[bytes]:
    """``group_names_commands``'s four replies as the names they hold."""
    return _group_names(*replies)


def _lowest(priority: str, floor: int | str) -> tuple[Any, ...]:
    """The lowest-scored job of ``priority`` from ``floor`` up, with its score."""
    return ("ZRANGE", priority, floor, "+inf", "BYSCORE", "LIMIT", 0, 1, "WITHSCORES")


def _first_level(reply: Any) -> int | None:
    first = _pairs(reply)
    return priority_level(first[0][1]) if first else None


def _pairs(reply: Any) -> list[tuple[bytes, float]]:
    """ZRANGE ... WITHSCORES as (member, score) pairs, from RESP2's flat list or RESP3's pairs."""
    if reply and isinstance(reply[0], list | tuple):
        return [(wire(m), float(s)) for m, s in reply]
    return [(wire(reply[i]), float(reply[i + 1])) for i in range(0, len(reply), 2)]


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


QUEUE_RUN_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
)
"""Seconds: the upper bounds of the queue-level run histogram's buckets (a last one, +Inf, follows).

Stored on the server (``run_b<i>``, ``run_sum_us``), so changing them splits a queue's history."""
QUEUE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
"""Seconds: the queue-level wait histogram's bounds (``wait_b<i>``, ``wait_sum_us``)."""


def histogram_fields(name: str, bounds: tuple[float, ...]) -> tuple[str, ...]:
    """A shared histogram's fields: one count per bucket (not cumulative; the last is +Inf), the sum."""
    return (*(f"{name}_b{i}" for i in range(len(bounds) + 1)), f"{name}_sum_us")


HISTOGRAM_FIELDS = (
    *histogram_fields("run", QUEUE_RUN_BUCKETS),
    *histogram_fields("wait", QUEUE_WAIT_BUCKETS),
)
"""The fields of ``<base>metrics:counts`` that hold the queue-level run and wait histograms."""


def observation(name: str, bounds: tuple[float, ...], seconds: float) -> dict[str, int]:
    """The deltas one observation adds to a shared histogram: its bucket's count and the sum (in µs)."""
    index = next((i for i, bound in enumerate(bounds) if seconds <= bound), len(bounds))
    return {f"{name}_b{index}": 1, f"{name}_sum_us": max(0, round(seconds * 1_000_000))}


@dataclass(frozen=True)
class SharedHistogram:
    """A queue-level histogram as the server holds it: cumulative bucket counts, as Prometheus reads them."""

    buckets: list[tuple[float, int]]  # (upper bound, jobs at or under it), the last bound inf
    sum_seconds: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1] if self.buckets else 0


def shared_histograms(queue: str) -> Read[dict[str, SharedHistogram]]:
    """The queue's run and wait histograms, added to by every worker that records metrics."""
    key = counters_key(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        return [("HMGET", key, *HISTOGRAM_FIELDS)]

    def parse(now: int, replies: list[Any]) -> dict[str, SharedHistogram]:
        values = dict(zip(HISTOGRAM_FIELDS, (_count(v) for v in replies[0]), strict=True))
        out = {}
        for name, bounds in (("run", QUEUE_RUN_BUCKETS), ("wait", QUEUE_WAIT_BUCKETS)):
            total, buckets = 0, []
            for i, bound in enumerate((*bounds, float("inf"))):
                total += values[f"{name}_b{i}"]
                buckets.append((bound, total))
            out[name] = SharedHistogram(buckets, values[f"{name}_sum_us"] / 1_000_000)
        return out

    return Read(keys_of(queue).pending, build, parse)


def add_counters(queue: str, deltas: dict[str, int]) -> list[tuple[Any, ...]]:
    """The commands that add ``deltas`` (``COUNTER_FIELDS``, ``HISTOGRAM_FIELDS``) to the shared counters."""
    key = counters_key(queue)
    known = (*COUNTER_FIELDS, *HISTOGRAM_FIELDS)
    return [("HINCRBY", key, name, n) for name, n in deltas.items() if n and name in known]


QUEUE_KEYS = ("pending", "priority", "delayed", "active", "dead", "queue")
QUEUE_SCANS = (("emq:{*}:[adp]*", "zset"), ("emq:{*}:pending", "list"), ("emq:{*}:queue", "string"))
"""The passes of ``scan_queues``: a queue's sorted sets (``priority``, ``delayed``, ``active``,
``dead``: no row ``job:``, setting ``meta`` or record ``req:`` is one), then its list (``pending``),
then the registry's marker ``queue`` that the first enqueue makes and OBLITERATE deletes, so that a
queue that ever had a job is found however fast it drains."""


def scan_queues(cursor: int, count: int, scan: int = 0) -> tuple[Any, ...]:
    """One SCAN step of pass ``scan`` (``QUEUE_SCANS``) over the keys that look like a queue's."""
    pattern, kind = QUEUE_SCANS[scan]
    return ("SCAN", cursor, "MATCH", pattern, "COUNT", count, "TYPE", kind)


def queue_of_key(key: bytes | str) -> str | None:
    """The queue a key found by ``scan_queues`` belongs to, or None when it is not a queue's lane or set."""
    name = text(key)
    if not name.startswith("emq:{"):
        return None
    queue, sep, rest = name[len("emq:{") :].partition("}:")
    if not sep or rest not in QUEUE_KEYS or not queue or "{" in queue or "}" in queue:
        return None
    return queue
