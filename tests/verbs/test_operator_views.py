"""The operator's views that the dashboard and the exporter read (issue 19): active(),
pending(), counters(), queues(), on both clients, against a real server."""

from __future__ import annotations

import asyncio

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq._protocol import counters_key, queue_of_key
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

Q = "views"
K = queue_keys(Q)


def test_active_lists_leases_soonest_first_with_the_row(client: echomq.Client, r: redis.Redis) -> None:
    for i in range(3):
        client.enqueue(Q, b"p", job_id=f"j{i}")
    a = client.claim(Q, lease_ms=60_000)
    b = client.claim(Q, lease_ms=5_000)
    assert a is not None and b is not None
    client.cancel(Q, a.id, "operator said so")
    r.hset(K.job(b.id), "stalled", 2)
    jobs = client.active(Q)
    assert [j.id for j in jobs] == [b.id, a.id]  # soonest deadline first
    first, second = jobs
    assert 0 < first.lease_left_ms <= 5_000 and 50_000 < second.lease_left_ms <= 60_000
    assert first.stalled == 2 and first.attempts == 1 and first.tries == 1
    assert second.cancel_requested and second.cancel_reason == "operator said so"
    assert not first.cancel_requested and first.cancel_reason is None
    assert first.claimed_at is not None and first.enqueued_at is not None
    assert [j.id for j in client.active(Q, offset=1, count=1)] == [a.id]
    r.zadd(K.active, {"lapsed": 1000})
    (lapsed,) = (j for j in client.active(Q) if j.id == "lapsed")
    assert lapsed.lease_left_ms < 0 and lapsed.attempts == 0 and lapsed.claimed_at is None


def test_pending_is_in_claim_order_with_the_head_waiting_longest(
    client: echomq.Client, r: redis.Redis
) -> None:
    assert client.pending(Q) == []
    client.enqueue(Q, b"p", job_id="first")
    client.enqueue(Q, b"p", job_id="second")
    (now_s, now_us) = r.time()
    now = int(now_s) * 1000 + int(now_us) // 1000
    r.hset(K.job("first"), "enqueued_at", now - 5_000)  # enqueued 5 s ago
    client.enqueue(Q, b"p", job_id="later", delay_ms=60_000)
    client.enqueue(Q, b"p", job_id="urgent", priority=-3)
    client.enqueue(Q, b"p", job_id="lazy", priority=4)
    client.enqueue(Q, b"p", job_id="gone")
    client.cancel(Q, "gone")  # its entry stays, a tombstone: not a waiting job
    jobs = client.pending(Q)
    assert [(j.id, j.priority) for j in jobs] == [
        ("urgent", -3), ("first", 0), ("second", 0), ("lazy", 4), ("later", 0)
    ]  # fmt: skip
    assert 5_000 <= jobs[1].waiting_ms < 10_000 and not jobs[1].delayed and jobs[1].due_at == 0
    assert jobs[4].delayed and jobs[4].waiting_ms == 0 and jobs[4].due_at >= now + 60_000
    # A page counts the tombstones it passes (they are not shown): 3 from 2 is second, (gone), lazy.
    assert [j.id for j in client.pending(Q, offset=2, count=3)] == ["second", "lazy"]
    # A job given back (at the head of its lane) waits since its last claim.
    r.lpush(K.pending, "back")
    r.hset(K.job("back"), mapping={"state": "pending", "claimed_at": now - 2_000, "attempts": 3, "tries": 1})
    head = client.pending(Q, count=2)[1]
    assert head.id == "back" and head.due_at == 0 and 2_000 <= head.waiting_ms < 7_000
    assert (head.attempts, head.tries) == (3, 1)


def test_counters_read_the_shared_hash_and_the_modules_death_count(
    client: echomq.Client, r: redis.Redis
) -> None:
    empty = client.counters(Q)
    assert (empty.claimed, empty.completed, empty.dead_lettered) == (0, 0, 0)
    r.hset(counters_key(Q), mapping={"claimed": 7, "completed": 5, "recovered": 1, "bogus": "x"})
    r.hset(K.metrics_failed, "count", 2)
    got = client.counters(Q)
    assert (got.claimed, got.completed, got.recovered, got.failed, got.dead_lettered) == (7, 5, 1, 0, 2)
    assert got.server_time > 0


def test_obliterate_deletes_the_shared_counters(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue(Q, b"p")
    r.hset(counters_key(Q), "completed", 3)
    client.obliterate(Q)
    assert not r.exists(counters_key(Q))


def test_queues_finds_every_queue_with_a_set_and_nothing_else(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue("mail", b"p")
    client.enqueue("thumbs", b"p")
    client.claim("thumbs", lease_ms=60_000)
    r.zadd("emq:{graveyard}:dead", {"x": 1})
    r.zadd("emq:{odd}:other", {"x": 1})  # not a queue's set
    r.set("emq:{strings}:pending", "not a list")  # TYPE list leaves it out
    r.zadd("emq:{lanes}:priority", {"x": 1})  # a queue whose jobs all have a priority
    r.zadd("emq:{later}:delayed", {"x": 1})  # ... or are all delayed
    r.zadd("unrelated", {"x": 1})
    assert client.queues() == ["graveyard", "lanes", "later", "mail", "thumbs"]
    assert client.queues(limit=1) == ["graveyard"]


def test_queues_scan_is_bounded(client: echomq.Client, r: redis.Redis) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(3000):
        pipe.set(f"filler:{i}", 1)
    pipe.execute()
    client.enqueue("needle", b"p")
    calls = []
    original = r.execute_command

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(args[0])
        return original(*args, **kwargs)  # type: ignore[arg-type]

    r.execute_command = counting  # type: ignore[method-assign]
    try:
        assert client.queues(scan_budget=1000) == ["needle"]
        first, calls[:] = list(calls), []
        assert client.queues(scan_budget=1000) == ["needle"]
    finally:
        r.execute_command = original  # type: ignore[method-assign]
    # The registry's index never filled (docs/concepts/registry.md): one step of 1000 per pass
    # (the sets, the lists, the markers), the budget whatever the keyspace holds, then it is
    # filled; from then on no SCAN at all.
    assert first == ["SISMEMBER", "SCAN", "SCAN", "SCAN", "SADD", "SSCAN"]
    assert calls == ["SISMEMBER", "SSCAN"]
    with pytest.raises(ValueError):
        client.queues(scan_budget=0)


@pytest.mark.parametrize(
    ("key", "queue"),
    [
        (b"emq:{mail}:pending", "mail"),
        ("emq:{a b}:dead", "a b"),
        (b"emq:{mail}:job:1", None),
        (b"emq:{mail}:metrics:failed", None),
        (b"emq:{}:pending", None),
        (b"emq:{a{b}:pending", None),
        (b"other:{mail}:pending", None),
    ],
)
def test_queue_of_key(key: bytes | str, queue: str | None) -> None:
    assert queue_of_key(key) == queue


def test_the_asyncio_client_reads_the_same(server: EmbeddedServer, r: redis.Redis) -> None:
    sync = echomq.Client(r)
    sync.enqueue(Q, b"p", job_id="a")
    sync.enqueue(Q, b"p", job_id="b")
    held = sync.claim(Q, lease_ms=30_000)
    assert held is not None
    r.hset(counters_key(Q), "completed", 4)

    async def scenario() -> None:
        client = emq.Client.from_url(server.url)
        try:
            assert [j.id for j in await client.active(Q)] == [held.id]
            assert [j.id for j in await client.pending(Q)] == ["b"]
            assert (await client.counters(Q)).completed == 4
            assert await client.queues() == [Q]
        finally:
            await client.aclose()

    asyncio.run(scenario())
