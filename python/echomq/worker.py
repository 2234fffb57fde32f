"""The worker: claim, run the handler under a lease keeper, complete or fail.

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        for chunk in chunks(job.payload):
            cancel.raise_if_cancelled()
            process(chunk)

    worker = echomq.Worker(client, "mail", handler, lease_ms=30_000, concurrency=4)
    worker.run()            # or worker.start() ... worker.stop()

A job whose lease was lost is never completed or failed by this worker: the
job belongs to whoever holds it now.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .cancel import CancelToken
from .client import Client, Job
from .errors import Cancelled, LeaseLost
from .lease import LeaseKeeper

__all__ = ["Handler", "Worker", "WorkerStats", "error_text"]

log = logging.getLogger("echomq.worker")

Handler = Callable[[Job, CancelToken], object]


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


def error_text(error: BaseException) -> str:
    """The ``last_error`` a worker records for a handler's exception."""
    if isinstance(error, Cancelled):
        return str(error)  # "cancelled: <reason>"
    return f"{type(error).__name__}: {error}"


class Worker:
    """Runs ``handler(job, cancel_token)`` for the jobs of ``queue``.

    - ``lease_ms``: each job's lease, checkpointed every ``extend_interval``
      seconds (default: a third of the lease).
    - ``max_attempts``: a handler that raises sends the job back to pending
      until the job has been claimed this many times, then to the dead set.
    - ``concurrency``: threads, each handling one job at a time.
    """

    def __init__(
        self,
        client: Client,
        queue: str,
        handler: Handler,
        *,
        lease_ms: int = 30_000,
        max_attempts: int = 3,
        concurrency: int = 1,
        poll_interval: float = 0.2,
        extend_interval: float | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.client, self.queue, self.handler = client, queue, handler
        self.lease_ms, self.max_attempts = lease_ms, max_attempts
        self.concurrency, self.poll_interval = concurrency, poll_interval
        self.extend_interval = extend_interval
        self.stats = WorkerStats()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[int, CancelToken] = {}
        self._threads: list[threading.Thread] = []

    # -- control ---------------------------------------------------------------

    def run(self) -> None:
        """Work in this thread (plus ``concurrency - 1`` others) until ``stop()``."""
        self._stopping.clear()
        extra = [self._spawn(n) for n in range(1, self.concurrency)]
        try:
            self._loop()
        finally:
            for t in extra:
                t.join()

    def start(self) -> Worker:
        """Work in background threads; returns at once."""
        self._stopping.clear()
        self._threads = [self._spawn(n) for n in range(self.concurrency)]
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop claiming, cancel running handlers with reason "shutdown", and wait for them."""
        self._stopping.set()
        with self._lock:
            tokens = list(self._running.values())
        for token in tokens:
            token.cancel("shutdown")
        for t in self._threads:
            t.join(timeout)

    def _spawn(self, n: int) -> threading.Thread:
        t = threading.Thread(target=self._loop, name=f"echomq-worker-{self.queue}-{n}", daemon=True)
        t.start()
        return t

    # -- the loop --------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                worked = self.work_one()
            except Exception:
                log.exception("worker loop error on %s", self.queue)
                worked = False
            if not worked:
                self._stopping.wait(self.poll_interval)

    def work_one(self) -> bool:
        """Claim and process one job; False when the queue had none."""
        claimed_at = time.monotonic()
        job = self.client.claim(self.queue, self.lease_ms)
        if job is None:
            return False
        cancel = CancelToken()
        ident = threading.get_ident()
        with self._lock:
            self._running[ident] = cancel
        if self._stopping.is_set():
            cancel.cancel("shutdown")
        error: BaseException | None = None
        keeper = LeaseKeeper(
            self.client, job, self.lease_ms, cancel, interval=self.extend_interval, claimed_at=claimed_at
        )
        try:
            with keeper:
                try:
                    self.handler(job, cancel)
                except Exception as exc:  # the handler's failure is the job's, not the worker's
                    error = exc
        finally:
            with self._lock:
                self._running.pop(ident, None)
        self._finish(job, keeper, error)
        return True

    def _finish(self, job: Job, keeper: LeaseKeeper, error: BaseException | None) -> None:
        if keeper.lost is not None:
            self.stats.leases_lost += 1
            return
        try:
            if error is None:
                self.client.complete(job.queue, job.id, job.token)
                self.stats.completed += 1
            else:
                text = error_text(error)
                where = self.client.fail(job.queue, job.id, job.token, text, self.max_attempts)
                self.stats.record_fail(where)
                log.info("job %s failed (%s), now %s", job.id, text, where)
        except LeaseLost as exc:
            # The lease lapsed between the keeper's last check and now.
            self.stats.rejected += 1
            log.warning("job %s: %s refused: %s", job.id, "complete" if error is None else "fail", exc)
