"""`echomq` and `echomq.asyncio` expose the same public surface: a drift fails here.

The only difference allowed is that a method which waits or sends is a
coroutine in asyncio; the deliberate exceptions are listed with their reasons.
"""

from __future__ import annotations

import asyncio
import inspect
import types
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

pytestmark = pytest.mark.once

TWINS = ("App", "Client", "JobContext", "LeaseKeeper", "Reaper", "Worker")
# asyncio's names for the sync protocol methods.
RENAMED = {"__enter__": "__aenter__", "__exit__": "__aexit__", "close": "aclose"}
# Plain functions in both: they neither wait for nor send anything.
PLAIN_IN_BOTH = {"__init__", "from_url", "start", "raise_if_cancelled", "check", "rate_limited"}
# The App's that only build something (a task, options, a handle, a worker): plain in both too.
PLAIN_IN_BOTH |= {"task", "options", "handle", "worker", "add_hook"}  # add_hook: echomq/tasks/hooks.py
# Deliberate differences, each with its reason.
DIFFERENT = {
    ("Worker", "stop"): "asyncio's stop() only signals: handlers and signal handlers call it and cannot "
    "await; `await worker.run()` or leaving `async with worker:` waits, as the sync stop() does",
    ("App", "queues"): "the queues of the app's own tasks: nothing to ask the server, plain in both "
    "(Client.queues, a coroutine, scans the server)",
    ("App", "schedule"): "keeps a periodic task's definition, sends nothing: plain in both "
    "(Client.schedule, a coroutine, stores one; App.register_schedules is the awaited twin)",
}
Q = "parity"
K = queue_keys(Q)


def surface(cls: type) -> dict[str, Any]:
    """Public methods and properties by name, with the dunders a user calls."""
    dunders = {"__init__", "__enter__", "__exit__", "__aenter__", "__aexit__"}
    return {
        name: inspect.getattr_static(cls, name)
        for name in dir(cls)
        if not name.startswith("_") or (name in dunders and hasattr(cls, name))
    }


def parameters(member: Any) -> list[tuple[str, Any, Any]]:
    function = member.__func__ if isinstance(member, classmethod | staticmethod) else member
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def instance_attributes(obj: object) -> set[str]:
    return {name for name in vars(obj) if not name.startswith("_")}


def test_asyncio_exports_the_twins() -> None:
    assert set(emq.__all__) == {*TWINS, "AsyncHandler", "task_context"}
    for name in TWINS:
        assert name in echomq.__all__


@pytest.mark.parametrize("name", TWINS)
def test_same_methods_and_signatures(name: str) -> None:
    sync, aio = surface(getattr(echomq, name)), surface(getattr(emq, name))
    assert {RENAMED.get(n, n) for n in sync} == set(aio), f"{name}: public names differ"
    for method, member in sync.items():
        twin = aio[RENAMED.get(method, method)]
        where = f"{name}.{method}"
        attribute = (property, types.MemberDescriptorType)  # properties and __slots__ fields
        assert isinstance(member, attribute) == isinstance(twin, attribute), where
        if isinstance(member, attribute):
            continue
        assert not inspect.iscoroutinefunction(member), f"{where} is a coroutine in sync code"
        if (name, method) in DIFFERENT:
            continue
        assert parameters(member) == parameters(twin), where
        if method in PLAIN_IN_BOTH:
            assert not inspect.iscoroutinefunction(twin), f"asyncio {where} should not need await"
        else:
            assert inspect.iscoroutinefunction(twin), f"asyncio {where} should be a coroutine"


def test_same_instance_attributes() -> None:
    job = echomq.Job(Q, "j", "1-00000000000000aa", b"")
    sync_client, aio_client = echomq.Client(redis.Redis()), emq.Client(aioredis.Redis())
    assert instance_attributes(sync_client) == instance_attributes(aio_client)
    pairs = [
        (
            echomq.LeaseKeeper(sync_client, job, 1000, echomq.CancelToken()),
            emq.LeaseKeeper(aio_client, job, 1000, echomq.CancelToken()),
        ),
        (echomq.Reaper(sync_client, Q), emq.Reaper(aio_client, Q)),
        (echomq.Worker(sync_client, Q, lambda j, c: None), emq.Worker(aio_client, Q, _async_noop)),
    ]
    for sync, aio in pairs:
        assert instance_attributes(sync) == instance_attributes(aio), type(sync).__name__


async def _async_noop(job: echomq.Job, cancel: echomq.CancelToken) -> None:
    return None


def test_asyncio_from_url_with_cluster_builds_the_asyncio_cluster_client() -> None:
    # It connects on first use, so no cluster is needed to see what it built;
    # tests/verbs/test_cluster.py runs it against one.
    client = emq.Client.from_url("redis://127.0.0.1:7000/0", cluster=True)
    assert isinstance(client.redis, AsyncRedisCluster)
    assert isinstance(emq.Client.from_url("redis://127.0.0.1:7000/0").redis, aioredis.Redis)


# -- the behaviour the twins now share --------------------------------------------


def test_a_job_claimed_after_stop_is_given_back_unrun(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="late")
    seen: list[echomq.Cancellation | None] = []
    worker = echomq.Worker(client, Q, lambda job, cancel: seen.append(cancel.check()))
    worker.stop()
    assert worker.work_one()  # as if the claim was in flight when stop() came
    assert seen == []
    assert r.hget(K.job("late"), "state") == b"pending" and r.hget(K.job("late"), "tries") == b"0"
    assert worker.stats.released == 1


def test_async_a_job_claimed_after_stop_is_given_back_unrun(r: redis.Redis, server: EmbeddedServer) -> None:
    r.flushall()
    seen: list[echomq.Cancellation | None] = []

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        seen.append(cancel.check())

    async def main() -> None:
        client = emq.Client.from_url(server.url)
        try:
            await client.enqueue(Q, job_id="late")
            worker = emq.Worker(client, Q, handler)
            worker.stop()
            assert await worker.work_one()
            assert worker.stats.released == 1
        finally:
            await client.aclose()

    asyncio.run(main())
    assert seen == []
    assert r.hget(K.job("late"), "state") == b"pending" and r.hget(K.job("late"), "tries") == b"0"


def test_async_start_stop_and_on_sweep(r: redis.Redis, server: EmbeddedServer) -> None:
    r.zadd(K.active, {f"j{i}": i for i in range(3)})
    seen: list[echomq.SweepResult] = []
    done: list[str] = []

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        done.append(job.id)

    async def main() -> None:
        client = emq.Client.from_url(server.url)
        try:
            reaper = emq.Reaper(client, Q, interval=0.05, max_stalled=5, on_sweep=seen.append).start()
            async with emq.Worker(client, Q, handler, poll_interval=0.01) as worker:
                for _ in range(500):
                    if worker.stats.completed == 3:
                        break
                    await asyncio.sleep(0.01)
            await reaper.stop()
        finally:
            await client.aclose()

    asyncio.run(main())
    assert seen and sorted(j for s in seen for j in s.recovered) == ["j0", "j1", "j2"]
    assert sorted(done) == ["j0", "j1", "j2"]
