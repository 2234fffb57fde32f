"""How a thread worker's threads take turns: run a ready job, send the pending ends, or wait for work.

The threads share the sending, in turns (``_next_turn``), so that a busy
worker sends a few commands per batch of jobs rather than one per job, and
an idle one one command per wait:

- a thread whose handler ended adds the job's end to the pending ones; if
  no thread is sending, it sends them all in one pipeline with a claim of
  as many jobs as the worker has free slots, riding in the last COMPLETE
  (EMQ.COMPLETECLAIM ... COUNT), until none is pending (``_send_pending``,
  the finisher's turn; the sending itself is ``_finisher.py``'s);
- the jobs claimed wait in ``_ready``, their leases kept by the worker's
  keeper from the claim on, until a thread takes one;
- when nothing is ready, pending or being sent, one idle thread claims for
  every free slot, waiting on the server (``_wait_for_work``): one waiting
  claim per worker, cut by ``stop()``;
- with ``prefetch``, one more thread only sends and claims, so the others
  run what is ready while the ends are on the wire.

A single-thread worker thus sends one EMQ.COMPLETECLAIM per job and hands
nothing from thread to thread.  ``worker.py`` runs the threads and a job.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import TypeVar

from .._runtime import (
    ATTEMPT_TIMEOUT_S,
    Action,
    Backoff,
    ClaimStep,
    Finish,
    HeldJob,
    IdleWait,
    Slots,
    count_of,
)
from ._finisher import SETTLE_TRY_S, Finisher, Sent, _GaveUp, _Stopped
from .client import Job
from .lease import LeaseKeeper

__all__ = ["Turns"]

HandlerT = TypeVar("HandlerT")

# A thread's turns besides running a job (``_next_turn``).
SEND = "send"
WAIT = "wait"


class Turns(Finisher[HandlerT]):
    """The threads' turns of the thread ``Worker`` (see the module docstring)."""

    _threads: list[threading.Thread]
    _abandoned: set[threading.Thread]

    def _init_turns(self) -> None:
        # The threads' turns (_next_turn), under _turns (not _lock: never both at once).
        # The Condition's own lock, taken directly: its __enter__ is a Python call more, a few per job.
        self._turns_lock = threading.Lock()
        self._turns = threading.Condition(self._turns_lock)
        # Threads asleep in _next_turn: a notify with none of them is a Python call and its
        # ownership check for nothing, a few times a job (read and written under _turns_lock).
        self._sleeping = 0
        self._ready: collections.deque[LeaseKeeper] = collections.deque()  # claimed, waiting for a thread
        self._pending: list[Finish] = []  # ends waiting for the finisher's turn
        self._sending = False  # a thread has the finisher's turn
        self._waiting = False  # a thread's claim waits for work
        self._idle_until = 0.0  # no waiting claim before (a scripts backend's poll, a backoff)
        self._slots = Slots(self.concurrency, self.prefetch)
        self._idle = IdleWait(self.poll_interval, self.lease_ms)
        self._pause = Backoff()  # after a claim that got no answer
        self._claim_step = ClaimStep()  # the waiting claim's (asked again as the worker ends if in doubt)
        self._doubts: set[ClaimStep] = set()  # claims sent with ends whose answers were lost

    # -- what the Worker does (worker.py) ------------------------------------------

    def _run(self, keeper: LeaseKeeper) -> None:
        raise NotImplementedError

    def _claim(
        self, step: ClaimStep, *, count: int = 1, block_ms: int | None = None, settle: bool = False
    ) -> tuple[list[Job], float]:
        raise NotImplementedError

    def _adopt(self, job: Job, claimed_at: float, unrun: list[HeldJob] | None = None) -> LeaseKeeper | None:
        raise NotImplementedError

    def _replicated(self, jobs: list[Job], claimed_at: float, *, loop: bool = True) -> list[Job]:
        raise NotImplementedError

    def _wake_threads(self) -> None:
        with self._turns_lock:
            self._turns.notify_all()

    def _loop(self, runs: bool = True) -> None:
        """One of ``concurrency`` threads: run a ready job, send the pending ends, or wait for work.

        ``runs``: False for ``prefetch``'s sender, which never runs a job.
        """
        while True:
            turn = self._next_turn(runs)
            if turn is None:
                return
            try:
                if isinstance(turn, LeaseKeeper):
                    self._run(turn)
                elif turn[0] == SEND:
                    self._send_pending()
                else:
                    self._wait_for_work(turn[1])
            except Exception as exc:  # a bug of ours: logged once with its traceback; the thread goes on
                self._trouble(exc, "a worker thread's turn")
            if self._abandoned and threading.current_thread() in self._abandoned:
                return  # its handler was abandoned: another thread has its place

    def _next_turn(self, runs: bool = True) -> LeaseKeeper | tuple[str, int] | None:
        """This thread's next turn (see the module docstring); None when the worker stops.

        Ready jobs first (at a stop, to give them back), then the pending
        ends; the one waiting claim only when nothing is ready, pending or
        being sent: the finisher claims with its ends.
        """
        with self._turns_lock:
            while True:
                if self._ready and runs:
                    return self._ready.popleft()
                if self._pending and not self._sending:
                    self._sending = True
                    return (SEND, 0)
                if self._stop_requested:
                    return None
                wait: float | None = None
                if not (self._sending or self._waiting or self._pending):
                    wait = self._idle_until - time.monotonic()
                    count = self._slots.free()
                    if wait <= 0 and count > 0:
                        self._waiting = True
                        self._slots.reserve(count)
                        return (WAIT, count)
                    if wait <= 0:
                        wait = None  # every slot taken: a job's end wakes us
                self._sleeping += 1
                try:
                    self._turns.wait(wait)
                finally:
                    self._sleeping -= 1

    def _hand(self, finish: Finish) -> None:
        """A handler ended: its slot is free and its end pending; this thread sends, unless one does.

        With ``prefetch``, a thread that has a ready job to run leaves the
        sending to the sender thread: the round trip overlaps the next run.
        """
        if finish.lapsed:  # tried past its lease, on this thread: not in a batch bounded by others'
            try:
                self._finish(finish)
            finally:  # its slot is free once its give-back is settled, however that ended
                with self._turns_lock:
                    self._slots.ended()
                    if self._sleeping:
                        self._turns.notify()
            return
        with self._turns_lock:
            self._slots.ended()
            if finish.action is Action.DROP:
                if self._sleeping:
                    self._turns.notify()
                return
            self._pending.append(finish)
            if self._sending:
                return
            if self.prefetch and self._ready and not self._waiting:  # (a waiting claim would hold them)
                self._turns.notify_all()
                return
            self._sending = True
        self._send_pending()

    def _send_pending(self) -> None:
        """The finisher's turn: the pending ends, with a claim for the free slots, until none is pending.

        What the fast path could not settle (``Sent.slow``, ``Sent.doubt``)
        is done after the turn is handed over: the next ends do not wait
        for an outage's retries.
        """
        left: list[Sent] = []
        try:
            while True:
                with self._turns_lock:
                    batch, self._pending = self._pending, []
                    count = 0 if self._stop_requested or not batch else self._slots.free()
                    self._slots.reserve(count)
                if not batch:
                    return
                try:
                    sent = self._send_batch(batch, count)
                finally:
                    with self._turns_lock:
                        self._slots.answered(count, 0)
                if sent.jobs:
                    self._take(sent.jobs, sent.claimed_at)
                if sent.slow or sent.doubt is not None:
                    left.append(sent)
                    return
        finally:
            with self._turns_lock:
                self._sending = False
                # The next turn is one thread's (to send what came meanwhile, or the idle claim);
                # this one looks for its own next turn itself.
                if self._sleeping:
                    self._turns.notify(2)
            for sent in left:
                if sent.doubt is not None and (jobs := self._ask_again(sent.doubt)):
                    self._take(jobs, sent.doubt.since)
                for finish in sent.slow:
                    self._finish(finish)

    def _wait_for_work(self, count: int) -> None:
        """The worker's one waiting claim, for ``count`` jobs (one per free slot)."""
        step = self._claim_step
        if step.call is not None and count_of(step.call) != count:
            step.renew()
        cuttable = self.client._waits_cut()
        jobs: list[Job] = []
        claimed_at = time.monotonic()
        pause = self.poll_interval
        try:
            block_ms = self._idle.block_ms(cuttable, self.client._wait_limit_ms())
            jobs, claimed_at = self._claim(step, count=count, block_ms=block_ms, settle=True)
        except _Stopped:
            pause = 0.0
        except _GaveUp:
            pause = self._pause.next_wait(time.monotonic()) or self.poll_interval
        except Exception as exc:  # a bug, not the server: logged once, and the claims go on
            self._trouble(exc, "claim")
        else:
            self._pause = Backoff()
            if getattr(self, "partitions", None) is not None:  # no BLOCK: paced as before (asyncio's _paced)
                cuttable = self.client._bounded()
            pause = self._idle.after(len(jobs), time.monotonic() - claimed_at, self._blocks(), cuttable)
        finally:
            with self._turns_lock:
                self._waiting = False
                self._slots.answered(count, 0)
                self._idle_until = time.monotonic() + pause
                self._turns.notify_all()
        if jobs:
            self._take(jobs, claimed_at)

    def _blocks(self) -> bool:
        """Whether the claims wait on the server (the module does; a script cannot)."""
        rendering = self.client._rendering
        return rendering is not None and rendering.name == "module"

    def _take(self, jobs: list[Job], claimed_at: float) -> None:
        """Jobs a claim brought: each gets its lease keeper now, and waits in ``_ready`` for a thread.

        Counted in their slots from here until their handlers end.  A job
        the worker will not run (it stops, the replicas did not confirm it,
        its late claim could not be confirmed) is given back or dropped here.
        """
        with self._turns_lock:
            self._slots.answered(0, len(jobs))
        kept = self._replicated(jobs, claimed_at)
        unrun: list[HeldJob] = []  # the worker stops: given back together, in one round trip
        keepers = [keeper for job in kept if (keeper := self._adopt(job, claimed_at, unrun)) is not None]
        with self._turns_lock:
            self._slots.ended(len(jobs) - len(keepers))
            self._ready.extend(keepers)
            # A thread per job (and prefetch's sender, which takes none): waking every thread for
            # each claim's answer cost a quarter of a busy worker's time in waking threads that
            # found nothing to do.  Whatever else changes notifies for itself.
            if self._sleeping:
                self._turns.notify(len(keepers) + (1 if self.prefetch else 0))
        if unrun:
            now = time.monotonic()
            until = max(max(held.confirmed_until for held in unrun), now + ATTEMPT_TIMEOUT_S)
            self._give_back_all(unrun, until, floor=now + SETTLE_TRY_S)

    def _give_back_ready(self) -> None:
        """At a stop, the jobs waiting for a thread are given back, by a thread of their own.

        Idle threads would give them back too; busy ones could not before
        their handlers end (a ``prefetch``'s jobs).
        """
        with self._turns_lock:
            if not self._ready:
                return
            waiting = list(self._ready)
            self._ready.clear()

        def give_back() -> None:
            self._give_back_waiting(waiting)

        thread = threading.Thread(
            target=give_back,
            name=f"echomq-worker-{self.queue}-give-back",
            daemon=True,
        )
        self._threads.append(thread)
        thread.start()

    def _give_back_waiting(self, keepers: list[LeaseKeeper]) -> None:
        """Jobs that waited for a thread as the worker stopped: given back unrun, together.

        One round trip for all of them (``_give_back_all``), not one per job
        in turn: a claim's hundred jobs are back before their leases lapse.
        """
        unrun: list[HeldJob] = []
        for keeper in keepers:
            held = keeper._held
            keeper.stop()
            with self._lock:
                self._let_go(held)
                if held.lost is not None and not held.given_back:  # lost while it waited
                    self._count_lost(held)
                give_back = not held.given_back and held.maybe_ours  # lapsed by our reckoning: still ours
                held.given_back = held.given_back or give_back
                if not give_back and held.lost is not None:
                    self._decide(held, None)  # stale or gone: nothing sent
            if give_back:
                self._settled_unrun(held.job)
                unrun.append(held)
        with self._turns_lock:
            self._slots.ended(len(keepers))
            self._turns.notify_all()
        if unrun:
            now = time.monotonic()
            until = max(max(held.confirmed_until for held in unrun), now + ATTEMPT_TIMEOUT_S)
            self._give_back_all(unrun, until, floor=now + SETTLE_TRY_S)

    def _settle(self) -> None:
        """The threads have ended: what a claim answered and nobody ran is given back.

        The jobs still waiting for a thread (a thread that died, a forced
        stop), and those the claims in doubt took (their REQs, asked again).
        """
        with self._turns_lock:
            waiting = list(self._ready)
            self._ready.clear()
            pending, self._pending = self._pending, []
        if waiting:
            self._give_back_waiting(waiting)
        for finish in pending:  # no thread was left to send them (abandoned handlers')
            self._finish(finish)
        with self._lock:
            doubts = [self._claim_step, *self._doubts]
            self._doubts.clear()
        for step in doubts:
            if jobs := self._resolve(step):
                self._give_back_unrun(jobs, step.since)
