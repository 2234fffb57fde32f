"""Issue 47: workers of a partitioned queue on a 3-master Redis Cluster: 9 partitions, every job
done exactly once by sync and asyncio workers together, each master holding a third of them, and
an idle worker's EMQ command rate (INFO commandstats deltas, summed over the masters)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import zlib
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


def key_for(index: int) -> str:
    """A partition_key that routes to partition ``index`` (crc32 mod K: docs/concepts/partitions.md)."""
    return next(f"k{n}" for n in range(10_000) if zlib.crc32(f"k{n}".encode()) % K == index)


def emq_calls(delta: Counter[str]) -> int:
    return sum(n for name, n in delta.items() if name.startswith("cmdstat_emq."))


def test_an_idle_worker_is_quiet_and_woken(nodes: list[EmbeddedServer]) -> None:
    flush(nodes)
    client = echomq.Client.from_url(nodes[0].url, cluster=True)
    client.declare_queue(Q, partitions=K)
    got: list[str] = []
    worker = echomq.Worker(client, Q, lambda ctx: got.append(ctx.id))
    with worker:
        state = worker._partition_wakes.state
        # subscribed to the wakes, and once around the partitions since: now it only waits
        assert wait_until(lambda: state.subscribed and state.empties >= K, timeout=60)
        before = commands(nodes)
        started = time.monotonic()
        time.sleep(12)
        delta = commands(nodes) - before
        # the claims and sweeps over the 9 partitions (the cancel listener's and the schedule
        # driver's reads of the logical name are the worker's as on any queue: not counted here)
        rate = emq_calls(delta) / (time.monotonic() - started)
        # a job in the partition the rotation just left wakes it: claimed by the next claim, not
        # by the rotation coming round again (K - 1 claims, one per 5 s)
        claims = []
        for _ in range(3):
            assert wait_until(lambda: state.subscribed and state.empties >= K, timeout=60)
            behind = (worker._partition_rotation.at - 1) % K
            before = commands(nodes)
            job_id = client.enqueue(Q, b"late", partition_key=key_for(behind))
            assert wait_until(lambda: job_id in got, timeout=60), got  # noqa: B023 (used at once)
            claims.append((commands(nodes) - before)["cmdstat_emq.claim"])
    client.close()
    assert rate <= 0.5, (rate, delta)
    # the wake's claim, then the ones after the job (with its end, the next idle one); the rotation
    # would take K - 1 = 8 before the job
    assert max(claims) <= 3, claims


def test_an_idle_asyncio_worker_is_quiet_and_woken(nodes: list[EmbeddedServer]) -> None:
    flush(nodes)
    producer = echomq.Client.from_url(nodes[0].url, cluster=True)
    producer.declare_queue(Q, partitions=K)
    got: list[str] = []

    async def handler(ctx: emq.JobContext) -> None:
        got.append(ctx.id)

    async def scenario() -> tuple[float, Counter[str], list[int]]:
        client = emq.Client.from_url(nodes[1].url, cluster=True)
        worker = emq.Worker(client, Q, handler)
        task = asyncio.create_task(worker.run(handle_signals=False))
        try:
            for _ in range(600):
                wakes = getattr(worker, "_partition_wakes", None)
                if wakes is not None and wakes.state.subscribed and wakes.state.empties >= K:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the asyncio worker never went idle on its wakes")
            before = commands(nodes)
            started = time.monotonic()
            await asyncio.sleep(12)
            delta = commands(nodes) - before
            rate = emq_calls(delta) / (time.monotonic() - started)
            claims = []
            for _ in range(3):
                for _ in range(600):
                    if wakes.state.subscribed and wakes.state.empties >= K:
                        break
                    await asyncio.sleep(0.1)
                behind = (worker._partition_rotation.at - 1) % K
                before = commands(nodes)
                job_id = producer.enqueue(Q, b"late", partition_key=key_for(behind))
                for _ in range(600):
                    if job_id in got:
                        break
                    await asyncio.sleep(0.1)
                assert job_id in got, got
                claims.append((commands(nodes) - before)["cmdstat_emq.claim"])
        finally:
            worker.stop()
            await task
            await client.aclose()
        return rate, delta, claims

    rate, delta, claims = asyncio.run(scenario())
    producer.close()
    assert rate <= 0.5, (rate, delta)
    assert max(claims) <= 3, claims  # as for the thread worker


@pytest.mark.backends
def test_a_partitioned_queue_on_one_server_with_either_backend(client: echomq.Client) -> None:
    # One server holds every partition: the same calls, a worker claims across them (its idle
    # claims never wait on the server, so the scripts backend's work the same).
    client.redis.flushall()
    client.declare_queue("one-server", partitions=4)
    ids = client.enqueue_many("one-server", [b""] * 200)
    done: Counter[str] = Counter()
    worker = echomq.Worker(client, "one-server", lambda ctx: done.update([ctx.id]), poll_interval=0.02)
    with worker:
        assert wait_until(lambda: len(done) == 200, timeout=120), len(done)
        late = client.enqueue("one-server", b"late")  # after the worker idled: a wake or the rotation
        assert wait_until(lambda: late in done, timeout=60)
    assert set(done) == {*ids, late} and set(done.values()) == {1}
    assert all(client.counts(name).pending == 0 for name in client.partitions("one-server"))


def test_a_cancel_is_pushed_to_the_running_job_of_any_partition(nodes: list[EmbeddedServer]) -> None:
    # A lease of 10 minutes checkpoints every 200 s: within the test only a push delivers.
    flush(nodes)
    client = echomq.Client.from_url(nodes[0].url, cluster=True)
    client.declare_queue(Q, partitions=K)
    started, seen = threading.Event(), []

    def handler(ctx: echomq.JobContext) -> None:
        started.set()
        ctx.cancel.sleep(60)
        seen.append(ctx.check())
        ctx.raise_if_cancelled()

    worker = echomq.Worker(client, Q, handler, lease_ms=600_000, poll_interval=0.02).start()
    try:
        job_id = client.enqueue(Q, b"x", partition_key="somewhere")
        assert started.wait(60)
        assert client.cancel(Q, job_id, "user asked") == "requested"
        assert wait_until(lambda: worker.stats.cancelled == 1, timeout=30), worker.stats
    finally:
        worker.stop(grace=0)
    client.close()
    assert seen == [echomq.Cancellation("user asked")]

    async def aio() -> None:
        aclient = emq.Client.from_url(nodes[1].url, cluster=True)
        astarted, aseen = asyncio.Event(), []

        async def ahandler(ctx: emq.JobContext) -> None:
            astarted.set()
            await asyncio.wait_for(ctx.cancel.wait(), 60)
            aseen.append(ctx.check())
            ctx.raise_if_cancelled()

        aworker = emq.Worker(aclient, Q, ahandler, lease_ms=600_000, poll_interval=0.02)
        task = asyncio.create_task(aworker.run(handle_signals=False))
        try:
            job_id = await aclient.enqueue(Q, b"y", partition_key="elsewhere")
            await asyncio.wait_for(astarted.wait(), 60)
            assert await aclient.cancel(Q, job_id, "again") == "requested"
            for _ in range(600):
                if aworker.stats.cancelled == 1:
                    break
                await asyncio.sleep(0.05)
            assert aworker.stats.cancelled == 1, aworker.stats
        finally:
            aworker.stop()
            await task
            await aclient.aclose()
        assert aseen == [echomq.Cancellation("again")]

    asyncio.run(aio())
