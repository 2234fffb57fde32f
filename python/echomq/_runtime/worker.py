"""``WorkerCore``: what both ``Worker`` classes share, their settings checked, the held jobs, the stats."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Generic, TypeVar

from .. import _protocol as proto
from .._protocol import MAX_MS, Call, Job, keys_of
from ..errors import NotReplicated
from ..retry import RetryPolicy, merge_attempts
from .args import check_callable, check_client, check_int, check_seconds, takes_context
from .finish import Finishing
from .isolation import ISOLATIONS
from .lease import LOST_UNCONFIRMED, HeldJob, Leases
from .logs import worker_log
from .per_job import PerJob, settings_hook
from .shutdown import SHUTDOWN, Shutdown
from .stats import WorkerStats
from .sweep import Reaping
from .timeouts import Timing
from .troubles import Trouble, Troubles

if TYPE_CHECKING:
    from .metrics import Metrics

ClientT = TypeVar("ClientT")
HandlerT = TypeVar("HandlerT")


class WorkerCore(Shutdown, Finishing, Reaping, Timing, PerJob, Generic[ClientT, HandlerT]):
    """What both ``Worker`` classes share: settings, the held jobs, shutdown, finishing, stats.

    Shutdown, in both drivers: ``_request_stop`` stops claiming at once
    (a job whose claim was in flight is given back without running); at the
    end of the grace ``_shutdown_tick`` cancels every running handler's token
    with "shutdown"; ``FORCE_AFTER_S`` later ``_force`` hands the driver the
    jobs whose handlers still run, to give back itself.  A handler that ends
    after "shutdown" by raising has its job released (no attempt used).
    """

    _client_type: type | None = None

    def __init__(
        self,
        client: ClientT,
        queue: str,
        handler: HandlerT,
        *,
        lease_ms: int = 30_000,
        max_attempts: int = 3,
        concurrency: int = 1,
        prefetch: int = 0,
        poll_interval: float = 0.2,
        extend_interval: float | None = None,
        grace: float = 10.0,
        retry: RetryPolicy | None = None,
        metrics: Metrics | None = None,
        replicas: int = 0,
        replicas_timeout_ms: int = 1000,
        replicas_aof: bool = False,
        reap: bool = True,
        reap_interval: float = 10.0,
        max_stalled: int = 3,
        timeout_ms: int | None = None,
        timeout_grace: float = 5.0,
        isolation: str = "thread",
        max_jobs_per_child: int | None = None,
    ) -> None:
        check_client("client", client, self._client_type)
        keys_of(queue)
        check_callable("handler", handler)
        self._check_handler(handler)
        self._context_style = takes_context(handler)  # type: ignore[arg-type]
        # A handler serving several kinds of job may give each its own lease, timeout and tries.
        self._settings_hook = settings_hook(handler)
        check_int("lease_ms", lease_ms, 1, MAX_MS)
        check_int("max_attempts", max_attempts)
        check_int("concurrency", concurrency, 1, 10_000)
        check_int("prefetch", prefetch, 0, 10_000)
        check_seconds("poll_interval", poll_interval)
        if extend_interval is not None:
            check_seconds("extend_interval", extend_interval)
            if extend_interval * 1000 >= lease_ms:
                raise ValueError(
                    f"extend_interval ({extend_interval} s) must be shorter than the lease ({lease_ms} ms)"
                )
        check_seconds("grace", grace, zero_ok=True)
        if not isinstance(reap, bool):
            raise TypeError(f"reap must be a bool, not {type(reap).__name__}")
        check_seconds("reap_interval", reap_interval)
        check_int("max_stalled", max_stalled)
        if timeout_ms is not None:
            check_int("timeout_ms", timeout_ms, 1, MAX_MS)
        check_seconds("timeout_grace", timeout_grace, zero_ok=True)
        if isolation not in ISOLATIONS:
            choices = ", ".join(map(repr, ISOLATIONS))
            raise ValueError(f"isolation must be one of {choices}, got {isolation!r}")
        if max_jobs_per_child is not None:
            check_int("max_jobs_per_child", max_jobs_per_child)
            if isolation != "process":
                raise ValueError("max_jobs_per_child needs isolation='process' (threads are not recycled)")
        self._check_isolation(isolation, handler)
        if retry is not None:
            if not isinstance(retry, RetryPolicy):
                raise TypeError(f"retry must be an echomq.RetryPolicy, not {type(retry).__name__}")
            # The worker's 3 is its default, not a choice: the policy's number then stands.
            retry = merge_attempts(None if max_attempts == 3 else max_attempts, retry)
            max_attempts = retry.max_attempts
        self.client, self.queue, self.handler = client, queue, handler
        self.metrics = metrics  # echomq.metrics.Metrics: told of every claim, lease and end
        if metrics is not None:
            metrics.bind(client)
        self.lease_ms, self.max_attempts = lease_ms, max_attempts
        # replicas=N: a claimed job runs once N replicas have its claim (the client's claim(replicas=)).
        self.replica_wait = proto.replica_wait(replicas, replicas_timeout_ms, replicas_aof)
        if self.replica_wait is not None:
            proto.check_wait_fits(self.replica_wait, proto.socket_timeout_of(getattr(client, "redis", None)))
        self.concurrency, self.poll_interval = concurrency, poll_interval
        # prefetch=N: up to N jobs claimed beyond the free slots, their leases kept while they wait.
        self.prefetch = prefetch
        self.extend_interval = extend_interval
        # Each job's checkpoint interval: extend_interval, else a third of the lease.
        self._interval = extend_interval if extend_interval is not None else lease_ms / 3000.0
        self.grace = grace
        # reap=True: this worker sweeps the queue itself (bounded, jittered: Reaping).
        self.reap, self.reap_interval, self.max_stalled = reap, reap_interval, max_stalled
        # timeout_ms: a handler's token is cancelled with "timeout" then; timeout_grace later it is abandoned.
        self.timeout_ms, self.timeout_grace = timeout_ms, timeout_grace
        # isolation="process": handlers run in child processes (echomq.isolation), recycled after
        # max_jobs_per_child jobs; a timeout's abandon kills the child.
        self.isolation, self.max_jobs_per_child = isolation, max_jobs_per_child
        self.retry = retry
        self.stats = WorkerStats()
        self._held = Leases()
        self._troubles = Troubles(worker_log, f"worker of {queue!r}", self.stats)
        self._stop_requested = False
        self._grace_until = math.inf
        self._tokens_cancelled = False
        self._forced = False
        self._force_until = math.inf  # after a forced stop: the end of FORCE_BUDGET_S
        self._interrupt: BaseException | None = None  # what run() raises when it is done
        self._init_driver()

    def _not_replicated(self, exc: NotReplicated) -> None:
        """A claim's wait for replicas ran out: its jobs were given back unrun; counted and logged."""
        self.stats.not_replicated += len(exc.job_ids)
        worker_log.warning("worker of %r: %s", self.queue, exc)

    def _check_handler(self, handler: object) -> None:
        """The driver refuses a handler of the other kind (a coroutine function in threads, say)."""

    def _check_isolation(self, isolation: str, handler: object) -> None:
        """The driver refuses an isolation it cannot give (processes: a handler children cannot import)."""

    def _init_driver(self) -> None:
        """Make the driver's own thread or task primitives."""

    # -- jobs ------------------------------------------------------------------

    def _took(self, held: HeldJob, landed: bool = False) -> bool:
        """A job was claimed and its keeper made.  False if the worker is stopping: give it back unrun.

        ``landed``: its claim was answered before the stop was requested
        (the asyncio claimer hands jobs to its runners a loop turn later):
        it runs, within the grace, as a job already started would; not once
        the stop was forced.
        """
        # After a forced stop nothing starts, landed or not: nobody would stop it again.
        if self._forced or (self._stop_requested and not landed):
            held.given_back = True
            return False
        held.metrics = self.metrics
        self._held.add(held)
        if self._tokens_cancelled:
            held.cancel.cancel(SHUTDOWN)
        return True

    def _let_go(self, held: HeldJob) -> None:
        """The handler ended (however it ended) and its keeper stopped."""
        self._held.discard(held)

    def _unconfirmed(self, held: HeldJob) -> bool:
        """A claim answered late whose lease could not be confirmed: True when the driver gives it back.

        No answer within a lease (``LOST_UNCONFIRMED``) does not make the job
        someone else's: on the server it may still be ours, and left there it
        is held by nobody until a sweep, which counts a stall (a try charged
        for a job that never ran; three and it is dead).  So it is given back
        (RELEASE is fenced by its token: a job another worker holds now
        answers stale, nothing written).  Stale or gone: not ours, counted
        as lost, nothing sent.
        """
        self._let_go(held)
        if held.lost == LOST_UNCONFIRMED and not held.given_back:
            held.given_back = True
            return True
        self._decide(held, None)
        return False

    def _stopped(self) -> None:
        """The worker has stopped: what the metrics still hold goes out now."""
        if self.metrics is not None:
            self.metrics.flush()

    # -- what is sent: one small function each, for both drivers ----------------

    def _claim_call(self, block_ms: int | None = None, count: int = 1) -> Call[list[Job]]:
        """The claim step's command (one REQ, sent again until answered).

        With ``block_ms``, the idle wait happens on the server (EMQ.CLAIM ...
        BLOCK, ``IdleWait.block_ms``): a job enqueued while the worker idles
        is claimed at once instead of at the next poll.
        """
        return proto.claim(self.queue, self.lease_ms, count, block_ms)

    def _trouble(self, exc: BaseException, doing: str, job: Job | None = None) -> Trouble:
        """Count and log (once per kind) an error met while ``doing``; the caller retries."""
        return self._troubles.report(exc, doing, job)

    def _healed(self) -> None:
        self._troubles.healed()
