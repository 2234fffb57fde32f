"""The exceptions echomq raises.

Catch at the level you care about::

    EchoMQError            anything echomq itself reports
    ├── LeaseLost          the caller no longer holds the job
    │   ├── JobGone        the job row does not exist any more
    │   └── StaleToken     another attempt holds it, or it is no longer active
    ├── JobExists          enqueue with an id that is already taken
    ├── ModuleNotLoaded    the server has no emq module (start it with --loadmodule)
    ├── BadArgument        the server refused an argument (also a ValueError)
    ├── CorruptQueue       a key or field of the queue is not what the module expects
    └── Cancelled          raised by CancelToken.raise_if_cancelled()

The clients check argument types and ranges before sending anything and raise
``TypeError``/``ValueError`` naming the argument; ``BadArgument`` is for what
only the server can tell (a lease whose deadline would be too large).
Connection errors and the server's own typed refusals (``NoPermissionError``,
``ReadOnlyError``, ``OutOfMemoryError``, ``TryAgainError``) stay redis-py's.
"""

from __future__ import annotations


class EchoMQError(Exception):
    """Base class of every exception echomq raises."""


class LeaseLost(EchoMQError):
    """The caller's lease on a job is gone: stop working on it."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class JobGone(LeaseLost):
    """The job row does not exist (or has no ``attempts`` field)."""


class StaleToken(LeaseLost):
    """The token is not the row's current ``attempts``, or the job is no longer active."""


class JobExists(EchoMQError):
    """A job with this id already exists in the queue."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class ModuleNotLoaded(EchoMQError):
    """The server does not know the EMQ.* commands."""


class BadArgument(EchoMQError, ValueError):
    """The server refused an argument of an EMQ.* command (the message names it)."""


class CorruptQueue(EchoMQError):
    """A key of the queue holds the wrong type, or a field the module counts with is not an integer.

    Retrying does not help: an operator must repair the key (the message
    is the server's, word for word).
    """


class Cancelled(EchoMQError):
    """A cooperative cancel, raised at the handler's own safe point."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__("cancelled" if reason is None else f"cancelled: {reason}")
        self.reason = reason
