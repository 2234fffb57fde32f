"""Finishing a job: what its handler's end decides (``Action``, ``Finish``), what it sends, what it counts.

``Finishing`` is the part of ``WorkerCore`` that decides a held job's end
and settles it by the server's answer; both drivers' finishers send it.
"""

from __future__ import annotations

import enum
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import _protocol as proto
from .._protocol import Call, FailOutcome, Job, ReleaseOutcome
from ..cancel import Cancellation
from ..errors import Cancelled, LeaseLost, NonRetryable, RateLimited, RetryLater
from .isolation import CHILD_TRACEBACK
from .lease import TIMEOUT, HeldJob
from .logs import job_fields, worker_log
from .per_job import JobSettings
from .shutdown import SHUTDOWN
from .stats import WorkerStats
from .troubles import Troubles

if TYPE_CHECKING:
    from ..retry import RetryPolicy
    from .metrics import Metrics


def error_text(error: BaseException) -> str:
    """The ``last_error`` a worker records for a handler's exception."""
    if isinstance(error, Cancelled):
        return str(error)  # "cancelled: <reason>"
    return f"{type(error).__name__}: {error}"


# A job lost to its own deadline is given back with tries for this long, or a lease if longer.
LAPSED_TRY_MIN_S = 1.0


class Action(enum.Enum):
    """What a worker does with a job whose handler has ended."""

    COMPLETE = "complete"
    FAIL = "fail"
    RELEASE = "release"
    """Give the job back without using an attempt: a shutdown (an operator's signal or ``stop()``)."""
    DROP = "drop"
    """The lease was lost (or the job given back already): it belongs to someone else; send nothing."""


@dataclass(slots=True)
class Finish:
    """The decision for one job whose handler ended, and what it needs to be sent."""

    held: HeldJob
    action: Action
    error: str = ""  # FAIL's last_error
    backoff_ms: int = 0  # RELEASE ... BACKOFF: the handler raised RateLimited
    result: bytes | None = None  # COMPLETE's RESULT (a StoredResult the handler returned)
    trace: str | None = None  # FAIL's TRACE
    dead: bool = False  # FAIL's DEAD (NonRetryable)
    delay_ms: int | None = None  # FAIL's DELAY asked by the handler (RetryLater)
    # RELEASE of a job whose lease this worker lost to its own deadline (``HeldJob.maybe_ours``):
    # tried a little past that deadline (the drivers' ``_finish``), never batched with the others.
    lapsed: bool = False

    @property
    def job(self) -> Job:
        return self.held.job


class StoredResult(bytes):
    """What a handler returns to have its job completed with a result (COMPLETE ... RESULT).

    Any other return value is ignored, as it always was: the task layer
    (``echomq.tasks``) encodes a task's return value into one of these.
    """


# Frames of this package that call a handler (the worker's, the task dispatcher's) say nothing
# about the failure: a traceback starts at the first frame outside it.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def traceback_text(error: BaseException) -> str:
    """What FAIL's TRACE stores (the client keeps its newest 8 KiB), from the handler's own frames.

    A handler's exception raised in a child process (``echomq.isolation``)
    keeps the traceback it had there: the frames that matter are the child's.
    """
    child = getattr(error, "__dict__", {}).get(CHILD_TRACEBACK)
    if isinstance(child, str):
        return child
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def result_refused(exc: BaseException) -> bool:
    """COMPLETE refused its RESULT (larger than ``emq.max-result-bytes``): nothing was written."""
    return "the result is larger" in str(exc)


class Finishing:
    """Deciding and settling a job's end, for ``WorkerCore`` (see the module docstring)."""

    queue: str
    stats: WorkerStats
    metrics: Metrics | None
    retry: RetryPolicy | None
    max_attempts: int
    _troubles: Troubles
    _stop_requested: bool
    _timed_out_error: Callable[[HeldJob, BaseException | None], str | None]  # Timing's
    _settings: Callable[[Job], JobSettings | None]  # PerJob's

    def _decide(
        self, held: HeldJob, error: BaseException | None, interrupted: bool = False, value: object = None
    ) -> Finish:
        """What to send for a job whose handler ended with ``error`` (None: it returned ``value``).

        RELEASE (``lapsed``) if the lease was lost to its own deadline
        (``HeldJob.maybe_ours``: a sweep would count a stall for a job its
        holder merely could not reach the server about); nothing if the
        lease was lost otherwise (stale, gone), a forced shutdown gave the job back
        already or a timeout abandoned it; RELEASE if the handler's exception
        came after "shutdown"; COMPLETE if it returned (with ``value`` as
        its result when it is a ``StoredResult``); RELEASE with a back-off
        if it raised ``RateLimited``; else FAIL with the
        error's text (the timeout's, after "timeout") and traceback, DEAD
        for a ``NonRetryable``, delayed for a ``RetryLater``.  A handler
        that raised SystemExit or KeyboardInterrupt itself
        (``interrupted``) fails its job like any other failure, a try used:
        a job that kills its workers ends dead after its tries, never
        crash-loops (an operator's signal reaches the worker, not the
        handler: its jobs are given back after "shutdown").
        """
        if held.given_back or held.abandoned:  # given back, or failed, while its handler ran: nothing to send
            return Finish(held, Action.DROP)
        if held.lost is not None:
            self._count_lost(held)
            if held.maybe_ours:  # lost by our own reckoning: the server may hold it for us still
                held.given_back = True
                # Tried for another lease at least (a restart, a stall): a sweep ends it sooner (stale).
                held.give_back_until = time.monotonic() + max(LAPSED_TRY_MIN_S, held.lease_ms / 1000)
                return Finish(held, Action.RELEASE, held.lost, lapsed=True)
            self._ended(held.job, "lost")
            return Finish(held, Action.DROP)
        held.finishing = True
        cancellation = held.cancel.check()
        if cancellation is not None and cancellation.reason == TIMEOUT:
            self.stats.timed_out += 1
        if error is None:
            return Finish(held, Action.COMPLETE, result=value if isinstance(value, StoredResult) else None)
        if cancellation == Cancellation(SHUTDOWN) and not interrupted:
            return Finish(held, Action.RELEASE, error_text(error))
        if isinstance(error, RateLimited):  # a 429: given back, no try used, the queue backs off
            return Finish(held, Action.RELEASE, error_text(error), error.ms)
        text = self._timed_out_error(held, error) or error_text(error)
        delay = error.delay_ms if isinstance(error, RetryLater) else None
        return Finish(held, Action.FAIL, text, dead=isinstance(error, NonRetryable), delay_ms=delay)

    def _teach(self, finish: Finish, error: BaseException | None) -> None:
        """A failure's traceback, for its FAIL's TRACE and the ERROR log line.

        The drivers call it outside their lock: formatting a traceback reads
        the source files of its frames.
        """
        if finish.action is not Action.FAIL or error is None:
            return
        finish.trace = traceback_text(error)
        fields = job_fields(finish.job)
        if isinstance(error, Cancelled):  # a cancel asked for: no fault to teach
            worker_log.info("job %s ended: %s", finish.job.id, finish.error, extra=fields)
        else:
            worker_log.error(
                "job %s failed: %s\n%s", finish.job.id, finish.error, finish.trace.rstrip(), extra=fields
            )

    def _result_refused(self, finish: Finish, exc: BaseException) -> Finish:
        """COMPLETE was refused for its result's size (nothing written): the job fails instead, a try used."""
        error = f"ResultTooLarge: {exc}"
        worker_log.error(
            "job %s: its result was refused: %s", finish.job.id, exc, extra=job_fields(finish.job)
        )
        return Finish(finish.held, Action.FAIL, error)

    def _landed(self, finish: Finish, where: FailOutcome | ReleaseOutcome | None = None) -> None:
        """COMPLETE, FAIL or RELEASE was accepted; ``where`` is FAIL's or RELEASE's answer."""
        self._troubles.healed()
        if finish.action is Action.COMPLETE:  # the usual end: no log line, so no log fields
            self.stats.completed += 1
            if self.metrics is not None:
                self.metrics.finished(finish.held.job, "completed")
            return
        fields = job_fields(finish.job)
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

    def _count_lost(self, held: HeldJob) -> None:
        """``leases_lost`` counts a job once, whichever paths its loss goes through."""
        if not held.loss_counted:
            held.loss_counted = True
            self.stats.leases_lost += 1

    def _ended(self, job: Job, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.finished(job, outcome)

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

    def _unfinished(self, finish: Finish, now: float | None = None) -> None:
        """The job's end got no answer before its lease ended, or (``now`` given) before a forced stop's
        budget ran out at ``now``, with that much of the lease left: the log says which."""
        self._count_lost(finish.held)
        self._ended(finish.job, "lost")
        left = None if now is None else finish.held.confirmed_until - now
        if left is not None and left > 0:
            worker_log.warning(
                "job %s: no answer to its %s before the forced stop's budget ran out, %.1f s before its "
                "lease ends (if it reached the server it took effect; if not, the job is recovered once "
                "its lease lapses)",
                finish.job.id, finish.action.value, left, extra=job_fields(finish.job),
            )  # fmt: skip
            return
        worker_log.warning(
            "job %s: no answer to its %s before its lease ended (if it reached the server it took "
            "effect; if not, the reaper gives the job to another worker)",
            finish.job.id,
            finish.action.value,
            extra=job_fields(finish.job),
        )

    def _fail_call(self, job: Job, error: str, finish: Finish | None = None) -> Call[FailOutcome]:
        """Where a failed job goes: FAIL with its error, traceback and DEAD, and its delay if there is one.

        The job's own retry budget (``_settings``) if its handler gives one,
        else the worker's; a ``RetryLater``'s delay before the policy's.
        """
        settings = self._settings(job)
        retry = settings.retry if settings is not None and settings.retry is not None else self.retry
        if settings is not None and settings.retry is not None:
            max_attempts = settings.retry.max_attempts
        elif settings is not None and settings.max_attempts is not None:
            max_attempts = settings.max_attempts  # its own tries, the worker's delays
        else:
            max_attempts = self.retry.max_attempts if self.retry is not None else self.max_attempts
        delay = finish.delay_ms if finish is not None else None
        if retry is not None and delay is None:
            delay = retry.delay_ms(job.attempt)
        trace, dead = (finish.trace, finish.dead) if finish is not None else (None, False)
        return proto.fail(job.queue, job.id, job.token, error, max_attempts, delay, trace, dead)

    def _end_call(self, finish: Finish) -> Call[object]:
        """The command that ends a job's hold: COMPLETE, FAIL (``_fail_call``) or RELEASE."""
        job = finish.job
        if finish.action is Action.COMPLETE:
            return proto.complete(job.queue, job.id, job.token, finish.result)  # type: ignore[return-value]
        if finish.action is Action.FAIL:
            return self._fail_call(job, finish.error, finish)  # type: ignore[return-value]
        return proto.release(job.queue, job.id, job.token, finish.backoff_ms)  # type: ignore[return-value]
