"""The operator's verbs and views of ``echomq.asyncio.Client``: the twin of ``echomq/_sync/_operator.py``.

A mixin of the client's, apart from the job lifecycle (``client.py``); each
verb one command (or one read of the server's clock and a MULTI) through
the client's own ``_run``.

Hand-written beside its twin ``_sync/_operator.py``, not generated from it
(``tests/unasync.py``): the code is the same but for ``await``; the docstrings are not
(the asyncio client's point to the sync client's, as the API reference shows them), nor
are the types of ``redis``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar, overload

import redis
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from .. import _protocol as proto
from .._protocol import (
    ActiveJob,
    DeadJob,
    GroupDefault,
    GroupInfo,
    JobId,
    JobInfo,
    ObliterateResult,
    PendingJob,
    QueueCounters,
    QueueCounts,
    RateLimit,
    Retention,
    RetryDeadResult,
)
from ..errors import EchoMQError
from . import _partitions
from ._partitions import partition_of

T = TypeVar("T")


class OperatorVerbs:
    """The operator's verbs of ``echomq.asyncio.Client`` (see the module docstring)."""

    redis: aioredis.Redis | aioredis.RedisCluster
    _registrations: proto.Registrations
    """The queues this client added to the registry's index lately (``_register``)."""

    async def _run(self, call: proto.Call[T]) -> T:
        raise NotImplementedError

    async def _partition_of(self, queue: str, job_id: JobId) -> str:
        """The queue that holds ``job_id`` (its partition, on a partitioned queue: ``_partitions.py``)."""
        return await partition_of(self, queue, job_id)  # type: ignore[arg-type]

    def _node_of(self, key: str) -> dict[str, Any]:
        if hasattr(self.redis, "get_node_from_key"):
            return {"target_nodes": self.redis.get_node_from_key(key)}
        return {}

    async def _server_time(self, key: str) -> int:
        return proto.server_ms(await self.redis.execute_command("TIME", **self._node_of(key)))

    async def _register(self, queue: str) -> None:
        """Add ``queue`` to the registry's index ``emq:queues``, at most once a minute per queue.

        Sent after the enqueue was answered, so nothing here fails it: the
        enqueue's marker ``emq:{Q}:queue`` already registered the queue, and a
        reader fills the index from the markers (docs/concepts/registry.md).  A
        refusal (``NOPERM`` on ``emq:queues``) is not asked again for a minute; a
        lost connection is asked again at the next enqueue.
        """
        now = time.monotonic()
        if not self._registrations.due(queue, now):
            return
        try:
            await self.redis.execute_command(*proto.register(queue))
        except ResponseError:
            pass
        except redis.RedisError:
            return
        self._registrations.done(queue, now)

    async def _unregister(self, queue: str) -> None:
        """Take an obliterated ``queue`` out of the registry's index (its marker went with its last step)."""
        self._registrations.forget(queue)
        await self.redis.execute_command(*proto.unregister(queue))

    async def _read(self, read: proto.Read[T]) -> T:
        now = await self._server_time(read.key)
        pipe = self.redis.pipeline(transaction=True)
        for args in read.build(now):
            pipe.execute_command(*args)
        return read.parse(now, await pipe.execute())

    async def retention(
        self,
        queue: str,
        *,
        done_ms: int | None = None,
        cancelled_ms: int | None = None,
        dead_ms: int | None = None,
    ) -> Retention:
        """Read, or set, the queue's retention (see ``echomq.Client.retention``)."""
        return await self._run(proto.retention(queue, done_ms, cancelled_ms, dead_ms))

    async def job(self, queue: str, job_id: JobId, *, payload: bool = False) -> JobInfo | None:
        """The job's status, or None (see ``echomq.Client.job``)."""
        return await self._read(proto.job_info(await self._partition_of(queue, job_id), job_id, payload))

    async def counts(self, queue: str) -> QueueCounts:
        """The queue's numbers, pending by priority level too (see ``echomq.Client.counts``)."""
        hint = proto.CountsHint()
        for _ in range(proto.SNAPSHOT_TRIES):
            found = await self._read(proto.counts(queue, hint))
            if isinstance(found, QueueCounts):
                return found
            hint = found
        tries = proto.SNAPSHOT_TRIES
        raise EchoMQError(f"counts({queue!r}): groups or priority levels changed in each of {tries} reads")

    async def dead(self, queue: str, *, offset: int = 0, count: int = 100) -> list[DeadJob]:
        """A page of the dead set, oldest first (see ``echomq.Client.dead``)."""
        page = await self._read(proto.dead_page(queue, offset, count))
        return await self._read(proto.dead_rows(queue, page)) if page else []

    async def active(self, queue: str, *, offset: int = 0, count: int = 100) -> list[ActiveJob]:
        """A page of the active set, soonest deadline first (see ``echomq.Client.active``)."""
        page = await self._read(proto.active_page(queue, offset, count))
        return await self._read(proto.active_rows(queue, page)) if page else []

    async def pending(self, queue: str, *, offset: int = 0, count: int = 100) -> list[PendingJob]:
        """A page of the waiting jobs, in claim order (see ``echomq.Client.pending``)."""
        layout = await self._read(proto.pending_layout(queue))
        if layout.names:  # the groups' lanes, by the names found
            layout = await self._read(proto.pending_layout(queue, layout.names))
        page = await self._read(proto.pending_page(queue, offset, count, layout))
        return await self._read(proto.pending_rows(queue, page)) if page else []

    async def counters(self, queue: str) -> QueueCounters:
        """The queue's shared counters (see ``echomq.Client.counters``)."""
        return await self._read(proto.counters(queue))

    async def queues(
        self, *, limit: int = 100, scan_budget: int = 100_000, rescan: bool = False
    ) -> list[str]:
        """The names of the queues that ever had a job (since their last obliterate), sorted.

        Read from the queue registry's index, the set ``emq:queues``, with no
        SCAN of the keyspace: a queue that drained in a second is listed all
        the same (docs/concepts/registry.md).  When the index was never filled
        (an upgrade from a version without it), or with ``rescan``, a bounded
        SCAN (on every primary of a cluster) of the queues' markers, lanes and
        sets runs first and fills it: it stops after about ``scan_budget`` keys
        examined or ``limit`` queues found.  At most ``limit`` names.
        """
        proto.positive_int("limit", limit)
        proto.positive_int("scan_budget", scan_budget)
        found: set[str] = set()
        filled = await self.redis.execute_command("SISMEMBER", proto.REGISTRY_KEY, proto.REGISTRY_FILLED)
        if rescan or not filled:
            step = min(1000, scan_budget)
            nodes = self.redis.get_primaries() if hasattr(self.redis, "get_primaries") else [None]
            for node in nodes:
                for scan in range(len(proto.QUEUE_SCANS)):
                    target = {} if node is None else {"target_nodes": node}
                    found |= await self._scan_queues(scan, step, scan_budget, limit - len(found), target)
            with contextlib.suppress(ResponseError):  # a reader that may not write it scans again next time
                await self.redis.execute_command(*proto.fill_registry(sorted(found)))
        cursor = 0
        while len(found) < limit:
            reply = await self.redis.execute_command(*proto.registry_page(cursor, 1000))
            cursor, names = proto.registry_reply(reply)
            found.update(names)
            if cursor == 0:
                break
        return sorted(found)[:limit]

    async def _scan_queues(
        self, scan: int, step: int, budget: int, limit: int, target: dict[str, Any]
    ) -> set[str]:
        """One pass of ``queues`` on one node: at most ``budget`` keys examined, ``limit`` queues found."""
        found: set[str] = set()
        cursor, examined = 0, 0
        while limit > 0:
            reply = await self.redis.execute_command(*proto.scan_queues(cursor, step, scan), **target)
            cursor, keys = proto.scan_reply(reply)
            found.update(q for q in map(proto.queue_of_key, keys) if q is not None)
            examined += step
            if cursor == 0 or examined >= budget or len(found) >= limit:
                break
        return found

    async def retry(self, queue: str, job_id: JobId) -> None:
        """Send a dead or cancelled job back to pending (see ``echomq.Client.retry``)."""
        await self._run(proto.retry(queue, job_id))

    async def _within_max_limit(self, make: Callable[[int], proto.Call[T]], limit: int) -> tuple[T, int]:
        """``make(limit)``'s answer, and the step size that ran: halved while the server's
        ``emq.max-limit`` refuses it (nothing written then: ``proto.halved_limit``)."""
        while True:
            try:
                return await self._run(make(limit)), limit
            except ResponseError as exc:
                smaller = proto.halved_limit(exc, limit)
                if smaller is None:
                    raise
                limit = smaller

    async def retry_dead(self, queue: str, *, limit: int = 100) -> RetryDeadResult:
        """Retry every job dead now, in bounded steps (see ``echomq.Client.retry_dead``)."""
        until = await self._server_time(proto.keys_of(queue).dead)
        retried = dropped = 0
        while True:
            step, limit = await self._within_max_limit(lambda n: proto.retry_dead(queue, n, until), limit)
            retried, dropped = retried + step.retried, dropped + step.dropped
            if step.retried + step.dropped < limit:
                return RetryDeadResult(retried, dropped)

    async def purge_dead(self, queue: str, *, limit: int = 100) -> int:
        """Delete every job dead now, in bounded steps (see ``echomq.Client.purge_dead``)."""
        until = await self._server_time(proto.keys_of(queue).dead)
        total = 0
        while True:
            step, limit = await self._within_max_limit(lambda n: proto.purge_dead(queue, n, until), limit)
            total += step
            if step < limit:
                return total

    async def pause(self, queue: str) -> bool:
        """Stop handing out the queue's jobs (see ``echomq.Client.pause``)."""
        return await self._run(proto.pause(queue))

    async def resume(self, queue: str) -> bool:
        """Hand out the queue's jobs again (see ``echomq.Client.resume``)."""
        return await self._run(proto.resume(queue))

    @overload
    async def set_group_limit(self, queue: str, group: str, *, max_active: int | None) -> GroupInfo: ...
    @overload
    async def set_group_limit(self, queue: str, group: None, *, max_active: int | None) -> GroupDefault: ...
    async def set_group_limit(
        self, queue: str, group: str | None, *, max_active: int | None
    ) -> GroupInfo | GroupDefault:
        """Cap one group's active jobs, or every group's (see ``echomq.Client.set_group_limit``)."""
        if group is None:
            return await self._run(proto.set_group_default(queue, max_active))
        return await self._run(proto.set_group_limit(queue, group, max_active))

    async def group(self, queue: str, group: str) -> GroupInfo:
        """One group of the queue (see ``echomq.Client.group``)."""
        return await self._run(proto.group_limit(queue, group))

    async def pause_group(self, queue: str, group: str) -> GroupInfo:
        """Hold back one group's waiting jobs (see ``echomq.Client.pause_group``)."""
        return await self._run(proto.pause_group(queue, group))

    async def resume_group(self, queue: str, group: str) -> GroupInfo:
        """Let a paused group's jobs be claimed again (see ``echomq.Client.resume_group``)."""
        return await self._run(proto.resume_group(queue, group))

    async def groups(self, queue: str) -> list[GroupInfo]:
        """Every group of the queue, by name (see ``echomq.Client.groups``)."""
        known: tuple[bytes, ...] = ()
        for _ in range(proto.SNAPSHOT_TRIES):
            found = await self._read(proto.group_rows(queue, known))
            if isinstance(found, list):
                return found
            known = found
        raise EchoMQError(f"groups({queue!r}): its groups changed in each of {proto.SNAPSHOT_TRIES} reads")

    async def set_rate_limit(self, queue: str, max: int | None, per_ms: int | None = None) -> RateLimit:
        """Set or remove the queue's rate limit (see ``echomq.Client.set_rate_limit``)."""
        proto.set_rate_limit(queue, max, per_ms)  # the arguments, checked before anything is sent
        if (partitioned := await _partitions.lookup(self, queue)) is not None:  # type: ignore[arg-type]
            return await _partitions.set_rate_limit(self, partitioned, max, per_ms)  # type: ignore[arg-type]
        return await self._run(proto.set_rate_limit(queue, max, per_ms))

    async def remove_rate_limit(self, queue: str) -> RateLimit:
        """Remove the queue's rate limit (see ``echomq.Client.remove_rate_limit``)."""
        if (partitioned := await _partitions.lookup(self, queue)) is not None:  # type: ignore[arg-type]
            return await _partitions.set_rate_limit(self, partitioned, None, None)  # type: ignore[arg-type]
        return await self._run(proto.set_rate_limit(queue, None))

    async def rate_limit(self, queue: str) -> RateLimit:
        """The queue's rate limit and back-off (see ``echomq.Client.rate_limit``)."""
        if (partitioned := await _partitions.lookup(self, queue)) is not None:  # type: ignore[arg-type]
            return await _partitions.rate_limit(self, partitioned)  # type: ignore[arg-type]
        return await self._run(proto.limit(queue))

    async def back_off(self, queue: str, ms: int) -> RateLimit:
        """Stop every claim of the queue for ``ms`` (see ``echomq.Client.back_off``)."""
        proto.back_off(queue, ms)  # the arguments, checked before anything is sent
        if (partitioned := await _partitions.lookup(self, queue)) is not None:  # type: ignore[arg-type]
            return await _partitions.back_off(self, partitioned, ms)  # type: ignore[arg-type]
        return await self._run(proto.back_off(queue, ms))

    async def obliterate(self, queue: str, *, force: bool = False, limit: int = 100) -> ObliterateResult:
        """Delete the queue in bounded steps (see ``echomq.Client.obliterate``)."""
        removed, forgotten, rounds = 0, 0, 0
        while True:  # a round: the sets, then the rows in none (SCAN)
            rounds += 1
            while True:
                (step, remaining), limit = await self._within_max_limit(
                    lambda n: proto.obliterate(queue, n, force), limit
                )
                removed += step
                if remaining == 0:
                    break
            cursor = 0
            target = self._node_of(proto.keys_of(queue).pending)
            while True:
                reply = await self.redis.execute_command(*proto.scan_rows(queue, cursor, limit), **target)
                cursor, found = proto.scan_reply(reply)
                for call in proto.forget_steps(queue, [proto.row_id(queue, k) for k in found], limit):
                    forgotten += await self._run(call)
                if cursor == 0:
                    break
            # a forget of a waiting job resolves what waited on it: a waiter under `fail` ends
            # dead (or, under `ignore`, enters a lane), which the next round removes
            # (docs/concepts/workflows.md)
            keys = proto.keys_of(queue)
            if rounds >= 100 or not await self.redis.exists(keys.dead, keys.pending, keys.base + "priority"):
                await self.redis.delete(proto.counters_key(queue))  # the shared counters (echomq.metrics)
                # ends left to resolve whose waiters the forgets deleted (docs/concepts/workflows.md)
                await self.redis.delete(proto.keys_of(queue).base + "resolve")
                await self._unregister(queue)
                return ObliterateResult(removed, forgotten)
