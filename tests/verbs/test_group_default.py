"""The queue's default group cap (issue 45): ``EMQ.GROUPLIMIT <pending> <base> * MAX <n> | NOMAX``
stores ``group_max`` in ``<base>meta``, the cap of every group without its own ``max``; a change
re-evaluates each group's place in the ring (at most 10,000 groups a call).  Replies are
asserted literally, so both backends answer byte for byte the same.
"""

from __future__ import annotations

import asyncio

import pytest
import redis

import echomq
import echomq.asyncio as aemq
from echomq.testing import EmbeddedServer, queue_problems

from ..helpers import digest
from .test_group_caps import fill, ids, limit
from .test_groups import ring as ring_key

pytestmark = [pytest.mark.backends, pytest.mark.memcheck]


def ring(r: redis.Redis) -> list[str]:
    return [m.decode() for m in r.lrange(ring_key(), 0, -1)]


def test_the_default_caps_every_group_without_its_own_and_re_evaluates_the_ring(
    r: redis.Redis, client: echomq.Client
) -> None:
    fill(client, "a", 3)
    fill(client, "b", 3)
    fill(client, "c", 3)
    assert limit(client, "c", "MAX", 2) == [2, 0, 3, 0]  # its own cap outranks the default
    assert limit(client, "*") == [None, 3]  # a read: no default, three groups
    assert limit(client, "*", "max", 1) == [1, 3]
    assert r.hget("emq:{q}:meta", "group_max") == b"1"
    assert limit(client, "a") == [None, 0, 3, 0]  # its own: none; the default governs it
    taken = ids(client.claim_many("q", 30_000, 10))
    assert sorted(taken) == ["a0", "b0", "c0", "c1"]
    assert ring(r) == []  # every group at its cap: out of the ring
    assert client.claim("q", 30_000) is None
    assert queue_problems(r, "q") == []
    assert limit(client, "*", "MAX", 2) == [2, 3]  # raised: a and b re-enter the ring
    assert ring(r) == ["", "a", "b"]
    assert sorted(ids(client.claim_many("q", 30_000, 10))) == ["a1", "b1"]
    assert queue_problems(r, "q") == []
    assert limit(client, "*", "MAX", 1) == [1, 3]  # lowered below active: out until they drain
    assert limit(client, "*", "NOMAX") == [None, 3]
    assert ring(r) == ["", "a", "b"] and r.hget("emq:{q}:meta", "group_max") is None
    assert sorted(ids(client.claim_many("q", 30_000, 10))) == ["a2", "b2"]
    assert queue_problems(r, "q") == []


def test_a_job_entering_a_group_at_the_default_cap_waits_and_a_freed_slot_re_adds_it(
    r: redis.Redis, client: echomq.Client
) -> None:
    assert limit(client, "*", "MAX", 1) == [1, 0]
    fill(client, "a", 1)
    job = client.claim("q", 30_000)
    assert job is not None and job.id == "a0"
    client.enqueue("q", b"", "a1", group="a")  # at its cap: in its lane, not the ring
    assert ring(r) == [] and client.claim("q", 30_000) is None
    assert queue_problems(r, "q") == []
    client.complete("q", job.id, job.token)  # the left-active hook reads the default too
    assert ring(r) == ["", "a"]
    nxt = client.claim("q", 30_000)
    assert nxt is not None and nxt.id == "a1"
    assert queue_problems(r, "q") == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("*", "PAUSE"), "syntax error"),
        (("*", "RESUME"), "syntax error"),
        (("*", "MAX", 0), "MAX must be an integer from 1 to 1000000000"),
        (("*", "MAX", 1, "NOMAX"), "syntax error"),
        (("**", "MAX", 1), "GROUP must be"),
    ],
)
def test_bad_default_options_are_refused_and_nothing_is_written(
    r: redis.Redis, client: echomq.Client, args: tuple[object, ...], error: str
) -> None:
    fill(client, "a", 1)
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=error):
        limit(client, *args)
    assert digest(r) == before


def test_a_broken_group_max_is_refused_by_the_verb_and_the_lanes(
    r: redis.Redis, client: echomq.Client
) -> None:
    fill(client, "a", 1)
    r.hset("emq:{q}:meta", "group_max", "x")
    before = digest(r)
    text = "the queue's meta hash's 'group_max' field is not an integer from 1 to 1000000000"
    calls = (
        lambda: limit(client, "*"),
        lambda: limit(client, "a"),
        lambda: client.enqueue("q", b"", "a1", group="a"),
    )
    for call in calls:
        with pytest.raises(redis.ResponseError, match=text):
            call()
    assert digest(r) == before


def test_more_groups_than_one_call_may_walk_is_refused_and_nothing_is_written(
    r: redis.Redis, client: echomq.Client
) -> None:
    r.zadd("emq:{q}:groupset", {f"g{i}": 0 for i in range(10_001)})  # the index alone: enough to count
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="more than 10000 groups"):
        limit(client, "*", "MAX", 3)
    assert digest(r) == before
    assert limit(client, "*") == [None, 10_001]  # a read walks nothing


def test_set_group_limit_with_no_group_sets_the_default_sync_and_asyncio(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer, backend: str
) -> None:
    fill(client, "a", 2)
    assert client.set_group_limit("q", None, max_active=1) == echomq.GroupDefault(max_active=1, groups=1)
    assert client.group("q", "a") == echomq.GroupInfo("a", 2, 0, None, False)  # its own cap: none
    assert len(client.claim_many("q", 30_000, 10)) == 1
    with pytest.raises(ValueError, match="max_active"):
        client.set_group_limit("q", None, max_active=0)

    async def run() -> echomq.GroupDefault:
        aclient = aemq.Client.from_url(server.url, backend=backend)
        try:
            return await aclient.set_group_limit("q", None, max_active=None)
        finally:
            await aclient.aclose()

    assert asyncio.run(run()) == echomq.GroupDefault(max_active=None, groups=1)
    assert len(client.claim_many("q", 30_000, 10)) == 1  # the default gone: the second runs
    assert queue_problems(r, "q") == []


def test_a_default_lowered_to_a_groups_active_count_takes_it_out_of_the_ring_at_once(
    r: redis.Redis, client: echomq.Client
) -> None:
    fill(client, "a", 2)
    fill(client, "b", 2)
    assert client.set_group_limit("q", "b", max_active=5).max_active == 5
    job = client.claim("q", 30_000)
    assert job is not None and job.id == "a0" and ring(r) == ["b", "", "a"]  # the claim turned it
    assert limit(client, "*", "MAX", 1) == [1, 2]  # a: 1 active of 1 -> out; b keeps its own cap
    assert ring(r) == ["b", ""]  # the others stay, in their order
    assert queue_problems(r, "q") == []
    assert ids(client.claim_many("q", 30_000, 10)) == ["b0", "b1"]
    assert ring(r) == [] and r.hget("emq:{q}:meta", "ring") is None  # the ring went with its last group
    client.complete("q", job.id, job.token)  # a's slot frees: back in
    assert ring(r) == ["", "a"]
    assert queue_problems(r, "q") == []
