"""Redis Cluster: three masters on loopback, built once for this file.

`echomq.Client` over redis-py's `RedisCluster` must reach the node that owns
each queue's slot.  redis-py finds a command's keys in the server's COMMAND
table (first key, last key, step), which the module fills when it registers
EMQ.EXTEND (keys 1..2) and EMQ.SWEEP (keys 1..3): no routing hint needed.

A queue's keys share the hash tag `{Q}`, so one command never spans slots;
a command that mixes two queues is refused by the server (CROSSSLOT) or,
when the two queues happen to share a slot, by SWEEP's own key check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster, key_slot

from echomq import Client, ExtendOutcome
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..clusters import node_id, owner, owner_and_another, start_cluster
from ..conftest import ServerFactory
from ..helpers import now_ms, sweep_args
from .test_fuzz import Resp, ServerError

pytestmark = pytest.mark.slow

NODES = 3
QUEUES = [f"queue-{i}" for i in range(24)]


@pytest.fixture(scope="module")
def cluster_nodes(server_factory: ServerFactory) -> Iterator[list[EmbeddedServer]]:
    nodes = start_cluster(server_factory, NODES)
    try:
        yield nodes
    finally:
        for n in nodes:  # stopped here even on failure (and again, harmlessly, by server_factory)
            n.stop()


@pytest.fixture(scope="module")
def rc(cluster_nodes: list[EmbeddedServer]) -> Iterator[RedisCluster]:
    first = cluster_nodes[0]
    conn = RedisCluster(host=first.host, port=first.port)
    yield conn
    conn.close()


def test_client_over_redis_cluster_routes_each_queue_to_its_node(
    rc: RedisCluster, cluster_nodes: list[EmbeddedServer]
) -> None:
    client = Client(rc)
    routed: Counter[int] = Counter()
    for q in QUEUES:
        keys = queue_keys(q)
        rc.delete(
            keys.active, keys.pending, keys.dead, keys.job("live"), keys.job("lapsed"), keys.metrics_failed
        )
        now = now_ms(rc.get_node_from_key(keys.active).redis_connection)
        rc.hset(keys.job("live"), mapping={"attempts": 2, "token": "2", "state": "active"})
        rc.hset(keys.job("lapsed"), mapping={"attempts": 1, "state": "active", "stalled": 0})
        rc.zadd(keys.active, {"live": now + 1000, "lapsed": now - 1000})

        client.extend(q, "live", token="2", lease_ms=600_000)
        result = client.sweep(q, max_stalled=2, limit=10)
        assert result.recovered == ["lapsed"] and result.dead == []

        # The work happened on the owner, and only there.
        node = owner(cluster_nodes, keys.active)
        direct = node.client()
        assert direct.zscore(keys.active, "live") >= now + 590_000
        assert direct.lrange(keys.pending, 0, -1) == [b"lapsed"]
        assert direct.hget(keys.job("lapsed"), "state") == b"pending"
        direct.close()
        for other in cluster_nodes:
            if other is not node:
                c = other.client()
                with pytest.raises(redis.exceptions.MovedError) as moved:
                    c.execute_command("EMQ.EXTEND", keys.active, keys.job("live"), "live", 2, 1000)
                assert str(moved.value).endswith(f":{node.port}")
                c.close()
        routed[node.port] += 1
    assert sum(routed.values()) == len(QUEUES) >= 12
    assert len(routed) == NODES, f"the queues did not spread over every node: {routed}"


def test_sweep_without_hash_tag_is_refused(cluster_nodes: list[EmbeddedServer]) -> None:
    # Without a tag the three sets hash as whole keys, into three slots: the
    # server refuses with CROSSSLOT before the module runs.  (No base without a
    # tag puts "active", "pending" and "dead" in one slot -- checked over all
    # 65536 CRC16 states -- so the module's own hash-tag error is the backstop.)
    base = "plain:"
    args = ["EMQ.SWEEP", base + "active", base + "pending", base + "dead", base, 1, 10]
    node = owner(cluster_nodes, base + "active")
    c = node.client()
    c.zadd(base + "active", {"x": 0})
    with pytest.raises(redis.exceptions.ClusterCrossSlotError):
        c.execute_command(*args)
    assert c.zscore(base + "active", "x") == 0
    c.delete(base + "active")
    c.close()


def twin_of(queue: str) -> str:
    """Another queue name whose keys hash to the same slot as `queue`'s."""
    slot = key_slot(queue.encode())
    for i in range(1_000_000):
        name = f"twin-{i}"
        if key_slot(name.encode()) == slot:
            return name
    raise AssertionError("no twin found")


def test_commands_mixing_two_queues_are_refused(
    rc: RedisCluster, cluster_nodes: list[EmbeddedServer]
) -> None:
    a, b = queue_keys("queue-0"), queue_keys("queue-1")
    assert key_slot(a.active.encode()) != key_slot(b.active.encode())
    c = owner(cluster_nodes, a.active).client()
    mixed = [
        ["EMQ.EXTEND", a.active, b.job("j"), "j", 1, 1000],
        ["EMQ.SWEEP", a.active, b.pending, a.dead, a.base, 1, 10],
    ]
    for args in mixed:
        with pytest.raises(redis.exceptions.ClusterCrossSlotError):
            c.execute_command(*args)
        # redis-py's cluster client refuses before sending.
        with pytest.raises(redis.exceptions.RedisClusterException, match="same key slot"):
            rc.execute_command(*args)

    # Two queues that share a slot pass the server's check; SWEEP's own key
    # check still refuses a set that is not <base> + its suffix.
    t = queue_keys(twin_of("queue-0"))
    assert key_slot(t.active.encode()) == key_slot(a.active.encode())
    with pytest.raises(redis.exceptions.ResponseError, match="must be <base>active"):
        c.execute_command("EMQ.SWEEP", a.active, t.pending, a.dead, a.base, 1, 10)
    with pytest.raises(redis.exceptions.ResponseError, match="must be <base>active"):
        c.execute_command(*sweep_args(a)[:4], t.base, 1, 10)
    c.close()


def test_command_getkeys_names_the_declared_keys(cluster_nodes: list[EmbeddedServer]) -> None:
    c = cluster_nodes[0].client()
    k = queue_keys("q")
    extend = c.execute_command("COMMAND GETKEYS", "EMQ.EXTEND", k.active, k.job("7"), "7", 3, 1000)
    sweep = c.execute_command("COMMAND GETKEYS", *sweep_args(k, 1, 10))
    assert [x.decode() if isinstance(x, bytes) else x for x in extend] == [k.active, k.job("7")]
    assert [x.decode() if isinstance(x, bytes) else x for x in sweep] == [k.active, k.pending, k.dead]
    c.close()


def test_client_from_url_with_cluster_true(cluster_nodes: list[EmbeddedServer]) -> None:
    # Any node's URL will do: the client learns the slot map from it.
    client = Client.from_url(cluster_nodes[-1].url, cluster=True)
    assert isinstance(client.redis, RedisCluster)
    for q in QUEUES[:6]:
        keys = queue_keys(q)
        direct = owner(cluster_nodes, keys.dead).client()
        client.redis.delete(keys.active, keys.pending, keys.dead, keys.job("c"), keys.job("lapsed"))
        client.redis.hset(keys.job("c"), mapping={"attempts": 9})
        client.redis.zadd(keys.active, {"c": 0})
        before = now_ms(direct)
        assert client.sweep(q, max_stalled=1).dead == ["c"]
        died = direct.zscore(keys.dead, "c")  # scored with the server time of death
        assert died is not None and before <= died <= now_ms(direct)
        direct.close()
    client.redis.close()


def test_lifecycle_verbs_route_in_the_cluster(rc: RedisCluster, cluster_nodes: list[EmbeddedServer]) -> None:
    """ENQUEUE, CLAIM, CHECKPOINT, CANCEL, COMPLETE and FAIL work on every node's queues."""
    client = Client(rc)
    nodes_used: set[int] = set()
    for q in QUEUES:
        keys = queue_keys(q)
        rc.delete(keys.active, keys.pending, keys.dead, keys.metrics_failed, *(keys.job(j) for j in "abc"))
        for j in "abc":
            client.enqueue(q, f"payload-{j}", job_id=j)
        a, b, c = (client.claim(q, lease_ms=60_000) for _ in range(3))
        assert a is not None and b is not None and c is not None
        assert {a.id, b.id, c.id} == {"a", "b", "c"}
        assert client.checkpoint(q, a.id, a.token, 60_000) is None
        assert client.cancel(q, b.id, "stop") == "requested"
        cancellation = client.checkpoint(q, b.id, b.token, 60_000)
        assert cancellation is not None and cancellation.reason == "stop"
        client.complete(q, a.id, a.token)
        assert client.fail(q, b.id, b.token, "cancelled: stop") == "cancelled"
        assert client.fail(q, c.id, c.token, "boom", max_attempts=1) == "dead"
        node = owner(cluster_nodes, keys.active)
        direct = node.client()
        assert [direct.hget(keys.job(j), "state") for j in "abc"] == [b"done", b"cancelled", b"dead"]
        direct.close()
        nodes_used.add(node.port)
    assert len(nodes_used) == NODES


def test_asyncio_client_and_cli_over_the_cluster(
    cluster_nodes: list[EmbeddedServer], capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    import echomq.asyncio as emq
    from echomq.cli import main

    first = cluster_nodes[0]

    async def body() -> list[str]:
        client = emq.Client(AsyncRedisCluster(host=first.host, port=first.port))
        ids = []
        try:
            for q in QUEUES[:6]:
                rc_keys = queue_keys(q)
                await client.redis.delete(rc_keys.pending, rc_keys.job("x"))
                ids.append(await client.enqueue(q, job_id="x"))
                job = await client.claim(q, lease_ms=1000)
                assert job is not None and job.id == "x"
                await client.complete(q, "x", job.token)
        finally:
            await client.aclose()
        return ids

    assert asyncio.run(body()) == ["x"] * 6
    for q in QUEUES[:6]:
        assert main(["--cluster", "--url", f"redis://{first.host}:{first.port}/0", "inspect", q]) == 0
        assert f"queue {q}" in capsys.readouterr().out


def test_asyncio_client_from_url_with_cluster_true(cluster_nodes: list[EmbeddedServer]) -> None:
    import asyncio

    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    import echomq.asyncio as emq

    async def body() -> None:
        # Any node's URL will do, as for the sync client.
        client = emq.Client.from_url(cluster_nodes[-1].url, cluster=True)
        assert isinstance(client.redis, AsyncRedisCluster)
        assert client.backend == "module"  # asked before any command (issue 30: it raised)
        try:
            for q in QUEUES[6:12]:
                keys = queue_keys(q)
                await client.redis.delete(keys.active, keys.pending, keys.job("y"))
                await client.enqueue(q, job_id="y")
                job = await client.claim(q, lease_ms=1000)
                assert job is not None and job.id == "y"
                assert await client.extend_many(q, [(job.id, job.token)], 1000) == [ExtendOutcome.OK]
                await client.complete(q, "y", job.token)
        finally:
            await client.aclose()

    asyncio.run(body())


# The module's words, or the server's own where it routes by <base> too (its
# NOT_KEY key spec is in the legacy key range): <base> is never a key, so it
# is always "missing" while the slot moves.
TRYAGAIN = (b"TRYAGAIN a key of this queue is moving between cluster nodes; retry",
            b"TRYAGAIN Multiple keys request during rehashing of slot")  # fmt: skip


def test_a_derived_key_on_a_moving_slot_answers_tryagain(cluster_nodes: list[EmbeddedServer]) -> None:
    """While the queue's slot migrates, a derived key (here ENQUEUE's new row) that
    is absent may live on the other node: the verb answers TRYAGAIN and writes
    nothing, on the source (which would redirect it: ASK) and on the target
    (reached with ASKING, where the row may still be on the source)."""
    q = "moving"
    keys = queue_keys(q)
    slot = key_slot(keys.pending.encode())
    source, target = owner_and_another(cluster_nodes, keys.pending)
    src, dst = source.client(), target.client()
    try:
        src.delete(keys.pending, keys.job("new"))
        src.rpush(keys.pending, "waiting")  # the declared key is here: the server lets the verb run
        src.hset(keys.job("here"), mapping={"state": "pending"})
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(source))
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(target))
        enqueue = ["EMQ.ENQUEUE", keys.pending, keys.base, "new", "p"]
        before, target_before = src.execute_command("DEBUG", "DIGEST"), dst.execute_command("DEBUG", "DIGEST")
        raw = Resp(source.port)  # raw RESP: the exact bytes (redis-py strips TRYAGAIN)
        try:
            with pytest.raises(ServerError) as refused:
                raw.call(*enqueue)
        finally:
            raw.close()
        assert refused.value.message in TRYAGAIN
        assert src.execute_command("DEBUG", "DIGEST") == before
        # On the importing node, after ASKING on the same connection (raw RESP: exact bytes).
        raw = Resp(target.port)
        try:
            asking, reply = raw.pipeline([["ASKING"], enqueue])
        finally:
            raw.close()
        assert asking == b"OK" and isinstance(reply, ServerError), reply
        assert reply.message in TRYAGAIN
        assert dst.execute_command("DEBUG", "DIGEST") == target_before
        # Once the slot is stable again, the verb runs as usual.
        for c in (src, dst):
            c.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        with pytest.raises(redis.ResponseError, match=r"^EMQEXISTS"):
            src.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, "here", "p")
    finally:
        for c in (src, dst):
            c.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        src.delete(keys.pending, keys.job("here"))
        src.close()
        dst.close()


def test_group_counts_live_in_their_queues_slot_and_a_moving_one_answers_tryagain(
    rc: RedisCluster, cluster_nodes: list[EmbeddedServer]
) -> None:
    """Groups (issue 45): a queue's ``<base>group:<g>`` is on the queue's node, moved by the claim
    and the complete routed there; while the slot migrates, a claim of a grouped job whose count
    is absent here (it may be on the other node) answers TRYAGAIN and writes nothing."""
    client = Client(rc)
    for q in QUEUES[:6]:
        keys = queue_keys(q)
        client.enqueue(q, b"", "g-a", group="tenant-1")
        job = client.claim(q, lease_ms=60_000)
        assert job is not None and job.id == "g-a"
        direct = owner(cluster_nodes, keys.active).client()
        assert direct.hget(keys.base + "group:tenant-1", "active") == b"1"
        client.complete(q, job.id, job.token)
        assert not direct.exists(keys.base + "group:tenant-1")
        direct.delete(keys.job("g-a"))
        direct.close()
    q = "moving-groups"
    keys = queue_keys(q)
    slot = key_slot(keys.pending.encode())
    source, target = owner_and_another(cluster_nodes, keys.pending)
    src, dst = source.client(), target.client()
    try:
        src.rpush(keys.pending, "w")
        src.hset(keys.job("w"), mapping={"state": "pending", "group": "g"})
        src.zadd(keys.active, {"other": 9_000_000_000_000})
        # every other key the claim opens is here, so that only the group's count is absent
        src.zadd(keys.delayed, {"later": 9_000_000_000_000})
        src.zadd(keys.priority, {"low": (5 + 1024) * 2**42 + 2**32})
        src.hset(keys.meta, "stale", 0)
        src.hset(keys.base + "limit", "backoff_until", 1)
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(source))
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(target))
        before = src.execute_command("DEBUG", "DIGEST")
        raw = Resp(source.port)
        try:
            with pytest.raises(ServerError) as refused:
                raw.call("EMQ.CLAIM", keys.pending, keys.active, keys.base, "60000")
        finally:
            raw.close()
        assert refused.value.message in TRYAGAIN
        assert src.execute_command("DEBUG", "DIGEST") == before
        for c in (src, dst):
            c.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        claimed = src.execute_command("EMQ.CLAIM", keys.pending, keys.active, keys.base, "60000")
        assert claimed[0][0] == b"w" and src.hget(keys.base + "group:g", "active") == b"1"
        src.delete(keys.base + "group:g")
    finally:
        for c in (src, dst):
            c.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        src.delete(keys.pending, keys.active, keys.job("w"), keys.delayed, keys.priority, keys.meta,
                   keys.base + "limit")
        assert not src.exists(keys.base + "group:g")
        src.close()
        dst.close()
