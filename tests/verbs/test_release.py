"""EMQ.RELEASE: the holder gives a job back without using an attempt (issue 14)."""

from __future__ import annotations

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys

from ..helpers import digest, entries

Q = queue_keys("q")


def release(r: redis.Redis, job_id: str, token: object) -> object:
    return r.execute_command("EMQ.RELEASE", Q.active, Q.pending, Q.base, job_id, token)


def test_release_gives_the_job_back_without_using_an_attempt(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue("q", b"x", job_id="j")
    client.enqueue("q", b"y", job_id="later")
    first = client.claim("q", lease_ms=60_000)
    assert first is not None and first.attempt == 1
    assert client.release("q", first.id, first.token) == "pending"
    assert r.hmget(Q.job("j"), "state", "tries", "attempts", "stalled") == [b"pending", b"0", b"1", None]
    assert entries(r, Q) == [b"j", b"later"]  # at the head again, before 'later'
    again = client.claim("q", lease_ms=60_000)
    assert again is not None and again.id == "j" and again.attempt == 1  # the same budget
    assert again.token != first.token  # and a fresh token
    # max-attempts 1: a job that was released and then failed once is dead only now.
    assert client.fail("q", again.id, again.token, "boom", max_attempts=1) == "dead"


def test_release_is_fenced_and_safe_to_retry(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue("q", b"x", job_id="j")
    job = client.claim("q", lease_ms=60_000)
    assert job is not None
    with pytest.raises(echomq.StaleToken):
        client.release("q", "j", job.token + "x")
    assert release(r, "j", job.token) == b"pending"
    before = digest(r)
    assert release(r, "j", job.token) == b"pending"  # the retry of a lost reply
    assert digest(r) == before
    newer = client.claim("q", lease_ms=60_000)
    assert newer is not None
    with pytest.raises(echomq.StaleToken):  # the old token cannot release the new claim
        client.release("q", "j", job.token)
    with pytest.raises(echomq.JobGone):
        client.release("q", "nope", "1-0000000000000000")


def test_a_released_job_with_a_cancel_request_ends_cancelled(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue("q", b"x", job_id="j")
    job = client.claim("q", lease_ms=60_000)
    assert job is not None
    assert client.cancel("q", "j", reason="no") == "requested"
    assert client.release("q", "j", job.token) == "cancelled"
    assert r.hget(Q.job("j"), "state") == b"cancelled"
    assert not r.exists(Q.pending) and not r.exists(Q.active)
    assert 0 < r.pttl(Q.job("j")) <= 86_400_000
