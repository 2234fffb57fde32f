"""Schedules over redis-py with threads: the I/O around ``schedules.py``'s rules.

Every write is a WATCH ... MULTI/EXEC on the schedule's row: the cursor is
read, the decision taken (``schedules.plan``), and the jobs and the new
cursor written in one EXEC, or not at all when another driver changed the
row first (then the row is read again, and found consumed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import ResponseError, WatchError

from . import _protocol as proto
from . import schedules as rules
from ._scripts import missing_code
from .errors import BadSchedule, JobExists

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("echomq.schedules")


@dataclass
class DriveResult:
    """What one drive of a queue's schedules did."""

    fired: list[str] = field(default_factory=list)
    """The ids of the jobs enqueued, in tick order per schedule."""
    dropped: int = 0
    """Due ticks consumed without a job (missed, under ``skip`` or ``one``, or beyond the ceiling)."""


def _now(reply: Any) -> int:
    return proto.server_ms(reply)


def names_of(reply: Any) -> list[str]:
    return [n.decode() if isinstance(n, bytes) else str(n) for n in reply]


def enqueue_failed(reply: Any) -> bool:
    """Did a tick's ENQUEUE inside the EXEC fail (other than: its job already exists)?"""
    return isinstance(reply, ResponseError) and "exists" not in str(reply)


def tell_failure(queue: str, job: str, reply: BaseException) -> None:
    log.warning("schedule of %r: the tick's job %s was not enqueued: %s", queue, job, reply)


def add(client: Client, queue: str, schedule: rules.Schedule) -> rules.ScheduleInfo:
    row_key, set_key = rules.schedule_key(queue, schedule.name), rules.schedules_key(queue)
    with client.redis.pipeline(transaction=True) as pipe:
        for _ in range(rules.WATCH_TRIES):
            try:
                pipe.watch(row_key, set_key)
                now = _now(pipe.execute_command("TIME"))
                row = pipe.hgetall(row_key)
                if not row and pipe.zcard(set_key) >= rules.MAX_SCHEDULES:
                    pipe.unwatch()
                    raise BadSchedule(f"queue {queue!r} has {rules.MAX_SCHEDULES} schedules, the most it may hold")
                commands = rules.add_commands(schedule, queue, row, now)
                pipe.multi()
                for command in commands:
                    pipe.execute_command(*command)
                pipe.execute()
                break
            except WatchError:
                continue
        else:
            raise WatchError(f"schedule {schedule.name!r} of {queue!r} kept changing under us")
    found = get(client, queue, schedule.name)
    assert found is not None
    return found


def remove(client: Client, queue: str, name: str) -> bool:
    rules.check_name(name)
    with client.redis.pipeline(transaction=True) as pipe:
        for command in rules.remove_commands(queue, name):
            pipe.execute_command(*command)
        deleted, _ = pipe.execute()
    return bool(deleted)


def get(client: Client, queue: str, name: str) -> rules.ScheduleInfo | None:
    row = client.redis.hgetall(rules.schedule_key(queue, name))
    return rules.info_of(name, row) if row else None


def listing(client: Client, queue: str) -> list[rules.ScheduleInfo]:
    names = names_of(client.redis.zrange(rules.schedules_key(queue), 0, rules.MAX_SCHEDULES - 1))
    pipe = client.redis.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(rules.schedule_key(queue, name))
    rows = pipe.execute() if names else []
    return sorted((rules.info_of(n, row) for n, row in zip(names, rows, strict=True) if row), key=lambda i: i.name)


def drive(client: Client, queue: str) -> DriveResult:
    """Fire every due tick of ``queue``'s schedules (at most ``DRIVE_BATCH`` schedules)."""
    set_key = rules.schedules_key(queue)
    now = client._server_time(set_key)
    result = DriveResult()
    for name in names_of(client.redis.zrangebyscore(set_key, "-inf", now, start=0, num=rules.DRIVE_BATCH)):
        fire(client, queue, name, result)
    return result


def fire(client: Client, queue: str, name: str, result: DriveResult) -> None:
    """Fire one schedule's due ticks, once whatever the number of drivers."""
    row_key, set_key = rules.schedule_key(queue, name), rules.schedules_key(queue)
    rendering = client._render()
    with client.redis.pipeline(transaction=True) as pipe:
        for _ in range(rules.WATCH_TRIES):
            try:
                pipe.watch(row_key)
                now = _now(pipe.execute_command("TIME"))
                row = pipe.hgetall(row_key)
                if not row:  # removed meanwhile: nothing to fire, and no entry to keep
                    pipe.multi()
                    pipe.zrem(set_key, name)
                    pipe.execute()
                    return
                schedule = rules.from_row(name, row)
                firing = rules.plan(schedule, int(row.get(b"last", row.get("last", 0))), now)
                calls = rules.fire_calls(schedule, queue, firing)
                pipe.multi()
                for call in calls:
                    pipe.execute_command(*rendering.command(call.args))
                for command in rules.advance_commands(schedule, queue, firing):
                    pipe.execute_command(*command)
                replies = pipe.execute(raise_on_error=False)
                break
            except WatchError:
                continue
        else:
            return  # others keep firing it: they consume its ticks
    result.dropped += firing.dropped
    for call, reply in zip(calls, replies, strict=False):
        job = call.args[3].decode()
        if isinstance(reply, ResponseError) and missing_code(reply):
            # The node lacked the scripts: nothing of that ENQUEUE ran, but the cursor moved.
            try:
                client._run(call)
            except JobExists:
                pass
            except ResponseError as exc:
                tell_failure(queue, job, exc)
                continue
        elif enqueue_failed(reply):
            tell_failure(queue, job, reply)
            continue
        result.fired.append(job)


def drive_quietly(client: Client, queue: str, trouble: Any) -> None:
    """A worker's or reaper's turn: drive the schedules; a failure is told to ``trouble(exc, what)``."""
    try:
        drive(client, queue)
    except (redis.RedisError, ValueError) as exc:
        trouble(exc, "schedules")
