"""A thread worker's prefetch (issue 34): jobs claimed before a thread is free, their leases kept
while they wait, given back unrun when the worker stops.

``Worker(..., prefetch=N)`` is off by default.  Each test fails on the code
before issue 34, which had no ``prefetch``.
"""

from __future__ import annotations

import asyncio
import threading

import redis

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..faults import wait_until

Q = "prefetch"
K = queue_keys(Q)


def states(r: redis.Redis, ids: list[str]) -> list[str]:
    return [(r.hget(K.job(i), "state") or b"").decode() for i in ids]


def test_prefetched_jobs_are_held_and_their_leases_kept_while_they_wait(
    r: redis.Redis, client: echomq.Client
) -> None:
    ids = client.enqueue_many(Q, [(f"j{n}", b"") for n in range(3)])
    go = threading.Event()

    def handler(ctx: echomq.JobContext) -> None:
        go.wait(10)

    worker = echomq.Worker(client, Q, handler, concurrency=1, prefetch=2, lease_ms=600, reap=False)
    with worker:
        assert wait_until(lambda: r.zcard(K.active) == 3)  # one running, two waiting for the thread
        first = {i: r.zscore(K.active, i) for i in ids}
        # Three leases' worth: the waiting jobs' leases are checkpointed like the running one's.
        assert wait_until(lambda: all((r.zscore(K.active, i) or 0) > (first[i] or 0) for i in ids))
        threading.Event().wait(1.0)
        assert client.sweep(Q, max_stalled=3).recovered == []  # none lapsed
        go.set()
        assert wait_until(lambda: states(r, ids) == ["done"] * 3)
    assert worker.stats.completed == 3 and worker.stats.leases_lost == 0


def test_a_stop_gives_the_prefetched_jobs_back_unrun(r: redis.Redis, client: echomq.Client) -> None:
    ids = client.enqueue_many(Q, [(f"j{n}", b"") for n in range(4)])
    started, go = threading.Event(), threading.Event()
    ran: list[str] = []

    def handler(ctx: echomq.JobContext) -> None:
        ran.append(ctx.id)
        started.set()
        go.wait(10)

    worker = echomq.Worker(client, Q, handler, concurrency=1, prefetch=3, reap=False).start()
    assert started.wait(10) and wait_until(lambda: r.zcard(K.active) == 4)
    stopper = threading.Thread(target=worker.stop, kwargs={"grace": 10})
    stopper.start()
    # The running handler gets its grace; the three waiting jobs are given back at once.
    assert wait_until(lambda: worker.stats.released == 3)
    go.set()
    stopper.join(10)
    assert ran == ["j0"]
    assert states(r, ids) == ["done", "pending", "pending", "pending"]
    assert [r.hget(K.job(i), "tries") for i in ids[1:]] == [b"0"] * 3  # no try used
    assert r.zcard(K.active) == 0


def test_asyncio_prefetched_jobs_keep_their_leases_and_a_stop_gives_them_back(server: EmbeddedServer) -> None:
    r = server.client()
    r.flushall()
    ids = echomq.Client(r).enqueue_many(Q, [(f"j{n}", b"") for n in range(4)])
    ran: list[str] = []

    async def main() -> echomq.WorkerStats:
        go = asyncio.Event()

        async def handler(ctx: emq.JobContext) -> None:
            ran.append(ctx.id)
            await go.wait()

        client = emq.Client(redis.asyncio.Redis(port=server.port))
        worker = emq.Worker(client, Q, handler, concurrency=1, prefetch=3, lease_ms=600, reap=False)
        task = asyncio.create_task(worker.run(handle_signals=False))
        while r.zcard(K.active) < 4:
            await asyncio.sleep(0.01)
        first = {i: r.zscore(K.active, i) for i in ids}
        await asyncio.sleep(1.0)  # more than a lease: the waiting jobs' leases are kept too
        assert all((r.zscore(K.active, i) or 0) > (first[i] or 0) for i in ids)
        worker.stop(grace=10)
        while worker.stats.released < 3:  # given back at once, not after the running handler
            await asyncio.sleep(0.01)
        go.set()
        await task
        await client.aclose()
        return worker.stats

    stats = asyncio.run(main())
    assert ran == ["j0"] and stats.completed == 1 and stats.released == 3 and stats.leases_lost == 0
    assert states(r, ids) == ["done", "pending", "pending", "pending"]
    assert r.zcard(K.active) == 0
