"""Flow control in the workers (issue 32): a handler's 429 -- ``ctx.rate_limited(ms)`` or
``raise echomq.RateLimited(ms)`` -- gives the job back without using a try and stops every
worker's claims of the queue for ms on the server clock (one EMQ.RELEASE ... BACKOFF), both
drivers, both backends; and a worker idle against a limit does not spin (module: it waits on
the server)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
import redis.asyncio as aredis

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..helpers import now_ms

pytestmark = pytest.mark.backends

Q = "flow"
K = queue_keys(Q)


def wait_until(cond: object, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


def check_backed_off(r: redis.Redis, started: dict[str, int]) -> None:
    """`a` ran twice (its first run raised the 429) with one try; nothing started during the back-off."""
    until = int(r.hget(K.base + "limit", "backoff_until") or 0)
    assert until > 0
    row = r.hgetall(K.job("a"))
    assert row[b"state"] == b"done" and row[b"attempts"] == b"2" and row[b"tries"] == b"1"
    claimed = {i: int(r.hget(K.job(i), "claimed_at") or 0) for i in ("a", "b", "c")}
    # every claim after the 429 came at or after the back-off's end
    assert all(at >= until for at in claimed.values()), (claimed, until)
    assert set(started) == {"a", "b", "c"}


@pytest.mark.parametrize("how", ["ctx", "raise"])
def test_a_429_releases_without_a_try_and_backs_the_queue_off(
    r: redis.Redis, client: echomq.Client, how: str
) -> None:
    for i in ("a", "b", "c"):
        client.enqueue(Q, b"", job_id=i)
    started: dict[str, int] = {}
    lock = threading.Lock()

    def handler(ctx: echomq.JobContext) -> None:
        with lock:
            first = ctx.id == "a" and "a" not in started
            started[ctx.id] = ctx.attempt
        if first:
            if how == "ctx":
                ctx.rate_limited(600)
            raise echomq.RateLimited(600)

    worker = echomq.Worker(client, Q, handler, lease_ms=10_000, concurrency=1, poll_interval=0.01).start()
    try:
        assert wait_until(lambda: worker.stats.completed == 3)
    finally:
        worker.stop()
    assert worker.stats.released == 1
    check_backed_off(r, started)


def test_the_asyncio_worker_backs_off_too(r: redis.Redis, server: EmbeddedServer, backend: str) -> None:
    for i in ("a", "b", "c"):
        echomq.Client(r).enqueue(Q, b"", job_id=i)
    started: dict[str, int] = {}

    async def handler(ctx: emq.JobContext) -> None:
        first = ctx.id == "a" and "a" not in started
        started[ctx.id] = ctx.attempt
        if first:
            ctx.rate_limited(600)

    async def main() -> None:
        conn = aredis.Redis(host="127.0.0.1", port=server.port)
        client = emq.Client(conn)
        worker = emq.Worker(client, Q, handler, lease_ms=10_000, concurrency=1, poll_interval=0.01)
        task = asyncio.create_task(worker.run(handle_signals=False))
        deadline = time.monotonic() + 20
        while worker.stats.completed < 3:
            assert time.monotonic() < deadline, worker.stats
            await asyncio.sleep(0.02)
        worker.stop()
        await task
        await conn.aclose()

    asyncio.run(main())
    check_backed_off(r, started)


def test_rate_limited_checks_its_argument() -> None:
    with pytest.raises(ValueError):
        echomq.RateLimited(-1)
    with pytest.raises(TypeError):
        echomq.RateLimited(1.5)  # type: ignore[arg-type]
    assert echomq.RateLimited(250).ms == 250


@pytest.mark.memcheck  # make -C module check runs it under valgrind
def test_release_backoff_is_one_atomic_step(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, b"", job_id="a")
    job = client.claim(Q, 60_000)
    assert job is not None
    before = now_ms(r)
    k = queue_keys(Q)
    assert client._send(("EMQ.RELEASE", k.active, k.pending, k.base, "a", job.token, "BACKOFF", "5000")) in (
        b"pending", "pending",
    )  # fmt: skip
    assert int(r.hget(k.base + "limit", "backoff_until") or 0) >= before + 5000
    assert r.hget(k.job("a"), "tries") == b"0"
    assert client.claim(Q, 60_000) is None  # backed off
    for bad, text in [
        (("BACKOFF",), "syntax error"),
        (("BACKOFF", "-1"), "BACKOFF must be"),
        (("NO", "1"), "syntax"),
    ]:
        with pytest.raises(redis.ResponseError, match=text):
            client._send(("EMQ.RELEASE", k.active, k.pending, k.base, "a", "1-0000000000000000", *bad))


def test_an_idle_limited_worker_does_not_spin(r: redis.Redis, client: echomq.Client, backend: str) -> None:
    """A worker whose queue has jobs but whose window is spent sends few claims: on the module
    it waits on the server until the window opens (a 3 s window: about one claim per slot)."""
    client.enqueue_many(Q, [(f"j{i}", b"") for i in range(100)])
    client.set_rate_limit(Q, 2, 3000)
    worker = echomq.Worker(client, Q, lambda ctx: None, lease_ms=10_000, concurrency=4, poll_interval=0.05)
    r.config_resetstat()
    worker.start()
    try:
        time.sleep(2.5)
    finally:
        worker.stop()
    stats = r.info("commandstats")
    calls = sum(
        int(v["calls"]) for name, v in stats.items() if "emq.claim" in name or "emq.completeclaim" in name
    )
    evals = sum(
        int(v["calls"])
        for name, v in stats.items()
        if name in ("cmdstat_evalsha", "cmdstat_fcall", "cmdstat_eval")
    )
    per_s = (calls + evals) / 2.5
    # the module: a few claims in 2.5 s; the scripts (polling, at most every 3 s once idle): a few dozen
    assert per_s < (8 if backend == "module" else 40), (calls, evals)
    done = client.counts(Q)
    assert 100 - done.pending <= 2 * 2  # at most two windows' worth were handed out
