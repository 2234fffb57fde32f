"""Schedules over redis.asyncio: the I/O around ``schedules.py``'s rules.

The source of its sync twin, ``_sync/_schedules.py``, which ``tests/unasync.py`` writes from it.

Every write is a WATCH ... MULTI/EXEC on the schedule's row: the cursor is
read, the decision taken (``schedules.plan``), and the jobs and the new
cursor written in one EXEC, or not at all when another driver changed the
row first (then the row is read again, and found consumed).
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import redis
from redis.exceptions import ResponseError, WatchError

from .. import _protocol as proto
from .. import schedules as rules
from .._scripts import Rendering
from ..errors import BadSchedule, JobExists

T = TypeVar("T")


class Client(Protocol):
    """What these functions use of ``echomq.asyncio.Client`` (a Protocol: the client imports this module)."""

    redis: Any

    async def _render(self) -> Rendering: ...

    async def _run(self, call: proto.Call[T]) -> T: ...

    async def _server_time(self, key: str) -> int: ...


async def add(client: Client, queue: str, schedule: rules.Schedule) -> rules.ScheduleInfo:
    row_key, set_key = rules.schedule_key(queue, schedule.name), rules.schedules_key(queue)
    async with client.redis.pipeline(transaction=True) as pipe:
        for _ in range(rules.WATCH_TRIES):
            try:
                now = await client._server_time(row_key)  # before the WATCH: a cluster routes it
                await pipe.watch(row_key, set_key)
                row = await pipe.hgetall(row_key)
                if not row and await pipe.zcard(set_key) >= rules.MAX_SCHEDULES:
                    await pipe.unwatch()
                    raise BadSchedule(
                        f"queue {queue!r} has {rules.MAX_SCHEDULES} schedules, the most it may hold"
                    )
                commands = rules.add_commands(schedule, queue, row, now)
                pipe.multi()
                for command in commands:
                    pipe.execute_command(*command)
                await pipe.execute()
                break
            except WatchError:
                continue
        else:
            raise WatchError(f"schedule {schedule.name!r} of {queue!r} kept changing under us")
    found = await get(client, queue, schedule.name)
    assert found is not None
    return found


async def remove(client: Client, queue: str, name: str) -> bool:
    rules.check_name(name)
    async with client.redis.pipeline(transaction=True) as pipe:
        for command in rules.remove_commands(queue, name):
            pipe.execute_command(*command)
        deleted = (await pipe.execute())[0]
    return bool(deleted)


async def get(client: Client, queue: str, name: str) -> rules.ScheduleInfo | None:
    row = await client.redis.hgetall(rules.schedule_key(queue, name))
    return rules.info_of(name, row) if row else None


async def listing(client: Client, queue: str) -> list[rules.ScheduleInfo]:
    names = rules.names_of(await client.redis.zrange(rules.schedules_key(queue), 0, rules.MAX_SCHEDULES - 1))
    pipe = client.redis.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(rules.schedule_key(queue, name))
    rows = await pipe.execute() if names else []
    return sorted(
        (rules.info_of(n, row) for n, row in zip(names, rows, strict=True) if row), key=lambda i: i.name
    )


async def next_tick(client: Client, queue: str) -> tuple[int | None, int]:
    """The earliest next tick of ``queue``'s schedules (epoch ms; None: none has one) and the server's now."""
    set_key = rules.schedules_key(queue)
    first = await client.redis.zrange(set_key, 0, 0, withscores=True)
    now = await client._server_time(set_key)
    if not first or first[0][1] == float("inf"):
        return None, now
    return int(first[0][1]), now


async def drive(client: Client, queue: str) -> rules.DriveResult:
    """Fire every due tick of ``queue``'s schedules (at most ``DRIVE_BATCH`` schedules)."""
    set_key = rules.schedules_key(queue)
    result = rules.DriveResult()
    if not await client.redis.zrange(set_key, 0, 0):  # the common case, no schedule: one command a turn
        return result
    now = await client._server_time(set_key)
    for name in rules.names_of(
        await client.redis.zrangebyscore(set_key, "-inf", now, start=0, num=rules.DRIVE_BATCH)
    ):
        try:
            await fire(client, queue, name, result)
        except BadSchedule as exc:  # a row edited by hand: told, and the others still fire
            rules.log.warning("schedule %r of %r not driven: %s", name, queue, exc)
    return result


async def fire(client: Client, queue: str, name: str, result: rules.DriveResult) -> None:
    """Fire one schedule's due ticks, once whatever the number of drivers."""
    row_key, set_key = rules.schedule_key(queue, name), rules.schedules_key(queue)
    rendering = await client._render()
    async with client.redis.pipeline(transaction=True) as pipe:
        for _ in range(rules.WATCH_TRIES):
            try:
                now = await client._server_time(row_key)  # before the WATCH: a cluster routes it
                await pipe.watch(row_key)
                row = await pipe.hgetall(row_key)
                if not row:  # removed meanwhile: nothing to fire, and no entry to keep
                    pipe.multi()
                    pipe.zrem(set_key, name)
                    await pipe.execute()
                    return
                firing, calls, commands = rules.decide_fire(queue, name, row, now)
                pipe.multi()
                for call in calls:
                    pipe.execute_command(*rendering.command(call.args))
                for command in commands:
                    pipe.execute_command(*command)
                replies = await pipe.execute(raise_on_error=False)
                break
            except WatchError:
                continue
        else:
            return  # others keep firing it: they consume its ticks
    for call in rules.take_replies(queue, firing, calls, replies, result):
        # The node lacked the scripts: nothing of that ENQUEUE ran, but the cursor moved.
        try:
            await client._run(call)
        except JobExists:
            pass
        except ResponseError as exc:
            rules.tell_failure(queue, call, exc)
            continue
        result.fired.append(rules.call_job(call))


async def drive_quietly(client: Client, queue: str, trouble: Any) -> None:
    """A worker's or reaper's turn: drive the schedules; a failure is told to ``trouble(exc, what)``."""
    try:
        result = await drive(client, queue)
    except (redis.RedisError, ValueError) as exc:
        trouble(exc, "schedules")
        return
    rules.tell_drive(queue, result)
