"""Schedules (issue 31): a job enqueued on every tick of a cron expression or a fixed period.

The rules, without I/O; ``_sync/_schedules.py`` (threads) and
``asyncio/_schedules.py`` drive them.  A schedule lives in its queue's slot:

- ``<base>schedule:<name>``, a hash: the definition (``cron`` or ``every_ms``,
  ``tz``, ``payload``, ``start_at``, ``end_at``, ``missed``), the cursor
  ``last`` (the latest tick consumed, fired or skipped: epoch ms), ``fired``
  (jobs enqueued so far) and ``ticks`` (the next ticks, precomputed here so
  that nothing on the server needs a cron parser);
- ``<base>schedules``, a sorted set: each schedule's name scored with its
  next tick (``+inf`` once it has none left).

Any process may drive a queue's schedules (every worker's sweep and every
``Reaper`` do): it reads the due names, and for each one runs a transaction
that WATCHes the row, reads the cursor, and in one MULTI/EXEC enqueues the
ticks' jobs and advances the cursor.  Two drivers of one tick: the second
one's EXEC is refused (the row changed), it reads the row again and finds
the tick consumed.  The tick's job id is ``<name>@<tick ms>``; the cursor,
not the id, is what stops a second run once that job has ended and its row
expired.  A restart (AOF) or a failover replays or loses the EXEC whole, job
and cursor together: a tick is never fired twice, and one lost with the
write is fired again by the next driver.

Cron parsing is cronsim's (a small, dependency-free, BSD-licensed parser
with Debian cron's DST behaviour, iterating zoneinfo-aware datetimes).
"""

from __future__ import annotations

import logging
import re
import zoneinfo
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, get_args

from cronsim import CronSim, CronSimError
from redis.exceptions import ResponseError

from ._protocol import Call, Enqueued, enqueue, keys_of
from ._protocol.calls import missing_code
from .errors import BadSchedule

log = logging.getLogger("echomq.schedules")

__all__ = [
    "MISSED_CEILING",
    "ON_TIME_MS",
    "DriveResult",
    "Firing",
    "Missed",
    "Schedule",
    "ScheduleInfo",
    "define",
    "job_id",
    "plan",
]

Missed = Literal["skip", "one", "all"]
MISSED_CHOICES: tuple[str, ...] = get_args(Missed)

ON_TIME_MS = 60_000
"""A tick fired later than this after its time is missed (as is one whose next tick came first)."""
MISSED_CEILING = 1_000
"""``missed="all"``: at most this many ticks are fired by one drive (the latest); older ones are dropped."""
MAX_SCHEDULES = 1_000
"""The most schedules one queue holds: ``schedule()`` refuses one more."""
DRIVE_BATCH = 100
"""The most due schedules one drive of a queue fires (the rest: the next drive)."""
STORED_TICKS = 8
"""How many upcoming ticks the row keeps precomputed (``ticks``)."""
MAX_PAYLOAD_BYTES = 1 << 20
"""The payload's ceiling (the module's default ``emq.max-payload-bytes``)."""
MAX_EVERY_MS = 366 * 86_400_000
"""``every_ms`` at most a year (and at least 1)."""
MAX_SCAN = 100_000
"""Cron iterations one plan may take before it jumps (a long downtime of a per-second cron)."""
WATCH_TRIES = 16
"""How often a driver reads a row again after another driver changed it under its WATCH."""
RECHECK_S = 5.0
"""A worker's schedule driver reads the queue's next tick at least this often (a lost change message)."""
RECHECK_UNTOLD_S = 1.0
"""As ``RECHECK_S``, for a driver that hears no change messages (a worker without its cancel listener)."""
RETRY_S = 1.0
"""A driver whose drive failed, or left a tick due (a row it could not read), tries again this much later."""

_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_UTC = timezone.utc


def schedules_key(queue: str) -> str:
    """The sorted set of a queue's schedules (name, scored with its next tick)."""
    return keys_of(queue).base + "schedules"


def schedule_key(queue: str, name: str) -> str:
    """One schedule's row."""
    return keys_of(queue).base + "schedule:" + name


def changes_channel(queue: str) -> str:
    """The channel a schedule's add, replace or removal is published on (its name): the workers'
    drivers, woken by it, read the queue's next tick again (``<base>schedules``, a channel)."""
    return keys_of(queue).base + "schedules"


def wait_s(next_ms: int | None, now_ms: int, recheck_s: float = RECHECK_S) -> float:
    """How long a driver sleeps before the queue's next tick ``next_ms`` (None: none), read at the
    server's ``now_ms``: until the tick, at most ``recheck_s``; 0.0 when it is due."""
    if next_ms is None:
        return recheck_s
    return min(recheck_s, max(0.0, (next_ms - now_ms) / 1000))


def job_id(name: str, tick_ms: int) -> str:
    """The id of the job a tick enqueues: the schedule's name and the tick's time (epoch ms)."""
    return f"{name}@{tick_ms}"


def _opt_ms(what: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise BadSchedule(f"{what} must be an aware datetime (with a tzinfo) or epoch ms")
        return int(value.timestamp() * 1000)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
        raise BadSchedule(
            f"{what} must be epoch ms (an int from 0 to 2**53) or an aware datetime, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class Schedule:
    """A schedule's definition: when its ticks come and what each tick's job carries."""

    name: str
    cron: str | None
    every_ms: int | None
    payload: bytes
    tz: str = "UTC"
    start_at: int | None = None
    """Epoch ms: no tick before it."""
    end_at: int | None = None
    """Epoch ms: no tick after it."""
    missed: Missed = "skip"

    def _zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.tz)

    def ticks_after(self, after_ms: int, count: int) -> list[int]:
        """The next ``count`` ticks strictly after ``after_ms`` (fewer once ``end_at`` comes)."""
        out: list[int] = []
        for tick in self.iter_ticks(after_ms):
            if len(out) >= count:
                break
            out.append(tick)
        return out

    def iter_ticks(self, after_ms: int) -> Iterator[int]:
        """Ticks after ``after_ms`` in order, within ``start_at``..``end_at``."""
        if self.start_at is not None and after_ms < self.start_at - 1:
            after_ms = self.start_at - 1
        if self.every_ms is not None:
            anchor = self.start_at or 0
            tick = anchor + ((after_ms - anchor) // self.every_ms + 1) * self.every_ms
            while self.end_at is None or tick <= self.end_at:
                yield tick
                tick += self.every_ms
            return
        assert self.cron is not None
        # cronsim works in whole seconds and yields times strictly after its start.
        start = datetime.fromtimestamp(after_ms // 1000, _UTC).astimezone(self._zone())
        previous = after_ms
        try:
            for moment in CronSim(self.cron, start):
                tick = int(moment.timestamp()) * 1000
                if tick <= previous:  # wall time again (a repeated hour): ticks only move forward
                    continue
                if self.end_at is not None and tick > self.end_at:
                    return
                previous = tick
                yield tick
        except CronSimError:
            return

    def latest_ticks(self, now_ms: int, count: int) -> list[int]:
        """Up to ``count`` ticks at or before ``now_ms``, oldest first (walking back: for long gaps)."""
        assert self.cron is not None
        moment = datetime.fromtimestamp(now_ms // 1000 + 1, _UTC).astimezone(self._zone())
        out: list[int] = []
        try:
            for back in CronSim(self.cron, moment, reverse=True):
                tick = int(back.timestamp()) * 1000
                if len(out) >= count or (self.start_at is not None and tick < self.start_at):
                    break
                if tick <= now_ms and (self.end_at is None or tick <= self.end_at) and tick not in out:
                    out.append(tick)
        except (CronSimError, StopIteration):
            pass
        return sorted(out)

    def fields(self) -> dict[str, bytes]:
        """The definition as the row's fields."""
        out: dict[str, bytes] = {
            "tz": self.tz.encode(),
            "payload": self.payload,
            "missed": self.missed.encode(),
        }
        if self.cron is not None:
            out["cron"] = self.cron.encode()
        if self.every_ms is not None:
            out["every_ms"] = str(self.every_ms).encode()
        if self.start_at is not None:
            out["start_at"] = str(self.start_at).encode()
        if self.end_at is not None:
            out["end_at"] = str(self.end_at).encode()
        return out


DEFINITION_FIELDS = ("cron", "every_ms", "tz", "payload", "start_at", "end_at", "missed")


def define(
    name: str,
    *,
    cron: str | None = None,
    every_ms: int | None = None,
    payload: bytes | str = b"",
    tz: str = "UTC",
    start_at: int | datetime | None = None,
    end_at: int | datetime | None = None,
    missed: str = "skip",
) -> Schedule:
    """Check a definition; ``BadSchedule`` (a ``ValueError``) names what is wrong, before anything is sent."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadSchedule(f"schedule name must be 1 to 128 of A-Z a-z 0-9 _ . : - , got {name!r}")
    if (cron is None) == (every_ms is None):
        raise BadSchedule("give exactly one of cron= and every_ms=")
    if every_ms is not None and (
        isinstance(every_ms, bool) or not isinstance(every_ms, int) or not 1 <= every_ms <= MAX_EVERY_MS
    ):
        raise BadSchedule(f"every_ms must be an int from 1 to {MAX_EVERY_MS} (a year), got {every_ms!r}")
    if not isinstance(tz, str) or not tz:
        raise BadSchedule(f"tz must be an IANA time zone name such as 'Europe/Berlin', got {tz!r}")
    try:
        zone = zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:  # OSError: too long for a path
        raise BadSchedule(f"unknown time zone {tz!r}") from exc
    if cron is not None:
        if not isinstance(cron, str):
            raise BadSchedule(f"cron must be a str, got {type(cron).__name__}")
        try:
            next(CronSim(cron, datetime(2000, 1, 1, tzinfo=zone)))
        except (CronSimError, StopIteration, ValueError) as exc:
            raise BadSchedule(f"bad cron expression {cron!r}: {exc}") from exc
    if missed not in MISSED_CHOICES:
        raise BadSchedule(f"missed must be one of {', '.join(MISSED_CHOICES)}, got {missed!r}")
    if isinstance(payload, str):
        body = payload.encode()
    elif isinstance(payload, bytes):
        body = payload
    else:
        raise BadSchedule(f"payload must be bytes or str, not {type(payload).__name__}")
    if len(body) > MAX_PAYLOAD_BYTES:
        raise BadSchedule(f"payload is {len(body)} bytes, more than {MAX_PAYLOAD_BYTES}")
    start, end = _opt_ms("start_at", start_at), _opt_ms("end_at", end_at)
    if start is not None and end is not None and end < start:
        raise BadSchedule("end_at must not come before start_at")
    return Schedule(name, cron, every_ms, body, tz, start, end, missed)  # type: ignore[arg-type]


def text_of(row: dict[Any, Any], key: str) -> str | None:
    """A row's field as text (None when absent)."""
    value = row.get(key, row.get(key.encode()))
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def out_of_ticks(row: dict[Any, Any], now_ms: int) -> bool:
    """A cron schedule whose stored ticks are all due: the module's timer, which fires a cron
    only from them (it has no cron parser), waits for a client's drive to compute the next ones."""
    if text_of(row, "cron") is None:
        return False
    try:
        last = int(text_of(row, "last") or 0)
        ticks = [int(t) for t in (text_of(row, "ticks") or "").split(",") if t]
    except ValueError:
        return False  # a malformed row: the drivers say so
    ahead = [t for t in ticks if t > last]
    return bool(ahead) and ahead[-1] <= now_ms


def from_row(name: str, row: dict[Any, Any]) -> Schedule:
    """A stored definition, read back (checked again: a row edited by hand is refused, not run)."""
    every = text_of(row, "every_ms")
    start, end = text_of(row, "start_at"), text_of(row, "end_at")
    raw = row.get("payload", row.get(b"payload", b""))
    try:
        return define(
            name,
            cron=text_of(row, "cron"),
            every_ms=int(every) if every is not None else None,
            payload=raw if isinstance(raw, bytes) else str(raw).encode(),
            tz=text_of(row, "tz") or "UTC",
            start_at=int(start) if start is not None else None,
            end_at=int(end) if end is not None else None,
            missed=text_of(row, "missed") or "skip",
        )
    except ValueError as exc:
        raise BadSchedule(f"schedule {name!r} has a malformed row: {exc}") from exc


@dataclass(frozen=True)
class ScheduleInfo:
    """A stored schedule: its definition, its cursor and its next ticks (``client.schedules``)."""

    schedule: Schedule
    last_ms: int
    """The latest tick consumed (fired or skipped as missed); at first, when the schedule was added."""
    next_ms: int | None
    """The next tick, None once ``end_at`` has passed."""
    fired: int
    """Jobs this schedule enqueued."""
    upcoming: list[int] = field(default_factory=list)
    """The precomputed ticks stored with it (epoch ms)."""

    @property
    def name(self) -> str:
        return self.schedule.name


def info_of(name: str, row: dict[Any, Any]) -> ScheduleInfo:
    schedule = from_row(name, row)
    ticks = text_of(row, "ticks") or ""
    upcoming = [int(t) for t in ticks.split(",") if t]
    return ScheduleInfo(
        schedule,
        int(text_of(row, "last") or 0),
        upcoming[0] if upcoming else None,
        int(text_of(row, "fired") or 0),
        upcoming,
    )


@dataclass(frozen=True)
class Firing:
    """What one drive of one schedule does: the ticks whose jobs it enqueues, and the new cursor."""

    fire: list[int]
    """Ticks to enqueue, oldest first."""
    cursor: int
    """The new ``last``: every tick up to it is consumed."""
    upcoming: list[int]
    """The next ticks after ``cursor`` (the first is the next due time)."""
    dropped: int = 0
    """Due ticks not fired (missed under ``skip``/``one``, or beyond ``MISSED_CEILING``)."""


def due_ticks(schedule: Schedule, last_ms: int, now_ms: int) -> tuple[list[int], int]:
    """The due ticks (in ``(last_ms, now_ms]``), at most the latest ``MISSED_CEILING`` of them,
    oldest first; and how many older due ones were left out."""
    first = schedule.ticks_after(last_ms, 1)
    if not first or first[0] > now_ms:
        return [], 0
    every = schedule.every_ms
    if every is not None:  # arithmetic: a long gap is not walked
        end = now_ms if schedule.end_at is None else min(now_ms, schedule.end_at)
        total = (end - first[0]) // every + 1
        kept = min(total, MISSED_CEILING)
        newest = first[0] + (total - 1) * every
        return [newest - i * every for i in range(kept - 1, -1, -1)], total - kept
    latest: deque[int] = deque(maxlen=MISSED_CEILING)
    for seen, tick in enumerate(schedule.iter_ticks(last_ms)):
        if tick > now_ms:
            return list(latest), max(0, seen - MISSED_CEILING)
        if seen >= MAX_SCAN:
            # A long downtime of a fine-grained cron: the newest ones, found walking back from now.
            return [t for t in schedule.latest_ticks(now_ms, MISSED_CEILING) if t > last_ms], MAX_SCAN
        latest.append(tick)
    return list(latest), 0  # no tick after end_at: the due ones are all there are (at most the ceiling)


def plan(schedule: Schedule, last_ms: int, now_ms: int) -> Firing:
    """Which ticks a drive at ``now_ms`` fires, given the cursor ``last_ms``.

    A tick is *missed* when it was not fired before its next tick came due,
    or not within ``ON_TIME_MS`` of its time.  So of the due ticks at most
    the latest is on time.  ``missed`` says what happens to the rest:

    - ``skip``: none of the missed ticks runs; the latest due tick runs only if on time;
    - ``one``: only the latest due tick runs (the missed ones fold into it);
    - ``all``: every due tick runs, oldest first, at most ``MISSED_CEILING`` (the latest).

    Every due tick is consumed either way: the cursor moves to the latest.
    """
    due, older = due_ticks(schedule, last_ms, now_ms)
    if not due:
        return Firing([], last_ms, schedule.ticks_after(last_ms, STORED_TICKS))
    latest = due[-1]
    if schedule.missed == "all":
        fire = due
    elif schedule.missed == "one" or now_ms - latest <= ON_TIME_MS:
        fire = [latest]
    else:
        fire = []
    dropped = older + len(due) - len(fire)
    return Firing(fire, latest, schedule.ticks_after(latest, STORED_TICKS), dropped)


# -- what a driver reads and writes


@dataclass
class DriveResult:
    """What one drive of a queue's schedules did."""

    fired: list[str] = field(default_factory=list)
    """The ids of the jobs enqueued, in tick order per schedule."""
    dropped: int = 0
    """Due ticks consumed without a job (missed, under ``skip`` or ``one``, or beyond the ceiling)."""


def names_of(reply: Any) -> list[str]:
    return [n.decode() if isinstance(n, bytes) else str(n) for n in reply]


def call_job(call: Call[Enqueued]) -> str:
    job = call.args[3]
    return job.decode() if isinstance(job, bytes) else str(job)


def tell_failure(queue: str, call: Call[Enqueued], reply: BaseException) -> None:
    log.warning("schedule of %r: the tick's job %s was not enqueued: %s", queue, call_job(call), reply)


def tell_drive(queue: str, result: DriveResult) -> None:
    """A worker's or reaper's drive that did something, logged as their sweeps are."""
    if result.fired or result.dropped:
        log.info(
            "schedules of %r: %d jobs enqueued (%s), %d missed ticks dropped",
            queue, len(result.fired), " ".join(result.fired[:10]), result.dropped,
        )  # fmt: skip


def decide_fire(
    queue: str, name: str, row: dict[Any, Any], now_ms: int
) -> tuple[Firing, list[Call[Enqueued]], list[tuple[Any, ...]]]:
    """Read under WATCH: what the EXEC holds -- the ticks' ENQUEUEs, then the cursor's advance."""
    schedule = from_row(name, row)
    firing = plan(schedule, int(text_of(row, "last") or 0), now_ms)
    return firing, fire_calls(schedule, queue, firing), advance_commands(schedule, queue, firing)


def take_replies(
    queue: str, firing: Firing, calls: list[Call[Enqueued]], replies: list[Any], result: DriveResult
) -> list[Call[Enqueued]]:
    """Count an EXEC's ENQUEUE replies into ``result``; the calls to send again, outside it: those
    the node could not run for want of the scripts (nothing of them ran)."""
    result.dropped += firing.dropped
    again: list[Call[Enqueued]] = []
    for call, reply in zip(calls, replies, strict=False):
        if isinstance(reply, ResponseError) and missing_code(reply):
            again.append(call)
        elif isinstance(reply, ResponseError) and "exists" not in str(reply):
            tell_failure(queue, call, reply)
        else:
            result.fired.append(call_job(call))
    return again


# -- the commands a driver sends -----------------------------------------------------


def state_fields(last: int, upcoming: list[int]) -> dict[str, bytes]:
    return {"last": str(last).encode(), "ticks": ",".join(map(str, upcoming)).encode()}


TIMING_FIELDS = ("cron", "every_ms", "tz", "start_at")
"""What decides where the ticks fall: a replaced schedule whose timing changed starts after now."""


def add_commands(schedule: Schedule, queue: str, row: dict[Any, Any], now_ms: int) -> list[tuple[Any, ...]]:
    """Write (or replace) a definition.  A replaced schedule with the same timing (the app that
    defines it at every start) keeps its cursor and count: the ticks it already consumed never run
    again, and those missed meanwhile are handled by ``missed``.  One whose timing changed keeps
    its count and starts after now: the old ticks are not the new ones'."""
    key = schedule_key(queue, schedule.name)
    kept = text_of(row, "last")
    last = int(kept) if kept is not None else now_ms
    fresh = schedule.fields()
    if kept is not None and any(
        text_of(row, f) != (fresh[f].decode() if f in fresh else None) for f in TIMING_FIELDS
    ):
        last = max(last, now_ms)
    upcoming = schedule.ticks_after(last, STORED_TICKS)
    fields = {**schedule.fields(), **state_fields(last, upcoming)}
    if kept is None:
        fields["fired"] = b"0"
    stale = [f for f in DEFINITION_FIELDS if f not in fields and (f in row or f.encode() in row)]
    commands: list[tuple[Any, ...]] = []
    if stale:
        commands.append(("HDEL", key, *stale))
    flat = [part for pair in fields.items() for part in pair]
    commands.append(("HSET", key, *flat))
    commands.append(("ZADD", schedules_key(queue), _zscore(upcoming), schedule.name))
    commands.append(("PUBLISH", changes_channel(queue), schedule.name))  # the drivers read it again
    return commands


def _zscore(upcoming: list[int]) -> str:
    return str(upcoming[0]) if upcoming else "+inf"


def fire_calls(schedule: Schedule, queue: str, firing: Firing) -> list[Call[Enqueued]]:
    """One ENQUEUE per fired tick, with the tick's deterministic id."""
    return [enqueue(queue, schedule.payload, job_id(schedule.name, tick)) for tick in firing.fire]


def advance_commands(schedule: Schedule, queue: str, firing: Firing) -> list[tuple[Any, ...]]:
    """The cursor, the precomputed ticks and the next due time, after a firing."""
    key = schedule_key(queue, schedule.name)
    flat = [part for pair in state_fields(firing.cursor, firing.upcoming).items() for part in pair]
    commands: list[tuple[Any, ...]] = [("HSET", key, *flat)]
    if firing.fire:
        commands.append(("HINCRBY", key, "fired", len(firing.fire)))
    commands.append(("ZADD", schedules_key(queue), _zscore(firing.upcoming), schedule.name))
    return commands


def remove_commands(queue: str, name: str) -> list[tuple[Any, ...]]:
    """The row and its entry removed (the first reply: whether there was a row); the drivers told."""
    return [
        ("DEL", schedule_key(queue, name)),
        ("ZREM", schedules_key(queue), name),
        ("PUBLISH", changes_channel(queue), name),
    ]


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise BadSchedule(f"schedule name must be 1 to 128 of A-Z a-z 0-9 _ . : - , got {name!r}")
    return name


def when_text(ms: int | None, tz: str = "UTC") -> str:
    """A tick for people: ISO 8601 in the schedule's zone."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000, _UTC).astimezone(zoneinfo.ZoneInfo(tz))
    return moment.isoformat(timespec="seconds")
