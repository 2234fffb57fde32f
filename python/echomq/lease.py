"""The lease keeper: checkpoint a running job's lease, and stop the handler when it is lost.

While the handler runs, a background thread calls EMQ.EXTEND every
``interval`` (a third of the lease by default).  The lease is lost when

- the server answers StaleToken (another attempt holds the job, or a sweep
  took it) or JobGone (the row was deleted), or
- no extend was confirmed before the deadline of the last confirmed one
  passed (the server is unreachable): by then a sweep may have handed the
  job to another worker.

Either way the handler's CancelToken is cancelled with a reason that says
which, so the handler stops at its next check instead of racing the worker
that now owns the job.

With ``deliver_cancel`` (the default) the checkpoint is EMQ.CHECKPOINT, which
also brings back a cancel requested with ``Client.cancel`` from anywhere: the
token is cancelled with that request's reason and the lease keeps running
while the handler winds down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

from .cancel import Cancellation, CancelToken
from .client import Client, Job
from .errors import JobGone, StaleToken

__all__ = ["LOST_DEADLINE", "LOST_GONE", "LOST_STALE", "LeaseKeeper", "lost_reason"]

log = logging.getLogger("echomq.lease")

# Why a lease was lost: the reason given to the handler's CancelToken.
LOST_STALE = "lease lost: stale token (the job was swept or another attempt holds it)"
LOST_GONE = "lease lost: the job row is gone"
LOST_DEADLINE = "lease lost: no extend confirmed before the deadline passed"


def lost_reason(exc: BaseException) -> str | None:
    """The reason a checkpoint's exception means the lease is lost, or None (retry)."""
    if isinstance(exc, StaleToken):
        return LOST_STALE
    if isinstance(exc, JobGone):
        return LOST_GONE
    return None


class LeaseKeeper:
    """Context manager that keeps ``job``'s lease alive while its block runs.

    ``claimed_at`` is the ``time.monotonic()`` taken just before the claim
    (or the last extend) was sent: the server's deadline is at least
    ``claimed_at + lease_ms``, so the keeper's own deadline is never late.

    >>> with LeaseKeeper(client, job, lease_ms=30_000, cancel=token):  # doctest: +SKIP
    ...     handler(job, token)
    """

    def __init__(
        self,
        client: Client,
        job: Job,
        lease_ms: int,
        cancel: CancelToken,
        *,
        interval: float | None = None,
        claimed_at: float | None = None,
        deliver_cancel: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lease_ms < 1:
            raise ValueError("lease_ms must be >= 1")
        self.client, self.job, self.lease_ms, self.cancel = client, job, lease_ms, cancel
        self.interval = interval if interval is not None else lease_ms / 3000.0
        self.deliver_cancel = deliver_cancel
        self._clock = clock
        self._lease_s = lease_ms / 1000.0
        self._confirmed_until = (claimed_at if claimed_at is not None else clock()) + self._lease_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Timer | None = None
        self.lost: str | None = None
        self.extends = 0

    # -- lifecycle -----------------------------------------------------------

    def __enter__(self) -> LeaseKeeper:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        with self._lock:
            self._arm_watchdog()
        self._thread = threading.Thread(target=self._run, name=f"echomq-lease-{self.job.id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None

    # -- the work ------------------------------------------------------------

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self.lost is not None:
                return
            self.lost = reason
            self._stop.set()
        log.warning("job %s of %s: %s", self.job.id, self.job.queue, reason)
        self.cancel.cancel(reason)

    def _arm_watchdog(self) -> None:
        # A timer, not the loop, watches the deadline: an extend blocked on a
        # dead connection must not keep the handler running past its lease.
        if self._watchdog is not None:
            self._watchdog.cancel()
        delay = max(0.0, self._confirmed_until - self._clock())
        self._watchdog = threading.Timer(delay, self._deadline_passed)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _deadline_passed(self) -> None:
        with self._lock:
            if self._stop.is_set() or self._clock() < self._confirmed_until:
                return
        self._lose(LOST_DEADLINE)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            sent = self._clock()
            try:
                requested = self._checkpoint()
            except Exception as exc:
                reason = lost_reason(exc)
                if reason is not None:
                    self._lose(reason)
                    return
                # Connection trouble: retry until the deadline says otherwise.
                log.debug("extend of %s failed: %r", self.job.id, exc)
                continue
            with self._lock:
                if self._stop.is_set():
                    return
                self.extends += 1
                self._confirmed_until = sent + self._lease_s
                self._arm_watchdog()
            if requested is not None:
                # Keep the lease while the handler winds down; just tell it.
                self.cancel.cancel(requested.reason)

    def _checkpoint(self) -> Cancellation | None:
        job = self.job
        if self.deliver_cancel:
            return self.client.checkpoint(job.queue, job.id, job.token, self.lease_ms)
        self.client.extend(job.queue, job.id, job.token, self.lease_ms)
        return None
