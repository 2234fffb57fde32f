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
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, TypeVar, cast

from . import _protocol as proto
from ._log import CURRENT_JOB
from ._protocol import keys_of
from ._runtime import (
    ATTEMPT_TIMEOUT_S,
    Action,
    Backoff,
    ClaimStep,
    Finish,
    HeldJob,
    Trouble,
    WorkerCore,
    WorkerStats,
    error_text,
    worker_log,
)
from ._watch import WATCH
from .cancel import CancelToken
from .client import Client, Job
from .context import JobContext
from .errors import JobGone, LeaseLost, NotReplicated
from .lease import LeaseKeeper, SharedKeeper

__all__ = ["Handler", "JobContext", "Worker", "WorkerStats", "error_text"]

T = TypeVar("T")

Handler = Callable[[JobContext], object] | Callable[[Job, CancelToken], object]

# How often the supervising thread looks at signals, the grace and its threads.
TICK_S = 0.05
# How often the cancel listener looks up from its subscription (to see the worker stop).
CANCEL_POLL_S = 0.2
# After a forced stop, how long the jobs still held may take to be given back.
FORCE_BUDGET_S = 0.4


class _GaveUp(Exception):
    """A command could not be sent before its deadline (or a forced stop); the last error is the cause."""


class Worker(WorkerCore[Client, Handler]):
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

    def _check_handler(self, handler: object) -> None:
        call = getattr(handler, "__call__", None)  # noqa: B004 (a callable object's own method)
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call):
            raise TypeError("handler is a coroutine function: run it with echomq.asyncio.Worker")

    def _init_driver(self) -> None:
        self._lock = threading.Lock()  # the core's state is shared by the threads
        self._wake = threading.Event()  # set when stopping: idle and backing-off threads look again
        self._forced_event = threading.Event()
        self._threads: list[threading.Thread] = []
        self._supervisor: threading.Thread | None = None
        self._supervisor_ident: int | None = None
        self._started = False
        self._done = threading.Event()
        self._signals: collections.deque[int] = collections.deque()
        self._keepers = SharedKeeper(f"echomq-worker-{self.queue}-leases")  # one thread keeps every lease
        self._complete_claim = True  # EMQ.COMPLETECLAIM: complete and claim the next in one command
        self._listener: threading.Thread | None = None  # pushed cancels (<base>cancel)
        self._done_listening = threading.Event()

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

    def _replicated(self, jobs: list[Job], *, loop: bool = True) -> list[Job]:
        """With ``replicas=``: the claimed jobs once the replicas have them; none if they were given back.

        In a claim loop the thread then pauses ``poll_interval``; for ``work_one`` (``loop=False``)
        ``NotReplicated`` is raised to its caller.
        """
        if self.replica_wait is None or not jobs:
            return jobs
        try:
            return self.client._wait_for_replicas(jobs, self.lease_ms, self.replica_wait)
        except NotReplicated as exc:
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
        self._listener = threading.Thread(
            target=self._listen_for_cancels, name=f"echomq-worker-{self.queue}-cancels", daemon=True
        )
        self._listener.start()
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
                    if not first:
                        self._go_forced()
                        return
        finally:
            for t in self._threads:
                t.join(0 if self._forced else None)
            self._keepers.close()
            self._done_listening.set()
            if self._listener is not None:
                self._listener.join(CANCEL_POLL_S + 1.0)
            WATCH.release()
            self._stopped()

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
        if stopping:
            self._wake.set()
        if force:
            self._go_forced()
            return True
        if not any(t.is_alive() for t in self._threads):
            return True
        time.sleep(TICK_S if wait is None else min(wait, TICK_S))
        return False

    def _go_forced(self) -> None:
        """Stop at once: give back the jobs whose handlers still run, within ``FORCE_BUDGET_S``."""
        with self._lock:
            stuck = self._force()
        self._forced_event.set()
        self._wake.set()
        until = time.monotonic() + FORCE_BUDGET_S
        for held in stuck:
            self._give_back(held, until)

    # -- pushed cancels ----------------------------------------------------------

    def _listen_for_cancels(self) -> None:
        """Subscribe to ``<base>cancel``: a cancel of a job held here is checkpointed at once.

        EMQ.CANCEL publishes the job's id there when it records a request
        for a running job; the checkpoint it triggers delivers the reason to
        the handler's token (and is fenced as any checkpoint).  One
        connection for the worker; a lost message, or a lost connection, is
        harmless: the lease keeper's next checkpoint delivers the cancel
        anyway, as it always did.
        """
        channel = keys_of(self.queue).base + "cancel"
        pubsub = None
        while not self._done_listening.is_set():
            try:
                if pubsub is None:
                    pubsub = self.client.redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                    pubsub.subscribe(channel)
                message = pubsub.get_message(timeout=CANCEL_POLL_S)
                if message is not None and message.get("type") == "message":
                    self._keepers.pushed(proto.text(message["data"]))
            except Exception as exc:  # the checkpoints deliver meanwhile; subscribe again soon
                worker_log.debug("worker of %r: cancel subscription: %r", self.queue, exc)
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()
                pubsub = None
                self._done_listening.wait(CANCEL_POLL_S)
        if pubsub is not None:
            with contextlib.suppress(Exception):
                pubsub.close()

    # -- a worker thread -------------------------------------------------------

    def _loop(self) -> None:
        pause, step = Backoff(), ClaimStep()
        ready: tuple[list[Job], float] | None = None  # claimed with the last job's end
        while not self._stop_requested:
            if ready is not None:
                (jobs, claimed_at), ready = ready, None
                jobs = self._replicated(jobs)
                if not jobs:
                    continue
            else:
                try:
                    jobs, claimed_at = self._claim(step)
                except _GaveUp:
                    self._wake.wait(pause.next_wait(time.monotonic()) or self.poll_interval)
                    continue
                except Exception as exc:  # a bug, not the server: logged once, and the loop goes on
                    self._trouble(exc, "claim")
                    self._wake.wait(self.poll_interval)
                    continue
                pause = Backoff()
                jobs = self._replicated(jobs)
                if not jobs:  # the claim waited on the server; the rest of poll_interval here
                    rest = self.poll_interval - (time.monotonic() - claimed_at)
                    if rest > 0.001:
                        self._wake.wait(rest)
                    continue
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

    def _finish_and_claim(self, finish: Finish, step: ClaimStep) -> tuple[list[Job], float] | None:
        """Send a job's end and the next claim in one round trip; the jobs claimed, if any.

        A COMPLETE goes as one EMQ.COMPLETECLAIM; a FAIL or RELEASE and the
        claim go pipelined.  Each half keeps its own safety: the end is
        fenced by the job's token (a repeat answers its first reply), the
        claim carries its REQ (a repeat answers the jobs it took).  Without
        an answer, the end goes the ordinary way (``_finish``, retried until
        its lease ends) and the claim step keeps the REQ, so the loop's next
        claim is answered with whatever this one took.
        """
        job = finish.job
        sent = time.monotonic()
        timeout = min(ATTEMPT_TIMEOUT_S, self.lease_ms / 3000, max(finish.held.confirmed_until - sent, 0.0))
        if finish.action is Action.COMPLETE and self._complete_claim:
            call = proto.complete_claim(job.queue, job.id, job.token, self.lease_ms)
            step.adopt(proto.claim(self.queue, self.lease_ms, request_id=proto.request_id_of(call)), sent)
            try:
                both = self.client._attempt(call, timeout)
            except LeaseLost as exc:  # stale: nothing was written, nothing claimed
                step.answered([])
                with self._lock:
                    self._refused(finish, exc)
                return None
            except Exception as exc:
                if "unknown command" in str(exc).lower():  # an older module: send the two verbs
                    self._complete_claim = False
                    step.answered([])
                else:
                    step.failed()
                    self._trouble(exc, finish.action.value, job)
                self._finish(finish)
                return None
            with self._lock:
                if both.gone:
                    self._refused(finish, JobGone("the job row is gone", job.id))
                else:
                    self._healed()
                    self._landed(finish)
            return self._claimed(step, both.jobs, sent)
        end = self._end_call(finish)
        claim, claimed_at = step.next(lambda: self._claim_call(False), sent)
        try:
            end_reply, claim_reply = self.client._attempt_many([end, claim], timeout)
        except Exception as exc:
            step.failed()
            self._trouble(exc, finish.action.value, job)
            self._finish(finish)
            return None
        try:
            where = proto.read_reply(end, end_reply)
        except LeaseLost as exc:
            with self._lock:
                self._refused(finish, exc)
        except Exception as exc:  # an answer that is no verdict: the ordinary way, with its retries
            self._trouble(exc, finish.action.value, job)
            self._finish(finish)
        else:
            with self._lock:
                self._healed()
                self._landed(finish, where)  # type: ignore[arg-type]
        try:
            jobs = proto.read_reply(claim, claim_reply)
        except Exception as exc:
            self._trouble(exc, "claim")
            return None
        return self._claimed(step, jobs, claimed_at)

    @staticmethod
    def _claimed(step: ClaimStep, jobs: list[Job], claimed_at: float) -> tuple[list[Job], float] | None:
        step.answered(jobs)
        if not jobs:
            step.call = None  # answered: nothing claimed for this REQ, and the next claim may wait
            return None
        return jobs, claimed_at

    def work_one(self) -> bool:
        """Claim and process one job in this thread; False when the queue had none.

        With ``replicas=``: ``NotReplicated`` when the replicas did not confirm the claim (given back).
        """
        try:
            jobs, claimed_at = self._claim(wait=False)
        except _GaveUp as exc:
            raise exc.__cause__ or exc from None
        jobs = self._replicated(jobs, loop=False)
        for job in jobs:
            self._process(job, claimed_at)
        return bool(jobs)

    def _claim(self, step: ClaimStep | None = None, wait: bool = True) -> tuple[list[Job], float]:
        """One claim step: the jobs of one EMQ.CLAIM, and when (``time.monotonic()``) its REQ was first sent.

        The same call (so the same REQ) is sent again after a lost reply
        until it is answered (or a forced stop), and by the loop's next
        steps until it brings jobs back (``ClaimStep``): a job the server
        handed to a reply we did not get comes back to us, and one answered
        late has its lease confirmed before it runs (``_process``).  With ``wait``
        the claim waits on the server for a job (``claim_block_ms``).  The
        command is ``_claim_call()``'s, shared with the asyncio worker.
        """
        step = step if step is not None else ClaimStep()
        call, claimed_at = step.next(lambda: self._claim_call(wait), time.monotonic())
        extra = self.claim_block_ms / 1000 if wait else 0.0
        # A lost reply must be noticed, and the claim sent again, well before the
        # lease it took lapses (then the retry is answered with the job): each
        # attempt waits at most a third of the lease, plus the server-side wait.
        jobs = self._send_until(
            call, None, "claim", extra_s=extra, on_retry=step.failed, cap_s=self.lease_ms / 3000
        )
        step.answered(jobs)
        return jobs, claimed_at

    def _send_until(
        self,
        call: proto.Call[T],
        until: float | None,
        doing: str,
        job: Job | None = None,
        extra_s: float = 0.0,
        on_retry: Callable[[], None] | None = None,
        cap_s: float | None = None,
    ) -> T:
        """Send ``call`` until it is answered, ``until`` passes, or a forced stop: then ``_GaveUp``.

        ``LeaseLost`` is an answer: it is raised as is.  So is a permanent
        error while the worker is stopping (nothing to wait for).
        """
        backoff = Backoff(until)
        while True:
            try:
                timeout = backoff.timeout(time.monotonic())
                timeout = (timeout if cap_s is None else min(timeout, cap_s)) + extra_s
                reply = self.client._attempt(call, timeout)
            except LeaseLost:
                raise
            except Exception as exc:
                kind = self._trouble(exc, doing, job)
                if on_retry is not None:
                    on_retry()
                wait = backoff.next_wait(time.monotonic())
                if wait is None or self._forced or (kind is Trouble.PERMANENT and self._stop_requested):
                    raise _GaveUp(doing) from exc
                self._forced_event.wait(wait)
                continue
            self._healed()
            return reply

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
        if run_it and self.metrics is not None:
            self.metrics.claimed_with_wait(self.client, job)
        context = CURRENT_JOB.set(job)
        try:
            if not run_it:  # the claim was in flight when stop() came: give it back unrun
                self._give_back(held, held.confirmed_until)
                return None
            if held.needs_confirmation(time.monotonic()) and not keeper._confirm(ATTEMPT_TIMEOUT_S):
                with self._lock:
                    self._let_go(held)
                    self._decide(held, None)  # lost: counted, nothing sent
                return None
            error: BaseException | None = None
            interrupted = False
            keeper.start()
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
                keeper.stop()
            with self._lock:
                self._let_go(held)
                finish = self._decide(held, error, interrupted)
                if interrupted:
                    assert error is not None
                    self._interrupted(error, time.monotonic())
            if interrupted:
                self._wake.set()
            if defer:
                return finish
            self._finish(finish)
            return None
        finally:
            CURRENT_JOB.reset(context)

    def _finish(self, finish: Finish) -> None:
        """Send the job's end, again after connection trouble, until it lands or its lease ends."""
        if finish.action is not Action.DROP:
            self._send_end(finish, self._end_call(finish), finish.held.confirmed_until)

    def _give_back(self, held: HeldJob, until: float) -> None:
        """RELEASE a job this worker will not run (or not finish): no attempt used."""
        job = held.job
        self._send_end(Finish(held, Action.RELEASE), proto.release(job.queue, job.id, job.token), until)

    def _send_end(self, finish: Finish, call: proto.Call[Any], until: float) -> None:
        """Send ``call`` (the job's end) until it lands or ``until``; settle the job by how it went."""
        try:
            where = self._send_until(call, until, finish.action.value, finish.job)
        except LeaseLost as exc:
            with self._lock:
                self._refused(finish, exc)
            return
        except _GaveUp:
            with self._lock:
                self._unfinished(finish)
            return
        with self._lock:
            self._landed(finish, None if finish.action is Action.COMPLETE else where)
