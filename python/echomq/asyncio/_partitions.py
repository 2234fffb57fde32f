"""A partitioned queue, for ``echomq.asyncio.Client``: the calls of ``_sync/_partitions.py``,
awaited.

Hand-written beside its twin ``_sync/_partitions.py``, not generated from it
(``tests/unasync.py``): the wakes' listener is a task here, a thread with its events there.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterable
from typing import Any, Protocol

import redis
from redis.exceptions import NoPermissionError, ResponseError

from .. import _protocol as proto
from .._protocol import EnqueueItem, JobId, RateLimit
from .._protocol import partitions as rules
from .._protocol.partitions import Partitioned
from .._protocol.unique import Enqueued
from .._result_wait import _anext_message, _asharded
from .._runtime import ATTEMPT_TIMEOUT_S
from .._runtime.partitions import IdleWakes, adopt, wake_channel
from ..errors import ServerUnreachable


class Client(Protocol):
    """What these functions use of ``echomq.asyncio.Client`` (a Protocol: the client imports this module)."""

    redis: Any
    _partitioned_queues: dict[str, Partitioned | None]

    async def enqueue(self, *args: Any, **kwargs: Any) -> Enqueued: ...

    async def enqueue_many(self, *args: Any, **kwargs: Any) -> list[str]: ...

    async def _pipeline_run(self, calls: list[proto.Call[Any]]) -> list[Any]: ...

    async def _register(self, queue: str) -> None: ...


async def declare(client: Client, queue: str, partitions: int) -> None:
    queue = rules.check_logical(queue)
    partitions = rules.check_partitions(partitions)
    key, count = rules.declaration(queue, partitions)
    before = rules.declared(await client.redis.set(key, count, nx=True, get=True))
    rules.check_declared(queue, before, partitions)
    client._partitioned_queues[queue] = Partitioned(queue, partitions)


async def lookup(client: Client, queue: str) -> Partitioned | None:
    """``queue``'s declaration as this client first read it (None: an ordinary queue).

    A partition's name (it has a ``#``) is never declared: no read.  A user whose
    ACL may not read the declaration's key sees an ordinary queue.
    """
    known = client._partitioned_queues
    if queue in known:
        return known[queue]
    found: Partitioned | None = None
    if isinstance(queue, str) and "#" not in queue:
        try:
            count = rules.declared(await _read(client, queue))
        except NoPermissionError:
            count = None
        found = None if count is None else Partitioned(queue, count)
    known[queue] = found
    return found


async def _read(client: Client, queue: str) -> Any:
    """The declaration's GET, sent again after a lost reply within the enqueue's own window (a GET
    is safe to repeat): a stall the enqueue would ride out does not fail it here."""
    window = proto.RequestWindow(time.monotonic(), proto.socket_timeout_of(client.redis))
    while True:
        try:
            return await client.redis.execute_command(*rules.read_args(queue))
        except ServerUnreachable:  # nothing listens there (a wrong URL): at once, as the enqueue would
            raise
        except (redis.ConnectionError, redis.TimeoutError):
            pause = window.next_pause(time.monotonic())
            if pause is None:
                raise
            await asyncio.sleep(pause)


async def partition_of(client: Client, queue: str, job_id: JobId) -> str:
    """The queue that holds ``job_id``: its partition on a partitioned queue, else ``queue``."""
    partitioned = await lookup(client, queue)
    return queue if partitioned is None else partitioned.partition_of_id(job_id)


async def enqueue(
    client: Client,
    partitioned: Partitioned,
    payload: bytes | str,
    job_id: JobId | None,
    partition_key: str | bytes | None,
    unique_key: str | bytes | None,
    group: str | None,
    **options: Any,
) -> Enqueued:
    after = options.get("after")
    if after:  # with what it waits for (docs/concepts/partitions.md)
        after = options["after"] = list(after)
        given = partition_key is not None or group is not None
        chosen = partitioned.route(partition_key, group, None, None) if given else None
        index = partitioned.route_after(after, chosen)
    else:
        index = partitioned.route(partition_key, group, unique_key, job_id)
    name = partitioned.names[index]
    enqueued = await client.enqueue(
        name, payload, partitioned.job_id(index, job_id), unique_key=unique_key, group=group, **options
    )
    await wake(client, name)
    return enqueued


async def enqueue_many(
    client: Client,
    partitioned: Partitioned,
    items: Iterable[EnqueueItem],
    partition_key: str | bytes | None,
    delay_ms: int | None,
    priority: int | None,
    group: str | None,
) -> list[str]:
    """Each item to its partition, every partition's ENQUEUEMANY in one pipeline (a round trip per node)."""
    fixed = (
        None
        if partition_key is None and group is None
        else partitioned.route(partition_key, group, None, None)
    )
    per: dict[int, list[EnqueueItem]] = {}
    ids: list[bytes] = []
    for item in items:
        if isinstance(item, tuple) and len(item) != 2:
            raise ValueError(f"an enqueue_many item must be a payload or (job_id, payload), got {item!r}")
        given = item[0] if isinstance(item, tuple) else None
        body = item[1] if isinstance(item, tuple) else item
        index = fixed if fixed is not None else partitioned.route(None, None, None, given)
        wid = partitioned.job_id(index, given)
        ids.append(wid)
        per.setdefault(index, []).append((wid, body))
    calls = [
        call
        for index, jobs in sorted(per.items())
        for call in proto.enqueue_many(
            partitioned.names[index], jobs, delay_ms, priority=priority, group=group
        )
    ]
    if not calls:
        return []
    replies = await client._pipeline_run(calls)
    first_error: BaseException | None = None
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, ResponseError) and proto.over_max_limit(reply):  # emq.max-limit below 10,000
            count = int(call.args[3])
            jobs = [(call.args[4 + 2 * i], call.args[5 + 2 * i]) for i in range(count)]
            await client.enqueue_many(call.queue, jobs, delay_ms=delay_ms, priority=priority, group=group)
        elif isinstance(reply, BaseException) and first_error is None:
            first_error = reply
    if first_error is not None:
        if isinstance(first_error, ResponseError):
            bad = next(c for c, r in zip(calls, replies, strict=True) if r is first_error)
            proto.raise_mapped(first_error, bad)
        raise first_error
    for index in per:
        await client._register(partitioned.names[index])
        await wake(client, partitioned.names[index])
    return [proto.text(wid) for wid in ids]


async def wake(client: Client, name: str) -> None:
    """Announce a job in partition ``name`` to its idle workers (see ``_sync/_partitions.wake``)."""
    with contextlib.suppress(redis.RedisError):
        await client.redis.execute_command(
            "SPUBLISH" if await _asharded(client.redis) else "PUBLISH", wake_channel(name), b""
        )


async def _close(pubsub: Any) -> None:
    closing = getattr(pubsub, "aclose", None) or pubsub.close  # aclose() from redis-py 5.0.1
    await closing()


class Wakes:
    """A partitioned worker's listener of its partitions' wakes: subscribed while it idles."""

    def __init__(self, client: Client, names: tuple[str, ...], state: IdleWakes) -> None:
        self.client, self.state = client, state
        self.index = {wake_channel(name).encode(): i for i, name in enumerate(names)}
        self.woken = asyncio.Event()  # a wake came: the claim looks again
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self, name: str) -> None:
        self._task = asyncio.create_task(self._run(), name=name)

    def changed(self) -> None:
        self._changed.set()

    async def stop(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def _run(self) -> None:
        state, pubsub, sharded = self.state, None, False
        try:
            while True:
                try:
                    if state.wanted and pubsub is None:
                        sharded = await _asharded(self.client.redis)
                        pubsub = self.client.redis.pubsub(ignore_subscribe_messages=True)
                        await (pubsub.ssubscribe if sharded else pubsub.subscribe)(*self.index)
                        state.subscribed = True
                    elif not state.wanted and pubsub is not None:
                        state.subscribed = False
                        await _close(pubsub)
                        pubsub = None
                    if pubsub is None:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._changed.wait(), 0.5)
                        self._changed.clear()
                        continue
                    message = await _anext_message(pubsub, sharded, 0.2)
                    if message is not None and message.get("type") in ("message", "smessage"):
                        index = self.index.get(message["channel"])
                        if index is not None:
                            state.woken(index)
                            self.woken.set()
                except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                    raise
                except Exception:  # the subscription dropped: made again while still wanted
                    state.subscribed = False
                    if pubsub is not None:
                        with contextlib.suppress(Exception):
                            await _close(pubsub)
                    pubsub = None
                    await asyncio.sleep(1.0)
        finally:
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    await _close(pubsub)


def hook_worker(worker: Any) -> None:
    """At a worker's start: it reads its queue's declaration with its first claim, a stop
    cutting the read (see ``_sync/_partitions.hook_worker``)."""
    claim = worker._claim

    async def first_claim(step: Any, **options: Any) -> Any:
        read = asyncio.ensure_future(lookup(worker.client, worker.queue))
        stopping = asyncio.ensure_future(worker._stopping.wait())
        try:
            await asyncio.wait(
                {read, stopping}, timeout=ATTEMPT_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (read, stopping):
                task.cancel()
        if not read.done() or read.cancelled() or read.exception() is not None:
            return await claim(step, **options)  # not read: the claim, its own way
        del worker._claim  # the class's own again: no hook on any later claim
        if (partitioned := read.result()) is not None:
            _adopt(worker, partitioned)
        return await worker._claim(step, **options)

    worker._claim = first_claim


def _adopt(worker: Any, partitioned: Partitioned) -> None:
    if worker._listener is not None:  # pushed cancels: every partition's channel
        worker._listener.listen_to(partitioned.names)
    state = IdleWakes(partitioned.partitions)
    adopt(worker, partitioned.names, random.randrange(partitioned.partitions), state)
    wakes = worker._partition_wakes = Wakes(worker.client, partitioned.names, state)
    claim = worker._claim

    async def claim_and_move_on(step: Any, **options: Any) -> Any:
        try:
            jobs, claimed_at = await claim(step, **options)
        finally:
            step.renew()  # an empty answer (or jobs) ends this partition's turn: the next claim moves on
        if options.get("block_ms") is None:  # a claim with ends: the worker is busy
            return jobs, claimed_at
        was = state.wanted
        wait = state.claimed(len(jobs))
        if state.wanted != was:
            wakes.changed()
        if state.wanted and not state.subscribed:  # the subscription first, then around once more
            deadline = time.monotonic() + 2.0
            while not state.subscribed and time.monotonic() < deadline and not worker._stop_requested:
                await asyncio.sleep(0.01)
        until = time.monotonic() + wait
        while not state.pending and not worker._stop_requested and (left := until - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakes.woken.wait(), min(left, 0.1))
            wakes.woken.clear()
        return jobs, claimed_at

    worker._claim = claim_and_move_on
    wakes.start(f"echomq-worker-{worker.queue}-wakes")


async def stop_worker(worker: Any) -> None:
    """The worker stops: its wakes' listener too (a worker of an ordinary queue has none)."""
    wakes = getattr(worker, "_partition_wakes", None)
    if wakes is not None:
        await wakes.stop()


async def set_rate_limit(
    client: Client, partitioned: Partitioned, max: int | None, per_ms: int | None
) -> RateLimit:
    """The queue-wide limit split into the partitions' shares (``rules.rate_shares``), one pipeline."""
    shares = rules.rate_shares(max, partitioned.partitions)
    calls = [
        proto.set_rate_limit(name, share, per_ms)
        for name, share in zip(partitioned.names, shares, strict=True)
    ]
    return await _limits(client, calls)


async def rate_limit(client: Client, partitioned: Partitioned) -> RateLimit:
    return await _limits(client, [proto.limit(name) for name in partitioned.names])


async def back_off(client: Client, partitioned: Partitioned, ms: int) -> RateLimit:
    return await _limits(client, [proto.back_off(name, ms) for name in partitioned.names])


async def _limits(client: Client, calls: list[proto.Call[RateLimit]]) -> RateLimit:
    replies = await client._pipeline_run(list(calls))
    limits = []
    for call, reply in zip(calls, replies, strict=True):
        if isinstance(reply, ResponseError):
            proto.raise_mapped(reply, call)
        if isinstance(reply, BaseException):
            raise reply
        limits.append(call.read(reply))
    return rules.combined_limit(limits)
