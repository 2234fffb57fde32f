"""The client: typed wrappers for the EMQ.* commands over redis-py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from redis.exceptions import ResponseError

from . import _protocol as proto
from ._protocol import CancelOutcome, ExtendOutcome, FailOutcome, Job, JobId, ReleaseOutcome, SweepResult
from .cancel import Cancellation

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

__all__ = ["Client", "ExtendOutcome", "Job", "JobId", "SweepResult"]

T = TypeVar("T")


class Client:
    """EchoMQ's lifecycle commands on one Redis (or Redis Cluster) connection.

    >>> client = Client.from_url("redis://localhost:6379/0")   # doctest: +SKIP
    >>> client.extend("emails", "job-42", token=3, lease_ms=30_000)  # doctest: +SKIP
    """

    def __init__(self, redis_client: redis.Redis | RedisCluster) -> None:
        self.redis = redis_client

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **kwargs: Any) -> Client:
        """Connect with ``redis.Redis.from_url(url, **kwargs)``.

        With ``cluster=True``, ``url`` names any node of a Redis Cluster and the
        client is redis-py's ``RedisCluster``: each command goes to the node
        that owns its queue's slot.
        """
        if cluster:
            from redis.cluster import RedisCluster

            return cls(RedisCluster.from_url(url, **kwargs))
        return cls(redis.Redis.from_url(url, **kwargs))

    def _run(self, call: proto.Call[T]) -> T:
        try:
            reply = self.redis.execute_command(*call.args)  # type: ignore[no-untyped-call]
        except ResponseError as exc:
            proto.raise_mapped(exc, call)
        return call.read(reply)

    def extend(self, queue: str, job_id: JobId, token: str, lease_ms: int) -> None:
        """Checkpoint the lease: the job's deadline becomes server-now + ``lease_ms``.

        ``token`` is the fencing token the caller got when it claimed the job
        (``Job.token``).  Raises ``JobGone`` if the row no longer exists and ``StaleToken``
        if another attempt holds the job or it is no longer active; both are
        ``LeaseLost``: the handler should stop.
        """
        self._run(proto.extend(queue, job_id, token, lease_ms))

    def extend_many(
        self, queue: str, jobs: Iterable[tuple[JobId, str]], lease_ms: int
    ) -> list[ExtendOutcome]:
        """Checkpoint the leases of many jobs in one round trip.

        ``jobs`` is ``(job_id, token)`` pairs; the answer is one
        ``ExtendOutcome`` (OK, GONE, STALE) per pair, in the same order.  Each
        job is one EMQ.EXTEND with its own contract (pipelined, not a
        transaction): a lost lease is an outcome, not an exception.  Arguments
        are checked before anything is sent.  Any other server error
        (WRONGTYPE, an unknown command) is raised after the round trip; the
        extensions before it in the batch have been applied.
        """
        calls = proto.extend_batch(queue, jobs, lease_ms)
        if not calls:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call.args)
        replies = pipe.execute(raise_on_error=False)
        return [proto.extend_outcome(call, reply) for call, reply in zip(calls, replies, strict=True)]

    def checkpoint(
        self, queue: str, job_id: JobId, token: str, lease_ms: int, *, state: bytes | None = None
    ) -> Cancellation | None:
        """``extend`` that also delivers remote cancels: the Cancellation requested, or None.

        Same lease effect and the same ``JobGone``/``StaleToken`` as ``extend``.
        With ``state``, the bytes are stored on the job in the same atomic
        step (fenced like the lease): the next claim of the job, after a
        crash, hands them back as ``Job.resume_state``.
        """
        return self._run(proto.checkpoint(queue, job_id, token, lease_ms, state))

    def sweep(self, queue: str, max_stalled: int = 1, limit: int = 100) -> SweepResult:
        """Recover the jobs whose lease lapsed, dead-lettering those at ``max_stalled`` stalls.

        At most ``limit`` jobs are taken per call, oldest deadline first.
        """
        return self._run(proto.sweep(queue, max_stalled, limit))

    def enqueue(self, queue: str, payload: bytes | str = b"", job_id: JobId | None = None) -> str:
        """Add a job to ``queue``; returns its id (a new time-ordered one unless given).

        The row and the pending entry are written by one EMQ.ENQUEUE, atomically.
        Raises ``JobExists`` if a job with that id already exists.
        """
        return self._run(proto.enqueue(queue, payload, job_id))

    def claim(self, queue: str, lease_ms: int) -> Job | None:
        """Take the next pending job and lease it for ``lease_ms``; None when none is claimable.

        Recovered jobs come first, then first in, first out.  The Job carries
        its payload: one round trip.  Safe to retry: a claim whose reply was
        lost is answered again with the same job, not another.
        """
        jobs = self._run(proto.claim(queue, lease_ms))
        return jobs[0] if jobs else None

    def claim_many(self, queue: str, lease_ms: int, count: int) -> list[Job]:
        """Take up to ``count`` jobs in one round trip (oldest first); [] when none is claimable."""
        return self._run(proto.claim(queue, lease_ms, count))

    def complete(self, queue: str, job_id: JobId, token: str) -> None:
        """Mark the job done; only its current holder may (``JobGone``/``StaleToken`` otherwise)."""
        self._run(proto.complete(queue, job_id, token))

    def fail(self, queue: str, job_id: JobId, token: str, error: str, max_attempts: int = 3) -> FailOutcome:
        """Report the handler's failure; returns where the job went.

        Below ``max_attempts`` attempts it goes back to pending (behind waiting
        work), else it is dead-lettered; a job with a cancel request ends
        ``"cancelled"`` (not retried, not counted as failed).  ``error`` is kept
        in the row's ``last_error``.  Same fencing as ``complete``.
        """
        return self._run(proto.fail(queue, job_id, token, error, max_attempts))

    def release(self, queue: str, job_id: JobId, token: str) -> ReleaseOutcome:
        """Give a held job back without using an attempt: ``"pending"``, or ``"cancelled"``.

        For a graceful shutdown or a handler that cannot run the job now: the
        job waits at the head of the queue again, its retry budget is as it
        was before this claim, and no stall is counted.  A job whose cancel
        was requested ends ``"cancelled"`` instead.  Fenced like ``complete``
        (``JobGone``/``StaleToken``); safe to retry.
        """
        return self._run(proto.release(queue, job_id, token))

    def cancel(self, queue: str, job_id: JobId, reason: str | None = None) -> CancelOutcome:
        """Ask for a job to be cancelled, from anywhere; no token needed.

        Returns ``"cancelled"`` if the job was pending (it will never be
        claimed), ``"requested"`` if it is held (its handler hears of it at the
        holder's next checkpoint), ``"finished"`` if it is already done, dead
        or cancelled.  Idempotent; the first reason is kept.  Raises
        ``JobGone`` for an unknown id.
        """
        return self._run(proto.cancel(queue, job_id, reason))

    def close(self) -> None:
        """Close the redis client's connections."""
        self.redis.close()
