"""The client: typed wrappers for the EMQ.* commands over redis-py."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import ResponseError
from redis.retry import Retry

from . import _protocol as proto
from ._protocol import CancelOutcome, ExtendOutcome, FailOutcome, Job, JobId, ReleaseOutcome, SweepResult
from .cancel import Cancellation

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

__all__ = ["Client", "ExtendOutcome", "Job", "JobId", "SweepResult"]

T = TypeVar("T")

# redis-py's settings for the clients ``from_url`` builds (both packages).
# Every EMQ.* command is safe to send twice: CLAIM and ENQUEUE carry a request
# id (REQ) whose retry is answered with the first call's result; COMPLETE,
# FAIL and RELEASE by a token that already ended the hold answer as the first
# call did; EXTEND and CHECKPOINT set an absolute deadline; SWEEP and CANCEL
# repeat as no-ops.  So a command whose reply was lost (a timeout, a dropped
# connection) is sent again, a few times, with backoff, on a fresh connection.
RETRIES = 10
RETRY_FIRST_S = 0.05
RETRY_CAP_S = 1.0
SOCKET_TIMEOUT_S = 5.0
# A worker's own connections (Client._attempt) connect and shake hands within
# this, or the attempt fails and the worker tries again on its own schedule.
WORKER_CONNECT_S = 2.0


def default_retry() -> Retry:
    """The redis-py ``Retry`` that ``from_url`` gives its client (a fresh one each time)."""
    return Retry(
        ExponentialWithJitterBackoff(base=RETRY_FIRST_S, cap=RETRY_CAP_S),
        RETRIES,
        supported_errors=(redis.ConnectionError, redis.TimeoutError),
    )


def connection_defaults(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for redis-py with echomq's deliberate defaults where the caller gave none."""
    out = dict(kwargs)
    out.setdefault("retry", default_retry())
    out.setdefault("socket_timeout", SOCKET_TIMEOUT_S)
    out.setdefault("socket_connect_timeout", SOCKET_TIMEOUT_S)
    out.setdefault("socket_keepalive", True)
    return out


def check_redis_client(redis_client: object, *, want_async: bool) -> None:
    """Refuse a redis client of the other kind (sync vs asyncio) at construction, not at first use."""
    execute = getattr(redis_client, "execute_command", None)
    if execute is None:
        raise TypeError(f"redis_client must be a redis-py client, not {type(redis_client).__name__}")
    is_async = inspect.iscoroutinefunction(execute)
    if is_async and not want_async:
        raise TypeError(
            f"redis_client is an asyncio client ({type(redis_client).__module__}."
            f"{type(redis_client).__name__}): use echomq.asyncio.Client with it"
        )
    if want_async and not is_async:
        raise TypeError(
            f"redis_client is a synchronous client ({type(redis_client).__module__}."
            f"{type(redis_client).__name__}): use echomq.Client with it, or redis.asyncio here"
        )


class Cutter:
    """The connection a bounded attempt is reading from, so another thread can cut it short.

    ``cut()`` (from any thread) disconnects it: a read blocked on a half-open
    connection returns at once with an error instead of waiting out the
    socket timeout.  After ``cut()`` no attempt starts with this cutter.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connection: Any = None
        self.done = False

    def hold(self, connection: Any) -> bool:
        with self._lock:
            if self.done:
                return False
            self._connection = connection
            return True

    def drop(self) -> None:
        with self._lock:
            self._connection = None

    def cut(self) -> bool:
        """Cut the attempt in progress, if any (True then); no attempt starts with this cutter after it."""
        # Under the lock: the owner releases its connection to the pool only
        # after drop(), so this never disconnects a connection someone else
        # has taken from the pool since.
        with self._lock:
            self.done = True
            connection, self._connection = self._connection, None
            if connection is not None:
                connection.disconnect()
            return connection is not None


class Client:
    """EchoMQ's lifecycle commands on one Redis (or Redis Cluster) connection.

    >>> client = Client.from_url("redis://localhost:6379/0")   # doctest: +SKIP
    >>> client.extend("emails", "job-42", token="3-9f2c...", lease_ms=30_000)  # doctest: +SKIP
    """

    def __init__(self, redis_client: redis.Redis | RedisCluster) -> None:
        check_redis_client(redis_client, want_async=False)
        self.redis = redis_client
        # For a worker's attempts (see _attempt): its own connections, and
        # whether the last attempt met a timeout or a lost connection.
        self._pool: redis.ConnectionPool | None = None
        self._suspect = False

    @classmethod
    def from_url(cls, url: str, *, cluster: bool = False, **kwargs: Any) -> Client:
        """Connect with ``redis.Redis.from_url(url, **kwargs)``.

        With ``cluster=True``, ``url`` names any node of a Redis Cluster and the
        client is redis-py's ``RedisCluster``: each command goes to the node
        that owns its queue's slot.

        Unless ``kwargs`` say otherwise: a 5 s socket and connect timeout,
        TCP keepalive, and a command whose reply was lost (connection error
        or timeout) is sent again up to 10 times (50 ms, doubling to 1 s,
        with jitter).  Every EMQ.* command is safe to send twice (see the
        README, "Retries").  Raw commands you send through ``client.redis``
        are retried the same way: use a client of your own for commands
        that are not safe to repeat.
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        options = connection_defaults(kwargs)
        if cluster:
            from redis.cluster import RedisCluster

            return cls(RedisCluster.from_url(url, **options))
        return cls(redis.Redis.from_url(url, **options))

    def _run(self, call: proto.Call[T]) -> T:
        try:
            reply = self.redis.execute_command(*call.args)  # type: ignore[no-untyped-call]
        except ResponseError as exc:
            proto.raise_mapped(exc, call)
        return call.read(reply)

    def _attempt(self, call: proto.Call[T], timeout: float, cutter: Cutter | None = None) -> T:
        """Send ``call`` once and wait at most ``timeout`` seconds for its reply (the worker's retries).

        The worker retries on its own schedule, bounded by a lease, with the
        same REQ or token each time, so each call here is one try: it goes
        out on connections of the worker's own (``_worker_pool``: the
        caller's connection settings, no redis-py retries, connect and
        handshake bounded by ``WORKER_CONNECT_S``), never through the
        caller's pool and its retries.  A reply that does not come in time
        disconnects its connection (it may be half-open) and the pool's idle
        ones with it.  Until an attempt succeeds again, attempts go out on a
        connection of their own whose connect and handshake are bounded by
        ``timeout`` too (a frozen server accepts connections and never
        answers the handshake), closed after the attempt.  ``cutter`` lets
        another thread end the wait.  On Redis Cluster (routing by slot) and
        on a single-connection client this is ``_run``: redis-py's own
        timeouts and retries apply.
        """
        r = self.redis
        if not isinstance(r, redis.Redis) or r.connection is not None:
            return self._run(call)
        pool = self._worker_pool()
        own = self._suspect
        if own:
            options = dict(pool.connection_kwargs)
            options.update(socket_timeout=timeout, socket_connect_timeout=timeout)
            connection = pool.connection_class(**options)
        else:
            connection = pool.get_connection()
        try:
            if cutter is not None and not cutter.hold(connection):
                raise redis.ConnectionError("the attempt was cut before it started")
            try:
                if own:
                    connection.connect()
                connection.send_command(*call.args)
                reply = connection.read_response(timeout=max(timeout, 0.001))
            except ResponseError as exc:
                self._suspect = False
                proto.raise_mapped(exc, call)
            except (redis.TimeoutError, redis.ConnectionError):
                self._suspect = True
                pool.disconnect(inuse_connections=False)
                raise
            except redis.RedisError:
                raise
            except Exception as exc:  # a cut from another thread tore the parser down mid-read
                self._suspect = True
                connection.disconnect()
                raise redis.ConnectionError(f"the attempt was cut: {exc!r}") from exc
        finally:
            if cutter is not None:
                cutter.drop()
            if own:
                connection.disconnect()
            else:
                pool.release(connection)
        self._suspect = False
        return call.read(reply)

    def _worker_pool(self) -> redis.ConnectionPool:
        """The connections ``_attempt`` uses: the caller's settings, without redis-py's retries."""
        pool = self._pool
        if pool is None:
            base = cast("redis.Redis", self.redis).connection_pool
            options = dict(base.connection_kwargs)
            options["retry"] = Retry(NoBackoff(), 0)
            for name in ("socket_timeout", "socket_connect_timeout"):
                given = options.get(name)
                options[name] = WORKER_CONNECT_S if given is None else min(float(given), WORKER_CONNECT_S)
            pool = self._pool = redis.ConnectionPool(connection_class=base.connection_class, **options)
        return pool

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

    def checkpoint(self, queue: str, job_id: JobId, token: str, lease_ms: int) -> Cancellation | None:
        """``extend`` that also delivers remote cancels: the Cancellation requested, or None.

        Same lease effect and the same ``JobGone``/``StaleToken`` as ``extend``.
        """
        return self._run(proto.checkpoint(queue, job_id, token, lease_ms))

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
        """Close the redis client's connections (and a worker's own)."""
        if self._pool is not None:
            self._pool.disconnect()
        self.redis.close()
