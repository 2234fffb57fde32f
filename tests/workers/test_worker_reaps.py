"""Every worker sweeps (issue 30): a crashed worker's jobs come back without a Reaper.

Before issue 30 nobody recovered a job whose worker was killed with
``kill -9`` unless a ``Reaper`` (or ``echomq reap``) ran: the job stayed
active, lapsed, for as long as nobody swept, and so did the dead retention.
Now every ``Worker`` (threads or asyncio) sweeps its queue itself, a few
small sweeps a turn every ``reap_interval`` seconds, jittered, unless
``reap=False``.  Both backends.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..faults import wait_until

pytestmark = pytest.mark.backends

Q = "reaps"
K = queue_keys(Q)
LEASE_MS = 800

# A worker process that claims the job and hangs in its handler until killed.
HANGING = textwrap.dedent(
    """
    import sys, time, echomq, redis
    client = echomq.Client(redis.Redis.from_url(sys.argv[1]))
    def handler(ctx):
        print("running", flush=True)
        time.sleep(3600)
    echomq.Worker(client, sys.argv[2], handler, lease_ms=int(sys.argv[3])).run()
    """
)


def crashed_worker_holding(server: EmbeddedServer, r: redis.Redis, job_id: str) -> None:
    """Enqueue ``job_id``, let a worker process claim it, and kill it with SIGKILL: the job stays active."""
    echomq.Client(r).enqueue(Q, b"", job_id=job_id)
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGING, server.url, Q, str(LEASE_MS)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "running"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    assert r.zscore(K.active, job_id) is not None  # held by nobody until a sweep


def run_worker(
    server: EmbeddedServer,
    mode: str,
    handler_ran: list[str],
    seconds: float,
    reaped: int = 0,
    **kwargs: object,
) -> echomq.WorkerStats:
    """A plain worker of Q (``kwargs`` added) for ``seconds``, or until a handler ran; its stats.

    With ``reaped``, until its sweeps have also counted that many: the job a sweep recovered
    can be claimed and run before the sweep's own answer is read (another connection), and a
    stop then would cancel the sweep's task with its count (what was taken stays taken).
    """
    if mode == "sync":

        def handler(ctx: echomq.JobContext) -> None:
            handler_ran.append(ctx.id)

        worker = echomq.Worker(echomq.Client(server.client()), Q, handler, **kwargs)  # type: ignore[arg-type]
        with worker:
            wait_until(lambda: bool(handler_ran) and worker.stats.reaped >= reaped, timeout=seconds)
        return worker.stats

    async def main() -> echomq.WorkerStats:
        async def handler(ctx: emq.JobContext) -> None:
            handler_ran.append(ctx.id)

        client = emq.Client(redis.asyncio.Redis(port=server.port))
        worker = emq.Worker(client, Q, handler, **kwargs)  # type: ignore[arg-type]
        async with worker:
            deadline = time.monotonic() + seconds
            while not (handler_ran and worker.stats.reaped >= reaped) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        await client.aclose()
        return worker.stats

    return asyncio.run(main())


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_killed_workers_job_is_recovered_by_another_plain_worker(
    server: EmbeddedServer, r: redis.Redis, mode: str
) -> None:
    crashed_worker_holding(server, r, "J")
    ran: list[str] = []
    stats = run_worker(server, mode, ran, seconds=20, reaped=1, reap_interval=0.3)
    assert ran == ["J"]
    assert stats.reaped == 1 and stats.completed == 1
    row = r.hgetall(K.job("J"))
    assert row[b"state"] == b"done" and row[b"stalled"] == b"1"


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_worker_told_not_to_reap_leaves_the_lapsed_job_to_a_reaper(
    server: EmbeddedServer, r: redis.Redis, mode: str
) -> None:
    crashed_worker_holding(server, r, "J")
    ran: list[str] = []
    stats = run_worker(server, mode, ran, seconds=2.5, reap=False, reap_interval=0.3)
    assert ran == [] and stats.reaped == 0
    assert r.zscore(K.active, "J") is not None  # still lapsed: nobody swept
    assert echomq.Client(r).sweep(Q, max_stalled=3).recovered == ["J"]


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_workers_sweep_applies_the_dead_retention(
    server: EmbeddedServer, r: redis.Redis, mode: str
) -> None:
    client = echomq.Client(r)
    client.enqueue(Q, b"", job_id="D")
    job = client.claim(Q, lease_ms=10_000)
    assert job is not None
    assert client.fail(Q, "D", job.token, "boom", max_attempts=1) == "dead"
    client.retention(Q, dead_ms=1)
    time.sleep(0.05)
    run_worker(server, mode, [], seconds=2.0, reap_interval=0.3)
    assert r.zcard(K.dead) == 0 and not r.exists(K.job("D"))


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_workers_reap_settings_are_checked(mode: str) -> None:
    cls = echomq.Worker if mode == "sync" else emq.Worker
    client = echomq.Client(redis.Redis()) if mode == "sync" else emq.Client(redis.asyncio.Redis())
    handler = (lambda ctx: None) if mode == "sync" else _ahandler
    with pytest.raises(TypeError, match="reap must be a bool"):
        cls(client, Q, handler, reap="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reap_interval"):
        cls(client, Q, handler, reap_interval=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_stalled"):
        cls(client, Q, handler, max_stalled=0)  # type: ignore[arg-type]


async def _ahandler(ctx: emq.JobContext) -> None:
    return None
