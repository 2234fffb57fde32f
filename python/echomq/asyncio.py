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
import logging
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from . import _protocol as proto
from ._protocol import CancelOutcome, ExtendOutcome, FailOutcome, Job, JobId, SweepResult
from .cancel import Cancellation, CancelToken
from .errors import LeaseLost
from .lease import LOST_DEADLINE, lost_reason
from .worker import WorkerStats, error_text

__all__ = ["AsyncHandler", "Client", "LeaseKeeper", "Reaper", "Worker"]

T = TypeVar("T")
log = logging.getLogger("echomq.asyncio")

AsyncHandler = Callable[[Job, CancelToken], Awaitable[object]]


class Client:
    """``echomq.Client`` for asyncio; every method is a coroutine with the same contract."""

    def __init__(self, redis_client: aioredis.Redis | aioredis.RedisCluster) -> None:
        self.redis = redis_client

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Client:
        """Connect with ``redis.asyncio.Redis.from_url(url, **kwargs)``."""
        return cls(aioredis.Redis.from_url(url, **kwargs))

    async def _run(self, call: proto.Call[T]) -> T:
        try:
            reply = await self.redis.execute_command(*call.args)
        except ResponseError as exc:
            proto.raise_mapped(exc, call)
        return call.read(reply)

    async def extend(self, queue: str, job_id: JobId, token: int, lease_ms: int) -> None:
        """Checkpoint the lease (see ``echomq.Client.extend``)."""
        await self._run(proto.extend(queue, job_id, token, lease_ms))

    async def extend_many(
        self, queue: str, jobs: Iterable[tuple[JobId, int]], lease_ms: int
    ) -> list[ExtendOutcome]:
        """Checkpoint many leases in one round trip (see ``echomq.Client.extend_many``)."""
        calls = proto.extend_batch(queue, jobs, lease_ms)
        if not calls:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call.args)
        replies = await pipe.execute(raise_on_error=False)
        return [proto.extend_outcome(call, reply) for call, reply in zip(calls, replies, strict=True)]

    async def checkpoint(self, queue: str, job_id: JobId, token: int, lease_ms: int) -> Cancellation | None:
        """Extend and learn of a remote cancel (see ``echomq.Client.checkpoint``)."""
        return await self._run(proto.checkpoint(queue, job_id, token, lease_ms))

    async def sweep(self, queue: str, max_stalled: int = 1, limit: int = 100) -> SweepResult:
        """Recover lapsed jobs (see ``echomq.Client.sweep``)."""
        return await self._run(proto.sweep(queue, max_stalled, limit))

    async def enqueue(self, queue: str, payload: bytes | str = b"", job_id: JobId | None = None) -> str:
        """Add a job; returns its id (see ``echomq.Client.enqueue``)."""
        return await self._run(proto.enqueue(queue, payload, job_id))

    async def claim(self, queue: str, lease_ms: int) -> Job | None:
        """Take the next pending job (see ``echomq.Client.claim``)."""
        claimed = await self._run(proto.claim(queue, lease_ms))
        if claimed is None:
            return None
        payload = await self.redis.hget(proto.keys_of(queue).job(claimed[0]), "payload")
        return proto.claimed_job(queue, claimed, payload)

    async def complete(self, queue: str, job_id: JobId, token: int) -> None:
        """Mark the job done (see ``echomq.Client.complete``)."""
        await self._run(proto.complete(queue, job_id, token))

    async def fail(
        self, queue: str, job_id: JobId, token: int, error: str, max_attempts: int = 3
    ) -> FailOutcome:
        """Report a failure (see ``echomq.Client.fail``)."""
        return await self._run(proto.fail(queue, job_id, token, error, max_attempts))

    async def cancel(self, queue: str, job_id: JobId, reason: str | None = None) -> CancelOutcome:
        """Request a cancel (see ``echomq.Client.cancel``)."""
        return await self._run(proto.cancel(queue, job_id, reason))

    async def aclose(self) -> None:
        await self.redis.aclose()


class LeaseKeeper:
    """Async context manager: checkpoint ``job`` every ``interval`` while the block runs.

    Same rules as ``echomq.LeaseKeeper``: ``cancel`` is cancelled with a reason
    when the lease is lost (stale, gone, or no checkpoint confirmed before the
    deadline) and, with ``deliver_cancel``, with a remote cancel's reason.
    """

    def __init__(
        self,
        client: Client,
        job: Job,
        lease_ms: int,
        cancel: CancelToken,
        *,
        interval: float | None = None,
        claimed_at: float | None = None,
        deliver_cancel: bool = True,
    ) -> None:
        if lease_ms < 1:
            raise ValueError("lease_ms must be >= 1")
        self.client, self.job, self.lease_ms, self.cancel = client, job, lease_ms, cancel
        self.interval = interval if interval is not None else lease_ms / 3000.0
        self.deliver_cancel = deliver_cancel
        self._claimed_at = claimed_at
        self._lease_s = lease_ms / 1000.0
        self._confirmed_until = 0.0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.lost: str | None = None
        self.extends = 0

    async def __aenter__(self) -> LeaseKeeper:
        loop = asyncio.get_running_loop()
        start = self._claimed_at if self._claimed_at is not None else loop.time()
        self._confirmed_until = start + self._lease_s
        self._task = asyncio.create_task(self._run(), name=f"echomq-lease-{self.job.id}")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    def _lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            log.warning("job %s of %s: %s", self.job.id, self.job.queue, reason)
            self.cancel.cancel(reason)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            remaining = self._confirmed_until - loop.time()
            if remaining <= 0:
                self._lose(LOST_DEADLINE)
                return
            if await _wait(self._stop, min(self.interval, remaining)):
                return
            sent = loop.time()
            job = self.job
            try:
                # The deadline bounds the call itself: a hung connection must
                # not keep the handler running past its lease.
                if self.deliver_cancel:
                    call = self.client.checkpoint(job.queue, job.id, job.token, self.lease_ms)
                else:
                    call = _none_after(self.client.extend(job.queue, job.id, job.token, self.lease_ms))
                requested = await asyncio.wait_for(call, timeout=max(self._confirmed_until - sent, 0.001))
            except Exception as exc:
                reason = lost_reason(exc)
                if reason is not None:
                    self._lose(reason)
                    return
                # Connection trouble or a timeout: the deadline decides.
                log.debug("extend of %s failed: %r", job.id, exc)
                continue
            self.extends += 1
            self._confirmed_until = sent + self._lease_s
            if requested is not None:
                self.cancel.cancel(requested.reason)


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds; True if it is set."""
    try:
        await asyncio.wait_for(event.wait(), timeout=timeout)
    except asyncio.TimeoutError:
        return False
    return True


async def _none_after(awaitable: Awaitable[None]) -> Cancellation | None:
    await awaitable
    return None


class Reaper:
    """Sweep ``queue`` every ``interval`` seconds in a task (see ``echomq.Reaper``)."""

    def __init__(
        self, client: Client, queue: str, *, interval: float = 1.0, max_stalled: int = 1, limit: int = 100
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.client, self.queue = client, queue
        self.interval, self.max_stalled, self.limit = interval, max_stalled, limit
        self.recovered = self.dead = self.errors = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def sweep_once(self) -> SweepResult:
        recovered: list[str] = []
        dead: list[str] = []
        for _ in range(100):
            result = await self.client.sweep(self.queue, self.max_stalled, self.limit)
            recovered += result.recovered
            dead += result.dead
            if len(result) < self.limit:
                break
        self.recovered += len(recovered)
        self.dead += len(dead)
        return SweepResult(recovered, dead)

    async def run(self) -> None:
        while not self._stop.is_set():
            try:
                await self.sweep_once()
            except Exception:
                self.errors += 1
                log.exception("sweep of %s failed", self.queue)
            await _wait(self._stop, self.interval)

    async def __aenter__(self) -> Reaper:
        self._stop.clear()
        self._task = asyncio.create_task(self.run(), name=f"echomq-reaper-{self.queue}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task


class Worker:
    """Runs ``await handler(job, cancel_token)`` for ``queue``'s jobs (see ``echomq.Worker``)."""

    def __init__(
        self,
        client: Client,
        queue: str,
        handler: AsyncHandler,
        *,
        lease_ms: int = 30_000,
        max_attempts: int = 3,
        concurrency: int = 1,
        poll_interval: float = 0.2,
        extend_interval: float | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.client, self.queue, self.handler = client, queue, handler
        self.lease_ms, self.max_attempts = lease_ms, max_attempts
        self.concurrency, self.poll_interval = concurrency, poll_interval
        self.extend_interval = extend_interval
        self.stats = WorkerStats()
        self._stopping = asyncio.Event()
        self._running: set[CancelToken] = set()

    async def run(self) -> None:
        """Work with ``concurrency`` tasks until ``stop()``."""
        self._stopping.clear()
        await asyncio.gather(*(self._loop() for _ in range(self.concurrency)))

    def stop(self) -> None:
        """Stop claiming and cancel running handlers with reason "shutdown"."""
        self._stopping.set()
        for token in list(self._running):
            token.cancel("shutdown")

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                worked = await self.work_one()
            except Exception:
                log.exception("worker loop error on %s", self.queue)
                worked = False
            if not worked:
                await _wait(self._stopping, self.poll_interval)

    async def work_one(self) -> bool:
        """Claim and process one job; False when the queue had none."""
        claimed_at = asyncio.get_running_loop().time()
        job = await self.client.claim(self.queue, self.lease_ms)
        if job is None:
            return False
        cancel = CancelToken()
        self._running.add(cancel)
        error: BaseException | None = None
        keeper = LeaseKeeper(
            self.client, job, self.lease_ms, cancel, interval=self.extend_interval, claimed_at=claimed_at
        )
        try:
            async with keeper:
                try:
                    await self.handler(job, cancel)
                except Exception as exc:
                    error = exc
        finally:
            self._running.discard(cancel)
        if keeper.lost is not None:
            self.stats.leases_lost += 1
            return True
        try:
            if error is None:
                await self.client.complete(job.queue, job.id, job.token)
                self.stats.completed += 1
            else:
                text = error_text(error)
                where = await self.client.fail(job.queue, job.id, job.token, text, self.max_attempts)
                self.stats.record_fail(where)
        except LeaseLost as exc:
            self.stats.rejected += 1
            log.warning("job %s: finishing refused: %s", job.id, exc)
        return True
