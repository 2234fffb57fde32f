"""Claiming, for ``echomq.Client``: ``claim`` and ``claim_many``, blocking on the server or
polling the scripts backend, and the wait for replicas that a claim may ask for.

A mixin of the client's, as ``_operator.py`` is: the verbs that hand out jobs, apart from
the ones that end them (``client.py``), each through the client's own ``_run``.

Hand-written beside its twin ``asyncio/_claims.py``, not generated from it
(``tests/unasync.py``): the docstrings users read are the sync client's (the asyncio
client's point here), and a blocking wait sleeps in a thread in one and on the loop in
the other.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from redis.exceptions import ResponseError

from .. import _protocol as proto
from .._protocol import Job, JobId, ReleaseOutcome
from .._redis import _missing
from .._scripts import ClaimPoll, Rendering
from ..errors import EchoMQError, LeaseLost, NotReplicated

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

T = TypeVar("T")


class ClaimVerbs:
    """The claiming verbs of ``echomq.Client`` (see the module docstring)."""

    redis: redis.Redis | RedisCluster
    _waitaof: bool | None

    def _run(self, call: proto.Call[T]) -> T:
        raise NotImplementedError

    def _render(self) -> Rendering:
        raise NotImplementedError

    def _send(self, args: tuple[Any, ...]) -> Any:
        raise NotImplementedError

    def release(self, queue: str, job_id: JobId, token: str) -> ReleaseOutcome:
        raise NotImplementedError

    def _claim(
        self,
        queue: str,
        lease_ms: int,
        count: int,
        block_ms: int | None,
        wait: proto.ReplicaWait | None = None,
    ) -> list[Job]:
        if wait is not None:
            self._check_wait(wait)
        jobs = self._claim_jobs(queue, lease_ms, count, block_ms)
        return jobs if wait is None else self._wait_for_replicas(jobs, lease_ms, wait)

    def _claim_jobs(self, queue: str, lease_ms: int, count: int, block_ms: int | None) -> list[Job]:
        if block_ms is None:
            return self._run(proto.claim(queue, lease_ms, count))
        if (self._render()).name == "scripts":  # a script cannot wait: poll, with backoff
            poll = ClaimPoll(block_ms, time.monotonic())
            proto.claim(queue, lease_ms, count, block_ms)  # the arguments, checked before anything is sent
            while not (jobs := self._run(proto.claim(queue, lease_ms, count))):
                if (pause := poll.next_pause(time.monotonic())) is None:
                    break
                time.sleep(pause)
            return jobs
        plan = proto.BlockingClaim(block_ms, proto.socket_timeout_of(self.redis), time.monotonic())
        proto.claim(queue, lease_ms, count)  # the arguments, checked before anything is sent
        while (wait := plan.next_wait(time.monotonic())) is not None:
            sent = time.monotonic()
            jobs = self._run(proto.claim(queue, lease_ms, count, wait))
            if jobs or plan.ended(wait, sent, time.monotonic()):
                return jobs
        return []

    def claim(
        self,
        queue: str,
        lease_ms: int,
        *,
        block_ms: int | None = None,
        replicas: int = 0,
        replicas_timeout_ms: int = 1000,
        replicas_aof: bool = False,
    ) -> Job | None:
        """Take the next pending job and lease it for ``lease_ms``; None when none is claimable.

        The most urgent job: smaller priorities first, first in, first out
        within a level (a job given back or recovered at the head of its
        level).  The Job carries its payload: one round trip.  With ``block_ms``, waits up to
        that long (0: no limit) for a job, on the server (EMQ.CLAIM ... BLOCK):
        waiting claims are served first come, first served, and cost no
        commands while they wait.  A wait is cut into commands that each end
        before the connection's ``socket_timeout`` (redis-py 8's default is
        5 s: one command per 4 s; with ``socket_timeout=None``, one for the
        whole wait).  Safe to retry: a claim whose reply was lost is answered
        again with the same job, not another.  ``Unblocked`` when the server
        ends the wait (``CLIENT UNBLOCK ... ERROR``, a failover).

        The job's ``token`` is a ``str``, ``"<attempts>-<16 hex digits>"``:
        the claim's number over the job's life and a random part the server
        draws for this claim alone.  Hand it back unchanged to extend,
        checkpoint, complete, fail and release; compare it only for equality.

        With ``replicas=N`` (N >= 1) the claim returns only once N replicas
        have acknowledged it (``WAIT N replicas_timeout_ms``, after an
        extension of the job's lease on the same connection, so that the
        wait covers the claim however it was answered; with
        ``replicas_aof=True`` also ``WAITAOF 0 N replicas_timeout_ms``: the
        replicas wrote it to their append-only file).  If they do not in
        time, the job is given back (RELEASE: pending again, at the head of
        the queue, no try used) and ``NotReplicated`` is raised.  This makes
        a re-run after a failover less likely (the promoted replica knows
        the claim, so the job is not handed to a second worker while the
        first still runs it); it does not make the claim durable (a failover
        during the wait can still lose it) and delivery stays at least once.
        ``replicas_timeout_ms`` must be shorter than the connection's
        ``socket_timeout``; ``replicas_aof`` needs WAITAOF (Redis 7.2+,
        Valkey 8+: ``BadArgument`` before anything is claimed elsewhere).
        Needs a ``redis.Redis`` client (not Redis Cluster).
        """
        wait = proto.replica_wait(replicas, replicas_timeout_ms, replicas_aof)
        jobs = self._claim(queue, lease_ms, 1, block_ms, wait)
        return jobs[0] if jobs else None

    def claim_many(
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
        """Take up to ``count`` jobs in one round trip (in claim order); [] when none is claimable.

        ``block_ms`` waits as in ``claim``, and returns as soon as at least
        one job is claimable.  ``replicas`` and its companions as in
        ``claim``: one wait covers every job of the call, and a wait that
        runs out gives them all back.
        """
        wait = proto.replica_wait(replicas, replicas_timeout_ms, replicas_aof)
        return self._claim(queue, lease_ms, count, block_ms, wait)

    def _check_wait(self, wait: proto.ReplicaWait) -> None:
        """Before anything is claimed: a client and a server that can wait as asked."""
        if not isinstance(self.redis, redis.Redis):
            raise ValueError("replicas= needs a redis.Redis client (a master with replicas)")
        proto.check_wait_fits(wait, proto.socket_timeout_of(self.redis))
        if wait.aof:
            if self._waitaof is None:
                try:
                    self.redis.execute_command(*proto.waitaof_probe())  # type: ignore[no-untyped-call]
                    self._waitaof = True
                except ResponseError as exc:
                    if not proto.probe_says_no_waitaof(exc):
                        raise
                    self._waitaof = False
            if not self._waitaof:
                raise proto.no_waitaof()

    def _wait_for_replicas(self, jobs: list[Job], lease_ms: int, wait: proto.ReplicaWait) -> list[Job]:
        """The claimed ``jobs`` once ``wait.replicas`` replicas have them; else given back, ``NotReplicated``.

        One pipeline, one connection: each job's lease extended one
        millisecond past the claim's (a write newer than the claim, however
        the claim was answered), then WAIT (and WAITAOF), which count the
        replicas that acknowledged this connection's last write.
        """
        if not jobs:
            return jobs
        held, acked, cause = list(jobs), 0, None
        try:
            for past_ms in (1, 2):  # 2: again, past the extension that loaded the script
                calls = proto.held_extensions(jobs, lease_ms, past_ms)
                rendering = self._render()
                pipe = self.redis.pipeline(transaction=False)
                for call in calls:
                    pipe.execute_command(*rendering.command(call.args))
                for line in wait.commands():
                    pipe.execute_command(*line)
                replies = pipe.execute(raise_on_error=False)
                missing = [c for c, r in zip(calls, replies, strict=False) if _missing(r)]
                if not missing:
                    break
                self._send(missing[0].args)  # nothing ran: load the script (it extends), again
            held = proto.still_held(jobs, calls, replies[: len(calls)])
            acked = wait.acked(replies[len(calls) :])
        except (redis.RedisError, EchoMQError) as exc:  # the wait failed (a dead master, a demoted one)
            cause = exc
        if cause is None and acked >= wait.replicas:
            return held
        released = []
        for job in held:
            try:
                self.release(job.queue, job.id, job.token)
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

