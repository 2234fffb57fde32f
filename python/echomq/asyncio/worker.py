"""The asyncio worker: one claimer task, ``concurrency`` runner tasks, one keeper task.

The same rules as the thread worker (``_runtime.WorkerCore``): the shutdown,
the retries, what a handler's end does to its job.  Two hold on every path
out, a cancelled ``run()`` included: a job a claim answered is run or given
back (``_unowned``: the jobs claimed and not yet taken by a runner; a claim
whose answer was lost is asked again by its REQ; an answer whose caller was
cancelled goes to ``_orphaned``), and every command is bounded by its job's
lease and by the stop (``WorkerCore._bounded``).

Hand-written beside its twin ``_sync/worker.py``, not generated from it
(``tests/unasync.py``): threads that take turns (``_turns.py``) and a supervising
``run()`` thread, where asyncio has a claimer, runner tasks and a keeper in one loop.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar, cast

from .._log import CURRENT_JOB
from .._protocol import Job
from .._runtime import (
    ATTEMPT_TIMEOUT_S,
    FORCE_AFTER_S,
    FORCE_BUDGET_S,
    Action,
    Backoff,
    ClaimStep,
    HeldJob,
    IdleWait,
    count_of,
)
from .._watch import WATCH
from ..cancel import CancelToken
from ..isolation import ProcessPool, check_isolated_handler
from . import _partitions
from ._attempt import STOP_LANE
from ._finisher import SETTLE_TRY_S, Finisher, _GaveUp, _Stopped
from ._isolation import InChild, run_in_child
from ._pushes import CancelListener
from ._sweeper import sweep_loop
from ._ticks import TickDriver
from ._together import Coalescer
from ._waits import wait_event, within
from .client import Client
from .context import AsyncHandler, JobContext
from .lease import Keepers, LeaseKeeper

__all__ = ["Worker"]

T = TypeVar("T")

# Connections a worker needs besides one per runner: the claimer, the batches
# sent together, a pushed cancel's checkpoint, its sweeps (and STOP_LANE more,
# kept for its stop's give-backs and its keeper's batch).
OWN_LOOPS = 4


class Worker(Finisher[AsyncHandler]):
    """Runs ``await handler(ctx)`` for ``queue``'s jobs, ``concurrency`` at a time, as tasks.

    The same arguments, attributes and rules as ``echomq.Worker`` (a
    handler taking two arguments gets ``(job, cancel_token)``).  A
    CancelledError a handler raises by itself is its job's failure;
    cancelling ``run()`` stops the worker at once (the
    jobs held are given back, every task it made ends) and then lets the
    cancellation through.  ``stop()`` is a plain function (a handler or a
    signal handler can call it, from any thread): it stops claiming and
    starts the grace period; ``await run()``, or leave ``async with
    worker:``, to wait for the end.  ``isolation="process"`` runs each
    slot's handler (importable by name) in a child process, in a loop of
    its own there, killed at its timeout's abandon (``echomq.isolation``).
    """

    _client_type = Client
    _push_cancels = True  # subscribe to <base>cancel (tests switch it off: then only checkpoints deliver)

    def _check_isolation(self, isolation: str, handler: object) -> None:
        if isolation == "process":
            check_isolated_handler(handler)

    def _check_handler(self, handler: object) -> None:
        call = getattr(handler, "__call__", None)  # noqa: B004 (a callable object's own method)
        if not (inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)):
            raise TypeError(
                "handler must be a coroutine function (async def); run a plain one with echomq.Worker"
            )

    def _init_driver(self) -> None:
        self._started = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._wake: asyncio.Event | None = None  # the supervisor looks again
        self._stopping: asyncio.Event | None = None  # idle tasks look again
        self._forced_event: asyncio.Event | None = None
        self._force_pending = False
        self._loops: list[asyncio.Task[None]] = []
        self._handlers: dict[HeldJob, asyncio.Task[Any]] = {}  # the task running each handler
        self._keepers = Keepers()  # one task keeps every held job's lease
        self._listener: CancelListener | None = None  # pushed cancels (<base>cancel)
        self._coalescer = Coalescer(self.client)  # jobs' ends go out together
        self._complete_claim = True  # EMQ.COMPLETECLAIM: a runner's COMPLETE claims its next job
        # claimed (job, when, whether before any stop), for the runners
        self._jobs: asyncio.Queue[tuple[Job, float, bool] | None] | None = None
        self._free = 0  # runners neither running a job nor about to
        self._slot: asyncio.Event | None = None  # set when a runner becomes free
        # Jobs a claim answered that no runner has taken yet (by token): given back if the worker ends first.
        self._unowned: dict[str, tuple[Job, float]] = {}
        self._waiting: dict[str, LeaseKeeper] = {}  # prefetch: the keepers of jobs waiting for a runner
        self._claim_step = ClaimStep()  # the claimer's; asked again at the end if its answer was lost
        self._doubts: set[ClaimStep] = set()  # runners' claims (COMPLETECLAIM) sent, answers not yet read
        self._settling: set[asyncio.Task[Any]] = set()  # give-backs of answers whose callers were cancelled
        self._claim_attempt: asyncio.Future[Any] | None = None  # the claimer's try, cut by a stop
        self._sweeps: asyncio.Task[None] | None = None  # reap=True: the worker's own sweeps
        self._ticks: asyncio.Task[None] | None = None  # reap=True: its queue's schedule ticks
        self._reserved = 0
        self._soon: list[HeldJob] = []  # jobs to give back in the next batch (``_give_back_soon``)
        self._soon_task: asyncio.Task[None] | None = None
        self._ending: set[asyncio.Task[Any]] = set()  # runners sending their job's end
        self._supervised = False  # the supervisor has ended: the worker settles (``_signal``)
        self._pool: ProcessPool | None = None  # isolation="process": the handlers' children

    # -- control ---------------------------------------------------------------

    async def run(self, *, handle_signals: bool = True) -> None:
        """Work with ``concurrency`` tasks until ``stop()``, SIGINT or SIGTERM (see ``echomq.Worker.run``)."""
        await self._run(handle_signals)
        if self._interrupt is not None:
            raise self._interrupt

    def start(self) -> Worker:
        """Work in a task of the running loop; returns at once."""
        self._task = asyncio.create_task(self._run(False), name=f"echomq-worker-{self.queue}")
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stop claiming now; handlers get ``grace`` seconds (default: the worker's), then "shutdown".

        Only asks: ``await run()`` or leaving ``async with`` waits.  Safe
        from any thread; before ``run()``, the worker never starts.
        """
        self._request_stop(time.monotonic(), grace)
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if threading.get_ident() == self._loop_thread:
            self._poke()
        else:
            loop.call_soon_threadsafe(self._poke)

    async def __aenter__(self) -> Worker:
        return self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
        task = self._task
        if task is None:
            return
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if not task.done():  # we were cancelled while waiting: so is the worker, at once
                task.cancel()
                await asyncio.wait([task])
            raise

    def _paced(self, cuttable: bool) -> bool:
        """``cuttable`` for ``IdleWait.after``: a partitioned worker's claims carry no BLOCK (it waits
        for wakes between them), paced between claims as before where its client's are not bounded."""
        return cuttable if getattr(self, "partitions", None) is None else self.client._bounded()

    def _poke(self) -> None:
        for event in (self._wake, self._stopping, self._slot):
            if event is not None:
                event.set()
        attempt = self._claim_attempt
        if self._stop_requested and attempt is not None and not attempt.done():
            attempt.cancel()  # the waiting claim: a dropped connection claims nothing; _settle asks again
        if self._stop_requested and self._sweeps is not None:
            self._sweeps.cancel()  # a sweep in flight: what it took is taken
        if self._stop_requested and self._ticks is not None:
            self._ticks.cancel()  # a drive in flight: a transaction executed fired its ticks once

    async def _run(self, handle_signals: bool) -> None:
        if self._started:
            raise RuntimeError("this worker has already run; make a new one")
        if self.replica_wait is not None:  # a server that can wait as asked, before anything is claimed
            await self.client._check_wait(self.replica_wait)
        self._started = True
        if self._stop_requested:  # stop() came first: never start
            return
        _partitions.hook_worker(self)  # a partitioned queue: claims and sweeps rotate over it
        if self.isolation == "process":  # the children start (and import) before anything is claimed
            pool = self._process_pool()
            try:
                await asyncio.to_thread(pool.prestart, self.concurrency)
            except BaseException:
                await self._close_pool()
                raise
        loop = self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake, self._stopping, self._forced_event = asyncio.Event(), asyncio.Event(), asyncio.Event()
        WATCH.retain()
        self._reserved = self.concurrency + OWN_LOOPS + STOP_LANE
        self.client._reserve(self._reserved, STOP_LANE)
        restore = self._install_signals(loop) if handle_signals else None
        try:
            self._jobs, self._slot = asyncio.Queue(), asyncio.Event()
            self._free = self.concurrency + self.prefetch
            self._loops = [
                asyncio.create_task(self._runner(), name=f"echomq-worker-{self.queue}-{n}")
                for n in range(self.concurrency)
            ]
            claimer = asyncio.create_task(self._claim_loop(), name=f"echomq-worker-{self.queue}-claim")
            self._loops.append(claimer)
            ticks: TickDriver | None = None
            if self.reap:  # its own sweeps, and its queue's schedule ticks fired as they come
                self._sweeps = asyncio.create_task(
                    sweep_loop(self, self._stopping), name=f"echomq-worker-{self.queue}-sweep"
                )
                ticks = TickDriver(self, told=self._push_cancels)
                self._ticks = asyncio.create_task(ticks.run(), name=f"echomq-worker-{self.queue}-ticks")
                self._loops += [self._sweeps, self._ticks]
                for task in (self._sweeps, self._ticks):  # the supervisor looks again once it ends
                    task.add_done_callback(self._loop_ended)
            if self._push_cancels:
                self._listener = CancelListener(
                    self.client, self.queue, self._keepers, lambda: len(self._held) > 0,
                    ticks.changed if ticks is not None else None,
                )  # fmt: skip
                self._listener.start()
            try:
                await self._supervise()
            except asyncio.CancelledError:
                # run() itself was cancelled: stop at once, give back what is held,
                # end every task we made, then let the cancellation through.
                await self._force_stop()
                raise
        finally:
            # No supervisor from here: a second signal while the claims settle forces
            # the stop itself (``_signal``), so the signal handlers stay until then (a
            # forced deploy's second SIGTERM went to the handler before run(); it exited 0).
            self._supervised = True
            try:
                left = [t for t in self._loops if not t.done()]
                for t in left:
                    t.cancel()
                if left:
                    await asyncio.wait(left)
                await self._settle()
            finally:
                if restore is not None:
                    restore()
            await self._close_pool()
            await _partitions.stop_worker(self)
            if self._listener is not None:
                await self._listener.close()
            await self._keepers.close()
            self.client._unreserve(self._reserved, STOP_LANE)
            WATCH.release()
            self._stopped()

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        previous: dict[int, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, self._signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # no signals on this loop or platform
                continue
            previous[sig] = handler

        def restore() -> None:
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                if handler is not None:  # asyncio.run()'s own SIGINT handler, for one
                    signal.signal(sig, handler)

        return restore

    def _signal(self, signum: int) -> None:
        if self._on_signal(signum, time.monotonic()):
            self._force_pending = True
            if self._supervised and not self._forced:  # the claims settle: force here
                self._force_late()
        self._poke()

    def _force_late(self) -> None:
        """A second signal after the supervisor ended: the settling is bounded by the force's budget."""
        stuck = self._force()
        if self._forced_event is not None:
            self._forced_event.set()
        if stuck:  # none is a runner's any more (the runners have ended): given back in a task
            floor = time.monotonic() + SETTLE_TRY_S
            task = asyncio.get_running_loop().create_task(
                self._give_back_batch(stuck, floor=floor), name="echomq-give-back"
            )
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _supervise(self) -> None:
        assert self._wake is not None
        while True:
            now = time.monotonic()
            wait = self._shutdown_tick(now)
            if self._force_pending or wait == 0.0:
                await self._force_stop()
                return
            if all(t.done() for t in self._loops):
                return
            if self._stop_requested and self._stopping is not None:
                self._stopping.set()  # idle tasks stop waiting for their next poll
                self._give_back_waiting()
            self._abandon_overdue(now)
            abandon = self._next_abandon(time.monotonic())
            if abandon is not None:
                wait = abandon if wait is None else min(wait, abandon)
            await wait_event(self._wake, wait)
            self._wake.clear()

    def _give_back_waiting(self) -> None:
        """At a stop, the prefetched jobs waiting for a runner are given back now, not after a busy one."""
        if not self._waiting or self._jobs is None:
            return
        keep: list[tuple[Job, float, bool] | None] = []
        waited: list[tuple[Job, float]] = []
        while not self._jobs.empty():
            item = self._jobs.get_nowait()
            if item is not None and item[0].token in self._waiting:
                waited.append((item[0], item[1]))
            else:
                keep.append(item)
        for item in keep:
            self._jobs.put_nowait(item)
        if not waited:
            return
        self._free += len(waited)
        task = asyncio.get_running_loop().create_task(self._give_back_these(waited), name="echomq-give-back")
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    def _abandon_overdue(self, now: float) -> None:
        """Handlers a grace past their timeout: their jobs failed without them, their tasks cancelled.

        A handler that does not let the cancellation through (it catches
        CancelledError, or blocks the loop) keeps its runner until it ends;
        its job's end then sends nothing.
        """
        for held in self._abandon_due(now):
            finish = self._abandon(held)
            self._abandon_handler(held)
            task = asyncio.get_running_loop().create_task(self._finish(finish), name="echomq-timeout-fail")
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)

    def _abandon_handler(self, held: HeldJob) -> None:
        """Cancel the task running ``held``'s handler (the seam for a driver that can stop one for real)."""
        task = self._handlers.get(held)
        if task is not None:
            task.cancel()

    async def _force_stop(self) -> None:
        """Stop at once: cancel the handlers still running, give their jobs back, end every task."""
        stuck = self._force()
        assert self._forced_event is not None
        self._forced_event.set()
        self._poke()
        # The ends already on the wire may hear their answers a little longer
        # (one of them may be a COMPLETECLAIM's, whose jobs are then given back).
        self._coalescer.stretch(self._force_until + SETTLE_TRY_S)
        for held in stuck:
            task = self._handlers.get(held)
            if task is not None:
                task.cancel()
        # One batch of RELEASEs on the stop's own connections, each job until its lease
        # ends or the budget does (``_give_back_batch``), not one try per job; with one
        # real try past the budget (SETTLE_TRY_S), as the thread worker's: a job cut off
        # by the budget stays held by nobody until a sweep counts it a stall.
        floor = time.monotonic() + SETTLE_TRY_S
        give_back = (
            [asyncio.create_task(self._give_back_batch(stuck, floor=floor), name="echomq-give-back")]
            if stuck
            else []
        )
        if give_back:
            await asyncio.wait(give_back, timeout=max(FORCE_BUDGET_S, SETTLE_TRY_S) + FORCE_AFTER_S / 2)
        pending: set[asyncio.Task[None]] = set()
        if self._loops:
            _, pending = await asyncio.wait(self._loops, timeout=FORCE_AFTER_S / 2)
        # Runners sending their job's end: that end has one real try past the budget
        # (``_send_until``); cancelled now, its job would be held by nobody until a sweep.
        ending = [t for t in pending if t in self._ending]
        if ending:
            left = self._force_until + SETTLE_TRY_S - time.monotonic()
            await asyncio.wait(ending, timeout=max(0.0, left) + FORCE_AFTER_S / 2)
            pending = {t for t in pending if not t.done()}
        for t in [*pending, *give_back]:
            if not t.done():
                t.cancel()
        rest = [t for t in [*pending, *give_back] if not t.done()]
        if rest:
            await asyncio.wait(rest)

    # -- the claimer and the runners -------------------------------------------------

    async def _claim_loop(self) -> None:
        """The one claimer: as many jobs in one CLAIM as runners are free, handed to them.

        A busy worker claims in batches (COUNT = its free runners), so a
        claim costs a fraction of a command per job; an idle one waits on
        the server (BLOCK) as before.
        """
        assert self._stopping is not None and self._wake is not None
        assert self._jobs is not None and self._slot is not None
        pause, step, idle = Backoff(), self._claim_step, IdleWait(self.poll_interval, self.lease_ms)
        cuttable, limit_ms = self.client._waits_cut(), self.client._wait_limit_ms()
        try:
            while not self._stop_requested:
                if self._free <= 0:
                    self._slot.clear()
                    await self._slot.wait()
                    continue
                count = self._free
                if step.call is not None and count_of(step.call) != count:
                    step.renew()
                try:
                    jobs, claimed_at = await self._claim(
                        step, count=count, block_ms=idle.block_ms(cuttable, limit_ms), stop_ok=True
                    )
                except _Stopped:
                    return
                except _GaveUp:
                    await wait_event(self._stopping, pause.next_wait(time.monotonic()) or self.poll_interval)
                    continue
                except Exception as exc:  # a bug, not the server: logged once, and the loop goes on
                    self._trouble(exc, "claim")
                    await wait_event(self._stopping, self.poll_interval)
                    continue
                pause = Backoff()
                self._hand(jobs, claimed_at)
                waited = time.monotonic() - claimed_at
                rest = idle.after(len(jobs), waited, self._blocks(), self._paced(cuttable))
                jobs = await self._replicated(jobs, claimed_at)
                if not jobs:  # the claim waited on the server, or polls (see IdleWait)
                    if rest > 0.001:
                        await wait_event(self._stopping, rest)
                    continue
                self._free -= len(jobs)
                landed = not self._stop_requested  # answered before any stop: they run
                for job in jobs:
                    if self.prefetch:
                        self._keep_waiting(job, claimed_at)
                    self._jobs.put_nowait((job, claimed_at, landed))
        finally:
            for _ in range(self.concurrency):  # the runners give back what is queued, then end
                self._jobs.put_nowait(None)
            self._wake.set()

    async def _runner(self) -> None:
        """One of ``concurrency`` tasks: run the jobs the claimer hands over, one at a time."""
        assert self._jobs is not None and self._slot is not None and self._wake is not None
        try:
            # After a forced stop the jobs still queued are left to _settle (one batch back).
            while not self._forced and (item := await self._jobs.get()) is not None:
                # A job's end may bring the next jobs (EMQ.COMPLETECLAIM): this
                # runner runs them before it is free for the claimer again.
                chain: list[tuple[Job, float, bool]] = [item]
                try:
                    while chain:
                        job, claimed_at, landed = chain.pop(0)
                        try:
                            chain += await self._process(job, claimed_at, chain=not chain, landed=landed)
                        except Exception as exc:  # a bug of ours: logged once with its traceback
                            self._trouble(exc, "processing a job", job)
                finally:
                    self._free += 1
                    self._slot.set()
        finally:
            self._wake.set()

    async def work_one(self) -> bool:
        """Claim and process one job; False when the queue had none (see ``echomq.Worker.work_one``)."""
        try:
            jobs, claimed_at = await self._claim(ClaimStep())
        except _GaveUp as exc:
            raise exc.__cause__ or exc from None
        self._hand(jobs, claimed_at)
        jobs = await self._replicated(jobs, claimed_at, loop=False)
        try:
            for job in jobs:
                await self._process(job, claimed_at)
        finally:
            if self._jobs is None:  # work_one() on its own: its child (isolation="process") goes with it
                await self._close_pool()
        return bool(jobs)

    async def _claim(
        self, step: ClaimStep, *, count: int = 1, block_ms: int | None = None, stop_ok: bool = False
    ) -> tuple[list[Job], float]:
        """One claim step (see ``echomq.Worker._claim``: the same REQ until jobs come back).

        With ``stop_ok`` (the claimer), a stop ends the tries (``_Stopped``)
        and cuts the waiting try (``_poke``).
        """
        call, claimed_at = step.next(lambda: self._claim_call(block_ms, count), time.monotonic())
        extra = (block_ms or 0) / 1000
        # A lost reply must be noticed, and the claim sent again, well before the
        # lease it took lapses (then the retry is answered with the job): each
        # attempt waits at most a third of the lease, plus the server-side wait.
        jobs = await self._send_until(
            call, None, "claim", extra_s=extra, on_lost_reply=step.failed, cap_s=self.lease_ms / 3000,
            stop_ok=stop_ok,
        )  # fmt: skip
        step.answered(jobs)
        return jobs, claimed_at

    # -- a job -----------------------------------------------------------------------

    async def _process(
        self, job: Job, claimed_at: float, chain: bool = False, landed: bool = False
    ) -> list[tuple[Job, float, bool]]:
        """Run ``job``'s handler under its lease and send its end.

        With ``chain``, a COMPLETE also claims the next job in the same
        command (EMQ.COMPLETECLAIM); the jobs it brought are returned, for
        this task to run next.  ``landed``: see ``WorkerCore._took``.
        """
        self._unowned.pop(job.token, None)  # this task's from now: run, or given back
        waited = self._waiting.pop(job.token, None)  # prefetched: its lease kept since the claim
        keeper = waited or self._keeper(job, claimed_at)
        held = keeper._held
        context = CURRENT_JOB.set(job)
        try:
            if waited is not None and self._stop_requested:
                landed = False  # a prefetched job that waited for a runner: given back at a stop
            if not self._took(held, landed):  # the claim was in flight when stop() came: give it back unrun
                if waited is not None:
                    await keeper.stop()
                # With the other runners' (a claim of many answered as the stop came), in a task a
                # forced stop does not cancel: cut in this runner, its job was held by nobody.
                await asyncio.shield(self._give_back_soon(held))
                return []
            if waited is not None and held.lost is not None:  # lost while it waited for a runner: not run
                await keeper.stop()
                self._let_go(held)
                finish = self._decide(held, None)  # counted; lapsed by our own reckoning: given back
                if finish.lapsed:
                    await asyncio.shield(self._give_back_soon(held))
                return []
            if self.metrics is not None:
                await self._claimed_metric(job)
            if (
                waited is None
                and held.needs_confirmation(time.monotonic())
                and not await self._confirm(keeper)
            ):
                if self._unconfirmed(held):  # no answer in time: given back; stale: not ours
                    await asyncio.shield(self._give_back_soon(held))
                return []
            if held.given_back:
                # A forced stop gave the job back while this runner got it ready (a
                # wait's metric read, a confirmation): it never starts, nobody would stop it.
                if waited is not None:
                    await keeper.stop()
                self._let_go(held)
                return []
            if waited is None:
                keeper.start()
            # The handler runs in this task (a task of its own would cost a few
            # loop turns per job); a forced stop cancels this task while it is
            # here, and _call_handler tells that cancel from one the handler
            # raised by itself by the job having been given back.
            current = asyncio.current_task()
            assert current is not None
            self._handlers[held] = current
            if self.isolation != "process":  # a child's wait for its start is not the handler's time
                self._time(keeper)
            try:
                error, interrupted, value = await self._call_handler(held, keeper)
            finally:
                self._handlers.pop(held, None)
                await keeper.stop()
            # our own forced stop, or a timeout's abandon, is no request to stop
            interrupted = interrupted and not (held.given_back or held.abandoned)
            self._let_go(held)
            finish = self._decide(held, error, interrupted, value)
            self._teach(finish, error)
            if interrupted:
                assert error is not None
                self._interrupted(error, time.monotonic())
                self._poke()
            chained = chain and finish.action is Action.COMPLETE and self._complete_claim
            self._ending.add(current)  # a forced stop lets this end have its real try (_force_stop)
            try:
                if chained and not self._stop_requested:
                    return await self._complete_and_claim(finish)
                await self._finish(finish)
                return []
            finally:
                self._ending.discard(current)
        finally:
            CURRENT_JOB.reset(context)

    def _time(self, keeper: LeaseKeeper) -> None:
        """The handler starts now: its timeout (``timeout_ms``) runs from here."""
        with keeper._lock:
            timeout_at = self._time_handler(keeper._held, time.monotonic())
        if timeout_at < math.inf:
            WATCH.earlier(timeout_at)
            if self._wake is not None:
                self._wake.set()  # the supervisor looks at its grace's end

    async def _claimed_metric(self, job: Job) -> None:
        """The metrics' claim, with its sampled wait read for at most a third of the lease.

        The read goes through redis-py's own pool, with no socket timeout: on a
        half-open connection it waited for ever, and the claimed job's handler
        never started (until a forced stop gave the job back).  Past the bound
        the claim is counted without its wait.
        """
        metrics = self.metrics
        assert metrics is not None
        bound = min(ATTEMPT_TIMEOUT_S, self.lease_ms / 3000)
        try:
            # Not asyncio.wait_for: before Python 3.12 it drops a cancel of this runner (a forced
            # stop) that comes as the wait ends, and the handler would then run.
            await within(metrics.aclaimed_with_wait(self.client, job), bound)
        except asyncio.TimeoutError:
            metrics.claimed(job, None)

    def _keeper(self, job: Job, claimed_at: float) -> LeaseKeeper:
        lease_ms, interval = self._lease_for(job)
        keeper = LeaseKeeper._for_worker(
            self.client, job, lease_ms, CancelToken(), interval=interval, claimed_at=claimed_at,
            troubles=self._troubles,
        )  # fmt: skip
        if self._jobs is not None:  # run(): the worker's one keeper task (work_one: the job's own)
            keeper._shared = self._keepers
        return keeper

    def _keep_waiting(self, job: Job, claimed_at: float) -> None:
        """``prefetch``: a job claimed ahead of a free runner has its lease kept while it waits.

        Not one answered so late that it must be confirmed first: its runner does that.
        """
        keeper = self._keeper(job, claimed_at)
        if not keeper._held.needs_confirmation(time.monotonic()):
            keeper.start()
            self._waiting[job.token] = keeper

    async def _call_handler(
        self, held: HeldJob, keeper: LeaseKeeper
    ) -> tuple[BaseException | None, bool, object]:
        """Run the handler: (its exception or None, whether that exception stops the worker, its value).

        Nothing escapes: a KeyboardInterrupt or SystemExit raised in a task
        would otherwise tear the event loop down.  A cancel of this task by
        a forced stop (the job was given back first) is consumed here: the
        task goes on to end its loop.
        """
        job, cancel = held.job, held.cancel
        try:
            if self.isolation == "process":
                # The child is killed once the worker fails the job without it (the abandon) or
                # gives it back (a forced stop): both cancel this task, not the thread that waits.
                value = await run_in_child(
                    self._process_pool(), job, cancel, keeper, self._context_style,
                    lambda: held.abandoned or held.given_back, lambda: self._time(keeper),
                )  # fmt: skip
            elif self._context_style:
                value = await cast("Callable[[JobContext], Awaitable[object]]", self.handler)(
                    JobContext(job, cancel, keeper)
                )
            else:
                value = await cast("Callable[[Job, CancelToken], Awaitable[object]]", self.handler)(
                    job, cancel
                )
        except asyncio.CancelledError as exc:
            # Ours only when a forced stop cancelled the task (the job was
            # given back then); else the handler let a cancellation of its
            # own escape: its job's failure.
            if held.given_back or held.abandoned:
                current = asyncio.current_task()
                if current is not None and sys.version_info >= (3, 11):
                    current.uncancel()  # consumed: later timeouts in this task work as usual
                return exc, True, None
            return exc, False, None
        except Exception as exc:
            return exc, False, None
        except (
            BaseException
        ) as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit: its job fails, the worker stops
            return exc, True, None
        return None, False, value

    def _process_pool(self) -> ProcessPool:
        """The handlers' children (``isolation="process"``), made when first needed.

        The child runs the asyncio handler in a loop of its own (``InChild``).
        """
        if self._pool is None:
            handler = InChild(cast("Callable[..., Any]", self.handler))
            self._pool = ProcessPool(
                handler,
                max_jobs_per_child=self.max_jobs_per_child,
                limit_of=getattr(self.handler, "child_limit", None),  # an app's tasks' own limits
            )
        return self._pool

    async def _close_pool(self) -> None:
        """Stop the children: idle ones exit, one still running a given-back job's handler is killed."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.close)

    def _blocks(self) -> bool:
        """Whether the claims wait on the server (the module does; a script cannot)."""
        rendering = self.client._rendering
        return rendering is not None and rendering.name == "module"

    async def _confirm(self, keeper: LeaseKeeper) -> bool:
        """A claim answered late: confirm its lease before the handler runs (``echomq.Worker._confirm``)."""
        backoff = Backoff()
        until = time.monotonic() + self.lease_ms / 1000
        while True:
            backoff.until = self._bounded(until)
            timeout = min(backoff.timeout(time.monotonic()), ATTEMPT_TIMEOUT_S)
            confirmed = await keeper._confirm(timeout, self._coalescer.attempt)
            if confirmed is not None:
                return confirmed
            wait = backoff.next_wait(time.monotonic())
            if wait is None:
                keeper._confirm_gave_up()
                return False
            if self._forced_event is not None and not self._forced:
                await wait_event(self._forced_event, wait)
            else:
                await asyncio.sleep(wait)
