"""The claim path in Redis Cluster: ENQUEUEMANY, delays and waiting claims.

Three masters joined by the engine's own cli (tests/clusters.py).  redis-py's
RedisCluster routes EMQ.ENQUEUEMANY and EMQ.CLAIM by their declared key
(<pending>); the rows derived from <base> share its hash tag.  While a
queue's slot migrates, ENQUEUEMANY answers TRYAGAIN and writes nothing (as
ENQUEUE: a row it would create may live on the other node); a claim waiting
on a slot that moves away is redirected by the server (-MOVED), and
redis-py's cluster client follows it and waits on the new owner.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

import echomq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..chaos.test_resharding import SlotMove, digest
from ..clusters import owner, queue_in_slot, start_cluster, wait_for
from ..conftest import ServerFactory

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nodes(server_factory: ServerFactory) -> Iterator[list[EmbeddedServer]]:
    started = start_cluster(server_factory, 3)
    yield started
    for n in started:
        n.stop()


def cluster_client(nodes: list[EmbeddedServer]) -> echomq.Client:
    return echomq.Client(RedisCluster(host=nodes[0].host, port=nodes[0].port, socket_timeout=None))


def test_enqueue_many_delays_and_waiting_claims_reach_the_queues_owner(nodes: list[EmbeddedServer]) -> None:
    client = cluster_client(nodes)
    queues = [f"cq-{i}" for i in range(6)]  # spread over the three masters
    assert len({owner(nodes, queue_keys(q).base).port for q in queues}) > 1
    for q in queues:
        ids = client.enqueue_many(q, [b"a", (f"{q}-b", b"b")])
        assert ids[1] == f"{q}-b"
        client.enqueue(q, b"later", job_id=f"{q}-late", delay_ms=100)
        jobs = client.claim_many(q, 60_000, 5)
        assert [j.payload for j in jobs] == [b"a", b"b"]
        assert client.fail(q, jobs[0].id, jobs[0].token, "x", delay_ms=50) == "pending"
        got = client.claim_many(q, 60_000, 5, block_ms=5_000)  # waits on the owner for the due jobs
        assert {j.id for j in got} <= {jobs[0].id, f"{q}-late"} and got
    # A waiting claim woken by an enqueue from another client.
    q = queues[0]
    other = cluster_client(nodes)
    timer = threading.Timer(0.2, lambda: other.enqueue(q, b"w", job_id="woken"))
    timer.start()
    leftovers = {f"{q}-late", "woken"}
    job = client.claim(q, 60_000, block_ms=5_000)
    while job is not None and job.id != "woken":
        assert job.id in leftovers
        job = client.claim(q, 60_000, block_ms=5_000)
    assert job is not None and job.id == "woken"
    timer.join()


def test_cluster_mode_requires_the_hash_tag(nodes: list[EmbeddedServer]) -> None:
    base = "emq:notag:"
    node = owner(nodes, base + "pending").client()
    before = digest(node)
    # <pending> and <base> (declared as a not-a-key spec, for routing) without a tag hash
    # to different slots: the server refuses them itself (CROSSSLOT), or the module does.
    with pytest.raises(redis.ResponseError, match=r"must contain a hash tag|don't hash to the same slot"):
        node.execute_command("EMQ.ENQUEUEMANY", base + "pending", base, 1, "a", "p")
    with pytest.raises(redis.ResponseError, match=r"must contain a hash tag|don't hash to the same slot"):
        node.execute_command("EMQ.CLAIM", base + "pending", base + "active", base, 1000, "BLOCK", 10)
    assert digest(node) == before
    node.close()


def test_enqueuemany_answers_tryagain_while_the_slot_moves(nodes: list[EmbeddedServer]) -> None:
    keys = queue_keys(queue_in_slot(404, "many"))
    src = owner(nodes, keys.base).client()
    src.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, "j1", "payload")
    move = SlotMove(nodes, keys)
    move.migrate(keys.job("j1"))
    before = digest(move.src)
    for ids in (("j1", "j2"), ("j2", "j3")):  # a row that moved; rows absent from a migrating slot
        with pytest.raises(redis.exceptions.TryAgainError):
            move.src.execute_command("EMQ.ENQUEUEMANY", keys.pending, keys.base, 2, ids[0], "x", ids[1], "y")
    assert digest(move.src) == before
    move.finish()
    src.close()


def test_a_waiting_claim_follows_its_slot_to_the_new_owner(nodes: list[EmbeddedServer]) -> None:
    keys = queue_keys(queue_in_slot(505, "moving"))
    src_node = owner(nodes, keys.base)
    src = src_node.client()
    src.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, "delayed", "p", "DELAY", 600_000)
    raw: dict[str, Any] = {}

    def wait_raw() -> None:
        conn = src_node.client(socket_timeout=None)
        try:
            raw["reply"] = conn.execute_command(
                "EMQ.CLAIM", keys.pending, keys.active, keys.base, 60_000, "BLOCK", 0
            )
        except redis.ResponseError as exc:
            raw["error"] = type(exc).__name__, str(exc)
        conn.close()

    t = threading.Thread(target=wait_raw)
    t.start()
    wait_for(lambda: int(src.info("clients")["blocked_clients"]) == 1, "the claim waits")
    move = SlotMove(nodes, keys)
    move.finish()  # every key moved, the slot given to the destination
    t.join(10)
    assert raw.get("error") == ("MovedError", f"505 {move.dst_node.host}:{move.dst_node.port}"), raw
    # redis-py's cluster client follows the redirect and waits on the new owner.
    client = cluster_client(nodes)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(client.claim(keys.queue, 60_000, block_ms=5_000)))
    waiter.start()
    time.sleep(0.3)
    cluster_client(nodes).enqueue(keys.queue, b"x", job_id="after-move")
    waiter.join(10)
    assert got and got[0] is not None and got[0].id == "after-move"
    src.close()
