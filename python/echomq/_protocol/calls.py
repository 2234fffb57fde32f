"""The Call machinery: one command line to send and how to read its reply, and the argument checks.

Every builder of the other modules of this package validates its arguments
with the functions here, builds the command line and says how to read the
reply, without doing any I/O: a ``Call``.  The clients only send
``call.args`` and hand the reply to ``call.read`` (or a ResponseError to
``raise_mapped``), so the two clients cannot drift apart.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Generic, Literal, NoReturn, TypeVar

from redis.exceptions import NoScriptError, ResponseError

from ..errors import (
    BadArgument,
    CorruptQueue,
    JobExists,
    JobGone,
    ModuleNotLoaded,
    NotRetryable,
    QueueBusy,
    StaleToken,
    Unblocked,
)
from ..keyspace import QueueKeys, queue_keys

T = TypeVar("T")
JobId = str | bytes
Payload = bytes | str
EnqueueItem = Payload | tuple[JobId, Payload]
"""One job of ``enqueue_many``: its payload (a new id is made), or ``(job_id, payload)``."""
CancelOutcome = Literal["cancelled", "requested", "finished"]
FailOutcome = Literal["pending", "dead", "cancelled"]
ReleaseOutcome = Literal["pending", "cancelled"]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One command to send, and how to read its reply.

    ``parse`` is a module-level function of (call, reply): building a Call
    costs no closure, which matters on extend, a busy worker's hot path.
    """

    args: tuple[Any, ...]
    parse: Callable[[Call[T], Any], T]
    queue: str = ""
    wire_id: bytes = b""

    @property
    def job_id(self) -> str:
        return text(self.wire_id)

    def read(self, reply: Any) -> T:
        return self.parse(self, reply)


# -- conversions -----------------------------------------------------------------


def text(value: bytes | str) -> str:
    """An id or reply as str; surrogateescape keeps non-UTF-8 ids round-trippable."""
    # ``__class__ is``, not isinstance: an attribute read where isinstance is a call, on every
    # reply a worker reads (and a subclass takes the general path below, as before).
    if value.__class__ is bytes or isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value


def wire(value: JobId, name: str = "job_id") -> bytes:
    """An id as the bytes sent to the server; ``name`` is the argument named in errors."""
    if value.__class__ is str and value:  # a claim's own id, as a worker sends it back
        return value.encode("utf-8", "surrogateescape")
    if value.__class__ is bytes and value:
        return value
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogateescape")
    else:
        raise TypeError(f"{name} must be str or bytes, not {type(value).__name__}")
    if not data:
        raise ValueError(f"{name} must not be empty")
    return data


def server_ms(time_reply: Sequence[int | bytes | str]) -> int:
    """TIME's reply (seconds, microseconds) as milliseconds on the server's clock, the one EMQ.* reads."""
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000


def new_id() -> bytes:
    # Time first, so ids sort roughly as their jobs were made (the views
    # and `echomq dead` list by id where times tie, and SWEEP's recoveries of
    # one lease deadline go back in id order).
    # os.urandom, not uuid4: a sixth of the cost, which enqueue_many pays per job.
    return f"{time.time_ns():x}-{os.urandom(6).hex()}".encode()


def new_request_id() -> bytes:
    """A request id (REQ) for a call that must not take effect twice.

    A command whose reply was lost (a timeout, a dropped connection) is sent
    again; with the same REQ the server answers the retry with the first
    call's result instead of claiming or enqueueing again.  96 random bits
    in 16 characters: it names the call's record, ``<base>req:<id>``, one
    key per call, so every byte of it is kept for the record's life.
    """
    return base64.urlsafe_b64encode(os.urandom(12))


def check_token(value: object) -> bytes:
    """A fencing token as sent: the str (or bytes) a claim handed out."""
    if value.__class__ is str and value:  # the hot path: a claim's token, as a worker sends it back
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogateescape")
    elif isinstance(value, bytes):
        data = value
    else:
        raise TypeError(f"token must be the str a claim returned, not {type(value).__name__}")
    if not data:
        raise ValueError("token must not be empty")
    return data


# The module's integers are signed 64-bit; a deadline must stay an exact
# double (2^53 ms): no lease, count or limit beyond these can be right.
MAX_COUNT = 2**63 - 1
MAX_MS = 2**53


def positive_int(name: str, value: object, maximum: int = MAX_COUNT) -> int:
    """``value`` if it is an int in [1, maximum], else TypeError/ValueError naming ``name``."""
    if value.__class__ is int and 0 < value <= maximum:  # a bool is not: its class is bool
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def lease(name: str, value: object) -> int:
    """A lease (or any duration) in ms: an int in [1, 2^53]."""
    return positive_int(name, value, MAX_MS)


def data(name: str, value: object) -> bytes:
    """A payload as sent: bytes as they are, a str as UTF-8."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"{name} must be bytes or str, not {type(value).__name__} (serialize it first)")


def message(name: str, value: object, *, optional: bool = False) -> bytes:
    """A text argument (an error, a reason) as UTF-8; None only where ``optional``."""
    if value is None and optional:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    kind = "a str or None" if optional else "a str"
    raise TypeError(f"{name} must be {kind}, not {type(value).__name__}")


MAX_EXACT_MS = 2**53
"""The server keeps due times and deadlines as exact sorted-set scores: at most 2^53 ms."""


def ms_int(name: str, value: object) -> int:
    """A time in milliseconds the server accepts: an int from 0 to 2^53."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (milliseconds), not {type(value).__name__}")
    if not 0 <= value <= MAX_EXACT_MS:
        raise ValueError(f"{name} must be between 0 and 2**53 ms, got {value}")
    return value


def payload_bytes(value: object) -> bytes:
    return data("payload", value)


PRIORITY_MIN, PRIORITY_MAX = -1000, 1000
"""The range of ``priority=`` (the server's PRIORITY): smaller runs first, 0 is the default."""


def priority_args(value: object) -> tuple[Any, ...]:
    """ENQUEUE's ``PRIORITY <n>`` (nothing for None or 0: the default lane)."""
    if value is None:
        return ()
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"priority must be an int, not {type(value).__name__}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise ValueError(f"priority must be from {PRIORITY_MIN} to {PRIORITY_MAX}, got {value}")
    return () if value == 0 else ("PRIORITY", value)


MAX_TRACEBACK_BYTES = 8192
"""The most of a traceback a client sends with FAIL (its newest frames; the server takes up to 64 KiB)."""


def traceback_bytes(value: object) -> bytes:
    """A traceback as FAIL's TRACE sends it: UTF-8, its last ``MAX_TRACEBACK_BYTES`` bytes.

    A traceback reads oldest frame first and ends with the exception: when it
    is too long the oldest frames go, cut at a line, behind a marker line.
    """
    if not isinstance(value, str):
        raise TypeError(f"traceback must be a str, not {type(value).__name__}")
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) <= MAX_TRACEBACK_BYTES:
        return raw
    marker = b"... (older frames cut: the newest 8 KiB are kept)\n"
    tail = raw[len(raw) - (MAX_TRACEBACK_BYTES - len(marker)) :]
    newline = tail.find(b"\n")
    if 0 <= newline < len(tail) - 1:
        tail = tail[newline + 1 :]
    return marker + tail


def when_args(delay_ms: int | None, run_at_ms: int | None) -> tuple[Any, ...]:
    """ENQUEUE's ``DELAY <ms>`` or ``AT <unix-ms>`` (neither: claimable at once)."""
    if delay_ms is not None and run_at_ms is not None:
        raise ValueError("give delay_ms or run_at_ms, not both")
    if delay_ms is not None:
        return ("DELAY", ms_int("delay_ms", delay_ms))
    if run_at_ms is not None:
        return ("AT", ms_int("run_at_ms", run_at_ms))
    return ()


def keys_of(queue: object) -> QueueKeys:
    """queue_keys, memoized: the hot path (extend) should not rebuild key names."""
    if queue.__class__ is not str and not isinstance(queue, str):
        return queue_keys(queue)  # type: ignore[arg-type]  # raises its TypeError, naming the queue name
    return _keys_of(queue)


@lru_cache(maxsize=1024)
def _keys_of(queue: str) -> QueueKeys:
    return queue_keys(queue)


def _check_gone(call: Call[Any], reply: Any) -> None:
    if reply == -1:
        raise JobGone(f"job {call.job_id!r} of queue {call.queue!r} is gone", call.job_id)


def _none_unless_gone(call: Call[None], reply: Any) -> None:
    _check_gone(call, reply)


def over_max_limit(exc: Exception) -> bool:
    """A refusal of a count, limit or list above the server's emq.max-limit (nothing was written)."""
    return "exceeds the server's emq.max-limit" in str(exc)


def halved_limit(exc: Exception, limit: int) -> int | None:
    """The step size to try after ``exc``: half of ``limit`` when the server refused it for its emq.max-limit.

    The bulk verbs' loops (retry_dead, purge_dead, obliterate) take a step
    size of the caller's; a server whose emq.max-limit is lower refuses the
    step whole, writing nothing, so halving until it fits loses nothing.
    None: ``exc`` is another error (or the limit is 1), raise it.
    """
    if not over_max_limit(exc) or limit < 2:
        return None
    return limit // 2


# The module's own errors (module/emq_core.c's table) by what they mean to a
# caller; redis-py strips the "ERR " prefix of generic errors.
_BAD_ARGUMENT = (
    "lease-ms ",
    "max-stalled ",
    "limit ",
    "max-attempts ",
    "COUNT ",
    "count must be",  # not "count exceeds the server's emq.max-limit": enqueue_many halves those
    "the number of ids exceeds",
    "DELAY ",
    "RATE ",
    "PER ",
    "BACKOFF ",
    "AT ",
    "BLOCK ",
    "UNTIL ",
    "the same id appears twice",
    "the checkpoint state is larger",
    "PRIORITY ",
    "the payload is larger",
    "the result is larger",
    "the TRACE is larger",
    "the progress is larger",
    "syntax error",
    "the REQ request id ",
    "<active>",
    "<pending>",
    "<dead>",
    "<job>",
    "in cluster mode <base>",
    "AFTER ",
    "a dependency id ",
    "a job cannot depend ",
    "ON_PARENT_FAILURE ",
    "MISSING ",
    "dependency ",
)
_CORRUPT = (
    "WRONGTYPE",
    "the record of this REQ request id ",
    "a swept job row ",
    "the job row's ",
    "the metrics:failed ",
    "the queue's meta hash ",
    "the queue's limit hash ",
    "increment or decrement would overflow",
)


def read_reply(call: Call[T], reply: Any) -> T:
    """A pipelined reply (an error comes as a value): ``call``'s answer, or its mapped exception."""
    if isinstance(reply, ResponseError):
        raise_mapped(reply, call)
    return call.read(reply)


def raise_mapped(exc: ResponseError, call: Call[Any]) -> NoReturn:
    """Turn a server error into echomq's exception for it (or re-raise redis-py's typed one)."""
    text = str(exc)
    where = f"queue {call.queue!r}" if call.queue else "the queue"
    if text.startswith("EMQSTALE"):
        raise StaleToken(f"{text} (job {call.job_id!r} of {where})", call.job_id) from None
    if text.startswith("EMQEXISTS"):
        raise JobExists(f"job {call.job_id!r} already exists in {where}", call.job_id) from None
    if text.startswith("EMQSTATE"):
        state = text.split(":", 1)[0].removeprefix("EMQSTATE the job is ").strip()
        raise NotRetryable(text, call.job_id, state if " " not in state else None) from None
    if text.startswith("EMQBUSY"):
        raise QueueBusy(text) from None
    if text.startswith("UNBLOCKED"):
        raise Unblocked(text) from None
    if text.lower().startswith(("unknown command", "err unknown command")):
        raise ModuleNotLoaded(
            f"the server does not know {call.args[0]}: start it with "
            "--loadmodule /path/to/emq.so (see echomq.module_path())"
        ) from exc
    if type(exc) is ResponseError:  # redis-py's typed subclasses (NOPERM, READONLY, OOM, ...) stay
        if text.startswith(_BAD_ARGUMENT):
            raise BadArgument(f"{call.args[0]} refused an argument: {text}") from None
        if text.startswith(_CORRUPT):
            raise CorruptQueue(f"{call.args[0]} on {where}: {text}") from None
    raise exc


def missing_code(error: Exception) -> bool:
    """Does the node lack the code (the library's function, or the script), so that nothing ran?

    (redis-py answers NOSCRIPT as a NoScriptError without the word.)"""
    text = str(error)
    return isinstance(error, NoScriptError) or text.startswith("NOSCRIPT") or "Function not found" in text
