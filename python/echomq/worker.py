"""The worker (threads): claim, run the handler under a lease keeper, complete or fail.

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        for chunk in chunks(job.payload):
            cancel.raise_if_cancelled()
            process(chunk)

    worker = echomq.Worker(client, "mail", handler, lease_ms=30_000, concurrency=4)
    worker.run()            # or worker.start() ... worker.stop(), or `with worker:`

A job whose lease was lost is never completed or failed by this worker: the
job belongs to whoever holds it now.  What to do when a handler ends, and
the stats, are ``_runtime.WorkerCore``'s; this file only runs threads and
sends commands.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from ._runtime import Action, Finish, WorkerCore, WorkerStats, error_text
from .cancel import CancelToken
from .client import Client, Job
from .errors import LeaseLost
from .lease import LeaseKeeper

__all__ = ["Handler", "Worker", "WorkerStats", "error_text"]

Handler = Callable[[Job, CancelToken], object]


class Worker(WorkerCore[Client, Handler]):
    """Runs ``handler(job, cancel_token)`` for the jobs of ``queue``.

    ``Worker(client, queue, handler, *, lease_ms=30_000, max_attempts=3,
    concurrency=1, poll_interval=0.2, extend_interval=None)``:

    - ``lease_ms``: each job's lease, checkpointed every ``extend_interval``
      seconds (default: a third of the lease).
    - ``max_attempts``: a handler that raises sends the job back to pending
      until the job has been claimed this many times, then to the dead set.
    - ``concurrency``: threads, each handling one job at a time; a thread
      that found no job waits ``poll_interval`` seconds before claiming again.
    - ``metrics``: an ``echomq.metrics.Metrics`` to count into (claims,
      ends and run times, lost leases, delivered cancels), or None.
    - ``stats``: a ``WorkerStats``.
    """

    def _init_driver(self) -> None:
        self._stopping = threading.Event()  # wakes idle threads; the decisions read _stop_requested
        self._lock = threading.Lock()  # the core's held jobs are shared by the threads
        self._threads: list[threading.Thread] = []

    # -- control ---------------------------------------------------------------

    def run(self) -> None:
        """Work in this thread (plus ``concurrency - 1`` others) until ``stop()``."""
        self._begin()
        self._stopping.clear()
        extra = [self._spawn(n) for n in range(1, self.concurrency)]
        try:
            self._loop()
        finally:
            for t in extra:
                t.join()

    def start(self) -> Worker:
        """Work in background threads; returns at once."""
        self._begin()
        self._stopping.clear()
        self._threads = [self._spawn(n) for n in range(self.concurrency)]
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop claiming, cancel running handlers with reason "shutdown", and wait for them."""
        with self._lock:
            self._request_stop()
        self._stopping.set()
        for t in self._threads:
            t.join(timeout)
        if self.metrics is not None:
            self.metrics.flush()

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

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
                self._loop_failed()
                worked = False
            if not worked:
                self._stopping.wait(self.poll_interval)

    def work_one(self) -> bool:
        """Claim and process one job; False when the queue had none."""
        claimed_at = time.monotonic()
        job = self.client.claim(self.queue, self.lease_ms)
        if job is None:
            return False
        if self.metrics is not None:
            self.metrics.claimed_with_wait(self.client, job)
        cancel = CancelToken()
        keeper = LeaseKeeper(
            self.client, job, self.lease_ms, cancel, interval=self.extend_interval, claimed_at=claimed_at
        )
        with self._lock:
            self._took(keeper._held)
        error: BaseException | None = None
        try:
            with keeper:
                try:
                    self.handler(job, cancel)
                except Exception as exc:  # the handler's failure is the job's, not the worker's
                    error = exc
        finally:
            with self._lock:
                self._let_go(keeper._held)
        self._finish(self._decide(keeper._held, error))
        return True

    def _finish(self, finish: Finish) -> None:
        job = finish.job
        try:
            if finish.action is Action.COMPLETE:
                self.client.complete(job.queue, job.id, job.token)
                self._landed(finish)
            elif finish.action is Action.FAIL:
                where = self.client.fail(job.queue, job.id, job.token, finish.error, self.max_attempts)
                self._landed(finish, where)
        except LeaseLost as exc:
            self._refused(finish, exc)
