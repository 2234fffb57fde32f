"""Issue 47, next stage: a partitioned queue's partition moves to another master while sync and
asyncio workers run it (its slot migrated key by key, as `redis-cli --cluster reshard` does):
every job is done exactly once, none lost, and the partition is then served by the other node."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from redis.cluster import key_slot

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..clusters import flush, node_id, owner, start_cluster
from ..conftest import ServerFactory
from ..faults import wait_until

pytestmark = pytest.mark.slow

Q = "resharded"
K = 9
JOBS = 3000


@pytest.fixture(scope="module")
def nodes(server_factory: ServerFactory) -> Iterator[list[EmbeddedServer]]:
    started = start_cluster(server_factory, 3)
    try:
        yield started
    finally:
        for n in started:
            n.stop()


def move_slot(nodes: list[EmbeddedServer], slot: int, src: EmbeddedServer, dst: EmbeddedServer) -> int:
    """Migrate ``slot`` from ``src`` to ``dst`` a key at a time; the keys moved."""
    s, d = src.client(), dst.client()
    moved = 0
    try:
        d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(src))
        s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(dst))
        while keys := s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 20):
            for key in keys:
                s.execute_command("MIGRATE", dst.host, dst.port, key, 0, 5000)
                moved += 1
            time.sleep(0.005)  # the workers' commands interleave with the move
        for node in nodes:
            c = node.client()
            try:
                c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_id(dst))
            finally:
                c.close()
    finally:
        s.close()
        d.close()
    return moved


def test_a_partition_moves_between_masters_during_a_run(nodes: list[EmbeddedServer]) -> None:
    flush(nodes)
    client = echomq.Client.from_url(nodes[0].url, cluster=True)
    client.declare_queue(Q, partitions=K)
    ids = client.enqueue_many(Q, [f"{i}".encode() for i in range(JOBS)])
    name = client.partitions(Q)[4]
    keys = queue_keys(name)
    slot = key_slot(keys.base.encode())
    src = owner(nodes, keys.base)
    dst = next(n for n in nodes if n is not src)

    done: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(ctx: echomq.JobContext) -> None:
        time.sleep(0.001)
        with lock:
            done[ctx.id] += 1

    async def ahandler(ctx: emq.JobContext) -> None:
        await asyncio.sleep(0.001)
        with lock:
            done[ctx.id] += 1

    stop = threading.Event()

    def aworkers() -> None:
        async def run() -> None:
            aclient = emq.Client.from_url(nodes[1].url, cluster=True)
            aworker = emq.Worker(aclient, Q, ahandler, concurrency=4, lease_ms=60_000, poll_interval=0.02)
            task = asyncio.create_task(aworker.run(handle_signals=False))
            while not stop.is_set():
                await asyncio.sleep(0.05)
            aworker.stop()
            await task
            await aclient.aclose()

        asyncio.run(run())

    worker = echomq.Worker(client, Q, handler, concurrency=4, lease_ms=60_000, poll_interval=0.02)
    runner = threading.Thread(target=aworkers)
    with worker:
        runner.start()
        try:
            assert wait_until(lambda: sum(done.values()) >= JOBS // 10, timeout=120)
            waiting = client.counts(name).pending
            moved = move_slot(nodes, slot, src, dst)
            assert wait_until(lambda: sum(done.values()) >= JOBS, timeout=300), sum(done.values())
        finally:
            stop.set()
            runner.join(60)
    assert waiting > 0 and moved > 0, (waiting, moved)  # the move overlapped the run
    redirected = 0  # and the workers met it: ASK/TRYAGAIN answers of the two nodes
    for node in (src, dst):
        c = node.client()
        try:
            stats = c.info("errorstats")
        finally:
            c.close()
        redirected += sum(
            int(v["count"]) for k, v in stats.items() if k in ("errorstat_ASK", "errorstat_TRYAGAIN")
        )
    assert redirected > 0, "the workers never met the moving slot: the test proves nothing"
    assert owner(nodes, keys.base) is dst
    assert set(done) == set(ids) and set(done.values()) == {1}, Counter(done.values())
    for each in client.partitions(Q):
        counts = client.counts(each)
        assert (counts.pending, counts.active, counts.dead) == (0, 0, 0), (each, counts)
    for job_id in ids[:: JOBS // 30]:
        info = client.job(Q, job_id)
        assert info is not None and info.state == "done", (job_id, info)
    client.close()
