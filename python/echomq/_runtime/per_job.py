"""Per-job settings: what a handler serving several kinds of job asks of each one.

A worker has one lease, one timeout and one retry budget.  A handler that
serves several kinds of job (the task layer's dispatcher, ``echomq.tasks``)
may give each job its own: it carries a ``job_settings(job)`` method, and the
worker asks it once per claimed job (``PerJob._settings``).  Whatever it
leaves as None is the worker's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._protocol import Job

if TYPE_CHECKING:
    from ..retry import RetryPolicy

SETTINGS_HOOK = "job_settings"
"""The name of a handler's per-job settings method (``Callable[[Job], JobSettings | None]``)."""


@dataclass(frozen=True, slots=True)
class JobSettings:
    """One job's own lease, timeout and retry budget (None: the worker's)."""

    lease_ms: int | None = None
    timeout_ms: int | None = None
    max_attempts: int | None = None
    retry: RetryPolicy | None = None


def settings_hook(handler: object) -> Callable[[Job], JobSettings | None] | None:
    """The handler's ``job_settings`` method, if it has one."""
    hook = getattr(handler, SETTINGS_HOOK, None)
    return hook if callable(hook) else None


class PerJob:
    """For ``WorkerCore``: a job's settings, the handler's where it gives them, else the worker's."""

    lease_ms: int
    _interval: float
    _settings_hook: Callable[[Job], JobSettings | None] | None

    def _settings(self, job: Job) -> JobSettings | None:
        return None if self._settings_hook is None else self._settings_hook(job)

    def _lease_for(self, job: Job) -> tuple[int, float]:
        """The lease its keeper extends ``job`` by, and how often it checkpoints.

        The claim took the worker's lease: the first checkpoint comes within
        a third of the shorter of the two, so the job's own lease is never
        late.
        """
        settings = self._settings(job)
        if settings is None or settings.lease_ms is None:
            return self.lease_ms, self._interval
        lease_ms = settings.lease_ms
        return lease_ms, min(self._interval, lease_ms / 3000.0)
