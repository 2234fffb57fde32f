"""The workers on the claim path: an idle claim waits on the server (EMQ.CLAIM ... BLOCK), and a failed
job is retried after its RetryPolicy's delay (EMQ.FAIL ... DELAY).  Sync and asyncio alike."""

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

from ..calibration import budget
from ..faults import wait_until

Q = "claimpath"
K = queue_keys(Q)


def test_an_idle_thread_worker_claims_a_new_job_at_once(r: redis.Redis, client: echomq.Client) -> None:
    started: list[float] = []
    # poll_interval 3 s: a polling worker would see the job up to 3 s late.
    worker = echomq.Worker(client, Q, lambda ctx: started.append(time.monotonic()), poll_interval=3.0)
    with worker:
        time.sleep(0.3)  # idle, its claim waiting on the server
        enqueued = time.monotonic()
        client.enqueue(Q, b"", job_id="J")
        assert wait_until(lambda: bool(started), timeout=5)
        worker.stop(grace=5)
    assert started[0] - enqueued < budget(0.5, under=3.0)
    assert r.hget(K.job("J"), "state") == b"done"


def test_an_idle_asyncio_worker_claims_a_new_job_at_once(r: redis.Redis, server: EmbeddedServer) -> None:
    started: list[float] = []

    async def handler(ctx: emq.JobContext) -> None:
        started.append(time.monotonic())

    async def main() -> float:
        client = emq.Client.from_url(server.url)
        worker = emq.Worker(client, Q, handler, poll_interval=3.0)
        task = asyncio.create_task(worker.run(handle_signals=False))
        await asyncio.sleep(0.3)
        enqueued = time.monotonic()
        await client.enqueue(Q, b"", job_id="A")
        for _ in range(500):
            if started:
                break
            await asyncio.sleep(0.01)
        worker.stop()
        await task
        await client.aclose()
        return enqueued

    enqueued = asyncio.run(main())
    assert started and started[0] - enqueued < budget(0.5, under=3.0)
    assert r.hget(K.job("A"), "state") == b"done"


def test_a_failed_job_is_retried_after_the_retry_policys_delay(r: redis.Redis, client: echomq.Client) -> None:
    runs: list[float] = []
    lock = threading.Lock()

    def handler(ctx: echomq.JobContext) -> None:
        with lock:
            runs.append(time.monotonic())
        if ctx.attempt == 1:
            raise RuntimeError("first run fails")

    client.enqueue(Q, b"", job_id="R")
    policy = echomq.RetryPolicy.fixed(600, max_attempts=2)
    worker = echomq.Worker(client, Q, handler, retry=policy, poll_interval=0.05)
    assert worker.max_attempts == 2
    with worker:
        assert wait_until(lambda: worker.stats.completed == 1, timeout=10)
    assert len(runs) == 2 and runs[1] - runs[0] >= 0.55  # claimable again only after the delay
    row = r.hgetall(K.job("R"))
    assert row[b"state"] == b"done" and row[b"last_error"] == b"RuntimeError: first run fails"


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_retry_settings_are_checked(kind: str) -> None:
    module = echomq if kind == "sync" else emq
    client = echomq.Client(redis.Redis()) if kind == "sync" else emq.Client(redis.asyncio.Redis())

    async def ahandler(ctx: emq.JobContext) -> None:
        return None

    handler = (lambda ctx: None) if kind == "sync" else ahandler
    with pytest.raises(TypeError, match="retry"):
        module.Worker(client, Q, handler, retry=5)
    with pytest.raises(ValueError, match="max_attempts"):
        module.Worker(client, Q, handler, max_attempts=7, retry=echomq.RetryPolicy(max_attempts=2))
    assert module.Worker(client, Q, handler, retry=echomq.RetryPolicy(max_attempts=9)).max_attempts == 9
