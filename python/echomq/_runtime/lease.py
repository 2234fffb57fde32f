"""The lease: one held job as its keeper sees it (``HeldJob``), the jobs a worker holds
(``Leases``), one batch of checkpoints (``checkpoint_round``) and the keepers' shared core."""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from redis import exceptions as rx

from .. import _protocol as proto
from .._protocol import MAX_MS, Call, Job, check_token
from ..cancel import Cancellation, CancelToken
from ..errors import JobGone, StaleToken
from .args import check_callable, check_client, check_int, check_seconds
from .logs import job_fields, lease_log
from .troubles import ATTEMPT_TIMEOUT_S, Troubles

if TYPE_CHECKING:
    from .metrics import Metrics

ClientT = TypeVar("ClientT")
KeeperSelf = TypeVar("KeeperSelf", bound="KeeperCore[Any]")


# Why a lease was lost: the reason given to the handler's CancelToken.
LOST_STALE = "lease lost: stale token (the job was swept or another attempt holds it)"
LOST_GONE = "lease lost: the job row is gone"
LOST_DEADLINE = "lease lost: no extend confirmed before the deadline passed"
LOST_UNCONFIRMED = "lease lost: a claim answered late could not be confirmed within a lease"
# The reason a handler's token gets when it ran past its timeout (timeout_ms).
TIMEOUT = "timeout"

# A keeper retries a checkpoint that got no answer this soon, or sooner.
CHECKPOINT_RETRY_S = 1.0
# A worker's keeper checkpoints every held job that is due in one batch (one
# pipeline), with those due within this fraction of their interval: one
# command per tick whatever the number of jobs, at most this many in it.
CHECKPOINT_EARLY = 0.25
MAX_CHECKPOINT_BATCH = 500


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


@dataclass(eq=False, slots=True)
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
    # A handler's time limit (``_runtime.timeouts``): its token is cancelled
    # with "timeout" at ``timeout_at``; at ``abandon_at`` the worker stops
    # waiting for it (``abandoned``) and fails the job itself.
    timeout_at: float = math.inf
    abandon_at: float = math.inf
    abandoned: bool = False
    loss_counted: bool = False  # ``WorkerStats.leases_lost`` has this job (counted once, whatever the path)
    # A job lost to its own deadline is given back (``maybe_ours``) with tries until then (monotonic s).
    give_back_until: float = -math.inf

    @property
    def maybe_ours(self) -> bool:
        """Not known to be someone else's: never lost, or lost by this worker's own reckoning only.

        A deadline that passed with no checkpoint confirmed (``LOST_DEADLINE``:
        the server stalled, froze, restarted, or the connection went half-open)
        or a late claim that could not be confirmed (``LOST_UNCONFIRMED``) says
        nothing about the server: until a sweep takes the job it is still held
        with this token, and a RELEASE (fenced by the token: a swept job
        answers stale, nothing written) gives it back with no stall counted and
        no try used.  Stale or gone: the server said it is not ours.
        """
        return self.lost is None or self.lost in (LOST_DEADLINE, LOST_UNCONFIRMED)

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
        """True while the keeper should keep checkpointing: not lost, let go, given back or abandoned."""
        return self.lost is None and not self.stopped and not self.given_back and not self.abandoned

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
        is sooner (a long lease should not wait a third of itself to try
        again), and never later than half-way to the deadline: a checkpoint
        that waited its whole timeout (an interval) is late already, and a
        retry an interval after it would come at the deadline itself (a
        default interval is a third of the lease) -- one slow answer would
        lose the lease with a third of it left.
        """
        reason = lost_reason(exc)
        if reason is not None:
            return self.lose(reason)
        if not self.active:
            return LeaseEvent.IGNORED
        lease_log.debug("checkpoint of %s failed: %r", self.job.id, exc, extra=job_fields(self.job))
        self.failures += 1
        self.next_checkpoint = now + min(self.interval, CHECKPOINT_RETRY_S, max(0.0, self.time_left(now)) / 2)
        return LeaseEvent.RETRY

    def lose(self, reason: str) -> LeaseEvent:
        """Mark the lease lost and cancel the handler's token with ``reason`` (the first reason stays).

        Not once the worker gave the job back itself: a checkpoint then
        answered stale is its own RELEASE's doing, not a lost lease.
        """
        if self.lost is not None or self.given_back or self.abandoned:
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

    def time_out(self, now: float) -> bool:
        """Cancel the token with "timeout" once the handler's time is up; True if it was cancelled now.

        The deadline watch calls it (a handler that blocks its event loop is
        told all the same); a token cancelled already keeps its first reason.
        """
        if now < self.timeout_at or self.stopped or self.lost is not None or self.given_back:
            return False
        self.timeout_at = math.inf
        return self.cancel.cancel(TIMEOUT)

    def next_deadline(self) -> float:
        """The earliest moment the deadline watch must look at this job: its lease's end or its timeout."""
        return min(self.confirmed_until, self.timeout_at)


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

    @classmethod
    def _for_worker(
        cls: type[KeeperSelf],
        client: Any,
        job: Job,
        lease_ms: int,
        cancel: CancelToken,
        *,
        interval: float,
        claimed_at: float,
        troubles: Troubles,
    ) -> KeeperSelf:
        """A worker's keeper of a job it claimed: what ``__init__`` makes, without checking it again.

        The worker checked its settings once (``lease_ms``, ``interval``) and
        the job comes from the server: a busy worker makes one per job, and
        the checks cost more than the rest.  Its errors count in the
        worker's ``troubles``.
        """
        keeper = cls.__new__(cls)
        keeper._held = HeldJob(
            job, cancel, lease_ms, interval, claimed_at + lease_ms / 1000.0, claimed_at + interval
        )
        keeper.client, keeper.job, keeper.lease_ms, keeper.cancel = client, job, lease_ms, cancel
        keeper.interval = interval
        keeper.deliver_cancel = True
        keeper._clock = time.monotonic
        keeper._troubles = troubles
        keeper.states_refused = 0
        keeper._init_driver()
        return keeper

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
