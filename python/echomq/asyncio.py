"""echomq for asyncio: the same client API over ``redis.asyncio``, and an async
lease keeper, reaper and worker.

    import echomq.asyncio as emq

    client = emq.Client.from_url("redis://localhost:6379/0")
    await client.enqueue("mail", b'{"to": "ada"}')

    async def handler(ctx: emq.JobContext) -> None:
        await send(ctx.payload)
        await ctx.checkpoint()               # extend the lease; raises Cancelled if cancelled
        ctx.raise_if_cancelled()             # O(1), as in sync code

    await emq.Worker(client, "mail", handler, concurrency=10).run()   # until SIGINT/SIGTERM or stop()

``CancelToken`` is the same class as in sync code: ``await token.wait()``
works from any event loop, and ``cancel()`` from any thread.  The drivers
follow the thread drivers' rules (``_runtime.py``): the same deadline watch
(a handler that blocks the loop still has its token cancelled at the
deadline), the same retries, the same shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar, cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ResponseError

from . import _protocol as proto
from ._log import CURRENT_JOB
from ._protocol import (
    ActiveJob,
    CancelOutcome,
    DeadJob,
    EnqueueItem,
    ExtendOutcome,
    FailOutcome,
    Job,
    JobId,
    JobInfo,
    ObliterateResult,
    PendingJob,
    QueueCounters,
    QueueCounts,
    ReleaseOutcome,
    Retention,
    RetryDeadResult,
    SweepResult,
)
from ._runtime import (
    ATTEMPT_TIMEOUT_S,
    FORCE_AFTER_S,
    Action,
    Backoff,
    ClaimStep,
    ContextCore,
    Finish,
    HeldJob,
    KeeperCore,
    LeaseEvent,
    Progress,
    ReaperCore,
    Trouble,
    WorkerCore,
    state_refused,
    worker_log,
)
from ._scripts import (
    PROBE,
    BackendChoice,
    BackendName,
    ClaimPoll,
    Rendering,
    ScriptLimits,
    backend_from_probe,
    check_backend,
    load_refused,
    missing_code,
)
from ._watch import WATCH
from .cancel import Cancellation, CancelToken
from .client import RETRIES, RETRY_CAP_S, RETRY_FIRST_S, _missing, check_redis_client, connection_defaults
from .errors import BadArgument, EchoMQError, JobGone, LeaseLost, NotReplicated

__all__ = ["AsyncHandler", "Client", "JobContext", "LeaseKeeper", "Reaper", "Worker"]

T = TypeVar("T")

# How long a forced stop waits for the jobs still held to be given back, then
# for the worker's tasks to end, before it cancels them.
FORCE_BUDGET_S = 0.4
# How long the cancel listener waits for a message before it looks again.
CANCEL_POLL_S = 0.2


class Client:
    """``echomq.Client`` for asyncio; every method is a coroutine with the same contract.

    ``backend`` and ``script_limits`` as for ``echomq.Client``.  With ``"auto"``
    the server is asked at the first command (or ``await
    client.detect_backend()``); ``client.backend`` is known from then on.
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
        kwargs.setdefault(
            "retry",
            AsyncRetry(
                ExponentialWithJitterBackoff(base=RETRY_FIRST_S, cap=RETRY_CAP_S),
                RETRIES,
                supported_errors=(redis.ConnectionError, redis.TimeoutError),
            ),
        )
        options = connection_defaults(kwargs)
        if cluster:
            return cls(aioredis.RedisCluster.from_url(url, **options), backend, script_limits=script_limits)
        return cls(aioredis.Redis.from_url(url, **options), backend, script_limits=script_limits)

    @property
    def backend(self) -> BackendName:
        """``"module"`` or ``"scripts"``; with "auto", known once a command ran (or ``detect_backend``).

        Raises RuntimeError before that: a property cannot await the server.
        """
        if self._rendering is None:
            raise RuntimeError("the backend is not known yet: await client.detect_backend() first")
        return self._rendering.name

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
        """Send ``call`` and wait at most ``timeout`` seconds (see ``echomq.Client._attempt``).

        Cancelled at the timeout, redis-py drops the connection the command
        was on (it may be half-open); the next attempt uses a fresh one.
        """
        try:
            if sys.version_info >= (3, 11):  # no task per call, unlike wait_for before 3.12
                async with asyncio.timeout(max(timeout, 0.001)):
                    return await self._run(call)
            return await asyncio.wait_for(self._run(call), timeout=max(timeout, 0.001))
        except asyncio.TimeoutError:
            raise redis.TimeoutError(f"no reply to {call.args[0]} within {timeout:.3f} s") from None

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
                return await self._attempt(call, window.try_s)
            except (redis.ConnectionError, redis.TimeoutError):
                pause = window.next_pause(loop.time())
                if pause is None:
                    raise
                await asyncio.sleep(pause)

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
        self, queue: str, job_id: JobId, token: str, lease_ms: int, *, state: bytes | None = None
    ) -> Cancellation | None:
        """Extend, store ``state``, and learn of a remote cancel (see ``echomq.Client.checkpoint``)."""
        return await self._run(proto.checkpoint(queue, job_id, token, lease_ms, state))

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
    ) -> str:
        """Add a job, now or delayed; returns its id (see ``echomq.Client.enqueue``)."""
        return await self._run_request(proto.enqueue(queue, payload, job_id, delay_ms, run_at_ms))

    async def enqueue_many(
        self, queue: str, items: Iterable[EnqueueItem], *, delay_ms: int | None = None
    ) -> list[str]:
        """Add many jobs in few round trips (see ``echomq.Client.enqueue_many``)."""
        ids: list[str] = []
        calls = proto.enqueue_many(queue, items, delay_ms)
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
        return ids

    async def _claim(
        self,
        queue: str,
        lease_ms: int,
        count: int,
        block_ms: int | None,
        wait: proto.ReplicaWait | None = None,
    ) -> list[Job]:
        if wait is not None:
            await self._check_wait(wait)
        jobs = await self._claim_jobs(queue, lease_ms, count, block_ms)
        return jobs if wait is None else await self._wait_for_replicas(jobs, lease_ms, wait)

    async def _claim_jobs(self, queue: str, lease_ms: int, count: int, block_ms: int | None) -> list[Job]:
        if block_ms is None:
            return await self._run(proto.claim(queue, lease_ms, count))
        if (await self._render()).name == "scripts":  # a script cannot wait: poll, with backoff
            poll = ClaimPoll(block_ms, time.monotonic())
            proto.claim(queue, lease_ms, count, block_ms)  # the arguments, checked before anything is sent
            while not (jobs := await self._run(proto.claim(queue, lease_ms, count))):
                if (pause := poll.next_pause(time.monotonic())) is None:
                    break
                await asyncio.sleep(pause)
            return jobs
        plan = proto.BlockingClaim(block_ms, proto.socket_timeout_of(self.redis), time.monotonic())
        proto.claim(queue, lease_ms, count)  # the arguments, checked before anything is sent
        while (wait := plan.next_wait(time.monotonic())) is not None:
            sent = time.monotonic()
            jobs = await self._run(proto.claim(queue, lease_ms, count, wait))
            if jobs or plan.ended(wait, sent, time.monotonic()):
                return jobs
        return []

    async def claim(
        self,
        queue: str,
        lease_ms: int,
        *,
        block_ms: int | None = None,
        replicas: int = 0,
        replicas_timeout_ms: int = 1000,
        replicas_aof: bool = False,
    ) -> Job | None:
        """Take the next pending job, waiting up to ``block_ms`` for one (see ``echomq.Client.claim``).

        The token is a ``str``, ``"<attempts>-<16 hex digits>"``.  With
        ``replicas=N``: returned once N replicas acknowledged the claim,
        else given back and ``NotReplicated`` (see ``echomq.Client.claim``).
        """
        wait = proto.replica_wait(replicas, replicas_timeout_ms, replicas_aof)
        jobs = await self._claim(queue, lease_ms, 1, block_ms, wait)
        return jobs[0] if jobs else None

    async def claim_many(
        self,
        queue: str,
        lease_ms: int,
        count: int,
        *,
        block_ms: int | None = None,
        replicas: int = 0,
        replicas_timeout_ms: int = 1000,
        replicas_aof: bool = False,
    ) -> list[Job]:
        """Take up to ``count`` jobs in one round trip (see ``echomq.Client.claim_many``)."""
        wait = proto.replica_wait(replicas, replicas_timeout_ms, replicas_aof)
        return await self._claim(queue, lease_ms, count, block_ms, wait)

    async def _check_wait(self, wait: proto.ReplicaWait) -> None:
        """Before anything is claimed: a client and a server that can wait as asked."""
        if not isinstance(self.redis, aioredis.Redis):
            raise ValueError("replicas= needs a redis.asyncio.Redis client (a master with replicas)")
        proto.check_wait_fits(wait, proto.socket_timeout_of(self.redis))
        if wait.aof:
            if self._waitaof is None:
                try:
                    await self.redis.execute_command(*proto.waitaof_probe())  # type: ignore[no-untyped-call]
                    self._waitaof = True
                except ResponseError as exc:
                    if not proto.probe_says_no_waitaof(exc):
                        raise
                    self._waitaof = False
            if not self._waitaof:
                raise proto.no_waitaof()

    async def _wait_for_replicas(self, jobs: list[Job], lease_ms: int, wait: proto.ReplicaWait) -> list[Job]:
        """The claimed ``jobs`` once replicas have them (see ``echomq.Client._wait_for_replicas``)."""
        if not jobs:
            return jobs
        held, acked, cause = list(jobs), 0, None
        try:
            for past_ms in (1, 2):  # 2: again, past the extension that loaded the script
                calls = proto.held_extensions(jobs, lease_ms, past_ms)
                rendering = await self._render()
                pipe = self.redis.pipeline(transaction=False)
                for call in calls:
                    pipe.execute_command(*rendering.command(call.args))
                for line in wait.commands():
                    pipe.execute_command(*line)
                replies = await pipe.execute(raise_on_error=False)
                missing = [c for c, r in zip(calls, replies, strict=False) if _missing(r)]
                if not missing:
                    break
                await self._send(missing[0].args)  # nothing ran: load the script (it extends), again
            held = proto.still_held(jobs, calls, replies[: len(calls)])
            acked = wait.acked(replies[len(calls) :])
        except (redis.RedisError, EchoMQError) as exc:  # the wait failed (a dead master, a demoted one)
            cause = exc
        if cause is None and acked >= wait.replicas:
            return held
        released = []
        for job in held:
            try:
                await self.release(job.queue, job.id, job.token)
                released.append(job.id)
            except (LeaseLost, redis.RedisError):  # left to its lease (and the reaper)
                pass
        raise NotReplicated(
            f"{acked} of {wait.replicas} replicas acknowledged the claim within {wait.timeout_ms} ms"
            + (f" ({type(cause).__name__}: {cause})" if cause is not None else "")
            + f"; given back: {released}",
            [job.id for job in held],
            released,
            acked,
            wait.replicas,
        ) from cause

    async def complete(self, queue: str, job_id: JobId, token: str) -> None:
        """Mark the job done (see ``echomq.Client.complete``)."""
        await self._run(proto.complete(queue, job_id, token))

    async def fail(
        self,
        queue: str,
        job_id: JobId,
        token: str,
        error: str,
        max_attempts: int = 3,
        *,
        delay_ms: int | None = None,
    ) -> FailOutcome:
        """Report a failure, with an optional retry delay (see ``echomq.Client.fail``)."""
        return await self._run(proto.fail(queue, job_id, token, error, max_attempts, delay_ms))

    async def release(self, queue: str, job_id: JobId, token: str) -> ReleaseOutcome:
        """Give a held job back without using an attempt (see ``echomq.Client.release``)."""
        return await self._run(proto.release(queue, job_id, token))

    async def cancel(self, queue: str, job_id: JobId, reason: str | None = None) -> CancelOutcome:
        """Request a cancel (see ``echomq.Client.cancel``)."""
        return await self._run(proto.cancel(queue, job_id, reason))

    # -- the operator's verbs ------------------------------------------------

    def _node_of(self, key: str) -> dict[str, Any]:
        if hasattr(self.redis, "get_node_from_key"):
            return {"target_nodes": self.redis.get_node_from_key(key)}
        return {}

    async def _server_time(self, key: str) -> int:
        return proto.server_ms(await self.redis.execute_command("TIME", **self._node_of(key)))

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
        return await self._read(proto.job_info(queue, job_id, payload))

    async def counts(self, queue: str) -> QueueCounts:
        """The queue's numbers (see ``echomq.Client.counts``)."""
        return await self._read(proto.counts(queue))

    async def dead(self, queue: str, *, offset: int = 0, count: int = 100) -> list[DeadJob]:
        """A page of the dead set, oldest first (see ``echomq.Client.dead``)."""
        page = await self._read(proto.dead_page(queue, offset, count))
        return await self._read(proto.dead_rows(queue, page)) if page else []

    async def active(self, queue: str, *, offset: int = 0, count: int = 100) -> list[ActiveJob]:
        """A page of the active set, soonest deadline first (see ``echomq.Client.active``)."""
        page = await self._read(proto.active_page(queue, offset, count))
        return await self._read(proto.active_rows(queue, page)) if page else []

    async def pending(self, queue: str, *, offset: int = 0, count: int = 100) -> list[PendingJob]:
        """A page of the pending set, in claim order (see ``echomq.Client.pending``)."""
        page = await self._read(proto.pending_page(queue, offset, count))
        return await self._read(proto.pending_rows(queue, page)) if page else []

    async def counters(self, queue: str) -> QueueCounters:
        """The queue's shared counters (see ``echomq.Client.counters``)."""
        return await self._read(proto.counters(queue))

    async def queues(self, *, limit: int = 100, scan_budget: int = 100_000) -> list[str]:
        """The queues that have jobs, by a bounded SCAN (see ``echomq.Client.queues``)."""
        proto.positive_int("limit", limit)
        proto.positive_int("scan_budget", scan_budget)
        found: set[str] = set()
        step = min(1000, scan_budget)
        nodes = self.redis.get_primaries() if hasattr(self.redis, "get_primaries") else [None]
        for node in nodes:
            target = {} if node is None else {"target_nodes": node}
            cursor, examined = 0, 0
            while True:
                reply = await self.redis.execute_command(*proto.scan_queues(cursor, step), **target)
                cursor, keys = proto.scan_reply(reply)
                found.update(q for q in map(proto.queue_of_key, keys) if q is not None)
                examined += step
                if cursor == 0 or examined >= scan_budget or len(found) >= limit:
                    break
        return sorted(found)[:limit]

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

    async def obliterate(self, queue: str, *, force: bool = False, limit: int = 100) -> ObliterateResult:
        """Delete the queue in bounded steps (see ``echomq.Client.obliterate``)."""
        removed = 0
        while True:
            (step, remaining), limit = await self._within_max_limit(
                lambda n: proto.obliterate(queue, n, force), limit
            )
            removed += step
            if remaining == 0:
                break
        forgotten, cursor = 0, 0
        target = self._node_of(proto.keys_of(queue).pending)
        while True:
            reply = await self.redis.execute_command(*proto.scan_rows(queue, cursor, limit), **target)
            cursor, found = proto.scan_reply(reply)
            for call in proto.forget_steps(queue, [proto.row_id(queue, k) for k in found], limit):
                forgotten += await self._run(call)
            if cursor == 0:
                await self.redis.delete(proto.counters_key(queue))  # the shared counters (echomq.metrics)
                return ObliterateResult(removed, forgotten)

    async def aclose(self) -> None:
        """Close the redis client's connections."""
        await self.redis.aclose()


async def _wait(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds (None: no bound); True if it is set."""
    if event.is_set():
        return True
    try:
        if sys.version_info >= (3, 11):  # no task per wait, unlike wait_for before 3.12
            async with asyncio.timeout(timeout):
                await event.wait()
        else:
            await asyncio.wait_for(event.wait(), timeout=timeout)
    except asyncio.TimeoutError:
        return False
    return True


async def _within(awaitable: Awaitable[T], timeout: float) -> T:
    """``await awaitable``, at most ``timeout`` seconds (else asyncio.TimeoutError)."""
    if sys.version_info >= (3, 11):  # no task per call, unlike wait_for before 3.12
        async with asyncio.timeout(timeout):
            return await awaitable
    return await asyncio.wait_for(awaitable, timeout=timeout)


class LeaseKeeper(KeeperCore[Client]):
    """Async context manager: checkpoint ``job`` every ``interval`` while the block runs.

    The same arguments, attributes and rules as ``echomq.LeaseKeeper``:
    ``cancel`` is cancelled with a reason when the lease is lost (stale,
    gone, or no checkpoint confirmed before the deadline) and, with
    ``deliver_cancel``, with a remote cancel's reason.  ``claimed_at`` is on
    ``clock`` (``time.monotonic``, which is also the default event loop's
    clock).  The deadline is watched from a thread (``_watch.py``): a
    handler that blocks the event loop past the lease has its token
    cancelled at the deadline all the same.  A checkpoint's answer is
    awaited at most an interval; ``stop()`` cancels one in flight.
    """

    _client_type = Client

    def _init_driver(self) -> None:
        # A thread lock, held only between awaits: the deadline watch thread
        # updates the HeldJob too.
        self._lock = threading.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[Any] | None = None
        self._sending = False
        self._shared: _Keepers | None = None  # a worker's one keeper task checkpoints this job

    async def __aenter__(self) -> LeaseKeeper:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def start(self) -> None:
        """Start checkpointing in a task of the running loop (and watching the deadline)."""
        WATCH.add(self._held, self._lock, self._clock)
        if self._shared is not None:
            self._shared.add(self)
            return
        self._task = asyncio.create_task(self._run(), name=f"echomq-lease-{self.job.id}")

    async def stop(self) -> None:
        """Stop checkpointing, cancel a checkpoint in flight, then look at the deadline a last time."""
        with self._lock:
            self._held.stop()
        self._stop.set()
        if self._shared is not None:
            self._shared.discard(self)
        task = self._task
        try:
            if task is not None:
                if self._sending:  # its answer can no longer change anything
                    task.cancel()
                await asyncio.wait([task])
        finally:
            if task is not None and not task.done():  # stop() itself was cancelled
                task.cancel()
            WATCH.remove(self._held)
            with self._lock:
                self._held.expire(self._clock())

    async def checkpoint(self, state: bytes | None = None) -> Cancellation | None:
        """Checkpoint now, storing ``state`` if given (see ``echomq.LeaseKeeper.checkpoint``)."""
        return (await self._checkpoint(own=False, state=state))[1]

    async def _store(self, state: bytes | None) -> bool:
        """A handler's checkpoint: True when the server confirmed it (and stored ``state``, if given)."""
        return (await self._checkpoint(own=False, state=state))[0]

    async def _confirm(self, timeout: float) -> bool:
        """Before ``start()``: one checkpoint for a claim answered late (see ``echomq.LeaseKeeper``)."""
        sent = self._clock()
        job = self.job
        try:
            call = proto.checkpoint(job.queue, job.id, job.token, self.lease_ms)
            requested = await self.client._attempt(call, timeout)
        except Exception as exc:
            self._confirm_failed(exc)
            return False
        self._confirmed(sent, requested)
        return True

    async def _run(self) -> None:
        while True:
            with self._lock:
                wait = self._held.wait_before_checkpoint(self._clock())
            if wait is None or await _wait(self._stop, wait):
                return
            with self._lock:
                due = self._held.checkpoint_due(self._clock())
            if due:
                await self._checkpoint(own=True)

    async def _checkpoint(
        self, *, own: bool, state: bytes | None = None
    ) -> tuple[bool, Cancellation | None]:
        """One checkpoint: (confirmed, the cancel it delivered); as ``echomq.LeaseKeeper``'s."""
        with self._lock:
            sent = self._clock()
            timeout = self._held.checkpoint_timeout(sent)
        call = self._checkpoint_call(state)
        self._sending = own
        try:
            requested = await self.client._attempt(call, timeout)
        except BadArgument as exc:
            if state is not None:  # a state past emq.max-state-bytes: the handler's to fix; nothing written
                raise
            return self._failed(exc)
        except Exception as exc:
            if state is not None and state_refused(exc):  # past maxmemory: keep the lease without it
                self._state_not_stored(exc)
                self._sending = False
                return False, (await self._checkpoint(own=own))[1]
            return self._failed(exc)
        finally:
            self._sending = False
        requested = requested if self.deliver_cancel else None
        with self._lock:
            self._held.confirmed(sent, self._clock(), requested)
        self._troubles.healed()
        return True, requested

    def _failed(self, exc: BaseException) -> tuple[bool, None]:
        with self._lock:
            event = self._held.failed(exc, self._clock())
        if event is LeaseEvent.RETRY:
            self._troubles.report(exc, "checkpoint", self.job)
        return False, None


class _Keepers:
    """One task that checkpoints every job a worker holds, instead of a task per job.

    Each held job keeps its ``LeaseKeeper`` (the handler's ``checkpoint()``,
    the rules, ``stop()``); this task only wakes when the earliest held job
    is due and starts that job's checkpoint, as the keeper's own task would
    have (``stop()`` cancels one in flight the same way).  A worker that runs
    a thousand short jobs a second starts no task for them.
    """

    def __init__(self) -> None:
        self._keepers: dict[LeaseKeeper, None] = {}
        self._by_id: dict[str, LeaseKeeper] = {}  # for a pushed cancel: the job's keeper
        self._wake = asyncio.Event()
        self._wakes_at = math.inf
        self._task: asyncio.Task[None] | None = None
        self._pushes: set[asyncio.Task[Any]] = set()

    def add(self, keeper: LeaseKeeper) -> None:
        self._keepers[keeper] = None
        self._by_id[keeper.job.id] = keeper
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="echomq-lease-keeper")
        elif keeper._held.next_checkpoint < self._wakes_at:
            self._wake.set()

    def discard(self, keeper: LeaseKeeper) -> None:
        self._keepers.pop(keeper, None)
        if self._by_id.get(keeper.job.id) is keeper:
            del self._by_id[keeper.job.id]

    def pushed(self, job_id: str) -> bool:
        """A cancel of ``job_id`` was published: checkpoint it now (which delivers the reason).

        False when this worker does not hold the job.  The checkpoint runs in
        a task of its own, so the listener goes on reading.
        """
        keeper = self._by_id.get(job_id)
        if keeper is None:
            return False
        task = asyncio.create_task(keeper.checkpoint(), name=f"echomq-cancel-{job_id}")
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)
        return True

    async def close(self) -> None:
        task, self._task = self._task, None
        tasks = [t for t in [task, *self._pushes] if t is not None and not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _run(self) -> None:
        while True:
            wait: float | None = None
            for keeper in list(self._keepers):
                with keeper._lock:
                    now = keeper._clock()
                    left = keeper._held.wait_before_checkpoint(now)
                if left is None:
                    continue
                if left <= 0.0 and (keeper._task is None or keeper._task.done()):
                    keeper._task = asyncio.create_task(
                        keeper._checkpoint(own=True), name=f"echomq-lease-{keeper.job.id}"
                    )
                    left = keeper._held.interval
                wait = left if wait is None else min(wait, left)
            self._wakes_at = math.inf if wait is None else time.monotonic() + wait
            await _wait(self._wake, wait)
            self._wake.clear()
            self._wakes_at = -math.inf


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A caller that gave up waiting leaves its answer unread: read it, so asyncio does not warn."""
    if not future.cancelled():
        future.exception()


class _Coalescer:
    """Calls sent at about the same time go out together: one pipeline, one round trip.

    A worker's tasks finish jobs at about the same time; while one batch is
    on the wire the next one gathers, so a busy worker sends its COMPLETEs
    (and the like) in a few round trips instead of one each.  Each call
    keeps its own answer and its own error; each caller keeps its own
    retries and deadline (the verbs sent this way are safe to send again).
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self._waiting: list[tuple[proto.Call[Any], asyncio.Future[Any], float]] = []
        self._flushing = False
        self._task: asyncio.Task[None] | None = None

    async def attempt(self, call: proto.Call[T], timeout: float) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)
        self._waiting.append((call, future, timeout))
        if not self._flushing:  # the task starts next turn: calls made this turn join the batch
            self._flushing = True
            self._task = asyncio.create_task(self._flush(), name="echomq-send-together")
        try:
            return await _within(asyncio.shield(future), max(timeout, 0.001))
        except asyncio.TimeoutError:
            raise redis.TimeoutError(f"no reply to {call.args[0]} within {timeout:.3f} s") from None

    async def _flush(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                live = [(c, f, t) for c, f, t in batch if not f.done()]
                if not live:
                    continue
                calls = [c for c, _, _ in live]
                try:
                    replies = await _within(self.client._pipeline_run(calls), max(t for _, _, t in live))
                except asyncio.CancelledError:
                    for _, future, _ in live:
                        future.cancel()
                    raise
                except Exception as exc:
                    if isinstance(exc, asyncio.TimeoutError):
                        exc = redis.TimeoutError(f"no reply to a batch of {len(calls)} calls")
                    for _, future, _ in live:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (call, future, _), reply in zip(live, replies, strict=True):
                    if future.done():
                        continue
                    try:
                        if isinstance(reply, ResponseError):
                            proto.raise_mapped(reply, call)
                        future.set_result(call.read(reply))
                    except Exception as exc:
                        future.set_exception(exc)
        finally:
            self._flushing = False


class JobContext(ContextCore[LeaseKeeper]):
    """``echomq.JobContext`` for asyncio handlers: the same, with ``await ctx.checkpoint(...)``
    and ``await ctx.checkpoint_step(...)``; ``resume_state`` and ``resume_point`` are properties."""

    __slots__ = ()

    async def checkpoint(self, state: bytes | None = None) -> bool:
        """Extend the lease (storing ``state``); raise ``Cancelled`` if the job is cancelled.

        See ``echomq.JobContext.checkpoint``: True when the server confirmed it.
        """
        stored = await self._keeper._store(state)
        self.cancel.raise_if_cancelled()
        return stored

    async def checkpoint_step(self, step: int, data: dict[str, Any] | None = None) -> bool:
        """Store ``Progress(step, data)`` as the job's state (see ``echomq.JobContext.checkpoint_step``)."""
        return await self.checkpoint(Progress(step, {} if data is None else data).encode())


AsyncHandler = Callable[[JobContext], Awaitable[object]] | Callable[[Job, CancelToken], Awaitable[object]]


class Reaper(ReaperCore[Client]):
    """Sweep ``queue`` every ``interval`` seconds in a task.

    The same arguments, attributes and tick as ``echomq.Reaper``
    (``on_sweep`` is a plain function, called in the loop).
    """

    _client_type = Client

    def _init_driver(self) -> None:
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def sweep_once(self) -> SweepResult:
        """Sweep until nothing lapsed is left (bounded); returns everything it did."""
        tick = self._tick()
        while tick.wants_more():
            tick.add(await self.client.sweep(self.queue, max_stalled=self.max_stalled, limit=self.limit))
        return self._swept(tick)

    async def run(self) -> None:
        """Sweep every ``interval`` until ``stop()``; errors are counted, logged once, and retried."""
        while True:
            try:
                await self.sweep_once()
            except Exception as exc:
                self._sweep_failed(exc)
            if await _wait(self._stop, self.interval):
                return

    def start(self) -> Reaper:
        """Run in a task of the running loop; returns at once."""
        self._stop.clear()
        self._task = asyncio.create_task(self.run(), name=f"echomq-reaper-{self.queue}")
        return self

    async def stop(self) -> None:
        """Stop, and wait for a sweep in flight to end."""
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def __aenter__(self) -> Reaper:
        return self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


class _GaveUp(Exception):
    """A command could not be sent before its deadline (or a forced stop); the last error is the cause."""


class Worker(WorkerCore[Client, AsyncHandler]):
    """Runs ``await handler(ctx)`` for ``queue``'s jobs, ``concurrency`` at a time, as tasks.

    The same arguments, attributes and rules as ``echomq.Worker`` (a
    handler taking two arguments gets ``(job, cancel_token)``).  A
    CancelledError a handler raises by itself is its job's failure;
    cancelling ``run()`` stops the worker at once (the
    jobs held are given back, every task it made ends) and then lets the
    cancellation through.  ``stop()`` is a plain function (a handler or a
    signal handler can call it, from any thread): it stops claiming and
    starts the grace period; ``await run()``, or leave ``async with
    worker:``, to wait for the end.
    """

    _client_type = Client

    def _check_handler(self, handler: object) -> None:
        call = getattr(handler, "__call__", None)  # noqa: B004 (a callable object's own method)
        if not (inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)):
            raise TypeError(
                "handler must be a coroutine function (async def); run a plain one with echomq.Worker"
            )

    def _init_driver(self) -> None:
        self._started = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._wake: asyncio.Event | None = None  # the supervisor looks again
        self._stopping: asyncio.Event | None = None  # idle tasks look again
        self._forced_event: asyncio.Event | None = None
        self._force_pending = False
        self._loops: list[asyncio.Task[None]] = []
        self._handlers: dict[HeldJob, asyncio.Task[Any]] = {}  # the task running each handler
        self._keepers = _Keepers()  # one task keeps every held job's lease
        self._listener: asyncio.Task[None] | None = None  # pushed cancels (<base>cancel)
        self._listening = True
        self._coalescer = _Coalescer(self.client)  # jobs' ends go out together
        self._complete_claim = True  # EMQ.COMPLETECLAIM: a runner's COMPLETE claims its next job
        # claimed (job, when, whether before any stop), for the runners
        self._jobs: asyncio.Queue[tuple[Job, float, bool] | None] | None = None
        self._free = 0  # runners neither running a job nor about to
        self._slot: asyncio.Event | None = None  # set when a runner becomes free

    # -- control ---------------------------------------------------------------

    async def run(self, *, handle_signals: bool = True) -> None:
        """Work with ``concurrency`` tasks until ``stop()``, SIGINT or SIGTERM (see ``echomq.Worker.run``)."""
        await self._run(handle_signals)
        if self._interrupt is not None:
            raise self._interrupt

    def start(self) -> Worker:
        """Work in a task of the running loop; returns at once."""
        self._task = asyncio.create_task(self._run(False), name=f"echomq-worker-{self.queue}")
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop claiming now; handlers get ``grace`` seconds (default: the worker's), then "shutdown".

        Only asks: ``await run()`` or leaving ``async with`` waits.  Safe
        from any thread; before ``run()``, the worker never starts.
        """
        self._request_stop(time.monotonic(), grace)
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if threading.get_ident() == self._loop_thread:
            self._poke()
        else:
            loop.call_soon_threadsafe(self._poke)

    async def __aenter__(self) -> Worker:
        return self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        task = self._task
        if task is None:
            return
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():  # we were cancelled while waiting: so is the worker, at once
                task.cancel()
                await asyncio.wait([task])
            raise

    def _poke(self) -> None:
        for event in (self._wake, self._stopping, self._slot):
            if event is not None:
                event.set()

    async def _run(self, handle_signals: bool) -> None:
        if self._started:
            raise RuntimeError("this worker has already run; make a new one")
        if self.replica_wait is not None:  # a server that can wait as asked, before anything is claimed
            await self.client._check_wait(self.replica_wait)
        self._started = True
        if self._stop_requested:  # stop() came first: never start
            return
        loop = self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake, self._stopping, self._forced_event = asyncio.Event(), asyncio.Event(), asyncio.Event()
        WATCH.retain()
        restore = self._install_signals(loop) if handle_signals else None
        try:
            self._jobs, self._slot, self._free = asyncio.Queue(), asyncio.Event(), self.concurrency
            self._loops = [
                asyncio.create_task(self._runner(), name=f"echomq-worker-{self.queue}-{n}")
                for n in range(self.concurrency)
            ]
            claimer = asyncio.create_task(self._claim_loop(), name=f"echomq-worker-{self.queue}-claim")
            self._loops.append(claimer)
            self._listener = asyncio.create_task(
                self._listen_for_cancels(), name=f"echomq-worker-{self.queue}-cancels"
            )
            try:
                await self._supervise()
            except asyncio.CancelledError:
                # run() itself was cancelled: stop at once, give back what is held,
                # end every task we made, then let the cancellation through.
                await self._force_stop()
                raise
        finally:
            if restore is not None:
                restore()
            left = [t for t in self._loops if not t.done()]
            for t in left:
                t.cancel()
            if left:
                await asyncio.wait(left)
            if self._listener is not None:
                # It looks up every CANCEL_POLL_S (redis-py's pub/sub read does not
                # always end when its task is cancelled); a cancel only if it hangs.
                self._listening = False
                _, late = await asyncio.wait([self._listener], timeout=CANCEL_POLL_S + 1.0)
                for t in late:
                    t.cancel()
            await self._keepers.close()
            WATCH.release()
            self._stopped()

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        previous: dict[int, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, self._signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # no signals on this loop or platform
                continue
            previous[sig] = handler

        def restore() -> None:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                if handler is not None:  # asyncio.run()'s own SIGINT handler, for one
                    signal.signal(sig, handler)

        return restore

    def _signal(self, signum: int) -> None:
        if self._on_signal(signum, time.monotonic()):
            self._force_pending = True
        self._poke()

    async def _supervise(self) -> None:
        assert self._wake is not None
        while True:
            wait = self._shutdown_tick(time.monotonic())
            if self._force_pending or wait == 0.0:
                await self._force_stop()
                return
            if all(t.done() for t in self._loops):
                return
            if self._stop_requested and self._stopping is not None:
                self._stopping.set()  # idle tasks stop waiting for their next poll
            await _wait(self._wake, wait)
            self._wake.clear()

    async def _force_stop(self) -> None:
        """Stop at once: cancel the handlers still running, give their jobs back, end every task."""
        stuck = self._force()
        assert self._forced_event is not None
        self._forced_event.set()
        self._poke()
        for held in stuck:
            task = self._handlers.get(held)
            if task is not None:
                task.cancel()
        until = time.monotonic() + FORCE_BUDGET_S
        give_back = [asyncio.create_task(self._give_back(h, until), name="echomq-give-back") for h in stuck]
        if give_back:
            await asyncio.wait(give_back, timeout=FORCE_BUDGET_S + FORCE_AFTER_S / 2)
        pending: set[asyncio.Task[None]] = set()
        if self._loops:
            _, pending = await asyncio.wait(self._loops, timeout=FORCE_AFTER_S / 2)
        for t in [*pending, *give_back]:
            if not t.done():
                t.cancel()
        rest = [t for t in [*pending, *give_back] if not t.done()]
        if rest:
            await asyncio.wait(rest)

    # -- pushed cancels ----------------------------------------------------------

    async def _listen_for_cancels(self) -> None:
        """Subscribe to ``<base>cancel`` (see ``echomq.Worker._listen_for_cancels``) until the worker ends."""
        channel = proto.keys_of(self.queue).base + "cancel"
        pubsub: Any = None
        try:
            while self._listening:
                try:
                    if pubsub is None:
                        pubsub = self.client.redis.pubsub(ignore_subscribe_messages=True)
                        await pubsub.subscribe(channel)
                    message = await pubsub.get_message(timeout=CANCEL_POLL_S)
                    if message is not None and message.get("type") == "message":
                        self._keepers.pushed(proto.text(message["data"]))
                except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
                    raise
                except Exception as exc:  # the checkpoints deliver meanwhile; subscribe again soon
                    worker_log.debug("worker of %r: cancel subscription: %r", self.queue, exc)
                    if pubsub is not None:
                        with contextlib.suppress(Exception):
                            await pubsub.aclose()
                    pubsub = None
                    if self._listening:
                        await asyncio.sleep(CANCEL_POLL_S)
        finally:
            if pubsub is not None:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    # -- a worker task -----------------------------------------------------------

    async def _claim_loop(self) -> None:
        """The one claimer: as many jobs in one CLAIM as runners are free, handed to them.

        A busy worker claims in batches (COUNT = its free runners), so a
        claim costs a fraction of a command per job; an idle one waits on
        the server (BLOCK) as before.
        """
        assert self._stopping is not None and self._wake is not None
        assert self._jobs is not None and self._slot is not None
        pause, step = Backoff(), ClaimStep()
        try:
            while not self._stop_requested:
                if self._free <= 0:
                    self._slot.clear()
                    await self._slot.wait()
                    continue
                try:
                    jobs, claimed_at = await self._claim(step, count=self._free)
                except _GaveUp:
                    await _wait(self._stopping, pause.next_wait(time.monotonic()) or self.poll_interval)
                    continue
                except Exception as exc:  # a bug, not the server: logged once, and the loop goes on
                    self._trouble(exc, "claim")
                    await _wait(self._stopping, self.poll_interval)
                    continue
                pause = Backoff()
                jobs = await self._replicated(jobs)
                if not jobs:  # the claim waited on the server; the rest of poll_interval here
                    rest = self.poll_interval - (time.monotonic() - claimed_at)
                    if rest > 0.001:
                        await _wait(self._stopping, rest)
                    continue
                self._free -= len(jobs)
                landed = not self._stop_requested  # answered before any stop: they run
                for job in jobs:
                    self._jobs.put_nowait((job, claimed_at, landed))
        finally:
            for _ in range(self.concurrency):  # the runners give back what is queued, then end
                self._jobs.put_nowait(None)
            self._wake.set()

    async def _runner(self) -> None:
        """One of ``concurrency`` tasks: run the jobs the claimer hands over, one at a time."""
        assert self._jobs is not None and self._slot is not None and self._wake is not None
        try:
            while (item := await self._jobs.get()) is not None:
                # A job's end may bring the next jobs (EMQ.COMPLETECLAIM): this
                # runner runs them before it is free for the claimer again.
                chain: list[tuple[Job, float, bool]] = [item]
                try:
                    while chain:
                        job, claimed_at, landed = chain.pop(0)
                        try:
                            chain += await self._process(job, claimed_at, chain=not chain, landed=landed)
                        except Exception as exc:  # a bug of ours: logged once with its traceback
                            self._trouble(exc, "processing a job", job)
                finally:
                    self._free += 1
                    self._slot.set()
        finally:
            self._wake.set()

    async def _replicated(self, jobs: list[Job], *, loop: bool = True) -> list[Job]:
        """With ``replicas=``: the jobs once replicas have them (see ``echomq.Worker._replicated``)."""
        if self.replica_wait is None or not jobs:
            return jobs
        try:
            return await self.client._wait_for_replicas(jobs, self.lease_ms, self.replica_wait)
        except NotReplicated as exc:
            self._not_replicated(exc)
            if not loop:
                raise
            assert self._stopping is not None
            await _wait(self._stopping, self.poll_interval)
            return []

    async def work_one(self) -> bool:
        """Claim and process one job; False when the queue had none (see ``echomq.Worker.work_one``)."""
        try:
            jobs, claimed_at = await self._claim(wait=False)
        except _GaveUp as exc:
            raise exc.__cause__ or exc from None
        jobs = await self._replicated(jobs, loop=False)
        for job in jobs:
            await self._process(job, claimed_at)
        return bool(jobs)

    async def _claim(
        self, step: ClaimStep | None = None, wait: bool = True, count: int = 1
    ) -> tuple[list[Job], float]:
        """One claim step (see ``echomq.Worker._claim``: the same REQ until jobs come back)."""
        step = step if step is not None else ClaimStep()
        call, claimed_at = step.next(lambda: self._claim_call(wait, count), time.monotonic())
        extra = self.claim_block_ms / 1000 if wait else 0.0
        # A lost reply must be noticed, and the claim sent again, well before the
        # lease it took lapses (then the retry is answered with the job): each
        # attempt waits at most a third of the lease, plus the server-side wait.
        jobs = await self._send_until(
            call, None, "claim", extra_s=extra, on_retry=step.failed, cap_s=self.lease_ms / 3000
        )
        step.answered(jobs)
        return jobs, claimed_at

    async def _send_until(
        self,
        call: proto.Call[T],
        until: float | None,
        doing: str,
        job: Job | None = None,
        extra_s: float = 0.0,
        on_retry: Callable[[], None] | None = None,
        cap_s: float | None = None,
        together: bool = False,
    ) -> T:
        """Send ``call`` until it is answered, ``until`` passes, or a forced stop (see ``echomq.Worker``).

        ``together``: in one pipeline with the other calls sent meanwhile (``_Coalescer``).
        """
        backoff = Backoff(until)
        while True:
            try:
                timeout = backoff.timeout(time.monotonic())
                timeout = (timeout if cap_s is None else min(timeout, cap_s)) + extra_s
                if together:
                    reply = await self._coalescer.attempt(call, timeout)
                else:
                    reply = await self.client._attempt(call, timeout)
            except LeaseLost:
                raise
            except Exception as exc:
                kind = self._trouble(exc, doing, job)
                if on_retry is not None:
                    on_retry()
                wait = backoff.next_wait(time.monotonic())
                if wait is None or self._forced or (kind is Trouble.PERMANENT and self._stop_requested):
                    raise _GaveUp(doing) from exc
                if self._forced_event is not None:
                    await _wait(self._forced_event, wait)
                else:
                    await asyncio.sleep(wait)
                continue
            self._healed()
            return reply

    async def _process(
        self, job: Job, claimed_at: float, chain: bool = False, landed: bool = False
    ) -> list[tuple[Job, float, bool]]:
        """Run ``job``'s handler under its lease and send its end.

        With ``chain``, a COMPLETE also claims the next job in the same
        command (EMQ.COMPLETECLAIM); the jobs it brought are returned, for
        this task to run next.  ``landed``: see ``WorkerCore._took``.
        """
        cancel = CancelToken()
        keeper = LeaseKeeper(
            self.client, job, self.lease_ms, cancel, interval=self.extend_interval, claimed_at=claimed_at
        )
        keeper._troubles = self._troubles
        if self._jobs is not None:  # run(): the worker's one keeper task (work_one: the job's own)
            keeper._shared = self._keepers
        held = keeper._held
        context = CURRENT_JOB.set(job)
        try:
            if not self._took(held, landed):  # the claim was in flight when stop() came: give it back unrun
                await self._give_back(held, held.confirmed_until)
                return []
            if self.metrics is not None:
                await self.metrics.aclaimed_with_wait(self.client, job)
            if held.needs_confirmation(time.monotonic()) and not await keeper._confirm(ATTEMPT_TIMEOUT_S):
                self._let_go(held)
                self._decide(held, None)  # lost: counted, nothing sent
                return []
            keeper.start()
            # The handler runs in this task (a task of its own would cost a few
            # loop turns per job); a forced stop cancels this task while it is
            # here, and _call_handler tells that cancel from one the handler
            # raised by itself by the job having been given back.
            current = asyncio.current_task()
            assert current is not None
            self._handlers[held] = current
            try:
                error, interrupted = await self._call_handler(held, keeper)
            finally:
                self._handlers.pop(held, None)
                await keeper.stop()
            interrupted = interrupted and not held.given_back  # our own forced stop is no request to stop
            self._let_go(held)
            finish = self._decide(held, error, interrupted)
            if interrupted:
                assert error is not None
                self._interrupted(error, time.monotonic())
                self._poke()
            chained = chain and finish.action is Action.COMPLETE and self._complete_claim
            if chained and not self._stop_requested:
                return await self._complete_and_claim(finish)
            await self._finish(finish)
            return []
        finally:
            CURRENT_JOB.reset(context)

    async def _call_handler(self, held: HeldJob, keeper: LeaseKeeper) -> tuple[BaseException | None, bool]:
        """Run the handler; returns (its exception or None, whether that exception asks the worker to stop).

        Nothing escapes: a KeyboardInterrupt or SystemExit raised in a task
        would otherwise tear the event loop down.  A cancel of this task by
        a forced stop (the job was given back first) is consumed here: the
        task goes on to end its loop.
        """
        job, cancel = held.job, held.cancel
        try:
            if self._context_style:
                await cast("Callable[[JobContext], Awaitable[object]]", self.handler)(
                    JobContext(job, cancel, keeper)
                )
            else:
                await cast("Callable[[Job, CancelToken], Awaitable[object]]", self.handler)(job, cancel)
        except asyncio.CancelledError as exc:
            # Ours only when a forced stop cancelled the task (the job was
            # given back then); else the handler let a cancellation of its
            # own escape: its job's failure.
            if held.given_back:
                current = asyncio.current_task()
                if current is not None and sys.version_info >= (3, 11):
                    current.uncancel()  # consumed: later timeouts in this task work as usual
                return exc, True
            return exc, False
        except Exception as exc:
            return exc, False
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit: stop the worker
            return exc, True
        return None, False

    async def _finish(self, finish: Finish) -> None:
        """Send the job's end, again after connection trouble, until it lands or its lease ends."""
        if finish.action is not Action.DROP:
            await self._send_end(finish, self._end_call(finish), finish.held.confirmed_until, together=True)

    async def _complete_and_claim(self, finish: Finish) -> list[tuple[Job, float, bool]]:
        """COMPLETE the job and claim the next in one command, sent with the others' (``_Coalescer``).

        Retry-safe as ``echomq.Worker._finish_and_claim``: without an answer
        the COMPLETE goes the ordinary way (``_finish``), then the claim half
        is asked again by its REQ (a CLAIM with it answers the jobs it took).
        """
        job = finish.job
        sent = time.monotonic()
        call = proto.complete_claim(job.queue, job.id, job.token, self.lease_ms)
        timeout = min(ATTEMPT_TIMEOUT_S, self.lease_ms / 3000, max(finish.held.confirmed_until - sent, 0.0))
        try:
            both = await self._coalescer.attempt(call, timeout)
        except LeaseLost as exc:  # stale: nothing was written, nothing claimed
            self._refused(finish, exc)
            return []
        except Exception as exc:
            if "unknown command" in str(exc).lower():  # an older module: the two verbs
                self._complete_claim = False
                await self._finish(finish)
                return []
            self._trouble(exc, finish.action.value, job)
            await self._finish(finish)
            again = proto.claim(self.queue, self.lease_ms, request_id=proto.request_id_of(call))
            try:
                jobs = await self._send_until(again, None, "claim", cap_s=self.lease_ms / 3000)
            except _GaveUp:
                return []
            return [(j, sent, False) for j in await self._replicated(jobs)]
        if both.gone:
            self._refused(finish, JobGone("the job row is gone", job.id))
        else:
            self._landed(finish)
        return [(j, sent, False) for j in await self._replicated(both.jobs)]

    async def _give_back(self, held: HeldJob, until: float) -> None:
        """RELEASE a job this worker will not run (or not finish): no attempt used."""
        job = held.job
        await self._send_end(Finish(held, Action.RELEASE), proto.release(job.queue, job.id, job.token), until)

    async def _send_end(
        self, finish: Finish, call: proto.Call[Any], until: float, *, together: bool = False
    ) -> None:
        """Send ``call`` (the job's end) until it lands or ``until``; settle the job by how it went."""
        try:
            where = await self._send_until(call, until, finish.action.value, finish.job, together=together)
        except LeaseLost as exc:
            self._refused(finish, exc)
            return
        except _GaveUp:
            self._unfinished(finish)
            return
        self._landed(finish, None if finish.action is Action.COMPLETE else where)
