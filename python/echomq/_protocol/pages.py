"""Pages of a queue's keys: the jobs waiting (in claim order), active (soonest lease first), dead.

Each page is two ``Read``s (``views.py``): the ids of the page, then their
rows -- read apart, so a job that moved meanwhile is left out.  The waiting
jobs' order is the claims' (module/emq_lanes.h): the levels below 0 of
``priority``, then ``pending`` (tombstones left out: a page may hold fewer
jobs than asked for), then the levels above 0, then ``delayed`` by due time;
a ``PendingLayout`` (one more read) says where each part begins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .calls import keys_of, positive_int, text
from .views import DeadJob, Read, _count, _int, _opt_text, _pairs, level_floor, priority_level

Lane = Literal["priority", "pending", "delayed"]


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
    """A waiting job, in claim order: its level, when it is due, and its counters.

    ``priority`` is its level (smaller runs first; 0 the default).
    ``due_at`` is a delayed job's due time (server ms), and 0 for a job
    claimable now; ``delayed`` is True while ``due_at`` is in the future.
    ``waiting_ms`` is how long it has been claimable: now minus its last
    claim (a job given back, retried or recovered) or its enqueue time, 0
    while delayed.
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
    priority: int = 0


def _offset(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"offset must be an int >= 0, got {value!r}")
    return value


DEAD_FIELDS = ("last_error", "attempts", "tries", "retries", "stalled", "traceback")


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
            last_error, attempts, tries, retries, stalled, traceback = values
            jobs.append(
                DeadJob(
                    id=text(page[i][0]),
                    died_at=int(float(score)),
                    last_error=_opt_text(last_error),
                    attempts=_count(attempts),
                    tries=_count(tries if tries is not None else attempts),
                    retries=_count(retries),
                    stalled=_count(stalled),
                    traceback=_opt_text(traceback),
                )
            )
        return jobs

    return Read(keys.dead, build, parse)


def _page(queue: str, key: str, offset: int, count: int) -> Read[list[tuple[bytes, int]]]:
    _offset(offset)
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


@dataclass(frozen=True)
class PendingLayout:
    """Where each part of the waiting jobs begins: (levels below 0, ``pending``'s entries, the levels
    above 0, ``delayed``) -- their sizes, tombstones included."""

    before: int
    entries: int
    after: int
    delayed: int


def pending_layout(queue: str) -> Read[PendingLayout]:
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        return [
            ("ZCOUNT", keys.priority, "-inf", f"({level_floor(0)}"),
            ("LLEN", keys.pending),
            ("ZCARD", keys.priority),
            ("ZCARD", keys.delayed),
        ]

    def parse(now: int, replies: list[Any]) -> PendingLayout:
        before, entries, prioritised, delayed = (int(r) for r in replies)
        return PendingLayout(before, entries, prioritised - before, delayed)

    return Read(keys.pending, build, parse)


PageEntry = tuple[bytes, Lane, float | None]
"""One waiting job of a page: its id, its lane, and its score there (None in ``pending``)."""


def pending_page(queue: str, offset: int, count: int, layout: PendingLayout) -> Read[list[PageEntry]]:
    """The ids of one page of the waiting jobs, in claim order (``layout``: ``pending_layout``'s)."""
    _offset(offset)
    positive_int("count", count)
    keys = keys_of(queue)
    # (key, its first position in the claim order, its size, how it is read)
    parts: list[tuple[str, int, int, Lane]] = [
        (keys.priority, 0, layout.before, "priority"),
        (keys.pending, layout.before, layout.entries, "pending"),
        (keys.priority, layout.before + layout.entries, layout.after, "priority"),
        (keys.delayed, layout.before + layout.entries + layout.after, layout.delayed, "delayed"),
    ]
    ranges: list[tuple[str, Lane, int, int]] = []  # key, lane, start, stop within the key
    for i, (key, first, size, lane) in enumerate(parts):
        lo, hi = max(offset, first), min(offset + count, first + size)
        if lo >= hi:
            continue
        shift = layout.before if i == 2 else 0  # the upper levels start after the lower ones in the set
        ranges.append((key, lane, lo - first + shift, hi - first + shift - 1))

    def build(now: int) -> list[tuple[Any, ...]]:
        return [
            ("LRANGE", key, start, stop) if lane == "pending" else ("ZRANGE", key, start, stop, "WITHSCORES")
            for key, lane, start, stop in ranges
        ]

    def parse(now: int, replies: list[Any]) -> list[PageEntry]:
        page: list[PageEntry] = []
        for (_, lane, _, _), reply in zip(ranges, replies, strict=True):
            if lane == "pending":
                page += [(bytes(m), lane, None) for m in reply]
            else:
                page += [(m, lane, s) for m, s in _pairs(reply)]
        return page

    return Read(keys.pending, build, parse)


PENDING_FIELDS = ("enqueued_at", "claimed_at", "attempts", "tries", "retries", "cancel_requested", "state",
                  "priority")  # fmt: skip


def pending_rows(queue: str, page: list[PageEntry]) -> Read[list[PendingJob]]:
    """The rows of a page of waiting ids; jobs claimed or cancelled since, and tombstones, are left out."""
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = []
        for wid, lane, _ in page:
            # in <pending>: its entry is a job's while the job waits there (not delayed, no level)
            commands.append(("ZSCORE", keys.delayed if lane == "pending" else getattr(keys, lane), wid))
            commands.append(("HMGET", keys.job(wid), *PENDING_FIELDS))
        return commands

    def parse(now: int, replies: list[Any]) -> list[PendingJob]:
        jobs, seen = [], set()
        for i, (wid, lane, _) in enumerate(page):
            score, values = replies[2 * i], replies[2 * i + 1]
            enqueued, claimed, attempts, tries, retries, cancel, state, level = values
            if lane == "pending":
                live = score is None and state == b"pending" and level is None and wid not in seen
                if not live:
                    continue
                seen.add(wid)
            elif score is None:
                continue
            due = int(float(score)) if lane == "delayed" else 0
            since = due if due > 0 else (_int(claimed) or _int(enqueued) or now)
            jobs.append(
                PendingJob(
                    id=text(wid),
                    due_at=due,
                    delayed=due > now,
                    waiting_ms=0 if due > now else max(0, now - since),
                    enqueued_at=_int(enqueued),
                    claimed_at=_int(claimed),
                    attempts=_count(attempts),
                    tries=_count(tries if tries is not None else attempts),
                    retries=_count(retries),
                    cancel_requested=cancel is not None,
                    priority=priority_level(float(score)) if lane == "priority" else _count(level),
                )
            )
        return jobs

    return Read(keys.pending, build, parse)
