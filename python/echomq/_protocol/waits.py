"""How a call waits: an enqueue's resends within its request window, a claim that waits for
replicas, and a blocking claim cut to the connection's socket timeout (sans I/O: the clients
send what these say).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis as redis_sync
from redis.exceptions import ResponseError

from ..errors import BadArgument
from .calls import MAX_MS, Call, ms_int, positive_int
from .lifecycle import ExtendOutcome, Job, extend, extend_outcome

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


_DEFAULT_TIMEOUTS: dict[type, Any] = {}


def _default_socket_timeout(cls: type) -> Any:
    """The ``socket_timeout`` default of ``cls``'s constructor (else ``redis.Redis``'s).

    Kept per class: ``inspect.signature`` is read once, where it took a quarter of the
    time of every ``client.enqueue`` of a client made without ``socket_timeout``.
    """
    if cls not in _DEFAULT_TIMEOUTS:
        _DEFAULT_TIMEOUTS[cls] = _read_default_socket_timeout(cls)
    return _DEFAULT_TIMEOUTS[cls]


def _read_default_socket_timeout(cls: type) -> Any:
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
