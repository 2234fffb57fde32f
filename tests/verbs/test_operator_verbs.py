"""The operator's verbs (issue 13): every reply and every error of RETRY,
RETRYDEAD, PURGE, RETENTION, PAUSE, RESUME, OBLITERATE and FORGET.

Each error is checked word for word (docs/reference/ documents these texts) and
with DEBUG DIGEST unchanged: a refused command wrote nothing.  The queue
invariants (echomq.testing.queue_problems) are checked at the end of the
tests that move jobs.
"""

from __future__ import annotations

import time

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys
from echomq.testing import queue_problems

from ..helpers import digest, entries, now_ms, queued

pytestmark = pytest.mark.memcheck  # make -C module check runs it under valgrind

Q = queue_keys("q")

NO_STATE = "EMQSTATE the job is {}: only a dead or cancelled job can be retried"
DEAD_PENDING = "ERR <dead> and <pending> must be <base>dead and <base>pending"
RETENTION_VALUE = "ERR a retention must be -1 (keep forever) or an integer from 0 to 9007199254740992 (ms)"
WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
THREE_SETS = "ERR <active>, <pending> and <dead> must be <base>active, <base>pending and <base>dead"
BUSY = "EMQBUSY the queue has active jobs: obliterate it with FORCE to delete them too"


def refused(r: redis.Redis, args: list[object], message: str) -> None:
    """The command answers exactly `message` and changes nothing."""
    before = digest(r)
    with pytest.raises(redis.ResponseError) as info:
        r.execute_command(*args)
    assert str(info.value) == message.removeprefix("ERR "), args  # redis-py drops the "ERR "
    assert digest(r) == before


def make_dead(client: echomq.Client, job_id: str, error: str = "boom") -> echomq.Job:
    client.enqueue("q", f"payload of {job_id}".encode(), job_id=job_id)
    job = client.claim("q", lease_ms=60_000)
    assert job is not None and job.id == job_id
    assert client.fail("q", job.id, job.token, error, max_attempts=1) == "dead"
    return job


def queue_keys_left(r: redis.Redis) -> list[str]:
    """The keys of the queue, but for claim records (they expire with their lease)."""
    return sorted(k.decode() for k in r.keys("*") if not k.startswith(Q.base.encode() + b"req:"))


def retry(r: redis.Redis, job_id: object) -> object:
    return r.execute_command("EMQ.RETRY", Q.dead, Q.pending, Q.base, job_id)


# -- RETRY -----------------------------------------------------------------------


def test_retry_gives_a_dead_job_a_fresh_budget_and_keeps_its_token_counting(
    client: echomq.Client, r: redis.Redis
) -> None:
    client.enqueue("q", b"x", job_id="j")
    first = client.claim("q", lease_ms=60_000)
    assert first is not None
    assert client.fail("q", "j", first.token, "once", max_attempts=2) == "pending"
    second = client.claim("q", lease_ms=60_000)
    assert second is not None and second.attempt == 2
    assert client.fail("q", "j", second.token, "twice", max_attempts=2) == "dead"
    died = r.zscore(Q.dead, "j")
    assert died is not None and abs(died - now_ms(r)) < 5_000  # scored with the time it died

    before = now_ms(r)
    assert retry(r, "j") == b"pending"
    row = r.hgetall(Q.job("j"))
    assert row[b"state"] == b"pending" and row[b"tries"] == b"0" and row[b"stalled"] == b"0"
    assert row[b"retries"] == b"1" and row[b"attempts"] == b"2" and row[b"token"] == second.token.encode()
    assert row[b"last_error"] == b"twice"  # history is kept
    assert b"closed_by" not in row and b"finished_at" not in row and b"cancel_requested" not in row
    assert r.zscore(Q.dead, "j") is None and not r.exists(Q.dead)
    assert entries(r, Q)[-1:] == [b"j"] and before <= now_ms(r)  # at the tail: behind the work waiting
    assert r.pttl(Q.job("j")) == -1

    # The full budget again: two more claims before it dies; the token keeps counting.
    third = client.claim("q", lease_ms=60_000)
    assert third is not None and third.attempt == 1 and third.token.startswith("3-")
    assert client.fail("q", "j", third.token, "again", max_attempts=2) == "pending"
    fourth = client.claim("q", lease_ms=60_000)
    assert fourth is not None and fourth.attempt == 2 and fourth.token.startswith("4-")
    assert client.fail("q", "j", fourth.token, "again", max_attempts=2) == "dead"
    assert retry(r, "j") == b"pending"
    assert r.hget(Q.job("j"), "retries") == b"2"
    assert queue_problems(r, "q") == []


def test_a_holder_from_before_the_retry_is_stale_everywhere(client: echomq.Client, r: redis.Redis) -> None:
    """Its token was the row's when the job died: after RETRY it matches a job
    that is not active, and after the next claim it matches nothing."""
    old = make_dead(client, "j")
    client.retry("q", "j")
    holder_verbs = [
        ["EMQ.EXTEND", Q.active, Q.job("j"), "j", old.token, 1000],
        ["EMQ.CHECKPOINT", Q.active, Q.job("j"), "j", old.token, 1000],
        ["EMQ.COMPLETE", Q.active, Q.job("j"), "j", old.token],
        ["EMQ.FAIL", Q.active, Q.pending, Q.dead, Q.base, "j", old.token, 1, "late"],
        ["EMQ.RELEASE", Q.active, Q.pending, Q.base, "j", old.token],
    ]
    for (
        args
    ) in holder_verbs:  # the FAIL too: RETRY deleted closed_by, so it is not "the retry of a lost reply"
        refused(r, args, "EMQSTALE job is no longer active")
    new = client.claim("q", lease_ms=60_000)
    assert new is not None and new.token != old.token
    mismatch = ["extend", "extend", "complete", "fail", "release"]
    for args, verb in zip(holder_verbs, mismatch, strict=True):
        refused(r, args, f"EMQSTALE {verb} token mismatch")
    with pytest.raises(echomq.StaleToken):
        client.complete("q", "j", old.token)
    client.complete("q", "j", new.token)
    assert queue_problems(r, "q") == []


def test_retry_of_a_cancelled_job_persists_its_row(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue("q", b"x", job_id="c")
    assert client.cancel("q", "c", reason="not now") == "cancelled"
    assert r.pttl(Q.job("c")) > 0  # the cancelled retention
    assert retry(r, "c") == b"pending"
    row = r.hgetall(Q.job("c"))
    assert row[b"state"] == b"pending" and b"cancel_requested" not in row and b"finished_at" not in row
    assert r.pttl(Q.job("c")) == -1
    job = client.claim("q", lease_ms=60_000)
    assert job is not None and job.id == "c" and job.attempt == 1
    assert client.checkpoint("q", "c", job.token, 60_000) is None  # the old cancel request is gone
    assert queue_problems(r, "q") == []


def test_retry_refuses_jobs_that_are_not_dead_or_cancelled(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue("q", b"x", job_id="held")
    client.enqueue("q", b"x", job_id="waiting")
    held = client.claim("q", lease_ms=60_000)
    assert held is not None and held.id == "held"
    client.enqueue("q", b"x", job_id="finished")
    r.hset(Q.job("odd"), "payload", "no state")
    r.hset(Q.job("weird"), "state", "sleeping")
    refused(r, ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "held"], NO_STATE.format("active"))
    refused(r, ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "waiting"], NO_STATE.format("pending"))
    r.hset(Q.job("finished"), "state", "done")
    r.lrem(Q.pending, 0, "finished")
    refused(r, ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "finished"], NO_STATE.format("done"))
    unknown = "EMQSTATE the job has no known state: only a dead or cancelled job can be retried"
    refused(r, ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "odd"], unknown)
    refused(r, ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "weird"], unknown)
    with pytest.raises(echomq.NotRetryable) as info:
        client.retry("q", "held")
    assert info.value.state == "active" and info.value.job_id == "held"
    with pytest.raises(echomq.NotRetryable) as info:
        client.retry("q", "odd")
    assert info.value.state is None


def test_retry_of_an_unknown_id_is_gone(client: echomq.Client, r: redis.Redis) -> None:
    make_dead(client, "d")
    before = digest(r)
    assert retry(r, "nope") == -1
    assert digest(r) == before
    with pytest.raises(echomq.JobGone):
        client.retry("q", "nope")


def test_retry_errors(client: echomq.Client, r: redis.Redis) -> None:
    make_dead(client, "d")
    refused(
        r, ["EMQ.RETRY", Q.dead, Q.pending, Q.base], "ERR wrong number of arguments for 'emq.retry' command"
    )
    refused(r, ["EMQ.RETRY", Q.pending, Q.dead, Q.base, "d"], DEAD_PENDING)
    refused(r, ["EMQ.RETRY", Q.dead, Q.pending, "emq:{other}:", "d"], DEAD_PENDING)
    r.hset(Q.job("d"), "retries", "many")
    refused(
        r,
        ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "d"],
        "ERR the job row's 'retries' field is not an integer",
    )
    r.hset(Q.job("d"), "retries", str(2**63 - 1))
    refused(r, ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "d"], "ERR increment or decrement would overflow")
    r.hdel(Q.job("d"), "retries")
    r.set(Q.job("s"), "a string")
    refused(r, ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "s"], WRONGTYPE)
    r.set(Q.pending, "a string")
    refused(r, ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "d"], WRONGTYPE)


# -- RETRYDEAD and PURGE ---------------------------------------------------------


def retrydead(r: redis.Redis, limit: object, *options: object) -> object:
    return r.execute_command("EMQ.RETRYDEAD", Q.dead, Q.pending, Q.base, limit, *options)


def purge(r: redis.Redis, limit: object, *options: object) -> object:
    return r.execute_command("EMQ.PURGE", Q.dead, Q.base, limit, *options)


def test_retrydead_takes_the_oldest_dead_in_bounded_batches(client: echomq.Client, r: redis.Redis) -> None:
    for i in range(5):
        make_dead(client, f"d{i}")
        time.sleep(0.002)  # distinct death times
    first_death = int(r.zscore(Q.dead, "d0") or 0)
    assert retrydead(r, 2, "UNTIL", first_death - 1) == [0, 0]
    assert retrydead(r, 2) == [2, 0]
    assert sorted(entries(r, Q)) == [b"d0", b"d1"]
    assert r.hget(Q.job("d0"), "retries") == b"1"
    assert retrydead(r, 10, "until", int(r.zscore(Q.dead, "d2") or 0)) == [1, 0]
    assert retrydead(r, 10) == [2, 0]
    assert retrydead(r, 10) == [0, 0]
    assert not r.exists(Q.dead)
    assert queue_problems(r, "q") == []


def test_retrydead_drops_members_that_are_not_dead_jobs(client: echomq.Client, r: redis.Redis) -> None:
    make_dead(client, "real")
    client.enqueue("q", b"x", job_id="waiting")
    r.zadd(Q.dead, {"orphan": 1, "waiting": 2})  # no row; a row that is pending
    before = r.hgetall(Q.job("waiting"))
    assert retrydead(r, 10) == [1, 2]
    assert r.hgetall(Q.job("waiting")) == before  # untouched
    assert not r.exists(Q.job("orphan")) and not r.exists(Q.dead)
    assert queue_problems(r, "q") == []


def test_retrydead_checks_every_row_before_the_first_write(client: echomq.Client, r: redis.Redis) -> None:
    make_dead(client, "a")
    make_dead(client, "b")
    r.hset(Q.job("b"), "retries", "x")
    refused(
        r,
        ["EMQ.RETRYDEAD", Q.dead, Q.pending, Q.base, 10],
        "ERR the job row's 'retries' field is not an integer",
    )
    r.set(Q.job("b"), "string")
    refused(r, ["EMQ.RETRYDEAD", Q.dead, Q.pending, Q.base, 10], WRONGTYPE)


@pytest.mark.parametrize("verb", ["EMQ.RETRYDEAD", "EMQ.PURGE"])
def test_bulk_argument_errors(r: redis.Redis, verb: str) -> None:
    r.zadd(Q.dead, {"x": 1})
    keys = [Q.dead, Q.pending, Q.base] if verb == "EMQ.RETRYDEAD" else [Q.dead, Q.base]
    name = verb.lower()
    refused(r, [verb, *keys], f"ERR wrong number of arguments for '{name}' command")
    for limit in ("0", "-1", "1.5", "x", ""):
        refused(r, [verb, *keys, limit], "ERR limit must be an integer >= 1")
    refused(r, [verb, *keys, 5, "UNTIL"], "ERR syntax error")
    refused(r, [verb, *keys, 5, "UNTIL", 1, "UNTIL", 2], "ERR syntax error")
    refused(r, [verb, *keys, 5, "SINCE", 1], "ERR syntax error")
    refused(r, [verb, *keys, 5, "UNTIL", "soon"], "ERR UNTIL must be an integer (server ms)")
    mismatch = DEAD_PENDING if verb == "EMQ.RETRYDEAD" else "ERR <dead> must be <base>dead"
    refused(r, [verb, Q.pending, *keys[1:], 5], mismatch)


def test_purge_deletes_the_oldest_dead_with_their_rows(client: echomq.Client, r: redis.Redis) -> None:
    for i in range(4):
        make_dead(client, f"d{i}")
        time.sleep(0.002)
    client.enqueue("q", b"x", job_id="waiting")
    r.zadd(Q.dead, {"waiting": 0, "orphan": 0})  # not dead rows: they only leave <dead>
    assert purge(r, 3) == 3
    assert r.exists(Q.job("waiting")) and not r.exists(Q.job("d0"))
    assert r.zrange(Q.dead, 0, -1) == [b"d1", b"d2", b"d3"]
    assert purge(r, 10, "UNTIL", int(r.zscore(Q.dead, "d1") or 0)) == 1
    assert purge(r, 10) == 2
    assert purge(r, 10) == 0
    assert not r.exists(Q.dead, Q.job("d1"), Q.job("d3"))
    assert r.hget(Q.job("waiting"), "state") == b"pending"
    assert queue_problems(r, "q") == []


def test_client_bulk_loops_end_even_while_jobs_keep_dying(client: echomq.Client, r: redis.Redis) -> None:
    for i in range(7):
        make_dead(client, f"d{i}")
    result = client.retry_dead("q", limit=3)
    assert result == echomq.RetryDeadResult(retried=7, dropped=0)
    assert queued(r, Q) == 7
    for _ in range(7):  # they die again, with later death times
        job = client.claim("q", lease_ms=60_000)
        assert job is not None
        client.fail("q", job.id, job.token, "again", max_attempts=1)
    assert client.purge_dead("q", limit=2) == 7
    assert client.purge_dead("q", limit=2) == 0
    # the queue is still registered (docs/concepts/registry.md): its marker, the index
    assert queue_keys_left(r) == ["emq:queues", Q.metrics_failed, Q.base + "queue"]
    assert queue_problems(r, "q") == []


# -- RETENTION ----------------------------------------------------------------


def retention(r: redis.Redis, *options: object) -> object:
    return r.execute_command("EMQ.RETENTION", Q.pending, Q.base, *options)


def test_retention_reads_the_defaults_and_sets_only_what_changes(r: redis.Redis) -> None:
    assert retention(r) == [3_600_000, 86_400_000, -1]
    assert not r.exists(Q.meta)  # reading writes nothing
    assert retention(r, "DONE", 1000, "dead", 0) == [1000, 86_400_000, 0]
    assert r.hgetall(Q.meta) == {b"done_ttl_ms": b"1000", b"dead_ttl_ms": b"0"}
    before = digest(r)
    assert retention(r, "DONE", 1000) == [1000, 86_400_000, 0]  # unchanged: nothing written
    assert digest(r) == before
    assert retention(r, "Cancelled", -1, "DONE", 2**53) == [2**53, -1, 0]
    client = echomq.Client(r)
    assert client.retention("q") == echomq.Retention(2**53, -1, 0)
    assert client.retention("q", dead_ms=echomq.KEEP_FOREVER) == echomq.Retention(2**53, -1, -1)
    with pytest.raises(ValueError, match="done_ms"):
        client.retention("q", done_ms=-2)
    with pytest.raises(TypeError, match="dead_ms"):
        client.retention("q", dead_ms=1.5)  # type: ignore[arg-type]


def test_retention_errors(r: redis.Redis) -> None:
    r.hset(Q.meta, "paused", "1")
    for bad in ("-2", str(2**53 + 1), "1.0", "+1", "01", "", "forever"):
        refused(r, ["EMQ.RETENTION", Q.pending, Q.base, "DONE", bad], RETENTION_VALUE)
    refused(r, ["EMQ.RETENTION", Q.pending], "ERR wrong number of arguments for 'emq.retention' command")
    refused(r, ["EMQ.RETENTION", Q.pending, Q.base, "DONE"], "ERR syntax error")
    refused(r, ["EMQ.RETENTION", Q.pending, Q.base, "DONE", 1, "DONE", 2], "ERR syntax error")
    refused(r, ["EMQ.RETENTION", Q.pending, Q.base, "ACTIVE", 1], "ERR syntax error")
    refused(r, ["EMQ.RETENTION", Q.dead, Q.base], "ERR <pending> must be <base>pending")
    r.hset(Q.meta, "cancelled_ttl_ms", "soon")
    meta_error = "ERR the queue's meta hash holds a setting that is not an integer"
    refused(r, ["EMQ.RETENTION", Q.pending, Q.base], meta_error)
    refused(r, ["EMQ.RETENTION", Q.pending, Q.base, "DONE", 5], meta_error)
    assert retention(r, "CANCELLED", 5) == [3_600_000, 5, -1]  # setting it repairs it
    r.delete(Q.meta)
    r.set(Q.meta, "x")
    refused(r, ["EMQ.RETENTION", Q.pending, Q.base], WRONGTYPE)


def test_finished_rows_expire_and_their_ids_can_be_enqueued_again(
    client: echomq.Client, r: redis.Redis
) -> None:
    client.retention("q", done_ms=50, cancelled_ms=50)
    client.enqueue("q", b"x", job_id="j")
    job = client.claim("q", lease_ms=60_000)
    assert job is not None
    client.complete("q", "j", job.token)
    assert 0 < r.pttl(Q.job("j")) <= 50
    client.enqueue("q", b"x", job_id="c")
    client.cancel("q", "c")
    with pytest.raises(echomq.JobExists):
        client.enqueue("q", b"again", job_id="j")
    time.sleep(0.15)
    assert client.enqueue("q", b"again", job_id="j") == "j"
    assert client.enqueue("q", b"again", job_id="c") == "c"
    again = client.claim("q", lease_ms=60_000)
    assert again is not None and again.payload == b"again" and again.token.startswith("1-")

    client.retention("q", done_ms=0)  # not kept at all: the row goes at once
    client.complete("q", again.id, again.token)
    assert not r.exists(Q.job(again.id))
    assert queue_problems(r, "q") == []


def test_a_dead_retention_is_kept_by_sweep_in_bounded_steps(client: echomq.Client, r: redis.Redis) -> None:
    for i in range(5):
        make_dead(client, f"d{i}")
    client.retention("q", dead_ms=0)
    assert client.sweep("q", limit=2).expired == 2
    assert r.zcard(Q.dead) == 3 and not r.exists(Q.job("d0"), Q.job("d1"))
    assert client.sweep("q", limit=10).expired == 3
    assert not r.exists(Q.dead)
    assert client.enqueue("q", b"x", job_id="d0") == "d0"
    assert queue_problems(r, "q") == []


# -- PAUSE / RESUME --------------------------------------------------------------


def test_pause_stops_claims_and_resume_restarts_them(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue("q", b"x", job_id="held")
    held = client.claim("q", lease_ms=60_000)
    assert held is not None
    client.enqueue("q", b"x", job_id="waiting")
    assert r.execute_command("EMQ.PAUSE", Q.pending, Q.base) == 1
    assert r.hget(Q.meta, "paused") == b"1"
    before = digest(r)
    assert r.execute_command("EMQ.PAUSE", Q.pending, Q.base) == 0  # already paused: nothing written
    assert digest(r) == before
    assert client.claim("q", lease_ms=60_000) is None
    assert client.claim_many("q", lease_ms=60_000, count=10) == []
    assert client.counts("q").paused

    # Everything else goes on.
    client.enqueue("q", b"x", job_id="new")
    client.extend("q", "held", held.token, 60_000)
    client.checkpoint("q", "held", held.token, 60_000)
    assert client.fail("q", "held", held.token, "err", max_attempts=3) == "pending"
    r.zadd(Q.active, {"lapsed": 1})
    r.hset(Q.job("lapsed"), mapping={"state": "active", "attempts": 1, "tries": 1, "token": "1"})
    assert client.sweep("q", max_stalled=3).recovered == ["lapsed"]  # recovered, and it waits
    assert client.claim("q", lease_ms=60_000) is None

    assert client.resume("q") is True
    assert client.resume("q") is False
    assert not r.exists(Q.meta)  # paused was its only field
    claimed = client.claim_many("q", lease_ms=60_000, count=10)
    assert sorted(j.id for j in claimed) == ["held", "lapsed", "new", "waiting"]
    assert client.pause("q") is True
    assert queue_problems(r, "q") == []


def test_pause_and_resume_errors(r: redis.Redis) -> None:
    for verb in ("EMQ.PAUSE", "EMQ.RESUME"):
        refused(r, [verb, Q.pending], f"ERR wrong number of arguments for '{verb.lower()}' command")
        refused(
            r, [verb, Q.pending, Q.base, "x"], f"ERR wrong number of arguments for '{verb.lower()}' command"
        )
        refused(r, [verb, Q.active, Q.base], "ERR <pending> must be <base>pending")
    r.set(Q.meta, "x")
    refused(r, ["EMQ.PAUSE", Q.pending, Q.base], WRONGTYPE)
    refused(r, ["EMQ.RESUME", Q.pending, Q.base], WRONGTYPE)


# -- OBLITERATE and FORGET -----------------------------------------------------


def obliterate(r: redis.Redis, limit: object, *force: object) -> object:
    return r.execute_command("EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, limit, *force)


def busy_queue(client: echomq.Client, r: redis.Redis) -> echomq.Job:
    """Two dead, one done, one cancelled, one held, three waiting, settings and a metric."""
    make_dead(client, "d0")
    make_dead(client, "d1")
    client.enqueue("q", b"x", job_id="done")
    done = client.claim("q", lease_ms=60_000)
    assert done is not None
    client.complete("q", "done", done.token)
    client.enqueue("q", b"x", job_id="cancelled")
    client.cancel("q", "cancelled")
    client.enqueue("q", b"x", job_id="held")
    held = client.claim("q", lease_ms=60_000)
    assert held is not None
    for i in range(3):
        client.enqueue("q", b"x", job_id=f"w{i}")
    client.retention("q", done_ms=-1)
    return held


def test_obliterate_refuses_a_queue_with_active_jobs_unless_forced(
    client: echomq.Client, r: redis.Redis
) -> None:
    held = busy_queue(client, r)
    refused(r, ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 100], BUSY)
    with pytest.raises(echomq.QueueBusy):
        client.obliterate("q")
    client.complete("q", held.id, held.token)
    assert obliterate(r, 2) == [2, 3]  # pending first
    assert r.hget(Q.meta, "paused") == b"1"  # paused while it is half deleted
    assert client.claim("q", lease_ms=60_000) is None
    assert obliterate(r, 2) == [2, 1]
    assert obliterate(r, 2) == [1, 0]
    assert not r.exists(Q.pending, Q.active, Q.dead, Q.meta, Q.metrics_failed)
    # The finished rows are in no set: FORGET's; the registry's index loses the queue when
    # client.obliterate ends (the marker went with the step that emptied the sets).
    assert queue_keys_left(r) == ["emq:queues", Q.job("cancelled"), Q.job("done"), Q.job("held")]
    assert obliterate(r, 2) == [0, 0]
    result = client.obliterate("q")
    assert result == echomq.ObliterateResult(removed=0, forgotten=3)
    assert queue_keys_left(r) == []


def test_obliterate_with_force_takes_the_held_jobs_too(client: echomq.Client, r: redis.Redis) -> None:
    held = busy_queue(client, r)
    result = client.obliterate("q", force=True, limit=3)
    assert result == echomq.ObliterateResult(removed=6, forgotten=2)
    assert queue_keys_left(r) == []
    with pytest.raises(echomq.JobGone):
        client.extend("q", held.id, held.token, 1000)


def test_obliterate_never_leaves_half_a_job_enqueued_meanwhile(client: echomq.Client, r: redis.Redis) -> None:
    busy_queue(client, r)
    client.complete("q", "held", r.hget(Q.job("held"), "token").decode())  # type: ignore[union-attr]
    assert obliterate(r, 1) == [1, 4]
    client.enqueue("q", b"late", job_id="late")  # between two steps: deleted whole
    while obliterate(r, 1)[1]:  # type: ignore[index]
        pass
    assert not r.exists(Q.job("late"))
    # Between the set phase and FORGET: a finished id enqueued again is pending: kept whole.
    r.delete(Q.job("done"))
    client.enqueue("q", b"again", job_id="done")
    assert r.execute_command("EMQ.FORGET", Q.pending, Q.base, "done", "cancelled", "held", "nope") == 2
    assert r.hget(Q.job("done"), "state") == b"pending" and b"done" in entries(r, Q)
    assert queue_problems(r, "q") == []


def test_obliterate_errors(r: redis.Redis) -> None:
    r.rpush(Q.pending, "x")
    r.hset(Q.job("x"), "state", "pending")
    refused(
        r,
        ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base],
        "ERR wrong number of arguments for 'emq.obliterate' command",
    )
    refused(
        r,
        ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 5, "FORCE", "x"],
        "ERR wrong number of arguments for 'emq.obliterate' command",
    )
    refused(r, ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 5, "NOW"], "ERR syntax error")
    refused(
        r, ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 0], "ERR limit must be an integer >= 1"
    )
    refused(r, ["EMQ.OBLITERATE", Q.pending, Q.active, Q.dead, Q.base, 5], THREE_SETS)
    r.set(Q.dead, "x")
    refused(r, ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 5], WRONGTYPE)
    r.delete(Q.dead)
    r.rpush(Q.pending, "y")
    r.hset(Q.job("y"), "state", "pending")
    r.set(Q.meta, "x")  # it cannot be paused while members remain
    refused(r, ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 1], WRONGTYPE)
    assert obliterate(r, 2) == [2, 0]  # but the last step deletes it whatever it is
    assert r.dbsize() == 0


def test_forget_deletes_only_finished_rows(client: echomq.Client, r: redis.Redis) -> None:
    busy_queue(client, r)
    before = digest(r)
    assert r.execute_command("EMQ.FORGET", Q.pending, Q.base, "w0", "held", "d0", "nope") == 0
    assert digest(r) == before
    assert r.execute_command("EMQ.FORGET", Q.pending, Q.base, "done", "cancelled", "done") == 2
    assert not r.exists(Q.job("done"), Q.job("cancelled"))
    refused(r, ["EMQ.FORGET", Q.pending, Q.base], "ERR wrong number of arguments for 'emq.forget' command")
    refused(r, ["EMQ.FORGET", Q.dead, Q.base, "x"], "ERR <pending> must be <base>pending")
    r.set(Q.job("s"), "x")
    refused(r, ["EMQ.FORGET", Q.pending, Q.base, "w1", "s"], WRONGTYPE)
    assert queue_problems(r, "q") == []
