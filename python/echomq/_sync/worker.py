"""The worker (threads): claim, run the handler under a lease keeper, complete, fail or give back.

    def handler(ctx: echomq.JobContext) -> None:
        for chunk in chunks(ctx.payload):
            process(chunk)
            ctx.checkpoint()        # extends the lease; raises Cancelled if the job was cancelled

    worker = echomq.Worker(client, "mail", handler, lease_ms=30_000, concurrency=4)
    worker.run()            # until SIGINT/SIGTERM or stop(); or start() ... stop(), or `with worker:`

``concurrency`` threads run one job at a time each; ``run()``'s own thread
supervises them: it turns signals into a shutdown, times the grace period,
and gives jobs back.  A job whose lease was lost is never completed or
failed by this worker: it belongs to whoever holds it now.  What to do when
a handler ends, how a shutdown proceeds, and the stats are
``_runtime.WorkerCore``'s; this file only runs threads and sends commands.

The threads take turns at the sending and the claiming (``_turns.py``): a
busy worker sends a few commands per batch of jobs, a single-thread one
one EMQ.COMPLETECLAIM per job, an idle one one waiting claim per wait.
Two rules hold on every path out, a second signal's included: a job a
claim answered is run or given back (the jobs waiting for a thread at a
stop, and those a claim whose answer was lost may have taken, asked again
by its REQ: ``_settle``); and every command is bounded, by its job's lease
and by the stop (``WorkerCore._bounded``).  A handler past its timeout and
its grace is abandoned (``_abandon_overdue``): Python cannot stop its
thread, which runs on, and another takes its place.

Hand-written beside its twin ``asyncio/worker.py``, not generated from it
(``tests/unasync.py``): threads that take turns (``_turns.py``) and a supervising
``run()`` thread, where asyncio has a claimer, runner tasks and a keeper in one loop.
"""

from __future__ import annotations

import collections
import inspect
import math
import signal
import threading
import time
from collections.abc import Callable
from functools import partial
from types import FrameType, TracebackType
from typing import TypeVar, cast

from .._log import CURRENT_JOB
from .._runtime import (
    ATTEMPT_TIMEOUT_S,
    Backoff,
    ClaimStep,
    Finish,
    HeldJob,
    WorkerStats,
    error_text,
)
from .._watch import WATCH
from ..cancel import CancelToken
from ..errors import NotReplicated
from ..isolation import ProcessPool, check_isolated_handler
from . import _partitions
from ._attempt import Cutter
from ._finisher import SETTLE_TRY_S, _GaveUp
from ._pushes import CancelListener
from ._sweeper import Sweeper
from ._ticks import TickDriver
from ._turns import Turns
from .client import Client, Job
from .context import JobContext
from .lease import LeaseKeeper, SharedKeeper

__all__ = ["Handler", "JobContext", "Worker", "WorkerStats", "error_text"]

T = TypeVar("T")

Handler = Callable[[JobContext], object] | Callable[[Job, CancelToken], object]

# How often the supervising thread looks at signals, the grace and its threads.
TICK_S = 0.05
# Connections a worker needs besides one per slot: its keeper's batch, a
# pushed cancel's checkpoint, the supervisor's give-backs, the waiting claim,
# its sweeps.
OWN_LOOPS = 5


class Worker(Turns[Handler]):
    """Runs ``handler`` for the jobs of ``queue``, ``concurrency`` at a time, in threads.

    ``Worker(client, queue, handler, *, lease_ms=30_000, max_attempts=3,
    concurrency=1, prefetch=0, poll_interval=0.2, extend_interval=None,
    grace=10.0, retry=None, metrics=None, replicas=0,
    replicas_timeout_ms=1000, replicas_aof=False, reap=True,
    reap_interval=10.0, max_stalled=3, timeout_ms=None, timeout_grace=5.0)``:

    - ``handler(ctx)`` gets a ``JobContext`` (the job, its cancel token,
      ``checkpoint()``); a handler taking two arguments gets ``(job,
      cancel_token)`` as before.  It returns: the job is completed.  It
      raises: the job goes back to pending until it has been claimed
      ``max_attempts`` times, then to the dead set (``last_error`` is
      ``"<ExceptionType>: <message>"``, ``traceback`` its traceback, and
      the worker logs both at ERROR); ``echomq.NonRetryable``: to the dead
      set at once; ``echomq.RetryLater(delay_ms=...)``: claimable again
      then.  It raises SystemExit or KeyboardInterrupt itself: its job
      fails the same way (a try used: a job that kills its workers ends
      dead after its tries) and the worker stops; ``run()`` raises it
      again at the end.  It returns a ``StoredResult`` (bytes; the task
      layer's): stored as the job's result, with its completion.
    - ``lease_ms``: each job's lease, checkpointed every ``extend_interval``
      seconds (default: a third of the lease).
    - ``concurrency``: threads running a job each; ``prefetch``: jobs
      claimed beyond the free threads, their leases kept while they wait
      (off by default: it costs fairness, and a crash leaves them held
      until their leases lapse; see the worker guide).
    - ``poll_interval``: where a claim cannot wait on the server (the
      scripts backend), how often an idle worker claims (it backs off to
      3 s while the queue stays empty).  Elsewhere one claim for the whole
      worker waits on the server, 5 s a command (4 s on Redis Cluster,
      within redis-py's socket timeout), and a job enqueued meanwhile is
      claimed at once.
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
    - ``reap``: sweep the queue now and then (every ``reap_interval``
      seconds on average, jittered; small bounded sweeps): the jobs of
      workers that died come back, dead-lettered at ``max_stalled`` stalls,
      and the dead retention is applied.  A ``Reaper`` stays optional.
    - ``timeout_ms``: a handler running longer has its token cancelled with
      "timeout"; ``timeout_grace`` seconds later it is abandoned and its job
      failed with a timeout error (a try used).  Python cannot stop a
      thread: an abandoned handler's thread runs on, another takes its place.
    - ``stats``: a ``WorkerStats``.
    - A queue declared partitioned (``Client.declare_queue``): the worker
      claims across its partitions in turn and sweeps them in turn; idle, it
      waits for the producers' wakes (docs/concepts/partitions.md).

    Every argument is checked here: TypeError or ValueError naming it.  A
    worker runs once (``run()`` or ``start()``); make a new one to run again.
    """

    _client_type = Client
    _push_cancels = True  # subscribe to <base>cancel (tests switch it off: then only checkpoints deliver)

    def _check_isolation(self, isolation: str, handler: object) -> None:
        if isolation == "process":
            check_isolated_handler(handler)

    def _check_handler(self, handler: object) -> None:
        call = getattr(handler, "__call__", None)  # noqa: B004 (a callable object's own method)
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call):
            raise TypeError("handler is a coroutine function: run it with echomq.asyncio.Worker")

    def _init_driver(self) -> None:
        self._lock = threading.Lock()  # the core's state is shared by the threads
        self._wake = threading.Event()  # set when stopping: idle and backing-off threads look again
        self._forced_event = threading.Event()
        self._threads: list[threading.Thread] = []
        # Threads in a handler now, and its job's keeper (a forced stop leaves them; a timeout abandons them).
        self._handling: dict[threading.Thread, LeaseKeeper] = {}
        self._abandoned: set[threading.Thread] = set()  # their handlers ran past the timeout's grace
        self._supervisor: threading.Thread | None = None
        self._supervisor_ident: int | None = None
        self._started = False
        self._done = threading.Event()
        self._signals: collections.deque[int] = collections.deque()
        self._keepers = SharedKeeper(f"echomq-worker-{self.queue}-leases")  # one thread keeps every lease
        self._claim_cutter = Cutter()  # stop() cuts the waiting claim (one per worker: _wait_for_work)
        self._complete_claim = True  # EMQ.COMPLETECLAIM: complete and claim the next in one command
        self._listener: CancelListener | None = None  # pushed cancels (<base>cancel)
        self._sweeper: Sweeper | None = None  # reap=True: the worker's own sweeps
        self._ticks: TickDriver | None = None  # reap=True: its queue's schedule ticks
        self._reserved = 0
        self._pool: ProcessPool | None = None  # isolation="process": the handlers' children
        self._pool_lock = threading.Lock()
        self._init_turns()

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
            # A Ctrl-C while the threads start (no handler of ours: it would raise anywhere in
            # the spawning, which nothing would clean up) is held until the supervisor runs.
            held = self._hold_interrupts() if restore is None else None
            try:
                self._spawn_loops()
            finally:
                interrupts = held() if held is not None else 0
            self._supervise(interrupts)
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
                self._give_back_unrun(jobs, claimed_at)
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
        self._wake_threads()
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
        _partitions.hook_worker(self)  # a partitioned queue's: claims and sweeps rotate over its partitions
        if self.isolation == "process":  # the children start (and import) before anything is claimed
            pool = self._process_pool()
            try:
                pool.prestart(self.concurrency)
            except BaseException:
                self._close_pool()
                raise
        WATCH.retain()  # one deadline-watch thread for all this worker's jobs
        self._reserved = self.concurrency + OWN_LOOPS
        self.client._reserve(self._reserved)
        if self.reap:  # its own sweeps, and its queue's schedule ticks fired as they come
            self._sweeper = Sweeper(self, self._lock)
            self._sweeper.start()
            self._ticks = TickDriver(self, told=self._push_cancels)
            self._ticks.start()
        if self._push_cancels:
            holding: Callable[[], bool] = lambda: len(self._held) > 0  # noqa: E731 (the listener pings only then)
            changed = self._ticks.changed if self._ticks is not None else None
            self._listener = CancelListener(self.client, self.queue, self._keepers, holding, changed)
            self._listener.ensure()
        self._threads = [
            threading.Thread(target=self._loop, name=f"echomq-worker-{self.queue}-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        if self.prefetch:  # one more thread, that only sends and claims: the others run what is ready
            self._threads.append(
                threading.Thread(
                    target=self._loop, args=(False,), name=f"echomq-worker-{self.queue}-sender", daemon=True
                )
            )
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

    def _hold_interrupts(self) -> Callable[[], int] | None:
        """While the threads start, count Ctrl-Cs instead of raising them; the returned call puts
        Python's handler back and says how many came.  Only where Python's own handler is set (in
        the main thread): an application's SIGINT handler is left alone."""
        if threading.current_thread() is not threading.main_thread():
            return None
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return None
        came: list[int] = []
        signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))

        def release() -> int:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            return len(came)

        return release

    def _keyboard_interrupt(self, exc: KeyboardInterrupt) -> bool:
        """Ctrl-C without our SIGINT handler: the first stops gracefully, a second forces; True then."""
        with self._lock:
            if self._interrupt is None:
                self._interrupt = exc
            first = self._request_stop(time.monotonic())
        self._wake.set()
        self._wake_threads()
        if not first:
            self._go_forced()
        return not first

    def _supervise(self, interrupts: int = 0) -> None:
        try:
            for _ in range(interrupts):  # the Ctrl-Cs held while the threads started
                if self._keyboard_interrupt(KeyboardInterrupt()):
                    return
            while True:
                try:
                    if self._supervise_step():
                        return
                except KeyboardInterrupt as exc:  # Ctrl-C without our SIGINT handler
                    if self._keyboard_interrupt(exc):
                        return
        finally:
            if self._sweeper is not None:
                self._sweeper.stop()
            _partitions.stop_worker(self)
            if self._ticks is not None:
                self._ticks.stop()
            self._join_threads()
            self._close_pool()
            self._late_signals()
            self._settle()
            self._late_signals()
            self._keepers.close()
            if self._listener is not None:
                self._listener.close()
            self.client._unreserve(self._reserved)
            WATCH.release()
            self._stopped()

    def _late_signals(self) -> None:
        """Signals that came after the supervising loop ended (its threads had): a second one still
        forces the stop, so settling is bounded by the force's budget and ``run()`` raises what the
        signal means (a forced deploy exited 0 when its second SIGTERM came while claims settled)."""
        with self._lock:
            force = False
            while self._signals:
                force = self._on_signal(self._signals.popleft(), time.monotonic()) or force
            stuck = self._force() if force and not self._forced else []
        if force:
            self._forced_event.set()
        if stuck:
            self._give_back_all(stuck, self._force_until, floor=time.monotonic() + SETTLE_TRY_S)

    def _join_threads(self) -> None:
        """Wait for the threads; after a forced stop, only for those not in a handler, within the budget.

        Those threads are giving jobs back or settling a claim's answer,
        every command bounded by the force's budget: a job a claim answered
        is released before the process goes, a second signal or not.
        """
        for t in list(self._threads):
            with self._lock:
                abandoned = t in self._abandoned
            if abandoned:  # its handler ran past the timeout's grace: nothing to wait for
                continue
            if not self._forced:
                t.join()
                continue
            with self._lock:
                in_handler = t in self._handling
            if not in_handler:  # its give-backs get one real try past the budget (SETTLE_TRY_S)
                t.join(max(0.0, self._force_until + SETTLE_TRY_S - time.monotonic()) + 0.2)

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
            self._wake_threads()
            self._claim_cutter.cut()  # a signal or a handler's SystemExit stops as promptly as stop() does
            self._give_back_ready()
            if self._sweeper is not None:
                self._sweeper.cut()
            if self._ticks is not None:
                self._ticks.cut()
        if force:
            self._go_forced()
            return True
        self._abandon_overdue(now)
        if not any(t.is_alive() for t in self._threads if t not in self._abandoned):
            return True
        if holding:
            self._keepers.ensure()  # a keeper thread that could not start (or died) runs again
        if self._listener is not None and not stopping:
            self._listener.ensure()
        time.sleep(TICK_S if wait is None else min(wait, TICK_S))
        return False

    def _abandon_overdue(self, now: float) -> None:
        """Handlers a grace past their timeout: their jobs failed without them, their threads replaced.

        Python cannot stop a thread: an abandoned handler runs on, and its
        thread ends when it returns (its job's end then sends nothing).
        ``_abandon_handler`` is the seam for a driver that can stop one.
        """
        with self._lock:
            overdue = [(held, self._abandon(held)) for held in self._abandon_due(now)]
            running = {keeper._held: (t, keeper) for t, keeper in self._handling.items()}
            abandoned = [running[held] for held, _ in overdue if held in running]
            self._abandoned.update(thread for thread, _ in abandoned)
        for thread, keeper in abandoned:
            keeper.stop()  # no more checkpoints: the job ends with its FAIL
            self._abandon_handler(thread)
        if overdue:
            with self._turns_lock:
                self._slots.ended(len(overdue))
                self._pending += [finish for _, finish in overdue]
                self._turns.notify_all()

    def _abandon_handler(self, thread: threading.Thread) -> None:
        """Leave a handler's thread to itself and start another in its place (the worker keeps its slots).

        With ``isolation="process"`` the handler's child is killed: the
        handler stops for real, and its thread, told so, ends at once.
        """
        if self._pool is not None:
            self._pool.kill(thread)
        if self._stop_requested:
            return
        replacement = threading.Thread(target=self._loop, name=f"{thread.name}-after-timeout", daemon=True)
        self._threads.append(replacement)
        replacement.start()

    def _go_forced(self) -> None:
        """Stop at once: give back the jobs whose handlers still run, within ``FORCE_BUDGET_S``."""
        with self._lock:
            stuck = self._force()
        self._forced_event.set()
        self._wake.set()
        self._wake_threads()
        if stuck:  # in one pipeline, one real try at least: the budget cut the last of one-by-one ones
            self._give_back_all(stuck, self._force_until, floor=time.monotonic() + SETTLE_TRY_S)

    # -- a job -----------------------------------------------------------------

    def work_one(self) -> bool:
        """Claim and process one job in this thread; False when the queue had none.

        With ``replicas=``: ``NotReplicated`` when the replicas did not confirm the claim (given back).
        """
        step = ClaimStep()
        try:
            jobs, claimed_at = self._claim(step)
        except _GaveUp as exc:
            raise exc.__cause__ or exc from None
        jobs = self._replicated(jobs, claimed_at, loop=False)
        for job in jobs:
            keeper = self._adopt(job, claimed_at)
            if keeper is not None:
                finish = self._execute(keeper)
                if finish is not None:
                    self._finish(finish)
        if not self._threads:  # work_one() on its own: its child (isolation="process") goes with it
            self._close_pool()
        return bool(jobs)

    def _claim(
        self, step: ClaimStep, *, count: int = 1, block_ms: int | None = None, settle: bool = False
    ) -> tuple[list[Job], float]:
        """One claim step: the jobs of one EMQ.CLAIM, and when (``time.monotonic()``) its REQ was first sent.

        The same call (so the same REQ) is sent again after a lost reply
        until it is answered (or a forced stop), and by the next steps
        until it brings jobs back (``ClaimStep``): a job the server handed
        to a reply we did not get comes back to us, and one answered late
        has its lease confirmed before it runs (``_adopt``).  With
        ``block_ms`` the claim waits on the server for a job.  With
        ``settle`` (the waiting claim), a stop ends the tries at once unless
        one got no answer (``_Stopped``); then ``_settle`` asks again.  The
        waiting claim can be cut by ``stop()`` (``_claim_cutter``): a
        waiting claim whose connection drops claims nothing, and a frozen
        server cannot hold the stop for a whole try.  The command is
        ``_claim_call()``'s, shared with the asyncio worker.
        """
        call, claimed_at = step.next(lambda: self._claim_call(block_ms, count), time.monotonic())
        extra = (block_ms or 0) / 1000
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

    def _adopt(self, job: Job, claimed_at: float, unrun: list[HeldJob] | None = None) -> LeaseKeeper | None:
        """``job``'s lease keeper, started; None when the worker does not run it (given back).

        Not started for a claim answered so late that its lease may have
        lapsed: the thread that runs the job confirms it first (``_start``),
        each in its own thread, not one after another here.  A job not run
        because the worker stops is given back now, or added to ``unrun``
        for the caller to give back with the rest of its claim.
        """
        keeper = self._keeper(job, claimed_at)
        held = keeper._held
        with self._lock:
            took = self._took(held)
        if not took:  # the claim was in flight when stop() came: give it back unrun
            if unrun is not None:
                unrun.append(held)
            else:
                now = time.monotonic()
                self._give_back(
                    held, max(held.confirmed_until, now + ATTEMPT_TIMEOUT_S), floor=now + SETTLE_TRY_S
                )
            return None
        if held.needs_confirmation(time.monotonic()):
            return keeper
        return keeper if self._start(keeper) else None

    def _start(self, keeper: LeaseKeeper) -> bool:
        """Start ``keeper`` (confirming a late claim's lease first); False when the job is not run."""
        held = keeper._held
        if held.needs_confirmation(time.monotonic()) and not self._confirm(keeper):
            with self._lock:
                give_back = self._unconfirmed(held)  # no answer in time: given back; stale: not ours
            if give_back:
                now = time.monotonic()
                self._give_back(held, now + SETTLE_TRY_S, floor=now + SETTLE_TRY_S)
            return False
        try:
            keeper.start()
        except BaseException:  # no keeper (a thread that cannot start): not run, given back
            keeper.stop()
            with self._lock:
                self._let_go(held)
                held.given_back = True
            self._give_back(held, held.confirmed_until)
            raise
        return True

    def _keeper(self, job: Job, claimed_at: float) -> LeaseKeeper:
        lease_ms, interval = self._lease_for(job)
        keeper = LeaseKeeper._for_worker(
            self.client, job, lease_ms, CancelToken(), interval=interval, claimed_at=claimed_at,
            troubles=self._troubles,
        )  # fmt: skip
        if self._threads:  # run() or start(): the worker's one keeper thread (work_one: the job's own)
            keeper._shared = self._keepers
        return keeper

    def _run(self, keeper: LeaseKeeper) -> None:
        """A thread's turn at a ready job: run it and hand its end to the finisher."""
        finish = self._execute(keeper)
        if keeper._held.abandoned:
            return  # its slot was freed, and its FAIL sent, when it was abandoned
        if finish is not None:
            self._hand(finish)
        else:
            with self._turns_lock:
                self._slots.ended()
                if self._sleeping:
                    self._turns.notify()

    def _execute(self, keeper: LeaseKeeper) -> Finish | None:
        """Run the handler of an adopted job; its end, or None when it was not run (given back, lost)."""
        held = keeper._held
        job = held.job
        context = CURRENT_JOB.set(job)
        try:
            with self._lock:
                if self._stop_requested or not held.active:
                    self._let_go(held)
                    if held.lost is not None and not held.given_back:  # lost while it waited
                        self._count_lost(held)
                    give_back = not held.given_back and held.maybe_ours  # lapsed by our reckoning: ours
                    held.given_back = held.given_back or give_back
                else:
                    give_back = None
            if give_back is not None:  # not run: the worker stops, or the lease was lost while it waited
                keeper.stop()
                if give_back:
                    self._settled_unrun(job)
                    now = time.monotonic()
                    until = max(held.confirmed_until, now + ATTEMPT_TIMEOUT_S)
                    self._give_back(held, until, floor=now + SETTLE_TRY_S)
                elif held.lost is not None:
                    with self._lock:
                        self._decide(held, None)  # stale or gone: nothing sent
                return None
            if not keeper._started and not self._start(keeper):  # a late claim not confirmed
                return None
            if self.metrics is not None:
                self.metrics.claimed_with_wait(self.client, job)
            if self.isolation != "process":  # a child's wait for its start is not the handler's time
                self._time(keeper)
            error, interrupted, value = self._call_handler(job, held.cancel, keeper)
            with self._lock:
                self._let_go(held)
                finish = self._decide(held, error, interrupted, value)
                if interrupted:
                    assert error is not None
                    self._interrupted(error, time.monotonic())
            self._teach(finish, error)
            if interrupted:
                self._wake.set()
                self._wake_threads()
            return finish
        finally:
            CURRENT_JOB.reset(context)

    def _time(self, keeper: LeaseKeeper) -> None:
        """The handler starts now: its timeout (``timeout_ms``) runs from here."""
        with keeper._lock:
            timeout_at = self._time_handler(keeper._held, time.monotonic())
        if timeout_at < math.inf:
            WATCH.earlier(timeout_at)

    def _call_handler(
        self, job: Job, cancel: CancelToken, keeper: LeaseKeeper
    ) -> tuple[BaseException | None, bool, object]:
        """Run the handler; (its exception or None, whether that exception stops the worker, its value)."""
        me = threading.current_thread()
        with self._lock:
            self._handling[me] = keeper
        error: BaseException | None = None
        interrupted = False
        value: object = None
        try:
            if self.isolation == "process":
                pool = self._process_pool()
                child = pool.take()
                self._time(keeper)
                value = pool.run(child, job, cancel, keeper, self._context_style)
            elif self._context_style:
                value = cast("Callable[[JobContext], object]", self.handler)(JobContext(job, cancel, keeper))
            else:
                value = cast("Callable[[Job, CancelToken], object]", self.handler)(job, cancel)
        except Exception as exc:  # the handler's failure is the job's, not the worker's
            error = exc
        except (
            BaseException
        ) as exc:  # SystemExit, KeyboardInterrupt, GeneratorExit: its job fails, the worker stops
            error, interrupted = exc, True
        finally:
            with self._lock:
                self._handling.pop(me, None)
            keeper.stop()
        return error, interrupted, value

    def _process_pool(self) -> ProcessPool:
        """The handlers' children (``isolation="process"``), made when the first job runs."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ProcessPool(
                    self.handler,
                    max_jobs_per_child=self.max_jobs_per_child,
                    limit_of=getattr(self.handler, "child_limit", None),  # an app's tasks' own limits
                )
            return self._pool

    def _close_pool(self) -> None:
        """Stop the children: idle ones exit, one still running a given-back job's handler is killed."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

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
