"""The exceptions echomq raises.

Catch at the level you care about::

    EchoMQError            anything echomq itself reports
    ├── LeaseLost          the caller no longer holds the job
    │   ├── JobGone        the job row does not exist any more
    │   └── StaleToken     another attempt holds it, or it is no longer active
    ├── JobExists          enqueue with an id that is already taken
    ├── NotRetryable       retry of a job that is not dead or cancelled
    ├── QueueBusy          obliterate of a queue with active jobs, without force
    ├── Unblocked          the server ended a waiting claim without a job
    ├── NotReplicated      a claim's wait for replicas ran out; its jobs were given back
    ├── ModuleNotLoaded    the server has no emq module (start it with --loadmodule)
    ├── ServerUnreachable  nothing could be sent: no server answers at that address (also a
    │                      redis.ConnectionError)
    ├── BadArgument        the server refused an argument (also a ValueError)
    ├── CorruptQueue       a key or field of the queue is not what the module expects
    ├── RateLimited        raised by a handler: give the job back, stop the queue's claims for ms
    ├── BadSchedule        a schedule's definition is refused (also a ValueError)
    ├── Cancelled          raised by CancelToken.raise_if_cancelled()
    │   └── JobCancelled   a result was waited for, and the job was cancelled
    ├── JobFailed          a result was waited for, and the job is dead (type, message, traceback)
    ├── ResultTimeout      a result was waited for, and time ran out (also a TimeoutError)
    ├── NonRetryable       raised by a handler: its job is dead at once, whatever its tries
    └── RetryLater         raised by a handler: retry its job after ``delay_ms`` (a try used)

The clients check argument types and ranges before sending anything and raise
``TypeError``/``ValueError`` naming the argument; ``BadArgument`` is for what
only the server can tell (a lease whose deadline would be too large).
``BadArgument`` and ``CorruptQueue`` are ``redis.ResponseError`` subclasses too.
A server that cannot be reached at all (a mistyped host, a wrong port, a
server not started, or one that stayed away through every retry) raises
``ServerUnreachable``, chained to redis-py's error; a connection lost while a
command was on the wire, and the server's own typed refusals
(``NoPermissionError``, ``ReadOnlyError``, ``OutOfMemoryError``,
``TryAgainError``), stay redis-py's.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError


class EchoMQError(Exception):
    """Base class of every exception echomq raises."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as made, not by calling the class with its args (RetryLater's lack delay_ms,
        # LeaseLost's its job_id, a subclass's own __init__ may take others): so every one
        # crosses a process isolation's pipe (echomq.isolation) as it was raised.
        return (_rebuilt, (type(self), self.args), self.__dict__)


class ServerUnreachable(EchoMQError, RedisConnectionError):
    """No server could be reached, so nothing was sent (and nothing ran).

    A host that does not resolve or refuses the connection before the client
    ever reached it fails at once (no retry can help a wrong address); a
    server reached before and gone since is retried within the call's window
    (about 30 s for a REQ-carrying verb), then this.  The cause (redis-py's
    ``ConnectionError``) is chained.  Connecting waits at most
    ``socket_connect_timeout`` (5 s by default) per try.
    """


class LeaseLost(EchoMQError):
    """The caller's lease on a job is gone: stop working on it."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = str(job_id)


class JobGone(LeaseLost):
    """The job row does not exist (or has no ``attempts`` field)."""


class StaleToken(LeaseLost):
    """The token is not the row's current ``attempts``, or the job is no longer active."""


class JobExists(EchoMQError):
    """A job with this id already exists in the queue."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = str(job_id)


class PartitionsChanged(EchoMQError, ValueError):
    """``declare_queue`` with a partition count other than the one the server holds for the queue.

    ``queue``, ``declared`` (the server's) and ``asked``.  The count of a
    partitioned queue changes only by the migration of
    docs/concepts/partitions.md, never by declaring again.
    """

    def __init__(self, message: str, queue: str, declared: int, asked: int) -> None:
        super().__init__(message)
        self.queue, self.declared, self.asked = queue, declared, asked


class Unblocked(EchoMQError):
    """The server ended a waiting claim (``block_ms``) before a job came: nothing was claimed.

    ``CLIENT UNBLOCK <id> ERROR``, or the server stopped being a master
    (``REPLICAOF``, a failover): it answers ``-UNBLOCKED ...`` and, in the
    second case, closes the connection.  Claim again (from the new master).
    """


class NotReplicated(EchoMQError):
    """A claim that waits for replicas (``replicas=N``) did not see N of them acknowledge it in time.

    The claimed jobs were given back (RELEASE: pending again at the head of
    the queue, no try of their retry budget used, no stall counted) and no
    handler ran them.  ``job_ids``: the jobs that claim took and still held;
    ``released``: those given back (a release that failed too -- a dead
    connection -- leaves its job to its lease and the reaper);
    ``acked``: how many replicas had acknowledged when the wait ended (0
    when the wait itself failed); ``wanted``: ``replicas``.
    """

    def __init__(
        self, message: str, job_ids: list[str], released: list[str], acked: int, wanted: int
    ) -> None:
        super().__init__(message)
        self.job_ids = job_ids
        self.released = released
        self.acked = acked
        self.wanted = wanted


class ModuleNotLoaded(EchoMQError):
    """The server does not know the EMQ.* commands."""


class BadArgument(EchoMQError, ValueError, ResponseError):
    """The server refused an argument of an EMQ.* command (the message names it).

    Also a ``ValueError``, and a ``redis.ResponseError`` as it was before it
    had a type of its own (code that caught that still does).
    """


class CorruptQueue(EchoMQError, ResponseError):
    """A key of the queue holds the wrong type, or a field the module counts with is not an integer.

    Retrying does not help: an operator must repair the key (the message
    is the server's, word for word).  Also a ``redis.ResponseError``, as it
    was before it had a type of its own.
    """


class Cancelled(EchoMQError):
    """A cooperative cancel, raised at the handler's own safe point."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__("cancelled" if reason is None else f"cancelled: {reason}")
        self.reason = reason


class NotRetryable(EchoMQError):
    """Only a dead or cancelled job can be retried; ``state`` is the job's (None if unknown)."""

    def __init__(self, message: str, job_id: str, state: str | None) -> None:
        super().__init__(message)
        self.job_id = str(job_id)
        self.state = state


class QueueBusy(EchoMQError):
    """The queue has active jobs: obliterate refused (``force=True`` deletes them too)."""


class RateLimited(EchoMQError):
    """Raised by a handler whose downstream said "too many requests" (an HTTP 429).

    The worker gives the job back without using a try (RELEASE) and stops
    every worker's claims of the queue for ``ms`` on the server clock
    (``EMQ.LIMIT ... BACKOFF``); ``ctx.rate_limited(ms)`` raises it.
    """

    def __init__(self, ms: int, message: str = "") -> None:
        if isinstance(ms, bool) or not isinstance(ms, int):
            raise TypeError(f"ms must be an int, not {type(ms).__name__}")
        if not 0 <= ms <= 86_400_000:
            raise ValueError(f"ms must be from 0 to 86400000, got {ms}")
        super().__init__(message or f"rate limited: back off {ms} ms")
        self.ms = ms


class BadSchedule(EchoMQError, ValueError):
    """A schedule's definition is refused (a bad cron expression, an unknown time zone, ...),
    before anything is written; the message says what."""


class NonRetryable(EchoMQError):
    """Raise from a handler when a retry cannot help: the job goes to the dead set at once.

    The try is used and the job ends dead whatever its tries left (EMQ.FAIL
    ... DEAD), with this exception's type, message and traceback stored.
    Subclass it for your own permanent errors.
    """


class RetryLater(EchoMQError):
    """Raise from a handler to have its job tried again ``delay_ms`` from now (a try is used).

    Past its ``max_attempts`` the job is dead as after any failure.
    """

    def __init__(self, message: str = "retry later", *, delay_ms: int) -> None:
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int):
            raise TypeError(f"delay_ms must be an int, not {type(delay_ms).__name__}")
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
        super().__init__(message)
        self.delay_ms = delay_ms


class JobFailed(EchoMQError):
    """The job whose result was waited for is dead: its last failure, as the worker stored it.

    ``type`` and ``message`` split the row's ``last_error`` (``"Type:
    message"``), ``traceback`` is the stored traceback (None when the
    failure had none), ``queue`` and ``job_id`` say which job.
    """

    def __init__(self, queue: str, job_id: str, type: str, message: str, traceback: str | None) -> None:
        job_id = str(job_id)  # an Enqueued is the id, not its repr
        super().__init__(f"job {job_id!r} of queue {queue!r} failed: {type}: {message}")
        self.queue, self.job_id = queue, job_id
        self.type, self.message, self.traceback = type, message, traceback


class JobCancelled(Cancelled):
    """The job whose result was waited for was cancelled (``reason``: the cancel's, if any)."""

    def __init__(self, queue: str, job_id: str, reason: str | None) -> None:
        super().__init__(reason)
        self.queue, self.job_id = queue, str(job_id)


class ResultTimeout(EchoMQError, TimeoutError):
    """A wait for a job's result ran out of time; the job has not ended (it may still)."""

    def __init__(self, queue: str, job_id: str, timeout: float) -> None:
        job_id = str(job_id)  # an Enqueued is the id, not its repr
        super().__init__(f"job {job_id!r} of queue {queue!r} has not ended within {timeout} s")
        self.queue, self.job_id, self.timeout = queue, job_id, timeout


def _rebuilt(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    """An exception unpickled without its ``__init__`` (``RetryLater.__reduce__``): its args and state."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    return exc
