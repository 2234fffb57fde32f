"""The queue registry (issue 44; docs/concepts/registry.md): every queue that ever had a job is
found without a SCAN of the keyspace, on both backends, standalone and in a cluster.

The first ENQUEUE or ENQUEUEMANY of a queue makes the marker ``<base>queue`` in its atomic step
(in the queue's slot); the OBLITERATE step that empties the queue deletes it.  The clients keep
the index ``emq:queues`` beside it (SADD after an enqueue, SREM after an obliterate), and a
reader that finds the index never filled (an upgrade) fills it once from the markers and lanes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from redis.cluster import RedisCluster

import echomq
import echomq.asyncio as emq
from echomq import _protocol as proto
from echomq.keyspace import queue_keys
from echomq.metrics import QueueCollector
from echomq.testing import EmbeddedServer

from ..clusters import owner, start_cluster
from ..conftest import ServerFactory, needs

pytestmark = pytest.mark.backends

INDEX = "emq:queues"


def drain(client: echomq.Client, queue: str) -> None:
    while job := client.claim(queue, 60_000):
        client.complete(queue, job.id, job.token)


def marker(queue: str) -> str:
    return queue_keys(queue).base + "queue"


def scanned(r: redis.Redis) -> list[str]:
    """What a client would have to SCAN for: keys of the whole keyspace it examines."""
    return [k.decode() for k in r.scan_iter(count=1000)]


def test_the_first_enqueue_makes_the_marker_and_the_index_entry(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("fast", b"x", "a")
    client.enqueue_many("many", [b"1", b"2"])
    assert r.get(marker("fast")) == b"1" and r.get(marker("many")) == b"1"
    assert r.ttl(marker("fast")) == -1
    assert r.smembers(INDEX) == {b"fast", b"many"}
    if client.backend == "scripts":
        return
    # a raw verb (no client) makes the marker in its own atomic step, the index is the clients'
    r.execute_command("EMQ.ENQUEUE", queue_keys("raw").pending, queue_keys("raw").base, "i", "x")
    assert r.get(marker("raw")) == b"1" and not r.sismember(INDEX, "raw")


def test_the_marker_is_looked_up_only_when_the_default_lane_is_empty(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("busy", b"x", "a")
    r.delete(marker("busy"))  # not looked up while the lane holds an id: the busy path is free
    client.enqueue("busy", b"x", "b")
    assert not r.exists(marker("busy"))
    drain(client, "busy")
    client.enqueue("busy", b"x", "c")  # the lane was empty: looked up, made again
    assert r.get(marker("busy")) == b"1"
    client.enqueue("later", b"x", "a", delay_ms=60_000)  # a delayed job: the default lane stays empty
    assert r.get(marker("later")) == b"1"


def test_a_queue_with_a_schedule_is_registered(r: redis.Redis, client: echomq.Client) -> None:
    client.schedule("ticks", "every-minute", every_ms=60_000)
    assert r.sismember(INDEX, "ticks")


def test_a_queue_that_drained_is_listed_without_a_scan(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("fast", b"x", "a")
    client.enqueue_many("many", [b"1", b"2"])
    drain(client, "fast")
    drain(client, "many")
    client.retention("fast", done_ms=0)  # nothing of its jobs is left at all
    client.enqueue("fast", b"z", "c")
    drain(client, "fast")
    assert r.exists(queue_keys("fast").pending, queue_keys("fast").job("c")) == 0
    r.sadd(INDEX, "")  # the index was filled: a reader reads it, and nothing else
    before = r.info("commandstats").get("cmdstat_scan", {}).get("calls", 0)
    assert client.queues() == ["fast", "many"]
    assert r.info("commandstats").get("cmdstat_scan", {}).get("calls", 0) == before


def test_obliterate_takes_the_queue_out(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("gone", b"x", "a")
    client.enqueue("kept", b"x", "a")
    assert client.queues() == ["gone", "kept"]
    client.obliterate("gone")
    assert client.queues() == ["kept"]
    assert not r.exists(marker("gone")) and not r.sismember(INDEX, "gone")
    client.enqueue("gone", b"x", "b")  # a queue made again is listed again (this client forgot it)
    assert client.queues() == ["gone", "kept"]
    assert r.exists(marker("gone"))


def test_a_queue_another_process_obliterated_is_registered_again_within_a_minute(
    r: redis.Redis, client: echomq.Client
) -> None:
    other = echomq.Client(r, backend=client.backend)  # type: ignore[arg-type]
    client.enqueue("shared", b"x", "a")
    other.obliterate("shared", force=True)
    client.enqueue("shared", b"x", "b")  # registered by this client a moment ago: no SADD yet
    assert r.exists(marker("shared")) and not r.sismember(INDEX, "shared")
    client._registrations = proto.Registrations(every_s=0.0)  # as a minute later
    client.enqueue("shared", b"x", "c")
    assert r.sismember(INDEX, "shared")


def test_a_queue_made_before_the_registry_is_found_once_and_filled(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("old", b"x", "a")
    client.enqueue("drained", b"x", "a")
    drain(client, "drained")
    r.delete(INDEX, marker("old"), marker("drained"))  # as an older version left them
    client.enqueue("new", b"x", "a")  # a new client registered a new queue since the upgrade
    assert client.queues() == ["new", "old"]  # "drained" has nothing left to be found by
    assert r.smembers(INDEX) == {b"", b"new", b"old"}  # filled: the next reader does not scan
    r.set(marker("drained"), "1")
    assert client.queues() == ["new", "old"]
    assert client.queues(rescan=True) == ["drained", "new", "old"]


def test_a_producer_that_may_not_write_the_index_still_enqueues(
    r: redis.Redis, client: echomq.Client
) -> None:
    r.acl_setuser(
        "producer", enabled=True, nopass=True, keys=["%RW~emq:{p}:*"], commands=["+@all"], reset=True
    )
    kw = r.connection_pool.connection_kwargs
    conn = redis.Redis(host=kw["host"], port=kw["port"], username="producer")
    try:
        producer = echomq.Client(conn, backend=client.backend)  # type: ignore[arg-type]
        assert producer.enqueue("p", b"x", "a") == "a"
        assert producer.enqueue("p", b"y", "b") == "b"
    finally:
        conn.close()
    assert not r.sismember(INDEX, "p") and r.exists(marker("p"))
    assert "p" in client.queues(rescan=True)  # the marker stood for it


def test_the_exporter_lists_a_queue_that_drained_before_its_first_scrape(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue("blink", b"x", "a")
    drain(client, "blink")
    assert QueueCollector(client).queues() == ["blink"]


def test_the_asyncio_client_keeps_the_registry_alike(r: redis.Redis, client: echomq.Client) -> None:
    async def body() -> tuple[list[str], list[str]]:
        kw = r.connection_pool.connection_kwargs
        conn = aioredis.Redis(host=kw["host"], port=kw["port"])
        try:
            c = emq.Client(conn, backend=client.backend)  # type: ignore[arg-type]
            await c.enqueue("aq", b"x", "a")
            await c.enqueue_many("am", [b"1"])
            both = await c.queues()
            await c.obliterate("aq")
            return both, await c.queues()
        finally:
            await conn.aclose()

    both, after = asyncio.run(body())
    assert both == ["am", "aq"] and after == ["am"]
    assert r.smembers(INDEX) == {b"", b"am"}


@pytest.fixture(
    scope="module",
    params=["module", pytest.param("scripts", marks=needs("script_flags", "script flags are Redis 7.0+"))],
)
def cluster(server_factory: ServerFactory, request: pytest.FixtureRequest) -> Iterator[list[EmbeddedServer]]:
    """Three masters, with the module or without it (the scripts backend)."""
    started = start_cluster(server_factory, 3, load_module=request.param == "module")
    yield started
    for n in started:
        n.stop()


@pytest.mark.slow
def test_in_a_cluster_every_node_s_queues_are_listed_from_one_index(cluster: list[EmbeddedServer]) -> None:
    rc = RedisCluster(host=cluster[0].host, port=cluster[0].port)
    try:
        client = echomq.Client(rc)
        names = [f"c{i}" for i in range(9)]
        for q in names:
            client.enqueue(q, b"x", "a")
            drain(client, q)
        assert len({owner(cluster, marker(q)).port for q in names}) > 1  # spread over the nodes
        for q in names:
            assert owner(cluster, marker(q)).client().get(marker(q)) == b"1"
        rc.sadd(INDEX, "")
        assert client.queues() == names
        client.obliterate("c0")
        assert client.queues() == names[1:]
        rc.delete(INDEX)  # an upgrade: one scan of every primary's markers fills it
        assert client.queues() == names[1:]
        assert rc.sismember(INDEX, "")
    finally:
        rc.close()
