"""The handler context (issue 15): one typed object with the job, its token, checkpoint() and the safe points.

The old ``handler(job, cancel)`` keeps working (told apart by its signature).
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
from ..helpers import now_ms

Q = "ctx"
K = queue_keys(Q)


def test_a_handler_gets_its_job_token_and_attempt(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, b"payload", job_id="J")
    seen: list[tuple[object, ...]] = []

    def handler(ctx: echomq.JobContext) -> None:
        seen.append((ctx.id, ctx.queue, ctx.payload, ctx.token, ctx.attempt, ctx.job.id, ctx.cancelled))
        assert isinstance(ctx, echomq.JobContext) and ctx.check() is None
        ctx.raise_if_cancelled()

    worker = echomq.Worker(client, Q, handler)
    assert worker.work_one()
    (jid, queue, payload, token, attempt, job_id, cancelled) = seen[0]
    assert (jid, queue, payload, attempt, job_id, cancelled) == ("J", Q, b"payload", 1, "J", False)
    assert token == r.hget(K.job("J"), "token").decode()  # type: ignore[union-attr]
    assert r.hget(K.job("J"), "state") == b"done"


def test_checkpoint_extends_the_lease_now_and_delivers_a_remote_cancel(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue(Q, b"", job_id="J")
    deadlines: list[float] = []
    stopped: list[str | None] = []
    asked = threading.Event()

    def handler(ctx: echomq.JobContext) -> None:
        before = now_ms(r)
        ctx.checkpoint()  # the keeper's own would come only after 20 s
        deadlines.append(r.zscore(K.active, "J") - before)  # type: ignore[operator]
        client.cancel(Q, "J", "operator says no")
        asked.set()
        try:
            ctx.checkpoint()
        except echomq.Cancelled as exc:
            stopped.append(exc.reason)
            raise

    worker = echomq.Worker(client, Q, handler, lease_ms=60_000)
    assert worker.work_one()
    assert 59_000 <= deadlines[0] <= 60_100  # now + the lease, from just before the checkpoint
    assert stopped == ["operator says no"]
    assert r.hget(K.job("J"), "state") == b"cancelled" and worker.stats.cancelled == 1


def test_the_old_signature_and_callable_objects_keep_working(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, b"", job_id="old")
    client.enqueue(Q, b"", job_id="obj")
    calls: list[str] = []

    def old(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        assert isinstance(job, echomq.Job) and isinstance(cancel, echomq.CancelToken)
        calls.append(job.id)

    class Handler:
        def __call__(self, ctx: echomq.JobContext) -> None:
            calls.append(ctx.id)

    assert echomq.Worker(client, Q, old).work_one()
    assert echomq.Worker(client, Q, Handler()).work_one()
    assert sorted(calls) == ["obj", "old"]


def test_async_context_checkpoint_is_awaited(r: redis.Redis, server: EmbeddedServer) -> None:
    seen: list[object] = []

    async def handler(ctx: emq.JobContext) -> None:
        assert isinstance(ctx, emq.JobContext)
        seen.append((ctx.id, ctx.attempt, ctx.payload))
        await ctx.checkpoint()
        await asyncio.to_thread(echomq.Client(server.client()).cancel, Q, ctx.id, "stop")
        try:
            await ctx.checkpoint()
        except echomq.Cancelled as exc:
            seen.append(exc.reason)
            raise

    async def main() -> None:
        client = emq.Client.from_url(server.url)
        try:
            await client.enqueue(Q, b"p", job_id="A")
            worker = emq.Worker(client, Q, handler, lease_ms=60_000)
            assert await worker.work_one()
            assert worker.stats.cancelled == 1
        finally:
            await client.aclose()

    asyncio.run(main())
    assert seen == [("A", 1, b"p"), "stop"]
    assert wait_until(lambda: r.hget(K.job("A"), "state") == b"cancelled")
