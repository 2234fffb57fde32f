"""``echomq.Client`` for asyncio: the same commands and contracts over ``redis.asyncio``.

A worker's commands go through ``_attempt``/``_attempt_many``: one try each,
bounded, on connections of the worker's own (``_attempt.WorkerConnections``),
as in the thread driver's client.

Hand-written beside its twin ``_sync/client.py``, not generated from it
(``tests/unasync.py``): the methods users call carry their docs in the sync client and
point there from the asyncio one (the API reference shows both), and a worker's tries are
bounded by socket timeouts in one and by ``asyncio.timeout`` in the other.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar, cast

import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from .. import _protocol as proto
from .. import schedules as schedule_rules
from .._protocol import (
    CancelOutcome,
    EnqueueItem,
    ExtendOutcome,
    FailOutcome,
    JobId,
    ReleaseOutcome,
    SweepResult,
)
from .._protocol.calls import missing_code
from .._protocol.deps import OnParentFailure
from .._protocol.partitions import Partitioned
from .._protocol.unique import Enqueued
from .._redis import (
    _missing,
    check_redis_client,
    connection_defaults,
    default_async_retry,
    never_reached,
    unreachable,
    unwrapped,
)
from .._result_wait import await_result
from .._runtime.tries import NotSent
from .._scripts import (
    PROBE,
    BackendChoice,
    BackendName,
    Rendering,
    ScriptLimits,
    backend_from_probe,
    check_backend,
    load_refused,
)
from .._serializers import JSON
from ..cancel import Cancellation
from ..schedules import DriveResult, ScheduleInfo
from . import _partitions, _schedules
from ._attempt import Progress, WorkerConnections
from ._claims import ClaimVerbs
from ._operator import OperatorVerbs

__all__ = ["Client"]

T = TypeVar("T")

# The most a blocking backend probe (``client.backend`` before any command) waits.
PROBE_TIMEOUT_S = 5.0


class Client(ClaimVerbs, OperatorVerbs):
    """``echomq.Client`` for asyncio; every method is a coroutine with the same contract.

    ``backend`` and ``script_limits`` as for ``echomq.Client``.  With ``"auto"``
    the server is asked at the first command (or ``await
    client.detect_backend()``); ``client.backend`` asks it itself when no
    command has yet (see ``backend``).
    """

    def __init__(
        self,
        redis_client: aioredis.Redis | aioredis.RedisCluster,
        backend: BackendChoice = "auto",
        *,
        script_limits: ScriptLimits | None = None,
    ) -> None:
        check_redis_client(redis_client, want_async=True)
        self.redis = redis_client
        self._limits = script_limits if script_limits is not None else ScriptLimits()
        choice = check_backend(backend)
        self._rendering: Rendering | None = None if choice == "auto" else Rendering(choice, self._limits)
        self._waitaof: bool | None = None  # whether the server has WAITAOF (asked once, when needed)
        # Each queue's partition declaration as first read (None: an ordinary queue): _partitions.lookup.
        self._partitioned_queues: dict[str, Partitioned | None] = {}
        self._pool: WorkerConnections | None = None  # a worker's attempts: its own connections
        self._reached = False  # a request of ours got an answer once (never_reached)
        self._registrations = proto.Registrations()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool = False,
        backend: BackendChoice = "auto",
        script_limits: ScriptLimits | None = None,
        **kwargs: Any,
    ) -> Client:
        """Connect with ``redis.asyncio.Redis.from_url(url, **kwargs)``.

        With ``cluster=True``, ``url`` names any node of a Redis Cluster and the
        client is ``redis.asyncio.RedisCluster``: each command goes to the node
        that owns its queue's slot.  ``backend`` and ``script_limits`` as for
        ``Client``; the same deliberate timeouts and retries as
        ``echomq.Client.from_url``.
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        kwargs.setdefault("retry", default_async_retry())
        options = connection_defaults(kwargs)
        if cluster:
            return cls(aioredis.RedisCluster.from_url(url, **options), backend, script_limits=script_limits)
        return cls(aioredis.Redis.from_url(url, **options), backend, script_limits=script_limits)

    @property
    def backend(self) -> BackendName:
        """``"module"`` or ``"scripts"``: how this client's commands run (asks the server once).

        With "auto" and no command sent yet, a property cannot await: the
        server is asked on a short-lived connection of its own, a blocking
        round trip of at most ``PROBE_TIMEOUT_S`` (inside a running loop,
        prefer ``await client.detect_backend()``, which does not block it).
        """
        if self._rendering is None:
            try:
                name = self._probe_blocking()
            except (redis.RedisError, OSError, AttributeError, StopIteration) as exc:
                raise RuntimeError(
                    f"the backend is not known yet and the server could not be asked ({exc!r}): "
                    "await client.detect_backend()"
                ) from exc
            self._rendering = Rendering(name, self._limits)
        return self._rendering.name

    def _probe_blocking(self) -> BackendName:
        """The backend probe over a synchronous connection made with this client's settings."""
        r = self.redis
        if isinstance(r, aioredis.RedisCluster):
            manager = r.nodes_manager
            node = next(iter(manager.startup_nodes.values()))
            kwargs, async_class = (
                dict(manager.connection_kwargs),
                manager.connection_kwargs.get("connection_class"),
            )
            kwargs.update(host=node.host, port=node.port)
        else:
            pool = r.connection_pool
            kwargs, async_class = dict(pool.connection_kwargs), pool.connection_class
        sync_class = getattr(redis.connection, getattr(async_class, "__name__", "Connection"), None)
        if not isinstance(sync_class, type):
            sync_class = redis.connection.Connection
        accepted = inspect.signature(sync_class).parameters
        options = {k: v for k, v in kwargs.items() if k in accepted and k != "retry"}
        for name in ("socket_timeout", "socket_connect_timeout"):
            given = options.get(name)
            options[name] = PROBE_TIMEOUT_S if given is None else min(float(given), PROBE_TIMEOUT_S)
        connection = sync_class(retry=Retry(NoBackoff(), 0), **options)
        try:
            connection.send_command(*PROBE)
            reply = connection.read_response()
        except ResponseError:  # COMMAND refused (an ACL): the scripts run anywhere
            reply = None
        finally:
            connection.disconnect()
        return backend_from_probe(reply)

    async def detect_backend(self) -> BackendName:
        """The backend in use, asking the server once if it is "auto"."""
        return (await self._render()).name

    async def _render(self) -> Rendering:
        rendering = self._rendering
        if rendering is None:
            try:
                reply = await self.redis.execute_command(*PROBE, **(await self._any_node()))
            except ResponseError:  # COMMAND refused (an ACL): the scripts run anywhere
                reply = None
            rendering = self._rendering = Rendering(backend_from_probe(reply), self._limits)
        return rendering

    async def _any_node(self) -> dict[str, Any]:
        """For the backend probe: in a cluster, any node (known once the client has initialized)."""
        if not isinstance(self.redis, aioredis.RedisCluster):
            return {}
        await self.redis.initialize()
        return {"target_nodes": self.redis.get_random_node()}

    async def _send(self, args: tuple[Any, ...]) -> Any:
        """Send a module command line as the backend has it; load the Lua where a node lacks it."""
        rendering = await self._render()
        command = rendering.command(args)
        try:
            return await self.redis.execute_command(*command)
        except ResponseError as exc:
            if not missing_code(exc):
                raise
        # Nothing ran: the node lacks the library (or the script).  Load it there, send again.
        load = rendering.load()
        if load is not None:
            try:
                await self.redis.execute_command(*load, **self._node_of_call(command))
            except ResponseError as exc:
                if load_refused(exc):  # the caller may not load a library: one script per verb
                    self._rendering = rendering.as_eval()
                    return await self._send(args)
        return await self.redis.execute_command(*rendering.again(command))

    def _node_of_call(self, command: tuple[Any, ...]) -> dict[str, Any]:
        """In a cluster, the node that serves the call's first key (FUNCTION LOAD goes there)."""
        get = getattr(self.redis, "get_node_from_key", None)
        if get is None or not command[2]:
            return {}
        return {"target_nodes": get(command[3])}

    async def _run(self, call: proto.Call[T]) -> T:
        try:
            reply = await self._send(call.args)
        except ResponseError as exc:
            proto.raise_mapped(exc, call)
        return call.read(reply)

    async def _pipeline_run(self, calls: list[proto.Call[Any]]) -> list[Any]:
        """Send ``calls`` in one round trip (no transaction); the replies, errors as values."""
        rendering = await self._render()
        pipe = self.redis.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*rendering.command(call.args))
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        for i, reply in enumerate(replies):
            if isinstance(reply, ResponseError) and missing_code(reply):  # nothing ran: again, loading
                try:
                    replies[i] = await self._send(calls[i].args)
                except ResponseError as exc:
                    replies[i] = exc
        return replies

    async def _attempt(self, call: proto.Call[T], timeout: float) -> T:
        """Send ``call`` once and wait at most ``timeout`` seconds (see ``echomq.Client._attempt``)."""
        if not self._bounded():
            return await _timed(lambda _: self._run(call), timeout, str(call.args[0]), own=False)
        reply = (await self._bounded_try([call], timeout, None))[0]
        if isinstance(reply, ResponseError):
            proto.raise_mapped(reply, call)
        return call.read(reply)

    async def _run_request(self, call: proto.Call[T]) -> T:
        """Send a call carrying a REQ, and again after a lost reply only within its window.

        As ``echomq.Client._run_request``: each try is bounded by its timeout
        (``_attempt`` cancels redis-py's own retries at it), and a new try
        starts only within ``proto.RequestWindow``.
        """
        loop = asyncio.get_running_loop()
        window = proto.RequestWindow(loop.time(), proto.socket_timeout_of(self.redis))
        while True:
            try:
                reply = await self._attempt(call, window.try_s)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if never_reached(self.redis, exc, self._reached):
                    error: BaseException = exc
                    break
                pause = window.next_pause(loop.time())
                if pause is None:
                    if isinstance(exc, NotSent):  # the server stayed away: the public type, not ours
                        error = exc
                        break
                    raise
                await asyncio.sleep(pause)
            else:
                self._reached = True
                return reply
        raise unreachable(error) from unwrapped(error)  # outside the handler: chained to its own cause

    async def _attempt_many(
        self,
        calls: list[proto.Call[Any]],
        timeout: float,
        progress: Progress | None = None,
        *,
        lane: bool = False,
    ) -> list[Any]:
        """Send ``calls`` in one round trip, once, within ``timeout`` (see ``echomq.Client._attempt_many``).

        Cancelled at the timeout, the connection is dropped (it may be
        half-open) and the idle ones with it; ``NotSent`` when the time ran
        out before anything was sent, or the connection could not be made.
        ``lane``: a stopping worker's give-back, on the connections kept for
        it (``_attempt.STOP_LANE``).
        """
        if not self._bounded():
            return await _timed(
                lambda _: self._pipeline_run(calls), timeout, f"{len(calls)} calls", own=False
            )
        return await self._bounded_try(calls, timeout, progress, lane)

    async def _bounded_try(
        self, calls: list[proto.Call[Any]], timeout: float, progress: Progress | None, lane: bool = False
    ) -> list[Any]:
        connections = self._connections()
        try:
            return await _timed(
                lambda progress: self._try(connections, calls, progress, lane), timeout, "a try",
                progress=progress,
            )  # fmt: skip
        except NotSent:
            raise
        except (redis.TimeoutError, redis.ConnectionError):
            connections.drop_idle()
            raise

    async def _try(
        self,
        connections: WorkerConnections,
        calls: list[proto.Call[Any]],
        progress: Progress,
        lane: bool = False,
    ) -> list[Any]:
        async with connections.connection(progress, lane) as connection:
            rendering = self._rendering
            if rendering is None:
                (reply,) = await connections.round_trip(connection, [PROBE], progress)
                rendering = self._rendering = Rendering(
                    backend_from_probe(None if isinstance(reply, ResponseError) else reply), self._limits
                )
            commands = [rendering.command(call.args) for call in calls]
            replies = await connections.round_trip(connection, commands, progress)
            if any(_missing(reply) for reply in replies):  # nothing ran: load the scripts here, again
                load = rendering.load()
                if load is not None:
                    (loaded,) = await connections.round_trip(connection, [load], progress)
                    if isinstance(loaded, ResponseError) and load_refused(loaded):
                        rendering = self._rendering = rendering.as_eval()
                again = [i for i, reply in enumerate(replies) if _missing(reply)]
                resend = [rendering.again(rendering.command(calls[i].args)) for i in again]
                for i, reply in zip(
                    again, await connections.round_trip(connection, resend, progress), strict=True
                ):
                    replies[i] = reply
            return replies

    def _bounded(self) -> bool:
        """Whether a worker's commands go through bounded attempts of its own (a plain pooled Redis)."""
        r = self.redis
        return isinstance(r, aioredis.Redis) and getattr(r, "connection", None) is None

    def _waits_cut(self) -> bool:
        """Whether a worker's stop can cut its waiting claim (see ``echomq.Client._waits_cut``):
        bounded attempts, or Redis Cluster, whose connection a cancelled read drops."""
        return self._bounded() or isinstance(self.redis, aioredis.RedisCluster)

    def _wait_limit_ms(self) -> int | None:
        """The longest BLOCK a waiting claim may have (see ``echomq.Client._wait_limit_ms``)."""
        if not isinstance(self.redis, aioredis.RedisCluster):
            return None
        return proto.BlockingClaim(0, proto.socket_timeout_of(self.redis), 0.0).limit_ms

    def _connections(self) -> WorkerConnections:
        if self._pool is None:
            self._pool = WorkerConnections(cast("aioredis.Redis", self.redis).connection_pool)
        return self._pool

    def _reserve(self, n: int, lanes: int = 0) -> None:
        """A worker's share of the bounded attempts' connections (see ``echomq.Client._reserve``).

        ``lanes`` of the ``n`` are kept for its stop's give-backs (``_attempt.STOP_LANE``).
        """
        if self._bounded():
            self._connections().reserve(n, lanes)

    def _unreserve(self, n: int, lanes: int = 0) -> None:
        if self._pool is not None:
            self._pool.unreserve(n, lanes)

    def _distrust(self) -> None:
        """The connections may be half-open (a dead subscription): open fresh ones."""
        if self._pool is not None:
            self._pool.drop_idle()

    def _subscriber(self, confirmations: bool = False) -> Any:
        """A PubSub for a worker's pushed cancels or a result wait: bounded like the worker's attempts
        where they are bounded (a wait then does its own reconnecting, within its deadline)."""
        if self._bounded():
            return self._connections().subscriber(confirmations)
        return self.redis.pubsub(ignore_subscribe_messages=not confirmations)

    async def extend(self, queue: str, job_id: JobId, token: str, lease_ms: int) -> None:
        """Checkpoint the lease (see ``echomq.Client.extend``)."""
        await self._run(proto.extend(queue, job_id, token, lease_ms))

    async def extend_many(
        self, queue: str, jobs: Iterable[tuple[JobId, str]], lease_ms: int
    ) -> list[ExtendOutcome]:
        """Checkpoint many leases in one round trip (see ``echomq.Client.extend_many``)."""
        calls = proto.extend_batch(queue, jobs, lease_ms)
        if not calls:
            return []
        replies = await self._pipeline_run(calls)
        return [proto.extend_outcome(call, reply) for call, reply in zip(calls, replies, strict=True)]

    async def checkpoint(
        self,
        queue: str,
        job_id: JobId,
        token: str,
        lease_ms: int,
        *,
        state: bytes | None = None,
        progress: bytes | str | None = None,
    ) -> Cancellation | None:
        """Extend, store ``state`` and ``progress``, hear of a cancel (see ``echomq.Client.checkpoint``)."""
        return await self._run(proto.checkpoint(queue, job_id, token, lease_ms, state, progress))

    async def sweep(self, queue: str, max_stalled: int = 1, limit: int = 100) -> SweepResult:
        """Recover lapsed jobs (see ``echomq.Client.sweep``)."""
        return await self._run(proto.sweep(queue, max_stalled, limit))

    async def enqueue(
        self,
        queue: str,
        payload: bytes | str = b"",
        job_id: JobId | None = None,
        *,
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
            partition_key: str | bytes | None = None,
    ) -> Enqueued:
        """Add a job, now or delayed, at a priority, unique by a key, in a group, after other
        jobs, to a partition; returns its id as an ``Enqueued`` (see ``echomq.Client.enqueue``)."""
        call = proto.enqueue(
            queue, payload, job_id, delay_ms, run_at_ms, priority, unique_key, unique_for_ms, replace, group,
            after, on_parent_failure, missing_ok,
        )  # fmt: skip
        if (partitioned := await _partitions.lookup(self, queue)) is not None:
            return await _partitions.enqueue(
                self, partitioned, payload, job_id, partition_key, unique_key, group,
                delay_ms=delay_ms, run_at_ms=run_at_ms, priority=priority,
                unique_for_ms=unique_for_ms, replace=replace,
                after=after, on_parent_failure=on_parent_failure, missing_ok=missing_ok,
            )  # fmt: skip
        enqueued: Enqueued = await self._run_request(call)
        await self._register(queue)  # the registry's index (docs/concepts/registry.md)
        return enqueued

    async def enqueue_many(
        self,
        queue: str,
        items: Iterable[EnqueueItem],
        *,
        delay_ms: int | None = None,
        priority: int | None = None,
        group: str | None = None,
        partition_key: str | bytes | None = None,
    ) -> list[str]:
        """Add many jobs in few round trips (see ``echomq.Client.enqueue_many``)."""
        if (partitioned := await _partitions.lookup(self, queue)) is not None:
            return await _partitions.enqueue_many(
                self, partitioned, items, partition_key, delay_ms, priority, group
            )
        ids: list[str] = []
        calls = proto.enqueue_many(queue, items, delay_ms, priority=priority, group=group)
        while calls:
            call = calls.pop(0)
            try:
                added: list[str] = await self._run_request(call)
            except ResponseError as exc:  # emq.max-limit below 10,000: halve, nothing was written
                if not proto.over_max_limit(exc) or int(call.args[3]) < 2:
                    raise
                calls[:0] = proto.enqueue_many_halves(call)
                continue
            ids += added
        if ids:
            await self._register(queue)  # the registry's index (docs/concepts/registry.md)
        return ids

    # -- schedules (echomq/schedules.py holds the rules) -----------------------------

    async def schedule(
        self,
        queue: str,
        name: str,
        *,
        cron: str | None = None,
        every_ms: int | None = None,
        payload: bytes | str = b"",
        tz: str = "UTC",
        start_at: int | datetime | None = None,
        end_at: int | datetime | None = None,
        missed: str = "skip",
    ) -> ScheduleInfo:
        """Add (or replace) the schedule ``name`` of ``queue``: a job on every tick.

        Exactly one of ``cron`` (five fields, or six with seconds first; in
        the time zone ``tz``, an IANA name) and ``every_ms`` (ticks at
        multiples of the period since ``start_at``, or since the epoch).  Each
        tick enqueues one job with ``payload`` and the id ``<name>@<tick ms>``,
        once whatever the number of drivers (every worker's sweep and every
        ``Reaper`` drive their queue's schedules).  No tick before
        ``start_at`` or after ``end_at`` (epoch ms or an aware datetime), none
        before now.  ``missed`` says what a drive does with ticks missed
        while no driver ran (docs/concepts/schedules.md): ``"skip"`` none of
        them, ``"one"`` only the latest, ``"all"`` every one (at most 1,000).
        Replacing a schedule with the same timing keeps its cursor: a tick
        already consumed never runs again (with a new timing, ticks start
        after now).  Raises ``BadSchedule`` (a ``ValueError``) for a bad
        definition, before anything is written.  Returns the stored schedule.
        """
        definition = schedule_rules.define(
            name, cron=cron, every_ms=every_ms, payload=payload, tz=tz,
            start_at=start_at, end_at=end_at, missed=missed,
        )  # fmt: skip
        proto.keys_of(queue)
        info = await _schedules.add(self, queue, definition)
        # the jobs it fires are enqueued by whoever drives it: the queue is registered now
        await self._register(queue)  # (docs/concepts/registry.md)
        return info

    async def unschedule(self, queue: str, name: str) -> bool:
        """Remove the schedule ``name`` of ``queue``; False if there was none.  Jobs it enqueued stay."""
        proto.keys_of(queue)
        return await _schedules.remove(self, queue, name)

    async def schedules(self, queue: str) -> list[ScheduleInfo]:
        """The schedules of ``queue`` (by name): definition, cursor, next ticks, jobs fired."""
        proto.keys_of(queue)
        return await _schedules.listing(self, queue)

    async def drive_schedules(self, queue: str) -> DriveResult:
        """Fire the due ticks of ``queue``'s schedules now; what workers and reapers do on their sweeps.

        Safe to call from any number of processes at once: each tick's job is
        enqueued once.  Returns the ids enqueued and the count of missed
        ticks dropped.
        """
        proto.keys_of(queue)
        return await _schedules.drive(self, queue)

    async def complete(
        self, queue: str, job_id: JobId, token: str, *, result: bytes | str | None = None
    ) -> None:
        """Mark the job done, keeping its ``result`` (see ``echomq.Client.complete``)."""
        await self._run(proto.complete(queue, job_id, token, result))

    async def fail(
        self,
        queue: str,
        job_id: JobId,
        token: str,
        error: str,
        max_attempts: int = 3,
        *,
        delay_ms: int | None = None,
        traceback: str | None = None,
        dead: bool = False,
    ) -> FailOutcome:
        """Report a failure: a retry delay, its traceback, dead at once (see ``echomq.Client.fail``)."""
        return await self._run(
            proto.fail(queue, job_id, token, error, max_attempts, delay_ms, traceback, dead)
        )

    async def release(self, queue: str, job_id: JobId, token: str) -> ReleaseOutcome:
        """Give a held job back without using an attempt (see ``echomq.Client.release``)."""
        return await self._run(proto.release(queue, job_id, token))

    async def cancel(self, queue: str, job_id: JobId, reason: str | None = None) -> CancelOutcome:
        """Request a cancel (see ``echomq.Client.cancel``)."""
        proto.cancel(queue, job_id, reason)  # the arguments, checked before anything is sent
        queue = await _partitions.partition_of(self, queue, job_id)
        return await self._run(proto.cancel(queue, job_id, reason))

    async def result(
        self, queue: str, job_id: JobId, *, timeout: float | None = None, serializer: Any = None
    ) -> Any:
        """Wait for the job's end and return its result's value (see ``echomq.Client.result``)."""
        queue = await _partitions.partition_of(self, queue, job_id)
        return await await_result(self, queue, proto.text(proto.wire(job_id)), timeout, serializer or JSON)

    async def declare_queue(self, queue: str, *, partitions: int) -> None:
        """Declare ``queue`` partitioned, in ``partitions`` queues (see ``echomq.Client.declare_queue``)."""
        await _partitions.declare(self, queue, partitions)

    async def partitions(self, queue: str) -> list[str]:
        """The queues ``queue``'s jobs live in (see ``echomq.Client.partitions``)."""
        partitioned = await _partitions.lookup(self, proto.keys_of(queue).queue)
        return [queue] if partitioned is None else list(partitioned.names)

    async def aclose(self) -> None:
        """Close the redis client's connections (and a worker's own)."""
        if self._pool is not None:
            await self._pool.aclose()
        await self.redis.aclose()


async def _timed(
    attempt: Callable[[Progress], Awaitable[T]],
    timeout: float,
    what: str,
    *,
    own: bool = True,
    progress: Progress | None = None,
) -> T:
    """``attempt(progress)``, at most ``timeout`` seconds: then ``NotSent`` if nothing left, else a timeout.

    Not ``own`` (redis-py's pool and retries): whether anything left is not known, so it may have.
    ``progress``: the caller's, to see how far the try got or stretch it (``Progress.stretch``).
    """
    progress = Progress() if progress is None else progress
    progress.sent = not own
    try:
        if sys.version_info >= (3, 11):  # no task per call, unlike wait_for before 3.12
            async with asyncio.timeout(max(timeout, 0.001)) as progress.timer:
                return await attempt(progress)
        return await asyncio.wait_for(attempt(progress), timeout=max(timeout, 0.001))
    except asyncio.TimeoutError:
        if not progress.sent:
            raise NotSent(f"no free connection for {what} within {timeout:.3f} s") from None
        raise redis.TimeoutError(f"no reply to {what} within {timeout:.3f} s") from None
