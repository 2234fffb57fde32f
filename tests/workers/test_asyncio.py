"""echomq.asyncio against a real server (each test drives its own event loop)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..helpers import assert_token, forged_token, now_ms, put_active

pytestmark = pytest.mark.backends  # tests on the shared server: once per backend

Q = "aio"
K = queue_keys(Q)


def run(server: EmbeddedServer, body: Callable[[emq.Client], Awaitable[None]]) -> None:
    async def main() -> None:
        client = emq.Client.from_url(server.url)
        try:
            await body(client)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_same_contract_as_the_sync_client(r: redis.Redis, server: EmbeddedServer) -> None:
    async def body(client: emq.Client) -> None:
        await client.enqueue(Q, b"data", job_id="a")
        job = await client.claim(Q, lease_ms=5000)
        assert job is not None
        token = assert_token(job.token, attempts=1)
        assert job == echomq.Job(Q, "a", token, b"data", attempt=1, resume_state=None)
        await client.extend(Q, "a", token, 10_000)
        assert await client.checkpoint(Q, "a", token, 10_000) is None
        with pytest.raises(echomq.StaleToken):  # the same claim number, another random part
            await client.extend(Q, "a", forged_token(token), 10_000)
        with pytest.raises(TypeError):  # tokens are the strings claims hand out
            await client.extend(Q, "a", 1, 10_000)  # type: ignore[arg-type]
        with pytest.raises(echomq.JobGone):
            await client.complete(Q, "nope", token)
        assert await client.cancel(Q, "a", "why") == "requested"
        c = await client.checkpoint(Q, "a", token, 10_000)
        assert c is not None and c.reason == "why"
        assert await client.fail(Q, "a", token, "Cancelled: why") == "cancelled"
        put_active(r, Q, "lapsed", attempts=1, deadline=0)
        assert await client.sweep(Q, max_stalled=2) == echomq.SweepResult(["lapsed"], [], [], 0)
        again = await client.claim(Q, lease_ms=100)
        assert again is not None and again.id == "lapsed"
        assert_token(again.token, attempts=2)
        await client.enqueue(Q, b"x", job_id="b")
        await client.enqueue(Q, b"y", job_id="c")
        many = await client.claim_many(Q, lease_ms=100, count=5)
        assert [(j.id, j.payload, j.attempt) for j in many] == [("b", b"x", 1), ("c", b"y", 1)]
        assert await client.claim_many(Q, lease_ms=100, count=5) == []
        assert await client.claim(Q, lease_ms=100) is None
        with pytest.raises(echomq.JobExists):
            await client.enqueue(Q, job_id="a")
        with pytest.raises(ValueError):
            await client.sweep("bad{q")

    run(server, body)


def test_module_not_loaded(server_factory: ServerFactory) -> None:
    bare = server_factory(load_module=False)

    async def main() -> None:
        forced = emq.Client.from_url(bare.url, backend="module")
        auto = emq.Client.from_url(bare.url)
        try:
            assert forced.backend == "module"
            with pytest.raises(echomq.ModuleNotLoaded):
                await forced.sweep(Q)
            # Not asked yet: the property asks itself, on a connection of its own (issue 30: it raised).
            assert auto.backend == "scripts"
            assert await auto.sweep(Q) == echomq.SweepResult()  # auto: the scripts
            assert auto.backend == "scripts" and await auto.detect_backend() == "scripts"
        finally:
            await forced.aclose()
            await auto.aclose()

    asyncio.run(main())


def test_cancel_token_can_be_awaited_and_cancelled_from_a_thread() -> None:
    token = echomq.CancelToken()

    async def main() -> echomq.Cancellation:
        threading.Timer(0.05, token.cancel, args=("from a thread",)).start()
        return await asyncio.wait_for(token.wait(), timeout=10)

    c = asyncio.run(main())
    assert c.reason == "from a thread"
    assert token.check() is c  # the O(1) check sees the same cancellation

    async def already() -> echomq.Cancellation:
        return await token.wait()

    assert asyncio.run(already()).reason == "from a thread"


def test_wait_abandoned_by_timeout_leaves_no_waiter() -> None:
    token = echomq.CancelToken()

    async def main() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(token.wait(), timeout=0.01)

    asyncio.run(main())
    assert token.cancel("later") is True  # no stale future to resolve on a closed loop


def test_async_keeper_checkpoints_and_detects_loss(r: redis.Redis, server: EmbeddedServer) -> None:
    async def body(client: emq.Client) -> None:
        await client.enqueue(Q, job_id="j")
        job = await client.claim(Q, lease_ms=300)
        assert job is not None
        token = echomq.CancelToken()
        async with emq.LeaseKeeper(client, job, 300, token, interval=0.05) as keeper:
            await asyncio.sleep(0.6)
            assert (r.zscore(K.active, "j") or 0) > now_ms(r)
            for _ in range(50):  # the keeper may re-score the job between the two: lapse it again
                r.zadd(K.active, {"j": 0})
                if (await client.sweep(Q, max_stalled=5)).recovered == ["j"]:
                    break
            else:
                raise AssertionError("the keeper re-scored the job before every sweep")
            c = await asyncio.wait_for(token.wait(), timeout=10)
        assert keeper.extends >= 3
        assert "stale" in str(c.reason) and keeper.lost == c.reason

    run(server, body)


def test_async_keeper_deadline_when_the_server_dies(server_factory: ServerFactory, backend: str) -> None:
    server = server_factory(load_module=backend == "module")

    async def body(client: emq.Client) -> None:
        await client.enqueue(Q, job_id="j")
        started = asyncio.get_running_loop().time()
        job = await client.claim(Q, lease_ms=400)
        assert job is not None
        token = echomq.CancelToken()
        async with emq.LeaseKeeper(client, job, 400, token, interval=0.1, claimed_at=started):
            server.stop()
            c = await asyncio.wait_for(token.wait(), timeout=10)
            assert asyncio.get_running_loop().time() >= started + 0.4
        assert "deadline" in str(c.reason)

    run(server, body)


def test_async_worker_and_reaper(r: redis.Redis, server: EmbeddedServer) -> None:
    async def body(client: emq.Client) -> None:
        for i in range(15):
            await client.enqueue(Q, f"{i}", job_id=f"j{i:02}")
        await client.enqueue(Q, "boom", job_id="bad")
        put_active(r, Q, "orphan", attempts=1, deadline=0)
        seen: list[str] = []

        async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
            if job.payload == b"boom":
                raise RuntimeError("boom")
            await asyncio.sleep(0.01)
            seen.append(job.id)

        worker = emq.Worker(
            client, Q, handler, lease_ms=5000, max_attempts=2, concurrency=4, poll_interval=0.01
        )
        async with emq.Reaper(client, Q, interval=0.05, max_stalled=3) as reaper:
            task = asyncio.create_task(worker.run())
            deadline = time.monotonic() + 20
            while worker.stats.completed < 16 or worker.stats.failed < 2:
                assert time.monotonic() < deadline, worker.stats
                await asyncio.sleep(0.02)
            worker.stop()
            await task
        assert reaper.recovered == 1
        assert sorted(seen) == sorted([f"j{i:02}" for i in range(15)] + ["orphan"])
        assert r.hget(K.job("bad"), "state") == b"dead"
        assert r.hget(K.job("bad"), "last_error") == b"RuntimeError: boom"

    run(server, body)


def test_async_worker_remote_cancel_and_shutdown(r: redis.Redis, server: EmbeddedServer) -> None:
    async def body(client: emq.Client) -> None:
        await client.enqueue(Q, job_id="remote")
        await client.enqueue(Q, job_id="shutdown")
        reasons: dict[str, str | None] = {}
        both_running = asyncio.Event()

        async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
            reasons[job.id] = "running"
            if len(reasons) == 2:
                both_running.set()
            c = await cancel.wait()
            reasons[job.id] = c.reason
            cancel.raise_if_cancelled()

        worker = emq.Worker(client, Q, handler, lease_ms=600, concurrency=2, poll_interval=0.01)
        task = asyncio.create_task(worker.run())
        await asyncio.wait_for(both_running.wait(), timeout=10)
        echomq.Client(redis.Redis.from_url(server.url)).cancel(Q, "remote", "not wanted")
        deadline = time.monotonic() + 10
        while worker.stats.cancelled < 1:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        worker.stop(grace=0)
        await task
        assert reasons == {"remote": "not wanted", "shutdown": "shutdown"}
        assert r.hget(K.job("remote"), "state") == b"cancelled"
        assert r.hget(K.job("shutdown"), "state") == b"pending"  # shutdown: given back, retried later
        assert r.hget(K.job("shutdown"), "tries") == b"0"  # without using an attempt

    run(server, body)
