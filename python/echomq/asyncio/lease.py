"""The lease keeper for asyncio: checkpoint a running job's lease, and stop the handler when it is lost.

The same rules as ``echomq.lease`` (``_runtime.HeldJob``'s); a worker's
keepers share one task (``Keepers``) that checkpoints every held job that
is due in one batch: one pipeline per tick, whatever the number of jobs
(``_runtime.checkpoint_round``), so five hundred held jobs neither need
five hundred connections at once nor retry in step.

Hand-written beside its twin ``_sync/lease.py``, not generated from it
(``tests/unasync.py``): a thread per held job with its ``Event`` where asyncio has one
task checkpointing every held job a tick (``Keepers``).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from .. import _protocol as proto
from .._runtime import KeeperCore, LeaseEvent, checkpoint_round, lease_log, state_refused
from .._watch import HORIZON_S, WATCH
from ..cancel import Cancellation
from ..errors import BadArgument
from ._waits import wait_event
from .client import Client

__all__ = ["Keepers", "LeaseKeeper"]


class LeaseKeeper(KeeperCore[Client]):
    """Async context manager: checkpoint ``job`` every ``interval`` while the block runs.

    The same arguments, attributes and rules as ``echomq.LeaseKeeper``:
    ``cancel`` is cancelled with a reason when the lease is lost (stale,
    gone, or no checkpoint confirmed before the deadline) and, with
    ``deliver_cancel``, with a remote cancel's reason.  ``claimed_at`` is on
    ``clock`` (``time.monotonic``, which is also the default event loop's
    clock).  The deadline is watched from a thread (``_watch.py``): a
    handler that blocks the event loop past the lease has its token
    cancelled at the deadline all the same.  A checkpoint's answer is
    awaited at most an interval; ``stop()`` cancels one in flight.
    """

    _client_type = Client

    def _init_driver(self) -> None:
        # A thread lock, held only between awaits: the deadline watch thread
        # updates the HeldJob too.
        self._lock = threading.Lock()
        self._stop: asyncio.Event | None = None  # a keeper of its own (not a worker's) makes it in start()
        self._task: asyncio.Task[Any] | None = None
        self._sending = False
        self._shared: Keepers | None = None  # a worker's one keeper task checkpoints this job

    async def __aenter__(self) -> LeaseKeeper:
        self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def start(self) -> None:
        """Start checkpointing in a task of the running loop (and watching the deadline)."""
        WATCH.add(self._held, self._lock, self._clock)
        if self._shared is not None:
            self._shared.add(self)
            return
        self._stop = asyncio.Event()
        if self._held.stopped:
            self._stop.set()
        self._task = asyncio.create_task(self._run(), name=f"echomq-lease-{self.job.id}")

    async def stop(self) -> None:
        """Stop checkpointing, cancel a checkpoint in flight, then look at the deadline a last time."""
        with self._lock:
            self._held.stop()
        if self._stop is not None:
            self._stop.set()
        if self._shared is not None:
            self._shared.discard(self)
        task = self._task
        try:
            if task is not None:
                if self._sending:  # its answer can no longer change anything
                    task.cancel()
                await asyncio.wait([task])
        finally:
            if task is not None and not task.done():  # stop() itself was cancelled
                task.cancel()
            WATCH.remove(self._held)
            with self._lock:
                self._held.expire(self._clock())

    async def checkpoint(self, state: bytes | None = None) -> Cancellation | None:
        """Checkpoint now, storing ``state`` if given (see ``echomq.LeaseKeeper.checkpoint``)."""
        return (await self._checkpoint(own=False, state=state))[1]

    async def _store(self, state: bytes | None) -> bool:
        """A handler's checkpoint: True when the server confirmed it (and stored ``state``, if given)."""
        return (await self._checkpoint(own=False, state=state))[0]

    async def _progress(self, data: bytes) -> None:
        """A handler's ``progress`` (see ``echomq.LeaseKeeper._progress``)."""
        job = self.job
        await self.client._run(proto.checkpoint(job.queue, job.id, job.token, self.lease_ms, progress=data))

    async def _confirm(
        self, timeout: float, attempt: Callable[[proto.Call[Any], float], Awaitable[Any]] | None = None
    ) -> bool | None:
        """Before ``start()``: one try to confirm a late claim (see ``echomq.LeaseKeeper._confirm``).

        ``attempt``: how the try is sent (the worker's: in one pipeline with
        the other calls of this loop turn, so the jobs of one late claim are
        confirmed in one round trip, not each waiting for a connection).
        """
        sent = self._clock()
        job = self.job
        try:
            call = proto.checkpoint(job.queue, job.id, job.token, self.lease_ms)
            requested = await (attempt or self.client._attempt)(call, timeout)
        except Exception as exc:
            return False if self._confirm_failed(exc) else None
        self._confirmed(sent, requested)
        return True

    async def _run(self) -> None:
        assert self._stop is not None
        while True:
            with self._lock:
                wait = self._held.wait_before_checkpoint(self._clock())
            if wait is None or await wait_event(self._stop, wait):
                return
            with self._lock:
                due = self._held.checkpoint_due(self._clock())
            if due:
                await self._checkpoint(own=True)

    async def _checkpoint(self, *, own: bool, state: bytes | None = None) -> tuple[bool, Cancellation | None]:
        """One checkpoint: (confirmed, the cancel it delivered); as ``echomq.LeaseKeeper``'s."""
        with self._lock:
            sent = self._clock()
            timeout = self._held.checkpoint_timeout(sent)
        call = self._checkpoint_call(state)
        self._sending = own
        try:
            requested = await self.client._attempt(call, timeout)
        except BadArgument as exc:
            if state is not None:  # a state past emq.max-state-bytes: the handler's to fix; nothing written
                raise
            self._checkpoint_failed(exc)
            return False, None
        except Exception as exc:
            if state is not None and state_refused(exc):  # past maxmemory: keep the lease without it
                self._state_not_stored(exc)
                self._sending = False
                return False, (await self._checkpoint(own=own))[1]
            self._checkpoint_failed(exc)
            return False, None
        finally:
            self._sending = False
        return True, self._checkpoint_answered(sent, requested)


class Keepers:
    """One task that checkpoints every job a worker holds, in batches (see ``echomq.lease.SharedKeeper``).

    Each held job keeps its ``LeaseKeeper`` (the handler's ``checkpoint()``,
    the rules, ``stop()``); this task sleeps until the earliest held job is
    due, then sends every due job's checkpoint in one pipeline.  A pushed
    cancel checkpoints its job at once, in a task of its own.
    """

    def __init__(self) -> None:
        self._keepers: dict[LeaseKeeper, None] = {}
        self._by_id: dict[str, LeaseKeeper] = {}  # for a pushed cancel: the job's keeper
        self._wake = asyncio.Event()
        self._wakes_at = math.inf
        self._task: asyncio.Task[None] | None = None
        self._pushes: set[asyncio.Task[Any]] = set()
        self._closed = False

    def add(self, keeper: LeaseKeeper) -> None:
        self._keepers[keeper] = None
        self._by_id[keeper.job.id] = keeper
        if self._closed:  # the worker has ended: no task is made that nobody would end
            return
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="echomq-lease-keeper")
        elif keeper._held.next_checkpoint < self._wakes_at:
            self._wake.set()

    def discard(self, keeper: LeaseKeeper) -> None:
        self._keepers.pop(keeper, None)
        if self._by_id.get(keeper.job.id) is keeper:
            del self._by_id[keeper.job.id]

    def pushed(self, job_id: str) -> bool:
        """A cancel of ``job_id`` was published: checkpoint it now (which delivers the reason).

        False when this worker does not hold the job.  The checkpoint runs in
        a task of its own, so the listener goes on reading.
        """
        keeper = self._by_id.get(job_id)
        if keeper is None:
            return False
        task = asyncio.create_task(keeper.checkpoint(), name=f"echomq-cancel-{job_id}")
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)
        return True

    def checkpoint_all(self) -> None:
        """Checkpoint every held job now, in one batch (cancels published while nobody listened)."""
        for keeper in list(self._keepers):
            with keeper._lock:
                if keeper._held.active:
                    keeper._held.next_checkpoint = min(keeper._held.next_checkpoint, keeper._clock())
        self._wake.set()

    async def close(self) -> None:
        """End the task (and the pushed cancels' checkpoints).

        Its loop also looks at ``_closed``: a cancel swallowed on the way
        (one met a try's timeout as it fired, say) ended nothing, and a
        forced asyncio stop waited here for ever (the outage test's worker
        that never exited).
        """
        self._closed = True
        self._wake.set()
        task, self._task = self._task, None
        tasks = [t for t in [task, *self._pushes] if t is not None and not t.done()]
        while tasks:
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks, timeout=1.0)
            tasks = [t for t in tasks if not t.done()]

    async def _run(self) -> None:
        while not self._closed:
            self._wake.clear()
            try:
                batch, wait = checkpoint_round(list(self._keepers))
                if batch:
                    await self._send(batch)  # type: ignore[arg-type]
                    continue  # look again at once: the answers moved every deadline
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug, or memory: logged, and the keeper goes on
                lease_log.error("the lease keeper's round failed: %r", exc, exc_info=exc)
                wait = 0.1
            wait = HORIZON_S if wait is None else min(wait, HORIZON_S)  # see _watch.HORIZON_S
            self._wakes_at = time.monotonic() + wait
            await wait_event(self._wake, wait)
            self._wakes_at = -math.inf

    @staticmethod
    async def _send(batch: list[LeaseKeeper]) -> None:
        """One pipeline of checkpoints; each reply settles its own job, a failure all of them."""
        client = batch[0].client
        calls: list[proto.Call[Any]] = [keeper._checkpoint_call(None) for keeper in batch]
        sent = time.monotonic()
        timeout = min(keeper._held.checkpoint_timeout(sent) for keeper in batch)
        try:
            # On the worker's own lane (``_attempt.STOP_LANE``): renewals that waited behind a
            # dry pool (every handler's own checkpoint hung on a half-open connection) got
            # none in time, and every held job lost its lease at once.
            replies = await client._attempt_many(calls, timeout, lane=True)
        except Exception as exc:
            events = [keeper._checkpoint_failed(exc, report=False) for keeper in batch]
            if LeaseEvent.RETRY in events:  # once per batch, not once per job
                batch[0]._troubles.report(exc, f"checkpoint of {len(batch)} jobs")
            return
        for keeper, call, reply in zip(batch, calls, replies, strict=True):
            keeper._checkpoint_replied(sent, call, reply)
