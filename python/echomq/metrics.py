"""Prometheus metrics: what workers and reapers do (in-process), and what queues hold (the exporter).

Two sides, both with ``prometheus_client`` (``pip install 'echomq[metrics]'``):

- **In the worker's process**: ``Metrics`` holds the counters and
  histograms of what this process's workers and reapers did (claims,
  completions, failures, run times, lost leases, delivered cancels,
  recoveries...).  Pass it to ``Worker(..., metrics=m)`` and
  ``Reaper(..., metrics=m)`` (sync or asyncio), and expose its registry with
  ``serve(port)`` or your own web framework.  It also adds its totals, once
  a second, to the queue's shared counters in Redis
  (``<base>metrics:counts``; ``Client.counters``), so ``echomq exporter`` and
  ``echomq dashboard`` see the whole fleet's throughput without scraping
  every worker.
- **Queue-level**: ``QueueCollector`` reads what the server holds, through
  the client's read methods (``counts``, ``pending``, ``counters``), at
  every scrape, for queues named or found in the queue registry (no SCAN);
  ``CancelWatch`` measures how long a cancel takes from its request
  (EMQ.CANCEL's announcement) to the job ending cancelled.  ``echomq
  exporter`` serves both.

Labels stay bounded: ``queue`` (queues you run, or at most ``max_queues``
discovered), and small fixed sets (``outcome``, ``reason``, ``state``,
``by``); never a job id.  docs/guides/operating.md ("Metrics") lists every name.
"""

from __future__ import annotations

import atexit
import logging
import random
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("echomq.metrics needs prometheus_client: pip install 'echomq[metrics]'") from exc

import redis

from . import _protocol as proto
from ._protocol import Job, SweepResult

if TYPE_CHECKING:
    from . import _runtime
    from ._sync.client import Client

__all__ = [
    "CancelWatch",
    "Metrics",
    "QueueCollector",
    "serve",
]

log = logging.getLogger("echomq.metrics")

RUN_BUCKETS = proto.QUEUE_RUN_BUCKETS
"""Seconds: a handler's run, from milliseconds to an hour (the queue-level histogram's too)."""
WAIT_BUCKETS = proto.QUEUE_WAIT_BUCKETS
"""Seconds: enqueue to claim (the queue-level histogram's too)."""
CANCEL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
"""Seconds: a cancel's way, bounded by the checkpoint interval (a third of the lease by default)."""

OUTCOMES = ("completed", "failed", "cancelled", "released", "lost")
"""``outcome`` of ``echomq_job_run_seconds``: how the handler's run ended for the job."""
LOST_REASONS = {"stale": "stale token", "gone": "row is gone", "deadline": "no extend confirmed"}
"""``reason`` of ``echomq_leases_lost_total``, by a phrase of the lease keeper's reason."""


def _lost_label(reason: str) -> str:
    for label, phrase in LOST_REASONS.items():
        if phrase in reason:
            return label
    return "other"


# -- in the worker's process -----------------------------------------------------


class _Shared:
    """The deltas of the queue's shared counters, flushed to Redis by one daemon thread."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.redis: Any = None
        self._lock = threading.Lock()
        self._deltas: dict[str, dict[str, int]] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = 0
        # One flush at a time: a worker's stop flushes while the thread may be
        # mid-flush, and must not return (the process may exit) before the
        # deltas the thread took have reached Redis.
        self._flushing = threading.Lock()

    def add(self, queue: str, field: str, n: int = 1) -> None:
        with self._lock:
            per = self._deltas.setdefault(queue, {})
            per[field] = per.get(field, 0) + n
            if self._thread is None and self.redis is not None:
                self._thread = threading.Thread(target=self._run, name="echomq-metrics-share", daemon=True)
                self._thread.start()

    def flush(self) -> None:
        """Add the deltas to Redis now; the thread, woken, ends if nothing more comes."""
        self._flush()
        self._wake.set()

    def _flush(self) -> None:
        with self._flushing:
            self._flush_now()

    def _flush_now(self) -> None:
        with self._lock:
            deltas, self._deltas = self._deltas, {}
        if not deltas or self.redis is None:
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            for queue, per in deltas.items():
                for args in proto.add_counters(queue, per):
                    pipe.execute_command(*args)
            pipe.execute()
        except Exception as exc:
            self.errors += 1
            with self._lock:  # keep them for the next flush: counters must not lose counts
                for queue, per in deltas.items():
                    mine = self._deltas.setdefault(queue, {})
                    for name, n in per.items():
                        mine[name] = mine.get(name, 0) + n
            log.warning("could not add to the shared counters (will retry): %r", exc)

    def _run(self) -> None:
        # The thread lives while there is something to add: it ends after a flush
        # that leaves nothing behind, and the next ``add`` starts another, so an
        # idle process (or one whose workers stopped) keeps no thread of ours.
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            self._flush()
            with self._lock:
                if not self._deltas:
                    self._thread = None
                    return


def _sync_twin(async_redis: Any) -> Any:
    """A sync redis-py client to the server an asyncio client talks to (None if it cannot tell)."""
    pool = getattr(async_redis, "connection_pool", None)
    if pool is None:  # redis.asyncio.RedisCluster
        node = async_redis.get_default_node() if hasattr(async_redis, "get_default_node") else None
        if node is None:
            return None
        from redis.cluster import RedisCluster

        return RedisCluster(host=node.host, port=node.port)
    kw = pool.connection_kwargs
    keep = {k: kw[k] for k in ("host", "port", "db", "username", "password") if k in kw}
    if "path" in kw:
        keep["unix_socket_path"] = kw["path"]
    if "SSL" in type(pool).__name__ or "SSL" in getattr(pool.connection_class, "__name__", ""):
        keep["ssl"] = True
    return redis.Redis(**keep)


class Metrics:
    """What this process's workers and reapers did, as Prometheus metrics (and shared counters).

    ``Metrics(registry=None, *, share=True, redis=None, flush_interval=1.0,
    wait_sample=1.0)``:

    - ``registry``: where the metrics are registered (default:
      ``prometheus_client.REGISTRY``, what ``serve`` and most frameworks
      expose).  Make one ``Metrics`` per registry and give it to every
      ``Worker`` and ``Reaper`` of the process: the ``queue`` label tells
      them apart.
    - ``share``: also add the totals to the queue's shared counters in Redis
      (``<base>metrics:counts``, one pipelined HINCRBY per queue and field
      every ``flush_interval`` seconds, from a daemon thread), which the
      exporter and the dashboard read.  ``redis`` is the server to add them
      to (a redis-py client or a URL); by default the first Worker or Reaper
      that uses this object lends its client's server.
    - ``wait_sample``: the share of first claims whose enqueue-to-claim wait
      is measured (one ``Client.job`` read, two round trips, per measured
      claim; 0 turns it off).

    The methods below are what the runtime calls; they never raise.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        share: bool = True,
        redis: Any = None,
        flush_interval: float = 1.0,
        wait_sample: float = 1.0,
    ) -> None:
        if not 0.0 <= wait_sample <= 1.0:
            raise ValueError(f"wait_sample must be between 0 and 1, got {wait_sample}")
        if flush_interval <= 0:
            raise ValueError(f"flush_interval must be > 0, got {flush_interval}")
        reg = REGISTRY if registry is None else registry
        self.registry = reg
        self.wait_sample = wait_sample
        q = ["queue"]

        def counter(name: str, doc: str, labels: Sequence[str] = q) -> Counter:
            return Counter(name, doc, list(labels), registry=reg)

        try:
            self.jobs_claimed = counter("echomq_jobs_claimed", "Jobs this process's workers claimed.")
            self.jobs_completed = counter("echomq_jobs_completed", "Jobs completed (COMPLETE accepted).")
            self.jobs_failed = counter(
                "echomq_jobs_failed", "Handler failures FAIL accepted: the job was retried or dead-lettered."
            )
            self.jobs_dead_lettered = counter(
                "echomq_jobs_dead_lettered",
                "Jobs sent to the dead set: by=fail (out of attempts), by=sweep (out of stalls).",
                ["queue", "by"],
            )
            self.jobs_cancelled = counter(
                "echomq_jobs_cancelled",
                "Jobs ended cancelled: by=worker (FAIL/RELEASE of a cancelled job), by=sweep (lapsed).",
                ["queue", "by"],
            )
            self.jobs_released = counter("echomq_jobs_released", "Jobs given back without using an attempt.")
            self.jobs_refused = counter(
                "echomq_jobs_refused",
                "COMPLETE/FAIL/RELEASE refused: the lease had lapsed (StaleToken/JobGone).",
            )
            self.jobs_recovered = counter(
                "echomq_jobs_recovered", "Lapsed jobs a sweep sent back to pending."
            )
            self.dead_expired = counter(
                "echomq_dead_expired", "Dead jobs a sweep deleted past the dead retention."
            )
            self.leases_lost = counter(
                "echomq_leases_lost",
                "Leases a holder lost: reason=stale (another holder or swept), gone (row deleted), "
                "deadline (no extend confirmed in time).",
                ["queue", "reason"],
            )
            self.cancels_delivered = counter(
                "echomq_cancels_delivered", "Remote cancels a checkpoint delivered to a running handler."
            )
            self.run_seconds = Histogram(
                "echomq_job_run_seconds",
                "A handler's run, from claim to its end, by outcome.",
                ["queue", "outcome"],
                buckets=RUN_BUCKETS,
                registry=reg,
            )
            self.wait_seconds = Histogram(
                "echomq_job_wait_seconds",
                "Enqueue to first claim (server clock: the row's claimed_at - enqueued_at).",
                q,
                buckets=WAIT_BUCKETS,
                registry=reg,
            )
            self.cancel_stop_seconds = Histogram(
                "echomq_cancel_stop_seconds",
                "From the checkpoint that delivered a remote cancel to the handler's end.",
                q,
                buckets=CANCEL_BUCKETS,
                registry=reg,
            )
        except ValueError as exc:  # "Duplicated timeseries in CollectorRegistry"
            raise ValueError(
                f"{exc}: make one echomq.metrics.Metrics per registry and share it between workers"
            ) from exc
        self._share = _Shared(flush_interval) if share else None
        if self._share is not None and redis is not None:
            self._share.redis = _redis_of(redis)
        self._delivered: dict[tuple[str, str, str], float] = {}
        self._started: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()
        self._random = random.Random()
        if self._share is not None:
            atexit.register(_flush_at_exit, weakref.ref(self))

    # -- binding and flushing -----------------------------------------------------

    def bind(self, client: Any) -> None:
        """Lend the shared counters a server: the Worker's or Reaper's client (first one wins)."""
        share = self._share
        if share is None or share.redis is not None:
            return
        inner = getattr(client, "redis", client)
        is_async = type(client).__module__.endswith("asyncio") or "asyncio" in type(inner).__module__
        share.redis = _sync_twin(inner) if is_async else inner

    def flush(self) -> None:
        """Add what was counted since the last flush to the shared counters now (a worker's stop does)."""
        if self._share is not None:
            self._share.flush()

    def _observe(self, queue: str, name: str, bounds: tuple[float, ...], seconds: float) -> None:
        """One observation into the queue's shared histogram (the exporter's queue-level latency)."""
        if self._share is not None:
            for field, n in proto.observation(name, bounds, seconds).items():
                self._share.add(queue, field, n)

    def _add(self, queue: str, field: str, n: int = 1) -> None:
        if self._share is not None and n:
            self._share.add(queue, field, n)

    # -- what the runtime calls ----------------------------------------------------

    def wants_wait(self, job: Job) -> bool:
        """Whether to measure this claim's enqueue-to-claim wait (first claims, sampled)."""
        return job.attempt == 1 and self.wait_sample > 0 and self._random.random() < self.wait_sample

    def claimed(self, job: Job, wait_ms: int | None = None) -> None:
        """A job was claimed; ``wait_ms`` is its enqueue-to-claim wait when it was measured."""
        self.jobs_claimed.labels(job.queue).inc()
        with self._lock:
            if len(self._started) < 100_000:
                self._started[(job.queue, job.id, job.token)] = time.monotonic()
        if wait_ms is not None and wait_ms >= 0:
            self.wait_seconds.labels(job.queue).observe(wait_ms / 1000)
            self._observe(job.queue, "wait", WAIT_BUCKETS, wait_ms / 1000)
        self._add(job.queue, "claimed")

    def claimed_with_wait(self, client: Client, job: Job) -> None:
        """``claimed``, measuring the wait with ``client.job`` when ``wants_wait`` says so (sync)."""
        wait = None
        if self.wants_wait(job):
            try:
                wait = _wait_of(client.job(job.queue, job.id))
            except Exception as exc:
                log.debug("could not read the wait of %s: %r", job.id, exc)
        self.claimed(job, wait)

    async def aclaimed_with_wait(self, client: Any, job: Job) -> None:
        """``claimed``, measuring the wait with ``await client.job`` (asyncio)."""
        wait = None
        if self.wants_wait(job):
            try:
                wait = _wait_of(await client.job(job.queue, job.id))
            except Exception as exc:
                log.debug("could not read the wait of %s: %r", job.id, exc)
        self.claimed(job, wait)

    def cancel_delivered(self, job: Job) -> None:
        """A checkpoint brought a remote cancel for ``job``: its handler is being told now."""
        self.cancels_delivered.labels(job.queue).inc()
        with self._lock:
            if len(self._delivered) < 100_000:
                self._delivered.setdefault((job.queue, job.id, job.token), time.monotonic())

    def lease_lost(self, job: Job, reason: str) -> None:
        """The holder lost ``job``'s lease (``reason`` is the lease keeper's)."""
        self.leases_lost.labels(job.queue, _lost_label(reason)).inc()
        self._add(job.queue, "lease_lost")

    def finished(self, job: Job, outcome: str, run_seconds: float | None = None) -> None:
        """The handler's run of ``job`` ended and its end landed (or was dropped).

        ``run_seconds`` defaults to the time since ``claimed(job)``.

        ``outcome``: ``completed``; ``retried`` or ``dead`` (FAIL's answer);
        ``cancelled``; ``released``; ``refused`` (the server refused the end:
        the lease had lapsed); ``lost`` (the lease was lost first: nothing sent).
        """
        queue = job.queue
        key = (queue, job.id, job.token)
        with self._lock:
            delivered = self._delivered.pop(key, None)
            started = self._started.pop(key, None)
        if run_seconds is None:
            run_seconds = 0.0 if started is None else time.monotonic() - started
        if delivered is not None:
            self.cancel_stop_seconds.labels(queue).observe(max(0.0, time.monotonic() - delivered))
        label = outcome
        if outcome == "completed":
            self.jobs_completed.labels(queue).inc()
            self._add(queue, "completed")
        elif outcome in ("retried", "dead", "pending"):
            label = "failed"
            self.jobs_failed.labels(queue).inc()
            self._add(queue, "failed")
            if outcome == "dead":
                self.jobs_dead_lettered.labels(queue, "fail").inc()
        elif outcome == "cancelled":
            self.jobs_cancelled.labels(queue, "worker").inc()
            self._add(queue, "cancelled")
        elif outcome == "released":
            self.jobs_released.labels(queue).inc()
            self._add(queue, "released")
        elif outcome == "refused":
            label = "lost"
            self.jobs_refused.labels(queue).inc()
        else:
            label = "lost"
        self.run_seconds.labels(queue, label).observe(max(0.0, run_seconds))
        self._observe(queue, "run", RUN_BUCKETS, max(0.0, run_seconds))

    def swept(self, queue: str, result: SweepResult) -> None:
        """What a reaper's sweep (or tick) of ``queue`` did."""
        if result.recovered:
            self.jobs_recovered.labels(queue).inc(len(result.recovered))
            self._add(queue, "recovered", len(result.recovered))
        if result.dead:
            self.jobs_dead_lettered.labels(queue, "sweep").inc(len(result.dead))
        if result.cancelled:
            self.jobs_cancelled.labels(queue, "sweep").inc(len(result.cancelled))
            self._add(queue, "cancelled", len(result.cancelled))
        if result.expired:
            self.dead_expired.labels(queue).inc(result.expired)


if TYPE_CHECKING:  # what the runtime calls (its interface, echomq._runtime.Metrics): checked by mypy here
    _IMPLEMENTS: type[_runtime.Metrics] = Metrics


def _wait_of(info: Any) -> int | None:
    if info is None or info.claimed_at is None or info.enqueued_at is None:
        return None
    return int(info.claimed_at - info.enqueued_at)


def _redis_of(target: Any) -> Any:
    if isinstance(target, str):
        return redis.Redis.from_url(target)
    return getattr(target, "redis", target)


def _flush_at_exit(ref: weakref.ReferenceType[Metrics]) -> None:
    metrics = ref()
    if metrics is not None:
        metrics.flush()


def serve(port: int, addr: str = "127.0.0.1", registry: CollectorRegistry | None = None) -> Any:
    """Serve ``registry`` (default: prometheus_client's) at ``http://addr:port/metrics`` from a thread.

    Loopback by default: pass ``addr="0.0.0.0"`` for a Prometheus on another
    host.  Returns the server (``.server_address``, ``.shutdown()``).
    """
    server, _thread = start_http_server(port, addr=addr, registry=REGISTRY if registry is None else registry)
    log.info("metrics at http://%s:%d/metrics", *server.server_address[:2])
    return server


# -- queue-level: the exporter ---------------------------------------------------


@dataclass
class _QueueView:
    counts: Any
    head: Any
    counters: Any
    histograms: dict[str, Any]


class QueueCollector(Collector):
    """Queue-level metrics read from the server at each scrape (a ``prometheus_client`` collector).

    ``QueueCollector(client, queues=None, *, max_queues=100, scan_budget=100_000,
    discover_every=30.0)``: ``queues`` are the names to export; None
    discovers them with ``client.queues`` (the queue registry: a queue that drained
    between two discoveries is found; docs/concepts/registry.md) at most every
    ``discover_every`` seconds, at most ``max_queues`` of them; a queue found
    once stays exported (its sets may empty, its counters go on) until the
    exporter restarts.  A queue whose
    read fails is left out of that scrape (``echomq_exporter_errors_total``).
    """

    def __init__(
        self,
        client: Client,
        queues: Sequence[str] | None = None,
        *,
        max_queues: int = 100,
        scan_budget: int = 100_000,
        discover_every: float = 30.0,
    ) -> None:
        self.client = client
        self.fixed = list(queues) if queues else None
        for name in self.fixed or ():
            proto.keys_of(name)  # a bad name fails here, not at every scrape
        self.max_queues, self.scan_budget, self.discover_every = max_queues, scan_budget, discover_every
        self._known: list[str] = []
        self._discovered_at = -float("inf")
        self.errors = 0
        self._lock = threading.Lock()

    def queues(self) -> list[str]:
        """The queues exported now: the names given, or the last discovery (refreshed when due)."""
        if self.fixed is not None:
            return self.fixed
        with self._lock:
            if time.monotonic() - self._discovered_at >= self.discover_every:
                try:
                    found = self.client.queues(limit=self.max_queues, scan_budget=self.scan_budget)
                    # Sticky: a queue whose sets emptied is still exported (its counters go on).
                    room = self.max_queues - len(self._known)
                    self._known += [q for q in found if q not in self._known][: max(0, room)]
                    self._discovered_at = time.monotonic()
                except Exception as exc:
                    self.errors += 1
                    log.warning("queue discovery failed: %r", exc)
            return list(self._known)

    def describe(self) -> Iterable[Metric]:
        return []  # collected at scrape time only: registering does not read the server

    def _view(self, queue: str) -> _QueueView | None:
        try:
            head = self.client.pending(queue, count=1)
            return _QueueView(
                self.client.counts(queue),
                head[0] if head else None,
                self.client.counters(queue),
                self.client._read(proto.shared_histograms(queue)),
            )
        except Exception as exc:
            self.errors += 1
            log.warning("reading queue %r failed: %r", queue, exc)
            return None

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        jobs = GaugeMetricFamily(
            "echomq_queue_jobs", "Jobs in the queue's sets, by state.", labels=["queue", "state"]
        )
        lapsed = GaugeMetricFamily(
            "echomq_queue_lapsed_jobs", "Active jobs past their lease (a sweep takes them).", labels=["queue"]
        )
        paused = GaugeMetricFamily("echomq_queue_paused", "1 while the queue is paused.", labels=["queue"])
        oldest = GaugeMetricFamily(
            "echomq_queue_oldest_pending_age_seconds",
            "How long the job at the head of the queue has been claimable (0 when none is).",
            labels=["queue"],
        )
        dead_lettered = CounterMetricFamily(
            "echomq_queue_dead_lettered",
            "Jobs the queue ever dead-lettered (the module's count).",
            labels=["queue"],
        )
        shared = {
            name: CounterMetricFamily(
                f"echomq_queue_{name}",
                f"Shared counter '{name}' of the queue's workers and reapers.",
                labels=["queue"],
            )
            for name in proto.COUNTER_FIELDS
        }
        latency = {
            "run": HistogramMetricFamily(
                "echomq_queue_run_seconds",
                "A handler's run, claim to end, as every recording worker added it (server-held).",
                labels=["queue"],
            ),
            "wait": HistogramMetricFamily(
                "echomq_queue_wait_seconds",
                "Enqueue to first claim, sampled, as every recording worker added it (server-held).",
                labels=["queue"],
            ),
        }
        exported = 0
        for queue in self.queues():
            view = self._view(queue)
            if view is None:
                continue
            exported += 1
            c = view.counts
            for state, value in (
                ("pending", c.pending),
                ("delayed", c.delayed),
                ("active", c.active),
                ("dead", c.dead),
            ):
                jobs.add_metric([queue, state], value)
            lapsed.add_metric([queue], c.lapsed)
            paused.add_metric([queue], 1 if c.paused else 0)
            head = view.head
            oldest.add_metric([queue], 0.0 if head is None or head.delayed else head.waiting_ms / 1000)
            dead_lettered.add_metric([queue], view.counters.dead_lettered)
            for name, family in shared.items():
                family.add_metric([queue], getattr(view.counters, name))
            for name, histogram in latency.items():
                held = view.histograms[name]
                histogram.add_metric(
                    [queue], [(_bound(b), n) for b, n in held.buckets], sum_value=held.sum_seconds
                )
        yield from (jobs, lapsed, paused, oldest, dead_lettered, *shared.values(), *latency.values())
        yield GaugeMetricFamily("echomq_exporter_queues", "Queues exported by this scrape.", value=exported)
        yield CounterMetricFamily(
            "echomq_exporter_errors",
            "Failed reads (a queue or a discovery) since the exporter started.",
            value=self.errors,
        )
        yield GaugeMetricFamily(
            "echomq_exporter_scrape_seconds",
            "How long this scrape's reads took.",
            value=time.monotonic() - started,
        )


def _bound(bound: float) -> str:
    """A bucket's ``le`` as Prometheus writes it: ``+Inf``, ``0.005``, ``1.0``."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


class CancelWatch:
    """Measures remote cancels from request to the job ending cancelled, for the exporter.

    EMQ.CANCEL announces a request for a held job on ``<base>cancel``; this
    listens to those channels (PSUBSCRIBE ``emq:{*}:cancel``) from a daemon
    thread, notes the server time of each request, and every ``poll``
    seconds reads the jobs it waits for (``client.job``): a job that ended
    ``cancelled`` gives ``finished_at - request time`` (server clock) to
    ``echomq_cancel_delivery_seconds``.  Every request counts in
    ``echomq_cancels_requested_total`` (pending jobs are cancelled at once,
    unannounced, so they are not counted).  At most ``max_tracked`` requests
    are followed, each for at most ``give_up_after`` seconds; the ``queue``
    label takes only ``queues`` (all when None, at most ``max_queues``).
    """

    def __init__(
        self,
        client: Client,
        registry: CollectorRegistry | None = None,
        *,
        queues: Sequence[str] | None = None,
        max_queues: int = 100,
        poll: float = 0.5,
        max_tracked: int = 10_000,
        give_up_after: float = 3600.0,
    ) -> None:
        reg = REGISTRY if registry is None else registry
        self.client = client
        self.allowed = set(queues) if queues else None
        self.max_queues, self.poll, self.max_tracked, self.give_up_after = (
            max_queues,
            poll,
            max_tracked,
            give_up_after,
        )
        self.requested = Counter(
            "echomq_cancels_requested",
            "Cancels requested for running jobs (EMQ.CANCEL's announcements).",
            ["queue"],
            registry=reg,
        )
        self.delivery = Histogram(
            "echomq_cancel_delivery_seconds",
            "From a cancel's request to its job ending cancelled (server clock): delivery at the holder's "
            "next checkpoint, the handler's stop, and its FAIL or RELEASE.",
            ["queue"],
            buckets=CANCEL_BUCKETS,
            registry=reg,
        )
        self._waiting: dict[tuple[str, str], tuple[int, float]] = {}
        self._labels: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pubsub: Any = None

    def start(self) -> CancelWatch:
        """Subscribe and follow requests in a daemon thread; returns at once."""
        self._pubsub = self.client.redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
        self._pubsub.psubscribe("emq:{*}:cancel")
        self._thread = threading.Thread(target=self._run, name="echomq-cancel-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following; closes the subscription."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._pubsub is not None:
            self._pubsub.close()

    def _queue_label(self, queue: str) -> bool:
        if self.allowed is not None:
            return queue in self.allowed
        if queue in self._labels:
            return True
        if len(self._labels) >= self.max_queues:
            return False
        self._labels.add(queue)
        return True

    def requested_at(self, queue: str, job_id: str, server_ms: int) -> None:
        """Note a request (what a message on ``<base>cancel`` means), at ``server_ms``."""
        if not self._queue_label(queue):
            return
        self.requested.labels(queue).inc()
        if len(self._waiting) < self.max_tracked:
            self._waiting.setdefault((queue, job_id), (server_ms, time.monotonic()))

    def check(self) -> None:
        """Read the jobs waited for; observe those that ended cancelled, forget those that ended otherwise."""
        for (queue, job_id), (asked_ms, noted) in list(self._waiting.items()):
            try:
                info = self.client.job(queue, job_id)
            except Exception as exc:
                log.debug("cancel watch: reading %s failed: %r", job_id, exc)
                continue
            if info is None or info.state in ("done", "dead", "pending"):
                del self._waiting[(queue, job_id)]  # gone, or ended without the cancel taking effect
            elif info.state == "cancelled":
                del self._waiting[(queue, job_id)]
                if info.finished_at is not None:
                    self.delivery.labels(queue).observe(max(0, info.finished_at - asked_ms) / 1000)
            elif time.monotonic() - noted > self.give_up_after:
                del self._waiting[(queue, job_id)]

    def _run(self) -> None:
        next_check = time.monotonic() + self.poll
        while not self._stop.is_set():
            try:
                message = self._pubsub.get_message(timeout=min(self.poll, 0.2))
                if message is not None and message.get("type") == "pmessage":
                    queue = proto.queue_of_key(
                        proto.text(message["channel"]).removesuffix("cancel") + "pending"
                    )
                    if queue is not None:
                        now = proto.server_ms(self.client.redis.time())
                        self.requested_at(queue, proto.text(message["data"]), now)
                if time.monotonic() >= next_check:
                    self.check()
                    next_check = time.monotonic() + self.poll
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("cancel watch: %r (retrying)", exc)
                self._stop.wait(1.0)
                try:
                    self._pubsub.close()
                    self._pubsub = self.client.redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
                    self._pubsub.psubscribe("emq:{*}:cancel")
                except Exception:
                    pass


def exporter_registry(
    client: Client,
    queues: Sequence[str] | None = None,
    *,
    max_queues: int = 100,
    scan_budget: int = 100_000,
    discover_every: float = 30.0,
    cancel_latency: bool = True,
) -> tuple[CollectorRegistry, QueueCollector, CancelWatch | None]:
    """A fresh registry with the queue-level metrics and the cancel watch (started): ``echomq exporter``."""
    registry = CollectorRegistry()
    collector = QueueCollector(
        client, queues, max_queues=max_queues, scan_budget=scan_budget, discover_every=discover_every
    )
    registry.register(collector)
    watch = None
    if cancel_latency:
        watch = CancelWatch(client, registry, queues=queues, max_queues=max_queues).start()
    return registry, collector, watch
