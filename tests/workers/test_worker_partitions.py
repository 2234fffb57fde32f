"""Issue 47: workers of a partitioned queue on a 3-master Redis Cluster: 9 partitions, every job
done exactly once by sync and asyncio workers together, each master holding a third of them, and
an idle worker's EMQ command rate (INFO commandstats deltas, summed over the masters)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..clusters import flush, owner, start_cluster
from ..conftest import ServerFactory
from ..faults import wait_until

pytestmark = pytest.mark.slow

Q = "ingest"
K = 9
# make partitions-long runs the 30,000; the suite 3,000.
JOBS = int(os.environ.get("ECHOMQ_PARTITION_JOBS", "3000"))


@pytest.fixture(scope="module")
def nodes(server_factory: ServerFactory) -> Iterator[list[EmbeddedServer]]:
    started = start_cluster(server_factory, 3)
    try:
        yield started
    finally:
        for n in started:
            n.stop()


def commands(nodes: list[EmbeddedServer]) -> Counter[str]:
    """Commands the masters served so far, by name, INFO's own excluded."""
    total: Counter[str] = Counter()
    for node in nodes:
        c = node.client()
        try:
            stats = c.info("commandstats")
        finally:
            c.close()
        total.update({k: int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info"})
    return total


def test_sync_and_asyncio_workers_run_every_job_once_across_nine_partitions(
    nodes: list[EmbeddedServer],
) -> None:
    flush(nodes)
    client = echomq.Client.from_url(nodes[0].url, cluster=True)
    client.declare_queue(Q, partitions=K)
    ids = []
    for start in range(0, JOBS, 10_000):
        ids += client.enqueue_many(Q, [f"{i}".encode() for i in range(start, min(JOBS, start + 10_000))])
    assert len(set(ids)) == JOBS
    per_master: Counter[int] = Counter()
    for name in client.partitions(Q):
        per_master[owner(nodes, queue_keys(name).pending).port] += client.counts(name).pending
    assert sum(per_master.values()) == JOBS
    assert all(abs(n / JOBS - 1 / 3) <= 0.10 for n in per_master.values()), per_master

    done: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(ctx: echomq.JobContext) -> None:
        with lock:
            done[ctx.id] += 1

    async def ahandler(ctx: emq.JobContext) -> None:
        with lock:
            done[ctx.id] += 1

    async def aworkers() -> None:
        aclient = emq.Client.from_url(nodes[1].url, cluster=True)
        aworker = emq.Worker(aclient, Q, ahandler, concurrency=4, poll_interval=0.05)
        task = asyncio.create_task(aworker.run(handle_signals=False))
        for _ in range(6000):
            if sum(done.values()) >= JOBS:
                break
            await asyncio.sleep(0.05)
        aworker.stop()
        await task
        assert aworker.stats.completed > 0
        await aclient.aclose()

    worker = echomq.Worker(client, Q, handler, concurrency=4, poll_interval=0.05)
    with worker:
        asyncio.run(aworkers())
        assert wait_until(lambda: sum(done.values()) >= JOBS, timeout=300), sum(done.values())
    assert worker.stats.completed > 0
    assert len(done) == JOBS and set(done.values()) == {1}, Counter(done.values())
    assert set(done) == set(ids)
    for name in client.partitions(Q):
        counts = client.counts(name)
        assert (counts.pending, counts.active) == (0, 0), (name, counts)
    client.close()


def test_an_idle_worker_is_quiet(nodes: list[EmbeddedServer]) -> None:
    flush(nodes)
    client = echomq.Client.from_url(nodes[0].url, cluster=True)
    client.declare_queue(Q, partitions=K)
    got: list[str] = []
    worker = echomq.Worker(client, Q, lambda ctx: got.append(ctx.id))
    with worker:
        time.sleep(3)  # started, its first claims sent
        before = commands(nodes)
        started = time.monotonic()
        time.sleep(12)
        delta = commands(nodes) - before
        # the claims and sweeps over the 9 partitions (the cancel listener's and the schedule
        # driver's reads of the logical name are the worker's as on any queue: not counted here)
        rate = sum(n for name, n in delta.items() if name.startswith("cmdstat_emq.")) / (
            time.monotonic() - started
        )
        # a job is still claimed while it idles: within one rotation of waits
        job_id = client.enqueue(Q, b"late")
        assert wait_until(lambda: got == [job_id], timeout=60), got
    client.close()
    assert rate <= 0.5, (rate, delta)
