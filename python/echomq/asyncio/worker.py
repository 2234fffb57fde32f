"""The asyncio worker: one claimer task, ``concurrency`` runner tasks, one keeper task.

The same rules as the thread worker (``_runtime.WorkerCore``): the shutdown,
the retries, what a handler's end does to its job.  Two hold on every path
out, a cancelled ``run()`` included: a job a claim answered is run or given
back (``_unowned``: the jobs claimed and not yet taken by a runner; a claim
whose answer was lost is asked again by its REQ; an answer whose caller was
cancelled goes to ``_orphaned``), and every command is bounded by its job's
lease and by the stop (``WorkerCore._bounded``).
"""

from __future__ import annotations

import asyncio
import inspect
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar, cast

import redis

from .. import _protocol as proto
from .._attempt import NotSent
from .._log import CURRENT_JOB
from .._protocol import Job
from .._runtime import (
    ATTEMPT_TIMEOUT_S,
    FORCE_AFTER_S,
    FORCE_BUDGET_S,
    Action,
    Backoff,
    ClaimStep,
    Finish,
    HeldJob,
    Trouble,
    WorkerCore,
    reply_lost,
    state_refused,
)
from .._watch import WATCH
from ..cancel import CancelToken
from ..errors import JobGone, LeaseLost, NotReplicated
from ._pushes import CancelListener
from ._together import Coalescer, Orphan
from ._waits import wait_event
from .client import Client
from .context import AsyncHandler, JobContext
from .lease import Keepers, LeaseKeeper

__all__ = ["Worker"]

T = TypeVar("T")

# Connections a worker needs besides one per runner: the claimer, the batches
# sent together, the keeper's batch, a pushed cancel's checkpoint.
OWN_LOOPS = 4
# A stopping worker asks a lost claim's answer again with tries of at most this long each.
SETTLE_TRY_S = 1.0


class _GaveUp(Exception):
    """No answer before the deadline (or a forced stop's budget); the cause is the last error."""


class _Refused(Exception):
    """The server refused a command with an error that ends its tries (the cause); nothing was written."""


class _Stopped(Exception):
    """A claim not sent (again): the worker stops; ``_settle`` asks a lost answer again."""


class Worker(WorkerCore[Client, AsyncHandler]):
    """Runs ``await handler(ctx)`` for ``queue``'s jobs, ``concurrency`` at a time, as tasks.

    The same arguments, attributes and rules as ``echomq.Worker`` (a
    handler taking two arguments gets ``(job, cancel_token)``).  A
    CancelledError a handler raises by itself is its job's failure;
    cancelling ``run()`` stops the worker at once (the
    jobs held are given back, every task it made ends) and then lets the
    cancellation through.  ``stop()`` is a plain function (a handler or a
    signal handler can call it, from any thread): it stops claiming and
    starts the grace period; ``await run()``, or leave ``async with
    worker:``, to wait for the end.
    """

    _client_type = Client
    _push_cancels = True  # subscribe to <base>cancel (tests switch it off: then only checkpoints deliver)

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
        self._claim_step = ClaimStep()  # the claimer's; asked again at the end if its answer was lost
        self._doubts: set[ClaimStep] = set()  # runners' claims (COMPLETECLAIM) sent, answers not yet read
        self._settling: set[asyncio.Task[Any]] = set()  # give-backs of answers whose callers were cancelled
        self._claim_attempt: asyncio.Future[Any] | None = None  # the claimer's try, cut by a stop
        self._reserved = 0

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

    def _poke(self) -> None:
        for event in (self._wake, self._stopping, self._slot):
            if event is not None:
                event.set()
        attempt = self._claim_attempt
        if self._stop_requested and attempt is not None and not attempt.done():
            attempt.cancel()  # the waiting claim: a dropped connection claims nothing; _settle asks again

    async def _run(self, handle_signals: bool) -> None:
        if self._started:
            raise RuntimeError("this worker has already run; make a new one")
        if self.replica_wait is not None:  # a server that can wait as asked, before anything is claimed
            await self.client._check_wait(self.replica_wait)
        self._started = True
        if self._stop_requested:  # stop() came first: never start
            return
        loop = self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._wake, self._stopping, self._forced_event = asyncio.Event(), asyncio.Event(), asyncio.Event()
        WATCH.retain()
        self._reserved = self.concurrency + OWN_LOOPS
        self.client._reserve(self._reserved)
        restore = self._install_signals(loop) if handle_signals else None
        try:
            self._jobs, self._slot, self._free = asyncio.Queue(), asyncio.Event(), self.concurrency
            self._loops = [
                asyncio.create_task(self._runner(), name=f"echomq-worker-{self.queue}-{n}")
                for n in range(self.concurrency)
            ]
            claimer = asyncio.create_task(self._claim_loop(), name=f"echomq-worker-{self.queue}-claim")
            self._loops.append(claimer)
            if self._push_cancels:
                self._listener = CancelListener(
                    self.client, self.queue, self._keepers, lambda: len(self._held) > 0
                )
                self._listener.start()
            try:
                await self._supervise()
            except asyncio.CancelledError:
                # run() itself was cancelled: stop at once, give back what is held,
                # end every task we made, then let the cancellation through.
                await self._force_stop()
                raise
        finally:
            if restore is not None:
                restore()
            left = [t for t in self._loops if not t.done()]
            for t in left:
                t.cancel()
            if left:
                await asyncio.wait(left)
            await self._settle()
            if self._listener is not None:
                await self._listener.close()
            await self._keepers.close()
            self.client._unreserve(self._reserved)
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
        self._poke()

    async def _supervise(self) -> None:
        assert self._wake is not None
        while True:
            wait = self._shutdown_tick(time.monotonic())
            if self._force_pending or wait == 0.0:
                await self._force_stop()
                return
            if all(t.done() for t in self._loops):
                return
            if self._stop_requested and self._stopping is not None:
                self._stopping.set()  # idle tasks stop waiting for their next poll
            await wait_event(self._wake, wait)
            self._wake.clear()

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
        give_back = [
            asyncio.create_task(self._give_back(h, self._force_until), name="echomq-give-back") for h in stuck
        ]
        if give_back:
            await asyncio.wait(give_back, timeout=FORCE_BUDGET_S + FORCE_AFTER_S / 2)
        pending: set[asyncio.Task[None]] = set()
        if self._loops:
            _, pending = await asyncio.wait(self._loops, timeout=FORCE_AFTER_S / 2)
        for t in [*pending, *give_back]:
            if not t.done():
                t.cancel()
        rest = [t for t in [*pending, *give_back] if not t.done()]
        if rest:
            await asyncio.wait(rest)

    # -- what a claim answered is run or given back -------------------------------

    def _hand(self, jobs: list[Job], claimed_at: float) -> list[tuple[Job, float]]:
        """Jobs a claim answered: nobody's until a runner takes them (``_process``), then its."""
        for job in jobs:
            self._unowned[job.token] = (job, claimed_at)
        return [(job, claimed_at) for job in jobs]

    def _orphaned(self, jobs: list[Job], claimed_at: float) -> None:
        """A claim's answer whose caller was cancelled: its jobs are given back, in a task of their own."""
        self._hand(jobs, claimed_at)
        task = asyncio.get_running_loop().create_task(self._give_back_unowned(), name="echomq-give-back")
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle(self) -> None:
        """The worker ends: a lost claim answer is asked again, and every job nobody ran is given back.

        Bounded by the jobs' leases and by the stop (after a forced stop or a
        cancelled ``run()``, by its budget).
        """
        await self._coalescer.drain()  # answers whose callers were cancelled reach _orphaned first
        for step in [self._claim_step, *self._doubts]:
            if step.unresolved:
                await self._resolve(step)
        await self._give_back_unowned()
        if self._settling:
            await asyncio.wait(list(self._settling))

    async def _resolve(self, step: ClaimStep) -> None:
        call = step.resolving()
        now = time.monotonic()
        until = max(step.since + self.lease_ms / 1000, now + min(ATTEMPT_TIMEOUT_S, self.lease_ms / 3000))
        # A waiting claim is not waited for when the server cannot be reached at all (ClaimStep.waiting).
        unreachable = (lambda exc: isinstance(exc, NotSent)) if step.waiting else None
        try:
            jobs = await self._send_until(
                call, until, "claim", cap_s=SETTLE_TRY_S, refusal=unreachable, floor=now + SETTLE_TRY_S
            )
        except (_GaveUp, _Refused, LeaseLost) as exc:
            self._unresolved(exc.__cause__ or exc)
            return
        step.answered(jobs)
        step.call = None
        self._hand(jobs, step.since)

    async def _give_back_unowned(self) -> None:
        while self._unowned:
            _, (job, claimed_at) = self._unowned.popitem()
            held = HeldJob.claimed(
                job, CancelToken(), self.lease_ms, claimed_at=claimed_at, interval=self.extend_interval
            )
            held.given_back = True
            self._settled_unrun(job)
            now = time.monotonic()
            await self._give_back(
                held, max(held.confirmed_until, now + SETTLE_TRY_S), floor=now + SETTLE_TRY_S
            )

    # -- the claimer and the runners -------------------------------------------------

    async def _claim_loop(self) -> None:
        """The one claimer: as many jobs in one CLAIM as runners are free, handed to them.

        A busy worker claims in batches (COUNT = its free runners), so a
        claim costs a fraction of a command per job; an idle one waits on
        the server (BLOCK) as before.
        """
        assert self._stopping is not None and self._wake is not None
        assert self._jobs is not None and self._slot is not None
        pause, step = Backoff(), self._claim_step
        try:
            while not self._stop_requested:
                if self._free <= 0:
                    self._slot.clear()
                    await self._slot.wait()
                    continue
                try:
                    jobs, claimed_at = await self._claim(step, count=self._free, stop_ok=True)
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
                jobs = await self._replicated(jobs)
                if not jobs:  # the claim waited on the server; the rest of poll_interval here
                    rest = self.poll_interval - (time.monotonic() - claimed_at)
                    if rest > 0.001:
                        await wait_event(self._stopping, rest)
                    continue
                self._free -= len(jobs)
                landed = not self._stop_requested  # answered before any stop: they run
                for job in jobs:
                    self._jobs.put_nowait((job, claimed_at, landed))
        finally:
            for _ in range(self.concurrency):  # the runners give back what is queued, then end
                self._jobs.put_nowait(None)
            self._wake.set()

    async def _runner(self) -> None:
        """One of ``concurrency`` tasks: run the jobs the claimer hands over, one at a time."""
        assert self._jobs is not None and self._slot is not None and self._wake is not None
        try:
            while (item := await self._jobs.get()) is not None:
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

    async def _replicated(self, jobs: list[Job], *, loop: bool = True) -> list[Job]:
        """With ``replicas=``: the jobs once replicas have them (see ``echomq.Worker._replicated``)."""
        if self.replica_wait is None or not jobs:
            return jobs
        try:
            held = await self.client._wait_for_replicas(jobs, self.lease_ms, self.replica_wait)
        except NotReplicated as exc:
            for job in jobs:  # given back by the client (or left to their leases): not ours any more
                self._unowned.pop(job.token, None)
            self._not_replicated(exc)
            if not loop:
                raise
            assert self._stopping is not None
            await wait_event(self._stopping, self.poll_interval)
            return []
        for job in jobs:
            if job not in held:
                self._unowned.pop(job.token, None)
        return held

    async def work_one(self) -> bool:
        """Claim and process one job; False when the queue had none (see ``echomq.Worker.work_one``)."""
        try:
            jobs, claimed_at = await self._claim(ClaimStep(), wait=False)
        except _GaveUp as exc:
            raise exc.__cause__ or exc from None
        self._hand(jobs, claimed_at)
        jobs = await self._replicated(jobs, loop=False)
        for job in jobs:
            await self._process(job, claimed_at)
        return bool(jobs)

    async def _claim(
        self, step: ClaimStep, wait: bool = True, count: int = 1, stop_ok: bool = False
    ) -> tuple[list[Job], float]:
        """One claim step (see ``echomq.Worker._claim``: the same REQ until jobs come back).

        With ``stop_ok`` (the claimer), a stop ends the tries (``_Stopped``)
        and cuts the waiting try (``_poke``).
        """
        call, claimed_at = step.next(lambda: self._claim_call(wait, count), time.monotonic())
        extra = self.claim_block_ms / 1000 if wait else 0.0
        # A lost reply must be noticed, and the claim sent again, well before the
        # lease it took lapses (then the retry is answered with the job): each
        # attempt waits at most a third of the lease, plus the server-side wait.
        jobs = await self._send_until(
            call, None, "claim", extra_s=extra, on_lost_reply=step.failed, cap_s=self.lease_ms / 3000,
            stop_ok=stop_ok,
        )  # fmt: skip
        step.answered(jobs)
        return jobs, claimed_at

    async def _send_until(
        self,
        call: proto.Call[T],
        until: float | None,
        doing: str,
        job: Job | None = None,
        *,
        extra_s: float = 0.0,
        on_lost_reply: Callable[[], None] | None = None,
        cap_s: float | None = None,
        together: bool = False,
        orphan: Orphan | None = None,
        refusal: Callable[[BaseException], bool] | None = None,
        stop_ok: bool = False,
        floor: float | None = None,
    ) -> T:
        """Send ``call`` until answered, ``until`` passes or a forced stop's budget ends (``_GaveUp``).

        ``together``: in one pipeline with the other calls sent meanwhile
        (``Coalescer``), ``orphan`` taking its answer should this task be
        cancelled while it waits.  ``stop_ok``: the claimer's claim, whose
        waiting try a stop cuts.  ``floor``: tries go on until then even
        after a forced stop's budget (one real try to settle a claim's answer).
        """
        backoff = Backoff()
        while True:
            bound = self._bounded(until)
            backoff.until = bound if floor is None or bound is None else max(bound, floor)
            if stop_ok and self._stop_requested:
                raise _Stopped(doing)
            try:
                timeout = backoff.timeout(time.monotonic())
                timeout = (timeout if cap_s is None else min(timeout, cap_s)) + extra_s
                if together:
                    reply = await self._coalescer.attempt(call, timeout, orphan)
                elif stop_ok:
                    reply = await self._cuttable(self.client._attempt(call, timeout))
                else:
                    reply = await self.client._attempt(call, timeout)
            except LeaseLost:
                raise
            except asyncio.CancelledError:
                if (
                    on_lost_reply is not None and not together
                ):  # a try cut off may have run (an orphan's tells)
                    on_lost_reply()
                raise
            except Exception as exc:
                if on_lost_reply is not None and reply_lost(exc):
                    on_lost_reply()
                if stop_ok and self._stop_requested:  # the stop cut the waiting claim: no trouble
                    raise _Stopped(doing) from exc
                if refusal is not None and not reply_lost(exc) and refusal(exc):
                    raise _Refused(doing) from exc
                kind = self._trouble(exc, doing, job)
                wait = backoff.next_wait(time.monotonic())
                if wait is None or (kind is Trouble.PERMANENT and self._stop_requested):
                    raise _GaveUp(doing) from exc
                if self._forced:
                    await asyncio.sleep(wait)  # within the force's budget (backoff.until)
                elif stop_ok and self._stopping is not None:
                    await wait_event(self._stopping, wait)
                elif self._forced_event is not None:
                    await wait_event(self._forced_event, wait)
                else:
                    await asyncio.sleep(wait)
                continue
            self._healed()
            return reply

    async def _cuttable(self, attempt: Awaitable[T]) -> T:
        """The claimer's try, which a stop may cut (``_poke``): then a lost reply, not a cancelled claimer."""
        future = asyncio.ensure_future(attempt)
        self._claim_attempt = future
        try:
            return await future
        except asyncio.CancelledError:
            if future.cancelled() and self._stop_requested and not _cancelling():
                raise redis.ConnectionError("the waiting claim was cut by the stop") from None
            raise
        finally:
            self._claim_attempt = None
            if not future.done():
                future.cancel()

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
        cancel = CancelToken()
        keeper = LeaseKeeper(
            self.client, job, self.lease_ms, cancel, interval=self.extend_interval, claimed_at=claimed_at
        )
        keeper._troubles = self._troubles
        if self._jobs is not None:  # run(): the worker's one keeper task (work_one: the job's own)
            keeper._shared = self._keepers
        held = keeper._held
        context = CURRENT_JOB.set(job)
        try:
            if not self._took(held, landed):  # the claim was in flight when stop() came: give it back unrun
                await self._give_back(held, max(held.confirmed_until, time.monotonic() + ATTEMPT_TIMEOUT_S))
                return []
            if self.metrics is not None:
                await self.metrics.aclaimed_with_wait(self.client, job)
            if held.needs_confirmation(time.monotonic()) and not await self._confirm(keeper):
                self._let_go(held)
                self._decide(held, None)  # lost: counted, nothing sent
                return []
            keeper.start()
            # The handler runs in this task (a task of its own would cost a few
            # loop turns per job); a forced stop cancels this task while it is
            # here, and _call_handler tells that cancel from one the handler
            # raised by itself by the job having been given back.
            current = asyncio.current_task()
            assert current is not None
            self._handlers[held] = current
            try:
                error, interrupted = await self._call_handler(held, keeper)
            finally:
                self._handlers.pop(held, None)
                await keeper.stop()
            interrupted = interrupted and not held.given_back  # our own forced stop is no request to stop
            self._let_go(held)
            finish = self._decide(held, error, interrupted)
            if interrupted:
                assert error is not None
                self._interrupted(error, time.monotonic())
                self._poke()
            chained = chain and finish.action is Action.COMPLETE and self._complete_claim
            if chained and not self._stop_requested:
                return await self._complete_and_claim(finish)
            await self._finish(finish)
            return []
        finally:
            CURRENT_JOB.reset(context)

    async def _call_handler(self, held: HeldJob, keeper: LeaseKeeper) -> tuple[BaseException | None, bool]:
        """Run the handler; returns (its exception or None, whether that exception asks the worker to stop).

        Nothing escapes: a KeyboardInterrupt or SystemExit raised in a task
        would otherwise tear the event loop down.  A cancel of this task by
        a forced stop (the job was given back first) is consumed here: the
        task goes on to end its loop.
        """
        job, cancel = held.job, held.cancel
        try:
            if self._context_style:
                await cast("Callable[[JobContext], Awaitable[object]]", self.handler)(
                    JobContext(job, cancel, keeper)
                )
            else:
                await cast("Callable[[Job, CancelToken], Awaitable[object]]", self.handler)(job, cancel)
        except asyncio.CancelledError as exc:
            # Ours only when a forced stop cancelled the task (the job was
            # given back then); else the handler let a cancellation of its
            # own escape: its job's failure.
            if held.given_back:
                current = asyncio.current_task()
                if current is not None and sys.version_info >= (3, 11):
                    current.uncancel()  # consumed: later timeouts in this task work as usual
                return exc, True
            return exc, False
        except Exception as exc:
            return exc, False
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit: stop the worker
            return exc, True
        return None, False

    async def _confirm(self, keeper: LeaseKeeper) -> bool:
        """A claim answered late: confirm its lease before the handler runs (``echomq.Worker._confirm``)."""
        backoff = Backoff()
        until = time.monotonic() + self.lease_ms / 1000
        while True:
            backoff.until = self._bounded(until)
            timeout = min(backoff.timeout(time.monotonic()), ATTEMPT_TIMEOUT_S)
            confirmed = await keeper._confirm(timeout)
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

    async def _finish(self, finish: Finish) -> None:
        """Send the job's end, again after connection trouble, until it lands or its lease ends."""
        if finish.action is not Action.DROP:
            await self._send_end(finish, self._end_call(finish), finish.held.confirmed_until, together=True)

    async def _complete_and_claim(self, finish: Finish) -> list[tuple[Job, float, bool]]:
        """COMPLETE the job and claim the next in one command, sent with the others' (``Coalescer``).

        Retry-safe as ``echomq.Worker._finish_and_claim``, and sent again as
        a pair after a lost reply, until the job's lease ends.  Without an
        answer, the claim is asked again by its REQ at once (and by
        ``_settle`` if that gets none either); an answer this task cannot
        read (it was cancelled) goes to ``_orphaned``.
        """
        job = finish.job
        sent = time.monotonic()
        call = proto.complete_claim(job.queue, job.id, job.token, self.lease_ms)
        step = ClaimStep()
        step.adopt(proto.claim(self.queue, self.lease_ms, request_id=proto.request_id_of(call)), sent)
        self._doubts.add(step)  # until its answer is read: _settle asks again if this task is cancelled

        def orphan(outcome: Any) -> None:  # this task was cancelled: the answer is still someone's
            if isinstance(outcome, proto.CompletedAndClaimed):
                step.answered(outcome.jobs)
                step.call = None
                self._landed(finish)
                self._orphaned(outcome.jobs, sent)
            elif isinstance(outcome, BaseException) and reply_lost(outcome):
                step.failed()

        try:
            return await self._completed_and_claimed(finish, call, step, orphan)
        finally:
            if not step.unresolved:
                self._doubts.discard(step)

    async def _completed_and_claimed(
        self, finish: Finish, call: proto.Call[proto.CompletedAndClaimed], step: ClaimStep, orphan: Orphan
    ) -> list[tuple[Job, float, bool]]:
        job, sent = finish.job, step.since
        try:
            both = await self._send_until(
                call, finish.held.confirmed_until, finish.action.value, job, on_lost_reply=step.failed,
                cap_s=self.lease_ms / 3000, together=True, orphan=orphan, refusal=lambda exc: True,
            )  # fmt: skip
        except LeaseLost as exc:  # stale: nothing was written, nothing claimed
            self._refused(finish, exc)
            return []
        except _Refused as refused:  # COMPLETECLAIM refused (past maxmemory, an older module): COMPLETE
            cause = refused.__cause__
            if "unknown command" in str(cause).lower():
                self._complete_claim = False
            elif cause is not None:
                self._trouble(cause, finish.action.value, job)
            await self._finish(finish)
            return await self._ask_again(step)
        except _GaveUp:
            self._unfinished(finish)
            return await self._ask_again(step)
        step.answered(both.jobs)
        step.call = None
        if both.gone:
            self._refused(finish, JobGone("the job row is gone", job.id))
        else:
            self._landed(finish)
        self._hand(both.jobs, sent)
        return [(j, sent, False) for j in await self._replicated(both.jobs)]

    async def _ask_again(self, step: ClaimStep) -> list[tuple[Job, float, bool]]:
        """A COMPLETECLAIM whose claim half got no answer: its REQ, sent again, answers what it took."""
        if not step.unresolved:
            return []
        call = step.resolving()
        try:
            jobs = await self._send_until(
                call, step.since + self.lease_ms / 1000, "claim", on_lost_reply=step.failed,
                cap_s=self.lease_ms / 3000,
            )  # fmt: skip
        except (_GaveUp, LeaseLost):
            return []  # still in doubt: asked once more as the worker ends (_settle)
        step.answered(jobs)
        step.call = None
        self._hand(jobs, step.since)
        return [(j, step.since, False) for j in await self._replicated(jobs)]

    async def _give_back(self, held: HeldJob, until: float, floor: float | None = None) -> None:
        """RELEASE a job this worker will not run (or not finish): no attempt used."""
        job = held.job
        release = proto.release(job.queue, job.id, job.token)
        await self._send_end(Finish(held, Action.RELEASE), release, until, floor=floor)

    async def _send_end(
        self,
        finish: Finish,
        call: proto.Call[Any],
        until: float,
        *,
        together: bool = False,
        floor: float | None = None,
    ) -> None:
        """Send ``call`` (the job's end) until it lands or ``until``; settle the job by how it went.

        A FAIL refused past maxmemory is tried again with the lease kept
        alive by EXTEND, then the job is given back (``_fail_refused``).
        """
        refused_since: float | None = None
        pause = Backoff()
        while True:

            def orphan(outcome: Any, finish: Finish = finish) -> None:  # this task was cancelled: count it
                if not isinstance(outcome, BaseException):
                    self._landed(finish, None if finish.action is Action.COMPLETE else outcome)

            try:
                where = await self._send_until(
                    call, until, finish.action.value, finish.job, together=together, orphan=orphan,
                    refusal=state_refused if finish.action is Action.FAIL else None, floor=floor,
                )  # fmt: skip
            except LeaseLost as exc:
                self._refused(finish, exc)
                return
            except _Refused as refused:
                now = time.monotonic()
                refused_since = now if refused_since is None else refused_since
                finish = self._fail_refused(finish, refused.__cause__ or refused, refused_since, now)
                if finish.action is Action.RELEASE:
                    job = finish.job
                    call = proto.release(job.queue, job.id, job.token)
                    continue
                kept = await self._keep_lease(finish, until)
                if kept is None:
                    return
                until = kept
                wait = pause.next_wait(time.monotonic()) or 0.0
                if self._forced_event is not None:
                    await wait_event(self._forced_event, wait)
                else:
                    await asyncio.sleep(wait)
                continue
            except _GaveUp:
                self._unfinished(finish)
                return
            self._landed(finish, None if finish.action is Action.COMPLETE else where)
            return

    async def _keep_lease(self, finish: Finish, until: float) -> float | None:
        """EXTEND a job whose end cannot land yet; its new deadline, or None once it is settled (lost)."""
        job = finish.job
        call = proto.extend(job.queue, job.id, job.token, self.lease_ms)
        sent = time.monotonic()
        try:
            await self._send_until(call, until, "extend", job)
        except LeaseLost as exc:
            self._refused(finish, exc)
            return None
        except _GaveUp:
            self._unfinished(finish)
            return None
        return sent + self.lease_ms / 1000


def _cancelling() -> bool:
    """Whether the current task is being cancelled (Python 3.11+; before it, not known: False)."""
    task = asyncio.current_task()
    return task is not None and sys.version_info >= (3, 11) and task.cancelling() > 0
