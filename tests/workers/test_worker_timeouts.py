"""A handler's timeout (issue 30): ``timeout_ms`` cancels its token with "timeout"; ``timeout_grace``
later a handler still running is abandoned and its job failed with the timeout's error, a try used.

Before issue 30 a handler that never checkpointed and ignored its token ran
for ever: its lease keeper kept extending it.  Threads and asyncio; what a
thread worker cannot stop (its handler's thread runs on after the abandon)
is checked too: the worker goes on with another thread.
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

from ..faults import wait_until

Q = "timeouts"
K = queue_keys(Q)
ERROR = "TimeoutError: the handler ran longer than its timeout (300 ms)"


def row(r: redis.Redis, job_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(K.job(job_id)).items()}


def test_a_thread_handler_that_ignores_its_token_is_abandoned_and_its_job_failed(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue(Q, b"", job_id="slow")
    reasons: list[object] = []
    released = threading.Event()

    def handler(ctx: echomq.JobContext) -> None:
        if ctx.id == "slow":
            released.wait(20)  # ignores its token: only the test lets it go
            reasons.append(ctx.check())
        else:
            reasons.append("next")

    retry = echomq.RetryPolicy.fixed(1000, max_attempts=2)  # the retry waits a second
    worker = echomq.Worker(client, Q, handler, timeout_ms=300, timeout_grace=0.3, retry=retry, reap=False)
    with worker:
        assert wait_until(lambda: "last_error" in row(r, "slow"), timeout=10)
        info = row(r, "slow")
        assert info["state"] == "pending"
        assert info["last_error"] == ERROR and info["tries"] == "1"
        assert worker.stats.abandoned == 1 and worker.stats.failed == 1
        # The abandoned handler's thread runs on; the worker goes on with another thread:
        # the retry runs (and, abandoned again, dies) while the first run still waits.
        client.enqueue(Q, b"", job_id="next")
        assert wait_until(lambda: row(r, "next").get("state") == "done", timeout=10)
        assert wait_until(lambda: row(r, "slow").get("state") == "dead", timeout=10)
        released.set()
        assert wait_until(lambda: len(reasons) == 3, timeout=10)
    assert reasons.count("next") == 1
    assert [str(c.reason) for c in reasons if isinstance(c, echomq.Cancellation)] == ["timeout", "timeout"]
    assert worker.stats.completed == 1 and worker.stats.abandoned == 2 and worker.stats.timed_out == 2
    assert r.zcard(K.active) == 0


def test_a_handler_that_checks_its_token_ends_at_the_timeout_with_the_timeouts_error(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue(Q, b"", job_id="J")
    started = []

    def handler(ctx: echomq.JobContext) -> None:
        started.append(time.monotonic())
        while True:
            ctx.cancel.sleep(0.02)
            ctx.checkpoint()  # raises Cancelled("timeout")

    worker = echomq.Worker(client, Q, handler, timeout_ms=300, timeout_grace=30, max_attempts=1, reap=False)
    with worker:
        assert wait_until(lambda: row(r, "J").get("state") == "dead", timeout=10)
    assert row(r, "J")["last_error"] == ERROR
    assert worker.stats.timed_out == 1 and worker.stats.abandoned == 0


def test_a_handler_that_returns_within_the_grace_completes(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, b"", job_id="J")

    def handler(ctx: echomq.JobContext) -> None:
        while not ctx.cancel.sleep(0.02):
            pass  # told: it wraps up and returns

    worker = echomq.Worker(client, Q, handler, timeout_ms=300, timeout_grace=30, reap=False)
    with worker:
        assert wait_until(lambda: row(r, "J").get("state") == "done", timeout=10)
    assert worker.stats.timed_out == 1 and worker.stats.completed == 1


def test_an_asyncio_handler_past_its_grace_is_cancelled_and_its_job_failed(server: EmbeddedServer) -> None:
    r = server.client()
    r.flushall()
    echomq.Client(r).enqueue(Q, b"", job_id="stubborn")
    echomq.Client(r).enqueue(Q, b"", job_id="told")
    seen: dict[str, object] = {}

    async def handler(ctx: emq.JobContext) -> None:
        try:
            while True:  # never looks at its token
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            seen[ctx.id] = ctx.check()
            raise

    async def main() -> echomq.WorkerStats:
        client = emq.Client(redis.asyncio.Redis(port=server.port))
        worker = emq.Worker(
            client, Q, handler, concurrency=2, timeout_ms=300, timeout_grace=0.3, max_attempts=1, reap=False
        )
        async with worker:
            deadline = time.monotonic() + 10
            while r.zcard(K.dead) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        await client.aclose()
        return worker.stats

    stats = asyncio.run(main())
    assert {row(r, j)["state"] for j in ("stubborn", "told")} == {"dead"}
    assert row(r, "stubborn")["last_error"] == ERROR
    assert [str(getattr(c, "reason", c)) for c in seen.values()] == ["timeout", "timeout"]
    assert stats.abandoned == 2 and stats.timed_out == 2 and stats.failed == 2 and stats.leases_lost == 0


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_timeout_settings_are_checked(mode: str) -> None:
    cls = echomq.Worker if mode == "sync" else emq.Worker
    client = echomq.Client(redis.Redis()) if mode == "sync" else emq.Client(redis.asyncio.Redis())
    handler = (lambda ctx: None) if mode == "sync" else _ahandler
    with pytest.raises(ValueError, match="timeout_ms"):
        cls(client, Q, handler, timeout_ms=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="timeout_ms"):
        cls(client, Q, handler, timeout_ms=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_grace"):
        cls(client, Q, handler, timeout_grace=-1)  # type: ignore[arg-type]


async def _ahandler(ctx: emq.JobContext) -> None:
    return None
