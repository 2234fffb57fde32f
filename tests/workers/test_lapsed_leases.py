"""A lease lost to its own deadline is given back, not left for a sweep to count a stall (issue 39).

The server froze, stalled or restarted for longer than a lease: the worker's
keeper saw no checkpoint confirmed before the deadline and cancelled the
handler, as it must (someone else may get the job).  But nothing says the
job is someone else's: until a sweep takes it, the server still holds it
with this worker's token.  Both workers used to send nothing, and a sweep
then counted a stall for a job whose holder was only cut off from the
server (the outage chaos test's non-poison jobs dead after three outages).
Now the job is given back (RELEASE, fenced by its token: no stall, no try),
and a job a sweep took meanwhile answers stale, nothing written.
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

from ..conftest import ServerFactory
from ..faults import Proxy, frozen, no_echomq_threads, wait_until

Q = "lapsed"
K = queue_keys(Q)
LEASE_MS = 900
FREEZE_AT_S = 0.45  # after the first checkpoint (a third of the lease) was confirmed
FREEZE_S = 1.5  # past the deadline (at most 0.3 + 0.9 s), and over before the give-back's tries end


def row(r: redis.Redis, job_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(K.job(job_id)).items()}


def run_one(url: str, driver: str, seen: list[str | None]) -> echomq.WorkerStats:
    """One job run by ``driver``'s work_one(); its handler waits for its token (its reason in ``seen``)."""
    if driver == "threads":

        def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
            c = cancel.sleep(10.0)
            seen.append(c.reason if c is not None else None)

        worker = echomq.Worker(
            echomq.Client(redis.Redis.from_url(url, socket_timeout=0.4)), Q, handler, lease_ms=LEASE_MS
        )
        worker.work_one()
        return worker.stats

    async def ahandler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        seen.append((await asyncio.wait_for(cancel.wait(), 10.0)).reason)

    async def main() -> echomq.WorkerStats:
        client = emq.Client(redis.asyncio.Redis.from_url(url, socket_timeout=0.4))
        try:
            worker = emq.Worker(client, Q, ahandler, lease_ms=LEASE_MS)
            await worker.work_one()
            return worker.stats
        finally:
            await client.aclose()

    return asyncio.run(main())


@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_a_job_whose_lease_lapsed_while_the_server_was_frozen_is_given_back_without_a_stall(
    server_factory: ServerFactory, driver: str
) -> None:
    server = server_factory()
    r = server.client()
    echomq.Client(r).enqueue(Q, b"", job_id="J")
    out: list[echomq.WorkerStats] = []
    seen: list[str | None] = []
    thread = threading.Thread(target=lambda: out.append(run_one(server.url, driver, seen)))
    thread.start()
    time.sleep(FREEZE_AT_S)
    assert row(r, "J")["state"] == "active"
    with frozen(server):
        time.sleep(FREEZE_S)
    thread.join(15.0)
    assert not thread.is_alive()
    stats = out[0]
    assert seen == [echomq.lease.LOST_DEADLINE]  # the fault happened: the deadline passed unconfirmed
    after = row(r, "J")
    # Given back: waiting again, no stall counted, its try returned (it was 1 while held).
    assert after["state"] == "pending", after
    assert after.get("closed_by") == "release:pending", after
    assert "stalled" not in after and after.get("tries", "0") == "0", after
    assert r.zcard(K.active) == 0
    assert stats.leases_lost == 1 and stats.released == 1 and stats.completed == 0, stats
    assert no_echomq_threads() == []


@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_a_job_swept_while_its_holder_was_cut_off_is_not_given_back_by_it(
    server_factory: ServerFactory, driver: str
) -> None:
    # The other side of the fence: the holder is cut off from a server that
    # runs on (every connection dropped, new ones refused); its lease lapses
    # there too, a sweep takes the job (a stall, as it should be: its holder
    # did not answer) and another worker claims it.  When the first holder
    # reaches the server again its give-back answers stale and changes nothing.
    server = server_factory()
    r = server.client()
    echomq.Client(r).enqueue(Q, b"", job_id="J")
    proxy = Proxy(server.port)
    out: list[echomq.WorkerStats] = []
    seen: list[str | None] = []
    url = f"redis://127.0.0.1:{proxy.port}/0"
    thread = threading.Thread(target=lambda: out.append(run_one(url, driver, seen)))
    try:
        thread.start()
        time.sleep(FREEZE_AT_S)
        assert row(r, "J")["state"] == "active"
        proxy.refuse = True
        proxy.drop()
        assert wait_until(lambda: bool(seen), timeout=3.0)  # the holder's deadline passed
        other = echomq.Client(redis.Redis(port=server.port))
        assert wait_until(lambda: other.sweep(Q, max_stalled=5).recovered == ["J"], timeout=3.0)
        again = other.claim(Q, 60_000)
        assert again is not None and again.id == "J"
        proxy.refuse = False  # the first holder's give-back reaches the server now
        thread.join(15.0)
        assert not thread.is_alive()
    finally:
        proxy.close()
    assert proxy.refused >= 1  # the fault happened: the holder tried and could not connect
    stats = out[0]
    assert seen == [echomq.lease.LOST_DEADLINE]
    after = row(r, "J")
    assert after["state"] == "active" and after["token"] == again.token, after  # still the new holder's
    assert after["stalled"] == "1", after
    assert stats.released == 0 and stats.completed == 0 and stats.rejected == 1, stats
    assert no_echomq_threads() == []


@pytest.mark.parametrize("driver", ["threads", "asyncio"])
def test_a_running_worker_gives_back_a_lapsed_job_and_runs_it_again_without_a_stall(
    server_factory: ServerFactory, driver: str
) -> None:
    # The same through run() (the thread worker's turns, the asyncio runners), not work_one():
    # the give-back goes out on the handler's own thread or in the give-back batch, and once the
    # server answers again the job is claimed anew and done, its row showing no stall.
    server = server_factory()
    r = server.client()
    echomq.Client(r).enqueue(Q, b"", job_id="J")
    reasons: list[str | None] = []
    done = threading.Event()

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        if not reasons:
            c = cancel.sleep(10.0)
            reasons.append(c.reason if c is not None else None)
            return
        done.set()

    async def ahandler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        if not reasons:
            reasons.append((await asyncio.wait_for(cancel.wait(), 10.0)).reason)
            return
        done.set()

    stats: list[echomq.WorkerStats] = []

    def run() -> None:
        if driver == "threads":
            client = echomq.Client(redis.Redis.from_url(server.url, socket_timeout=0.4))
            worker = echomq.Worker(client, Q, handler, lease_ms=LEASE_MS, concurrency=2, reap=False)
            with worker:
                done.wait(15.0)
            stats.append(worker.stats)
            return

        async def main() -> None:
            client = emq.Client(redis.asyncio.Redis.from_url(server.url, socket_timeout=0.4))
            worker = emq.Worker(client, Q, ahandler, lease_ms=LEASE_MS, concurrency=2, reap=False)
            task = asyncio.create_task(worker.run(handle_signals=False))
            await asyncio.to_thread(done.wait, 15.0)
            worker.stop()
            await task
            await client.aclose()
            stats.append(worker.stats)

        asyncio.run(main())

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 5.0
    while row(r, "J").get("state") != "active" and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(FREEZE_AT_S)
    with frozen(server):
        time.sleep(FREEZE_S)
    thread.join(30.0)
    assert not thread.is_alive()
    assert reasons == [echomq.lease.LOST_DEADLINE] and done.is_set()  # lost to its deadline, then run
    after = row(r, "J")
    assert after["state"] == "done" and "stalled" not in after, after
    assert stats[0].leases_lost == 1 and stats[0].released == 1 and stats[0].completed == 1, stats[0]
