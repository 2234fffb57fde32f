"""A retried command has the effect of one (issue 23, the module's half).

redis-py retries a command whose reply it did not get (a timeout, a dropped
connection): by default ten times.  Each verb is safe to send twice:

- CLAIM and ENQUEUE carry a request id (REQ): the retry of a request that
  went through is answered with what the first call did, and writes nothing;
- COMPLETE and FAIL by the same token on a job that token already finished
  answer what the first call answered (the row's `closed_by`);
- EXTEND and CHECKPOINT set an absolute deadline: twice is once.
"""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq import Client
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..faults import Proxy
from ..helpers import digest, queued

Q = queue_keys("q")


def enqueue(r: redis.Redis, job_id: str, *req: str) -> object:
    return r.execute_command("EMQ.ENQUEUE", Q.pending, Q.base, job_id, "p", *req)


def claim(r: redis.Redis, *options: object) -> object:
    return r.execute_command("EMQ.CLAIM", Q.pending, Q.active, Q.base, 60_000, *options)


def test_a_retried_enqueue_answers_as_the_first_did(r: redis.Redis) -> None:
    assert enqueue(r, "j", "REQ", "e1") == 1
    before = digest(r)
    assert enqueue(r, "j", "REQ", "e1") == 1  # the retry
    assert digest(r) == before
    for other in (("REQ", "e2"), ()):  # another request for the same id is a duplicate
        try:
            enqueue(r, "j", *other)
        except redis.ResponseError as exc:
            assert str(exc).startswith("EMQEXISTS")
        else:
            raise AssertionError("a second job with the same id was accepted")
    assert digest(r) == before


def test_a_retried_claim_gets_the_same_jobs_and_claims_no_others(r: redis.Redis) -> None:
    for i in range(5):
        enqueue(r, f"j{i}")
    first = claim(r, "COUNT", 2, "REQ", "c1")
    before = digest(r)
    assert claim(r, "COUNT", 2, "REQ", "c1") == first  # the retry: same ids, same tokens
    assert digest(r) == before
    assert queued(r, Q) == 3
    assert r.pttl(Q.base + "req:c1") > 0  # remembered for the lease, not for ever
    # A new request claims new jobs.
    assert [job[0] for job in claim(r, "REQ", "c2")] == [b"j2"]


def test_a_retried_claim_leaves_out_jobs_the_request_no_longer_holds(r: redis.Redis) -> None:
    enqueue(r, "a")
    enqueue(r, "b")
    first = claim(r, "COUNT", 2, "REQ", "c1")
    token_a = first[0][1]
    assert r.execute_command("EMQ.COMPLETE", Q.active, Q.job("a"), "a", token_a) == 1
    assert [job[0] for job in claim(r, "COUNT", 2, "REQ", "c1")] == [b"b"]


def test_a_retried_complete_succeeds_and_a_stale_one_does_not(r: redis.Redis) -> None:
    enqueue(r, "j")
    token = claim(r)[0][1]
    complete = ["EMQ.COMPLETE", Q.active, Q.job("j"), "j", token]
    assert r.execute_command(*complete) == 1
    before = digest(r)
    assert r.execute_command(*complete) == 1  # its reply was lost: the retry succeeds
    assert digest(r) == before
    # The same token may not FAIL the job it completed.
    try:
        r.execute_command("EMQ.FAIL", Q.active, Q.pending, Q.dead, Q.base, "j", token, 3, "late")
    except redis.ResponseError as exc:
        assert str(exc) == "EMQSTALE job is no longer active"
    assert digest(r) == before


def test_a_retried_fail_answers_where_the_first_sent_the_job(r: redis.Redis) -> None:
    for max_attempts, where in ((3, b"pending"), (1, b"dead")):
        r.flushall()
        enqueue(r, "j")
        token = claim(r)[0][1]
        fail = ["EMQ.FAIL", Q.active, Q.pending, Q.dead, Q.base, "j", token, max_attempts, "boom"]
        assert r.execute_command(*fail) == where
        before = digest(r)
        assert r.execute_command(*fail) == where
        assert digest(r) == before
        if where == b"dead":
            assert r.hget(Q.metrics_failed, "count") == b"1"  # counted once


def test_a_swept_job_is_not_mistaken_for_a_finished_one(r: redis.Redis) -> None:
    # The holder's token still matches after a sweep, but the sweep ended the
    # hold, not a COMPLETE: a late COMPLETE is stale, not a retry.
    enqueue(r, "j")
    token = claim(r)[0][1]
    r.zadd(Q.active, {"j": 0})
    assert r.execute_command("EMQ.SWEEP", Q.active, Q.pending, Q.dead, Q.base, 5, 10)[0] == [b"j"]
    try:
        r.execute_command("EMQ.COMPLETE", Q.active, Q.job("j"), "j", token)
    except redis.ResponseError as exc:
        assert str(exc) == "EMQSTALE job is no longer active"
    else:
        raise AssertionError("a swept job was completed by its old holder")


def test_redis_py_retrying_a_claim_after_a_timeout_does_not_orphan_a_job(server: EmbeddedServer) -> None:
    # The reproduction: a claim's reply is lost (held past the client's socket
    # timeout by a proxy), so redis-py sends the claim again.  Both executions
    # reach the server; the job the first one took must be the one handed out.
    # (A server stall, DEBUG SLEEP, did not test this: the server drops what a
    # timed-out connection sent, so only the last try ever ran.)
    admin = server.client()
    admin.flushall()
    admin_client = Client(admin)
    for job_id in ("JOB-A", "JOB-B", "JOB-C"):
        admin_client.enqueue("q", b"x", job_id=job_id)
    proxy = Proxy(server.port)
    held: list[bytes] = []

    def hold(data: bytes) -> float:
        if b"JOB-A" in data and not held:
            held.append(data)
            return 1.0  # longer than the socket timeout: this reply is lost
        return 0.0

    proxy.hold_reply = hold
    # The retry spelled out: a redis-py client retries a timed-out command by default only from
    # redis-py 6 (before it, a caller's own client raises TimeoutError; Client.from_url retries).
    slow = Client(
        redis.Redis(
            port=proxy.port,
            socket_timeout=0.3,
            retry=Retry(NoBackoff(), 3),
            retry_on_error=[redis.TimeoutError],
        )
    )
    try:
        slow.redis.ping()
        before = int(admin.info("commandstats").get("cmdstat_emq.claim", {}).get("calls", 0))
        job = slow.claim("q", lease_ms=60_000)  # times out once, then retried
        # The fault fired: the first reply was lost, and both executions reached the server.
        assert held and proxy.held_replies == 1
        assert int(admin.info("commandstats")["cmdstat_emq.claim"]["calls"]) - before >= 2
        assert job is not None and job.id == "JOB-A"
        assert admin.zrange(Q.active, 0, -1) == [b"JOB-A"], "a second job was claimed by the retry"
        assert queued(admin, Q) == 2
        slow.complete("q", job.id, job.token)
        assert admin.hget(Q.job("JOB-A"), "state") == b"done"
    finally:
        slow.redis.close()
        proxy.close()
        admin.close()
