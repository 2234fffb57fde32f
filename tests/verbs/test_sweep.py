"""EMQ.SWEEP: replies, key effects, order, limit, thresholds and refusals."""

from __future__ import annotations

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..helpers import digest, entries, extend_args, now_ms, put_active, queued, sweep_args

pytestmark = [pytest.mark.smoke, pytest.mark.memcheck]

Q = "mail"
META_NOT_INTEGER = r"^the queue's meta hash holds a setting that is not an integer$"


def test_empty_queue_sweeps_nothing_and_writes_nothing(r: redis.Redis) -> None:
    keys = queue_keys(Q)
    assert r.execute_command(*sweep_args(keys)) == [[], [], [], 0]
    assert r.keys() == []


def test_live_leases_are_left_alone(r: redis.Redis) -> None:
    keys = put_active(r, Q, "live", attempts=1, deadline=now_ms(r) + 60_000)
    before = digest(r)
    assert r.execute_command(*sweep_args(keys)) == [[], [], [], 0]
    assert digest(r) == before


def test_recovers_below_threshold(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=now_ms(r) - 10)
    assert r.execute_command(*sweep_args(keys, max_stalled=3)) == [[b"j1"], [], [], 0]
    assert entries(r, keys) == [b"j1"]  # at the head of its lane
    assert not r.exists(keys.active)
    row = r.hgetall(keys.job("j1"))
    assert row[b"stalled"] == b"1" and row[b"state"] == b"pending"
    assert row[b"attempts"] == b"1"  # the token is the claim's business, not the sweep's
    assert row[b"token"] == b"1"
    assert b"last_error" not in row and b"finished_at" not in row  # not finished: it runs again
    assert not r.exists(keys.dead) and not r.exists(keys.metrics_failed)


def test_dead_letters_at_threshold(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=3, deadline=now_ms(r) - 10, stalled=2)
    before = now_ms(r)
    assert r.execute_command(*sweep_args(keys, max_stalled=3)) == [[], [b"j1"], [], 0]
    after = now_ms(r)
    died = r.zscore(keys.dead, "j1")  # the dead set is scored with the server time of death
    assert died is not None and before <= died <= after
    row = r.hgetall(keys.job("j1"))
    assert (row[b"stalled"], row[b"state"], row[b"last_error"]) == (b"3", b"dead", b"stalled")
    assert int(row[b"finished_at"]) == died
    assert r.pttl(keys.job("j1")) == -1  # dead rows are kept (dead_ttl_ms defaults to forever)
    assert r.hget(keys.metrics_failed, "count") == b"1"
    assert not r.exists(keys.pending)


def test_above_threshold_is_dead_too(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=0, stalled=9)
    assert r.execute_command(*sweep_args(keys, max_stalled=2)) == [[], [b"j1"], [], 0]
    assert r.hget(keys.job("j1"), "stalled") == b"10"


def test_failed_metric_accumulates(r: redis.Redis) -> None:
    keys = queue_keys(Q)
    r.hset(keys.metrics_failed, "count", 5)
    for i in range(3):
        put_active(r, Q, f"j{i}", attempts=1, deadline=i)
    r.execute_command(*sweep_args(keys))
    assert r.hget(keys.metrics_failed, "count") == b"8"


def test_deadline_equal_to_now_is_lapsed(r: redis.Redis) -> None:
    # "at or before server-now": a deadline in the past by 0 ms counts.
    keys = put_active(r, Q, "j1", attempts=1, deadline=now_ms(r))
    assert r.execute_command(*sweep_args(keys, max_stalled=5)) == [[b"j1"], [], [], 0]


def test_order_is_lowest_deadline_first_and_split_by_fate(r: redis.Redis) -> None:
    now = now_ms(r)
    put_active(r, Q, "c", attempts=1, deadline=now - 100, stalled=1)  # will die
    put_active(r, Q, "a", attempts=1, deadline=now - 300)
    put_active(r, Q, "d", attempts=1, deadline=now - 50)
    put_active(r, Q, "b", attempts=1, deadline=now - 200, stalled=1)  # will die
    keys = put_active(r, Q, "live", attempts=1, deadline=now + 60_000)
    assert r.execute_command(*sweep_args(keys, max_stalled=2)) == [[b"a", b"d"], [b"b", b"c"], [], 0]
    assert r.zrange(keys.active, 0, -1) == [b"live"]


def test_equal_deadlines_in_member_order(r: redis.Redis) -> None:
    for job in ["b", "c", "a"]:
        keys = put_active(r, Q, job, attempts=1, deadline=1000)
    assert r.execute_command(*sweep_args(keys, max_stalled=9)) == [[b"a", b"b", b"c"], [], [], 0]


def test_limit_takes_the_oldest_first(r: redis.Redis) -> None:
    for i in range(10):
        keys = put_active(r, Q, f"j{i}", attempts=1, deadline=1000 + i)
    assert r.execute_command(*sweep_args(keys, max_stalled=9, limit=3)) == [[b"j0", b"j1", b"j2"], [], [], 0]
    assert r.zcard(keys.active) == 7
    assert r.execute_command(*sweep_args(keys, max_stalled=9, limit=100))[0] == [
        f"j{i}".encode() for i in range(3, 10)
    ]
    assert queued(r, keys) == 10


def test_large_sweep_in_one_call(r: redis.Redis) -> None:
    keys = queue_keys(Q)
    pipe = r.pipeline(transaction=False)
    for i in range(5000):
        pipe.hset(keys.job(f"j{i:05}"), mapping={"attempts": 1, "state": "active"})
        pipe.zadd(keys.active, {f"j{i:05}": i})
    pipe.execute()
    reply = r.execute_command(*sweep_args(keys, max_stalled=2, limit=10_000))
    assert reply == [[f"j{i:05}".encode() for i in range(5000)], [], [], 0]
    assert queued(r, keys) == 5000 and not r.exists(keys.active)


def test_stall_counts_across_sweeps_until_dead(r: redis.Redis) -> None:
    keys = queue_keys(Q)
    for round_ in range(1, 4):
        put_active(r, Q, "poison", attempts=round_, deadline=0)
        r.delete(keys.pending)
        recovered, dead, cancelled, expired = r.execute_command(*sweep_args(keys, max_stalled=3))
        assert (cancelled, expired) == ([], 0)
        assert r.hget(keys.job("poison"), "stalled") == str(round_).encode()
        assert (recovered, dead) == (([b"poison"], []) if round_ < 3 else ([], [b"poison"]))
    assert r.zrange(keys.dead, 0, -1) == [b"poison"]


def test_vanished_row_is_recreated_by_the_stall_count(r: redis.Redis) -> None:
    keys = queue_keys(Q)
    r.zadd(keys.active, {"ghost": 0})
    assert r.execute_command(*sweep_args(keys, max_stalled=2)) == [[b"ghost"], [], [], 0]
    assert r.hgetall(keys.job("ghost")) == {b"stalled": b"1", b"state": b"pending"}


def test_binary_and_unicode_ids(r: redis.Redis) -> None:
    ids = [b"\x00\xff\r\n", "zoë-✓".encode(), b"with space", b"job:nested:colons"]
    for n, job in enumerate(ids):
        keys = put_active(r, Q, job, attempts=1, deadline=n)
    assert r.execute_command(*sweep_args(keys, max_stalled=5)) == [ids, [], [], 0]
    for job in ids:
        assert r.hget(keys.job(job), "state") == b"pending"
    assert entries(r, keys) == ids  # at the head of their lane, in deadline order


def test_lapsed_job_with_a_cancel_request_ends_cancelled(r: redis.Redis) -> None:
    """Its holder is gone and it must not run again: the third list, never pending, no stall."""
    now = now_ms(r)
    keys = put_active(r, Q, "c", attempts=2, deadline=now - 10, stalled=1, cancel_requested="stop")
    put_active(r, Q, "a", attempts=1, deadline=now - 20)
    before = now_ms(r)
    assert r.execute_command(*sweep_args(keys, max_stalled=2)) == [[b"a"], [], [b"c"], 0]
    after = now_ms(r)
    row = r.hgetall(keys.job("c"))
    assert row[b"state"] == b"cancelled" and row[b"cancel_requested"] == b"stop"
    assert row[b"stalled"] == b"1"  # not counted as a stall (it would have died at 2)
    assert before <= int(row[b"finished_at"]) <= after
    assert b"last_error" not in row
    assert 0 < r.pttl(keys.job("c")) <= 86_400_000  # the cancelled retention: a day by default
    assert entries(r, keys) == [b"a"] and not r.exists(keys.dead, keys.metrics_failed)
    assert not r.exists(keys.active)


def test_dead_rows_past_the_dead_retention_expire(r: redis.Redis) -> None:
    keys = queue_keys(Q)
    now = now_ms(r)
    r.hset(keys.base + "meta", "dead_ttl_ms", 60_000)
    for i in range(5):
        r.hset(keys.job(f"old{i}"), mapping={"state": "dead", "attempts": 1})
        r.zadd(keys.dead, {f"old{i}": now - 120_000 + i})
    r.hset(keys.job("young"), mapping={"state": "dead", "attempts": 1})
    r.zadd(keys.dead, {"young": now - 1_000})
    # At most <limit> per call, oldest first; the lapsed list is bounded separately.
    assert r.execute_command(*sweep_args(keys, limit=3)) == [[], [], [], 3]
    assert r.zrange(keys.dead, 0, -1) == [b"old3", b"old4", b"young"]
    assert not r.exists(keys.job("old0"), keys.job("old1"), keys.job("old2"))
    assert r.execute_command(*sweep_args(keys, limit=3)) == [[], [], [], 2]
    assert r.zrange(keys.dead, 0, -1) == [b"young"] and r.exists(keys.job("young"))
    assert r.execute_command(*sweep_args(keys, limit=3)) == [[], [], [], 0]


def test_dead_rows_are_kept_forever_by_default(r: redis.Redis) -> None:
    keys = queue_keys(Q)
    r.hset(keys.job("old"), mapping={"state": "dead"})
    r.zadd(keys.dead, {"old": 0})
    before = digest(r)
    assert r.execute_command(*sweep_args(keys)) == [[], [], [], 0]
    assert digest(r) == before
    r.hset(keys.base + "meta", "dead_ttl_ms", -1)  # -1 says the same
    before = digest(r)
    assert r.execute_command(*sweep_args(keys)) == [[], [], [], 0]
    assert digest(r) == before


@pytest.mark.parametrize("value", ["x", "-2", "1.5", "", "9007199254740993"])
def test_a_bad_meta_setting_refuses_the_sweep(r: redis.Redis, value: str) -> None:
    keys = put_active(r, Q, "a", attempts=1, deadline=0)
    r.hset(keys.base + "meta", "dead_ttl_ms", value)
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=META_NOT_INTEGER):
        r.execute_command(*sweep_args(keys))
    assert digest(r) == before


def test_wrong_type_meta_refuses_the_sweep(r: redis.Redis) -> None:
    keys = put_active(r, Q, "a", attempts=1, deadline=0)
    r.set(keys.base + "meta", "not a hash")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^WRONGTYPE"):
        r.execute_command(*sweep_args(keys))
    assert digest(r) == before


# -- refusals: an error reply has written nothing ------------------------------


@pytest.mark.parametrize("argc", [0, 1, 5, 7, 8])
def test_wrong_arity(r: redis.Redis, argc: int) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=0)
    args = [*sweep_args(keys)[1:], "extra", "more"]
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("EMQ.SWEEP", *args[:argc])
    assert digest(r) == before


@pytest.mark.parametrize("value", ["0", "-1", "", "1.0", "x", "+2", " 2", "99999999999999999999"])
@pytest.mark.parametrize("which", ["max-stalled", "limit"])
def test_bad_counts(r: redis.Redis, which: str, value: str) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=0)
    args = sweep_args(keys, **({"max_stalled": value} if which == "max-stalled" else {"limit": value}))
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=f"{which} must be an integer >= 1"):
        r.execute_command(*args)
    assert digest(r) == before


@pytest.mark.parametrize("position", [1, 2, 3])
def test_keys_must_derive_from_base(r: redis.Redis, position: int) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=0)
    args = sweep_args(keys)
    args[position] = queue_keys("other").active if position != 1 else queue_keys("other").pending
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="must be <base>active"):
        r.execute_command(*args)
    assert digest(r) == before


def test_base_must_match_all_three(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=0)
    args = sweep_args(keys)
    args[4] = queue_keys("other").base
    with pytest.raises(redis.ResponseError, match="must be <base>active"):
        r.execute_command(*args)


@pytest.mark.parametrize("which", ["active", "pending", "dead"])
def test_wrong_type_set(r: redis.Redis, which: str) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=0)
    target = getattr(keys, which)
    r.delete(target)
    if which == "pending":
        r.zadd(target, {"x": 1})  # the lane is a list: a sorted set is the wrong type
    else:
        r.rpush(target, "x")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^WRONGTYPE"):
        r.execute_command(*sweep_args(keys))
    assert digest(r) == before


def test_wrong_type_row_refuses_the_whole_sweep(r: redis.Redis) -> None:
    keys = put_active(r, Q, "a", attempts=1, deadline=0)
    put_active(r, Q, "b", attempts=1, deadline=1)
    r.delete(keys.job("b"))
    r.set(keys.job("b"), "not a hash")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^WRONGTYPE"):
        r.execute_command(*sweep_args(keys))
    assert digest(r) == before  # "a" was not half-swept either


def test_wrong_type_metrics_refuses_when_a_job_dies(r: redis.Redis) -> None:
    keys = put_active(r, Q, "a", attempts=1, deadline=0)
    r.sadd(keys.metrics_failed, "x")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^WRONGTYPE"):
        r.execute_command(*sweep_args(keys, max_stalled=1))
    assert digest(r) == before
    # ... but a sweep that kills nobody never looks at the metric.
    assert r.execute_command(*sweep_args(keys, max_stalled=2)) == [[b"a"], [], [], 0]


@pytest.mark.parametrize("stalled", ["x", "1.5", "", "01", "9223372036854775807"])
def test_non_integer_or_overflowing_stalled_refuses_the_whole_sweep(r: redis.Redis, stalled: str) -> None:
    keys = put_active(r, Q, "a", attempts=1, deadline=0)
    put_active(r, Q, "b", attempts=1, deadline=1, stalled=stalled)
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"stalled|overflow"):
        r.execute_command(*sweep_args(keys, max_stalled=5))
    assert digest(r) == before


def test_non_integer_failed_count_refuses(r: redis.Redis) -> None:
    keys = put_active(r, Q, "a", attempts=1, deadline=0)
    r.hset(keys.metrics_failed, "count", "many")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="count"):
        r.execute_command(*sweep_args(keys, max_stalled=1))
    assert digest(r) == before


# -- the stale holder: the deliberate difference from the seed -----------------


def test_stale_holder_cannot_resurrect_a_swept_job(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=0)
    assert r.execute_command(*sweep_args(keys, max_stalled=3)) == [[b"j1"], [], [], 0]
    after_sweep = digest(r)
    # The old holder wakes up; its token still equals attempts (nobody claimed yet).
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE"):
        r.execute_command(*extend_args(keys, "j1", 1, 60_000))
    assert digest(r) == after_sweep
    assert entries(r, keys) == [b"j1"] and not r.exists(keys.active)
    # ... so the next sweep has nothing to count twice.
    assert r.execute_command(*sweep_args(keys, max_stalled=3)) == [[], [], [], 0]
    assert r.hget(keys.job("j1"), "stalled") == b"1"


def test_stale_holder_cannot_resurrect_a_dead_job(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=0)
    r.execute_command(*sweep_args(keys, max_stalled=1))
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE"):
        r.execute_command(*extend_args(keys, "j1", 1, 60_000))
    assert r.zrange(keys.dead, 0, -1) == [b"j1"] and not r.exists(keys.active)
    assert r.hget(keys.metrics_failed, "count") == b"1"


# -- through the Python client ------------------------------------------------


def test_client_sweep(r: redis.Redis, client: echomq.Client) -> None:
    put_active(r, Q, "a", attempts=1, deadline=0)
    put_active(r, Q, "b", attempts=1, deadline=1, stalled=1)
    result = client.sweep(Q, max_stalled=2)
    assert result == echomq.SweepResult(recovered=["a"], dead=["b"])
    assert len(result) == 2
    assert client.sweep(Q) == echomq.SweepResult()


def test_client_sweep_binary_ids_round_trip(r: redis.Redis, client: echomq.Client) -> None:
    put_active(r, Q, b"\xff\xfe", attempts=7, deadline=0)
    result = client.sweep(Q, max_stalled=3)
    assert result.recovered == [b"\xff\xfe".decode("utf-8", "surrogateescape")]
    keys = queue_keys(Q)
    # The str the client returned addresses the same row again.
    r.zadd(keys.active, {b"\xff\xfe": 0})
    client.extend(Q, result.recovered[0], token="7", lease_ms=1000)
    assert r.zscore(keys.active, b"\xff\xfe") != 0


def test_client_sweep_decode_responses(server: EmbeddedServer) -> None:
    r = server.client(decode_responses=True)
    r.flushall()
    put_active(r, Q, "é", attempts=1, deadline=0)
    assert echomq.Client(r).sweep(Q, max_stalled=5).recovered == ["é"]


@pytest.mark.parametrize("kwargs", [{"max_stalled": 0}, {"limit": 0}, {"limit": -3}])
def test_client_sweep_validates(client: echomq.Client, kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        client.sweep(Q, **kwargs)
