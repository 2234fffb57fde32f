"""The client: typed wrappers for the EMQ.* commands over redis-py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import redis
from redis.exceptions import ResponseError

from .errors import JobGone, ModuleNotLoaded, StaleToken
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

    def extend(self, queue: str, job_id: JobId, token: int, lease_ms: int) -> None:
        """Checkpoint the lease: the job's deadline becomes server-now + ``lease_ms``.

        ``token`` is the ``attempts`` value the caller got when it claimed the
        job.  Raises ``JobGone`` if the row no longer exists and ``StaleToken``
        if another attempt holds the job or it is no longer active; both are
        ``LeaseLost``: the handler should stop.
        """
        if isinstance(token, bool) or not isinstance(token, int):
            raise TypeError(f"token must be an int, not {type(token).__name__}")
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
