"""echomq for asyncio: the same client API over ``redis.asyncio``, and an async
lease keeper, reaper and worker.

    import echomq.asyncio as emq

    client = emq.Client.from_url("redis://localhost:6379/0")
    await client.extend("mail", job_id, token=3, lease_ms=30_000)

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        await send(job.payload)
        cancel.raise_if_cancelled()          # O(1), as in sync code
        await cancel.wait()                  # or wait for the cancel itself

    await emq.Worker(client, "mail", handler, concurrency=10).run()

``CancelToken`` is the same class as in sync code: ``await token.wait()``
works from any event loop, and ``cancel()`` from any thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from . import _protocol as proto
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
from ._runtime import Action, Finish, KeeperCore, ReaperCore, WorkerCore
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
from .cancel import Cancellation, CancelToken
from .errors import LeaseLost

__all__ = ["AsyncHandler", "Client", "LeaseKeeper", "Reaper", "Worker"]

T = TypeVar("T")

AsyncHandler = Callable[[Job, CancelToken], Awaitable[object]]


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
        self.redis = redis_client
        self._limits = script_limits if script_limits is not None else ScriptLimits()
        choice = check_backend(backend)
        self._rendering: Rendering | None = None if choice == "auto" else Rendering(choice, self._limits)

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
        ``Client``.
        """
        if cluster:
            return cls(aioredis.RedisCluster.from_url(url, **kwargs), backend, script_limits=script_limits)
        return cls(aioredis.Redis.from_url(url, **kwargs), backend, script_limits=script_limits)

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
        return await self._run(proto.enqueue(queue, payload, job_id, delay_ms, run_at_ms))

    async def enqueue_many(
        self, queue: str, items: Iterable[EnqueueItem], *, delay_ms: int | None = None
    ) -> list[str]:
        """Add many jobs in few round trips (see ``echomq.Client.enqueue_many``)."""
        ids: list[str] = []
        calls = proto.enqueue_many(queue, items, delay_ms)
        while calls:
            call = calls.pop(0)
            try:
                added: list[str] = await self._run(call)
            except ResponseError as exc:  # emq.max-limit below 10,000: halve, nothing was written
                if not proto.over_max_limit(exc) or int(call.args[3]) < 2:
                    raise
                calls[:0] = proto.enqueue_many_halves(call)
                continue
            ids += added
        return ids

    async def _claim(self, queue: str, lease_ms: int, count: int, block_ms: int | None) -> list[Job]:
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

    async def claim(self, queue: str, lease_ms: int, *, block_ms: int | None = None) -> Job | None:
        """Take the next pending job, waiting up to ``block_ms`` for one (see ``echomq.Client.claim``)."""
        jobs = await self._claim(queue, lease_ms, 1, block_ms)
        return jobs[0] if jobs else None

    async def claim_many(
        self, queue: str, lease_ms: int, count: int, *, block_ms: int | None = None
    ) -> list[Job]:
        """Take up to ``count`` jobs in one round trip (see ``echomq.Client.claim_many``)."""
        return await self._claim(queue, lease_ms, count, block_ms)

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

    async def retry_dead(self, queue: str, *, limit: int = 100) -> RetryDeadResult:
        """Retry every job dead now, in bounded steps (see ``echomq.Client.retry_dead``)."""
        until = await self._server_time(proto.keys_of(queue).dead)
        retried = dropped = 0
        while True:
            step = await self._run(proto.retry_dead(queue, limit, until))
            retried, dropped = retried + step.retried, dropped + step.dropped
            if step.retried + step.dropped < limit:
                return RetryDeadResult(retried, dropped)

    async def purge_dead(self, queue: str, *, limit: int = 100) -> int:
        """Delete every job dead now, in bounded steps (see ``echomq.Client.purge_dead``)."""
        until = await self._server_time(proto.keys_of(queue).dead)
        total = 0
        while True:
            step = await self._run(proto.purge_dead(queue, limit, until))
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
            step, remaining = await self._run(proto.obliterate(queue, limit, force))
            removed += step
            if remaining == 0:
                break
        forgotten, cursor = 0, 0
        target = self._node_of(proto.keys_of(queue).pending)
        while True:
            reply = await self.redis.execute_command(*proto.scan_rows(queue, cursor, limit), **target)
            cursor, found = proto.scan_reply(reply)
            if found:
                forgotten += await self._run(proto.forget(queue, [proto.row_id(queue, k) for k in found]))
            if cursor == 0:
                await self.redis.delete(proto.counters_key(queue))  # the shared counters (echomq.metrics)
                return ObliterateResult(removed, forgotten)

    async def aclose(self) -> None:
        """Close the redis client's connections."""
        await self.redis.aclose()


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds; True if it is set."""
    try:
        await asyncio.wait_for(event.wait(), timeout=timeout)
    except asyncio.TimeoutError:
        return False
    return True


class LeaseKeeper(KeeperCore[Client]):
    """Async context manager: checkpoint ``job`` every ``interval`` while the block runs.

    The same arguments, attributes and rules as ``echomq.LeaseKeeper``:
    ``cancel`` is cancelled with a reason when the lease is lost (stale,
    gone, or no checkpoint confirmed before the deadline) and, with
    ``deliver_cancel``, with a remote cancel's reason.  ``claimed_at`` is on
    ``clock`` (``time.monotonic``, which is also the default event loop's
    clock).  A checkpoint in flight is bounded by the deadline itself, so a
    hung connection cannot keep the handler running past its lease.
    """

    def _init_driver(self) -> None:
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LeaseKeeper:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def start(self) -> None:
        """Start checkpointing in a task of the running loop."""
        self._task = asyncio.create_task(self._run(), name=f"echomq-lease-{self.job.id}")

    async def stop(self) -> None:
        """Stop checkpointing; waits for a checkpoint in flight, then looks at the deadline a last time."""
        self._held.stop()
        self._stop.set()
        if self._task is not None:
            await self._task
        self._held.expire(self._clock())

    async def _run(self) -> None:
        while True:
            wait = self._held.wait_before_checkpoint(self._clock())
            if wait is None or await _wait(self._stop, wait):
                return
            if self._held.checkpoint_due(self._clock()):
                await self._checkpoint()

    async def _checkpoint(self) -> None:
        sent = self._clock()
        try:
            call = self._send()
            requested = await asyncio.wait_for(call, timeout=max(self._held.time_left(sent), 0.001))
        except Exception as exc:  # a timeout too: the deadline decides
            self._held.failed(exc, self._clock())
            return
        self._held.confirmed(sent, self._clock(), requested)

    async def _send(self) -> Cancellation | None:
        job = self.job
        if self.deliver_cancel:
            return await self.client.checkpoint(job.queue, job.id, job.token, self.lease_ms)
        await self.client.extend(job.queue, job.id, job.token, self.lease_ms)
        return None


class Reaper(ReaperCore[Client]):
    """Sweep ``queue`` every ``interval`` seconds in a task.

    The same arguments, attributes and tick as ``echomq.Reaper``
    (``on_sweep`` is a plain function, called in the loop).
    """

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
        """Sweep every ``interval`` until ``stop()``; errors are logged and retried."""
        while True:
            try:
                await self.sweep_once()
            except Exception:
                self._sweep_failed()
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


class Worker(WorkerCore[Client, AsyncHandler]):
    """Runs ``await handler(job, cancel_token)`` for ``queue``'s jobs.

    The same arguments, attributes and rules as ``echomq.Worker``, with
    ``concurrency`` tasks instead of threads.  ``stop()`` is a plain function
    (a handler or a signal handler can call it): it stops claiming and
    cancels the running handlers; ``await run()``, or leave ``async with
    worker:``, to wait for them.
    """

    def _init_driver(self) -> None:
        self._stopping = asyncio.Event()  # wakes idle tasks; the decisions read _stop_requested
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Work with ``concurrency`` tasks until ``stop()``."""
        self._begin()
        self._stopping.clear()
        await self._work()

    def start(self) -> Worker:
        """Work in a task of the running loop; returns at once."""
        self._begin()
        self._stopping.clear()
        self._task = asyncio.create_task(self._work(), name=f"echomq-worker-{self.queue}")
        return self

    def stop(self) -> None:
        """Stop claiming and cancel running handlers with reason "shutdown"."""
        self._request_stop()
        self._stopping.set()
        if self.metrics is not None:
            self.metrics.flush()

    async def __aenter__(self) -> Worker:
        return self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        if self._task is not None:
            await self._task
            self._task = None

    async def _work(self) -> None:
        await asyncio.gather(*(self._loop() for _ in range(self.concurrency)))

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                worked = await self.work_one()
            except Exception:
                self._loop_failed()
                worked = False
            if not worked:
                await _wait(self._stopping, self.poll_interval)

    async def work_one(self) -> bool:
        """Claim and process one job; False when the queue had none."""
        claimed_at = time.monotonic()
        job = await self.client.claim(self.queue, self.lease_ms)
        if job is None:
            return False
        if self.metrics is not None:
            await self.metrics.aclaimed_with_wait(self.client, job)
        cancel = CancelToken()
        keeper = LeaseKeeper(
            self.client, job, self.lease_ms, cancel, interval=self.extend_interval, claimed_at=claimed_at
        )
        self._took(keeper._held)
        error: BaseException | None = None
        try:
            async with keeper:
                try:
                    await self.handler(job, cancel)
                except Exception as exc:  # the handler's failure is the job's, not the worker's
                    error = exc
        finally:
            self._let_go(keeper._held)
        await self._finish(self._decide(keeper._held, error))
        return True

    async def _finish(self, finish: Finish) -> None:
        job = finish.job
        try:
            if finish.action is Action.COMPLETE:
                await self.client.complete(job.queue, job.id, job.token)
                self._landed(finish)
            elif finish.action is Action.FAIL:
                where = await self.client.fail(job.queue, job.id, job.token, finish.error, self.max_attempts)
                self._landed(finish, where)
        except LeaseLost as exc:
            self._refused(finish, exc)
