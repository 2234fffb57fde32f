"""Prometheus metrics (issue 19): scraped over real HTTP while real workers process jobs on a
real server, and checked against what the queue says (counts equal, counters monotonic)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest
import redis
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import echomq
import echomq.asyncio as emq
from echomq._protocol import counters_key
from echomq.metrics import Metrics, exporter_registry, serve
from echomq.testing import EmbeddedServer

from ..calibration import budget

# Engine-independent (once): the metrics over the client; its verbs are tests/verbs/'s, on every engine.
pytestmark = pytest.mark.once

Q = "metered"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """One real HTTP GET of a /metrics endpoint, parsed: {(sample name, sorted labels): value}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def endpoint() -> Iterator[Callable[[CollectorRegistry], str]]:
    """Serve a registry on a free loopback port; the servers are shut down after the test."""
    servers = []

    def start(registry: CollectorRegistry) -> str:
        server = serve(0, "127.0.0.1", registry)
        servers.append(server)
        host, port = server.server_address[:2]
        return f"http://{host}:{port}/metrics"

    yield start
    for server in servers:
        server.shutdown()


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


Handler = Callable[[echomq.Job, echomq.CancelToken], None]


def handler_failing_on(bad: set[str], delay: float = 0.01) -> Handler:
    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        time.sleep(delay)
        if job.id in bad:
            raise RuntimeError(f"job {job.id} always fails")

    return handler


def test_a_workers_metrics_match_the_queue_while_it_works(
    client: echomq.Client, r: redis.Redis, endpoint: Callable[[CollectorRegistry], str]
) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, flush_interval=0.1)
    url = endpoint(registry)
    ids = [client.enqueue(Q, b"p", job_id=f"j{i:03d}") for i in range(60)]
    bad = {"j007", "j042"}
    worker = echomq.Worker(
        client, Q, handler_failing_on(bad), lease_ms=10_000, max_attempts=2, concurrency=3, metrics=metrics
    )
    seen: list[Samples] = []
    with worker:
        while True:  # scrape while it works: every counter only ever grows
            seen.append(scrape(url))
            counts = client.counts(Q)
            if counts.pending == 0 and counts.active == 0:
                break
            time.sleep(0.02)
    final = scrape(url)
    seen.append(final)
    names = [
        ("echomq_jobs_claimed_total", {"queue": Q}),
        ("echomq_jobs_completed_total", {"queue": Q}),
        ("echomq_jobs_failed_total", {"queue": Q}),
        ("echomq_job_run_seconds_count", {"queue": Q, "outcome": "completed"}),
    ]
    for name, labels in names:
        series = [value(s, name, **labels) for s in seen]
        assert series == sorted(series), f"{name} went down: {series}"
    assert len(seen) >= 3, "the worker finished before the test could scrape it twice"
    counts = client.counts(Q)
    assert counts.dead == len(bad)
    completed = len(ids) - len(bad)
    assert value(final, "echomq_jobs_completed_total", queue=Q) == completed == worker.stats.completed
    assert value(final, "echomq_jobs_claimed_total", queue=Q) == completed + 2 * len(bad)
    assert value(final, "echomq_jobs_failed_total", queue=Q) == 2 * len(bad)
    assert value(final, "echomq_jobs_dead_lettered_total", queue=Q, by="fail") == counts.dead
    assert value(final, "echomq_job_run_seconds_count", queue=Q, outcome="completed") == completed
    assert value(final, "echomq_job_run_seconds_count", queue=Q, outcome="failed") == 2 * len(bad)
    # Every first claim's wait was read from the row (server clock): one observation each.
    assert value(final, "echomq_job_wait_seconds_count", queue=Q) == len(ids)
    # The shared counters in Redis hold the same totals once flushed (stop flushes).
    shared = client.counters(Q)
    assert (shared.claimed, shared.completed, shared.failed) == (completed + 4, completed, 4)
    assert shared.dead_lettered == counts.failed == len(bad)


def test_the_exporter_serves_the_queue_as_the_server_holds_it(
    client: echomq.Client, r: redis.Redis, endpoint: Callable[[CollectorRegistry], str]
) -> None:
    for i in range(5):
        client.enqueue(Q, b"p", job_id=f"p{i}")
    client.enqueue(Q, b"p", job_id="later", delay_ms=60_000)
    held = client.claim(Q, lease_ms=60_000)
    assert held is not None
    client.enqueue(Q, b"p", job_id="doomed")
    r.lrem(f"emq:{{{Q}}}:pending", 1, "doomed")  # to the head, then dead
    r.lpush(f"emq:{{{Q}}}:pending", "doomed")
    doomed = client.claim(Q, lease_ms=60_000)
    assert doomed is not None and doomed.id == "doomed"
    client.fail(Q, doomed.id, doomed.token, "boom", max_attempts=1)
    client.pause(Q)
    r.zadd(f"emq:{{{Q}}}:active", {"lapsed": 1})
    r.hset(counters_key(Q), mapping={"completed": 11, "recovered": 2})
    registry, _collector, watch = exporter_registry(client, [Q], cancel_latency=False)
    assert watch is None
    samples = scrape(endpoint(registry))
    counts = client.counts(Q)
    for state in ("pending", "delayed", "active", "dead"):
        assert value(samples, "echomq_queue_jobs", queue=Q, state=state) == getattr(counts, state), state
    assert (counts.pending, counts.delayed, counts.active, counts.dead) == (4, 1, 2, 1)
    assert value(samples, "echomq_queue_lapsed_jobs", queue=Q) == counts.lapsed == 1
    assert value(samples, "echomq_queue_paused", queue=Q) == 1
    assert value(samples, "echomq_queue_dead_lettered_total", queue=Q) == 1
    assert value(samples, "echomq_queue_completed_total", queue=Q) == 11
    assert value(samples, "echomq_queue_recovered_total", queue=Q) == 2
    assert value(samples, "echomq_exporter_queues") == 1
    age = value(samples, "echomq_queue_oldest_pending_age_seconds", queue=Q)
    head = client.pending(Q, count=1)[0]
    assert 0 <= age <= head.waiting_ms / 1000 + 1
    # No label per job id, ever.
    assert not any(dict(labels).get("job") for (_, labels) in samples)


def test_the_exporter_discovers_queues_and_tracks_a_working_fleet(
    client: echomq.Client, endpoint: Callable[[CollectorRegistry], str]
) -> None:
    for queue in ("alpha", "beta"):
        for i in range(40):
            client.enqueue(queue, b"p", job_id=f"{queue}{i}")
    registry, _, _ = exporter_registry(client, None, discover_every=0.0, cancel_latency=False)
    url = endpoint(registry)
    first = scrape(url)
    assert value(first, "echomq_queue_jobs", queue="alpha", state="pending") == 40
    assert value(first, "echomq_exporter_queues") == 2
    metrics = Metrics(CollectorRegistry(), flush_interval=0.05)
    workers = [
        echomq.Worker(client, queue, handler_failing_on(set(), 0.005), concurrency=2, metrics=metrics)
        for queue in ("alpha", "beta")
    ]
    history = []
    for w in workers:
        w.start()
    try:
        while True:
            history.append(scrape(url))
            if all(client.counts(q).pending + client.counts(q).active == 0 for q in ("alpha", "beta")):
                break
            time.sleep(0.03)
    finally:
        for w in workers:
            w.stop()
    history.append(scrape(url))
    for queue in ("alpha", "beta"):
        completed = [value(s, "echomq_queue_completed_total", queue=queue) for s in history]
        assert completed == sorted(completed), completed
        assert completed[-1] == 40
        pending = [value(s, "echomq_queue_jobs", queue=queue, state="pending") for s in history]
        assert pending[-1] == 0 and pending == sorted(pending, reverse=True)


def test_cancels_are_counted_and_timed_from_request_to_the_job_ending_cancelled(
    client: echomq.Client, r: redis.Redis, endpoint: Callable[[CollectorRegistry], str]
) -> None:
    worker_registry = CollectorRegistry()
    metrics = Metrics(worker_registry)
    registry, _collector, watch = exporter_registry(client, [Q])
    assert watch is not None
    try:
        url, worker_url = endpoint(registry), endpoint(worker_registry)
        started = threading.Event()

        def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
            started.set()
            while not cancel.sleep(0.01):
                pass
            cancel.raise_if_cancelled()

        client.enqueue(Q, b"p", job_id="long")
        with echomq.Worker(client, Q, handler, lease_ms=600, metrics=metrics):  # checkpoints every 200 ms
            assert started.wait(10)
            time.sleep(0.05)
            assert client.cancel(Q, "long", "operator") == "requested"
            wait_until(lambda: (info := client.job(Q, "long")) is not None and info.state == "cancelled")
        wait_until(
            lambda: value(scrape(url), "echomq_cancel_delivery_seconds_count", queue=Q) == 1, what="the watch"
        )
        samples, worker_samples = scrape(url), scrape(worker_url)
        assert value(samples, "echomq_cancels_requested_total", queue=Q) == 1
        latency = value(samples, "echomq_cancel_delivery_seconds_sum", queue=Q)
        # pushed (<base>cancel): often within the same server millisecond, so 0 is a
        # measurement too; never more than one checkpoint interval, plus the stop
        assert 0 <= latency < budget(0.6 + 0.5), latency
        assert value(worker_samples, "echomq_cancels_delivered_total", queue=Q) == 1
        assert value(worker_samples, "echomq_cancel_stop_seconds_count", queue=Q) == 1
        assert value(worker_samples, "echomq_jobs_cancelled_total", queue=Q, by="worker") == 1
        assert value(worker_samples, "echomq_job_run_seconds_count", queue=Q, outcome="cancelled") == 1
    finally:
        watch.stop()


def test_lost_leases_and_sweeps_are_counted_by_reason(
    client: echomq.Client, r: redis.Redis, endpoint: Callable[[CollectorRegistry], str]
) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, flush_interval=0.05)
    url = endpoint(registry)
    started = threading.Event()

    def stuck(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        started.set()
        cancel.sleep(5)

    client.enqueue(Q, b"p", job_id="stolen")
    with echomq.Worker(client, Q, stuck, lease_ms=300, metrics=metrics) as worker:
        assert started.wait(10)
        r.hset(f"emq:{{{Q}}}:job:stolen", "token", "someone-else")  # the next checkpoint is stale
        wait_until(lambda: worker.stats.leases_lost == 1, what="the lost lease")
    samples = scrape(url)
    assert value(samples, "echomq_leases_lost_total", queue=Q, reason="stale") == 1
    assert value(samples, "echomq_job_run_seconds_count", queue=Q, outcome="lost") == 1
    # The reaper's view: a lapsed lease recovered.
    r.zadd(f"emq:{{{Q}}}:active", {"stolen": 1})
    with echomq.Reaper(client, Q, interval=0.05, max_stalled=3, metrics=metrics) as reaper:
        wait_until(lambda: reaper.recovered == 1, what="the sweep")
    metrics.flush()
    assert value(scrape(url), "echomq_jobs_recovered_total", queue=Q) == 1
    assert client.counters(Q).recovered == 1 and client.counters(Q).lease_lost == 1


def test_an_asyncio_worker_counts_the_same(server: EmbeddedServer, client: echomq.Client) -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry, redis=server.url)
    for i in range(20):
        client.enqueue(Q, b"p", job_id=f"a{i}")

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        await asyncio.sleep(0.001)
        if job.id == "a3":
            raise ValueError("no")

    async def scenario() -> None:
        aclient = emq.Client.from_url(server.url)
        try:
            async with emq.Worker(aclient, Q, handler, max_attempts=1, concurrency=4, metrics=metrics):
                while (await aclient.counts(Q)).pending + (await aclient.counts(Q)).active:
                    await asyncio.sleep(0.02)
        finally:
            await aclient.aclose()

    asyncio.run(scenario())
    metrics.flush()
    assert registry.get_sample_value("echomq_jobs_completed_total", {"queue": Q}) == 19
    assert registry.get_sample_value("echomq_jobs_dead_lettered_total", {"queue": Q, "by": "fail"}) == 1
    assert registry.get_sample_value("echomq_job_wait_seconds_count", {"queue": Q}) == 20
    assert client.counters(Q).completed == 19


def test_an_asyncio_worker_lends_its_server_to_the_shared_counters(
    server: EmbeddedServer, client: echomq.Client
) -> None:
    metrics = Metrics(CollectorRegistry(), flush_interval=0.05)
    client.enqueue(Q, b"p")

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        return None

    async def scenario() -> None:
        aclient = emq.Client.from_url(server.url)
        try:
            async with emq.Worker(aclient, Q, handler, metrics=metrics):
                while (await aclient.counts(Q)).pending + (await aclient.counts(Q)).active:
                    await asyncio.sleep(0.02)
        finally:
            await aclient.aclose()

    asyncio.run(scenario())
    wait_until(lambda: client.counters(Q).completed == 1, what="the flush")


def test_one_metrics_per_registry_says_so() -> None:
    registry = CollectorRegistry()
    Metrics(registry, share=False)
    with pytest.raises(ValueError, match=r"one echomq\.metrics\.Metrics per registry"):
        Metrics(registry, share=False)
    with pytest.raises(ValueError):
        Metrics(CollectorRegistry(), wait_sample=2)


def test_echomq_exporter_runs_as_a_command(server: EmbeddedServer, client: echomq.Client) -> None:
    client.enqueue("cli-q", b"p")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq", "--url", server.url, "exporter", "--port", "0", "--duration", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"(http://\S+/metrics)", line)
        assert match, line
        samples = scrape(match.group(1))
        assert value(samples, "echomq_queue_jobs", queue="cli-q", state="pending") == 1
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""


def test_the_exporter_serves_queue_level_run_and_wait_histograms_every_worker_added(
    client: echomq.Client, endpoint: Callable[[CollectorRegistry], str]
) -> None:
    # Issue 42: the run and wait histograms lived on each worker's own port; the server now holds
    # them per queue, added to by every recording worker (here two in-process ones), for the exporter.
    for i in range(12):
        client.enqueue(Q, b"p", job_id=f"h{i}")
    workers = [
        echomq.Worker(client, Q, handler_failing_on(set(), delay=0.02), poll_interval=0.02,
                      metrics=Metrics(registry=CollectorRegistry(), wait_sample=1.0, flush_interval=0.05))
        for _ in range(2)
    ]  # fmt: skip
    for w in workers:
        w.start()
    try:
        wait_until(lambda: client.counts(Q).pending == 0 and client.counts(Q).active == 0, what="drained")
    finally:
        for w in workers:
            w.stop()
    registry, _collector, _ = exporter_registry(client, [Q], cancel_latency=False)
    samples = scrape(endpoint(registry))
    assert value(samples, "echomq_queue_run_seconds_count", queue=Q) == 12
    assert value(samples, "echomq_queue_run_seconds_bucket", queue=Q, le="0.01") == 0  # each ran >= 20 ms
    assert value(samples, "echomq_queue_run_seconds_bucket", queue=Q, le="+Inf") == 12
    assert 12 * 0.02 <= value(samples, "echomq_queue_run_seconds_sum", queue=Q) < 12 * 5
    assert value(samples, "echomq_queue_wait_seconds_count", queue=Q) == 12  # every first claim sampled
    buckets = [n for (name, labels), n in samples.items() if name == "echomq_queue_wait_seconds_bucket"]
    assert buckets == sorted(buckets)  # cumulative, as Prometheus reads them
