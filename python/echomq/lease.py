"""The lease keeper (threads): checkpoint a running job's lease, and stop the handler when it is lost.

While the handler runs, a background thread checkpoints the lease every
``interval`` (a third of the lease by default): EMQ.CHECKPOINT, or EMQ.EXTEND
with ``deliver_cancel=False``.  The lease is lost when

- the server answers StaleToken (another attempt holds the job, or a sweep
  took it) or JobGone (the row was deleted), or
- no checkpoint was confirmed before the deadline of the last confirmed one
  passed (the server is unreachable): by then a sweep may have handed the
  job to another worker.  The deadline counts until ``stop()`` returns, so
  a worker never finishes a job whose lease it could not show.

Either way the handler's CancelToken is cancelled with a reason that says
which (``LOST_STALE``, ``LOST_GONE``, ``LOST_DEADLINE``), so the handler
stops at its next check instead of racing the worker that now owns the job.
EMQ.CHECKPOINT also brings back a cancel requested with ``Client.cancel``
from anywhere: the token is cancelled with that request's reason and the
lease keeps running while the handler winds down.

The rules are ``_runtime.HeldJob``'s; this file only waits and sends.
"""

from __future__ import annotations

import threading
from types import TracebackType

from ._runtime import LOST_DEADLINE, LOST_GONE, LOST_STALE, KeeperCore, LeaseEvent, lost_reason
from .cancel import Cancellation
from .client import Client

__all__ = ["LOST_DEADLINE", "LOST_GONE", "LOST_STALE", "LeaseKeeper", "lost_reason"]


class LeaseKeeper(KeeperCore[Client]):
    """Context manager that keeps ``job``'s lease alive while its block runs.

    ``LeaseKeeper(client, job, lease_ms, cancel, *, interval=None,
    claimed_at=None, deliver_cancel=True, clock=time.monotonic)``:
    ``claimed_at`` is ``clock()`` taken just before the claim (or the last
    extend) was sent: the server's deadline is at least ``claimed_at +
    lease_ms``, so the keeper's own deadline is never late.  ``lost`` says
    why the lease was lost (None while it is not); ``extends`` counts the
    confirmed checkpoints.

    >>> with LeaseKeeper(client, job, lease_ms=30_000, cancel=token):  # doctest: +SKIP
    ...     handler(job, token)
    """

    def _init_driver(self) -> None:
        # One lock between the checkpoint thread and the deadline timer: the
        # HeldJob they both update is not thread-safe.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Timer | None = None

    def __enter__(self) -> LeaseKeeper:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start checkpointing in a background thread."""
        with self._lock:
            self._arm_watchdog()
        self._thread = threading.Thread(target=self._run, name=f"echomq-lease-{self.job.id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop checkpointing; waits for a checkpoint in flight, then looks at the deadline a last time."""
        with self._lock:
            self._held.stop()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None
            self._held.expire(self._clock())

    def _arm_watchdog(self) -> None:
        # A timer, not the loop, watches the deadline: a checkpoint blocked on
        # a dead connection must not keep the handler running past its lease.
        if self._watchdog is not None:
            self._watchdog.cancel()
        delay = max(0.0, self._held.time_left(self._clock()))
        self._watchdog = threading.Timer(delay, self._deadline_passed)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _deadline_passed(self) -> None:
        with self._lock:
            self._held.expire(self._clock())

    def _run(self) -> None:
        while True:
            with self._lock:
                wait = self._held.wait_before_checkpoint(self._clock())
            if wait is None or self._stop.wait(wait):
                return
            with self._lock:
                due = self._held.checkpoint_due(self._clock())
            if due:
                self._checkpoint()

    def _checkpoint(self) -> None:
        sent = self._clock()
        try:
            requested = self._send()
        except Exception as exc:
            with self._lock:
                self._held.failed(exc, self._clock())
            return
        with self._lock:
            if self._held.confirmed(sent, self._clock(), requested) is not LeaseEvent.IGNORED:
                self._arm_watchdog()

    def _send(self) -> Cancellation | None:
        job = self.job
        if self.deliver_cancel:
            return self.client.checkpoint(job.queue, job.id, job.token, self.lease_ms)
        self.client.extend(job.queue, job.id, job.token, self.lease_ms)
        return None
