"""The operator's verbs in Redis Cluster (issue 13).

Two nodes: A serves every slot, B serves none (it is only there to be the
target of a slot migration).  Through redis-py's RedisCluster the client's
reads (TIME and SCAN go to the queue's own node) and loops work; a <base>
without a hash tag is refused; and while the queue's slot migrates away, a
derived key (a row, the settings) that is absent on A may be on B already:
every verb answers TRYAGAIN then and writes nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster, key_slot

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..helpers import cluster_args, digest

pytestmark = pytest.mark.slow

Q = queue_keys("q")
NO_TAG = "in cluster mode <base> must contain a hash tag, e.g. emq:{queue}:"


def _wait(predicate: object, what: str, timeout: float = 30.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(what)


@pytest.fixture(scope="module")
def nodes(server_factory: ServerFactory) -> Iterator[tuple[EmbeddedServer, EmbeddedServer, str]]:
    """(A, B, B's node id): A serves every slot."""
    started = []
    for _ in range(2):
        args = cluster_args()
        started.append((server_factory(args), int(args[-1])))
    (a, _), (b, b_bus) = started
    ra, rb = a.client(), b.client()
    ra.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    ra.execute_command("CLUSTER", "MEET", b.host, b.port, b_bus)
    b_id = rb.execute_command("CLUSTER", "MYID")
    b_id = b_id.decode() if isinstance(b_id, bytes) else b_id

    def ready() -> bool:
        info = [c.execute_command("CLUSTER", "INFO") for c in (ra, rb)]
        texts = [i.decode() if isinstance(i, bytes) else str(i) for i in info]
        return all("cluster_state:ok" in t and "cluster_known_nodes:2" in t for t in texts)

    _wait(ready, "two nodes, state ok")
    ra.close()
    rb.close()
    yield a, b, b_id


@pytest.fixture
def a(nodes: tuple[EmbeddedServer, EmbeddedServer, str]) -> Iterator[redis.Redis]:
    conn = nodes[0].client()
    conn.flushall()
    yield conn
    conn.execute_command("CLUSTER", "SETSLOT", key_slot(Q.base.encode()), "STABLE")
    conn.close()


def make_dead(client: echomq.Client, job_id: str) -> None:
    client.enqueue("q", b"p", job_id=job_id)
    job = client.claim("q", lease_ms=60_000)
    assert job is not None and job.id == job_id
    client.fail("q", job.id, job.token, "boom", max_attempts=1)


def test_the_client_over_redis_cluster(
    nodes: tuple[EmbeddedServer, EmbeddedServer, str], a: redis.Redis
) -> None:
    rc = RedisCluster(host=nodes[0].host, port=nodes[0].port)
    client = echomq.Client(rc)
    try:
        for i in range(3):
            make_dead(client, f"d{i}")
        client.enqueue("q", b"x", job_id="done")
        job = client.claim("q", lease_ms=60_000)
        assert job is not None
        client.complete("q", "done", job.token)
        info = client.job("q", "d0")
        assert (
            info is not None and info.state == "dead" and abs(info.server_time - time.time() * 1000) < 60_000
        )
        assert client.counts("q").dead == 3
        assert [j.id for j in client.dead("q", count=2)] == ["d0", "d1"]
        assert client.retry_dead("q", limit=2).retried == 3
        assert client.pause("q") and client.counts("q").paused
        assert client.retention("q", done_ms=-1).done_ms == -1
        result = client.obliterate("q", limit=2)
        assert result == echomq.ObliterateResult(removed=3, forgotten=1)
    finally:
        rc.close()

    async def asynchronous() -> None:
        ac = emq.Client.from_url(nodes[0].url, cluster=True)
        try:
            await ac.enqueue("q", b"x", job_id="j")
            assert (await ac.counts("q")).pending == 1
            info = await ac.job("q", "j")
            assert info is not None and info.state == "pending"
            assert (await ac.obliterate("q")).removed == 1
        finally:
            await ac.aclose()

    asyncio.run(asynchronous())
    assert [k for k in a.keys("*") if b":req:" not in k] == []  # claim records expire with their lease


def test_counts_and_groups_read_one_snapshot_in_the_queues_slot(
    nodes: tuple[EmbeddedServer, EmbeddedServer, str], a: redis.Redis
) -> None:
    rc = RedisCluster(host=nodes[0].host, port=nodes[0].port)
    client = echomq.Client(rc)
    try:
        client.enqueue_many("q", [("a0", b""), ("a1", b"")], group="a")
        client.enqueue("q", b"", "b0", group="b")
        client.enqueue("q", b"", "p7", priority=7)
        job = client.claim("q", lease_ms=60_000)
        assert job is not None
        c = client.counts("q")  # every key of both reads in the queue's slot: one MULTI each
        assert (c.pending, c.active, c.by_priority) == (3, 1, {7: 1} if job.id != "p7" else {})
        assert [(g.name, g.waiting + g.active) for g in client.groups("q")] == [("a", 2), ("b", 1)]
    finally:
        rc.close()


def test_a_base_without_a_hash_tag_is_refused(a: redis.Redis) -> None:
    base = "emq:q:"
    a.zadd(base + "dead", {"x": 1})
    a.zadd(base + "pending", {"x": 1})
    before = digest(a)
    # Without a tag, <base> and the sets hash to different slots: where the
    # server routes by <base> too (Redis 7.0 counts its NOT_KEY key spec in
    # the legacy key range) it refuses them (CROSSSLOT) before the module
    # runs; elsewhere the module's own hash-tag rule does.
    for args in (
        ["EMQ.PURGE", base + "dead", base, 5],
        ["EMQ.RETENTION", base + "pending", base],
        ["EMQ.PAUSE", base + "pending", base],
        ["EMQ.RESUME", base + "pending", base],
        ["EMQ.FORGET", base + "pending", base, "x"],
    ):
        with pytest.raises(redis.ResponseError) as info:
            a.execute_command(*args)
        refused_by_server = isinstance(info.value, redis.exceptions.ClusterCrossSlotError)
        assert refused_by_server or str(info.value) == NO_TAG, args
    # The sets of a verb that declares two or three hash to different slots:
    # the server refuses them (CROSSSLOT) before the module runs.
    for args in (
        ["EMQ.RETRY", base + "dead", base + "pending", base, "x"],
        ["EMQ.RETRYDEAD", base + "dead", base + "pending", base, 5],
        ["EMQ.OBLITERATE", base + "active", base + "pending", base + "dead", base, 5],
    ):
        with pytest.raises(redis.exceptions.ClusterCrossSlotError):
            a.execute_command(*args)
    assert digest(a) == before


def test_a_derived_key_absent_during_a_migration_answers_tryagain(
    nodes: tuple[EmbeddedServer, EmbeddedServer, str], a: redis.Redis
) -> None:
    client = echomq.Client(a)
    make_dead(client, "d")
    client.enqueue("q", b"x", job_id="w")
    a.zadd(Q.dead, {"moved": 0})  # its row is gone from A: perhaps on B already
    a.rpush(Q.pending, "moved-too")
    a.zadd(Q.active, {"held": 2**50})
    a.hset(Q.job("held"), "state", "active")
    a.execute_command("CLUSTER", "SETSLOT", key_slot(Q.base.encode()), "MIGRATING", nodes[2])
    before = digest(a)
    for args in (
        ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "moved"],
        ["EMQ.RETRYDEAD", Q.dead, Q.pending, Q.base, 5],
        ["EMQ.PURGE", Q.dead, Q.base, 5],
        ["EMQ.RETENTION", Q.pending, Q.base],  # no <base>meta on A
        ["EMQ.PAUSE", Q.pending, Q.base],
        ["EMQ.RESUME", Q.pending, Q.base],
        ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 10, "FORCE"],
        ["EMQ.FORGET", Q.pending, Q.base, "w", "moved"],
    ):
        # The module's TRYAGAIN, or the server's own where it routes by <base>
        # too (an absent key in a migrating slot): either way nothing is written.
        with pytest.raises(redis.exceptions.TryAgainError):
            a.execute_command(*args)
    assert digest(a) == before
    # The server counts <base> (never a key of its own) among the keys it
    # routes by, so while the slot migrates every verb waits; once the slot
    # is stable again, what is all here is served as usual.
    a.execute_command("CLUSTER", "SETSLOT", key_slot(Q.base.encode()), "STABLE")
    assert a.execute_command("EMQ.RETRY", Q.dead, Q.pending, Q.base, "d") == b"pending"
