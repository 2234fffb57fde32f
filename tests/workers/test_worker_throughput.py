"""The worker's fast paths (issue 18), each checked for what it must keep, not for speed.

- A remote cancel is pushed: EMQ.CANCEL publishes the id on <base>cancel, the
  worker holding the job listens and checkpoints it at once.  With a lease
  whose checkpoints come every 200 s, a cancel that reaches the handler
  within the test came by the push (the checkpoint path could not have).
- A lost push (the worker's subscription was not there) is still delivered by
  the periodic checkpoint.
- One lease keeper per worker: many jobs in flight start no thread (sync) or
  task (asyncio) each, and every held job's lease is still checkpointed.
- Batched claims and ends together: every job of a burst is completed once,
  by the worker's own count and by the rows.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..helpers import queued

pytestmark = pytest.mark.backends  # once per backend: the scripts publish the cancel too

Q = "fast"
K = queue_keys(Q)
LONG_LEASE_MS = 600_000  # checkpoints every 200 s: only a push delivers a cancel within the test


def wait_until(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.005)
    return False


def test_sync_worker_gets_a_remote_cancel_pushed(client: echomq.Client, r: redis.Redis) -> None:
    started, seen = threading.Event(), []

    def handler(ctx: echomq.JobContext) -> None:
        started.set()
        ctx.cancel.sleep(30)
        seen.append(ctx.check())
        ctx.raise_if_cancelled()

    job_id = client.enqueue(Q, b"x")
    worker = echomq.Worker(client, Q, handler, lease_ms=LONG_LEASE_MS, poll_interval=0.01).start()
    try:
        assert started.wait(10)
        assert wait_until(lambda: r.pubsub_numsub(K.base + "cancel")[0][1] == 1)  # the worker listens
        assert client.cancel(Q, job_id, "user asked") == "requested"
        assert wait_until(lambda: worker.stats.cancelled == 1)
    finally:
        worker.stop(grace=0)
    assert seen == [echomq.Cancellation("user asked")]
    assert r.hget(K.job(job_id), "state") == b"cancelled"
    assert r.pubsub_numsub(K.base + "cancel")[0][1] == 0  # the subscription ends with the worker


def test_async_worker_gets_a_remote_cancel_pushed(r: redis.Redis, server: EmbeddedServer) -> None:
    async def main() -> None:
        client = emq.Client.from_url(server.url)
        started, seen = asyncio.Event(), []

        async def handler(ctx: emq.JobContext) -> None:
            started.set()
            await ctx.cancel.wait()
            seen.append(ctx.check())
            ctx.raise_if_cancelled()

        job_id = await client.enqueue(Q, b"x")
        worker = emq.Worker(client, Q, handler, lease_ms=LONG_LEASE_MS, poll_interval=0.01)
        task = asyncio.create_task(worker.run(handle_signals=False))
        try:
            await asyncio.wait_for(started.wait(), 10)
            for _ in range(1000):
                if r.pubsub_numsub(K.base + "cancel")[0][1] == 1:
                    break
                await asyncio.sleep(0.01)
            assert await client.cancel(Q, job_id, "user asked") == "requested"
            for _ in range(1000):
                if worker.stats.cancelled == 1:
                    break
                await asyncio.sleep(0.01)
        finally:
            worker.stop(grace=0)
            await task
            await client.aclose()
        assert worker.stats.cancelled == 1
        assert seen == [echomq.Cancellation("user asked")]

    asyncio.run(main())
    assert r.pubsub_numsub(K.base + "cancel")[0][1] == 0


def test_a_lost_push_is_delivered_by_the_next_checkpoint(client: echomq.Client, r: redis.Redis) -> None:
    started = threading.Event()

    def handler(ctx: echomq.JobContext) -> None:
        started.set()
        ctx.cancel.sleep(30)
        ctx.raise_if_cancelled()

    job_id = client.enqueue(Q, b"x")
    worker = echomq.Worker(client, Q, handler, lease_ms=3000, extend_interval=0.1, poll_interval=0.01)
    worker._push_cancels = False  # no subscription: pushes are lost
    worker.start()
    try:
        assert started.wait(10)
        assert r.pubsub_numsub(K.base + "cancel")[0][1] == 0
        assert client.cancel(Q, job_id, "late") == "requested"
        assert wait_until(lambda: worker.stats.cancelled == 1)
    finally:
        worker.stop(grace=0)
    assert r.hget(K.job(job_id), "last_error") == b"cancelled: late"


def test_one_keeper_thread_checkpoints_every_held_job(client: echomq.Client, r: redis.Redis) -> None:
    hold = threading.Event()
    running = threading.Semaphore(0)

    def handler(ctx: echomq.JobContext) -> None:
        running.release()
        hold.wait(30)

    ids = [client.enqueue(Q, b"") for _ in range(8)]
    worker = echomq.Worker(client, Q, handler, lease_ms=1500, concurrency=8, poll_interval=0.01)
    before = threading.active_count()
    worker.start()
    try:
        for _ in ids:
            assert running.acquire(timeout=10)
        first = {i: r.zscore(K.active, i) for i in ids}
        # 8 handlers + supervisor + one keeper + the cancel listener + the deadline watch + the
        # worker's sweeps + its schedule driver: no thread per job
        assert threading.active_count() - before <= 8 + 6
        # Every lease moves on (checkpoints every 0.5 s), though no job has a keeper thread of its own.
        assert wait_until(lambda: all((r.zscore(K.active, i) or 0) > (first[i] or 0) for i in ids))
    finally:
        hold.set()
        worker.stop()
    assert worker.stats.completed == 8 and worker.stats.leases_lost == 0


@pytest.mark.parametrize("kind", ["sync-1", "sync-4", "async-10"])
def test_a_burst_is_completed_once_each(
    kind: str, client: echomq.Client, r: redis.Redis, server: EmbeddedServer
) -> None:
    n = 300
    ids = client.enqueue_many(Q, [b"p"] * n)
    calls: list[str] = []
    if kind.startswith("sync"):
        worker = echomq.Worker(
            client,
            Q,
            lambda ctx: calls.append(ctx.id),
            concurrency=int(kind.split("-")[1]),
            poll_interval=0.01,
        ).start()
        try:
            assert wait_until(lambda: worker.stats.completed == n, 60)
        finally:
            worker.stop()
        stats = worker.stats
    else:

        async def main() -> echomq.WorkerStats:
            aclient = emq.Client.from_url(server.url)

            async def handler(ctx: emq.JobContext) -> None:
                calls.append(ctx.id)

            worker = emq.Worker(aclient, Q, handler, concurrency=10, poll_interval=0.01)
            task = asyncio.create_task(worker.run(handle_signals=False))
            for _ in range(6000):
                if worker.stats.completed >= n:
                    break
                await asyncio.sleep(0.01)
            worker.stop()
            await task
            await aclient.aclose()
            return worker.stats

        stats = asyncio.run(main())
    assert stats.completed == n and stats.failed == stats.rejected == stats.leases_lost == 0
    assert sorted(calls) == sorted(ids)  # each job ran once
    assert [r.hget(K.job(i), "state") for i in ids] == [b"done"] * n
    assert r.zcard(K.active) == 0 and queued(r, K) == 0


@pytest.mark.parametrize("driver", ["asyncio", "sync"])
def test_the_worker_packs_its_commands_as_redis_py_does(driver: str) -> None:
    # Packed by hiredis when installed (redis-py's asyncio packer is pure Python), byte for byte
    # what redis-py sends: a command name with a space in it ("COMMAND INFO", the backend probe)
    # is two arguments, or the probe fails and the worker falls back to the scripts.
    import redis
    from redis.asyncio.connection import Connection

    from echomq import _protocol as proto
    from echomq._runtime.tries import pack
    from echomq._scripts import PROBE

    connection = Connection() if driver == "asyncio" else redis.Connection()
    commands = [
        PROBE,
        proto.claim("qé", 30_000, 10, 5000).args,
        proto.complete_claim("q", "j\udcff", "3-00aa", 30_000, 4).args,
        ("SET", "k", 1.5),
    ]
    assert b"".join(pack(connection, commands)) == b"".join(connection.pack_commands(commands))
