"""The client: typed wrappers for the EMQ.* commands over redis-py."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import redis
from redis.exceptions import ResponseError

from .cancel import Cancellation
from .errors import JobExists, JobGone, ModuleNotLoaded, StaleToken
from .keyspace import queue_keys

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

__all__ = ["Client", "JobId", "SweepResult"]

JobId = str | bytes


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did, each list in processing order (oldest deadline first)."""

    recovered: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.recovered) + len(self.dead)


@dataclass(frozen=True)
class Job:
    """A claimed job: ``token`` is the holder's fencing token (the row's attempts)."""

    queue: str
    id: str
    token: int
    payload: bytes


def _text(value: bytes | str) -> str:
    # Ids are bytes on the wire; surrogateescape keeps a non-UTF-8 id
    # round-trippable: the str encodes back to exactly the same bytes.
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value


def _wire(value: JobId) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    raise TypeError(f"job id must be str or bytes, not {type(value).__name__}")


def _new_id() -> bytes:
    # Time first, so jobs enqueued in the same server millisecond (equal
    # pending scores, ordered by id) still come out roughly in order.
    return f"{time.time_ns():x}-{uuid.uuid4().hex[:12]}".encode()


def _token(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"token must be an int, not {type(value).__name__}")
    return value


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


class Client:
    """EchoMQ's lifecycle commands on one Redis (or Redis Cluster) connection.

    >>> client = Client.from_url("redis://localhost:6379/0")   # doctest: +SKIP
    >>> client.extend("emails", "job-42", token=3, lease_ms=30_000)  # doctest: +SKIP
    """

    def __init__(self, redis_client: redis.Redis | RedisCluster) -> None:
        self.redis = redis_client

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Client:
        """Connect with ``redis.Redis.from_url(url, **kwargs)``."""
        return cls(redis.Redis.from_url(url, **kwargs))

    def extend(self, queue: str, job_id: JobId, token: int, lease_ms: int) -> None:
        """Checkpoint the lease: the job's deadline becomes server-now + ``lease_ms``.

        ``token`` is the ``attempts`` value the caller got when it claimed the
        job.  Raises ``JobGone`` if the row no longer exists and ``StaleToken``
        if another attempt holds the job or it is no longer active; both are
        ``LeaseLost``: the handler should stop.
        """
        _token(token)
        _positive_int("lease_ms", lease_ms)
        keys = queue_keys(queue)
        wire_id = _wire(job_id)
        reply = self._call(
            "EMQ.EXTEND",
            keys.active,
            keys.job(wire_id),
            wire_id,
            str(token),
            str(lease_ms),
            job_id=_text(wire_id),
        )
        if reply == -1:
            raise JobGone(f"job {_text(wire_id)!r} of queue {queue!r} is gone", _text(wire_id))

    def sweep(self, queue: str, max_stalled: int = 1, limit: int = 100) -> SweepResult:
        """Recover the jobs whose lease lapsed, dead-lettering those at ``max_stalled`` stalls.

        At most ``limit`` jobs are taken per call, oldest deadline first.
        """
        _positive_int("max_stalled", max_stalled)
        _positive_int("limit", limit)
        keys = queue_keys(queue)
        recovered, dead = self._call(
            "EMQ.SWEEP",
            keys.active,
            keys.pending,
            keys.dead,
            keys.base,
            str(max_stalled),
            str(limit),
        )
        return SweepResult([_text(i) for i in recovered], [_text(i) for i in dead])

    def enqueue(self, queue: str, payload: bytes | str = b"", job_id: JobId | None = None) -> str:
        """Add a job to ``queue``; returns its id (a new random one unless given).

        The row and the pending entry are written by one EMQ.ENQUEUE, atomically.
        Raises ``JobExists`` if a job with that id already exists.
        """
        keys = queue_keys(queue)
        wire_id = _wire(job_id) if job_id is not None else _new_id()
        data = payload.encode() if isinstance(payload, str) else payload
        self._call("EMQ.ENQUEUE", keys.pending, keys.base, wire_id, data, job_id=_text(wire_id))
        return _text(wire_id)

    def claim(self, queue: str, lease_ms: int) -> Job | None:
        """Take the next pending job and lease it for ``lease_ms``; None when the queue is empty.

        Recovered jobs come first, then first in, first out.
        """
        _positive_int("lease_ms", lease_ms)
        keys = queue_keys(queue)
        reply = self._call("EMQ.CLAIM", keys.pending, keys.active, keys.base, str(lease_ms))
        if reply is None:
            return None
        wire_id, token = reply
        wire_id = _wire(wire_id)
        payload = self.redis.hget(keys.job(wire_id), "payload")
        return Job(queue, _text(wire_id), int(token), _wire(payload) if payload is not None else b"")

    def complete(self, queue: str, job_id: JobId, token: int) -> None:
        """Mark the job done; only its current holder may (``JobGone``/``StaleToken`` otherwise)."""
        _token(token)
        keys = queue_keys(queue)
        wire_id = _wire(job_id)
        reply = self._call(
            "EMQ.COMPLETE", keys.active, keys.job(wire_id), wire_id, str(token), job_id=_text(wire_id)
        )
        if reply == -1:
            raise JobGone(f"job {_text(wire_id)!r} of queue {queue!r} is gone", _text(wire_id))

    def fail(
        self, queue: str, job_id: JobId, token: int, error: str, max_attempts: int = 3
    ) -> Literal["pending", "dead", "cancelled"]:
        """Report the handler's failure; returns where the job went.

        Below ``max_attempts`` attempts it goes back to pending (behind waiting
        work), else it is dead-lettered; a job with a cancel request ends
        ``"cancelled"`` (not retried, not counted as failed).  ``error`` is kept in the row's
        ``last_error``.  Same fencing as ``complete``.
        """
        _token(token)
        _positive_int("max_attempts", max_attempts)
        keys = queue_keys(queue)
        wire_id = _wire(job_id)
        reply = self._call(
            "EMQ.FAIL",
            keys.active,
            keys.pending,
            keys.dead,
            keys.base,
            wire_id,
            str(token),
            str(max_attempts),
            error.encode("utf-8", "replace"),
            job_id=_text(wire_id),
        )
        if reply == -1:
            raise JobGone(f"job {_text(wire_id)!r} of queue {queue!r} is gone", _text(wire_id))
        outcome = _text(reply)
        if outcome == "dead":
            return "dead"
        return "cancelled" if outcome == "cancelled" else "pending"

    def cancel(
        self, queue: str, job_id: JobId, reason: str | None = None
    ) -> Literal["cancelled", "requested", "finished"]:
        """Ask for a job to be cancelled, from anywhere; no token needed.

        Returns ``"cancelled"`` if the job was pending (it will never be
        claimed), ``"requested"`` if it is held (its handler hears of it at the
        holder's next checkpoint), ``"finished"`` if it is already done, dead
        or cancelled.  Idempotent; the first reason is kept.  Raises
        ``JobGone`` for an unknown id.
        """
        keys = queue_keys(queue)
        wire_id = _wire(job_id)
        text = b"" if reason is None else reason.encode("utf-8", "surrogateescape")
        reply = self._call("EMQ.CANCEL", keys.pending, keys.base, wire_id, text, job_id=_text(wire_id))
        if reply == -1:
            raise JobGone(f"job {_text(wire_id)!r} of queue {queue!r} is gone", _text(wire_id))
        outcome = _text(reply)
        if outcome == "cancelled":
            return "cancelled"
        return "requested" if outcome == "requested" else "finished"

    def checkpoint(self, queue: str, job_id: JobId, token: int, lease_ms: int) -> Cancellation | None:
        """``extend`` that also delivers remote cancels: the Cancellation requested, or None.

        Same lease effect and the same ``JobGone``/``StaleToken`` as ``extend``.
        """
        _token(token)
        _positive_int("lease_ms", lease_ms)
        keys = queue_keys(queue)
        wire_id = _wire(job_id)
        reply = self._call(
            "EMQ.CHECKPOINT",
            keys.active,
            keys.job(wire_id),
            wire_id,
            str(token),
            str(lease_ms),
            job_id=_text(wire_id),
        )
        if reply == -1:
            raise JobGone(f"job {_text(wire_id)!r} of queue {queue!r} is gone", _text(wire_id))
        reason = reply[1]
        if reason is None:
            return None
        return Cancellation(_text(reason) or None)

    def _call(self, *args: Any, job_id: str = "") -> Any:
        try:
            return self.redis.execute_command(*args)  # type: ignore[no-untyped-call]
        except ResponseError as exc:
            self._raise_mapped(exc, args[0], job_id)

    @staticmethod
    def _raise_mapped(exc: ResponseError, command: str, job_id: str) -> NoReturn:
        message = str(exc)
        if message.startswith("EMQSTALE"):
            raise StaleToken(message, job_id) from None
        if message.startswith("EMQEXISTS"):
            raise JobExists(message, job_id) from None
        if message.lower().startswith(("unknown command", "err unknown command")):
            raise ModuleNotLoaded(
                f"the server does not know {command}: start it with "
                "--loadmodule /path/to/emq.so (see echomq.module_path())"
            ) from exc
        raise exc
