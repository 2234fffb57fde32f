"""The EMQ.* wire protocol, shared by the sync and the asyncio clients.

Each function validates its arguments, builds the command line and says how
to read the reply, without doing any I/O: a ``Call``.  The clients only send
``call.args`` and hand the reply to ``call.read`` (or a ResponseError to
``raise_mapped``), so the two clients cannot drift apart.
"""

from __future__ import annotations

import base64
import enum
import inspect
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Generic, Literal, NoReturn, TypeVar

import redis as redis_sync
from redis.exceptions import ResponseError

from .cancel import Cancellation
from .errors import (
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
from .keyspace import QueueKeys, queue_keys

T = TypeVar("T")
JobId = str | bytes
Payload = bytes | str
EnqueueItem = Payload | tuple[JobId, Payload]
"""One job of ``enqueue_many``: its payload (a new id is made), or ``(job_id, payload)``."""
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


def _enqueued_ids(call: Call[list[str]], reply: Any) -> list[str]:
    count = int(call.args[3])
    return [text(call.args[4 + 2 * i]) for i in range(count)]


def _claimed(call: Call[list[Job]], reply: Any) -> list[Job]:
    if reply is None:
        return []
    return [
        Job(call.queue, text(jid), text(token), data("payload", payload), int(attempt), state)
        for jid, token, payload, attempt, state in reply
    ]


@dataclass(frozen=True)
class CompletedAndClaimed:
    """EMQ.COMPLETECLAIM's answer: whether the completed job's row was gone (:-1), and the jobs claimed."""

    gone: bool
    jobs: list[Job]


def _completed_and_claimed(call: Call[CompletedAndClaimed], reply: Any) -> CompletedAndClaimed:
    done, claimed = reply
    return CompletedAndClaimed(done == -1, _claimed(call, claimed))  # type: ignore[arg-type]


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


def checkpoint(
    queue: str, job_id: JobId, token: str, lease_ms: int, state: bytes | None = None
) -> Call[Cancellation | None]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    lease("lease_ms", lease_ms)
    args: tuple[Any, ...] = ("EMQ.CHECKPOINT", keys.active, keys.job(wid), wid, tok, lease_ms)
    if state is not None:
        if not isinstance(state, bytes | bytearray | memoryview):
            raise TypeError(f"state must be bytes, not {type(state).__name__}")
        args += ("STATE", bytes(state))
    return Call(args, _requested_cancel, queue, wid)


def sweep(queue: str, max_stalled: int, limit: int) -> Call[SweepResult]:
    keys = keys_of(queue)
    positive_int("max_stalled", max_stalled)
    positive_int("limit", limit)
    args = ("EMQ.SWEEP", keys.active, keys.pending, keys.dead, keys.base, max_stalled, limit)
    return Call(args, _sweep_result, queue)


def enqueue(
    queue: str,
    payload: bytes | str,
    job_id: JobId | None,
    delay_ms: int | None = None,
    run_at_ms: int | None = None,
) -> Call[str]:
    keys = keys_of(queue)
    body = payload_bytes(payload)
    when = when_args(delay_ms, run_at_ms)
    wid = wire(job_id) if job_id is not None else new_id()
    args = ("EMQ.ENQUEUE", keys.pending, keys.base, wid, body, *when, "REQ", new_request_id())
    return Call(args, _enqueued_id, queue, wid)


MAX_ENQUEUE_MANY = 10_000
"""The most jobs one EMQ.ENQUEUEMANY takes (the server's bound); enqueue_many sends chunks of it."""


def enqueue_many(
    queue: str, items: Iterable[EnqueueItem], delay_ms: int | None = None, chunk: int = MAX_ENQUEUE_MANY
) -> list[Call[list[str]]]:
    """One EMQ.ENQUEUEMANY per ``chunk`` jobs (each all or nothing), every item checked first.

    An item is a payload (the job gets a new id) or a ``(job_id, payload)``
    pair.  Ids must be distinct across the whole input (``ValueError``):
    two chunks cannot see each other's ids.
    """
    keys = keys_of(queue)
    when = when_args(delay_ms, None)
    positive_int("chunk", chunk)
    jobs: list[tuple[bytes, bytes]] = []
    seen: set[bytes] = set()
    for item in items:
        if isinstance(item, tuple):
            if len(item) != 2:
                raise ValueError(f"an enqueue_many item must be a payload or (job_id, payload), got {item!r}")
            wid, body = wire(item[0]), payload_bytes(item[1])
            if wid in seen:
                raise ValueError(f"job id {text(wid)!r} appears twice in enqueue_many")
            seen.add(wid)
        else:
            wid, body = new_id(), payload_bytes(item)
        jobs.append((wid, body))
    size = min(chunk, MAX_ENQUEUE_MANY)
    return [_many_call(queue, keys, jobs[k : k + size], when) for k in range(0, len(jobs), size)]


def _many_call(
    queue: str, keys: QueueKeys, jobs: list[tuple[bytes, bytes]], when: tuple[Any, ...]
) -> Call[list[str]]:
    flat = [x for job in jobs for x in job]
    args = ("EMQ.ENQUEUEMANY", keys.pending, keys.base, len(jobs), *flat, *when, "REQ", new_request_id())
    return Call(args, _enqueued_ids, queue)


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


def enqueue_many_halves(call: Call[list[str]]) -> list[Call[list[str]]]:
    """A refused ENQUEUEMANY (``over_max_limit``) as two calls of half its jobs, each with a new REQ.

    The server's ``emq.max-limit`` may be set below the 10,000 the client
    sends: it refuses the call whole, so halving until it fits loses nothing
    (each half is all or nothing on its own).
    """
    count = int(call.args[3])
    if count < 2:
        raise ValueError("a one-job ENQUEUEMANY cannot be split")
    jobs = [(call.args[4 + 2 * i], call.args[5 + 2 * i]) for i in range(count)]
    when = tuple(call.args[4 + 2 * count : -2])  # the options but REQ
    keys = keys_of(call.queue)
    half = count // 2
    return [_many_call(call.queue, keys, jobs[:half], when), _many_call(call.queue, keys, jobs[half:], when)]


def claim(
    queue: str, lease_ms: int, count: int = 1, block_ms: int | None = None, request_id: bytes | None = None
) -> Call[list[Job]]:
    """Up to ``count`` jobs, each with its payload: one round trip (waiting up to ``block_ms`` for one)."""
    keys = keys_of(queue)
    lease("lease_ms", lease_ms)
    positive_int("count", count)
    args: tuple[Any, ...] = ("EMQ.CLAIM", keys.pending, keys.active, keys.base, lease_ms)
    if count != 1:
        args += ("COUNT", count)
    if block_ms is not None:
        args += ("BLOCK", ms_int("block_ms", block_ms))
    return Call((*args, "REQ", request_id or new_request_id()), _claimed, queue)


def complete_claim(
    queue: str, job_id: JobId, token: str, lease_ms: int, count: int = 1
) -> Call[CompletedAndClaimed]:
    """COMPLETE ``job_id``, then CLAIM up to ``count`` jobs, in one command (with a fresh REQ).

    The claim's REQ is the call's last argument (``request_id_of``): a claim
    sent with it answers the jobs this call took, should its reply be lost.
    """
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    lease("lease_ms", lease_ms)
    positive_int("count", count)
    args: tuple[Any, ...] = ("EMQ.COMPLETECLAIM", keys.active, keys.job(wid), keys.pending, wid, tok)
    args += (lease_ms,)
    if count != 1:
        args += ("COUNT", count)
    return Call((*args, "REQ", new_request_id()), _completed_and_claimed, queue, wid)


def request_id_of(call: Call[Any]) -> bytes:
    """The REQ a call carries (its last argument)."""
    rid = call.args[-1]
    assert call.args[-2] == "REQ" and isinstance(rid, bytes)
    return rid


# -- an enqueue's retries (issue 28) -------------------------------------------------
# The server answers a retried ENQUEUE or ENQUEUEMANY from the call's record,
# <base>req:<request-id>, which it keeps REQ_RECORD_TTL_S after the first call
# ran (module/emq_core.h: EMQ_ENQUEUE_RECORD_TTL_MS).  A retry arriving later
# would find no record and, if the job's row is gone by then (done at a
# retention of 0, forgotten), enqueue the job again.  So the clients send an
# enqueue again only within REQ_RETRY_WINDOW_S of its first send, on their own
# schedule (RequestWindow), never through redis-py's retries, whose span has no
# bound in time; the other half minute covers a resend still on its way.

REQ_RECORD_TTL_S = 60.0
REQ_RETRY_WINDOW_S = 30.0


class RequestWindow:
    """When a call carrying a REQ may be sent again (sans I/O: the clients send it).

    Each try waits at most ``try_s`` for its reply (the connection's socket
    timeout, 5 s when it has none); after a lost reply (a timeout, a dropped
    connection) the call is sent again after 50 ms, doubling to 1 s, while
    the window since the first send lasts.  ``next_pause`` says None once no
    resend may start in it: the caller raises the last error.
    """

    FIRST_PAUSE_S = 0.05
    MAX_PAUSE_S = 1.0

    def __init__(
        self, now: float, socket_timeout: float | None, window_s: float = REQ_RETRY_WINDOW_S
    ) -> None:
        self.deadline = now + window_s
        self.try_s = 5.0 if socket_timeout is None else max(float(socket_timeout), 0.001)
        self.pause_s = self.FIRST_PAUSE_S

    def next_pause(self, now: float) -> float | None:
        """Seconds to wait before sending again, or None when no resend may start in the window."""
        pause = self.pause_s
        if now + pause >= self.deadline:
            return None
        self.pause_s = min(self.pause_s * 2, self.MAX_PAUSE_S)
        return pause


# -- a claim that waits for replicas (issue 20) ------------------------------------
# WAIT counts the replicas that acknowledged the replication offset of the
# connection's own last write.  A claim answered again by its REQ (a lost
# reply), or by a wake on the server (CLAIM ... BLOCK), may have written on
# another connection, or never on this one: so the wait goes out on one
# connection after a write of its own that is newer than the claim -- an
# EXTEND of each claimed job to one millisecond past the claim's lease (a
# deadline later than the claim's even within the same millisecond, so the
# extension always writes and always replicates) -- and covers the claim too.


@dataclass(frozen=True)
class ReplicaWait:
    """How a claim waits for replicas: checked once, from ``replicas=`` and its companions.

    ``replicas``: how many replicas must have the claim; ``timeout_ms``: how
    long to wait for them; ``aof``: also wait (WAITAOF) until those replicas
    have written it to their append-only file.
    """

    replicas: int
    timeout_ms: int
    aof: bool = False

    def commands(self) -> list[tuple[Any, ...]]:
        """The wait's command lines, sent after the claimed jobs' extensions on the same connection."""
        lines: list[tuple[Any, ...]] = [("WAIT", self.replicas, self.timeout_ms)]
        if self.aof:
            lines.append(("WAITAOF", 0, self.replicas, self.timeout_ms))
        return lines

    def acked(self, replies: Sequence[Any]) -> int:
        """How many replicas had the claim when the wait ended (the least of WAIT's and WAITAOF's counts)."""
        counts = []
        for line, reply in zip(self.commands(), replies, strict=True):
            if isinstance(reply, BaseException):
                raise reply
            counts.append(int(reply[1]) if line[0] == "WAITAOF" else int(reply))
        return min(counts)


MAX_REPLICAS = 1_000


def replica_wait(replicas: object, timeout_ms: object, aof: object) -> ReplicaWait | None:
    """``replicas=``, ``replicas_timeout_ms=``, ``replicas_aof=`` checked; None when no wait is asked for."""
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise TypeError(f"replicas must be an int, not {type(replicas).__name__}")
    if not 0 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"replicas must be between 0 and {MAX_REPLICAS}, got {replicas}")
    # 0 would make WAIT wait for ever: a claim must give up some time.
    timeout = positive_int("replicas_timeout_ms", timeout_ms, MAX_MS)
    if not isinstance(aof, bool):
        raise TypeError(f"replicas_aof must be a bool, not {type(aof).__name__}")
    if replicas == 0:
        if aof:
            raise ValueError("replicas_aof=True needs replicas >= 1")
        return None
    return ReplicaWait(replicas, timeout, aof)


def check_wait_fits(wait: ReplicaWait, socket_timeout: float | None) -> None:
    """The connection must outwait the wait: a ValueError when ``socket_timeout`` would cut it."""
    if socket_timeout is not None and wait.timeout_ms / 1000 >= socket_timeout:
        raise ValueError(
            f"replicas_timeout_ms ({wait.timeout_ms} ms) must be shorter than the connection's "
            f"socket_timeout ({socket_timeout} s), or the wait is cut before it ends"
        )


def held_extensions(jobs: Sequence[Job], lease_ms: int, past_ms: int = 1) -> list[Call[None]]:
    """The write the wait covers: each claimed job's lease, ``past_ms`` past the claim's."""
    return [extend(job.queue, job.id, job.token, min(lease_ms + past_ms, MAX_MS)) for job in jobs]


def still_held(jobs: Sequence[Job], calls: Sequence[Call[None]], replies: Sequence[Any]) -> list[Job]:
    """The jobs whose extension went through; a job lost since its claim (gone, stale) is left out."""
    held = []
    for job, call, reply in zip(jobs, calls, replies, strict=True):
        if extend_outcome(call, reply) is ExtendOutcome.OK:
            held.append(job)
    return held


def waitaof_probe() -> tuple[Any, ...]:
    """WAITAOF for nothing: answered at once where the command exists (Redis 7.2+, Valkey 8+)."""
    return ("WAITAOF", 0, 0, 0)


def probe_says_no_waitaof(exc: ResponseError) -> bool:
    """The probe's error: the server does not know WAITAOF (any other error is raised as it is)."""
    return str(exc).lower().startswith("unknown command")


def no_waitaof() -> BadArgument:
    return BadArgument("replicas_aof=True needs WAITAOF (Redis 7.2+, Valkey 8+); this server lacks it")


def socket_timeout_of(redis_client: Any) -> float | None:
    """The read timeout (seconds) of a redis-py client's connections, None when it has none.

    redis-py 8 defaults to 5 s: a blocking claim must be answered before it
    or redis-py gives up on the connection (and retries the command).
    """
    get = getattr(redis_client, "get_connection_kwargs", None)
    pool = getattr(redis_client, "connection_pool", None)
    kwargs = get() if callable(get) else getattr(pool, "connection_kwargs", {})
    if isinstance(kwargs, dict) and "socket_timeout" in kwargs:
        value = kwargs["socket_timeout"]
    else:  # not given (a cluster client keeps only what it was given): redis-py's default
        value = _default_socket_timeout(type(redis_client))
    return None if value is None else float(value)


def _default_socket_timeout(cls: type) -> Any:
    """The ``socket_timeout`` default of ``cls``'s constructor (else ``redis.Redis``'s)."""
    for candidate in (cls, redis_sync.Redis):
        try:
            parameter = inspect.signature(candidate).parameters.get("socket_timeout")
        except (TypeError, ValueError):
            continue
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
    return None


class BlockingClaim:
    """The BLOCK of each command of one blocking claim (sans I/O: the clients send them).

    ``block_ms`` (0: no limit) is cut into waits that each end well before the
    connection's socket timeout (20% of it, at least 250 ms, earlier: a server
    notices an ended wait up to 1/hz late, 100 ms by default), so redis-py
    never times out a claim the server is still holding: with
    ``socket_timeout=None`` one command waits the whole time; with redis-py's
    default of 5 s, one command per 4 s.  A wait the server ends early with
    null (``CLIENT UNBLOCK``) ends the claim: the caller gets nothing.
    """

    EARLY_MS = 10

    def __init__(self, block_ms: int, socket_timeout: float | None, now: float) -> None:
        ms_int("block_ms", block_ms)
        self.limit_ms: int | None = None
        if socket_timeout is not None:
            self.limit_ms = int((socket_timeout - max(0.25, 0.2 * socket_timeout)) * 1000)
            if self.limit_ms < 1:
                raise ValueError(
                    f"the connection's socket_timeout ({socket_timeout} s) is too short for a blocking "
                    "claim: use more than 0.25 s, or None"
                )
        self.block_ms = block_ms
        self.deadline = None if block_ms == 0 else now + block_ms / 1000
        self.waits = 0

    def next_wait(self, now: float) -> int | None:
        """The next command's BLOCK in ms, or None when the time is up."""
        if self.deadline is None:
            wait = 0 if self.limit_ms is None else self.limit_ms
        else:
            # The first command waits the whole block_ms (capped); later ones what is left.
            # Rounded up: the claim never ends before block_ms has passed.
            left = round((self.deadline - now) * 1000, 6)
            remaining = self.block_ms if self.waits == 0 else math.ceil(left)
            if remaining < 1:
                return None
            wait = remaining if self.limit_ms is None else min(remaining, self.limit_ms)
        self.waits += 1
        return wait

    def ended(self, wait: int, sent: float, answered: float) -> bool:
        """After a null reply: True when the claim is over (its time is up, or the wait was ended early)."""
        if wait == 0:
            return True  # no time limit on the server: only CLIENT UNBLOCK answers null
        return (answered - sent) * 1000 < wait - self.EARLY_MS


def complete(queue: str, job_id: JobId, token: str) -> Call[None]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    return Call(("EMQ.COMPLETE", keys.active, keys.job(wid), wid, tok), _none_unless_gone, queue, wid)


def fail(
    queue: str, job_id: JobId, token: str, error: str, max_attempts: int, delay_ms: int | None = None
) -> Call[FailOutcome]:
    keys, wid = keys_of(queue), wire(job_id)
    tok = check_token(token)
    text_bytes = message("error", error)
    positive_int("max_attempts", max_attempts)
    delay = () if delay_ms is None else ("DELAY", ms_int("delay_ms", delay_ms))
    args: tuple[Any, ...] = ("EMQ.FAIL", keys.active, keys.pending, keys.dead, keys.base, wid, tok)
    args += (max_attempts, text_bytes, *delay)
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
    "count must be",  # not "count exceeds the server's emq.max-limit": enqueue_many halves those
    "the number of ids exceeds",
    "DELAY ",
    "AT ",
    "BLOCK ",
    "UNTIL ",
    "the same id appears twice",
    "the checkpoint state is larger",
    "syntax error",
    "the REQ request id ",
    "<active>",
    "<pending>",
    "<dead>",
    "<job>",
    "in cluster mode <base>",
)
_CORRUPT = (
    "WRONGTYPE",
    "the record of this REQ request id ",
    "a swept job row ",
    "the job row's ",
    "the metrics:failed ",
    "the queue's meta hash ",
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


# -- the operator's verbs (issue 13) ---------------------------------------------
# Retention, job status, retry, purge, pause/resume, obliterate.  The reads
# that need several commands are a ``Read``: the keyed commands to send in one
# MULTI/EXEC (one slot, so a cluster node serves it whole), built from the
# server's clock read just before, and how to read their replies.

KEEP_FOREVER = -1
"""A retention of -1: the finished rows are kept until deleted."""


@dataclass(frozen=True)
class Retention:
    """How long a queue keeps its finished rows, in ms (``KEEP_FOREVER`` = -1; 0 = not at all).

    Defaults: done rows an hour, cancelled rows a day, dead rows until
    retried or purged.
    """

    done_ms: int = 3_600_000
    cancelled_ms: int = 86_400_000
    dead_ms: int = KEEP_FOREVER


@dataclass(frozen=True)
class JobInfo:
    """One job as its row and the queue's sets said at one instant (``server_time``, ms).

    Times are server ms.  ``lease_deadline``/``lease_left_ms`` while the job
    is active (negative time left: the lease lapsed and a sweep will take
    it); ``due_at`` while it waits with a pending score in the future (a
    delayed job); ``dead_at`` while it is in the dead set; ``expires_at`` when
    the row has a retention expiry.  ``payload`` only when asked for
    (``payload_size`` always).  Fields that are absent or not integers read
    as None (0 for the counters).
    """

    queue: str
    id: str
    state: str
    attempts: int
    tries: int
    retries: int
    stalled: int
    last_error: str | None
    cancel_requested: bool
    cancel_reason: str | None
    enqueued_at: int | None
    claimed_at: int | None
    finished_at: int | None
    lease_deadline: int | None
    lease_left_ms: int | None
    due_at: int | None
    dead_at: int | None
    expires_at: int | None
    payload_size: int
    payload: bytes | None
    checkpoint_size: int | None
    checkpoint_at: int | None
    checkpoint_attempt: int | None
    server_time: int


@dataclass(frozen=True)
class QueueCounts:
    """A queue's numbers at one instant (``server_time``, ms).

    ``pending`` is claimable now, ``delayed`` waits for a later time;
    ``lapsed`` of the ``active`` are past their lease (a sweep takes them);
    ``failed`` is the dead-lettered metric (every death ever, not the dead
    set's size).
    """

    pending: int
    delayed: int
    active: int
    lapsed: int
    dead: int
    paused: bool
    failed: int
    server_time: int


@dataclass(frozen=True)
class DeadJob:
    """A job in the dead set: when it died (server ms), why, and its counters."""

    id: str
    died_at: int
    last_error: str | None
    attempts: int
    tries: int
    retries: int
    stalled: int


@dataclass(frozen=True)
class RetryDeadResult:
    """One EMQ.RETRYDEAD (or all of ``retry_dead``): jobs retried, and members dropped.

    ``dropped`` left the dead set without a retry: their row was gone or
    was not dead (the set was wrong about them).
    """

    retried: int = 0
    dropped: int = 0


@dataclass(frozen=True)
class ObliterateResult:
    """What ``obliterate`` deleted: members of the three sets (with their rows), and finished rows."""

    removed: int = 0
    forgotten: int = 0


@dataclass(frozen=True)
class Read(Generic[T]):
    """Commands of one queue to run in one MULTI/EXEC after reading the server clock."""

    key: str
    build: Callable[[int], list[tuple[Any, ...]]]
    parse: Callable[[int, list[Any]], T]


def _int(value: Any, default: int | None = None) -> int | None:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _count(value: Any) -> int:
    result = _int(value, 0)
    assert result is not None
    return result


def _opt_text(value: Any) -> str | None:
    return None if value is None else text(value)


def retention_ms(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (ms, or -1 to keep forever), not {type(value).__name__}")
    if value < KEEP_FOREVER or value > 2**53:
        raise ValueError(f"{name} must be -1 (keep forever) or from 0 to 2**53 ms, got {value}")
    return value


def _retention(call: Call[Retention], reply: Any) -> Retention:
    done, cancelled, dead = (int(v) for v in reply)
    return Retention(done, cancelled, dead)


def retention(
    queue: str, done_ms: int | None = None, cancelled_ms: int | None = None, dead_ms: int | None = None
) -> Call[Retention]:
    keys = keys_of(queue)
    args: tuple[Any, ...] = ("EMQ.RETENTION", keys.pending, keys.base)
    for option, name, value in (
        ("DONE", "done_ms", done_ms),
        ("CANCELLED", "cancelled_ms", cancelled_ms),
        ("DEAD", "dead_ms", dead_ms),
    ):
        if value is not None:
            args += (option, retention_ms(name, value))
    return Call(args, _retention, queue)


def _retried(call: Call[None], reply: Any) -> None:
    _check_gone(call, reply)


def retry(queue: str, job_id: JobId) -> Call[None]:
    keys, wid = keys_of(queue), wire(job_id)
    return Call(("EMQ.RETRY", keys.dead, keys.pending, keys.base, wid), _retried, queue, wid)


def _retry_dead_result(call: Call[RetryDeadResult], reply: Any) -> RetryDeadResult:
    retried, dropped = reply
    return RetryDeadResult(int(retried), int(dropped))


def retry_dead(queue: str, limit: int, until: int | None = None) -> Call[RetryDeadResult]:
    positive_int("limit", limit)
    keys = keys_of(queue)
    args: tuple[Any, ...] = ("EMQ.RETRYDEAD", keys.dead, keys.pending, keys.base, limit)
    if until is not None:
        args += ("UNTIL", int(until))
    return Call(args, _retry_dead_result, queue)


def _integer(call: Call[int], reply: Any) -> int:
    return int(reply)


def purge_dead(queue: str, limit: int, until: int | None = None) -> Call[int]:
    positive_int("limit", limit)
    keys = keys_of(queue)
    args: tuple[Any, ...] = ("EMQ.PURGE", keys.dead, keys.base, limit)
    if until is not None:
        args += ("UNTIL", int(until))
    return Call(args, _integer, queue)


def _changed(call: Call[bool], reply: Any) -> bool:
    return bool(reply == 1)


def pause(queue: str) -> Call[bool]:
    keys = keys_of(queue)
    return Call(("EMQ.PAUSE", keys.pending, keys.base), _changed, queue)


def resume(queue: str) -> Call[bool]:
    keys = keys_of(queue)
    return Call(("EMQ.RESUME", keys.pending, keys.base), _changed, queue)


def _obliterated(call: Call[tuple[int, int]], reply: Any) -> tuple[int, int]:
    removed, remaining = reply
    return int(removed), int(remaining)


def obliterate(queue: str, limit: int, force: bool) -> Call[tuple[int, int]]:
    """One bounded step: (members removed with their rows, members left)."""
    positive_int("limit", limit)
    keys = keys_of(queue)
    args: tuple[Any, ...] = ("EMQ.OBLITERATE", keys.active, keys.pending, keys.dead, keys.base, limit)
    return Call((*args, "FORCE") if force else args, _obliterated, queue)


def forget(queue: str, job_ids: Sequence[JobId]) -> Call[int]:
    """Delete the rows of these ids that are done or cancelled; how many were."""
    if not job_ids:
        raise ValueError("forget needs at least one job id")
    keys = keys_of(queue)
    return Call(("EMQ.FORGET", keys.pending, keys.base, *(wire(i) for i in job_ids)), _integer, queue)


def forget_steps(queue: str, job_ids: Sequence[JobId], limit: int) -> list[Call[int]]:
    """``forget`` in calls of at most ``limit`` ids each (SCAN may find more keys than its COUNT)."""
    positive_int("limit", limit)
    return [forget(queue, job_ids[k : k + limit]) for k in range(0, len(job_ids), limit)]


def _glob_escape(value: str) -> str:
    return "".join("\\" + c if c in "\\*?[]" else c for c in value)


def rows_pattern(queue: str) -> str:
    """The SCAN MATCH pattern of a queue's job rows."""
    return _glob_escape(keys_of(queue).base) + "job:*"


def scan_rows(queue: str, cursor: int, count: int) -> tuple[Any, ...]:
    """One SCAN step over the queue's job rows."""
    return ("SCAN", cursor, "MATCH", rows_pattern(queue), "COUNT", count)


def scan_reply(reply: Any) -> tuple[int, list[bytes]]:
    """SCAN's (cursor, keys); redis-py's cluster client answers ({node: cursor}, keys)."""
    cursor, keys = reply
    if isinstance(cursor, dict):
        (cursor,) = cursor.values()
    return int(cursor), [wire(k) for k in keys]


def row_id(queue: str, key: bytes | str) -> bytes:
    """The job id of a row key that SCAN found."""
    prefix = keys_of(queue).base.encode() + b"job:"
    raw = key if isinstance(key, bytes) else key.encode("utf-8", "surrogateescape")
    return raw[len(prefix) :]


JOB_FIELDS = (
    "state", "attempts", "tries", "retries", "stalled", "last_error", "cancel_requested",
    "enqueued_at", "claimed_at", "finished_at", "checkpoint_at", "checkpoint_attempt",
)  # fmt: skip


def job_info(queue: str, job_id: JobId, with_payload: bool = False) -> Read[JobInfo | None]:
    keys, wid = keys_of(queue), wire(job_id)
    row = keys.job(wid)
    fields = (*JOB_FIELDS, "payload") if with_payload else JOB_FIELDS

    def build(now: int) -> list[tuple[Any, ...]]:
        return [
            ("EXISTS", row),
            ("HMGET", row, *fields),
            ("HSTRLEN", row, "payload"),
            ("HEXISTS", row, "checkpoint"),
            ("HSTRLEN", row, "checkpoint"),
            ("ZSCORE", keys.active, wid),
            ("ZSCORE", keys.pending, wid),
            ("ZSCORE", keys.dead, wid),
            ("PTTL", row),
        ]

    def parse(now: int, replies: list[Any]) -> JobInfo | None:
        exists, values, payload_size, has_checkpoint, checkpoint_size, active, pending, dead, pttl = replies
        if not exists:
            return None
        v = dict(zip(fields, values, strict=True))
        deadline = None if active is None else int(float(active))
        due = None if pending is None or float(pending) <= now else int(float(pending))
        cancel = v["cancel_requested"]
        return JobInfo(
            queue=queue,
            id=text(wid),
            state=text(v["state"] or b""),
            attempts=_count(v["attempts"]),
            tries=_count(v["tries"] if v["tries"] is not None else v["attempts"]),
            retries=_count(v["retries"]),
            stalled=_count(v["stalled"]),
            last_error=_opt_text(v["last_error"]),
            cancel_requested=cancel is not None,
            cancel_reason=(text(cancel) or None) if cancel is not None else None,
            enqueued_at=_int(v["enqueued_at"]),
            claimed_at=_int(v["claimed_at"]),
            finished_at=_int(v["finished_at"]),
            lease_deadline=deadline,
            lease_left_ms=None if deadline is None else deadline - now,
            due_at=due,
            dead_at=None if dead is None else int(float(dead)),
            expires_at=now + int(pttl) if int(pttl) >= 0 else None,
            payload_size=int(payload_size),
            payload=None if not with_payload else wire(v["payload"] or b""),
            checkpoint_size=int(checkpoint_size) if has_checkpoint else None,
            checkpoint_at=_int(v["checkpoint_at"]),
            checkpoint_attempt=_int(v["checkpoint_attempt"]),
            server_time=now,
        )

    return Read(keys.pending, build, parse)


def counts(queue: str) -> Read[QueueCounts]:
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        return [
            ("ZCARD", keys.pending),
            ("ZCOUNT", keys.pending, "-inf", now),
            ("ZCARD", keys.active),
            ("ZCOUNT", keys.active, "-inf", f"({now}"),
            ("ZCARD", keys.dead),
            ("HEXISTS", keys.meta, "paused"),
            ("HGET", keys.metrics_failed, "count"),
        ]

    def parse(now: int, replies: list[Any]) -> QueueCounts:
        waiting, ready, active, lapsed, dead, paused, failed = replies
        return QueueCounts(
            pending=int(ready),
            delayed=int(waiting) - int(ready),
            active=int(active),
            lapsed=int(lapsed),
            dead=int(dead),
            paused=bool(paused),
            failed=_count(failed),
            server_time=now,
        )

    return Read(keys.pending, build, parse)


def _pairs(reply: Any) -> list[tuple[bytes, float]]:
    """ZRANGE ... WITHSCORES as (member, score) pairs, from RESP2's flat list or RESP3's pairs."""
    if reply and isinstance(reply[0], list | tuple):
        return [(wire(m), float(s)) for m, s in reply]
    return [(wire(reply[i]), float(reply[i + 1])) for i in range(0, len(reply), 2)]


DEAD_FIELDS = ("last_error", "attempts", "tries", "retries", "stalled")


def dead_page(queue: str, offset: int, count: int) -> Read[list[tuple[bytes, int]]]:
    """The ids and death times of one page of the dead set, oldest first."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, got {offset!r}")
    positive_int("count", count)
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        return [("ZRANGE", keys.dead, offset, offset + count - 1, "WITHSCORES")]

    def parse(now: int, replies: list[Any]) -> list[tuple[bytes, int]]:
        return [(m, int(s)) for m, s in _pairs(replies[0])]

    return Read(keys.dead, build, parse)


def dead_rows(queue: str, page: list[tuple[bytes, int]]) -> Read[list[DeadJob]]:
    """The rows of a page of dead ids; ids that left the dead set meanwhile are left out."""
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = []
        for wid, _ in page:
            commands.append(("ZSCORE", keys.dead, wid))
            commands.append(("HMGET", keys.job(wid), *DEAD_FIELDS))
        return commands

    def parse(now: int, replies: list[Any]) -> list[DeadJob]:
        jobs = []
        for i, _ in enumerate(page):
            score, values = replies[2 * i], replies[2 * i + 1]
            if score is None:
                continue
            last_error, attempts, tries, retries, stalled = values
            jobs.append(
                DeadJob(
                    id=text(page[i][0]),
                    died_at=int(float(score)),
                    last_error=_opt_text(last_error),
                    attempts=_count(attempts),
                    tries=_count(tries if tries is not None else attempts),
                    retries=_count(retries),
                    stalled=_count(stalled),
                )
            )
        return jobs

    return Read(keys.dead, build, parse)


# -- the operator's views: active and waiting jobs, the queues, shared counters ----


@dataclass(frozen=True)
class ActiveJob:
    """A job in the active set: its lease (server ms) and what its row says about it.

    ``lease_left_ms`` is negative once the lease has lapsed (a sweep will
    take the job).  ``cancel_requested`` is True once a cancel was asked
    for (``cancel_reason`` is its reason, None when none was given).
    """

    id: str
    lease_deadline: int
    lease_left_ms: int
    claimed_at: int | None
    enqueued_at: int | None
    attempts: int
    tries: int
    stalled: int
    cancel_requested: bool
    cancel_reason: str | None


@dataclass(frozen=True)
class PendingJob:
    """A job in the pending set, in claim order: when it is (or was) due, and its counters.

    ``due_at`` is its pending score (server ms): the enqueue time, a delayed
    job's due time, or 0 for a job put back at the head of the queue (by a
    sweep or a release).  ``delayed`` is True while ``due_at`` is in the
    future.  ``waiting_ms`` is how long it has been claimable: now minus
    ``due_at`` (for a job at the head, minus its last claim or its enqueue
    time), 0 while delayed.
    """

    id: str
    due_at: int
    delayed: bool
    waiting_ms: int
    enqueued_at: int | None
    claimed_at: int | None
    attempts: int
    tries: int
    retries: int
    cancel_requested: bool


COUNTER_FIELDS = ("claimed", "completed", "failed", "cancelled", "released", "recovered", "lease_lost")
"""The fields of ``<base>metrics:counts``, the counters workers and reapers share through Redis."""


@dataclass(frozen=True)
class QueueCounters:
    """A queue's shared counters (totals since they were first written), at ``server_time``.

    ``dead_lettered`` is the module's own count of deaths (``<base>metrics:failed``);
    the others are added by the workers and reapers that run with
    ``echomq.metrics.Metrics`` (``<base>metrics:counts``): jobs claimed,
    completed, failed (a handler raised: retried or dead), ended cancelled,
    given back (released), recovered by a sweep, and leases the holder lost.
    """

    claimed: int
    completed: int
    failed: int
    cancelled: int
    released: int
    recovered: int
    lease_lost: int
    dead_lettered: int
    server_time: int


def counters_key(queue: str) -> str:
    """The hash of the counters workers and reapers share: ``<base>metrics:counts``."""
    return keys_of(queue).base + "metrics:counts"


def counters(queue: str) -> Read[QueueCounters]:
    keys, key = keys_of(queue), counters_key(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        return [("HMGET", key, *COUNTER_FIELDS), ("HGET", keys.metrics_failed, "count")]

    def parse(now: int, replies: list[Any]) -> QueueCounters:
        values, dead = replies
        shared = {name: _count(v) for name, v in zip(COUNTER_FIELDS, values, strict=True)}
        return QueueCounters(**shared, dead_lettered=_count(dead), server_time=now)

    return Read(keys.pending, build, parse)


def add_counters(queue: str, deltas: dict[str, int]) -> list[tuple[Any, ...]]:
    """The commands that add ``deltas`` (fields of ``COUNTER_FIELDS``) to the shared counters."""
    key = counters_key(queue)
    return [("HINCRBY", key, name, n) for name, n in deltas.items() if n and name in COUNTER_FIELDS]


def _page(queue: str, key: str, offset: int, count: int) -> Read[list[tuple[bytes, int]]]:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an int >= 0, got {offset!r}")
    positive_int("count", count)

    def build(now: int) -> list[tuple[Any, ...]]:
        return [("ZRANGE", key, offset, offset + count - 1, "WITHSCORES")]

    def parse(now: int, replies: list[Any]) -> list[tuple[bytes, int]]:
        return [(m, int(s)) for m, s in _pairs(replies[0])]

    return Read(key, build, parse)


ACTIVE_FIELDS = ("claimed_at", "enqueued_at", "attempts", "tries", "stalled", "cancel_requested")


def active_page(queue: str, offset: int, count: int) -> Read[list[tuple[bytes, int]]]:
    """The ids and lease deadlines of one page of the active set, soonest deadline first."""
    return _page(queue, keys_of(queue).active, offset, count)


def active_rows(queue: str, page: list[tuple[bytes, int]]) -> Read[list[ActiveJob]]:
    """The rows of a page of active ids; ids that left the active set meanwhile are left out."""
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = []
        for wid, _ in page:
            commands.append(("ZSCORE", keys.active, wid))
            commands.append(("HMGET", keys.job(wid), *ACTIVE_FIELDS))
        return commands

    def parse(now: int, replies: list[Any]) -> list[ActiveJob]:
        jobs = []
        for i, (wid, _) in enumerate(page):
            score, values = replies[2 * i], replies[2 * i + 1]
            if score is None:
                continue
            claimed, enqueued, attempts, tries, stalled, cancel = values
            deadline = int(float(score))
            jobs.append(
                ActiveJob(
                    id=text(wid),
                    lease_deadline=deadline,
                    lease_left_ms=deadline - now,
                    claimed_at=_int(claimed),
                    enqueued_at=_int(enqueued),
                    attempts=_count(attempts),
                    tries=_count(tries if tries is not None else attempts),
                    stalled=_count(stalled),
                    cancel_requested=cancel is not None,
                    cancel_reason=(text(cancel) or None) if cancel is not None else None,
                )
            )
        return jobs

    return Read(keys.active, build, parse)


PENDING_FIELDS = ("enqueued_at", "claimed_at", "attempts", "tries", "retries", "cancel_requested")


def pending_page(queue: str, offset: int, count: int) -> Read[list[tuple[bytes, int]]]:
    """The ids and due times of one page of the pending set, in claim order."""
    return _page(queue, keys_of(queue).pending, offset, count)


def pending_rows(queue: str, page: list[tuple[bytes, int]]) -> Read[list[PendingJob]]:
    """The rows of a page of pending ids; ids claimed or cancelled meanwhile are left out."""
    keys = keys_of(queue)

    def build(now: int) -> list[tuple[Any, ...]]:
        commands: list[tuple[Any, ...]] = []
        for wid, _ in page:
            commands.append(("ZSCORE", keys.pending, wid))
            commands.append(("HMGET", keys.job(wid), *PENDING_FIELDS))
        return commands

    def parse(now: int, replies: list[Any]) -> list[PendingJob]:
        jobs = []
        for i, (wid, _) in enumerate(page):
            score, values = replies[2 * i], replies[2 * i + 1]
            if score is None:
                continue
            enqueued, claimed, attempts, tries, retries, cancel = values
            due = int(float(score))
            since = due if due > 0 else (_int(claimed) or _int(enqueued) or now)
            jobs.append(
                PendingJob(
                    id=text(wid),
                    due_at=due,
                    delayed=due > now,
                    waiting_ms=max(0, now - since),
                    enqueued_at=_int(enqueued),
                    claimed_at=_int(claimed),
                    attempts=_count(attempts),
                    tries=_count(tries if tries is not None else attempts),
                    retries=_count(retries),
                    cancel_requested=cancel is not None,
                )
            )
        return jobs

    return Read(keys.pending, build, parse)


QUEUE_SETS = ("pending", "active", "dead")
QUEUES_PATTERN = "emq:{*}:*"


def scan_queues(cursor: int, count: int) -> tuple[Any, ...]:
    """One SCAN step over the sorted sets that look like a queue's (``emq:{Q}:pending|active|dead``)."""
    return ("SCAN", cursor, "MATCH", QUEUES_PATTERN, "COUNT", count, "TYPE", "zset")


def queue_of_key(key: bytes | str) -> str | None:
    """The queue a key found by ``scan_queues`` belongs to, or None when it is not a queue's set."""
    name = text(key)
    if not name.startswith("emq:{"):
        return None
    queue, sep, rest = name[len("emq:{") :].partition("}:")
    if not sep or rest not in QUEUE_SETS or not queue or "{" in queue or "}" in queue:
        return None
    return queue
