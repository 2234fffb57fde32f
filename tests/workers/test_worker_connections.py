"""A worker's connections (issue 27: 2, 3, 4, 5): bounded, sized by the worker, never starved, never
unbounded, and a keeper that outlives a moment without threads.

Each test would fail on the code before issue 27:

- a thread worker above 100 slots starved itself: idle threads held
  redis-py's 100 connections in waiting claims, and the running jobs' ends
  and checkpoints failed with MaxConnectionsError until their leases lapsed;
- the asyncio keeper sent one checkpoint per held job, all at once: above
  the pool's 100 they failed together and the leases were lost;
- a FAIL + CLAIM pipeline of a "suspect" client went through the caller's
  pool, unbounded: on a half-open idle connection the thread blocked for
  ever and the job died "stalled";
- one failed thread start killed the thread keeper for good.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq import _protocol as proto
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..calibration import budget
from ..conftest import ServerFactory
from ..faults import Proxy, no_echomq_threads, pythonpath, wait_until
from ..helpers import queued

pytestmark = pytest.mark.backends

ROOT = Path(__file__).resolve().parents[2]
Q = "conns"
K = queue_keys(Q)


def a_server(server_factory: ServerFactory, backend: str) -> EmbeddedServer:
    return server_factory(load_module=backend == "module")


def checkout(pool: redis.ConnectionPool) -> redis.connection.AbstractConnection:
    """A connection from ``pool`` (redis-py before 5.3 wants a command name, later ones warn of it)."""
    try:
        return pool.get_connection()  # type: ignore[call-arg,no-any-return,unused-ignore]
    except TypeError:
        return pool.get_connection("PING")  # type: ignore[no-any-return,unused-ignore]


def drained(r: redis.Redis, timeout: float) -> bool:
    return wait_until(lambda: queued(r, K) == 0 and r.zcard(K.active) == 0, timeout)


def test_idle_slots_do_not_starve_the_running_jobs(server_factory: ServerFactory) -> None:
    # pool_starvation.py: 120 slots, 10 long jobs among 110 short ones, the
    # caller's pool allowing 1,000 connections: the long jobs' checkpoints
    # and COMPLETEs found no connection (the worker's own pool kept redis-py's
    # 100).  The module only: a claim of the scripts backend never waits on the server.
    r = server_factory().client()
    client = echomq.Client(r)
    longs, shorts = [f"L{i}" for i in range(10)], [f"s{i}" for i in range(110)]
    client.enqueue_many(Q, [(i, b"") for i in longs])
    client.enqueue_many(Q, [(i, b"") for i in shorts])
    lost: list[str] = []

    def handler(ctx: echomq.JobContext) -> None:
        if ctx.id.startswith("L"):
            c = ctx.cancel.sleep(2.5)
            if c is not None:
                lost.append(f"{ctx.id}: {c.reason}")
                ctx.raise_if_cancelled()

    user = echomq.Client(redis.Redis(port=r.connection_pool.connection_kwargs["port"], max_connections=1000))
    worker = echomq.Worker(user, Q, handler, lease_ms=3000, concurrency=120, grace=1.0)
    with worker:
        assert drained(r, 15), worker.stats
    assert lost == [] and worker.stats.leases_lost == 0
    assert worker.stats.completed == 120
    assert no_echomq_threads() == []


def test_a_worker_keeps_within_the_callers_max_connections(server: EmbeddedServer, r: redis.Redis) -> None:
    # 60 slots, a caller that allows 12 connections: the worker never opens
    # more (its own connections are bounded by the caller's limit), and every
    # job still completes: the slots wait for a connection, within each try.
    client = echomq.Client(r)
    client.enqueue_many(Q, [(f"j{i}", b"") for i in range(300)])
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        admin = redis.Redis(port=r.connection_pool.connection_kwargs["port"])
        while not stop.wait(0.02):
            peak[0] = max(peak[0], int(admin.info("clients")["connected_clients"]))

    def handler(ctx: echomq.JobContext) -> None:
        time.sleep(0.02)

    user = echomq.Client(redis.Redis(port=r.connection_pool.connection_kwargs["port"], max_connections=12))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    worker = echomq.Worker(user, Q, handler, lease_ms=3000, concurrency=60, grace=1.0)
    with worker:
        assert drained(r, 20), worker.stats
    stop.set()
    sampler.join()
    assert worker.stats.completed == 300 and worker.stats.leases_lost == 0
    # the worker's 12, its cancel subscription, the test's own three: r, the sampler, and the
    # connection of its own that `client.enqueue_many` sends its request-window tries on
    assert 4 <= peak[0] <= 12 + 1 + 3, f"{peak[0]} connections open at once"


@pytest.mark.parametrize(("mode", "held"), [("sync", 150), ("asyncio", 300)])
def test_many_held_jobs_keep_their_leases(
    server_factory: ServerFactory, backend: str, mode: str, held: int
) -> None:
    # many_leases.py: 300 jobs held at once with a 1.5 s lease: the asyncio
    # keeper's 300 checkpoints failed together above the pool's 100 (102
    # leases lost); the thread worker left 35 of 150 COMPLETEs unfinished.
    # Now one pipeline per tick checkpoints them all.
    # On a loaded machine (issue 39) the asyncio worker's one loop, a tenth of a core, took
    # seconds to start 300 handlers, and its keeper's pipeline waited behind them: a 1.5 s
    # lease is a time bound.  The lease and the handlers scale with the machine: each job
    # still sees about five checkpoints, all 300 in one pipeline.
    lease_ms, runs_for = int(budget(1.5) * 1000), budget(2.5)
    server = a_server(server_factory, backend)
    r = server.client()
    ids = echomq.Client(r).enqueue_many(Q, [(f"j{i}", b"") for i in range(held)])
    runs: collections.Counter[str] = collections.Counter()
    lost: list[str] = []
    if mode == "sync":

        def handler(ctx: echomq.JobContext) -> None:
            runs[ctx.id] += 1
            c = ctx.cancel.sleep(runs_for)
            if c is not None:
                lost.append(f"{ctx.id}: {c.reason}")

        user = echomq.Client(server.client())
        worker = echomq.Worker(user, Q, handler, lease_ms=lease_ms, concurrency=held)
        with worker:
            assert drained(r, 30), worker.stats
        stats = worker.stats
    else:

        async def main() -> echomq.WorkerStats:
            async def handler(ctx: emq.JobContext) -> None:
                runs[ctx.id] += 1
                try:
                    c = await asyncio.wait_for(ctx.cancel.wait(), runs_for)
                    lost.append(f"{ctx.id}: {c.reason}")
                except asyncio.TimeoutError:
                    pass

            client = emq.Client.from_url(server.url)
            worker = emq.Worker(client, Q, handler, lease_ms=lease_ms, concurrency=held)
            task = asyncio.create_task(worker.run(handle_signals=False))
            assert await asyncio.to_thread(drained, r, 30), worker.stats
            worker.stop()
            await asyncio.wait_for(task, 10)
            await client.aclose()
            return worker.stats

        stats = asyncio.run(main())
    assert lost == [] and stats.leases_lost == 0, lost[:5]
    assert stats.completed == held and sorted(runs) == sorted(ids) and set(runs.values()) == {1}


def test_a_failed_job_on_a_half_open_pooled_connection_is_bounded(server: EmbeddedServer) -> None:
    # halfopen_fail_pipeline.py: the caller's pool (socket_timeout None) holds
    # idle connections that go half-open; a checkpoint times out, then the
    # job fails: its FAIL + CLAIM went through the caller's pool and blocked
    # the thread for ever; stop() returned with it alive; the job died "stalled".
    r = server.client()
    proxy = Proxy(server.port)
    try:
        echomq.Client(r).enqueue(Q, b"", job_id="A")
        user = redis.Redis(port=proxy.port, socket_timeout=None)  # no socket timeout (redis-py 5-7 default)
        client = echomq.Client(user)
        client.detect_backend()
        pool = user.connection_pool
        idle = [checkout(pool), checkout(pool)]  # the application used it before
        for c in idle:
            pool.release(c)
        raised = threading.Event()

        def handler(ctx: echomq.JobContext) -> None:
            if ctx.attempt == 1:
                # Half-way to the keeper's first checkpoint, so that none of its lands before the FAIL.
                ctx.cancel.sleep(0.5)
                proxy.blackhole()  # every connection open now goes half-open; new ones work
                ctx.checkpoint()  # gets no answer: the client's connections are suspect now
                raised.set()
                raise ValueError("boom")

        worker = echomq.Worker(client, Q, handler, lease_ms=3000, grace=0.5, max_attempts=3).start()
        try:
            assert raised.wait(10)
            # FAILed within its lease (try 1 of 3), then run again and completed: never left to lapse
            assert wait_until(lambda: r.hget(K.job("A"), "state") == b"done", 6), worker.stats
        finally:
            started = time.monotonic()
            worker.stop()
        assert time.monotonic() - started < budget(3.0)
        row = {k.decode(): v.decode() for k, v in r.hgetall(K.job("A")).items()}
        assert row["last_error"] == "ValueError: boom" and row["tries"] == "2" and "stalled" not in row, row
        assert worker.stats.failed == 1 and worker.stats.completed == 1
        assert no_echomq_threads() == []
    finally:
        proxy.close()


KEEPER_CHILD = r"""
import json, resource, sys, threading, time
import echomq, redis

port = int(sys.argv[1])
client = echomq.Client(redis.Redis(port=port))
client.enqueue("conns", b"", job_id="first")
lost, started = [], threading.Event()

def handler(ctx):
    started.set()
    c = ctx.cancel.sleep(2.5 if ctx.id != "first" else 1.2)
    if c:
        lost.append([ctx.id, c.reason])
        ctx.raise_if_cancelled()

def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

worker = echomq.Worker(client, "conns", handler, lease_ms=1000, concurrency=2, grace=1.0).start()
started.wait(5)
time.sleep(0.1)
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + 4096, hard))  # no thread can start for 0.7 s
time.sleep(0.7)
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
time.sleep(0.5)
client.enqueue_many("conns", [("after0", b""), ("after1", b"")])
time.sleep(3.5)
worker.stop()
states = {j: client.job("conns", j).state for j in ("first", "after0", "after1")}
print(json.dumps({"lost": lost, "states": states, "leases_lost": worker.stats.leases_lost}))
"""


def test_the_keeper_outlives_a_moment_without_threads(server: EmbeddedServer) -> None:
    # keeper_thread_death.py, in a process of its own (it lowers its address
    # space limit): the keeper's per-checkpoint thread could not start, the
    # keeper died for good, and every job started later lost its lease.
    env = dict(os.environ, PYTHONPATH=pythonpath(ROOT / "python"))
    out = subprocess.run(
        [sys.executable, "-c", KEEPER_CHILD, str(server.port)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["lost"] == [] and result["leases_lost"] == 0, result
    assert result["states"] == {"first": "done", "after0": "done", "after1": "done"}, result


def test_the_stops_lane_is_free_when_every_other_connection_is_taken(server: EmbeddedServer) -> None:
    # Issue 39: a forced stop's give-back waited for a connection behind the traffic it was
    # ending.  The worker keeps STOP_LANE of its connections for it: other tries cannot take
    # them, and a lane try gets one at once while the others wait.
    from echomq import _protocol as proto
    from echomq.asyncio._attempt import STOP_LANE, Progress

    async def main() -> None:
        client = emq.Client.from_url(server.url)
        try:
            connections = client._connections()
            connections.reserve(3 + STOP_LANE, STOP_LANE)  # limit: 3 + STOP_LANE + SPARE
            others = connections.limit - STOP_LANE
            let_go = asyncio.Event()
            held = 0

            async def hold() -> None:
                nonlocal held
                async with connections.connection(Progress()):
                    held += 1
                    await let_go.wait()

            holders = [asyncio.create_task(hold()) for _ in range(others + 1)]
            # Each holder connects (a handshake each): on a busy machine 0.3 s saw none connected.
            deadline = time.monotonic() + budget(5.0)
            while held < others and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            assert held == others  # the last one waits: the lane's connections are not theirs
            release = proto.release("lane", "nobody", "1-0000000000000000")  # any answer will do
            replies = await client._attempt_many([release], 2.0, lane=True)
            assert len(replies) == 1  # a lane try got a connection at once: the server answered
            let_go.set()
            await asyncio.wait(holders, timeout=5)
            assert held == others + 1 and all(t.done() for t in holders)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_a_try_cancelled_at_any_step_of_its_send_ends(server: EmbeddedServer) -> None:
    """A waiting claim cancelled (its try's timeout, a stop cutting it) at any step of its send ends.

    Python 3.11's ``asyncio.wait_for``, which redis-py sends through when a connection has a
    socket timeout, returned the send's result and dropped a cancel that came just as the send
    completed: the try then read for ever, its timeout spent, waiting for an answer the server
    gives only when a job comes (the outage chaos test's asyncio worker that did not exit after
    its SIGTERM: its batch's try on a half-open connection).  The cancel lands one loop turn
    later each round, across the send, and every try must end within a second of it.
    """

    async def main() -> list[int]:
        client = emq.Client.from_url(server.url)
        hung: list[int] = []
        try:
            for turns in range(16):
                for _ in range(4):
                    await client._attempt(proto.claim(Q, 30_000), 5.0)  # an idle connection to take
                    call = proto.claim(Q, 30_000, block_ms=60_000)
                    task = asyncio.create_task(client._attempt(call, 120.0))
                    for _ in range(turns):
                        await asyncio.sleep(0)
                    task.cancel()
                    done, _ = await asyncio.wait([task], timeout=budget(1.0))
                    if not done:
                        hung.append(turns)
                        task.cancel()  # a second cancel lands in the read: the task ends
                        await asyncio.wait([task])
        finally:
            await client.aclose()
        return hung

    assert asyncio.run(main()) == [], "tries that went on after their cancel, by loop turns before it"
