"""The worker runtime's rules, without I/O: one core for the thread and asyncio drivers.

``lease.py``, ``reaper.py`` and ``worker.py`` (threads) and ``asyncio.py``
(tasks) only wait, send commands and feed what came back to this module,
which decides: when a lease's next checkpoint is due, what a checkpoint's
reply or exception means, whether the reaper sweeps again, what a handler's
end does to its job, and what the stats count.  Nothing here sends a command
or sleeps; time comes in as ``now``, seconds on the driver's monotonic clock.
Not thread-safe: the thread drivers call it under their own lock.

The shape, as a driver sees it (h11 style: feed events, ask what next):

- ``HeldJob``: one claimed job as its keeper sees it (the job and its token,
  the handler's CancelToken, the lease confirmed until when, lost or not).
  ``wait_before_checkpoint(now)`` says what next; ``confirmed()``,
  ``failed()`` and ``expire()`` take what happened.
- ``Leases``: the jobs one worker holds, the set a single keeper could
  checkpoint in one batch (``due``, ``wakeup_in``).
- ``SweepTick``: one reaper tick, "a full batch: sweep again", bounded.
- ``KeeperCore``, ``ReaperCore``, ``WorkerCore``: the settings, validation
  and bookkeeping the public classes share; each driver subclasses one and
  adds only its waiting and sending (``_init_driver`` makes its events).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from ._protocol import FailOutcome, Job, SweepResult
from .cancel import Cancellation, CancelToken
from .errors import Cancelled, JobGone, LeaseLost, StaleToken

if TYPE_CHECKING:
    from .metrics import Metrics

lease_log = logging.getLogger("echomq.lease")
reaper_log = logging.getLogger("echomq.reaper")
worker_log = logging.getLogger("echomq.worker")

ClientT = TypeVar("ClientT")
HandlerT = TypeVar("HandlerT")

# Why a lease was lost: the reason given to the handler's CancelToken.
LOST_STALE = "lease lost: stale token (the job was swept or another attempt holds it)"
LOST_GONE = "lease lost: the job row is gone"
LOST_DEADLINE = "lease lost: no extend confirmed before the deadline passed"
# The reason a stopping worker gives its running handlers.
SHUTDOWN = "shutdown"
# A sweep that took `limit` jobs may have left more behind: sweep again, but
# never spin forever on one tick.
MAX_SWEEPS_PER_TICK = 100


def lost_reason(exc: BaseException) -> str | None:
    """The reason a checkpoint's exception means the lease is lost, or None (retry)."""
    if isinstance(exc, StaleToken):
        return LOST_STALE
    if isinstance(exc, JobGone):
        return LOST_GONE
    return None


def error_text(error: BaseException) -> str:
    """The ``last_error`` a worker records for a handler's exception."""
    if isinstance(error, Cancelled):
        return str(error)  # "cancelled: <reason>"
    return f"{type(error).__name__}: {error}"


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

    @classmethod
    def claimed(
        cls, job: Job, cancel: CancelToken, lease_ms: int, *, claimed_at: float, interval: float | None = None
    ) -> HeldJob:
        """The record of a job claimed (or last extended) at ``claimed_at`` for ``lease_ms``.

        ``interval`` between checkpoints defaults to a third of the lease.
        """
        if lease_ms < 1:
            raise ValueError("lease_ms must be >= 1")
        every = interval if interval is not None else lease_ms / 3000.0
        return cls(job, cancel, lease_ms, every, claimed_at + lease_ms / 1000.0, claimed_at + every)

    @property
    def active(self) -> bool:
        """True while the keeper should keep checkpointing: not lost, not let go."""
        return self.lost is None and not self.stopped

    def time_left(self, now: float) -> float:
        """Seconds until the confirmed lease ends (negative once it has)."""
        return self.confirmed_until - now

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
        if self.lost is None and now >= self.confirmed_until:
            return self.lose(LOST_DEADLINE) is LeaseEvent.LOST
        return False

    def confirmed(self, sent_at: float, now: float, requested: Cancellation | None = None) -> LeaseEvent:
        """The checkpoint sent at ``sent_at`` was confirmed, with the remote cancel it delivered if any."""
        if self.lost is not None:
            return LeaseEvent.IGNORED
        self.extends += 1
        self.confirmed_until = sent_at + self.lease_ms / 1000.0
        self.next_checkpoint = now + self.interval
        if requested is None:
            return LeaseEvent.CONFIRMED
        if self.metrics is not None:
            self.metrics.cancel_delivered(self.job)
        # The lease keeps running while the handler winds down; just tell it.
        self.cancel.cancel(requested.reason)
        return LeaseEvent.CANCEL_REQUESTED

    def failed(self, exc: BaseException, now: float) -> LeaseEvent:
        """The checkpoint raised ``exc``: StaleToken/JobGone lose the lease, anything else is retried."""
        reason = lost_reason(exc)
        if reason is not None:
            return self.lose(reason)
        if not self.active:
            return LeaseEvent.IGNORED
        lease_log.debug("checkpoint of %s failed: %r", self.job.id, exc)
        self.next_checkpoint = now + self.interval
        return LeaseEvent.RETRY

    def lose(self, reason: str) -> LeaseEvent:
        """Mark the lease lost and cancel the handler's token with ``reason`` (the first reason stays)."""
        if self.lost is not None:
            return LeaseEvent.IGNORED
        self.lost = reason
        lease_log.warning("job %s of %s: %s", self.job.id, self.job.queue, reason)
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


class KeeperCore(Generic[ClientT]):
    """What both ``LeaseKeeper`` classes share: the arguments and one ``HeldJob``.

    ``claimed_at`` is ``clock()`` taken just before the claim (or the last
    extend) was sent; it defaults to now.
    """

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
        start = claimed_at if claimed_at is not None else clock()
        self._held = HeldJob.claimed(job, cancel, lease_ms, claimed_at=start, interval=interval)
        self.client, self.job, self.lease_ms, self.cancel = client, job, lease_ms, cancel
        self.interval = self._held.interval
        self.deliver_cancel = deliver_cancel
        self._clock = clock
        self._init_driver()

    def _init_driver(self) -> None:
        """Make the driver's own thread or task primitives."""

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
        self._full = True

    def wants_more(self) -> bool:
        """True while another sweep may find lapsed jobs and the tick's bound allows it."""
        return self._full and self.sweeps < self.max_sweeps

    def add(self, result: SweepResult) -> None:
        self.sweeps += 1
        self.recovered += result.recovered
        self.dead += result.dead
        self._full = len(result) >= self.limit

    @property
    def total(self) -> SweepResult:
        return SweepResult(list(self.recovered), list(self.dead))


class ReaperCore(Generic[ClientT]):
    """What both ``Reaper`` classes share: the settings and the counts."""

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
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.client, self.queue = client, queue
        self.metrics = metrics  # echomq.metrics.Metrics: told what each tick did
        if metrics is not None:
            metrics.bind(client)
        self.interval, self.max_stalled, self.limit = interval, max_stalled, limit
        self.on_sweep = on_sweep
        self.recovered = 0
        self.dead = 0
        self.errors = 0
        self._init_driver()

    def _init_driver(self) -> None:
        """Make the driver's own thread or task primitives."""

    def _tick(self) -> SweepTick:
        return SweepTick(self.limit)

    def _swept(self, tick: SweepTick) -> SweepResult:
        """Count a finished tick, tell ``on_sweep`` if it did anything, return what it did."""
        total = tick.total
        self.recovered += len(total.recovered)
        self.dead += len(total.dead)
        if self.metrics is not None:
            self.metrics.swept(self.queue, total)
        if total and self.on_sweep is not None:
            self.on_sweep(total)
        return total

    def _sweep_failed(self) -> None:
        """Count and log a failed tick (call from the ``except`` block); the next tick retries."""
        self.errors += 1
        reaper_log.exception("sweep of %s failed", self.queue)


# -- the worker ------------------------------------------------------------------


@dataclass
class WorkerStats:
    """What a worker did (counts since it was created)."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0  # ended by a remote cancel (EMQ.CANCEL)
    leases_lost: int = 0
    rejected: int = 0  # complete/fail refused with StaleToken/JobGone

    def record_fail(self, where: str) -> None:
        """Count a FAIL by where it sent the job."""
        if where == "cancelled":
            self.cancelled += 1
        else:
            self.failed += 1


class Action(enum.Enum):
    """What a worker does with a job whose handler has ended."""

    COMPLETE = "complete"
    FAIL = "fail"
    DROP = "drop"
    """The lease was lost: the job belongs to whoever holds it now; send nothing."""


@dataclass(frozen=True)
class Finish:
    """The decision for one job whose handler ended, and what it needs to be sent."""

    held: HeldJob
    action: Action
    error: str = ""  # FAIL's last_error

    @property
    def job(self) -> Job:
        return self.held.job


class WorkerCore(Generic[ClientT, HandlerT]):
    """What both ``Worker`` classes share: settings, the held jobs, stopping, finishing, stats."""

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
        metrics: Metrics | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.client, self.queue, self.handler = client, queue, handler
        self.metrics = metrics  # echomq.metrics.Metrics: told of every claim, lease and end
        if metrics is not None:
            metrics.bind(client)
        self.lease_ms, self.max_attempts = lease_ms, max_attempts
        self.concurrency, self.poll_interval = concurrency, poll_interval
        self.extend_interval = extend_interval
        self.stats = WorkerStats()
        self._held = Leases()
        self._stop_requested = False
        self._init_driver()

    def _init_driver(self) -> None:
        """Make the driver's own thread or task primitives."""

    def _begin(self) -> None:
        self._stop_requested = False

    def _request_stop(self) -> None:
        """Stop claiming; running handlers are told "shutdown"."""
        self._stop_requested = True
        self._held.cancel_all(SHUTDOWN)

    def _took(self, held: HeldJob) -> None:
        """A job was claimed and its keeper made; a claim that raced ``stop()`` is cancelled at once."""
        held.metrics = self.metrics
        self._held.add(held)
        if self._stop_requested:
            held.cancel.cancel(SHUTDOWN)

    def _let_go(self, held: HeldJob) -> None:
        """The handler ended (however it ended) and its keeper stopped."""
        self._held.discard(held)

    def _decide(self, held: HeldJob, error: BaseException | None) -> Finish:
        """Complete, fail with the error's text, or (the lease was lost) send nothing."""
        if held.lost is not None:
            self.stats.leases_lost += 1
            self._ended(held.job, "lost")
            return Finish(held, Action.DROP)
        if error is None:
            return Finish(held, Action.COMPLETE)
        return Finish(held, Action.FAIL, error_text(error))

    def _landed(self, finish: Finish, where: FailOutcome | None = None) -> None:
        """COMPLETE or FAIL was accepted; ``where`` is FAIL's answer."""
        if finish.action is Action.COMPLETE:
            self.stats.completed += 1
            self._ended(finish.job, "completed")
            return
        assert where is not None
        self.stats.record_fail(where)
        self._ended(finish.job, "retried" if where == "pending" else where)
        worker_log.info("job %s failed (%s), now %s", finish.job.id, finish.error, where)

    def _refused(self, finish: Finish, exc: LeaseLost) -> None:
        """COMPLETE or FAIL was refused: the lease lapsed between the keeper's last check and now."""
        self.stats.rejected += 1
        self._ended(finish.job, "refused")
        worker_log.warning("job %s: %s refused: %s", finish.job.id, finish.action.value, exc)

    def _ended(self, job: Job, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.finished(job, outcome)

    def _loop_failed(self) -> None:
        """Log an error of the claim loop itself (call from the ``except`` block); it goes on."""
        worker_log.exception("worker loop error on %s", self.queue)
