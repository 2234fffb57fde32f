"""EMQ.EXTEND: every row of DESIGN.md's reply table, against a real server."""

from __future__ import annotations

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys

from ..helpers import digest, extend_args, now_ms, put_active

pytestmark = [pytest.mark.smoke, pytest.mark.memcheck]

Q = "mail"


def test_ok_rescores_to_server_now_plus_lease(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=3, deadline=1)
    before = now_ms(r)
    assert r.execute_command(*extend_args(keys, "j1", 3, 30_000)) == 1
    after = now_ms(r)
    score = r.zscore(keys.active, "j1")
    assert score is not None and before + 30_000 <= score <= after + 30_000
    assert score == int(score)


def test_ok_writes_only_the_score(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=5)
    r.zadd(keys.active, {"other": 7})
    row = r.hgetall(keys.job("j1"))
    r.execute_command(*extend_args(keys, "j1", 1, 1000))
    assert r.hgetall(keys.job("j1")) == row
    assert r.zscore(keys.active, "other") == 7
    assert sorted(r.keys()) == sorted([keys.active.encode(), keys.job("j1").encode()])


def test_lease_one_ms_is_accepted(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=0)
    assert r.execute_command(*extend_args(keys, "j1", 1, 1)) == 1


@pytest.mark.parametrize(
    "row",
    [None, {"state": "active"}, {"state": "active", "attempts": "1"}],
    ids=["no-row", "no-token", "v1-row-with-attempts-only"],
)
def test_gone_answers_minus_one_and_writes_nothing(r: redis.Redis, row: dict[str, str] | None) -> None:
    keys = queue_keys(Q)
    r.zadd(keys.active, {"j1": 5})
    if row:
        r.hset(keys.job("j1"), mapping=row)
    before = digest(r)
    assert r.execute_command(*extend_args(keys, "j1", 1, 1000)) == -1
    assert digest(r) == before


@pytest.mark.parametrize("token", ["2", "01", " 1", "1 ", "", "+1"])
def test_token_must_match_byte_for_byte(r: redis.Redis, token: str) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=5)
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE"):
        r.execute_command(*extend_args(keys, "j1", token, 1000))
    assert digest(r) == before


def test_the_fence_is_the_token_not_attempts(r: redis.Redis) -> None:
    token = "1-0123456789abcdef"
    keys = put_active(r, Q, "j1", attempts=1, deadline=5, token=token)
    before = digest(r)
    for wrong in ("1", "1-0123456789abcdee", "1-0123456789ABCDEF"):
        with pytest.raises(redis.ResponseError, match=r"^EMQSTALE extend token mismatch$"):
            r.execute_command(*extend_args(keys, "j1", wrong, 1000))
    assert digest(r) == before
    assert r.execute_command(*extend_args(keys, "j1", token, 1000)) == 1


JOB_KEY_ERROR = r"^<job> must be <base>job:<id>, where <active> is <base>active$"


@pytest.mark.parametrize(
    "active, job",
    [
        ("emq:{mail}:active", "emq:{mail}:job:j2"),  # another job's row: its token must not fence j1
        ("emq:{mail}:active", "emq:{other}:job:j1"),
        ("emq:{mail}:active", "emq:{mail}:jobs:j1"),
        ("emq:{mail}:active", "emq:{mail}:job:j1 "),
        ("emq:{mail}:pending", "emq:{mail}:job:j1"),  # <active> must end in "active"
        ("emq:{mail}:activ", "emq:{mail}:job:j1"),
    ],
)
def test_job_must_be_the_ids_row_of_the_queue(r: redis.Redis, active: str, job: str) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=5)
    put_active(r, Q, "j2", attempts=1, deadline=5)
    before = digest(r)
    for verb in ("EMQ.EXTEND", "EMQ.CHECKPOINT"):
        with pytest.raises(redis.ResponseError, match=JOB_KEY_ERROR):
            r.execute_command(verb, active, job, "j1", "1", 1000)
        # Checked right after the same-key check, before the lease is parsed.
        with pytest.raises(redis.ResponseError, match=JOB_KEY_ERROR):
            r.execute_command(verb, active, job, "j1", "1", "not a lease")
        with pytest.raises(redis.ResponseError, match="different keys"):
            r.execute_command(verb, active, active, "j1", "1", "not a lease")
    assert digest(r) == before
    assert r.zscore(keys.active, "j1") == 5


def test_not_active_is_stale_and_writes_nothing(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=5)
    r.zrem(keys.active, "j1")
    r.zadd(keys.pending, {"j1": 0})
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE"):
        r.execute_command(*extend_args(keys, "j1", 1, 1000))
    assert digest(r) == before
    assert not r.exists(keys.active)


@pytest.mark.parametrize("argc", [0, 1, 2, 3, 4, 6, 7])
def test_wrong_arity(r: redis.Redis, argc: int) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=5)
    args = [keys.active, keys.job("j1"), "j1", "1", "1000", "x", "y"][:argc]
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("EMQ.EXTEND", *args)
    assert digest(r) == before


@pytest.mark.parametrize(
    "lease, message",
    [
        ("0", "at least 1"),
        ("-5", "at least 1"),
        ("", "not an integer"),
        ("1.5", "not an integer"),
        ("1e3", "not an integer"),
        (" 10", "not an integer"),
        ("+10", "not an integer"),
        ("010", "not an integer"),
        ("abc", "not an integer"),
        ("9223372036854775808", "not an integer"),
        (str(2**53), "too large"),
        ("9223372036854775807", "too large"),
    ],
)
def test_bad_lease_is_refused_and_writes_nothing(r: redis.Redis, lease: str, message: str) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=5)
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=message):
        r.execute_command(*extend_args(keys, "j1", 1, lease))
    assert digest(r) == before


def test_largest_exact_deadline_is_accepted(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=5)
    lease = 2**53 - now_ms(r) - 60_000  # the server's now moves on a little before it runs
    assert r.execute_command(*extend_args(keys, "j1", 1, lease)) == 1
    score = r.zscore(keys.active, "j1")
    assert score is not None and 2**53 - 60_000 <= score <= 2**53


@pytest.mark.parametrize("which", ["active", "job"])
def test_wrong_type(r: redis.Redis, which: str) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=5)
    target = keys.active if which == "active" else keys.job("j1")
    r.delete(target)
    r.set(target, "a string")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^WRONGTYPE"):
        r.execute_command(*extend_args(keys, "j1", 1, 1000))
    assert digest(r) == before


def test_same_key_twice_is_refused(r: redis.Redis) -> None:
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="different keys"):
        r.execute_command("EMQ.EXTEND", "k", "k", "j1", "1", "1000")
    assert digest(r) == before


# -- through the Python client ------------------------------------------------


def test_client_extend_ok(r: redis.Redis, client: echomq.Client) -> None:
    keys = put_active(r, Q, "j1", attempts=4, deadline=1)
    assert client.extend(Q, "j1", token="4", lease_ms=10_000) is None
    score = r.zscore(keys.active, "j1")
    assert score is not None and score > now_ms(r) + 5_000


def test_client_extend_gone(client: echomq.Client) -> None:
    with pytest.raises(echomq.JobGone) as info:
        client.extend(Q, "nope", token="1", lease_ms=1000)
    assert isinstance(info.value, echomq.LeaseLost)
    assert info.value.job_id == "nope"


def test_client_extend_stale(r: redis.Redis, client: echomq.Client) -> None:
    put_active(r, Q, "j1", attempts=2, deadline=1)
    with pytest.raises(echomq.StaleToken) as info:
        client.extend(Q, "j1", token="1", lease_ms=1000)
    assert isinstance(info.value, echomq.LeaseLost)
    assert isinstance(info.value, echomq.EchoMQError)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"token": "1", "lease_ms": 0}, ValueError),
        ({"token": "1", "lease_ms": 1.5}, TypeError),
        ({"token": 1, "lease_ms": 10}, TypeError),  # tokens are the strings claims hand out
        ({"token": True, "lease_ms": 10}, TypeError),
    ],
)
def test_client_extend_validates_arguments(
    client: echomq.Client, kwargs: dict[str, object], error: type
) -> None:
    with pytest.raises(error):
        client.extend(Q, "j1", **kwargs)  # type: ignore[arg-type]


def test_client_lease_too_large_is_a_typed_error(r: redis.Redis, client: echomq.Client) -> None:
    put_active(r, Q, "j1", attempts=1, deadline=1)
    with pytest.raises(ValueError, match="lease_ms"):  # never an exact deadline: refused before sending
        client.extend(Q, "j1", token="1", lease_ms=2**60)
    with pytest.raises(echomq.BadArgument, match="too large"):  # only the server's clock can tell
        client.extend(Q, "j1", token="1", lease_ms=2**53)
