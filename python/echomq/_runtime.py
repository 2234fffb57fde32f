"""The worker runtime's rules, without I/O: one core for the thread and asyncio drivers.

``lease.py``, ``reaper.py`` and ``worker.py`` (threads) and ``asyncio.py``
(tasks) only wait, send commands and feed what came back to this module,
which decides: when a lease's next checkpoint is due, what a checkpoint's
reply or exception means, whether the reaper sweeps again, what a handler's
end does to its job, how a command is retried, how a shutdown proceeds, and
what the stats count.  Nothing here sends a command or sleeps; time comes in
as ``now``, seconds on the driver's monotonic clock.  Not thread-safe unless
said: the thread drivers call it under their own lock.

The shape, as a driver sees it (h11 style: feed events, ask what next):

- ``HeldJob``: one claimed job as its keeper sees it (the job and its token,
  the handler's CancelToken, the lease confirmed until when, lost or not).
  ``wait_before_checkpoint(now)`` says what next; ``confirmed()``,
  ``failed()`` and ``expire()`` take what happened.
- ``Leases``: the jobs one worker holds, the set a single keeper could
  checkpoint in one batch (``due``, ``wakeup_in``).
- ``SweepTick``: one reaper tick, "a full batch: sweep again", bounded.
- ``Backoff``: the waits and per-attempt timeouts of one command sent again
  until it lands or a deadline passes.
- ``Troubles``: errors by kind (``TRANSIENT`` heals by retrying, ``PERMANENT``
  does not), each kind logged once with its cause, all counted.
- ``KeeperCore``, ``ReaperCore``, ``WorkerCore``: the settings, validation
  and bookkeeping the public classes share; each driver subclasses one and
  adds only its waiting and sending (``_init_driver`` makes its events).
  ``WorkerCore`` also holds the shutdown: stop claiming, a grace period,
  then "shutdown" to every token, then the jobs given back.
- ``ContextCore``: what a handler's ``JobContext`` shows in both drivers.
"""

from __future__ import annotations

import enum
import inspect
import json
import logging
import math
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from redis import exceptions as rx

from . import _protocol as proto
from ._attempt import NotSent
from ._protocol import MAX_MS, Call, FailOutcome, Job, ReleaseOutcome, SweepResult, check_token, keys_of
from .cancel import Cancellation, CancelToken
from .errors import (
    BadArgument,
    Cancelled,
    CorruptQueue,
    EchoMQError,
    JobGone,
    LeaseLost,
    ModuleNotLoaded,
    NotReplicated,
    StaleToken,
)
from .retry import RetryPolicy

if TYPE_CHECKING:
    from .metrics import Metrics

lease_log = logging.getLogger("echomq.lease")
reaper_log = logging.getLogger("echomq.reaper")
worker_log = logging.getLogger("echomq.worker")

ClientT = TypeVar("ClientT")
HandlerT = TypeVar("HandlerT")
KeeperT = TypeVar("KeeperT")

# Why a lease was lost: the reason given to the handler's CancelToken.
LOST_STALE = "lease lost: stale token (the job was swept or another attempt holds it)"
LOST_GONE = "lease lost: the job row is gone"
LOST_DEADLINE = "lease lost: no extend confirmed before the deadline passed"
LOST_UNCONFIRMED = "lease lost: a claim answered late could not be confirmed within a lease"
# The reason a stopping worker gives its running handlers when their grace is over.
SHUTDOWN = "shutdown"
# A sweep that took `limit` jobs may have left more behind: sweep again, but
# never spin forever on one tick.
MAX_SWEEPS_PER_TICK = 100
# After the grace and "shutdown" on every token, handlers get this much longer
# to return; then the worker gives their jobs back itself and stops waiting:
# a process exits within grace + 1 s.
FORCE_AFTER_S = 0.5
# After a forced stop, how long the worker's commands still in flight or to
# send (the jobs given back, a claim's answer to settle) may take.
FORCE_BUDGET_S = 0.4
# Retrying one command: waits from 50 ms doubling to 1 s (jittered); each
# attempt's reply awaited 2 s, doubling to 30 s (a slow server still answers
# in time; a half-open connection is given up and the next attempt opens a
# fresh one).
RETRY_FIRST_S = 0.05
RETRY_CAP_S = 1.0
ATTEMPT_TIMEOUT_S = 2.0
ATTEMPT_TIMEOUT_CAP_S = 30.0
# A keeper retries a checkpoint that got no answer this soon, or sooner.
CHECKPOINT_RETRY_S = 1.0
# A worker's keeper checkpoints every held job that is due in one batch (one
# pipeline), with those due within this fraction of their interval: one
# command per tick whatever the number of jobs, at most this many in it.
CHECKPOINT_EARLY = 0.25
MAX_CHECKPOINT_BATCH = 500
# An idle worker's claim waits on the server at most this long per command.
MAX_CLAIM_BLOCK_S = 1.0
# The pushed-cancel subscription, while the worker holds jobs: pinged when it
# has been silent this long, and given up (then subscribed again, and every
# held job checkpointed at once) when no answer comes within PONG_WITHIN_S.
# A half-open subscription is noticed within about their sum.
HEALTH_EVERY_S = 1.0
PONG_WITHIN_S = 1.0


# -- arguments -------------------------------------------------------------------


def check_int(name: str, value: object, minimum: int = 1, maximum: int = 2**63 - 1) -> int:
    """``value`` if it is an int in [minimum, maximum], else TypeError/ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{name} must be between {minimum} and {maximum}, got {value}")
    return value


def check_seconds(name: str, value: object, *, zero_ok: bool = False) -> float:
    """A duration in seconds: a finite int or float, > 0 (>= 0 with ``zero_ok``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ValueError(f"{name} must be {'>= 0' if zero_ok else '> 0'} seconds, got {value}")
    return float(value)


def check_callable(name: str, value: object) -> None:
    if not callable(value):
        raise TypeError(f"{name} must be callable, not {type(value).__name__}")


def check_client(name: str, client: object, expected: type | None) -> None:
    """The driver's own client class: a sync worker cannot drive an asyncio client, nor the reverse."""
    if expected is None or isinstance(client, expected):
        return
    package = "echomq.asyncio" if expected.__module__.startswith("echomq.asyncio") else "echomq"
    other = "echomq.Client" if package == "echomq.asyncio" else "echomq.asyncio.Client"
    hint = f" ({other} goes with the other package's classes)" if type(client).__name__ == "Client" else ""
    raise TypeError(f"{name} must be an {package}.{expected.__name__}, not {type(client).__name__}{hint}")


def takes_context(handler: Callable[..., object]) -> bool:
    """True for ``handler(ctx)``, False for the older ``handler(job, cancel)`` (told apart by signature)."""
    try:
        parameters = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): the current style
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in parameters if p.kind in positional and p.default is inspect.Parameter.empty]
    if len(required) == 2:
        return False
    if len(required) > 2:
        raise TypeError(
            f"handler must take one argument (the JobContext) or two (job, cancel), "
            f"not {len(required)}: {handler!r}"
        )
    return True


def lost_reason(exc: BaseException) -> str | None:
    """The reason a checkpoint's exception means the lease is lost, or None (retry)."""
    if isinstance(exc, StaleToken):
        return LOST_STALE
    if isinstance(exc, JobGone):
        return LOST_GONE
    return None


def state_refused(exc: BaseException) -> bool:
    """A checkpoint with state was refused for storing state (past maxmemory): extend without it.

    State grows memory, so a server past maxmemory refuses a checkpoint that
    carries it (and stores nothing, not even the lease); one without state
    still extends the lease.  A state past ``emq.max-state-bytes`` is
    ``BadArgument``: the handler's mistake, raised to it.
    """
    return isinstance(exc, rx.OutOfMemoryError)


def reply_lost(exc: BaseException) -> bool:
    """The command may have reached the server, and its answer was not read (a timeout, a lost connection).

    Then a claim may have taken jobs for its REQ.  An error reply is an
    answer (nothing ran), and ``NotSent`` never left: neither is a lost reply.
    """
    if isinstance(exc, (NotSent, rx.ResponseError)):
        return False
    return isinstance(exc, (rx.ConnectionError, rx.TimeoutError, OSError))


def error_text(error: BaseException) -> str:
    """The ``last_error`` a worker records for a handler's exception."""
    if isinstance(error, Cancelled):
        return str(error)  # "cancelled: <reason>"
    return f"{type(error).__name__}: {error}"


def job_fields(job: Job) -> dict[str, object]:
    """``extra=`` for a log line about ``job``: echomq's log format shows queue, job and attempt."""
    return {"echomq_queue": job.queue, "echomq_job": job.id, "echomq_attempt": job.attempt}


# -- errors and retries ------------------------------------------------------------


class Trouble(enum.Enum):
    """What an error from the server (or the way to it) means for retrying."""

    TRANSIENT = "transient"
    """Connection lost, timeout, server loading, out of memory, slot moving: retry, it heals."""
    PERMANENT = "permanent"
    """ACL refusal, read-only replica, module missing, wrong key type, a bug: retrying will not heal it."""


def trouble(exc: BaseException) -> Trouble:
    """Classify an exception raised by a command."""
    if isinstance(exc, (ModuleNotLoaded, CorruptQueue, BadArgument)):
        return Trouble.PERMANENT
    if isinstance(exc, (rx.NoPermissionError, rx.ReadOnlyError, rx.AuthenticationError)):
        return Trouble.PERMANENT
    if isinstance(exc, (rx.ConnectionError, rx.TimeoutError, OSError)):  # BusyLoadingError too
        return Trouble.TRANSIENT
    if isinstance(exc, (rx.OutOfMemoryError, rx.TryAgainError, rx.ClusterDownError, rx.MasterDownError)):
        return Trouble.TRANSIENT
    if isinstance(exc, rx.ResponseError) and str(exc).startswith(("LOADING", "BUSY", "TRYAGAIN")):
        return Trouble.TRANSIENT
    return Trouble.PERMANENT


class Troubles:
    """The errors one worker (or reaper) met: every one counted, each kind logged once.

    A transient error starts an "outage", logged once at WARNING; the first
    success after it is logged at INFO ("reachable again").  A permanent
    error is logged at ERROR the first time its kind (type and first word)
    is seen, with its cause, and at DEBUG after that.  Thread-safe.
    """

    def __init__(self, log: logging.Logger, what: str, stats: WorkerStats | None = None) -> None:
        self.log, self.what, self.stats = log, what, stats
        self.transient = 0
        self.permanent = 0
        self.last_permanent: str | None = None
        self._outage = False
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def report(self, exc: BaseException, doing: str, job: Job | None = None) -> Trouble:
        """Count ``exc`` (met while ``doing``), log it if it is news; returns its kind."""
        kind = trouble(exc)
        extra = job_fields(job) if job is not None else None
        with self._lock:
            if kind is Trouble.TRANSIENT:
                self.transient += 1
                news, self._outage = not self._outage, True
            else:
                self.permanent += 1
                self.last_permanent = f"{type(exc).__name__}: {exc}"
                key = (type(exc).__name__, str(exc).split(" ", 1)[0])
                news = key not in self._seen
                self._seen.add(key)
            if self.stats is not None:
                self.stats.connection_errors = self.transient
                self.stats.permanent_errors = self.permanent
                self.stats.last_permanent_error = self.last_permanent
        if kind is Trouble.TRANSIENT:
            level = logging.WARNING if news else logging.DEBUG
            self.log.log(
                level,
                "%s: %s failed, retrying: %s: %s",
                self.what,
                doing,
                type(exc).__name__,
                exc,
                extra=extra,
            )
        elif news:
            # The cause, once; retrying goes on (an operator may fix an ACL or
            # load the module), but it will not heal by itself.  Not a server's
            # answer at all (a bug): with its traceback.
            bug = not isinstance(exc, (rx.RedisError, EchoMQError))
            self.log.error(
                "%s: %s refused: %s: %s (retrying will not fix this; it is counted in the stats)",
                self.what,
                doing,
                type(exc).__name__,
                exc,
                extra=extra,
                exc_info=exc if bug else None,
            )
        else:
            self.log.debug("%s: %s refused again: %s", self.what, doing, exc, extra=extra)
        return kind

    def healed(self) -> None:
        """A command went through: an outage in progress is over."""
        with self._lock:
            was, self._outage = self._outage, False
        if was:
            self.log.info("%s: the server answers again", self.what)


class Backoff:
    """Sending one command again until it lands or ``until`` passes.

    ``timeout()`` is how long to wait for the current attempt's reply
    (``ATTEMPT_TIMEOUT_S``, doubling per attempt to ``ATTEMPT_TIMEOUT_CAP_S``,
    never past ``until``); ``next_wait(now)`` is the pause before the next
    attempt (``RETRY_FIRST_S`` doubling to ``RETRY_CAP_S``, jittered), or
    None when ``until`` has passed: give up.
    """

    def __init__(self, until: float | None = None, *, jitter: Callable[[], float] = random.random) -> None:
        self.until = until
        self.attempts = 0
        self._jitter = jitter

    def timeout(self, now: float) -> float:
        wait: float = min(ATTEMPT_TIMEOUT_S * 2.0 ** min(self.attempts, 16), ATTEMPT_TIMEOUT_CAP_S)
        if self.until is not None:
            wait = min(wait, self.until - now)
        return max(wait, 0.001)

    def next_wait(self, now: float) -> float | None:
        if self.until is not None and now >= self.until:
            return None
        wait: float = min(RETRY_FIRST_S * 2.0 ** min(self.attempts, 16), RETRY_CAP_S)
        wait *= 0.5 + self._jitter() / 2  # spread the herd of workers that lost the server together
        self.attempts += 1
        if self.until is not None:
            wait = min(wait, self.until - now)
        return max(wait, 0.0)


# -- the lease -----------------------------------------------------------------


class LeaseEvent(enum.Enum):
    """What one checkpoint (or the deadline) did to a held job's lease."""

    CONFIRMED = "confirmed"
    """The server extended the lease."""
    CANCEL_REQUESTED = "cancel requested"
    """Extended, and the reply carried a remote cancel: the token now has it."""
    RETRY = "retry"
    """No answer that decides anything (connection trouble): the deadline will."""
    LOST = "lost"
    """Stale, gone or past the deadline: the token is cancelled with the reason."""
    IGNORED = "ignored"
    """The lease was already lost (or a retry after the holder let go): nothing changes."""


@dataclass(eq=False)
class HeldJob:
    """One job a worker holds, as its lease keeper sees it.

    ``confirmed_until`` is the end of the last lease the server confirmed,
    counted from when the confirming command was *sent* (or from the claim):
    the server's own deadline is at least that late, so the keeper never
    believes in a lease the server has already let lapse.  After ``stop()``
    no checkpoint is started, but the answer to one in flight still counts
    and so does the deadline, until the keeper has stopped: a holder that
    cannot show a confirmed lease when it finishes has lost the job.

    ``finishing`` is set when the worker starts sending the job's end
    (complete, fail or release); ``given_back`` when a forced shutdown gave
    the job back while its handler still ran (the worker sends nothing more
    for it: no checkpoint, and the stale answers its own RELEASE causes are
    no lost lease).  ``failures`` counts the checkpoints in a row that got
    no answer: each waits longer for one (``checkpoint_timeout``).
    """

    job: Job
    cancel: CancelToken
    lease_ms: int
    interval: float
    confirmed_until: float
    next_checkpoint: float
    extends: int = 0
    lost: str | None = None
    stopped: bool = False
    metrics: Metrics | None = None  # told of delivered cancels and lost leases
    finishing: bool = False
    given_back: bool = False
    failures: int = 0

    @classmethod
    def claimed(
        cls, job: Job, cancel: CancelToken, lease_ms: int, *, claimed_at: float, interval: float | None = None
    ) -> HeldJob:
        """The record of a job claimed (or last extended) at ``claimed_at`` for ``lease_ms``.

        ``interval`` between checkpoints defaults to a third of the lease.
        """
        check_int("lease_ms", lease_ms, 1, MAX_MS)
        every = check_seconds("interval", interval) if interval is not None else lease_ms / 3000.0
        return cls(job, cancel, lease_ms, every, claimed_at + lease_ms / 1000.0, claimed_at + every)

    @property
    def active(self) -> bool:
        """True while the keeper should keep checkpointing: not lost, not let go, not given back."""
        return self.lost is None and not self.stopped and not self.given_back

    def time_left(self, now: float) -> float:
        """Seconds until the confirmed lease ends (negative once it has)."""
        return self.confirmed_until - now

    def needs_confirmation(self, now: float) -> bool:
        """The claim was answered so late that the lease may have lapsed: confirm it before running anything.

        ``confirmed_until`` counts from before the claim was first sent; a
        reply that took most of the lease (a stalled server, a retried
        claim) leaves too little to go on, or nothing.  One checkpoint
        settles it: confirmed, the lease runs from when it was sent; stale,
        the job is someone else's.
        """
        return self.lost is None and self.time_left(now) < self.interval

    def checkpoint_timeout(self, now: float) -> float:
        """How long to wait for one checkpoint's answer: ``ATTEMPT_TIMEOUT_S``, doubling with each
        checkpoint in a row that got none, never more than an interval nor past the deadline.

        A checkpoint that takes longer is given up (its connection may be
        half-open) and the next one is sent on a fresh connection: a long
        lease does not wait a third of itself to notice a dead connection.
        """
        grown = ATTEMPT_TIMEOUT_S * 2.0 ** min(self.failures, 16)
        return max(0.001, min(self.interval, grown, self.time_left(now)))

    def due_within(self, now: float, early: float) -> bool:
        """Kept, and its checkpoint due by ``now + early`` (a batch takes it a little early)."""
        return self.active and self.next_checkpoint <= now + early

    def wait_before_checkpoint(self, now: float) -> float | None:
        """What the keeper does next: wait this many seconds, checkpoint now (0.0), or stop (None).

        None once the lease is lost (this call loses it if its deadline has
        passed) or the holder let go.  A wait ends at the next checkpoint or
        at the deadline, whichever comes first.
        """
        if self.expire(now) or not self.active:
            return None
        return self.wakeup_in(now)

    def wakeup_in(self, now: float) -> float:
        """Seconds until the next checkpoint or the deadline, whichever comes first (0.0: now)."""
        return max(0.0, min(self.next_checkpoint, self.confirmed_until) - now)

    def checkpoint_due(self, now: float) -> bool:
        return self.active and now >= self.next_checkpoint

    def expire(self, now: float) -> bool:
        """Lose the lease if no checkpoint was confirmed before its deadline; True if it was lost now."""
        if self.lost is None and not self.given_back and now >= self.confirmed_until:
            return self.lose(LOST_DEADLINE) is LeaseEvent.LOST
        return False

    def confirmed(self, sent_at: float, now: float, requested: Cancellation | None = None) -> LeaseEvent:
        """The checkpoint sent at ``sent_at`` was confirmed, with the remote cancel it delivered if any."""
        if self.lost is not None:
            return LeaseEvent.IGNORED
        self.extends += 1
        self.failures = 0
        self.confirmed_until = max(self.confirmed_until, sent_at + self.lease_ms / 1000.0)
        self.next_checkpoint = now + self.interval
        if requested is None:
            return LeaseEvent.CONFIRMED
        if self.metrics is not None:
            self.metrics.cancel_delivered(self.job)
        # The lease keeps running while the handler winds down; just tell it.
        self.cancel.cancel(requested.reason)
        return LeaseEvent.CANCEL_REQUESTED

    def failed(self, exc: BaseException, now: float) -> LeaseEvent:
        """The checkpoint raised ``exc``: StaleToken/JobGone lose the lease, anything else is retried.

        The retry comes an interval later, or ``CHECKPOINT_RETRY_S`` if that
        is sooner: a long lease should not wait a third of itself to try again.
        """
        reason = lost_reason(exc)
        if reason is not None:
            return self.lose(reason)
        if not self.active:
            return LeaseEvent.IGNORED
        lease_log.debug("checkpoint of %s failed: %r", self.job.id, exc, extra=job_fields(self.job))
        self.failures += 1
        self.next_checkpoint = now + min(self.interval, CHECKPOINT_RETRY_S)
        return LeaseEvent.RETRY

    def lose(self, reason: str) -> LeaseEvent:
        """Mark the lease lost and cancel the handler's token with ``reason`` (the first reason stays).

        Not once the worker gave the job back itself: a checkpoint then
        answered stale is its own RELEASE's doing, not a lost lease.
        """
        if self.lost is not None or self.given_back:
            return LeaseEvent.IGNORED
        self.lost = reason
        lease_log.warning("job %s of %s: %s", self.job.id, self.job.queue, reason, extra=job_fields(self.job))
        if self.metrics is not None:
            self.metrics.lease_lost(self.job, reason)
        self.cancel.cancel(reason)
        return LeaseEvent.LOST

    def stop(self) -> None:
        """The holder let go (its handler ended): start no more checkpoints."""
        self.stopped = True


class Leases:
    """The jobs one worker holds: what a single lease keeper iterates over."""

    def __init__(self) -> None:
        self._held: list[HeldJob] = []

    def add(self, held: HeldJob) -> None:
        self._held.append(held)

    def discard(self, held: HeldJob) -> None:
        if held in self._held:
            self._held.remove(held)

    def __iter__(self) -> Iterator[HeldJob]:
        return iter(list(self._held))

    def __len__(self) -> int:
        return len(self._held)

    def expire(self, now: float) -> list[HeldJob]:
        """Lose every lease past its deadline; returns those lost now."""
        return [held for held in self._held if held.expire(now)]

    def due(self, now: float) -> list[HeldJob]:
        """The jobs whose checkpoint is due: one batch for ``extend_many``."""
        return [held for held in self._held if held.checkpoint_due(now)]

    def wakeup_in(self, now: float) -> float | None:
        """Seconds until some held job needs its keeper; None when none is kept."""
        return min((held.wakeup_in(now) for held in self._held if held.active), default=None)

    def cancel_all(self, reason: str) -> None:
        for held in self._held:
            held.cancel.cancel(reason)


def checkpoint_round(
    keepers: Iterable[KeeperCore[Any]], limit: int = MAX_CHECKPOINT_BATCH
) -> tuple[list[KeeperCore[Any]], float | None]:
    """One tick of a worker's keeper: the keepers to checkpoint now in one batch, and when to look next.

    A batch is every job whose checkpoint is due, with those due within
    ``CHECKPOINT_EARLY`` of their interval (a little early costs nothing:
    the lease runs from when the batch is sent; their next checkpoints then
    fall together too), the nearest deadlines first, at most ``limit`` (the
    rest go in the next batch, at once).  Many held jobs cost one command
    per tick, and a batch that fails is retried as one.  The wait is None
    when no job is kept; 0.0 when more are due at once.  Expires the
    leases whose deadline passed (each under its keeper's lock).
    """
    due: list[tuple[float, KeeperCore[Any]]] = []
    soon: list[tuple[float, float, KeeperCore[Any]]] = []
    wait: float | None = None
    for keeper in keepers:
        with keeper._lock:
            held = keeper._held
            now = keeper._clock()
            left = held.wait_before_checkpoint(now)
            if left is None:
                continue
            if held.checkpoint_due(now):
                due.append((held.confirmed_until, keeper))
            elif held.due_within(now, held.interval * CHECKPOINT_EARLY):
                soon.append((held.confirmed_until, left, keeper))
            else:
                wait = left if wait is None else min(wait, left)
    if not due:
        for _, left, _ in soon:
            wait = left if wait is None else min(wait, left)
        return [], wait
    ranked = sorted(due, key=lambda d: d[0]) + [
        (until, k) for until, _, k in sorted(soon, key=lambda d: d[0])
    ]
    batch = [keeper for _, keeper in ranked[:limit]]
    if len(ranked) > limit:
        wait = 0.0
    return batch, wait


class KeeperCore(Generic[ClientT]):
    """What both ``LeaseKeeper`` classes share: the arguments, checked, and one ``HeldJob``.

    ``claimed_at`` is ``clock()`` taken just before the claim (or the last
    extend) was sent; it defaults to now.  ``clock`` is for tests: whatever
    it returns, the deadline is watched (a clock that jumps is noticed
    within 0.1 s).
    """

    _client_type: type | None = None
    _lock: threading.Lock  # the driver's (``_init_driver``): held while ``_held`` changes

    def __init__(
        self,
        client: ClientT,
        job: Job,
        lease_ms: int,
        cancel: CancelToken,
        *,
        interval: float | None = None,
        claimed_at: float | None = None,
        deliver_cancel: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_client("client", client, self._client_type)
        if not isinstance(job, Job):
            raise TypeError(f"job must be an echomq.Job, not {type(job).__name__}")
        check_token(job.token)  # an int token (v1) would be refused by every checkpoint
        if not isinstance(cancel, CancelToken):
            raise TypeError(f"cancel must be an echomq.CancelToken, not {type(cancel).__name__}")
        if not isinstance(deliver_cancel, bool):
            raise TypeError(f"deliver_cancel must be a bool, not {type(deliver_cancel).__name__}")
        check_callable("clock", clock)
        start = clock() if claimed_at is None else claimed_at
        if isinstance(start, bool) or not isinstance(start, int | float):
            raise TypeError(
                f"claimed_at (or what clock() returns) must be a number, not {type(start).__name__}"
            )
        self._held = HeldJob.claimed(job, cancel, lease_ms, claimed_at=start, interval=interval)
        self.client, self.job, self.lease_ms, self.cancel = client, job, lease_ms, cancel
        self.interval = self._held.interval
        self.deliver_cancel = deliver_cancel
        self._clock = clock
        # A worker hands its own in, so its stats count its keepers' errors.
        self._troubles = Troubles(lease_log, f"lease keeper of {job.id!r}")
        # Checkpoint states the server refused past maxmemory (the lease was extended without them).
        self.states_refused = 0
        self._init_driver()

    def _init_driver(self) -> None:
        """Make the driver's own thread or task primitives."""

    def _checkpoint_call(self, state: bytes | None) -> Call[Any]:
        """EMQ.CHECKPOINT (always with state: EXTEND takes none), or EMQ.EXTEND without ``deliver_cancel``.

        Checks ``state`` (TypeError) before anything is sent.
        """
        job = self.job
        if self.deliver_cancel or state is not None:
            return proto.checkpoint(job.queue, job.id, job.token, self.lease_ms, state)
        return proto.extend(job.queue, job.id, job.token, self.lease_ms)  # answers None

    def _checkpoint_answered(self, sent: float, requested: Cancellation | None) -> Cancellation | None:
        """A checkpoint sent at ``sent`` was confirmed; the cancel it delivered (with ``deliver_cancel``)."""
        requested = requested if self.deliver_cancel else None
        with self._lock:
            self._held.confirmed(sent, self._clock(), requested)
        self._troubles.healed()
        return requested

    def _checkpoint_failed(self, exc: BaseException, report: bool = True) -> LeaseEvent:
        """A checkpoint raised ``exc``: lost (stale, gone) or to retry, counted and logged once per outage."""
        with self._lock:
            event = self._held.failed(exc, self._clock())
        if event is LeaseEvent.RETRY and report:  # not after stop(): a cut attempt is no trouble
            self._troubles.report(exc, "checkpoint", self.job)
        return event

    def _checkpoint_replied(self, sent: float, call: Call[Any], reply: Any) -> LeaseEvent:
        """One reply of a batch of checkpoints (an error reply is a value in a pipeline's answer)."""
        try:
            if isinstance(reply, BaseException):
                if isinstance(reply, rx.ResponseError):
                    proto.raise_mapped(reply, call)
                raise reply
            requested = call.read(reply)
        except Exception as exc:
            return self._checkpoint_failed(exc, report=False)
        self._checkpoint_answered(sent, requested)
        return LeaseEvent.CONFIRMED

    def _confirm_failed(self, exc: BaseException) -> bool:
        """``_confirm``'s checkpoint failed: True when the job is not ours (stale, gone), else False."""
        return self._checkpoint_failed(exc) is not LeaseEvent.RETRY

    def _confirm_gave_up(self) -> None:
        """No confirming checkpoint was answered within a lease: the job is not ours to run."""
        with self._lock:
            self._held.lose(LOST_UNCONFIRMED)

    def _confirmed(self, sent: float, requested: Cancellation | None) -> None:
        """``_confirm``'s checkpoint (sent at ``sent``) landed."""
        self._checkpoint_answered(sent, requested)

    def _state_not_stored(self, exc: BaseException) -> None:
        """A checkpoint's state was refused past maxmemory: logged once per job; the lease goes on."""
        self.states_refused += 1
        if self.states_refused == 1:
            lease_log.warning(
                "job %s of %s: checkpoint state not stored (%s); the lease is extended without it",
                self.job.id,
                self.job.queue,
                exc,
                extra=job_fields(self.job),
            )

    @property
    def lost(self) -> str | None:
        """Why the lease was lost (the reason given to the token), or None."""
        return self._held.lost

    @property
    def extends(self) -> int:
        """How many checkpoints the server confirmed."""
        return self._held.extends


# -- the reaper ------------------------------------------------------------------


class SweepTick:
    """One reaper tick: sweep again while a sweep took a full batch, at most ``max_sweeps`` times."""

    def __init__(self, limit: int, max_sweeps: int = MAX_SWEEPS_PER_TICK) -> None:
        self.limit, self.max_sweeps = limit, max_sweeps
        self.sweeps = 0
        self.recovered: list[str] = []
        self.dead: list[str] = []
        self.cancelled: list[str] = []
        self.expired = 0
        self._full = True

    def wants_more(self) -> bool:
        """True while another sweep may find lapsed jobs and the tick's bound allows it."""
        return self._full and self.sweeps < self.max_sweeps

    def add(self, result: SweepResult) -> None:
        self.sweeps += 1
        self.recovered += result.recovered
        self.dead += result.dead
        self.cancelled += result.cancelled
        self.expired += result.expired
        self._full = len(result) >= self.limit

    @property
    def total(self) -> SweepResult:
        return SweepResult(list(self.recovered), list(self.dead), list(self.cancelled), self.expired)


class ReaperCore(Generic[ClientT]):
    """What both ``Reaper`` classes share: the settings, checked, and the counts."""

    _client_type: type | None = None

    def __init__(
        self,
        client: ClientT,
        queue: str,
        *,
        interval: float = 1.0,
        max_stalled: int = 1,
        limit: int = 100,
        on_sweep: Callable[[SweepResult], None] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        check_client("client", client, self._client_type)
        keys_of(queue)
        check_seconds("interval", interval)
        check_int("max_stalled", max_stalled)
        check_int("limit", limit)
        if on_sweep is not None:
            check_callable("on_sweep", on_sweep)
        self.client, self.queue = client, queue
        self.metrics = metrics  # echomq.metrics.Metrics: told what each tick did
        if metrics is not None:
            metrics.bind(client)
        self.interval, self.max_stalled, self.limit = interval, max_stalled, limit
        self.on_sweep = on_sweep
        self.recovered = 0
        self.dead = 0
        self.cancelled = 0
        self.errors = 0
        self._troubles = Troubles(reaper_log, f"reaper of {queue!r}")
        self._init_driver()

    def _init_driver(self) -> None:
        """Make the driver's own thread or task primitives."""

    def _tick(self) -> SweepTick:
        return SweepTick(self.limit)

    def _swept(self, tick: SweepTick) -> SweepResult:
        """Count a finished tick, tell ``on_sweep`` if it did anything, return what it did."""
        self._troubles.healed()
        total = tick.total
        self.recovered += len(total.recovered)
        self.dead += len(total.dead)
        self.cancelled += len(total.cancelled)
        if self.metrics is not None:
            self.metrics.swept(self.queue, total)
        if (total or total.expired) and self.on_sweep is not None:
            self.on_sweep(total)
        return total

    def _sweep_failed(self, exc: BaseException) -> None:
        """Count a failed tick, logged once per outage or kind (no traceback each tick); retried next tick."""
        self.errors += 1
        self._troubles.report(exc, "sweep")


# -- the worker ------------------------------------------------------------------


@dataclass
class WorkerStats:
    """What a worker did (counts since it was created)."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0  # ended by a remote cancel (EMQ.CANCEL)
    released: int = 0  # given back without using an attempt (shutdown, or a handler's BaseException)
    leases_lost: int = 0  # the lease was lost (or could not be shown) before the job's end landed
    rejected: int = 0  # complete/fail/release refused with StaleToken/JobGone
    connection_errors: int = 0  # commands that met a connection error or timeout (each was retried)
    permanent_errors: int = 0  # refusals retrying will not heal: NOPERM, READONLY, WRONGTYPE, no module
    last_permanent_error: str | None = None
    not_replicated: int = 0  # claimed jobs given back unrun: the replicas did not confirm them (replicas=)

    def record_fail(self, where: str) -> None:
        """Count a FAIL by where it sent the job."""
        if where == "cancelled":
            self.cancelled += 1
        else:
            self.failed += 1


class ClaimStep:
    """One claim loop's request: the same REQ until a claim brings jobs back.

    A claim whose reply was lost (the server served it, the connection died:
    a restart, a half-open connection, a waiting claim whose client the
    server had not yet seen go) is answered again by the next claim with its
    REQ, from the server's record of it, for as long as the lease it took
    runs.  So the REQ changes only once jobs came back; until then each
    claim, even after an empty answer, carries it.

    ``since`` is the earliest the server can have claimed for this REQ, the
    start of the lease the keeper counts (never late): the time of this
    send while every earlier send of the REQ got its answer; once one did
    not (``failed``), the time the REQ was first sent.
    """

    def __init__(self) -> None:
        self.call: Call[list[Job]] | None = None
        self.since = 0.0
        self.troubled = False
        self.doubt = False  # a try got no answer, and no answer came since

    def next(self, make: Callable[[], Call[list[Job]]], now: float) -> tuple[Call[list[Job]], float]:
        """The call to send now, and ``since``."""
        if self.call is None:
            self.call, self.since, self.troubled, self.doubt = make(), now, False, False
        elif not self.troubled:
            self.since = now  # every earlier send was answered: nothing was claimed for it yet
        return self.call, self.since

    def adopt(self, call: Call[list[Job]], sent: float) -> None:
        """``call`` is this step's request now (the claim half of a COMPLETECLAIM sent at ``sent``, say)."""
        self.call, self.since, self.troubled, self.doubt = call, sent, False, False

    def failed(self) -> None:
        """An attempt got no answer: the server may have claimed for it; keep counting from the first send."""
        self.troubled = self.doubt = True

    def answered(self, jobs: list[Job]) -> None:
        """A reply came: jobs end this request (the next claim is a new one); nothing keeps it.

        An answer to the REQ answers what every earlier try took (``doubt``
        ends; ``troubled`` stays: a try stuck in a dead connection's buffer
        on a stalled server may still run later, and its jobs would then be
        answered to this REQ).  An error reply is no answer (a claim refused
        past maxmemory never reads the record): callers do not call this
        for one.
        """
        self.doubt = False
        if jobs:
            self.call = None

    @property
    def unresolved(self) -> bool:
        """A try of this REQ got no answer since the last one: the server may hold jobs nobody runs yet.

        A worker that stops sends it again (``resolving``) and gives back
        what comes: a job a claim answered is run or released.
        """
        return self.call is not None and self.doubt

    @property
    def waiting(self) -> bool:
        """This step's claim waits on the server (BLOCK): one whose connection dropped claimed nothing.

        Only a claim served in the instant before its connection dropped is
        in doubt then; a stopping worker that cannot reach the server at all
        does not wait for it.  A claim that does not wait (a COMPLETECLAIM's,
        a pipelined one) may well have taken a job: that one is waited for,
        within the stop's bound.
        """
        return self.call is not None and "BLOCK" in self.call.args

    def resolving(self) -> Call[list[Job]]:
        """This step's claim without BLOCK: answered at once by the REQ's record (the jobs it took)."""
        assert self.call is not None
        args = self.call.args
        if "BLOCK" in args:
            at = args.index("BLOCK")
            args = args[:at] + args[at + 2 :]
        return Call(args, self.call.parse, self.call.queue)


class SubscriptionHealth:
    """Whether a worker's pushed-cancel subscription still hears the server (a half-open one does not).

    Nothing comes on a quiet channel, so silence proves nothing: while the
    worker holds jobs (pushes matter only then), a subscription silent for
    ``HEALTH_EVERY_S`` is pinged, and one that answers nothing within
    ``PONG_WITHIN_S`` is dead.  An idle worker sends no pings.
    """

    def __init__(self, now: float) -> None:
        self.heard = now
        self.pinged: float | None = None

    def heard_from(self, now: float) -> None:
        """A message or a pong came."""
        self.heard, self.pinged = now, None

    def next(self, now: float, holding: bool) -> str:
        """``"ping"`` (send one now), ``"dead"`` (subscribe again), or ``"ok"``."""
        if self.pinged is not None:
            return "dead" if now - self.pinged >= PONG_WITHIN_S else "ok"
        if holding and now - self.heard >= HEALTH_EVERY_S:
            self.pinged = now
            return "ping"
        return "ok"


class Action(enum.Enum):
    """What a worker does with a job whose handler has ended."""

    COMPLETE = "complete"
    FAIL = "fail"
    RELEASE = "release"
    """Give the job back without using an attempt: shutdown, or the handler raised a BaseException."""
    DROP = "drop"
    """The lease was lost (or the job given back already): it belongs to someone else; send nothing."""


@dataclass(frozen=True)
class Finish:
    """The decision for one job whose handler ended, and what it needs to be sent."""

    held: HeldJob
    action: Action
    error: str = ""  # FAIL's last_error

    @property
    def job(self) -> Job:
        return self.held.job


@dataclass(frozen=True)
class Progress:
    """Where a job got to: a step counter and a small JSON dict (``JobContext.resume_point``).

    ``step`` is what the handler's last ``checkpoint_step(step, data)``
    stored (0 when nothing was: a first attempt); by convention the number
    of steps done, so a resumed handler goes on with step ``step``.
    ``data`` is the dict stored with it (JSON: str keys; values str, int,
    float, bool, None, lists and dicts of those).
    """

    step: int = 0
    data: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The checkpoint state: compact JSON ``{"step": <int>, "data": {...}}``, UTF-8."""
        check_int("step", self.step, 0)
        if not isinstance(self.data, dict):
            raise TypeError(f"data must be a dict, not {type(self.data).__name__}")
        body = {"step": self.step, "data": self.data}
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()

    @classmethod
    def decode(cls, state: bytes) -> Progress:
        """The Progress in ``state`` (what ``encode()`` made); ValueError for anything else."""
        try:
            body = json.loads(state)
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = None
        step = body.get("step") if isinstance(body, dict) else None
        data = body.get("data", {}) if isinstance(body, dict) else None
        if isinstance(step, bool) or not isinstance(step, int) or step < 0 or not isinstance(data, dict):
            raise ValueError(
                f"the job's resume_state is not a checkpoint_step() state: {bytes(state[:80])!r}"
            )
        return cls(step, data)


class ContextCore(Generic[KeeperT]):
    """What a handler's ``JobContext`` shows in both drivers: the job, its token, the safe points,
    and the state the job's last checkpoint stored (``resume_state``, ``resume_point``).

    The drivers add ``checkpoint(state=...)`` and ``checkpoint_step(step,
    data)`` (plain calls in threads, coroutines in asyncio).
    """

    __slots__ = ("_keeper", "cancel", "job")

    def __init__(self, job: Job, cancel: CancelToken, keeper: KeeperT) -> None:
        self.job = job
        self.cancel = cancel
        self._keeper = keeper

    @property
    def queue(self) -> str:
        return self.job.queue

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def payload(self) -> bytes:
        return self.job.payload

    @property
    def token(self) -> str:
        """The fencing token of this claim."""
        return self.job.token

    @property
    def attempt(self) -> int:
        """This claim's number within the job's retry budget (1 on a first run)."""
        return self.job.attempt

    @property
    def resume_state(self) -> bytes | None:
        """The state the job's last checkpoint stored, handed back by this claim; None if none was.

        None on a first attempt.  On a later one (the job was recovered after
        its holder died, or failed and retried), the bytes of the last
        ``checkpoint(state=...)`` the server accepted from any earlier
        attempt.  It stays what this claim brought: this attempt's own
        checkpoints do not change it.
        """
        return self.job.resume_state

    @property
    def resume_point(self) -> Progress:
        """Where this attempt resumes: the step and data of the last ``checkpoint_step()``.

        ``Progress(step=0, data={})`` when no state was stored (a first
        attempt).  ValueError when the stored state is not one
        ``checkpoint_step()`` wrote (bytes stored with
        ``checkpoint(state=...)``: read ``resume_state`` instead).
        """
        state = self.job.resume_state
        return Progress() if state is None else Progress.decode(state)

    @property
    def cancelled(self) -> bool:
        """True once the job is cancelled: remote cancel, lease lost, or shutdown."""
        return self.cancel.cancelled

    def check(self) -> Cancellation | None:
        """None while running on is fine, else the Cancellation (O(1), never blocks)."""
        return self.cancel.check()

    def raise_if_cancelled(self) -> None:
        """A safe point: raise ``echomq.Cancelled(reason)`` if the job is cancelled."""
        self.cancel.raise_if_cancelled()

    def __repr__(self) -> str:
        return f"<JobContext {self.job.queue}/{self.job.id} attempt {self.job.attempt} {self.cancel!r}>"


def forced_exit(signum: int | None) -> BaseException:
    """What ``run()`` raises after a second signal forced it out: what the signal means to Python."""
    if signum is None or signum == signal.SIGINT:
        return KeyboardInterrupt()
    return SystemExit(128 + signum)


class WorkerCore(Generic[ClientT, HandlerT]):
    """What both ``Worker`` classes share: settings, the held jobs, shutdown, finishing, stats.

    Shutdown, in both drivers: ``_request_stop`` stops claiming at once
    (a job whose claim was in flight is given back without running); at the
    end of the grace ``_shutdown_tick`` cancels every running handler's token
    with "shutdown"; ``FORCE_AFTER_S`` later ``_force`` hands the driver the
    jobs whose handlers still run, to give back itself.  A handler that ends
    after "shutdown" by raising has its job released (no attempt used).
    """

    _client_type: type | None = None

    def __init__(
        self,
        client: ClientT,
        queue: str,
        handler: HandlerT,
        *,
        lease_ms: int = 30_000,
        max_attempts: int = 3,
        concurrency: int = 1,
        poll_interval: float = 0.2,
        extend_interval: float | None = None,
        grace: float = 10.0,
        retry: RetryPolicy | None = None,
        metrics: Metrics | None = None,
        replicas: int = 0,
        replicas_timeout_ms: int = 1000,
        replicas_aof: bool = False,
    ) -> None:
        check_client("client", client, self._client_type)
        keys_of(queue)
        check_callable("handler", handler)
        self._check_handler(handler)
        self._context_style = takes_context(handler)  # type: ignore[arg-type]
        check_int("lease_ms", lease_ms, 1, MAX_MS)
        check_int("max_attempts", max_attempts)
        check_int("concurrency", concurrency, 1, 10_000)
        check_seconds("poll_interval", poll_interval)
        if extend_interval is not None:
            check_seconds("extend_interval", extend_interval)
            if extend_interval * 1000 >= lease_ms:
                raise ValueError(
                    f"extend_interval ({extend_interval} s) must be shorter than the lease ({lease_ms} ms)"
                )
        check_seconds("grace", grace, zero_ok=True)
        if retry is not None:
            if not isinstance(retry, RetryPolicy):
                raise TypeError(f"retry must be an echomq.RetryPolicy, not {type(retry).__name__}")
            if max_attempts not in (3, retry.max_attempts):  # 3: the default, not given
                raise ValueError(
                    f"max_attempts={max_attempts} and retry's max_attempts={retry.max_attempts}: give one"
                )
            max_attempts = retry.max_attempts
        self.client, self.queue, self.handler = client, queue, handler
        self.metrics = metrics  # echomq.metrics.Metrics: told of every claim, lease and end
        if metrics is not None:
            metrics.bind(client)
        self.lease_ms, self.max_attempts = lease_ms, max_attempts
        # replicas=N: a claimed job runs once N replicas have its claim (the client's claim(replicas=)).
        self.replica_wait = proto.replica_wait(replicas, replicas_timeout_ms, replicas_aof)
        if self.replica_wait is not None:
            proto.check_wait_fits(self.replica_wait, proto.socket_timeout_of(getattr(client, "redis", None)))
        self.concurrency, self.poll_interval = concurrency, poll_interval
        self.extend_interval = extend_interval
        self.grace = grace
        self.retry = retry
        # An idle claim waits on the server this long (at most a second, so a
        # stop() is seen soon); the rest of poll_interval, if any, on our side.
        self.claim_block_ms = max(1, round(min(poll_interval, MAX_CLAIM_BLOCK_S) * 1000))
        self.stats = WorkerStats()
        self._held = Leases()
        self._troubles = Troubles(worker_log, f"worker of {queue!r}", self.stats)
        self._stop_requested = False
        self._grace_until = math.inf
        self._tokens_cancelled = False
        self._forced = False
        self._force_until = math.inf  # after a forced stop: the end of FORCE_BUDGET_S
        self._interrupt: BaseException | None = None  # what run() raises when it is done
        self._init_driver()

    def _not_replicated(self, exc: NotReplicated) -> None:
        """A claim's wait for replicas ran out: its jobs were given back unrun; counted and logged."""
        self.stats.not_replicated += len(exc.job_ids)
        worker_log.warning("worker of %r: %s", self.queue, exc)

    def _check_handler(self, handler: object) -> None:
        """The driver refuses a handler of the other kind (a coroutine function in threads, say)."""

    def _init_driver(self) -> None:
        """Make the driver's own thread or task primitives."""

    # -- shutdown --------------------------------------------------------------

    def _request_stop(self, now: float, grace: float | None = None) -> bool:
        """Stop claiming now; handlers get ``grace`` (default ``self.grace``) seconds.

        A second request can only shorten the grace.  True if this call
        started the shutdown.
        """
        wait = self.grace if grace is None else check_seconds("grace", grace, zero_ok=True)
        self._grace_until = min(self._grace_until, now + wait)
        if self._stop_requested:
            return False
        self._stop_requested = True
        worker_log.info(
            "worker of %r stopping: no new jobs; %d running get %.1f s to finish",
            self.queue,
            len(self._held),
            wait,
        )
        return True

    def _shutdown_tick(self, now: float) -> float | None:
        """Advance a shutdown in progress: at the grace's end, "shutdown" to every token.

        Returns the seconds until the next step (0.0 once it is time to
        ``_force``), or None when no shutdown is in progress.
        """
        if not self._stop_requested:
            return None
        if not self._tokens_cancelled and now >= self._grace_until:
            self._tokens_cancelled = True
            if len(self._held):
                worker_log.info(
                    "worker of %r: grace over, cancelling %d running handlers", self.queue, len(self._held)
                )
            self._held.cancel_all(SHUTDOWN)
        if not self._tokens_cancelled:
            return self._grace_until - now
        return max(0.0, self._grace_until + FORCE_AFTER_S - now)

    def _force(self, now: float | None = None) -> list[HeldJob]:
        """Stop at once: every token cancelled; returns the jobs whose handlers still run.

        The driver gives those back itself (``RELEASE``) and stops waiting
        for their handlers; when one ends later, its job is ``DROP``ped.
        Jobs being finished already are left to their finish, and every
        command still to send gets ``FORCE_BUDGET_S`` (``_bounded``).
        """
        now = time.monotonic() if now is None else now
        self._force_until = min(self._force_until, now + FORCE_BUDGET_S)
        self._stop_requested = self._tokens_cancelled = self._forced = True
        self._held.cancel_all(SHUTDOWN)
        out = [h for h in self._held if not h.finishing and not h.given_back and h.lost is None]
        for h in out:
            h.given_back = True
        if out:
            worker_log.warning(
                "worker of %r: %d handlers did not stop in time; giving their jobs back", self.queue, len(out)
            )
        return out

    def _on_signal(self, signum: int, now: float) -> bool:
        """SIGINT/SIGTERM: the first stops gracefully, the second forces; True when it is time to force."""
        if not self._stop_requested:
            worker_log.warning(
                "worker of %r: %s: stopping (a second signal stops at once)",
                self.queue,
                signal.Signals(signum).name,
            )
            self._request_stop(now)
            return False
        worker_log.warning(
            "worker of %r: %s again: stopping at once", self.queue, signal.Signals(signum).name
        )
        if self._interrupt is None:
            self._interrupt = forced_exit(signum)
        return True

    def _interrupted(self, exc: BaseException, now: float) -> None:
        """A handler raised a BaseException (SystemExit, KeyboardInterrupt...): stop; run() raises it last."""
        if self._interrupt is None:
            self._interrupt = exc
        worker_log.error("worker of %r: a handler raised %s: stopping", self.queue, type(exc).__name__)
        self._request_stop(now)

    # -- jobs ------------------------------------------------------------------

    def _took(self, held: HeldJob, landed: bool = False) -> bool:
        """A job was claimed and its keeper made.  False if the worker is stopping: give it back unrun.

        ``landed``: its claim was answered before the stop was requested
        (the asyncio claimer hands jobs to its runners a loop turn later):
        it runs, within the grace, as a job already started would.
        """
        if self._stop_requested and not landed:
            held.given_back = True
            return False
        held.metrics = self.metrics
        self._held.add(held)
        if self._tokens_cancelled:
            held.cancel.cancel(SHUTDOWN)
        return True

    def _let_go(self, held: HeldJob) -> None:
        """The handler ended (however it ended) and its keeper stopped."""
        self._held.discard(held)

    def _decide(self, held: HeldJob, error: BaseException | None, interrupted: bool = False) -> Finish:
        """What to send for a job whose handler ended with ``error`` (None: it returned).

        Nothing if the lease was lost or a forced shutdown gave the job back
        already; RELEASE if the handler's exception is a request to stop
        (``interrupted``) or came after "shutdown"; COMPLETE if it returned;
        else FAIL with the error's text.
        """
        if held.given_back:  # a forced stop gave it back while its handler ran: nothing more to send
            return Finish(held, Action.DROP)
        if held.lost is not None:
            self.stats.leases_lost += 1
            self._ended(held.job, "lost")
            return Finish(held, Action.DROP)
        held.finishing = True
        if interrupted:
            return Finish(held, Action.RELEASE, error_text(error) if error is not None else "")
        if error is None:
            return Finish(held, Action.COMPLETE)
        if held.cancel.check() == Cancellation(SHUTDOWN):
            return Finish(held, Action.RELEASE, error_text(error))
        return Finish(held, Action.FAIL, error_text(error))

    def _landed(self, finish: Finish, where: FailOutcome | ReleaseOutcome | None = None) -> None:
        """COMPLETE, FAIL or RELEASE was accepted; ``where`` is FAIL's or RELEASE's answer."""
        self._troubles.healed()
        fields = job_fields(finish.job)
        if finish.action is Action.COMPLETE:
            self.stats.completed += 1
            self._ended(finish.job, "completed")
            return
        assert where is not None
        if finish.action is Action.RELEASE:
            if where == "cancelled":
                self.stats.cancelled += 1
            else:
                self.stats.released += 1
            self._ended(finish.job, "cancelled" if where == "cancelled" else "released")
            worker_log.info("job %s given back, now %s", finish.job.id, where, extra=fields)
            return
        self.stats.record_fail(where)
        self._ended(finish.job, "retried" if where == "pending" else where)
        worker_log.info("job %s failed (%s), now %s", finish.job.id, finish.error, where, extra=fields)

    def _refused(self, finish: Finish, exc: LeaseLost) -> None:
        """COMPLETE, FAIL or RELEASE was refused: the lease lapsed between the keeper's last check and now."""
        self.stats.rejected += 1
        self._ended(finish.job, "refused")
        worker_log.warning(
            "job %s: %s refused: %s", finish.job.id, finish.action.value, exc, extra=job_fields(finish.job)
        )

    def _ended(self, job: Job, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.finished(job, outcome)

    def _stopped(self) -> None:
        """The worker has stopped: what the metrics still hold goes out now."""
        if self.metrics is not None:
            self.metrics.flush()

    def _bounded(self, until: float | None) -> float | None:
        """A command's deadline, and after a forced stop no later than its budget: bounded by stop."""
        if self._force_until == math.inf:
            return until
        return self._force_until if until is None else min(until, self._force_until)

    def _fail_refused(self, finish: Finish, exc: BaseException, since: float, now: float) -> Finish:
        """FAIL was refused past maxmemory (``state_refused``; it is deny-oom, nothing was written).

        What to send next: the same FAIL, while the driver keeps the lease
        alive with EXTEND (not deny-oom) between tries; nothing can claim the
        job meanwhile anyway (CLAIM is deny-oom too), and the FAIL lands with
        its error and its try once memory is freed.  A worker that stops
        gives the job back instead (RELEASE, not deny-oom either): no try
        used, and its error, which the row cannot take now, is logged here.
        A refused end never becomes a stall.
        """
        fields = job_fields(finish.job)
        if not self._stop_requested:
            if now == since:
                worker_log.warning(
                    "job %s: FAIL refused (%s); its lease is kept while it is tried again",
                    finish.job.id, exc, extra=fields,
                )  # fmt: skip
            return finish
        worker_log.warning(
            "job %s: FAIL refused for %.1f s (%s) and the worker stops; giving the job back (RELEASE: no "
            "try used) with its error kept here: %s",
            finish.job.id, now - since, exc, finish.error, extra=fields,
        )  # fmt: skip
        return Finish(finish.held, Action.RELEASE, finish.error)

    def _settled_unrun(self, job: Job) -> None:
        """A job claimed for a REQ nobody ran is being given back (a stop settling its claims)."""
        worker_log.info(
            "job %s: claimed as the worker stopped; giving it back unrun", job.id, extra=job_fields(job)
        )

    def _unresolved(self, exc: BaseException | None) -> None:
        """A stopping worker could not learn what a claim took (the server did not answer in time)."""
        worker_log.warning(
            "worker of %r: a claim's answer was lost and could not be asked again before the stop's end "
            "(%s); a job it took, if any, is recovered when its lease lapses",
            self.queue, exc,
        )  # fmt: skip

    def _unfinished(self, finish: Finish) -> None:
        """The job's end could not be sent before its lease ended (the server stayed unreachable)."""
        self.stats.leases_lost += 1
        self._ended(finish.job, "lost")
        worker_log.warning(
            "job %s: no answer to its %s before its lease ended (if it reached the server it took "
            "effect; if not, the reaper gives the job to another worker)",
            finish.job.id,
            finish.action.value,
            extra=job_fields(finish.job),
        )

    # -- what is sent: one small function each, for both drivers ----------------

    def _claim_call(self, wait: bool = True, count: int = 1) -> Call[list[Job]]:
        """The claim step's command (one REQ, sent again until answered).

        With ``wait``, the idle wait happens on the server (EMQ.CLAIM ...
        BLOCK, ``claim_block_ms``): a job enqueued while the worker idles
        is claimed at once instead of at the next poll.
        """
        return proto.claim(self.queue, self.lease_ms, count, self.claim_block_ms if wait else None)

    def _fail_call(self, job: Job, error: str) -> Call[FailOutcome]:
        """Where a failed job goes: FAIL with its error, and the retry policy's delay if there is one."""
        if self.retry is None:
            return proto.fail(job.queue, job.id, job.token, error, self.max_attempts)
        delay = self.retry.delay_ms(job.attempt)
        return proto.fail(job.queue, job.id, job.token, error, self.retry.max_attempts, delay)

    def _end_call(self, finish: Finish) -> Call[object]:
        """The command that ends a job's hold: COMPLETE, FAIL (``_fail_call``) or RELEASE."""
        job = finish.job
        if finish.action is Action.COMPLETE:
            return proto.complete(job.queue, job.id, job.token)  # type: ignore[return-value]
        if finish.action is Action.FAIL:
            return self._fail_call(job, finish.error)  # type: ignore[return-value]
        return proto.release(job.queue, job.id, job.token)  # type: ignore[return-value]

    def _trouble(self, exc: BaseException, doing: str, job: Job | None = None) -> Trouble:
        """Count and log (once per kind) an error met while ``doing``; the caller retries."""
        return self._troubles.report(exc, doing, job)

    def _healed(self) -> None:
        self._troubles.healed()
