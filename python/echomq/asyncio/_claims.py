"""Claiming, for ``echomq.asyncio.Client``: ``claim``, ``claim_many`` and the wait for replicas.

Hand-written beside its twin ``_sync/_claims.py``, not generated from it
(``tests/unasync.py``): the docstrings are the sync client's, which the API reference
shows for both (the ones here point there), and a blocking wait sleeps on the loop here
and in a thread there.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypeVar

import redis
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from .. import _protocol as proto
from .._protocol import Job, JobId, ReleaseOutcome
from .._redis import _missing
from .._scripts import ClaimPoll, Rendering
from ..errors import EchoMQError, LeaseLost, NotReplicated

T = TypeVar("T")


class ClaimVerbs:
    """The claiming verbs of ``echomq.asyncio.Client`` (see the module docstring)."""

    redis: aioredis.Redis | aioredis.RedisCluster
    _waitaof: bool | None

    async def _run(self, call: proto.Call[T]) -> T:
        raise NotImplementedError

    async def _render(self) -> Rendering:
        raise NotImplementedError

    async def _send(self, args: tuple[Any, ...]) -> Any:
        raise NotImplementedError

    async def release(self, queue: str, job_id: JobId, token: str) -> ReleaseOutcome:
        raise NotImplementedError

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

