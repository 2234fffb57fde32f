"""The lease keeper (threads): checkpoint a running job's lease, and stop the handler when it is lost.

While the handler runs, a background thread checkpoints the lease every
``interval`` (a third of the lease by default) with EMQ.CHECKPOINT, or
EMQ.EXTEND when ``deliver_cancel=False``.  The lease is lost when

- the server answers StaleToken (another attempt holds the job, or a sweep
  took it) or JobGone (the row was deleted), or
- no checkpoint was confirmed before the deadline of the last confirmed one
  passed (the server is unreachable): by then a sweep may have handed the
  job to another worker.  The process-wide deadline watch (``_watch.py``)
  notices that even while a checkpoint is stuck on a dead connection, and
  the deadline counts until ``stop()`` returns, so a worker never finishes
  a job whose lease it could not show.

Either way the handler's CancelToken is cancelled with a reason that says
which (``LOST_STALE``, ``LOST_GONE``, ``LOST_DEADLINE``), so the handler
stops at its next check instead of racing the worker that now owns the job.
EMQ.CHECKPOINT also brings back a cancel requested with ``Client.cancel``
from anywhere: the token is cancelled with that request's reason and the
lease keeps running while the handler winds down.

A checkpoint's answer is awaited ``ATTEMPT_TIMEOUT_S`` (longer after each
one that got none, at most an interval, never past the deadline): one that
takes longer is given up with its connection, which may be half-open, and
the next goes out on a fresh one.  ``stop()`` does not wait for a
checkpoint in flight (its answer can no longer change anything): it cuts it
short.

A worker's keepers share one thread (``SharedKeeper``) that checkpoints
every held job that is due in one batch: one pipeline per tick, however
many jobs the worker holds (``_runtime.checkpoint_round``).

The rules are ``_runtime.HeldJob``'s; this file only waits and sends.

Hand-written beside its twin ``asyncio/lease.py``, not generated from it
(``tests/unasync.py``): a thread per held job with its ``Event`` where asyncio has one
task checkpointing every held job a tick (``Keepers``).
"""

from __future__ import annotations

import math
import threading
import time
from types import TracebackType
from typing import Any

from .. import _protocol as proto
from .._runtime import (
    LOST_DEADLINE,
    LOST_GONE,
    LOST_STALE,
    KeeperCore,
    LeaseEvent,
    checkpoint_round,
    lease_log,
    lost_reason,
    state_refused,
)
from .._watch import HORIZON_S, WATCH
from ..cancel import Cancellation
from ..errors import BadArgument
from ._attempt import Cutter
from .client import Client

__all__ = ["LOST_DEADLINE", "LOST_GONE", "LOST_STALE", "LeaseKeeper", "lost_reason"]

# How long stop() waits for the checkpoint thread once it has cut the
# checkpoint in flight; longer only while it is still connecting (bounded by
# the client's own connect and socket timeouts), and then it ends by itself.
STOP_JOIN_S = 0.5


class LeaseKeeper(KeeperCore[Client]):
    """Context manager that keeps ``job``'s lease alive while its block runs.

    ``LeaseKeeper(client, job, lease_ms, cancel, *, interval=None,
    claimed_at=None, deliver_cancel=True, clock=time.monotonic)``:
    ``claimed_at`` is ``clock()`` taken just before the claim (or the last
    extend) was sent: the server's deadline is at least ``claimed_at +
    lease_ms``, so the keeper's own deadline is never late.  ``lost`` says
    why the lease was lost (None while it is not); ``extends`` counts the
    confirmed checkpoints.  Every argument is checked here (TypeError or
    ValueError naming it).

    >>> with LeaseKeeper(client, job, lease_ms=30_000, cancel=token):  # doctest: +SKIP
    ...     handler(job, token)
    """

    _client_type = Client

    def _init_driver(self) -> None:
        # One lock between the checkpoint thread, the handler's own
        # checkpoint() and the deadline watch: the HeldJob is not thread-safe.
        self._lock = threading.Lock()
        # A keeper of its own (not a worker's: _shared) makes these in start(): a worker makes one per job.
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._cutter: Cutter | None = None
        self._shared: SharedKeeper | None = None  # a worker's one keeper thread checkpoints this job
        self._started = False

    def __enter__(self) -> LeaseKeeper:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start checkpointing in a background thread (and watching the deadline)."""
        self._started = True
        WATCH.add(self._held, self._lock, self._clock)
        if self._shared is not None:
            self._shared.add(self)
            return
        with self._lock:
            self._stop, self._cutter = threading.Event(), Cutter()
            if self._held.stopped:
                self._stop.set()
        self._thread = threading.Thread(target=self._run, name=f"echomq-lease-{self.job.id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop checkpointing, cut a checkpoint in flight short, then look at the deadline a last time."""
        with self._lock:
            self._held.stop()
            thread, stop, cutter = self._thread, self._stop, self._cutter
        if stop is not None:
            stop.set()
        if self._shared is not None:
            self._shared.discard(self)
        if cutter is not None:
            cutter.cut()
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_JOIN_S)
        WATCH.remove(self._held)
        with self._lock:
            self._held.expire(self._clock())

    def checkpoint(self, state: bytes | None = None) -> Cancellation | None:
        """Checkpoint now, from the caller's thread (a handler's ``JobContext.checkpoint()``).

        Returns the cancel the server delivered, if any.  Connection trouble
        is not raised: the keeper retries and the deadline decides; a lost
        lease cancels the token (both are seen by ``raise_if_cancelled``).
        With ``state``, the bytes are stored on the job with the lease
        (EMQ.CHECKPOINT ... STATE, fenced by the job's token), even when
        ``deliver_cancel`` is off; see ``JobContext.checkpoint``.
        """
        return self._checkpoint(None, state)[1]

    def _store(self, state: bytes | None) -> bool:
        """A handler's checkpoint: True when the server confirmed it (and stored ``state``, if given)."""
        return self._checkpoint(None, state)[0]

    def _progress(self, data: bytes) -> None:
        """A handler's ``progress``: one EMQ.CHECKPOINT ... PROGRESS, fenced by the claim's token."""
        job = self.job
        self.client._run(proto.checkpoint(job.queue, job.id, job.token, self.lease_ms, progress=data))

    def _confirm(self, timeout: float) -> bool | None:
        """Before ``start()``: one try to confirm a claim answered late.

        True: confirmed (the lease runs from this send); False: the job is
        not ours (stale, gone); None: no answer, try again (the worker
        does, within a lease).
        """
        sent = self._clock()
        job = self.job
        try:
            call = proto.checkpoint(job.queue, job.id, job.token, self.lease_ms)
            requested = self.client._attempt(call, timeout)
        except Exception as exc:
            return False if self._confirm_failed(exc) else None
        self._confirmed(sent, requested)
        return True

    def _run(self) -> None:
        assert self._stop is not None
        while True:
            with self._lock:
                wait = self._held.wait_before_checkpoint(self._clock())
            if wait is None or self._stop.wait(wait):
                return
            with self._lock:
                due = self._held.checkpoint_due(self._clock())
            if due:
                self._checkpoint(self._cutter)

    def _checkpoint(
        self, cutter: Cutter | None, state: bytes | None = None
    ) -> tuple[bool, Cancellation | None]:
        """One checkpoint: (confirmed, the cancel it delivered)."""
        with self._lock:
            sent = self._clock()
            timeout = self._held.checkpoint_timeout(sent)
        call = self._checkpoint_call(state)
        try:
            requested = self.client._attempt(call, timeout, cutter)
        except BadArgument as exc:
            if state is not None:  # a state past emq.max-state-bytes: the handler's to fix; nothing written
                raise
            self._checkpoint_failed(exc)
            return False, None
        except Exception as exc:
            if state is not None and state_refused(exc):  # past maxmemory: keep the lease without it
                self._state_not_stored(exc)
                return False, self._checkpoint(cutter)[1]
            self._checkpoint_failed(exc)
            return False, None
        return True, self._checkpoint_answered(sent, requested)


class SharedKeeper:
    """One thread that checkpoints every job a worker holds, in batches, instead of a thread per job.

    Each held job keeps its ``LeaseKeeper`` (the handler's ``checkpoint()``,
    the rules, ``stop()``); this thread sleeps until the earliest held job
    is due, then checkpoints every job due (and those due soon) in one
    pipeline (``_runtime.checkpoint_round``): a worker holding five hundred
    jobs sends one command per tick, not five hundred at once.  It starts
    no thread per checkpoint; if its own thread cannot be started (a
    process at its limits) or dies, ``ensure()`` (the worker's supervisor
    calls it every tick) starts it again.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        # Its sections take the lock itself (C), not the Condition's Python __enter__/__exit__.
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._keepers: dict[LeaseKeeper, None] = {}
        self._by_id: dict[str, LeaseKeeper] = {}  # for a pushed cancel: the job's keeper
        self._wakes_at = math.inf
        self._closed = False
        self._changes = 0  # additions, so one made while the thread looked is not slept past
        self._thread: threading.Thread | None = None
        self._start_failed = False

    def add(self, keeper: LeaseKeeper) -> None:
        with self._mutex:
            self._keepers[keeper] = None
            self._by_id[keeper.job.id] = keeper
            self._changes += 1
            if keeper._held.next_checkpoint < self._wakes_at:
                self._cond.notify()
            running = self._thread is not None
        if not running:  # one that died is started again by the worker's supervisor (ensure, every tick)
            self.ensure()

    def ensure(self) -> bool:
        """Start the thread unless it runs (never started, could not start, died); True if it runs."""
        with self._mutex:
            if self._closed or (self._thread is not None and self._thread.is_alive()):
                return not self._closed
            thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:  # "can't start new thread": the next add() or tick tries again
                if not self._start_failed:
                    lease_log.error(
                        "%s: cannot start the lease keeper's thread (%s); trying again", self._name, exc
                    )
                self._start_failed = True
                self._thread = None
                return False
            if self._start_failed:
                lease_log.warning("%s: the lease keeper's thread runs again", self._name)
            self._start_failed = False
            self._thread = thread
            return True

    def discard(self, keeper: LeaseKeeper) -> None:
        with self._mutex:
            self._keepers.pop(keeper, None)
            if self._by_id.get(keeper.job.id) is keeper:
                del self._by_id[keeper.job.id]

    def pushed(self, job_id: str) -> bool:
        """A cancel of ``job_id`` was published: checkpoint it now (which delivers the reason).

        Runs in the caller's thread (the worker's cancel listener); False
        when this worker does not hold the job.
        """
        with self._mutex:
            keeper = self._by_id.get(job_id)
        if keeper is None:
            return False
        keeper.checkpoint()
        return True

    def checkpoint_all(self) -> None:
        """Checkpoint every held job now, in one batch (cancels published while nobody listened)."""
        with self._mutex:
            keepers = list(self._keepers)
        for keeper in keepers:
            with keeper._lock:
                if keeper._held.active:
                    keeper._held.next_checkpoint = min(keeper._held.next_checkpoint, keeper._clock())
        with self._mutex:
            self._changes += 1
            self._cond.notify()

    def close(self) -> None:
        with self._mutex:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread.ident is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._mutex:
                if self._closed:
                    return
                keepers = list(self._keepers)
                seen = self._changes
            try:
                batch, wait = checkpoint_round(keepers)
                if batch:
                    self._send(batch)  # type: ignore[arg-type]
                    continue  # look again at once: the answers moved every deadline
            except Exception as exc:  # a bug, or memory: logged, and the keeper goes on
                lease_log.error("%s: a checkpoint round failed: %r", self._name, exc, exc_info=exc)
                wait = 0.1
            # Not past the horizon, even with nothing held: see _watch.HORIZON_S.
            wait = HORIZON_S if wait is None else min(wait, HORIZON_S)
            with self._mutex:
                if self._closed:
                    return
                if self._changes != seen:
                    continue  # added while we looked: look again before sleeping
                self._wakes_at = time.monotonic() + wait
                self._cond.wait(wait)
                self._wakes_at = -math.inf

    @staticmethod
    def _send(batch: list[LeaseKeeper]) -> None:
        """One pipeline of checkpoints; each reply settles its own job, a failure all of them."""
        client = batch[0].client
        calls: list[proto.Call[Any]] = [keeper._checkpoint_call(None) for keeper in batch]
        sent = time.monotonic()
        timeout = min(keeper._held.checkpoint_timeout(sent) for keeper in batch)
        try:
            replies = client._attempt_many(calls, timeout)
        except Exception as exc:
            events = [keeper._checkpoint_failed(exc, report=False) for keeper in batch]
            if LeaseEvent.RETRY in events:  # once per batch, not once per job
                batch[0]._troubles.report(exc, f"checkpoint of {len(batch)} jobs")
            return
        for keeper, call, reply in zip(batch, calls, replies, strict=True):
            keeper._checkpoint_replied(sent, call, reply)
