"""Issue 47, next stage: a master holding partitions of a partitioned queue fails over to its
replica (CLUSTER FAILOVER, the graceful one an operator runs) while sync and asyncio workers
run the queue: every job is done exactly once, and the promoted replica serves the partitions."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..clusters import flush, node_id, owner, start_cluster
from ..conftest import ServerFactory
from ..faults import wait_until

pytestmark = pytest.mark.slow

Q = "failed-over"
K = 9
JOBS = 3000


@pytest.fixture(scope="module")
def nodes(server_factory: ServerFactory) -> Iterator[list[EmbeddedServer]]:
    started = start_cluster(server_factory, 6, replicas=1)  # 3 masters, a replica each
    try:
        yield started
    finally:
        for n in started:
            n.stop()


def replica_of(nodes: list[EmbeddedServer], master: EmbeddedServer) -> EmbeddedServer:
    master_id = node_id(master)
    for node in nodes:
        c = node.client()
        try:
            role = c.execute_command("ROLE")
            myself = next(
                line
                for line in c.execute_command("CLUSTER", "NODES").decode().splitlines()
                if "myself" in line
            )
        finally:
            c.close()
        if role[0] == b"slave" and myself.split()[3] == master_id:
            return node
    raise AssertionError("the master has no replica")


def role(node: EmbeddedServer) -> bytes:
    c = node.client()
    try:
        return c.execute_command("ROLE")[0]  # type: ignore[no-any-return]
    finally:
        c.close()


def test_a_master_fails_over_during_a_run(nodes: list[EmbeddedServer]) -> None:
    masters = [n for n in nodes if role(n) == b"master"]
    flush(masters)
    client = echomq.Client.from_url(masters[0].url, cluster=True)
    client.declare_queue(Q, partitions=K)
    ids = client.enqueue_many(Q, [f"{i}".encode() for i in range(JOBS)])
    name = client.partitions(Q)[4]
    old = owner(nodes, queue_keys(name).base)
    new = replica_of(nodes, old)
    link = new.client()
    try:
        assert wait_until(lambda: link.info("replication").get("master_link_status") == "up", timeout=60)
    finally:
        link.close()

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
    errors: list[BaseException] = []

    def aworkers() -> None:
        async def run() -> None:
            aclient = emq.Client.from_url(masters[1].url, cluster=True)
            aworker = emq.Worker(aclient, Q, ahandler, concurrency=4, lease_ms=60_000, poll_interval=0.02)
            task = asyncio.create_task(aworker.run(handle_signals=False))
            while not stop.is_set():
                await asyncio.sleep(0.05)
            aworker.stop()
            await task
            await aclient.aclose()

        try:
            asyncio.run(run())
        except BaseException as exc:  # reported below
            errors.append(exc)

    worker = echomq.Worker(client, Q, handler, concurrency=4, lease_ms=60_000, poll_interval=0.02)
    runner = threading.Thread(target=aworkers)
    with worker:
        runner.start()
        try:
            assert wait_until(lambda: sum(done.values()) >= JOBS // 10, timeout=120)
            waiting = client.counts(name).pending
            c = new.client()
            try:
                assert c.execute_command("CLUSTER", "FAILOVER") == b"OK"
            finally:
                c.close()
            assert wait_until(lambda: role(new) == b"master" and role(old) == b"slave", timeout=60)
            assert wait_until(lambda: sum(done.values()) >= JOBS, timeout=300), sum(done.values())
        finally:
            stop.set()
            runner.join(60)
    assert not errors, errors
    assert waiting > 0, waiting  # the failover came while the partition still had work
    assert owner(nodes, queue_keys(name).base) is new
    assert set(done) == set(ids) and set(done.values()) == {1}, Counter(done.values())
    for each in client.partitions(Q):
        counts = client.counts(each)
        assert (counts.pending, counts.active, counts.dead) == (0, 0, 0), (each, counts)
    client.close()
