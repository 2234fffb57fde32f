"""Both workers and the CLI on Redis Cluster (one node holding every slot): the worker's bounded
attempts fall back to redis-py's own routing there, and `inspect`/`worker` find the module on a node."""

from __future__ import annotations

import asyncio
import socket

import pytest

import echomq
import echomq.asyncio as emq
from echomq.cli import main
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..faults import cut_connections, wait_until

Q = "clustered"
K = queue_keys(Q)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def node(server_factory: ServerFactory) -> EmbeddedServer:
    server = server_factory(
        [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-port",
            str(free_port()),
        ]
    )
    conn = server.client()
    conn.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    assert wait_until(lambda: b"cluster_state:ok" in conn.execute_command("CLUSTER", "INFO"), timeout=20)
    return server


def test_sync_and_asyncio_workers_on_a_cluster(
    node: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client = echomq.Client.from_url(node.url, cluster=True)
    for i in range(6):
        client.enqueue(Q, b"", job_id=f"j{i}")
    done: list[str] = []
    worker = echomq.Worker(client, Q, lambda ctx: done.append(ctx.id), poll_interval=0.02, concurrency=2)
    with worker:
        assert wait_until(lambda: len(done) >= 3, timeout=10), (done, worker.stats)
        worker.stop(grace=5)
    # The stop's cut of the cancel subscription (1 ms timeouts) went back to the node's pool
    # with it: the client's next command then timed out on a busy machine (make test, twice).
    assert cut_connections(client) == []

    async def rest() -> None:
        aclient = emq.Client.from_url(node.url, cluster=True)

        async def handler(ctx: emq.JobContext) -> None:
            await ctx.checkpoint()
            done.append(ctx.id)

        aworker = emq.Worker(aclient, Q, handler, poll_interval=0.02)
        task = asyncio.create_task(aworker.run(handle_signals=False))
        for _ in range(500):
            if len(done) == 6:
                break
            await asyncio.sleep(0.02)
        aworker.stop()
        await task
        await aclient.aclose()

    asyncio.run(rest())
    assert sorted(done) == [f"j{i}" for i in range(6)]
    assert all(client.redis.hget(K.job(f"j{i}"), "state") == b"done" for i in range(6))
    assert main(["--cluster", "--url", node.url, "inspect", Q]) == 0
    assert "pending 0   active 0" in capsys.readouterr().out


def test_tasks_and_their_results_on_a_cluster(node: EmbeddedServer) -> None:
    # Issue 29: a wait subscribes with SSUBSCRIBE on the node of the queue's slot (redis-py's
    # ClusterPubSub routes it), then reads the row there; both clients.
    app = echomq.App(echomq.Client.from_url(node.url, cluster=True), queue="tasks-clustered")

    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    handle = add.enqueue(2, 3)
    with app.worker(poll_interval=0.02, grace=0.5):
        assert handle.result(timeout=20) == 5

    async def aio() -> int:
        client = emq.Client.from_url(node.url, cluster=True)
        try:
            value = await client.result("tasks-clustered", handle.id, timeout=5)
        finally:
            await client.aclose()
        assert isinstance(value, int)
        return value

    assert asyncio.run(aio()) == 5
