"""The client: typed wrappers for the EMQ.* commands over redis-py."""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import redis
from redis.exceptions import ResponseError

from .errors import JobGone, ModuleNotLoaded, StaleToken
from .keyspace import queue_keys

if TYPE_CHECKING:
    from redis.cluster import RedisCluster

__all__ = ["Client", "ExtendOutcome", "JobId", "SweepResult"]

JobId = str | bytes


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did, each list in processing order (oldest deadline first)."""

    recovered: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.recovered) + len(self.dead)


class ExtendOutcome(enum.Enum):
    """What one extension of ``Client.extend_many`` did."""

    OK = "ok"
    """The lease now ends at server-now + ``lease_ms``."""
    GONE = "gone"
    """The job row no longer exists (``extend`` would raise ``JobGone``)."""
    STALE = "stale"
    """Another attempt holds the job, or it is no longer active (``StaleToken``)."""


@functools.lru_cache(maxsize=1024)
def _extend_keys(queue: str) -> tuple[str, bytes]:
    # extend() is the hot call of a busy worker: the queue's active key and
    # its row prefix are made once per queue name, not once per call.
    keys = queue_keys(queue)
    return keys.active, keys.base.encode() + b"job:"


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


def _check_token(token: object) -> None:
    if token.__class__ is not int and (isinstance(token, bool) or not isinstance(token, int)):
        raise TypeError(f"token must be an int, not {type(token).__name__}")


def _extend_keys_checked(queue: str) -> tuple[str, bytes]:
    if type(queue) is not str:
        queue_keys(queue)  # raises the TypeError a bad name deserves
    return _extend_keys(queue)


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
        _check_token(token)
        _positive_int("lease_ms", lease_ms)
        active, row_prefix = _extend_keys(queue) if type(queue) is str else _extend_keys_checked(queue)
        wire_id = job_id if type(job_id) is bytes else _wire(job_id)
        try:
            reply = self.redis.execute_command(  # type: ignore[no-untyped-call]
                "EMQ.EXTEND", active, row_prefix + wire_id, wire_id, token, lease_ms
            )
        except ResponseError as exc:
            self._raise_mapped(exc, "EMQ.EXTEND", _text(wire_id))
        if reply == -1:
            raise JobGone(f"job {_text(wire_id)!r} of queue {queue!r} is gone", _text(wire_id))

    def extend_many(
        self, queue: str, jobs: Iterable[tuple[JobId, int]], lease_ms: int
    ) -> list[ExtendOutcome]:
        """Checkpoint the leases of many jobs in one round trip.

        ``jobs`` is ``(job_id, token)`` pairs; the answer is one
        ``ExtendOutcome`` per pair, in the same order.  Each job is one
        EMQ.EXTEND with its own contract (pipelined, not a transaction): a
        lost lease is an outcome, not an exception.  Arguments are checked
        before anything is sent.  Any other server error (WRONGTYPE, an
        unknown command) is raised after the round trip; the extensions
        before it in the batch have been applied.
        """
        _positive_int("lease_ms", lease_ms)
        active, row_prefix = _extend_keys_checked(queue)
        calls: list[tuple[bytes, bytes, int]] = []
        for job_id, token in jobs:
            _check_token(token)
            wire_id = _wire(job_id)
            calls.append((row_prefix + wire_id, wire_id, token))
        if not calls:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for row, wire_id, token in calls:
            pipe.execute_command("EMQ.EXTEND", active, row, wire_id, token, lease_ms)
        replies = pipe.execute(raise_on_error=False)
        return [
            self._extend_outcome(reply, wire_id)
            for reply, (_, wire_id, _) in zip(replies, calls, strict=True)
        ]

    def _extend_outcome(self, reply: object, wire_id: bytes) -> ExtendOutcome:
        if reply == 1:
            return ExtendOutcome.OK
        if reply == -1:
            return ExtendOutcome.GONE
        if isinstance(reply, ResponseError):
            if str(reply).startswith("EMQSTALE"):
                return ExtendOutcome.STALE
            self._raise_mapped(reply, "EMQ.EXTEND", _text(wire_id))
        if isinstance(reply, BaseException):
            raise reply
        raise TypeError(f"unexpected EMQ.EXTEND reply {reply!r}")

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
        if message.lower().startswith(("unknown command", "err unknown command")):
            raise ModuleNotLoaded(
                f"the server does not know {command}: start it with "
                "--loadmodule /path/to/emq.so (see echomq.module_path())"
            ) from exc
        raise exc
