"""The asyncio worker under faults (issue 23): a blocked loop, cancellation, stop() any time, a frozen server.

Each test reproduces one of the asyncio scripts in
``shared/repro/worker-faults/`` against a real server and asserts that no job
is left active, none is completed past its lease, and no task or thread is
left behind.
"""

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

from ..calibration import budget
from ..faults import Proxy, frozen, no_echomq_threads, stall

Q = "afaults"
K = queue_keys(Q)
LOST_DEADLINE = "lease lost: no extend confirmed before the deadline passed"


def row(r: redis.Redis, job_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(K.job(job_id)).items()}


def run(server: EmbeddedServer, body: Callable[[emq.Client], Awaitable[None]]) -> None:
    """Run ``body`` on a fresh loop with a client; afterwards no task of ours may be left on that loop."""

    async def main() -> None:
        client = emq.Client.from_url(server.url)
        try:
            await body(client)
        finally:
            await client.aclose()
        await asyncio.sleep(0)  # let finished tasks be collected
        left = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert left == [], f"tasks left behind: {left}"

    asyncio.run(main())
    assert no_echomq_threads() == []


def test_a_handler_that_blocks_the_loop_is_cancelled_at_its_deadline(
    server: EmbeddedServer, r: redis.Redis
) -> None:
    # async_blocking.py: a handler that checks its token but never awaits
    # (CPU or a blocking call) kept running long after its lease was lost and
    # another worker had the job.  The deadline is now watched from a thread:
    # its token is cancelled at the deadline, loop blocked or not, and the
    # asyncio worker does not complete the job.
    echomq.Client(server.client()).enqueue(Q, b"", job_id="J")
    steps: list[int] = []
    stopped_by: list[str | None] = []

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        for step in range(20):
            c = cancel.check()
            if c is not None:
                stopped_by.append(c.reason)
                break
            steps.append(step)
            time.sleep(0.1)  # never awaits

    async def body(client: emq.Client) -> None:
        worker = emq.Worker(client, Q, handler, lease_ms=600, poll_interval=0.05)
        assert await worker.work_one()
        assert worker.stats.completed == 0 and worker.stats.leases_lost == 1

    run(server, body)
    assert stopped_by == [LOST_DEADLINE]
    assert len(steps) <= 8  # stopped at the first check after the 0.6 s deadline, not after 20 steps
    # Not completed: given back (its lease lost by the worker's own reckoning, the server still
    # held it for this token), no stall counted: tests/workers/test_lapsed_leases.py.
    after = row(r, "J")
    assert after["state"] == "pending" and "stalled" not in after, after


def test_a_handler_raising_cancelled_error_fails_its_job_and_the_worker_goes_on(
    server: EmbeddedServer, r: redis.Redis
) -> None:
    # async_cancelled.py: a CancelledError a handler lets escape (an inner
    # timeout, a cancelled sub-task) ended run() while another task kept
    # working.  It is the job's failure; run() keeps going until stop().
    client0 = echomq.Client(server.client())
    for job_id in ("bad", "a", "b", "c"):
        client0.enqueue(Q, b"", job_id=job_id)

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        if job.id == "bad":
            raise asyncio.CancelledError()
        await asyncio.sleep(0.05)

    async def body(client: emq.Client) -> None:
        worker = emq.Worker(
            client, Q, handler, lease_ms=2000, concurrency=2, poll_interval=0.02, max_attempts=2
        )
        task = asyncio.create_task(worker.run())
        for _ in range(500):
            if worker.stats.completed == 3 and worker.stats.failed == 2:
                break
            await asyncio.sleep(0.01)
        assert not task.done(), "run() ended on a handler's CancelledError"
        worker.stop()
        await task  # returns: no exception
        assert (worker.stats.completed, worker.stats.failed) == (3, 2)

    run(server, body)
    bad = row(r, "bad")
    assert bad["state"] == "dead" and bad["last_error"].startswith("CancelledError")
    assert [row(r, j)["state"] for j in "abc"] == ["done"] * 3


def test_cancelling_run_gives_every_job_in_flight_back(server: EmbeddedServer, r: redis.Redis) -> None:
    # async_shutdown.py: cancelling run() left every job in flight active.
    client0 = echomq.Client(server.client())
    for job_id in ("a", "b"):
        client0.enqueue(Q, b"", job_id=job_id)

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        await asyncio.sleep(30)

    async def body(client: emq.Client) -> None:
        worker = emq.Worker(client, Q, handler, lease_ms=10_000, concurrency=2, poll_interval=0.02, grace=30)
        task = asyncio.create_task(worker.run())
        for _ in range(500):
            if r.zcard(K.active) == 2:
                break
            await asyncio.sleep(0.01)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started < budget(2.0, under=30)  # at once, not after the 30 s grace
        assert worker.stats.released == 2

    run(server, body)
    for job_id in ("a", "b"):
        assert row(r, job_id)["state"] == "pending" and row(r, job_id)["tries"] == "0"
    assert not r.exists(K.active)


def test_stop_during_an_in_flight_claim_gives_the_claimed_job_back_unrun(
    server: EmbeddedServer, r: redis.Redis
) -> None:
    # async_stop_during_claim.py: the job a claim in flight brought back was
    # run with a token nobody would ever cancel.
    echomq.Client(server.client()).enqueue(Q, b"", job_id="J")
    ran: list[str] = []

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        ran.append(job.id)
        await asyncio.sleep(3)

    async def body(client: emq.Client) -> None:
        await client.redis.ping()
        # the queue's declaration read (once a client), so the call in flight is the claim
        assert await client.partitions(Q) == [Q]
        worker = emq.Worker(client, Q, handler, poll_interval=0.05)
        stalled = stall(server, 0.5)
        await asyncio.sleep(0.1)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.1)  # the claim is in flight
        worker.stop()
        started = time.monotonic()
        await task
        assert time.monotonic() - started < budget(1.5)
        assert worker.stats.released == 1
        await asyncio.to_thread(stalled.join)

    run(server, body)
    assert ran == []
    assert row(r, "J")["state"] == "pending" and row(r, "J")["tries"] == "0"


def test_stop_before_run_means_run_returns_at_once(server: EmbeddedServer) -> None:
    # stop_before_run.py: a stop() before the run() task started was wiped out.
    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        return None

    async def body(client: emq.Client) -> None:
        worker = emq.Worker(client, Q, handler, poll_interval=0.05)
        task = asyncio.create_task(worker.run())
        worker.stop()  # e.g. a signal handler firing right away
        await asyncio.wait_for(task, 2)

    run(server, body)


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt])
def test_a_handler_raising_system_exit_fails_its_job_and_run_raises_it(
    server: EmbeddedServer, r: redis.Redis, exc_type: type[BaseException]
) -> None:
    # Raised in a task, these would tear the event loop down mid-flight.
    echomq.Client(server.client()).enqueue(Q, b"", job_id="boom")

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        raise exc_type()

    async def body(client: emq.Client) -> None:
        worker = emq.Worker(client, Q, handler, lease_ms=2000, poll_interval=0.02)
        with pytest.raises(exc_type):
            await worker.run()
        assert worker.stats.released == 0 and worker.stats.failed == 1

    run(server, body)
    # Issue 29: a try used (it was given back without one, and crash-looped its workers)
    assert row(r, "boom")["state"] == "pending" and row(r, "boom")["tries"] == "1"


@pytest.mark.parametrize("length", ["long", "short"])
def test_a_deadline_passing_while_the_server_is_frozen(
    server: EmbeddedServer, r: redis.Redis, length: str
) -> None:
    # freeze_async.py: the same timeline as the thread worker's test (in
    # tests/workers/test_worker_faults.py), the same outcome.
    echomq.Client(server.client()).enqueue(Q, b"", job_id="J")
    seen: list[str | None] = []
    done = threading.Event()
    stats: list[echomq.WorkerStats] = []

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        if length == "long":
            seen.append((await cancel.wait()).reason)
        else:
            await asyncio.sleep(0.9)

    def in_thread() -> None:
        async def main() -> None:
            client = emq.Client(redis.asyncio.Redis(port=server.port, socket_timeout=0.5))
            try:
                worker = emq.Worker(client, Q, handler, lease_ms=1000, extend_interval=0.3)
                await worker.work_one()
                stats.append(worker.stats)
            finally:
                await client.aclose()

        asyncio.run(main())
        done.set()

    thread = threading.Thread(target=in_thread)
    thread.start()
    time.sleep(0.5)
    with frozen(server):
        returned_while_frozen = done.wait(2.5)
    thread.join()
    assert returned_while_frozen, "work_one() waited for the frozen server"
    assert stats[0].completed == 0 and stats[0].leases_lost == 1
    if length == "long":
        assert seen == [LOST_DEADLINE]
        assert r.hget(K.job("J"), "state") == b"active"
    assert no_echomq_threads() == []


def test_a_cancel_subscription_redis_py_made_again_by_itself_checkpoints_every_held_job(
    server: EmbeddedServer, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The twin of tests/workers/test_worker_faults.py's: redis-py subscribed again by itself after a dropped
    # connection; the second confirmation makes every held job ask at once.
    from echomq.asyncio._pushes import CancelListener

    from .test_worker_faults import HeldJobs, subscriber_id

    proxy = Proxy(server.port)

    async def main() -> tuple[int, int, str | None, str | None]:
        client = emq.Client(redis.asyncio.Redis(port=proxy.port, client_name="test-alistener"))
        monkeypatch.setattr(client, "_bounded", lambda: False)  # the path a cluster client takes
        held = HeldJobs()
        listener = CancelListener(client, "afaults", held, lambda: True)  # type: ignore[arg-type]
        listener.start()
        try:
            assert await until(lambda: subscriber_id(r, "test-alistener") is not None, 10)
            first = subscriber_id(r, "test-alistener")
            proxy.drop()
            await until(lambda: held.asked >= 1, 20)
            await until(lambda: subscriber_id(r, "test-alistener") not in (None, first), 10)
            return held.asked, listener.resubscribed, first, subscriber_id(r, "test-alistener")
        finally:
            await listener.close()
            await client.aclose()

    try:
        asked, resubscribed, first, now = asyncio.run(main())
    finally:
        proxy.close()
    assert asked >= 1, "a cancel published meanwhile waits for a checkpoint"
    assert resubscribed >= 1 and now not in (None, first)  # it was dropped, and is back


async def until(predicate: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return bool(predicate())


def test_a_forced_stop_against_a_frozen_server_says_its_budget_ended_the_give_back(
    server: EmbeddedServer, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 39: a forced stop whose RELEASE got no answer logged "no answer to its release
    # before its lease ended" with seconds of the lease left; the stop's budget ended it.
    echomq.Client(server.client()).enqueue(Q, b"", job_id="J")

    async def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        await asyncio.sleep(30)

    async def body(client: emq.Client) -> None:
        worker = emq.Worker(client, Q, handler, lease_ms=10_000, poll_interval=0.02, grace=30)
        task = asyncio.create_task(worker.run())
        for _ in range(500):
            if r.zcard(K.active) == 1:
                break
            await asyncio.sleep(0.01)
        with frozen(server):
            task.cancel()  # a forced stop: the give-back meets a server that answers nothing
            with pytest.raises(asyncio.CancelledError):
                await task
        assert worker.stats.released == 0 and worker.stats.leases_lost == 1

    with caplog.at_level("WARNING", logger="echomq"):
        run(server, body)
    said = [rec.getMessage() for rec in caplog.records if "no answer to its release" in rec.getMessage()]
    assert len(said) == 1 and "before the forced stop's budget ran out" in said[0], said
    assert "s before its lease ends" in said[0] and "before its lease ended" not in said[0]
    # The RELEASE sat in the frozen server's socket: it took effect once the server ran again.
    assert r.hget(K.job("J"), "state") in (b"pending", b"active")
