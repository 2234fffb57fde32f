"""Priorities (issue 31; docs/concepts/priorities.md): levels from -1000 to 1000, smaller first,
first in first out within a level whatever the ids, on both backends.

A level other than 0 waits in ``<base>priority`` (score ``(level + 1024) * 2^42 + seq``); level
0 in the list ``<pending>``.  A job given back (RELEASE) or recovered (SWEEP) goes to the head
of its level, a retried one (FAIL below its budget, RETRY, RETRYDEAD) to the tail, a delayed
one to the tail of its level when it comes due.
"""

from __future__ import annotations

import random
import threading

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer, queue_problems

from ..helpers import SEQ_LIMIT, digest, entries, now_ms

pytestmark = [pytest.mark.backends, pytest.mark.memcheck]

LEVELS = [-1000, -7, -1, 0, 0, 0, 1, 2, 1000]


def claim_all(client: echomq.Client, queue: str, count: int = 1000) -> list[str]:
    out: list[str] = []
    while jobs := client.claim_many(queue, 60_000, count):
        out += [job.id for job in jobs]
    return out


def test_ten_thousand_jobs_of_mixed_levels_are_claimed_in_exact_order(
    r: redis.Redis, client: echomq.Client
) -> None:
    """Runs of random levels, random ids (so only the seq can keep the order): the claims take
    every job once, by level, then in enqueue order -- whatever the batch a claim takes."""
    rng = random.Random(31)
    enqueued: list[tuple[int, int, str]] = []
    while len(enqueued) < 10_000:
        level = rng.choice(LEVELS)
        run = [(f"{rng.getrandbits(48):012x}", b"") for _ in range(rng.randint(1, 60))]
        client.enqueue_many("mix", run, priority=level)
        enqueued += [(level, len(enqueued) + i, job_id) for i, (job_id, _) in enumerate(run)]
    counts = client.counts("mix")
    assert counts.pending == len(enqueued)
    expected_levels = {level: sum(1 for e in enqueued if e[0] == level) for level in set(LEVELS)}
    assert counts.by_priority == {k: v for k, v in sorted(expected_levels.items()) if v}
    claimed: list[str] = []
    while jobs := client.claim_many("mix", 60_000, rng.choice([1, 7, 100, 1000])):
        claimed += [job.id for job in jobs]
    assert claimed == [job_id for _, _, job_id in sorted(enqueued)]
    assert client.counts("mix").pending == 0
    assert queue_problems(r, "mix") == []


def test_levels_go_before_and_after_the_default_lane(r: redis.Redis, client: echomq.Client) -> None:
    for job_id, level in (("a", 0), ("b", 5), ("c", -5), ("d", 0), ("e", 5), ("f", -1000), ("g", 1000)):
        client.enqueue("q", b"", job_id, priority=level)
    keys = queue_keys("q")
    assert entries(r, keys) == [b"a", b"d"]  # only level 0 in the list
    assert r.hget(keys.job("a"), "priority") is None  # written only when not 0
    assert r.hget(keys.job("b"), "priority") == b"5"
    assert [p.id for p in client.pending("q")] == ["f", "c", "a", "d", "b", "e", "g"]
    assert [p.priority for p in client.pending("q")] == [-1000, -5, 0, 0, 5, 5, 1000]
    assert claim_all(client, "q", 2) == ["f", "c", "a", "d", "b", "e", "g"]


def test_jobs_due_in_the_past_are_claimed_oldest_due_time_first_within_each_level(
    r: redis.Redis, client: echomq.Client
) -> None:
    # Django's rule for due tasks of one priority (issue 43, cause 5): a job due 10 hours ago
    # runs before one due 2 hours ago, even when enqueued after it.  Before, an AT in the past
    # meant "now" and jobs ran in the order they were enqueued.  Levels still come first.
    now, hour = now_ms(r), 3_600_000
    for job_id, hours_ago, level in (
        ("p0-2h", 2, 0), ("p0-10h", 10, 0), ("p0-1h", 1, 0),
        ("p20-2h", 2, -20), ("p20-10h", 10, -20), ("p3-5h", 5, 3), ("p3-6h", 6, 3),
    ):  # fmt: skip
        client.enqueue("q", b"", job_id, run_at_ms=now - hours_ago * hour, priority=level)
    assert claim_all(client, "q", 3) == ["p20-10h", "p20-2h", "p0-10h", "p0-2h", "p0-1h", "p3-6h", "p3-5h"]
    assert queue_problems(r, "q") == []


def test_a_bad_priority_is_refused_and_writes_nothing(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    client.enqueue("q", b"", "x")
    before = digest(r)
    for bad in ("1001", "-1001", "1.5", "x", "", "+1", "01", "-0"):
        with pytest.raises(redis.ResponseError, match="PRIORITY must be an integer from -1000 to 1000"):
            client._send(("EMQ.ENQUEUE", keys.pending, keys.base, "y", "p", "PRIORITY", bad))
    for bad_level in (1001, -1001, True):
        with pytest.raises((ValueError, TypeError)):
            client.enqueue("q", b"", "y", priority=bad_level)
    assert digest(r) == before


def test_release_and_recovery_go_to_the_head_of_their_level(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    for job_id, level in (("a", 5), ("b", 5), ("c", 0), ("d", 0), ("e", -2)):
        client.enqueue("q", b"", job_id, priority=level)
    e, c, d, a = client.claim_many("q", 60_000, 4)
    assert [e.id, c.id, d.id, a.id] == ["e", "c", "d", "a"]
    client.enqueue("q", b"", "f", priority=5)
    client.enqueue("q", b"", "g", priority=-2)
    client.enqueue("q", b"", "h")
    assert client.release("q", "a", a.token) == "pending"  # ahead of b and f, not behind them
    assert client.release("q", "c", c.token) == "pending"  # ahead of h
    r.zadd(keys.active, {"e": 1}, xx=True)  # e's holder died: its lease lapsed
    assert client.sweep("q", max_stalled=5).recovered == ["e"]  # ahead of g, which came in after it
    head = r.zscore(keys.priority, "a")  # below every tail of level 5: a seq under 2^32
    assert head is not None and (5 + 1024) * SEQ_LIMIT <= head < (5 + 1024) * SEQ_LIMIT + 2**32
    assert queue_problems(r, "q") == []
    assert claim_all(client, "q", 1) == ["e", "g", "c", "h", "a", "b", "f"]


@pytest.mark.parametrize("level", [-3, 0, 3])
def test_jobs_put_back_go_first_the_last_one_first_at_every_level(
    r: redis.Redis, client: echomq.Client, level: int
) -> None:
    """One rule at every level (docs/concepts/priorities.md): a job given back goes before every
    job waiting at its level, the last one given back first -- as level 0's LPUSH does, whatever
    the ids (level 3 used to tie them all at seq 0 and take them in id order)."""
    for job_id in ("m", "z", "b", "w"):
        client.enqueue("q", b"", job_id, priority=level)
    held = {job.id: job for job in client.claim_many("q", 60_000, 3)}
    assert sorted(held) == ["b", "m", "z"]
    for job_id in ("m", "z", "b"):  # three calls: m first, b last
        assert client.release("q", job_id, held[job_id].token) == "pending"
    assert queue_problems(r, "q") == []
    assert claim_all(client, "q", 1) == ["b", "z", "m", "w"]


@pytest.mark.parametrize("level", [-3, 0, 3])
def test_a_sweep_puts_its_recovered_back_in_deadline_order_before_the_released(
    r: redis.Redis, client: echomq.Client, level: int
) -> None:
    """The jobs one call puts back (a sweep's recoveries) go in that call's order, the first one
    first, and before the jobs put back by the calls before it: the same at every level."""
    keys = queue_keys("q")
    for job_id in ("a", "b", "c", "d"):
        client.enqueue("q", b"", job_id, priority=level)
    held = {job.id: job for job in client.claim_many("q", 60_000, 3)}
    assert client.release("q", "c", held["c"].token) == "pending"
    r.zadd(keys.active, {"a": 2, "b": 1}, xx=True)  # both holders died; b's lease lapsed first
    assert client.sweep("q", max_stalled=5).recovered == ["b", "a"]
    assert queue_problems(r, "q") == []
    assert claim_all(client, "q", 1) == ["b", "a", "c", "d"]


def test_a_level_emptied_and_refilled_starts_its_heads_afresh(r: redis.Redis, client: echomq.Client) -> None:
    """A head's seq is one less than its level's first job: claimed away, the next release starts
    again just under the tails (no drift towards seq 0 while a level keeps working)."""
    keys = queue_keys("q")
    client.enqueue("q", b"", "a", priority=2)
    client.enqueue("q", b"", "t", priority=2)
    tail = r.zscore(keys.priority, "t")
    for _ in range(3):
        job = client.claim("q", 60_000)
        assert job is not None and job.id == "a"
        assert client.release("q", "a", job.token) == "pending"
        assert r.zscore(keys.priority, "a") == (2 + 1024) * SEQ_LIMIT + 2**32 - 1
    assert r.zscore(keys.priority, "t") == tail
    assert claim_all(client, "q") == ["a", "t"]


def test_retries_keep_the_level_and_go_to_its_tail(r: redis.Redis, client: echomq.Client) -> None:
    for job_id in ("a", "b"):
        client.enqueue("q", b"", job_id, priority=3)
    a = client.claim("q", 60_000)
    assert a is not None and a.id == "a"
    assert client.fail("q", "a", a.token, "E: boom", max_attempts=3) == "pending"
    client.enqueue("q", b"", "c", priority=3)
    client.enqueue("q", b"", "z", priority=4)
    assert claim_all(client, "q", 1) == ["b", "a", "c", "z"]
    # dead, then retried by the operator: back at the tail of its level, behind d
    client.enqueue("r", b"", "a", priority=3)
    first = client.claim("r", 60_000)
    assert first is not None and first.id == "a"
    assert client.fail("r", "a", first.token, "E: again", max_attempts=1) == "dead"
    client.enqueue("r", b"", "d", priority=3)
    client.enqueue("r", b"", "e", priority=2)
    client.retry("r", "a")
    info = client.job("r", "a")
    assert info is not None and info.priority == 3
    assert claim_all(client, "r", 1) == ["e", "d", "a"]
    assert queue_problems(r, "q") == [] and queue_problems(r, "r") == []


def test_a_delayed_job_takes_its_level_when_due(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    client.enqueue("q", b"", "x", priority=-1, delay_ms=3_600_000)
    client.enqueue("q", b"", "y")
    client.enqueue("q", b"", "w", priority=-1)
    assert client.job("q", "x").priority == -1  # type: ignore[union-attr]
    assert r.zscore(keys.delayed, "x") is not None and r.zscore(keys.priority, "x") is None
    counts = client.counts("q")
    assert (counts.pending, counts.delayed, counts.by_priority) == (2, 1, {-1: 1, 0: 1})
    w = client.claim("q", 60_000)
    assert w is not None and w.id == "w"
    r.zadd(keys.delayed, {"x": now_ms(r) - 10}, xx=True)  # x came due (no sleeping in tests)
    assert client.counts("q").pending == 2  # due: counted as claimable before a claim moves it
    client.enqueue("q", b"", "v", priority=-1)  # in before x is moved: x goes to the tail, behind it
    got = client.claim_many("q", 60_000, 3)
    assert [j.id for j in got] == ["v", "x", "y"]
    # a failed try with a backoff waits in <base>delayed, then goes back to its level
    x = got[1]
    assert client.fail("q", "x", x.token, "E: later", max_attempts=5, delay_ms=3_600_000) == "pending"
    assert r.zscore(keys.delayed, "x") is not None
    client.enqueue("q", b"", "u", priority=-1)
    r.zadd(keys.delayed, {"x": 1}, xx=True)
    assert claim_all(client, "q", 1) == ["u", "x"]
    assert queue_problems(r, "q") == []


def test_a_corrupt_level_in_a_row_is_refused_where_the_job_goes_back(
    r: redis.Redis, client: echomq.Client
) -> None:
    keys = queue_keys("q")
    client.enqueue("q", b"", "a", priority=2)
    job = client.claim("q", 60_000)
    assert job is not None
    r.hset(keys.job("a"), "priority", "high")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="'priority' field is not an integer from -1000 to 1000"):
        client.release("q", "a", job.token)
    with pytest.raises(redis.ResponseError, match="'priority' field is not an integer from -1000 to 1000"):
        client.fail("q", "a", job.token, "E: x", max_attempts=3)
    assert digest(r) == before
    assert client.fail("q", "a", job.token, "E: x", max_attempts=1) == "dead"  # no lane needed


def test_pause_holds_every_level(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"", "a", priority=-3)
    client.enqueue("q", b"", "b")
    client.pause("q")
    assert client.claim("q", 60_000) is None
    client.resume("q")
    assert claim_all(client, "q") == ["a", "b"]


def test_obliterate_and_forget_clear_the_levels(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    client.enqueue("q", b"", "a", priority=-3)
    client.enqueue("q", b"", "b", priority=0)
    client.enqueue("q", b"", "c", priority=9, delay_ms=3_600_000)
    client.cancel("q", "b")  # a tombstone in the list
    assert client.obliterate("q").removed == 2  # the jobs a and c; the tombstone is no job
    assert not r.exists(keys.priority, keys.delayed, keys.pending, keys.job("a"), keys.job("c"))
    assert queue_problems(r, "q") == []


def test_the_blocking_claim_wakes_for_a_job_of_any_level(r: redis.Redis, client: echomq.Client) -> None:
    if client.backend == "scripts":
        pytest.skip("the scripts backend polls: it has no blocked claim to wake")
    got: list[echomq.Job | None] = []
    waiter = threading.Thread(target=lambda: got.append(client.claim("q", 60_000, block_ms=20_000)))
    waiter.start()
    deadline = 200
    while not [c for c in r.client_list() if c.get("cmd") == "emq.claim"] and deadline:
        deadline -= 1
        threading.Event().wait(0.05)
    client.enqueue("q", b"", "p", priority=7)
    waiter.join(30)
    assert [j.id for j in got if j] == ["p"]


def test_blocked_claims_are_served_in_order_the_most_urgent_job_first(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer
) -> None:
    """Two claims waiting, first come first served: the one that blocked first gets the most urgent
    of the jobs that arrive together (one MULTI), the second the next."""
    if client.backend == "scripts":
        pytest.skip("the scripts backend polls: it has no blocked claim to wake")
    got: dict[str, list[str]] = {}

    def wait(name: str) -> None:
        own = echomq.Client(server.client())
        got[name] = [j.id for j in own.claim_many("q", 60_000, 1, block_ms=20_000)]

    def blocked_until(n: int) -> None:
        for _ in range(500):
            if len([c for c in r.client_list() if c.get("cmd") == "emq.claim"]) >= n:
                return
            threading.Event().wait(0.02)
        raise AssertionError(f"{n} claims never blocked")

    waiters = [threading.Thread(target=wait, args=(name,)) for name in ("first", "second")]
    for n, waiter in enumerate(waiters, 1):
        waiter.start()
        blocked_until(n)
    keys = queue_keys("q")
    pipe = r.pipeline(transaction=True)
    pipe.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, "low", b"", "PRIORITY", 5)
    pipe.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, "plain", b"")
    pipe.execute_command("EMQ.ENQUEUE", keys.pending, keys.base, "urgent", b"", "PRIORITY", -5)
    pipe.execute()
    for waiter in waiters:
        waiter.join(30)
    assert got == {"first": ["urgent"], "second": ["plain"]}
    assert [j.id for j in client.claim_many("q", 60_000, 5)] == ["low"]
