"""The scripts backend on a Redis Cluster without the module: routing, and slots on the move.

Each call declares the keys known before it runs (its queue's sets, the row of a named
id, a claim's record), so redis-py routes EVALSHA to the queue's node and the server
refuses it there while those keys are moving (its own TRYAGAIN or ASK).  Rows found at
run time (a claim's heads, a sweep's lapsed jobs) are checked by the script itself: an
absent one on a slot on the move answers the module's TRYAGAIN and writes nothing, on the
source and on the importing node (after ASKING), as EMQ.* does (tests/chaos/test_resharding.py).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

import echomq
import echomq.asyncio as emq
from echomq import _scripts
from echomq.cli import main
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..chaos.test_resharding import SlotMove
from ..clusters import flush, owner, queue_in_slot, start_cluster
from ..conftest import ServerFactory, needs
from ..helpers import digest, queued

pytestmark = [pytest.mark.slow, needs("script_flags", "script flags (#!lua shebangs) are Redis 7.0+")]

LIMITS = _scripts.ScriptLimits()


@pytest.fixture(scope="module")
def nodes(server_factory: ServerFactory) -> Iterator[list[EmbeddedServer]]:
    started = start_cluster(server_factory, 3, load_module=False)
    yield started
    for n in started:
        n.stop()


def as_eval(*args: Any) -> tuple[Any, ...]:
    """A module command line as the EVAL the scripts backend falls back to (no NOSCRIPT to meet)."""
    return _scripts.eval_form(_scripts.render(args, LIMITS))


def test_the_client_picks_the_scripts_and_routes_every_queue_to_its_node(
    nodes: list[EmbeddedServer], capsys: pytest.CaptureFixture[str]
) -> None:
    client = echomq.Client(RedisCluster(host=nodes[0].host, port=nodes[0].port))
    assert client.backend == "scripts"
    routed: Counter[int] = Counter()
    for i in range(12):
        q = f"sc{i}"
        keys = queue_keys(q)
        client.enqueue_many(q, [("a", b"1"), ("b", b"2"), ("c", b"3")])
        a, b = client.claim_many(q, lease_ms=60_000, count=2)
        client.checkpoint(q, a.id, a.token, 60_000, state=b"half")
        outcomes = client.extend_many(q, [(a.id, a.token), (b.id, b.token)], 60_000)
        assert outcomes == [echomq.ExtendOutcome.OK] * 2
        client.complete(q, a.id, a.token)
        assert client.fail(q, b.id, b.token, "boom", max_attempts=1) == "dead"
        assert client.cancel(q, "c", "no") == "cancelled"
        client.retry(q, "c")
        assert client.retry_dead(q).retried == 1
        client.pause(q)
        assert client.claim(q, lease_ms=1000) is None
        client.resume(q)
        c = client.claim(q, lease_ms=1000, block_ms=50)
        assert c is not None
        assert client.release(q, c.id, c.token) == "pending"
        node = owner(nodes, keys.pending)
        direct = node.client()
        assert direct.hget(keys.job("a"), "state") == b"done"
        assert queued(direct, keys) == 2
        direct.close()
        routed[node.port] += 1
        assert client.obliterate(q, force=True).removed == 2
    assert len(routed) == 3, f"the queues did not spread over every node: {routed}"
    assert main(["--cluster", "--url", nodes[1].url, "inspect", "sc0"]) == 0
    assert "backend scripts" in capsys.readouterr().out


def test_the_asyncio_client_over_the_cluster(nodes: list[EmbeddedServer]) -> None:
    async def body() -> None:
        client = emq.Client.from_url(nodes[-1].url, cluster=True)
        try:
            assert await client.detect_backend() == "scripts"
            for i in range(6):
                q = f"asc{i}"
                await client.enqueue(q, b"x", job_id="x")
                job = await client.claim(q, lease_ms=1000)
                assert job is not None and job.id == "x"
                assert await client.checkpoint(q, "x", job.token, 1000) is None
                await client.complete(q, "x", job.token)
                assert (await client.sweep(q)).expired == 0
        finally:
            await client.aclose()

    asyncio.run(body())


def tryagain(conn: redis.Redis, *args: Any) -> str:
    """The TRYAGAIN a call answers (raising anything else)."""
    with pytest.raises(redis.exceptions.TryAgainError) as refused:
        conn.execute_command(*as_eval(*args))
    return str(refused.value)


MODULES_WORDS = "a key of this queue is moving between cluster nodes; retry"


def test_a_claim_on_the_source_does_not_stub_a_head_whose_row_moved(nodes: list[EmbeddedServer]) -> None:
    """The heads of a claim are found at run time: the script itself answers TRYAGAIN."""
    flush(nodes)  # the digests below see this test's keys only
    keys = queue_keys(queue_in_slot(111, "sstub"))
    src = owner(nodes, keys.base).client()
    for job_id in ("j1", "j2"):
        src.execute_command(*as_eval("EMQ.ENQUEUE", keys.pending, keys.base, job_id, "payload"))
    src.zadd(keys.active, {"other": 2**40})
    src.hset(keys.meta, "done_ttl_ms", 60_000)  # every declared key is here: the server lets it run
    move = SlotMove(nodes, keys)
    move.migrate(keys.job("j1"))
    before = digest(move.src)
    assert MODULES_WORDS in tryagain(move.src, "EMQ.CLAIM", keys.pending, keys.active, keys.base, 60_000)
    assert digest(move.src) == before
    move.finish()
    dst = move.dst_node.client()
    assert dst.hget(keys.job("j1"), "payload") == b"payload"  # moved whole: no BUSYKEY, no stub
    dst.close()


def test_named_rows_on_a_moving_slot_are_refused_by_the_server(nodes: list[EmbeddedServer]) -> None:
    """ENQUEUE's and CANCEL's row is declared: the server refuses the call (its own TRYAGAIN)."""
    flush(nodes)  # the digests below see this test's keys only
    keys = queue_keys(queue_in_slot(222, "smoved"))
    src = owner(nodes, keys.base).client()
    src.execute_command(*as_eval("EMQ.ENQUEUE", keys.pending, keys.base, "j1", "payload"))
    move = SlotMove(nodes, keys)
    move.migrate(keys.job("j1"))
    before = digest(move.src)
    tryagain(move.src, "EMQ.ENQUEUE", keys.pending, keys.base, "j1", "again")
    tryagain(move.src, "EMQ.CANCEL", keys.pending, keys.base, "j1", "why")
    assert digest(move.src) == before
    move.finish()


def test_a_sweep_on_the_importing_node_does_not_guess_that_rows_are_gone(nodes: list[EmbeddedServer]) -> None:
    """The set moved, the lapsed rows did not yet: after ASKING the target serves any single
    key of the slot, so a script probing one row would find it absent and re-create it.
    The script asks about each absent row beside a declared key: TRYAGAIN, nothing written."""
    flush(nodes)  # the digests below see this test's keys only
    keys = queue_keys(queue_in_slot(333, "sask"))
    src = owner(nodes, keys.base).client()
    src.hset(keys.job("j1"), mapping={"state": "active", "attempts": 1, "token": "1"})
    src.zadd(keys.active, {"j1": 1000})  # lapsed long ago
    src.rpush(keys.pending, "other")
    src.zadd(keys.dead, {"older": 1})
    src.hset(keys.meta, "done_ttl_ms", 60_000)
    move = SlotMove(nodes, keys)
    move.migrate(keys.active, keys.pending, keys.dead, keys.meta)  # the declared keys: the server lets it run
    before = digest(move.dst)
    reply = move.asking(*as_eval("EMQ.SWEEP", keys.active, keys.pending, keys.dead, keys.base, 1, 10))
    assert isinstance(reply, redis.exceptions.TryAgainError), str(reply)
    assert MODULES_WORDS in str(reply)
    assert digest(move.dst) == before
    move.finish()
    dst = move.dst_node.client()
    client = echomq.Client(RedisCluster(host=nodes[0].host, port=nodes[0].port))
    result = client.sweep(keys.queue, max_stalled=5)
    assert result.recovered == ["j1"]  # once the slot has moved, the sweep does its work
    assert dst.hget(keys.job("j1"), "stalled") == b"1"
    dst.close()


def test_a_claim_on_the_importing_node_waits_for_the_heads_rows(nodes: list[EmbeddedServer]) -> None:
    flush(nodes)  # the digests below see this test's keys only
    keys = queue_keys(queue_in_slot(444, "sclaim"))
    src = owner(nodes, keys.base).client()
    src.execute_command(*as_eval("EMQ.ENQUEUE", keys.pending, keys.base, "j1", "payload"))
    src.zadd(keys.active, {"other": 2**40})
    src.hset(keys.meta, "done_ttl_ms", 60_000)
    move = SlotMove(nodes, keys)
    move.migrate(keys.pending, keys.active, keys.meta)  # the declared keys, not the head's row
    before = digest(move.dst)
    reply = move.asking(*as_eval("EMQ.CLAIM", keys.pending, keys.active, keys.base, 60_000))
    assert isinstance(reply, redis.exceptions.TryAgainError), str(reply)
    assert MODULES_WORDS in str(reply)
    assert digest(move.dst) == before
    move.finish()
