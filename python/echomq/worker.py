"""The worker (threads): claim, run the handler under a lease keeper, complete, fail or give back.

    def handler(ctx: echomq.JobContext) -> None:
        for chunk in chunks(ctx.payload):
            process(chunk)
            ctx.checkpoint()        # extends the lease; raises Cancelled if the job was cancelled

    worker = echomq.Worker(client, "mail", handler, lease_ms=30_000, concurrency=4)
    worker.run()            # until SIGINT/SIGTERM or stop(); or start() ... stop(), or `with worker:`

``concurrency`` threads each claim and run one job at a time; ``run()``'s own
thread supervises them: it turns signals into a shutdown, times the grace
period, and gives jobs back.  A job whose lease was lost is never completed
or failed by this worker: it belongs to whoever holds it now.  What to do
when a handler ends, how a shutdown proceeds, and the stats are
``_runtime.WorkerCore``'s; this file only runs threads and sends commands.

Two rules hold on every path out of a thread's loop, a second signal's
included: a job a claim answered is run or given back (``_settle``: the
jobs a job's end brought, and the jobs a claim whose answer was lost may
have taken, asked again by its REQ); and every command is bounded, by its
job's lease and by the stop (``WorkerCore._bounded``).  Idle threads take
turns at one waiting claim (``_ClaimGate``), so they never hold the
connections the running jobs' ends and checkpoints need.
"""

from __future__ import annotations

import collections
import inspect
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from types import FrameType, TracebackType
from typing import TypeVar, cast

from ._finisher import Finisher, _GaveUp, _Stopped
from ._log import CURRENT_JOB
from ._pushes import CancelListener
from ._runtime import (
    ATTEMPT_TIMEOUT_S,
    Action,
    Backoff,
    ClaimStep,
    Finish,
    WorkerStats,
    error_text,
)
from ._watch import WATCH
from .cancel import CancelToken
from .client import Client, Cutter, Job
from .context import JobContext
from .errors import NotReplicated
from .lease import LeaseKeeper, SharedKeeper

__all__ = ["Handler", "JobContext", "Worker", "WorkerStats", "error_text"]

T = TypeVar("T")

Handler = Callable[[JobContext], object] | Callable[[Job, CancelToken], object]

# How often the supervising thread looks at signals, the grace and its threads.
TICK_S = 0.05
# Connections a worker needs besides one per slot: its keeper's batch, a
# pushed cancel's checkpoint, the supervisor's give-backs.
OWN_LOOPS = 3


class _ClaimGate:
    """One waiting claim per worker: idle threads take turns at it instead of each waiting on the server.

    A waiting claim holds a connection for up to a second; a hundred idle
    threads would hold a hundred, and the running jobs' ends and
    checkpoints would find none.  A thread whose turn comes claims (and is
    answered at once while jobs are there), then lets the next one go.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._taken = False

    def enter(self, stopping: Callable[[], bool]) -> bool:
        """Wait for the turn; False when the worker stops first (``wake_all``).

        No timed polling: a hundred idle threads sleep until the turn passes.
        """
        with self._cond:
            while self._taken and not stopping():
                self._cond.wait()
            if stopping():
                return False
            self._taken = True
            return True

    def leave(self) -> None:
        with self._cond:
            self._taken = False
            self._cond.notify()

    def wake_all(self) -> None:
        with self._cond:
            self._cond.notify_all()


class Worker(Finisher[Handler]):
    """Runs ``handler`` for the jobs of ``queue``, ``concurrency`` at a time, in threads.

    ``Worker(client, queue, handler, *, lease_ms=30_000, max_attempts=3,
    concurrency=1, poll_interval=0.2, extend_interval=None, grace=10.0,
    retry=None, metrics=None, replicas=0, replicas_timeout_ms=1000,
    replicas_aof=False)``:

    - ``handler(ctx)`` gets a ``JobContext`` (the job, its cancel token,
      ``checkpoint()``); a handler taking two arguments gets ``(job,
      cancel_token)`` as before.  It returns: the job is completed.  It
      raises: the job goes back to pending until it has been claimed
      ``max_attempts`` times, then to the dead set (``last_error`` is
      ``"<ExceptionType>: <message>"``).  It raises a BaseException that is
      not an Exception (SystemExit, KeyboardInterrupt): the job is given
      back without using an attempt and the worker stops; ``run()`` raises
      it again at the end.
    - ``lease_ms``: each job's lease, checkpointed every ``extend_interval``
      seconds (default: a third of the lease).
    - ``poll_interval``: how often an idle thread looks for work; its claim
      waits on the server (up to a second of it), so a job enqueued
      meanwhile is claimed at once.
    - ``retry``: an ``echomq.RetryPolicy``: its ``max_attempts``, and a
      failed job is claimable again only after its ``delay_ms(attempt)``.
    - ``grace``: on ``stop()`` or a signal, how long running handlers may
      take to finish before their tokens are cancelled with "shutdown".
    - ``metrics``: an ``echomq.metrics.Metrics`` to count into (claims,
      ends and run times, lost leases, delivered cancels), or None.
    - ``replicas``, ``replicas_timeout_ms``, ``replicas_aof``: a handler
      starts only once that many replicas have the job's claim (as
      ``Client.claim(replicas=...)``); a job they do not confirm in time is
      given back unrun (no try used), counted in ``stats.not_replicated``,
      and the thread waits ``poll_interval`` before it claims again.
      Fewer re-runs after a failover; still at least once.
    - ``stats``: a ``WorkerStats``.

    Every argument is checked here: TypeError or ValueError naming it.  A
    worker runs once (``run()`` or ``start()``); make a new one to run again.
    """

    _client_type = Client
    _push_cancels = True  # subscribe to <base>cancel (tests switch it off: then only checkpoints deliver)

    def _check_handler(self, handler: object) -> None:
        call = getattr(handler, "__call__", None)  # noqa: B004 (a callable object's own method)
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call):
            raise TypeError("handler is a coroutine function: run it with echomq.asyncio.Worker")

    def _init_driver(self) -> None:
        self._lock = threading.Lock()  # the core's state is shared by the threads
        self._wake = threading.Event()  # set when stopping: idle and backing-off threads look again
        self._forced_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._handling: set[threading.Thread] = set()  # threads in a handler now (a forced stop leaves them)
        self._supervisor: threading.Thread | None = None
        self._supervisor_ident: int | None = None
        self._started = False
        self._done = threading.Event()
        self._signals: collections.deque[int] = collections.deque()
        self._keepers = SharedKeeper(f"echomq-worker-{self.queue}-leases")  # one thread keeps every lease
        self._gate = _ClaimGate()
        self._claim_cutter = Cutter()  # stop() cuts the waiting claim (one at a time: _ClaimGate)
        self._complete_claim = True  # EMQ.COMPLETECLAIM: complete and claim the next in one command
        self._listener: CancelListener | None = None  # pushed cancels (<base>cancel)
        self._reserved = 0

    # -- control ---------------------------------------------------------------

    def run(self, *, handle_signals: bool = True) -> None:
        """Work until ``stop()``, SIGINT or SIGTERM; returns when every thread has stopped.

        ``concurrency`` threads work; this one supervises.  With
        ``handle_signals`` (and in the main thread) SIGINT and SIGTERM
        stop the worker gracefully (see ``stop()``), and a second one stops
        it at once: the jobs still held are given back and ``run()`` raises
        KeyboardInterrupt (SIGINT) or SystemExit(128 + signal) without
        waiting for handlers that did not stop.  The previous signal
        handlers are put back when it returns.  Without them, a
        KeyboardInterrupt here is a graceful stop (a second one, a forced
        one) and is raised again at the end.
        """
        self._check_replicas()
        if not self._begin():
            return
        restore = self._install_signals() if handle_signals else None
        self._supervisor_ident = threading.get_ident()
        try:
            self._spawn_loops()
            self._supervise()
        finally:
            if restore is not None:
                restore()
            self._done.set()
        if self._interrupt is not None:
            raise self._interrupt

    def start(self) -> Worker:
        """Work in background threads; returns at once (``stop()`` or leaving ``with`` ends it)."""
        self._check_replicas()
        if self._begin():
            self._spawn_loops()
            self._supervisor = threading.Thread(
                target=self._supervise_in_background,
                name=f"echomq-worker-{self.queue}-supervisor",
                daemon=True,
            )
            self._supervisor.start()
        return self

    def _check_replicas(self) -> None:
        """With ``replicas=``: a server that can wait as asked (WAITAOF), before anything is claimed."""
        if self.replica_wait is not None:
            self.client._check_wait(self.replica_wait)

    def _replicated(self, jobs: list[Job], claimed_at: float, *, loop: bool = True) -> list[Job]:
        """With ``replicas=``: the claimed jobs once the replicas have them; none if they were given back.

        In a claim loop the thread then pauses ``poll_interval``; for ``work_one`` (``loop=False``)
        ``NotReplicated`` is raised to its caller.
        """
        if self.replica_wait is None or not jobs:
            return jobs
        try:
            return self.client._wait_for_replicas(jobs, self.lease_ms, self.replica_wait)
        except Exception as exc:
            if not isinstance(exc, NotReplicated):  # a bug, not the replicas: logged, the jobs given back
                self._trouble(exc, "waiting for replicas")
                for job in jobs:
                    self._give_back_unrun(job, claimed_at)
                return []
            self._not_replicated(exc)
            if not loop:
                raise
            self._wake.wait(self.poll_interval)
            return []

    def stop(self, grace: float | None = None) -> None:
        """Stop claiming now; handlers get ``grace`` seconds (default: the worker's) to finish.

        Then their tokens are cancelled with "shutdown"; a job whose handler
        then raises, or is still held at the end, is given back (RELEASE: no
        attempt used); a handler that returns completes its job.  Waits
        until the worker has stopped, except when called from a handler or
        from ``run()``'s own thread (a signal handler): there it only asks.
        Called before ``run()`` or ``start()``, the worker never starts.
        """
        with self._lock:
            self._request_stop(time.monotonic(), grace)
        self._wake.set()
        self._gate.wake_all()
        self._claim_cutter.cut()
        me = threading.get_ident()
        if not self._started or me == self._supervisor_ident or threading.current_thread() in self._threads:
            return
        self._done.wait()

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _begin(self) -> bool:
        with self._lock:
            if self._started:
                raise RuntimeError("this worker has already run; make a new one")
            self._started = True
            if self._stop_requested:  # stop() came first: never start
                self._done.set()
                return False
        return True

    def _spawn_loops(self) -> None:
        WATCH.retain()  # one deadline-watch thread for all this worker's jobs
        self._reserved = self.concurrency + OWN_LOOPS
        self.client._reserve(self._reserved)
        if self._push_cancels:
            holding: Callable[[], bool] = lambda: len(self._held) > 0  # noqa: E731 (the listener pings only then)
            self._listener = CancelListener(self.client, self.queue, self._keepers, holding)
            self._listener.ensure()
        self._threads = [
            threading.Thread(target=self._loop, name=f"echomq-worker-{self.queue}-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        for t in self._threads:
            t.start()

    def _install_signals(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # Only a deque append: this runs between two bytecodes of
            # whatever the main thread was doing (the supervisor); it acts
            # on the signal at its next tick.
            self._signals.append(signum)

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    # -- the supervisor --------------------------------------------------------

    def _supervise_in_background(self) -> None:
        self._supervisor_ident = threading.get_ident()
        try:
            self._supervise()
        finally:
            self._done.set()

    def _supervise(self) -> None:
        try:
            while True:
                try:
                    if self._supervise_step():
                        return
                except KeyboardInterrupt as exc:  # Ctrl-C without our SIGINT handler
                    with self._lock:
                        if self._interrupt is None:
                            self._interrupt = exc
                        first = self._request_stop(time.monotonic())
                    self._wake.set()
                    self._gate.wake_all()
                    if not first:
                        self._go_forced()
                        return
        finally:
            self._join_threads()
            self._keepers.close()
            if self._listener is not None:
                self._listener.close()
            self.client._unreserve(self._reserved)
            WATCH.release()
            self._stopped()

    def _join_threads(self) -> None:
        """Wait for the threads; after a forced stop, only for those not in a handler, within the budget.

        Those threads are giving jobs back or settling a claim's answer,
        every command bounded by the force's budget: a job a claim answered
        is released before the process goes, a second signal or not.
        """
        for t in self._threads:
            if not self._forced:
                t.join()
                continue
            with self._lock:
                in_handler = t in self._handling
            if not in_handler:
                t.join(max(0.0, self._force_until - time.monotonic()) + 0.2)

    def _supervise_step(self) -> bool:
        """One look at signals, the grace and the threads; True when the worker is done."""
        force = False
        with self._lock:
            now = time.monotonic()
            while self._signals:
                force = self._on_signal(self._signals.popleft(), now) or force
            stopping = self._stop_requested
            wait = self._shutdown_tick(now)
            if wait == 0.0:
                force = True
            holding = len(self._held) > 0
        if stopping:
            self._wake.set()
            self._gate.wake_all()
        if force:
            self._go_forced()
            return True
        if not any(t.is_alive() for t in self._threads):
            return True
        if holding:
            self._keepers.ensure()  # a keeper thread that could not start (or died) runs again
        if self._listener is not None and not stopping:
            self._listener.ensure()
        time.sleep(TICK_S if wait is None else min(wait, TICK_S))
        return False

    def _go_forced(self) -> None:
        """Stop at once: give back the jobs whose handlers still run, within ``FORCE_BUDGET_S``."""
        with self._lock:
            stuck = self._force()
        self._forced_event.set()
        self._wake.set()
        self._gate.wake_all()
        for held in stuck:
            self._give_back(held, self._force_until)

    # -- a worker thread -------------------------------------------------------

    def _loop(self) -> None:
        pause, step = Backoff(), ClaimStep()
        ready: tuple[list[Job], float] | None = None  # claimed with the last job's end
        try:
            while True:
                if ready is not None:  # run, or given back unrun when stopping (_process)
                    (jobs, claimed_at), ready = ready, None
                    jobs = self._replicated(jobs, claimed_at)
                elif self._stop_requested:
                    return
                else:
                    claimed = self._take_turn(step, pause)
                    if claimed is None:
                        continue
                    pause = Backoff()
                    jobs, claimed_at = claimed
                ready = self._run_jobs(jobs, claimed_at, step)
        finally:
            self._settle(step, ready)

    def _take_turn(self, step: ClaimStep, pause: Backoff) -> tuple[list[Job], float] | None:
        """This thread's turn at the worker's one waiting claim; the jobs it brought, or None."""
        if not self._gate.enter(lambda: self._stop_requested):
            return None
        try:
            try:
                jobs, claimed_at = self._claim(step, settle=True)
            finally:
                self._gate.leave()
        except _Stopped:
            return None
        except _GaveUp:
            self._wake.wait(pause.next_wait(time.monotonic()) or self.poll_interval)
            return None
        except Exception as exc:  # a bug, not the server: logged once, and the loop goes on
            self._trouble(exc, "claim")
            self._wake.wait(self.poll_interval)
            return None
        jobs = self._replicated(jobs, claimed_at)
        if not jobs:  # the claim waited on the server; the rest of poll_interval here
            rest = self.poll_interval - (time.monotonic() - claimed_at)
            if rest > 0.001:
                self._wake.wait(rest)
            return None
        return jobs, claimed_at

    def _run_jobs(
        self, jobs: list[Job], claimed_at: float, step: ClaimStep
    ) -> tuple[list[Job], float] | None:
        """Run (or, stopping, give back) each job; the last one's end claims the next: what it brought."""
        ready = None
        for n, job in enumerate(jobs):
            try:
                finish = self._process(job, claimed_at, defer=True)
                if finish is None:
                    continue
                if n == len(jobs) - 1 and not self._stop_requested and finish.action is not Action.DROP:
                    ready = self._finish_and_claim(finish, step)
                else:
                    self._finish(finish)
            except Exception as exc:  # a bug of ours: logged once with its traceback; the thread goes on
                self._trouble(exc, "processing a job", job)
        return ready

    def work_one(self) -> bool:
        """Claim and process one job in this thread; False when the queue had none.

        With ``replicas=``: ``NotReplicated`` when the replicas did not confirm the claim (given back).
        """
        step = ClaimStep()
        try:
            jobs, claimed_at = self._claim(step, wait=False)
        except _GaveUp as exc:
            raise exc.__cause__ or exc from None
        jobs = self._replicated(jobs, claimed_at, loop=False)
        for job in jobs:
            self._process(job, claimed_at)
        return bool(jobs)

    def _claim(self, step: ClaimStep, wait: bool = True, settle: bool = False) -> tuple[list[Job], float]:
        """One claim step: the jobs of one EMQ.CLAIM, and when (``time.monotonic()``) its REQ was first sent.

        The same call (so the same REQ) is sent again after a lost reply
        until it is answered (or a forced stop), and by the loop's next
        steps until it brings jobs back (``ClaimStep``): a job the server
        handed to a reply we did not get comes back to us, and one answered
        late has its lease confirmed before it runs (``_process``).  With
        ``wait`` the claim waits on the server for a job (``claim_block_ms``).
        With ``settle``, a stop ends the tries at once unless one got no
        answer (``_Stopped``); then the thread's ``_settle`` asks again.
        The waiting claim can be cut by ``stop()`` (``_claim_cutter``): a
        waiting claim whose connection drops claims nothing, and a frozen
        server cannot hold the stop for a whole try.
        The command is ``_claim_call()``'s, shared with the asyncio worker.
        """
        call, claimed_at = step.next(lambda: self._claim_call(wait), time.monotonic())
        extra = self.claim_block_ms / 1000 if wait else 0.0
        cutter = self._claim_cutter if settle else None
        # A lost reply must be noticed, and the claim sent again, well before the
        # lease it took lapses (then the retry is answered with the job): each
        # attempt waits at most a third of the lease, plus the server-side wait.
        jobs = self._send_until(
            partial(self.client._attempt, call, cutter=cutter), None, "claim", extra_s=extra,
            on_lost_reply=step.failed, cap_s=self.lease_ms / 3000, stop_ok=settle,
        )  # fmt: skip
        step.answered(jobs)
        return jobs, claimed_at

    def _process(self, job: Job, claimed_at: float, defer: bool = False) -> Finish | None:
        """Run ``job``'s handler under its lease; send its end, or with ``defer`` return it to send."""
        cancel = CancelToken()
        keeper = LeaseKeeper(
            self.client, job, self.lease_ms, cancel, interval=self.extend_interval, claimed_at=claimed_at
        )
        keeper._troubles = self._troubles
        if self._threads:  # run() or start(): the worker's one keeper thread (work_one: the job's own)
            keeper._shared = self._keepers
        held = keeper._held
        with self._lock:
            run_it = self._took(held)
        context = CURRENT_JOB.set(job)
        try:
            if not run_it:  # the claim was in flight when stop() came: give it back unrun
                self._give_back(held, max(held.confirmed_until, time.monotonic() + ATTEMPT_TIMEOUT_S))
                return None
            if self.metrics is not None:
                self.metrics.claimed_with_wait(self.client, job)
            if held.needs_confirmation(time.monotonic()) and not self._confirm(keeper):
                with self._lock:
                    self._let_go(held)
                    self._decide(held, None)  # lost: counted, nothing sent
                return None
            try:
                keeper.start()
            except BaseException:  # no keeper (a thread that cannot start): not run, given back
                keeper.stop()
                with self._lock:
                    self._let_go(held)
                    held.given_back = True
                self._give_back(held, held.confirmed_until)
                raise
            error, interrupted = self._call_handler(job, cancel, keeper)
            with self._lock:
                self._let_go(held)
                finish = self._decide(held, error, interrupted)
                if interrupted:
                    assert error is not None
                    self._interrupted(error, time.monotonic())
            if interrupted:
                self._wake.set()
                self._gate.wake_all()
            if defer:
                return finish
            self._finish(finish)
            return None
        finally:
            CURRENT_JOB.reset(context)

    def _call_handler(
        self, job: Job, cancel: CancelToken, keeper: LeaseKeeper
    ) -> tuple[BaseException | None, bool]:
        """Run the handler; (its exception or None, whether that exception asks the worker to stop)."""
        me = threading.current_thread()
        with self._lock:
            self._handling.add(me)
        error: BaseException | None = None
        interrupted = False
        try:
            if self._context_style:
                cast("Callable[[JobContext], object]", self.handler)(JobContext(job, cancel, keeper))
            else:
                cast("Callable[[Job, CancelToken], object]", self.handler)(job, cancel)
        except Exception as exc:  # the handler's failure is the job's, not the worker's
            error = exc
        except BaseException as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit: stop the worker
            error, interrupted = exc, True
        finally:
            with self._lock:
                self._handling.discard(me)
            keeper.stop()
        return error, interrupted

    def _confirm(self, keeper: LeaseKeeper) -> bool:
        """A claim answered late: confirm its lease before the handler runs; True when confirmed.

        Tried again after a lost answer (EXTEND takes a job still active with
        its token, its lease lapsed or not: the server decides) within a
        lease and the stop's bound; a stale or gone answer means it is not
        ours; no answer in time, it is not ours to run (``LOST_UNCONFIRMED``).
        """
        backoff = Backoff()
        until = time.monotonic() + self.lease_ms / 1000
        while True:
            backoff.until = self._bounded(until)
            timeout = min(backoff.timeout(time.monotonic()), ATTEMPT_TIMEOUT_S)
            confirmed = keeper._confirm(timeout)
            if confirmed is not None:
                return confirmed
            wait = backoff.next_wait(time.monotonic())
            if wait is None:
                keeper._confirm_gave_up()
                return False
            self._forced_event.wait(wait)
