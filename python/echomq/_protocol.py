"""The EMQ.* wire protocol, shared by the sync and the asyncio clients.

Each function validates its arguments, builds the command line and says how
to read the reply, without doing any I/O: a ``Call``.  The clients only send
``call.args`` and hand the reply to ``call.read`` (or a ResponseError to
``raise_mapped``), so the two clients cannot drift apart.
"""

from __future__ import annotations

import enum
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Generic, Literal, NoReturn, TypeVar

from redis.exceptions import ResponseError

from .cancel import Cancellation
from .errors import BadArgument, CorruptQueue, JobExists, JobGone, ModuleNotLoaded, StaleToken
from .keyspace import QueueKeys, queue_keys

T = TypeVar("T")
JobId = str | bytes
CancelOutcome = Literal["cancelled", "requested", "finished"]
FailOutcome = Literal["pending", "dead", "cancelled"]
ReleaseOutcome = Literal["pending", "cancelled"]


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did, each list in processing order (oldest deadline first).

    ``recovered`` went back to pending, ``dead`` were dead-lettered at
    max-stalled stalls, ``cancelled`` had a cancel request and ended
    cancelled; ``expired`` counts dead rows removed past the queue's dead
    retention.
    """

    recovered: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    expired: int = 0

    def __len__(self) -> int:
        """The lapsed jobs this sweep took (recovered, dead or cancelled)."""
        return len(self.recovered) + len(self.dead) + len(self.cancelled)


@dataclass(frozen=True)
class Job:
    """A claimed job.

    ``token`` is the holder's fencing token, fresh for every claim (an
    opaque string: the claim's number and a random part); ``attempt`` is
    this claim's number within the job's retry budget (1 on a first run);
    ``resume_state`` is the state the job's last checkpoint stored, or None.
    """

    queue: str
    id: str
    token: str
    payload: bytes
    attempt: int = 1
    resume_state: bytes | None = None


class ExtendOutcome(enum.Enum):
    """What one extension of ``Client.extend_many`` did."""

    OK = "ok"
    """The lease now ends at server-now + ``lease_ms``."""
    GONE = "gone"
    """The job row no longer exists (``extend`` would raise ``JobGone``)."""
    STALE = "stale"
    """Another attempt holds the job, or it is no longer active (``StaleToken``)."""


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
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value


def wire(value: JobId, name: str = "job_id") -> bytes:
    """An id as the bytes sent to the server; ``name`` is the argument named in errors."""
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
    # Time first, so jobs enqueued in the same server millisecond (equal
    # pending scores, ordered by id) still come out roughly in order.
    return f"{time.time_ns():x}-{uuid.uuid4().hex[:12]}".encode()


def new_request_id() -> bytes:
    """A request id (REQ) for a call that must not take effect twice.

    redis-py retries a command whose reply was lost (a timeout, a dropped
    connection); with the same REQ the server answers the retry with the
    first call's result instead of claiming or enqueueing again.
    """
    return uuid.uuid4().hex.encode()


def check_token(value: object) -> bytes:
    """A fencing token as sent: the str (or bytes) a claim handed out."""
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


def keys_of(queue: object) -> QueueKeys:
    """queue_keys, memoized: the hot path (extend) should not rebuild key names."""
    if not isinstance(queue, str):
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


def _requested_cancel(call: Call[Cancellation | None], reply: Any) -> Cancellation | None:
    _check_gone(call, reply)
    reason = reply[1]
    return None if reason is None else Cancellation(text(reason) or None)


def _sweep_result(call: Call[SweepResult], reply: Any) -> SweepResult:
    recovered, dead, cancelled, expired = reply
    return SweepResult(
        [text(i) for i in recovered], [text(i) for i in dead], [text(i) for i in cancelled], int(expired)
    )


def _enqueued_id(call: Call[str], reply: Any) -> str:
    return call.job_id


def _claimed(call: Call[list[Job]], reply: Any) -> list[Job]:
    if reply is None:
        return []
    return [
        Job(call.queue, text(jid), text(token), data("payload", payload), int(attempt), state)
        for jid, token, payload, attempt, state in reply
    ]


def _fail_outcome(call: Call[FailOutcome], reply: Any) -> FailOutcome:
    _check_gone(call, reply)
    outcome = text(reply)
    if outcome == "dead":
        return "dead"
    return "cancelled" if outcome == "cancelled" else "pending"


def _cancel_outcome(call: Call[CancelOutcome], reply: Any) -> CancelOutcome:
    _check_gone(call, reply)
    outcome = text(reply)
    if outcome == "cancelled":
        return "cancelled"
    return "requested" if outcome == "requested" else "finished"


# -- the commands ----------------------------------------------------------------


def extend(queue: str, job_id: JobId, token: str, lease_ms: int) -> Call[None]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    lease("lease_ms", lease_ms)
    args = ("EMQ.EXTEND", keys.active, keys.job(wid), wid, tok, lease_ms)
    return Call(args, _none_unless_gone, queue, wid)


def extend_outcome(call: Call[None], reply: Any) -> ExtendOutcome:
    """One pipelined EXTEND's reply (or the ResponseError in its place) as an outcome."""
    if reply == 1:
        return ExtendOutcome.OK
    if reply == -1:
        return ExtendOutcome.GONE
    if isinstance(reply, ResponseError):
        if str(reply).startswith("EMQSTALE"):
            return ExtendOutcome.STALE
        raise_mapped(reply, call)
    if isinstance(reply, BaseException):
        raise reply
    raise TypeError(f"unexpected EMQ.EXTEND reply {reply!r}")


def extend_batch(queue: str, jobs: Iterable[tuple[JobId, str]], lease_ms: int) -> list[Call[None]]:
    """One EXTEND per (job_id, token), every argument checked before any is sent."""
    calls = []
    for pair in jobs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"jobs must be (job_id, token) pairs, got {pair!r}")
        calls.append(extend(queue, pair[0], pair[1], lease_ms))
    return calls


def checkpoint(queue: str, job_id: JobId, token: str, lease_ms: int) -> Call[Cancellation | None]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    lease("lease_ms", lease_ms)
    args = ("EMQ.CHECKPOINT", keys.active, keys.job(wid), wid, tok, lease_ms)
    return Call(args, _requested_cancel, queue, wid)


def sweep(queue: str, max_stalled: int, limit: int) -> Call[SweepResult]:
    keys = keys_of(queue)
    positive_int("max_stalled", max_stalled)
    positive_int("limit", limit)
    args = ("EMQ.SWEEP", keys.active, keys.pending, keys.dead, keys.base, max_stalled, limit)
    return Call(args, _sweep_result, queue)


def enqueue(queue: str, payload: bytes | str, job_id: JobId | None) -> Call[str]:
    keys = keys_of(queue)
    body = data("payload", payload)
    wid = wire(job_id) if job_id is not None else new_id()
    args = ("EMQ.ENQUEUE", keys.pending, keys.base, wid, body, "REQ", new_request_id())
    return Call(args, _enqueued_id, queue, wid)


def claim(queue: str, lease_ms: int, count: int = 1) -> Call[list[Job]]:
    """Up to ``count`` jobs, each with its payload: one round trip."""
    keys = keys_of(queue)
    lease("lease_ms", lease_ms)
    positive_int("count", count)
    args: tuple[Any, ...] = ("EMQ.CLAIM", keys.pending, keys.active, keys.base, lease_ms)
    if count != 1:
        args += ("COUNT", count)
    return Call((*args, "REQ", new_request_id()), _claimed, queue)


def complete(queue: str, job_id: JobId, token: str) -> Call[None]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    return Call(("EMQ.COMPLETE", keys.active, keys.job(wid), wid, tok), _none_unless_gone, queue, wid)


def fail(queue: str, job_id: JobId, token: str, error: str, max_attempts: int) -> Call[FailOutcome]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    text_bytes = message("error", error)
    positive_int("max_attempts", max_attempts)
    args = ("EMQ.FAIL", keys.active, keys.pending, keys.dead, keys.base, wid, tok, max_attempts, text_bytes)
    return Call(args, _fail_outcome, queue, wid)


def _release_outcome(call: Call[ReleaseOutcome], reply: Any) -> ReleaseOutcome:
    _check_gone(call, reply)
    return "cancelled" if text(reply) == "cancelled" else "pending"


def release(queue: str, job_id: JobId, token: str) -> Call[ReleaseOutcome]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    args = ("EMQ.RELEASE", keys.active, keys.pending, keys.base, wid, tok)
    return Call(args, _release_outcome, queue, wid)


def cancel(queue: str, job_id: JobId, reason: str | None) -> Call[CancelOutcome]:
    keys, wid = keys_of(queue), wire(job_id)
    text_bytes = message("reason", reason, optional=True)
    return Call(("EMQ.CANCEL", keys.pending, keys.base, wid, text_bytes), _cancel_outcome, queue, wid)


# The module's own errors (module/emq_core.c's table) by what they mean to a
# caller; redis-py strips the "ERR " prefix of generic errors.
_BAD_ARGUMENT = (
    "lease-ms ",
    "max-stalled ",
    "limit ",
    "max-attempts ",
    "COUNT ",
    "syntax error",
    "the REQ request id ",
    "<active>",
    "<pending>",
    "<job>",
    "in cluster mode <base>",
)
_CORRUPT = (
    "WRONGTYPE",
    "a swept job row ",
    "the job row's ",
    "the metrics:failed ",
    "the queue's meta hash ",
    "increment or decrement would overflow",
)


def raise_mapped(exc: ResponseError, call: Call[Any]) -> NoReturn:
    """Turn a server error into echomq's exception for it (or re-raise redis-py's typed one)."""
    text = str(exc)
    where = f"queue {call.queue!r}" if call.queue else "the queue"
    if text.startswith("EMQSTALE"):
        raise StaleToken(f"{text} (job {call.job_id!r} of {where})", call.job_id) from None
    if text.startswith("EMQEXISTS"):
        raise JobExists(f"job {call.job_id!r} already exists in {where}", call.job_id) from None
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
