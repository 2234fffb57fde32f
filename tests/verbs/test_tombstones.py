"""Tombstones and the bounded steps of the ready structures (docs/reference/keyspace.md).

CANCEL of a job waiting in ``<pending>`` leaves its entry (removing it from the middle of a list
would be O(n)) and counts it in ``<base>meta``'s ``stale``; claims drop such entries, at most
1,000 per call.  Claims (and sweeps) first move due ``<base>delayed`` members to their lanes, at
most 1,000 per call.  Whatever the order of verbs: counts stay exact (``stale`` is the list's
length less the pending jobs in it), no job is claimed twice, every waiting job is claimed.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
import redis

import echomq
from echomq.cli import main
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer, queue_problems

from ..helpers import entries, now_ms

pytestmark = [pytest.mark.backends, pytest.mark.smoke, pytest.mark.memcheck]

BOUND = 1000  # EMQ_DROP_MAX and EMQ_PROMOTE_MAX (module/emq_core.h; the prelude's twins)


def stale(r: redis.Redis, queue: str) -> int:
    return int(r.hget(queue_keys(queue).meta, "stale") or 0)


def test_a_cancelled_waiting_job_is_never_claimed(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    for job_id in ("a", "b", "c"):
        client.enqueue("q", b"", job_id)
    assert client.cancel("q", "b") == "cancelled"
    assert entries(r, keys) == [b"a", b"b", b"c"]  # the entry stays: a tombstone
    assert stale(r, "q") == 1
    counts = client.counts("q")
    assert (counts.pending, counts.stale) == (2, 1)
    assert [p.id for p in client.pending("q")] == ["a", "c"]
    assert client.cancel("q", "b") == "finished"  # the second CANCEL counts nothing
    assert stale(r, "q") == 1
    assert [j.id for j in client.claim_many("q", 60_000, 10)] == ["a", "c"]
    assert entries(r, keys) == [] and stale(r, "q") == 0
    assert client.claim("q", 60_000) is None
    assert queue_problems(r, "q") == []


def test_cancel_expire_and_enqueue_the_same_id_again(r: redis.Redis, client: echomq.Client) -> None:
    """The old entry names the new job: the job is claimed once, at one of its two places, and
    the other entry is counted stale until a claim drops it."""
    keys = queue_keys("q")
    client.retention("q", cancelled_ms=0)  # a cancelled row goes at once
    client.enqueue("q", b"old", "a")
    client.enqueue("q", b"", "b")
    assert client.cancel("q", "a") == "cancelled"
    assert not r.exists(keys.job("a"))
    client.enqueue("q", b"new", "a")  # the id is free again
    assert entries(r, keys) == [b"a", b"b", b"a"]
    assert stale(r, "q") == 1 and client.counts("q").pending == 2
    assert queue_problems(r, "q") == []
    first = client.claim("q", 60_000)
    assert first is not None and (first.id, first.payload) == ("a", b"new")
    assert client.counts("q").pending == 1 and queue_problems(r, "q") == []
    assert [j.id for j in client.claim_many("q", 60_000, 10)] == ["b"]  # the second "a" is dropped
    assert entries(r, keys) == [] and stale(r, "q") == 0
    client.complete("q", "a", first.token)
    assert queue_problems(r, "q") == []


def test_retry_of_a_cancelled_waiting_job(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    for job_id in ("a", "b"):
        client.enqueue("q", b"", job_id)
    client.cancel("q", "a")
    client.retry("q", "a")  # pending again: a new entry at the tail, the old one stays
    assert entries(r, keys) == [b"a", b"b", b"a"]
    counts = client.counts("q")
    assert (counts.pending, counts.stale) == (2, 1)
    assert queue_problems(r, "q") == []
    claimed = [j.id for j in client.claim_many("q", 60_000, 10)]
    assert sorted(claimed) == ["a", "b"]  # each once, never twice
    assert client.claim("q", 60_000) is None
    assert entries(r, keys) == [] and stale(r, "q") == 0
    assert queue_problems(r, "q") == []


def test_a_long_run_of_tombstones_is_dropped_in_bounded_steps(r: redis.Redis, client: echomq.Client) -> None:
    """2,100 cancelled jobs before a live one: two claims drop 1,000 each and answer nothing,
    the third drops the last 100 and claims."""
    keys = queue_keys("q")
    client.enqueue_many("q", [(f"t{i:04}", b"") for i in range(2100)])
    client.enqueue("q", b"", "live")
    pipe = r.pipeline(transaction=False)
    for i in range(2100):
        pipe.execute_command(*client_cancel_args(client, f"t{i:04}"))
    pipe.execute()
    assert stale(r, "q") == 2100 and client.counts("q").pending == 1
    assert client.claim("q", 60_000) is None
    assert stale(r, "q") == 1100 and r.llen(keys.pending) == 1101
    assert client.claim("q", 60_000) is None
    assert stale(r, "q") == 100 and client.counts("q").pending == 1
    job = client.claim("q", 60_000)
    assert job is not None and job.id == "live"
    assert stale(r, "q") == 0 and r.llen(keys.pending) == 0
    assert queue_problems(r, "q") == []


def client_cancel_args(client: echomq.Client, job_id: str) -> tuple[object, ...]:
    """EMQ.CANCEL as the client's backend sends it (a pipeline of them is quicker than 2,100 calls)."""
    keys = queue_keys("q")
    args = ("EMQ.CANCEL", keys.pending, keys.base, job_id, "")
    if client.backend == "module":
        return args
    from echomq import _scripts

    return _scripts.eval_form(_scripts.render(args, _scripts.ScriptLimits()))


def test_due_jobs_are_moved_in_bounded_steps_in_due_order(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    jobs = [(f"d{i:04}", b"") for i in range(1500)]
    client.enqueue_many("q", jobs, delay_ms=3_600_000)
    rng = random.Random(7)
    due = {job_id: rng.randrange(1, 10**6) * 10 + i % 10 for i, (job_id, _) in enumerate(jobs)}
    r.zadd(keys.delayed, due, xx=True)  # all came due, in an order that is not the ids'
    assert client.counts("q").pending == 1500
    first = client.claim("q", 60_000)
    assert first is not None
    assert r.zcard(keys.delayed) == 1500 - BOUND  # one claim moved 1,000 and took one
    assert r.llen(keys.pending) == BOUND - 1
    order = sorted(due, key=lambda j: (due[j], j))
    claimed = [first.id]
    while batch := client.claim_many("q", 60_000, 333):
        claimed += [j.id for j in batch]
        assert queue_problems(r, "q") == []
    assert claimed == order
    assert r.zcard(keys.delayed) == 0


def test_a_sweep_moves_due_jobs_too(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    client.enqueue("q", b"", "x", delay_ms=3_600_000, priority=4)
    r.zadd(keys.delayed, {"x": 1}, xx=True)
    client.sweep("q")
    assert r.zcard(keys.delayed) == 0 and r.zcard(keys.priority) == 1
    assert queue_problems(r, "q") == []


@pytest.mark.parametrize("seed", range(6))
def test_random_verbs_near_the_bounds_keep_the_counts_exact(
    r: redis.Redis, client: echomq.Client, seed: int
) -> None:
    """Runs of tombstones and of due jobs around 1,000 long, mixed with every verb that writes a
    lane: after each step the invariants hold, and over the whole run every job is claimed
    exactly once or ends cancelled."""
    rng = random.Random(seed)
    keys = queue_keys("q")
    made = 0
    claimed: list[str] = []
    cancelled: set[str] = set()
    held: dict[str, str] = {}
    for _ in range(14):
        roll = rng.randrange(7)
        if roll <= 1:  # a run that is cancelled while it waits: tombstones
            n = rng.choice([BOUND - 1, BOUND, BOUND + 1, 5])
            ids = [f"j{made + i}" for i in range(n)]
            made += n
            client.enqueue_many("q", [(i, b"") for i in ids], priority=rng.choice([0, 0, 0, -2, 3]))
            pipe = r.pipeline(transaction=False)
            for job_id in ids if roll == 0 else rng.sample(ids, n // 2):
                pipe.execute_command(*client_cancel_args(client, job_id))
                cancelled.add(job_id)
            pipe.execute()
        elif roll == 2:  # a run of delayed jobs that come due
            n = rng.choice([BOUND - 1, BOUND + 1, 3])
            ids = [f"j{made + i}" for i in range(n)]
            made += n
            client.enqueue_many(
                "q", [(i, b"") for i in ids], delay_ms=3_600_000, priority=rng.choice([0, -1])
            )
            r.zadd(keys.delayed, {i: rng.randrange(1, 100) for i in ids}, xx=True)
        elif roll == 3 and held:  # give some back, fail some (retried at the tail), finish the rest
            for job_id, token in list(held.items()):
                how = rng.randrange(3)
                if how == 0:
                    client.release("q", job_id, token)
                elif how == 1:
                    client.fail("q", job_id, token, "E: again", max_attempts=100)
                else:
                    client.complete("q", job_id, token)
                    claimed.append(job_id)
                del held[job_id]
        else:
            for job in client.claim_many("q", 60_000, rng.choice([1, 10, 1000])):
                assert job.id not in held, f"{job.id} claimed twice"
                held[job.id] = job.token
        problems = queue_problems(r, "q")
        assert problems == [], problems
    for job_id, token in held.items():
        client.complete("q", job_id, token)
        claimed.append(job_id)
    for _ in range(100):
        batch = client.claim_many("q", 60_000, 1000)
        if not batch and r.llen(keys.pending) == 0 and client.counts("q").pending == 0:
            break
        for job in batch:
            client.complete("q", job.id, job.token)
            claimed.append(job.id)
    assert len(claimed) == len(set(claimed)), "a job was completed twice"
    assert set(claimed) | cancelled == {f"j{i}" for i in range(made)}
    assert not set(claimed) & cancelled
    assert stale(r, "q") == 0 and r.llen(keys.pending) == 0


def test_a_blocked_claim_behind_many_tombstones_gets_the_live_job(
    r: redis.Redis, client: echomq.Client
) -> None:
    """A blocked claim that meets the drop bound looks again a millisecond later (it does not
    answer null: the caller asked to wait) until it reaches the live job."""
    if client.backend == "scripts":
        pytest.skip("the scripts backend polls: it has no blocked claim")
    client.enqueue_many("q", [(f"t{i}", b"") for i in range(2500)])
    pipe = r.pipeline(transaction=False)
    for i in range(2500):
        pipe.execute_command(*client_cancel_args(client, f"t{i}"))
    pipe.execute()
    got: list[echomq.Job | None] = []
    waiter = threading.Thread(target=lambda: got.append(client.claim("q", 60_000, block_ms=30_000)))
    waiter.start()
    deadline = time.monotonic() + 20
    while stale(r, "q") > 0 and time.monotonic() < deadline:  # the blocked claim drops them all
        time.sleep(0.02)
    assert stale(r, "q") == 0 and r.llen(queue_keys("q").pending) == 0
    client.enqueue("q", b"", "live")
    waiter.join(30)
    assert [j.id for j in got if j] == ["live"]
    assert now_ms(r) > 0 and queue_problems(r, "q") == []


# -- lanes edited by hand: what a claim does, what `echomq check` says (issue 39 item 8) ------------

LEVEL_1_TAIL = (1 + 1024) * 2**42 + 2**32  # the first tail seq of level 1 (docs/reference/keyspace.md)


def test_a_priority_member_without_a_pending_row_is_dropped_not_claimed(
    r: redis.Redis, client: echomq.Client
) -> None:
    """A member of ``<base>priority`` has nothing to run without its row, and is not waiting when
    its row says otherwise: a claim drops it from the lane (as a tombstone of the list) and
    takes the job behind it, with its payload; no row is made up for it."""
    keys = queue_keys("q")
    r.zadd(keys.priority, {"ghost": LEVEL_1_TAIL - 2, "over": LEVEL_1_TAIL - 1})  # ahead of "real"
    r.hset(keys.job("over"), mapping={"state": "done", "payload": "old"})
    client.enqueue("q", b"real payload", "real", priority=1)
    problems = queue_problems(r, "q")
    assert any("b'ghost' is in priority without its row" in p for p in problems), problems
    assert any("b'over' is in priority but its row says done" in p for p in problems), problems
    job = client.claim("q", 60_000)
    assert job is not None and (job.id, job.payload) == ("real", b"real payload")
    assert r.zcard(keys.priority) == 0 and not r.exists(keys.job("ghost"))
    assert r.hget(keys.job("over"), "state") == b"done"
    assert queue_problems(r, "q") == []
    r.zadd(keys.priority, {"ghost": LEVEL_1_TAIL})  # alone: the claim finds nothing, drops it
    assert client.claim("q", 60_000) is None
    assert r.zcard(keys.priority) == 0 and not r.exists(keys.job("ghost"))


def test_rowless_members_are_dropped_in_bounded_steps(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    r.zadd(keys.priority, {f"g{i:04}": LEVEL_1_TAIL - 2000 + i for i in range(BOUND + 5)})
    client.enqueue("q", b"p", "real", priority=1)
    assert client.claim("q", 60_000) is None  # the bound: 1,000 dropped, the rest for the next call
    assert r.zcard(keys.priority) == 5 + 1
    job = client.claim("q", 60_000)
    assert job is not None and job.id == "real" and r.zcard(keys.priority) == 0


def test_check_reports_the_rows_no_lane_holds_and_the_lane_members_without_a_row(
    r: redis.Redis, server: EmbeddedServer, client: echomq.Client, capsys: pytest.CaptureFixture[str]
) -> None:
    """Edits by hand the verbs cannot see: a queued job given a level (``HSET priority``) waits in
    no lane -- a claim drops its list entry as a tombstone and never claims it; an entry pushed,
    a member added, with no row; a row in a state no verb writes.  ``echomq check`` names each."""
    keys = queue_keys("q")
    client.enqueue("q", b"", "a")
    r.hset(keys.job("a"), "priority", "5")
    r.rpush(keys.pending, "x")
    r.zadd(keys.delayed, {"y": now_ms(r) + 60_000})
    r.hset(keys.job("z"), mapping={"state": "queued", "payload": "p"})
    problems = queue_problems(r, "q")
    expected = [
        "row b'emq:{q}:job:a' says pending at level b'5' but priority does not hold it "
        "(the list holds it: a claim drops it there)",
        "b'y' is in delayed without its row (or the row has no state)",
        "row b'emq:{q}:job:z' says 'queued': no lane holds it, no verb moves it",
        "meta stale is 0: the list has 2 entries, 0 waiting jobs (entries without a row: b'x')",
    ]
    assert sorted(problems) == sorted(expected)
    assert client.claim("q", 60_000) is None  # a and x dropped as tombstones: a is never claimed
    assert r.hget(keys.job("a"), "state") == b"pending" and r.llen(keys.pending) == 0
    after = queue_problems(r, "q")
    assert "row b'emq:{q}:job:a' says pending at level b'5' but priority does not hold it" in after
    capsys.readouterr()
    assert main(["--url", server.url, "check", "q"]) == 1
    out = capsys.readouterr().out
    assert "job:a' says pending at level b'5' but priority does not hold it" in out
    assert "b'y' is in delayed without its row" in out and "says 'queued'" in out
    assert client.cancel("q", "a") == "cancelled"  # the way back: cancel, retry
    client.retry("q", "a")
    job = client.claim("q", 60_000)
    assert job is not None and job.id == "a" and r.zcard(keys.priority) == 0
