"""Timeouts: a handler that runs too long is told, then abandoned, and its job failed (a try used).

``timeout_ms`` (per worker today; ``_timeout_for`` takes the job, so a task
layer can give each task its own) limits how long a handler runs:

1. at the timeout, its token is cancelled with the reason ``"timeout"``
   (by the deadline watch: a handler that blocks its event loop is told
   all the same); a handler that checks its token (``ctx.checkpoint()``,
   ``raise_if_cancelled()``, ``cancel.sleep()``) ends there, and its job
   fails with the timeout's error, a try used (retried while tries are
   left, else dead); one that returns completes its job;
2. ``timeout_grace`` seconds later, a handler still running is
   *abandoned*: the worker fails its job itself (the same error) and stops
   waiting for it.  What that stops depends on the driver: an asyncio
   handler's task is cancelled; a thread cannot be stopped by Python, so
   its thread runs on, unwatched, and the worker starts another in its
   place (``_abandon_handler``: the seam where a driver that runs handlers
   in child processes kills the child instead).

A handler abandoned goes on until it returns; its job may meanwhile be
claimed again (its FAIL made it pending): the two runs overlap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from .._protocol import Job
from .finish import Action, Finish
from .lease import TIMEOUT, HeldJob, Leases
from .logs import job_fields, worker_log
from .per_job import JobSettings
from .stats import WorkerStats

__all__ = ["TIMEOUT", "JobTimeout", "Timing"]


@dataclass(frozen=True)
class JobTimeout:
    """One job's time limit: ``timeout_ms`` until its token is cancelled, then ``grace`` seconds more."""

    timeout_ms: int
    grace: float

    @property
    def error(self) -> str:
        """The ``last_error`` of a job whose handler ran past its timeout."""
        return f"TimeoutError: the handler ran longer than its timeout ({self.timeout_ms} ms)"


class Timing:
    """Handlers' time limits, for ``WorkerCore`` (see the module docstring)."""

    queue: str
    stats: WorkerStats
    timeout_ms: int | None
    timeout_grace: float
    _held: Leases
    _settings: Callable[[Job], JobSettings | None]  # PerJob's

    def _timeout_for(self, job: Job) -> JobTimeout | None:
        """``job``'s time limit: its own (``PerJob``: a task's), else the worker's ``timeout_ms``."""
        settings = self._settings(job)
        timeout_ms = self.timeout_ms
        if settings is not None and settings.timeout_ms is not None:
            timeout_ms = settings.timeout_ms
        if timeout_ms is None:
            return None
        return JobTimeout(timeout_ms, self.timeout_grace)

    def _time_handler(self, held: HeldJob, started: float) -> float:
        """The handler of ``held`` starts at ``started``: its timeout and abandon times; the first (or inf).

        The caller holds the job's keeper lock (the deadline watch reads them).
        """
        limit = self._timeout_for(held.job)
        if limit is None:
            return math.inf
        held.timeout_at = started + limit.timeout_ms / 1000
        held.abandon_at = held.timeout_at + limit.grace
        return held.timeout_at

    def _abandon_due(self, now: float) -> list[HeldJob]:
        """The jobs whose handlers ran past their timeout and its grace and still run: to abandon now."""
        return [
            held
            for held in self._held
            if held.abandon_at <= now
            and not (held.abandoned or held.finishing or held.given_back or held.stopped)
            and held.lost is None
        ]

    def _next_abandon(self, now: float) -> float | None:
        """Seconds until the next handler is due to be abandoned; None when none has a time limit."""
        due = [h.abandon_at for h in self._held if h.abandon_at < math.inf and not h.abandoned]
        return max(0.0, min(due) - now) if due else None

    def _abandon(self, held: HeldJob) -> Finish:
        """Give up on ``held``'s handler: its job is failed with the timeout's error (a try used).

        When the handler ends later, nothing more is sent for it (``_decide``:
        DROP).  The driver sends the FAIL and does what it can to the handler
        (``_abandon_handler``).
        """
        held.abandoned = held.finishing = True
        # It timed out too: counted here, since its end, whenever it comes, is DROPped uncounted.
        self.stats.timed_out += 1
        self.stats.abandoned += 1
        limit = self._timeout_for(held.job)
        error = limit.error if limit is not None else "TimeoutError: the handler was abandoned"
        worker_log.warning(
            "job %s: the handler still runs %.1f s past its timeout; abandoned, and the job failed (a try "
            "used): %s",
            held.job.id, limit.grace if limit is not None else 0.0, error, extra=job_fields(held.job),
        )  # fmt: skip
        return Finish(held, Action.FAIL, error)

    def _timed_out_error(self, held: HeldJob, error: BaseException | None) -> str | None:
        """The error to record for a handler that raised after its timeout cancelled its token, else None."""
        cancellation = held.cancel.check()
        if error is None or cancellation is None or cancellation.reason != TIMEOUT:
            return None
        limit = self._timeout_for(held.job)
        return limit.error if limit is not None else "TimeoutError: the handler ran past its timeout"
