"""Pages of a queue's keys: the jobs waiting (in claim order), active (soonest lease first), dead.

Each page is two ``Read``s (``views.py``): the ids of the page, then their
rows -- read apart, so a job that moved meanwhile is left out.  The waiting
jobs' order is the claims' (module/emq_lanes.h): the levels below 0 of
``priority``, then ``pending`` (tombstones left out: a page may hold fewer
jobs than asked for), then the levels above 0, then each group's lane
``<base>g:<g>`` (groups in name order, each in its claim order: a claim
takes them round-robin across groups, issue 45), then ``delayed`` by due
time; a ``PendingLayout`` (one more read, two with groups) says where each
part begins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .calls import keys_of, positive_int, text
from .views import (
    DeadJob,
    Read,
    _count,
    _int,
    _opt_text,
    _pairs,
    group_names,
    group_names_commands,
    level_floor,
    priority_level,
)

Lane = Literal["priority", "pending", "group", "delayed"]


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
    ``group`` is its group (None: ungrouped); a grouped job waits in its
    group's lane, listed after the ungrouped ones.  ``waiting_ms`` is how
    long it has been claimable: now minus its last claim (a job given back,
    retried or recovered) or its enqueue time, 0 while delayed.
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
    group: str | None = None


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
    above 0, each group's lane, ``delayed``) -- their sizes, tombstones included.  ``names``: the
    groups the read found (``groups`` holds the lane sizes of those it was asked for)."""

    before: int
    entries: int
    after: int
    delayed: int
    groups: tuple[tuple[bytes, int], ...] = ()
    names: tuple[bytes, ...] = ()


def pending_layout(queue: str, names: tuple[bytes, ...] = ()) -> Read[PendingLayout]:
    """The sizes of the waiting jobs' parts, and the lanes of the groups ``names`` (the ``names``
    of a layout read before: the queue's groups)."""
    keys = keys_of(queue)
    base = keys.base.encode()

    def build(now: int) -> list[tuple[Any, ...]]:
        return [
            ("ZCOUNT", keys.priority, "-inf", f"({level_floor(0)}"),
            ("LLEN", keys.pending),
            ("ZCARD", keys.priority),
            ("ZCARD", keys.delayed),
            *group_names_commands(queue),
            *(("ZCARD", base + b"g:" + g) for g in names),
        ]

    def parse(now: int, replies: list[Any]) -> PendingLayout:
        before, entries, prioritised, delayed = (int(r) for r in replies[:4])
        lanes = tuple((g, int(n)) for g, n in zip(names, replies[8:], strict=True))
        found = tuple(group_names(replies[4:8]))
        return PendingLayout(before, entries, prioritised - before, delayed, lanes, found)

    return Read(keys.pending, build, parse)


PageEntry = tuple[bytes, Lane, float | None, bytes | None]
"""One waiting job of a page: its id, its lane, its score there (None in ``pending``) and, in a
group's lane, the group."""


def pending_page(queue: str, offset: int, count: int, layout: PendingLayout) -> Read[list[PageEntry]]:
    """The ids of one page of the waiting jobs, in claim order (``layout``: ``pending_layout``'s)."""
    _offset(offset)
    positive_int("count", count)
    keys = keys_of(queue)
    base = keys.base.encode()
    # (key, its first position in the claim order, its size, how it is read, its group, where the
    # part starts within the key)
    ungrouped = layout.before + layout.entries + layout.after
    parts: list[tuple[str | bytes, int, int, Lane, bytes | None, int]] = [
        (keys.priority, 0, layout.before, "priority", None, 0),
        (keys.pending, layout.before, layout.entries, "pending", None, 0),
        (keys.priority, layout.before + layout.entries, layout.after, "priority", None, layout.before),
    ]
    first = ungrouped
    for g, size in layout.groups:
        parts.append((base + b"g:" + g, first, size, "group", g, 0))
        first += size
    parts.append((keys.delayed, first, layout.delayed, "delayed", None, 0))
    ranges: list[tuple[str | bytes, Lane, int, int, bytes | None]] = []  # key, lane, start, stop, group
    for key, start, size, lane, group, shift in parts:
        lo, hi = max(offset, start), min(offset + count, start + size)
        if lo >= hi:
            continue
        ranges.append((key, lane, lo - start + shift, hi - start + shift - 1, group))

    def build(now: int) -> list[tuple[Any, ...]]:
        return [
            ("LRANGE", key, start, stop) if lane == "pending" else ("ZRANGE", key, start, stop, "WITHSCORES")
            for key, lane, start, stop, _ in ranges
        ]

    def parse(now: int, replies: list[Any]) -> list[PageEntry]:
        page: list[PageEntry] = []
        for (_, lane, _, _, group), reply in zip(ranges, replies, strict=True):
            if lane == "pending":
                page += [(bytes(m), lane, None, None) for m in reply]
            else:
                page += [(m, lane, s, group) for m, s in _pairs(reply)]
        return page

    return Read(keys.pending, build, parse)


PENDING_FIELDS = ("enqueued_at", "claimed_at", "attempts", "tries", "retries", "cancel_requested", "state",
                  "priority", "group")  # fmt: skip


def pending_rows(queue: str, page: list[PageEntry]) -> Read[list[PendingJob]]:
    """The rows of a page of waiting ids; jobs claimed or cancelled since, and tombstones, are left out."""
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = []
        for wid, lane, _, group in page:
            # in <pending>: its entry is a job's while the job waits there (not delayed, no level)
            if lane == "group" and group is not None:
                commands.append(("ZSCORE", keys.base.encode() + b"g:" + group, wid))
            else:
                commands.append(("ZSCORE", keys.delayed if lane == "pending" else getattr(keys, lane), wid))
            commands.append(("HMGET", keys.job(wid), *PENDING_FIELDS))
        return commands

    def parse(now: int, replies: list[Any]) -> list[PendingJob]:
        jobs, seen = [], set()
        for i, (wid, lane, _, _) in enumerate(page):
            score, values = replies[2 * i], replies[2 * i + 1]
            enqueued, claimed, attempts, tries, retries, cancel, state, level, group = values
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
                    priority=priority_level(float(score)) if lane in ("priority", "group") else _count(level),
                    group=_opt_text(group),
                )
            )
        return jobs

    return Read(keys.pending, build, parse)
