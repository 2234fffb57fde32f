"""EMQ.ENQUEUE, EMQ.CLAIM, EMQ.COMPLETE, EMQ.FAIL: replies, effects, refusals."""

from __future__ import annotations

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys

from ..conftest import ServerFactory, wait_for_replica
from ..helpers import assert_token, digest, entries, forged_token, now_ms, put_active, put_waiting

pytestmark = [pytest.mark.smoke, pytest.mark.memcheck]

Q = "work"
K = queue_keys(Q)
META = K.base + "meta"
META_NOT_INTEGER = r"^the queue's meta hash holds a setting that is not an integer$"
JOB_KEY_ERROR = r"^<job> must be <base>job:<id>, where <active> is <base>active$"
DONE_TTL_MS = 3_600_000  # the default retentions
CANCELLED_TTL_MS = 86_400_000


def enqueue(r: redis.Redis, job: str | bytes, payload: str | bytes = "p", *options: object) -> object:
    return r.execute_command("EMQ.ENQUEUE", K.pending, K.base, job, payload, *options)


def claim(r: redis.Redis, lease: object = 10_000, *options: object) -> object:
    return r.execute_command("EMQ.CLAIM", K.pending, K.active, K.base, lease, *options)


def claim_one(r: redis.Redis, lease: object = 10_000) -> tuple[bytes, str]:
    """CLAIM of one job: its id and its token (checked against the token format)."""
    reply = claim(r, lease)
    assert isinstance(reply, list) and len(reply) == 1, reply
    job_id, token, _payload, _attempt, _state = reply[0]
    return job_id, assert_token(token)


def complete(r: redis.Redis, job: str | bytes, token: object) -> object:
    return r.execute_command("EMQ.COMPLETE", K.active, K.job(job), job, token)


def fail(
    r: redis.Redis, job: str | bytes, token: object, max_attempts: object = 3, error: str = "boom"
) -> object:
    return r.execute_command("EMQ.FAIL", K.active, K.pending, K.dead, K.base, job, token, max_attempts, error)


# -- ENQUEUE -------------------------------------------------------------------


def test_enqueue_writes_row_and_pending_entry(r: redis.Redis) -> None:
    """The row holds what a waiting job needs, no counters (absent is 0): the v3 compact row."""
    before = now_ms(r)
    assert enqueue(r, "j1", b"\x00payload") == 1
    row = r.hgetall(K.job("j1"))
    assert entries(r, K) == [b"j1"]
    assert row.keys() == {b"state", b"payload", b"enqueued_at"}
    assert (row[b"state"], row[b"payload"]) == (b"pending", b"\x00payload")
    assert before <= int(row[b"enqueued_at"]) <= now_ms(r)
    assert r.pttl(K.job("j1")) == -1
    assert r.object("encoding", K.job("j1")) in (b"listpack", b"ziplist")  # ziplist: Redis 6.2's name


def test_enqueue_with_req_answers_its_own_retry(r: redis.Redis) -> None:
    assert enqueue(r, "j1", "p", "REQ", "rid-1") == 1
    assert not r.hexists(K.job("j1"), "request")  # the request is the record's, not the row's
    assert r.get(K.base + "req:rid-1") == b"1" and 0 < r.pttl(K.base + "req:rid-1") <= 60_000
    before = digest(r)
    assert enqueue(r, "j1", "p", "REQ", "rid-1") == 1  # the retry of a lost reply
    assert enqueue(r, "j1", "other payload", "req", "rid-1") == 1  # options are case-insensitive
    assert digest(r) == before
    assert entries(r, K) == [b"j1"] and r.hget(K.job("j1"), "payload") == b"p"
    for options in (("REQ", "rid-2"), ()):  # another request, or none: the id is taken
        with pytest.raises(redis.ResponseError, match=r"^EMQEXISTS"):
            enqueue(r, "j1", "p", *options)
    assert digest(r) == before


@pytest.mark.parametrize(
    "options, error",
    [
        (["REQ"], "^syntax error$"),
        (["REQ", "a", "REQ", "b"], "^syntax error$"),
        (["COUNT", "2"], "^syntax error$"),
        (["REQ", "a", "extra"], "^syntax error$"),
        (["REQ", ""], "^the REQ request id must not be empty$"),
    ],
)
def test_enqueue_bad_options_write_nothing(r: redis.Redis, options: list[str], error: str) -> None:
    with pytest.raises(redis.ResponseError, match=error):
        enqueue(r, "j1", "p", *options)
    assert r.keys() == []


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


def test_claim_takes_fifo_and_gives_a_fresh_token(r: redis.Redis) -> None:
    put_waiting(r, Q, "early", attempts=4, tries=1, payload="data")
    put_waiting(r, Q, "late")
    before = now_ms(r)
    reply = claim(r, 5000)
    after = now_ms(r)
    assert isinstance(reply, list) and len(reply) == 1
    job_id, token, payload, attempt, state = reply[0]
    assert (job_id, payload, attempt, state) == (b"early", b"data", 2, None)
    assert_token(token, attempts=5)  # every claim of the job's life, then 16 fresh hex digits
    row = r.hgetall(K.job("early"))
    assert row[b"attempts"] == b"5" and row[b"tries"] == b"2" and row[b"state"] == b"active"
    assert row[b"token"] == token
    assert before <= int(row[b"claimed_at"]) <= after
    score = r.zscore(K.active, "early")
    assert score is not None and before + 5000 <= score <= after + 5000
    assert entries(r, K) == [b"late"]


def test_two_claims_of_one_job_never_share_a_token(r: redis.Redis) -> None:
    enqueue(r, "j1")
    tokens = []
    for n in range(1, 6):
        job_id, token = claim_one(r)
        assert job_id == b"j1"
        assert_token(token, attempts=n)
        tokens.append(token)
        assert fail(r, "j1", token, max_attempts=100) == b"pending"
    assert len(set(tokens)) == 5
    r.delete(K.pending)
    # The random part differs even between two jobs' first claims.
    enqueue(r, "j2")
    enqueue(r, "j3")
    (_, t2), (_, t3) = claim_one(r), claim_one(r)
    assert t2 != t3 and t2.startswith("1-") and t3.startswith("1-")


def test_recovered_jobs_come_before_newer_ones(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="new")
    put_active(r, Q, "old", attempts=1, deadline=0)
    client.sweep(Q, max_stalled=5)
    old, new = claim(r), claim(r)
    assert isinstance(old, list) and isinstance(new, list)
    # put_active's row has no tries: this claim counts from 0.
    assert [old[0][0], old[0][2:]] == [b"old", [b"", 1, None]]
    assert_token(old[0][1], attempts=2)
    assert [new[0][0], new[0][2:]] == [b"new", [b"", 1, None]]
    assert_token(new[0][1], attempts=1)


def test_claim_drops_a_priority_member_whose_row_is_missing(r: redis.Redis) -> None:
    """A member of <base>priority whose row vanished has nothing to run: the claim drops it, as
    a <pending> entry without a row (test_tombstones.py), and makes up no row for it."""
    r.zadd(K.priority, {"ghost": 1025 * 2**42})
    assert claim(r) is None
    assert r.zcard(K.priority) == 0 and not r.exists(K.job("ghost"))


def test_claim_count_takes_up_to_n_oldest_first(r: redis.Redis) -> None:
    for i in range(5):
        enqueue(r, f"j{i}", f"p{i}")
    reply = claim(r, 10_000, "COUNT", 3)
    assert isinstance(reply, list)
    expected = [(f"j{i}".encode(), f"p{i}".encode(), 1, None) for i in range(3)]
    assert [(j[0], j[2], j[3], j[4]) for j in reply] == expected
    assert len({assert_token(j[1], attempts=1) for j in reply}) == 3
    assert r.zrange(K.active, 0, -1) == [b"j0", b"j1", b"j2"]
    rest = claim(r, 10_000, "count", 10)  # fewer are waiting: those
    assert isinstance(rest, list) and [j[0] for j in rest] == [b"j3", b"j4"]
    assert claim(r, 10_000, "COUNT", 10) is None


def test_claim_count_is_capped_at_1000(r: redis.Redis) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(1001):
        pipe.execute_command("EMQ.ENQUEUE", K.pending, K.base, f"j{i:04}", "p")
    pipe.execute()
    reply = claim(r, 10_000, "COUNT", 5000)
    assert isinstance(reply, list) and len(reply) == 1000
    assert entries(r, K) == [b"j1000"]


def test_claim_writes_nothing_when_nothing_is_claimable(r: redis.Redis) -> None:
    enqueue(r, "later", "p", "DELAY", 600_000)
    before = digest(r)
    assert claim(r) is None
    assert digest(r) == before
    enqueue(r, "now")
    r.hset(META, "paused", "1")  # the queue is paused
    before = digest(r)
    assert claim(r, 10_000, "COUNT", 5) is None
    assert digest(r) == before
    r.hdel(META, "paused")
    reply = claim(r, 10_000, "COUNT", 5)
    assert isinstance(reply, list) and [j[0] for j in reply] == [b"now"]


def test_claim_hands_out_the_checkpoint_and_clears_closed_by(r: redis.Redis) -> None:
    enqueue(r, "j1", "payload")
    _, token = claim_one(r)
    r.hset(K.job("j1"), "checkpoint", b"step-3\x00")
    assert fail(r, "j1", token, max_attempts=5) == b"pending"
    assert r.hget(K.job("j1"), "closed_by") == b"fail:pending"
    reply = claim(r)
    assert isinstance(reply, list)
    assert [reply[0][0], reply[0][2:]] == [b"j1", [b"payload", 2, b"step-3\x00"]]
    assert not r.hexists(K.job("j1"), "closed_by")


def test_claim_takes_a_job_whose_cancel_was_requested(r: redis.Redis) -> None:
    """No more skipping: the holder hears of the cancel at its first checkpoint."""
    enqueue(r, "j1")
    r.hset(K.job("j1"), "cancel_requested", "stop")
    job_id, token = claim_one(r)
    assert job_id == b"j1" and r.hget(K.job("j1"), "state") == b"active"
    assert r.execute_command("EMQ.CHECKPOINT", K.active, K.job("j1"), "j1", token, 10_000) == [1, b"stop"]


def test_claim_with_req_answers_its_own_retry(r: redis.Redis) -> None:
    for j in "abc":
        enqueue(r, j, f"p-{j}")
    before = now_ms(r)
    first = claim(r, 30_000, "COUNT", 2, "REQ", "rq")
    assert isinstance(first, list) and [j[0] for j in first] == [b"a", b"b"]
    record = K.base + "req:rq"
    assert 0 < r.pttl(record) <= 30_000
    deadline = r.zscore(K.active, "a")
    assert before + 30_000 <= deadline == r.zscore(K.active, "b")
    try:  # the record expires at the lease deadline of the claim
        assert r.execute_command("PEXPIRETIME", record) == deadline
    except redis.ResponseError:  # Redis 6.2 has no PEXPIRETIME: from PTTL, within a few ms
        assert abs(now_ms(r) + r.pttl(record) - deadline) <= 5
    snapshot = digest(r)
    # The retry of a lost reply: the same jobs with the same tokens, nothing written, no new claim.
    assert claim(r, 30_000, "COUNT", 2, "REQ", "rq") == first
    assert claim(r, 30_000, "COUNT", 5, "REQ", "rq") == first
    assert digest(r) == snapshot and entries(r, K) == [b"c"]
    # A job the request no longer holds is left out; null when none is held.
    assert complete(r, "a", first[0][1]) == 1
    assert claim(r, 30_000, "COUNT", 2, "REQ", "rq") == [first[1]]
    r.zadd(K.active, {"b": 0})
    r.execute_command("EMQ.SWEEP", K.active, K.pending, K.dead, K.base, 5, 10)
    snapshot = digest(r)
    assert claim(r, 30_000, "COUNT", 2, "REQ", "rq") is None
    assert digest(r) == snapshot
    # Another request claims afresh.
    other = claim(r, 30_000, "COUNT", 2, "REQ", "rq2")
    assert isinstance(other, list) and [j[0] for j in other] == [b"b", b"c"]
    assert other[0][1] != first[1][1]


@pytest.mark.parametrize(
    "options, error",
    [
        (["COUNT"], "^syntax error$"),
        (["COUNT", "1", "COUNT", "2"], "^syntax error$"),
        (["REQ", "a", "REQ", "b"], "^syntax error$"),
        (["LIMIT", "2"], "^syntax error$"),
        (["COUNT", "0"], "^COUNT must be an integer >= 1$"),
        (["COUNT", "-1"], "^COUNT must be an integer >= 1$"),
        (["COUNT", "x"], "^COUNT must be an integer >= 1$"),
        (["COUNT", "01"], "^COUNT must be an integer >= 1$"),
        (["REQ", ""], "^the REQ request id must not be empty$"),
    ],
)
def test_claim_bad_options_write_nothing(r: redis.Redis, options: list[str], error: str) -> None:
    enqueue(r, "j1")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=error):
        claim(r, 10_000, *options)
    assert digest(r) == before


@pytest.mark.parametrize("lease", ["0", "-1", "x", str(2**53)])
def test_claim_bad_lease_writes_nothing(r: redis.Redis, lease: str) -> None:
    enqueue(r, "j1")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="lease-ms"):
        claim(r, lease)
    assert digest(r) == before


@pytest.mark.parametrize("field", ["attempts", "tries"])
def test_claim_non_integer_counter_writes_nothing(r: redis.Redis, field: str) -> None:
    enqueue(r, "j0")
    enqueue(r, "j1")
    r.hset(K.job("j1"), field, "many")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=f"^the job row's '{field}' field is not an integer$"):
        claim(r, 10_000, "COUNT", 2)  # j0 is fine, but a claim takes all its jobs or none
    assert digest(r) == before


def test_claim_wrong_type_row(r: redis.Redis) -> None:
    r.rpush(K.pending, "j1")
    r.set(K.job("j1"), "x")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^WRONGTYPE"):
        claim(r)
    assert digest(r) == before


# -- COMPLETE ------------------------------------------------------------------


def test_complete_by_the_holder(r: redis.Redis) -> None:
    enqueue(r, "j1")
    _, token = claim_one(r)
    before = now_ms(r)
    assert complete(r, "j1", token) == 1
    after = now_ms(r)
    assert not r.exists(K.active)
    row = r.hgetall(K.job("j1"))
    assert row[b"state"] == b"done" and row[b"closed_by"] == b"complete" and row[b"token"] == token.encode()
    assert before <= int(row[b"finished_at"]) <= after
    assert 0 < r.pttl(K.job("j1")) <= DONE_TTL_MS  # the done retention: an hour by default


def test_complete_retried_answers_one_and_writes_nothing(r: redis.Redis) -> None:
    enqueue(r, "j1")
    _, token = claim_one(r)
    assert complete(r, "j1", token) == 1
    before = digest(r)
    assert complete(r, "j1", token) == 1  # its first reply was lost
    assert digest(r) == before
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE complete token mismatch$"):
        complete(r, "j1", forged_token(token))


@pytest.mark.parametrize("ttl, pttl", [("0", -2), ("-1", -1), ("5000", 5000)])
def test_complete_keeps_the_done_row_for_the_queues_retention(r: redis.Redis, ttl: str, pttl: int) -> None:
    r.hset(META, "done_ttl_ms", ttl)
    enqueue(r, "j1")
    _, token = claim_one(r)
    assert complete(r, "j1", token) == 1
    assert not r.exists(K.active)
    if pttl == 5000:
        assert 0 < r.pttl(K.job("j1")) <= 5000
    else:
        assert r.pttl(K.job("j1")) == pttl  # -2: deleted at once; -1: kept


def test_complete_gone(r: redis.Redis) -> None:
    assert complete(r, "nope", 1) == -1
    r.hset(K.job("tokenless"), "state", "active")  # a row without a token is gone too
    r.zadd(K.active, {"tokenless": 0})
    before = digest(r)
    assert complete(r, "tokenless", 1) == -1
    assert digest(r) == before


@pytest.mark.parametrize("case", ["wrong-token", "forged", "swept", "failed"])
def test_complete_stale_writes_nothing(r: redis.Redis, case: str) -> None:
    enqueue(r, "j1")
    _, token = claim_one(r, 1)
    error = "^EMQSTALE complete token mismatch$"
    if case == "wrong-token":
        token = token.split("-")[0]  # the claim number alone is not the token
    elif case == "forged":
        token = forged_token(token)
    elif case == "swept":
        r.zadd(K.active, {"j1": 0})
        r.execute_command("EMQ.SWEEP", K.active, K.pending, K.dead, K.base, 5, 10)
        error = "^EMQSTALE job is no longer active$"
    else:  # FAIL ended the hold: a COMPLETE after it is no retry of COMPLETE
        assert fail(r, "j1", token, max_attempts=5) == b"pending"
        error = "^EMQSTALE job is no longer active$"
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=error):
        complete(r, "j1", token)
    assert digest(r) == before


@pytest.mark.parametrize(
    "active, job, job_id",
    [
        (K.active, K.job("j2"), "j1"),  # another job's row
        (K.active, queue_keys("other").job("j1"), "j1"),  # another queue's row
        (K.pending, K.job("j1"), "j1"),  # <active> that does not end in "active"
        (queue_keys("other").active, K.job("j1"), "j1"),
    ],
)
def test_complete_job_key_must_be_the_ids_row(r: redis.Redis, active: str, job: str, job_id: str) -> None:
    enqueue(r, "j1")
    enqueue(r, "j2")
    _, token = claim_one(r)
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=JOB_KEY_ERROR):
        r.execute_command("EMQ.COMPLETE", active, job, job_id, token)
    assert digest(r) == before


def test_complete_same_key_twice(r: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError, match="different keys"):
        r.execute_command("EMQ.COMPLETE", "k", "k", "j", "1")


# -- FAIL ----------------------------------------------------------------------


def test_fail_below_max_goes_back_to_pending_behind_waiting_work(r: redis.Redis) -> None:
    enqueue(r, "j1")
    enqueue(r, "j2")
    job_id, token = claim_one(r)
    assert job_id == b"j1"
    assert fail(r, "j1", token, max_attempts=2, error="ValueError: bad") == b"pending"
    row = r.hgetall(K.job("j1"))
    assert row[b"state"] == b"pending" and row[b"last_error"] == b"ValueError: bad"
    assert row[b"closed_by"] == b"fail:pending" and b"finished_at" not in row
    assert r.pttl(K.job("j1")) == -1
    assert entries(r, K) == [b"j2", b"j1"]  # behind the waiting work: the tail of its lane
    assert not r.exists(K.active) and not r.exists(K.metrics_failed)


def test_fail_at_max_dead_letters_and_counts(r: redis.Redis) -> None:
    enqueue(r, "j1")
    _, token = claim_one(r)
    before = now_ms(r)
    assert fail(r, "j1", token, max_attempts=1, error="boom") == b"dead"
    after = now_ms(r)
    [(member, died)] = r.zrange(K.dead, 0, -1, withscores=True)
    assert member == b"j1" and before <= died <= after  # scored with the time of death
    row = r.hgetall(K.job("j1"))
    assert row[b"state"] == b"dead" and row[b"last_error"] == b"boom" and row[b"closed_by"] == b"fail:dead"
    assert int(row[b"finished_at"]) == died
    assert r.pttl(K.job("j1")) == -1  # dead rows are kept by default
    assert r.hget(K.metrics_failed, "count") == b"1"
    assert not r.exists(K.pending) and not r.exists(K.active)


def test_fail_with_a_cancel_request_ends_cancelled(r: redis.Redis) -> None:
    enqueue(r, "j1")
    _, token = claim_one(r)
    r.hset(K.job("j1"), "cancel_requested", "stop")
    before = now_ms(r)
    assert fail(r, "j1", token, max_attempts=1, error="Cancelled: stop") == b"cancelled"
    after = now_ms(r)
    row = r.hgetall(K.job("j1"))
    assert row[b"state"] == b"cancelled" and row[b"last_error"] == b"Cancelled: stop"
    assert row[b"closed_by"] == b"fail:cancelled" and before <= int(row[b"finished_at"]) <= after
    assert 0 < r.pttl(K.job("j1")) <= CANCELLED_TTL_MS
    assert not r.exists(K.active, K.pending, K.dead, K.metrics_failed)  # not retried, not a failure


def test_fail_budget_is_tries_not_attempts(r: redis.Redis) -> None:
    """`attempts` counts every claim of the job's life; the budget counts `tries`."""
    put_active(r, Q, "j1", attempts=7, deadline=now_ms(r) + 60_000, tries=1)
    assert fail(r, "j1", 7, max_attempts=2) == b"pending"
    put_active(r, Q, "j2", attempts=7, deadline=now_ms(r) + 60_000, tries=-1)  # negative is an integer
    assert fail(r, "j2", 7, max_attempts=1) == b"pending"
    put_active(r, Q, "j3", attempts=2, deadline=now_ms(r) + 60_000)  # no tries: attempts is the budget
    assert fail(r, "j3", 2, max_attempts=2) == b"dead"


@pytest.mark.parametrize("route", ["pending", "dead", "cancelled"])
def test_fail_retried_answers_the_same_and_writes_nothing(r: redis.Redis, route: str) -> None:
    enqueue(r, "j1")
    _, token = claim_one(r)
    if route == "cancelled":
        r.hset(K.job("j1"), "cancel_requested", "stop")
    max_attempts = 1 if route == "dead" else 5
    assert fail(r, "j1", token, max_attempts=max_attempts) == route.encode()
    before = digest(r)
    assert fail(r, "j1", token, max_attempts=max_attempts) == route.encode()
    assert fail(r, "j1", token, max_attempts=1) == route.encode()  # where the first call sent it
    assert digest(r) == before
    assert r.hget(K.metrics_failed, "count") == (b"1" if route == "dead" else None)


def test_fail_retried_after_the_job_moved_on_answers_its_first_reply(r: redis.Redis) -> None:
    enqueue(r, "j1")
    _, token = claim_one(r)
    assert fail(r, "j1", token, max_attempts=5) == b"pending"  # this reply is lost
    assert r.execute_command("EMQ.CANCEL", K.pending, K.base, "j1", "stop") == b"cancelled"
    before = digest(r)
    assert fail(r, "j1", token, max_attempts=5) == b"pending"  # redis-py's retry
    assert digest(r) == before


def test_fail_after_complete_is_stale(r: redis.Redis) -> None:
    enqueue(r, "j1")
    _, token = claim_one(r)
    assert complete(r, "j1", token) == 1
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE job is no longer active$"):
        fail(r, "j1", token)
    assert digest(r) == before


def test_fail_stale_and_gone(r: redis.Redis) -> None:
    assert fail(r, "nope", 1) == -1
    enqueue(r, "j1")
    _, token = claim_one(r)
    before = digest(r)
    for wrong in ("1", forged_token(token)):
        with pytest.raises(redis.ResponseError, match=r"^EMQSTALE fail token mismatch$"):
            fail(r, "j1", wrong)
    assert digest(r) == before


@pytest.mark.parametrize("max_attempts", ["0", "x", "-2"])
def test_fail_bad_max_attempts(r: redis.Redis, max_attempts: str) -> None:
    enqueue(r, "j1")
    _, token = claim_one(r)
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="max-attempts"):
        fail(r, "j1", token, max_attempts=max_attempts)
    assert digest(r) == before


def test_fail_corrupt_metric_writes_nothing(r: redis.Redis) -> None:
    enqueue(r, "j1")
    _, token = claim_one(r)
    r.hset(K.metrics_failed, "count", "lots")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="count"):
        fail(r, "j1", token, max_attempts=1)
    assert digest(r) == before


@pytest.mark.parametrize("verb", ["complete", "fail"])
def test_a_bad_meta_setting_refuses_and_writes_nothing(r: redis.Redis, verb: str) -> None:
    enqueue(r, "j1")
    _, token = claim_one(r)
    r.hset(META, "done_ttl_ms", "1.5")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=META_NOT_INTEGER):
        complete(r, "j1", token) if verb == "complete" else fail(r, "j1", token)
    assert digest(r) == before


@pytest.mark.parametrize(
    "args, options",
    [
        (["EMQ.ENQUEUE", K.pending, K.base, "j"], True),
        (["EMQ.CLAIM", K.pending, K.active, K.base], True),
        (["EMQ.COMPLETE", K.active, K.job("j"), "j"], True),  # [RESULT <bytes>]
        (["EMQ.FAIL", K.active, K.pending, K.dead, K.base, "j", "1", "3"], True),
    ],
)
def test_wrong_arity(r: redis.Redis, args: list[str], options: bool) -> None:
    """`args` is one argument short.  ENQUEUE, CLAIM, COMPLETE and FAIL take options after
    their arguments: more arguments than that are a syntax error, not an arity one."""
    for n in (1, len(args) - 1, len(args), len(args) + 2):
        if n == len(args) + 2 and options:
            with pytest.raises(redis.ResponseError, match=r"^syntax error$"):
                r.execute_command(*[*args, "x", "y", "z"][:n])
            continue
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            r.execute_command(*[*args, "x", "y", "z"][:n])
    assert r.keys() == []


# -- the Python client -----------------------------------------------------------


def test_client_round_trip(client: echomq.Client) -> None:
    first = client.enqueue(Q, b"one")
    client.enqueue(Q, "two", job_id="second")
    job = client.claim(Q, lease_ms=5000)
    assert job is not None
    assert job == echomq.Job(Q, first, assert_token(job.token, attempts=1), b"one", 1, None)
    client.complete(Q, job.id, job.token)
    assert client.complete(Q, job.id, job.token) is None  # a retried complete is answered, not refused
    with pytest.raises(echomq.StaleToken):
        client.complete(Q, job.id, forged_token(job.token))
    job2 = client.claim(Q, lease_ms=5000)
    assert job2 is not None and (job2.id, job2.payload) == ("second", b"two")
    assert client.fail(Q, job2.id, job2.token, "nope", max_attempts=1) == "dead"
    assert client.claim(Q, lease_ms=5000) is None
    with pytest.raises(echomq.JobExists):
        client.enqueue(Q, job_id="second")
    with pytest.raises(echomq.JobGone):
        client.complete(Q, "missing", "1")
    with pytest.raises(TypeError):
        client.complete(Q, "missing", 1)  # type: ignore[arg-type]


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


def test_client_claim_many_hands_out_payload_attempt_and_resume_state(
    r: redis.Redis, client: echomq.Client
) -> None:
    for i in range(3):
        client.enqueue(Q, f"p{i}".encode(), job_id=f"j{i}")
    r.hset(K.job("j1"), "checkpoint", b"resume here")
    r.config_resetstat()
    jobs = client.claim_many(Q, lease_ms=5000, count=2)
    stats = r.info("commandstats")
    assert stats["cmdstat_emq.claim"]["calls"] == 1 and "cmdstat_hget" not in stats  # one round trip
    assert [(j.queue, j.id, j.payload, j.attempt, j.resume_state) for j in jobs] == [
        (Q, "j0", b"p0", 1, None),
        (Q, "j1", b"p1", 1, b"resume here"),
    ]
    assert all(r.hget(K.job(j.id), "token") == assert_token(j.token, 1).encode() for j in jobs)
    assert [j.id for j in client.claim_many(Q, lease_ms=5000, count=5)] == ["j2"]
    assert client.claim_many(Q, lease_ms=5000, count=5) == []
    with pytest.raises(ValueError):
        client.claim_many(Q, lease_ms=5000, count=0)


def test_client_claim_and_enqueue_are_safe_to_resend(r: redis.Redis) -> None:
    """The client sends a fresh REQ with each claim and enqueue, so a resend of the
    same command line (redis-py's retry after a lost reply) takes effect once."""
    from echomq import _protocol as proto

    add = proto.enqueue(Q, b"data", None)
    assert r.execute_command(*add.args) == r.execute_command(*add.args) == 1
    assert r.llen(K.pending) == 1 and r.exists(K.base + "req:" + proto.request_id_of(add).decode())
    take = proto.claim(Q, 5000)
    first = r.execute_command(*take.args)
    assert r.execute_command(*take.args) == first  # the same job, the same token
    [job] = take.read(first)
    assert (job.id, job.payload) == (add.job_id, b"data") and r.zcard(K.active) == 1
    assert proto.claim(Q, 5000).args[-1] != take.args[-1]  # every call its own request id


def test_client_tokens_are_strings(client: echomq.Client) -> None:
    for call in (
        lambda: client.complete(Q, "j", 1),  # type: ignore[arg-type]
        lambda: client.fail(Q, "j", 1, "e"),  # type: ignore[arg-type]
        lambda: client.checkpoint(Q, "j", 1, 1000),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError, match="token"):
            call()


def test_client_sweep_result_counts_cancelled_jobs(r: redis.Redis, client: echomq.Client) -> None:
    put_active(r, Q, "a", attempts=1, deadline=0)
    put_active(r, Q, "c", attempts=1, deadline=1, cancel_requested="stop")
    result = client.sweep(Q, max_stalled=5)
    assert result == echomq.SweepResult(recovered=["a"], dead=[], cancelled=["c"], expired=0)
    assert len(result) == 2
