"""EMQ.EXTEND answers membership with the write itself (ZADD XX, one lookup).

The paths that shortcut must keep exactly: a non-member of a set that has
other members, an absent set, and a re-score to the score the member
already has.
"""

from __future__ import annotations

import pytest
import redis

from ..helpers import digest, extend_args, now_ms, put_active

Q = "mail"


def test_non_member_among_others_is_stale_and_writes_nothing(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=5)
    r.zrem(keys.active, "j1")
    r.zadd(keys.active, {"j0": 3, "j2": 9})  # the set stays, a listpack
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE job is no longer active"):
        r.execute_command(*extend_args(keys, "j1", 1, 1000))
    assert digest(r) == before


def test_non_member_of_a_large_set_is_stale_and_writes_nothing(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=1, deadline=5)
    r.zrem(keys.active, "j1")
    r.zadd(keys.active, {f"other{i}": i for i in range(300)})  # a skiplist
    assert r.object("encoding", keys.active) == b"skiplist"
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=r"^EMQSTALE job is no longer active"):
        r.execute_command(*extend_args(keys, "j1", 1, 1000))
    assert digest(r) == before


def test_member_of_a_large_set_is_extended(r: redis.Redis) -> None:
    keys = put_active(r, Q, "j1", attempts=2, deadline=5)
    r.zadd(keys.active, {f"other{i}": i for i in range(300)})
    before = now_ms(r)
    assert r.execute_command(*extend_args(keys, "j1", 2, 1000)) == 1
    score = r.zscore(keys.active, "j1")
    assert score is not None and score >= before + 1000
    assert r.zcard(keys.active) == 301


def test_extending_twice_in_one_transaction_succeeds_both_times(r: redis.Redis) -> None:
    # Usually both run in the same millisecond: the second re-scores the
    # member to the score it already has, which ZADD reports as neither
    # added nor updated.  That is still a live member, not a stale one.
    keys = put_active(r, Q, "j1", attempts=1, deadline=5)
    pipe = r.pipeline(transaction=True)
    pipe.execute_command(*extend_args(keys, "j1", 1, 60_000))
    pipe.execute_command(*extend_args(keys, "j1", 1, 60_000))
    assert pipe.execute() == [1, 1]
