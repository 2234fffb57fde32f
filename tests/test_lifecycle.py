"""EMQ.ENQUEUE, EMQ.CLAIM, EMQ.COMPLETE, EMQ.FAIL: replies, effects, refusals."""

from __future__ import annotations

import time

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys

from .conftest import ServerFactory, wait_for_replica
from .helpers import digest, now_ms, put_active

Q = "work"
K = queue_keys(Q)


def enqueue(r: redis.Redis, job: str | bytes, payload: str | bytes = "p") -> object:
    return r.execute_command("EMQ.ENQUEUE", K.pending, K.base, job, payload)


def claim(r: redis.Redis, lease: object = 10_000) -> object:
    return r.execute_command("EMQ.CLAIM", K.pending, K.active, K.base, lease)


def complete(r: redis.Redis, job: str | bytes, token: object) -> object:
    return r.execute_command("EMQ.COMPLETE", K.active, K.job(job), job, token)


def fail(
    r: redis.Redis, job: str | bytes, token: object, max_attempts: object = 3, error: str = "boom"
) -> object:
    return r.execute_command("EMQ.FAIL", K.active, K.pending, K.dead, K.base, job, token, max_attempts, error)


# -- ENQUEUE -------------------------------------------------------------------


def test_enqueue_writes_row_and_pending_entry(r: redis.Redis) -> None:
    before = now_ms(r)
    assert enqueue(r, "j1", b"\x00payload") == 1
    row = r.hgetall(K.job("j1"))
    assert row[b"state"] == b"pending" and row[b"attempts"] == b"0" and row[b"payload"] == b"\x00payload"
    score = r.zscore(K.pending, "j1")
    assert score is not None and before <= score <= now_ms(r)
    assert int(row[b"enqueued_at"]) == score


def test_enqueue_refuses_an_existing_id(r: redis.Redis) -> None:
    enqueue(r, "j1")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^EMQEXISTS"):
        enqueue(r, "j1", "other")
    assert digest(r) == before


def test_enqueue_refuses_foreign_pending_key(r: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError, match="must be <base>"):
        r.execute_command("EMQ.ENQUEUE", queue_keys("x").pending, K.base, "j", "p")
    assert r.keys() == []


# -- CLAIM ---------------------------------------------------------------------


def test_claim_empty_queue_is_null(r: redis.Redis) -> None:
    assert claim(r) is None
    assert r.keys() == []


def test_claim_takes_fifo_and_increments_the_token(r: redis.Redis) -> None:
    r.zadd(K.pending, {"late": 2000, "early": 1000})
    r.hset(K.job("early"), mapping={"attempts": 4, "state": "pending"})
    before = now_ms(r)
    assert claim(r, 5000) == [b"early", 5]
    row = r.hgetall(K.job("early"))
    assert row[b"attempts"] == b"5" and row[b"state"] == b"active"
    score = r.zscore(K.active, "early")
    assert score is not None and before + 5000 <= score <= now_ms(r) + 5000
    assert r.zrange(K.pending, 0, -1) == [b"late"]


def test_recovered_jobs_come_before_newer_ones(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="new")
    put_active(r, Q, "old", attempts=1, deadline=0)
    client.sweep(Q, max_stalled=5)
    assert claim(r) == [b"old", 2]
    assert claim(r) == [b"new", 1]


def test_claim_row_missing_starts_at_one(r: redis.Redis) -> None:
    r.zadd(K.pending, {"ghost": 0})
    assert claim(r) == [b"ghost", 1]


@pytest.mark.parametrize("lease", ["0", "-1", "x", str(2**53)])
def test_claim_bad_lease_writes_nothing(r: redis.Redis, lease: str) -> None:
    enqueue(r, "j1")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="lease-ms"):
        claim(r, lease)
    assert digest(r) == before


def test_claim_non_integer_attempts_writes_nothing(r: redis.Redis) -> None:
    enqueue(r, "j1")
    r.hset(K.job("j1"), "attempts", "many")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="attempts"):
        claim(r)
    assert digest(r) == before


def test_claim_wrong_type_row(r: redis.Redis) -> None:
    r.zadd(K.pending, {"j1": 0})
    r.set(K.job("j1"), "x")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^WRONGTYPE"):
        claim(r)
    assert digest(r) == before


# -- COMPLETE ------------------------------------------------------------------


def test_complete_by_the_holder(r: redis.Redis) -> None:
    enqueue(r, "j1")
    _, token = claim(r)  # type: ignore[misc]
    assert complete(r, "j1", token) == 1
    assert not r.exists(K.active) and r.hget(K.job("j1"), "state") == b"done"


def test_complete_gone(r: redis.Redis) -> None:
    assert complete(r, "nope", 1) == -1
    assert r.keys() == []


@pytest.mark.parametrize("case", ["wrong-token", "swept", "twice"])
def test_complete_stale_writes_nothing(r: redis.Redis, case: str) -> None:
    enqueue(r, "j1")
    _, token = claim(r, 1)  # type: ignore[misc]
    if case == "wrong-token":
        token = int(token) + 1
    elif case == "swept":
        r.zadd(K.active, {"j1": 0})
        r.execute_command("EMQ.SWEEP", K.active, K.pending, K.dead, K.base, 5, 10)
    else:
        r.zadd(K.active, {"j1": now_ms(r) + 60_000})
        assert complete(r, "j1", token) == 1
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE"):
        complete(r, "j1", token)
    assert digest(r) == before


def test_complete_same_key_twice(r: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError, match="different keys"):
        r.execute_command("EMQ.COMPLETE", "k", "k", "j", "1")


# -- FAIL ----------------------------------------------------------------------


def test_fail_below_max_goes_back_to_pending_behind_waiting_work(r: redis.Redis) -> None:
    enqueue(r, "j1")
    enqueue(r, "j2")
    assert claim(r) == [b"j1", 1]
    time.sleep(0.005)  # the retry is scored with server-now: leave this millisecond
    assert fail(r, "j1", 1, max_attempts=2, error="ValueError: bad") == b"pending"
    row = r.hgetall(K.job("j1"))
    assert row[b"state"] == b"pending" and row[b"last_error"] == b"ValueError: bad"
    assert r.zrange(K.pending, 0, -1) == [b"j2", b"j1"]
    assert not r.exists(K.active) and not r.exists(K.metrics_failed)


def test_fail_at_max_dead_letters_and_counts(r: redis.Redis) -> None:
    enqueue(r, "j1")
    claim(r)
    assert fail(r, "j1", 1, max_attempts=1, error="boom") == b"dead"
    assert r.zrange(K.dead, 0, -1, withscores=True) == [(b"j1", 0.0)]
    row = r.hgetall(K.job("j1"))
    assert row[b"state"] == b"dead" and row[b"last_error"] == b"boom"
    assert r.hget(K.metrics_failed, "count") == b"1"
    assert not r.exists(K.pending) and not r.exists(K.active)


def test_fail_stale_and_gone(r: redis.Redis) -> None:
    assert fail(r, "nope", 1) == -1
    enqueue(r, "j1")
    claim(r)
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE"):
        fail(r, "j1", 7)
    assert digest(r) == before


@pytest.mark.parametrize("max_attempts", ["0", "x", "-2"])
def test_fail_bad_max_attempts(r: redis.Redis, max_attempts: str) -> None:
    enqueue(r, "j1")
    claim(r)
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="max-attempts"):
        fail(r, "j1", 1, max_attempts=max_attempts)
    assert digest(r) == before


def test_fail_corrupt_metric_writes_nothing(r: redis.Redis) -> None:
    enqueue(r, "j1")
    claim(r)
    r.hset(K.metrics_failed, "count", "lots")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="count"):
        fail(r, "j1", 1, max_attempts=1)
    assert digest(r) == before


@pytest.mark.parametrize(
    "args",
    [
        ["EMQ.ENQUEUE", K.pending, K.base, "j"],
        ["EMQ.CLAIM", K.pending, K.active, K.base],
        ["EMQ.COMPLETE", K.active, K.job("j"), "j"],
        ["EMQ.FAIL", K.active, K.pending, K.dead, K.base, "j", "1", "3"],
    ],
)
def test_wrong_arity(r: redis.Redis, args: list[str]) -> None:
    for n in (1, len(args) - 1, len(args), len(args) + 2):
        if n == len(args) + 1:
            continue
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            r.execute_command(*[*args, "x", "y", "z"][:n])
    assert r.keys() == []


# -- the Python client -----------------------------------------------------------


def test_client_round_trip(client: echomq.Client) -> None:
    first = client.enqueue(Q, b"one")
    client.enqueue(Q, "two", job_id="second")
    job = client.claim(Q, lease_ms=5000)
    assert job == echomq.Job(Q, first, 1, b"one")
    client.complete(Q, job.id, job.token)
    with pytest.raises(echomq.StaleToken):
        client.complete(Q, job.id, job.token)
    job2 = client.claim(Q, lease_ms=5000)
    assert job2 is not None and (job2.id, job2.payload) == ("second", b"two")
    assert client.fail(Q, job2.id, job2.token, "nope", max_attempts=1) == "dead"
    assert client.claim(Q, lease_ms=5000) is None
    with pytest.raises(echomq.JobExists):
        client.enqueue(Q, job_id="second")
    with pytest.raises(echomq.JobGone):
        client.complete(Q, "missing", 1)


def test_lifecycle_replicates_exactly(server_factory: ServerFactory) -> None:
    master = server_factory()
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    client = echomq.Client(m)
    for i in range(40):
        client.enqueue(Q, f"payload-{i}", job_id=f"j{i}")
    for i in range(30):
        job = client.claim(Q, lease_ms=60_000)
        assert job is not None
        if i % 3 == 0:
            client.complete(Q, job.id, job.token)
        elif i % 3 == 1:
            client.fail(Q, job.id, job.token, f"error {i}", max_attempts=1 + i % 2)
    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    assert digest(s) == digest(m)
