"""Keyspace notifications: the module fires what the seed's Lua fires.

The module writes through the low-level key API, which notifies nobody, so
the module fires each event itself.  The reference is the seed's Lua run on the
same data: its core commands (ZREM, HINCRBY, HSET, ZADD) fire the events a
keyspace-notification consumer was built against.  We compare the exact
sequence of (event, key) pairs, `new` and `del` included, not just the set:
the module applies each job's writes in the Lua's order, so there is no
reason for a consumer to see anything different -- but for the one change of
the v3 keyspace: ``<pending>`` is a list, and a sweep's recovered jobs enter
it in one LPUSH after the jobs' own writes, where the seed had a ZADD per job.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from echomq.keyspace import QueueKeys, queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..helpers import extend_args, now_ms, put_active, sweep_args
from ..seed_scripts import EXTEND_LUA, SWEEP_LUA

MARKER = "echomq-test-marker"

Event = tuple[str, str]


@pytest.fixture(scope="module")
def notifying(server_factory: ServerFactory) -> EmbeddedServer:
    # K and E: both channel families; A: every class; n: key creation.
    return server_factory(["--notify-keyspace-events", "KEAn"])


@pytest.fixture
def nr(notifying: EmbeddedServer) -> Iterator[redis.Redis]:
    conn = notifying.client()
    conn.flushall()
    yield conn
    conn.close()


def captured(r: redis.Redis, action: Callable[[], object]) -> list[Event]:
    """The (event, key) pairs fired in db 0 while `action` ran, in order."""
    sub = r.pubsub()
    try:
        sub.psubscribe("__keyevent@0__:*")
        sub.subscribe(MARKER)
        for _ in range(2):  # the two subscribe confirmations
            assert sub.get_message(timeout=5) is not None
        action()
        r.publish(MARKER, "end")  # everything fired before this is already queued
        events: list[Event] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            msg = sub.get_message(timeout=1)
            if msg is None:
                continue
            if msg["type"] == "message" and msg["channel"] == MARKER.encode():
                return events
            if msg["type"] == "pmessage":
                event = msg["channel"].decode().split(":", 1)[1]
                events.append((event, msg["data"].decode()))
        raise TimeoutError("the marker never came back")
    finally:
        sub.close()


def seed_sweep_data(r: redis.Redis) -> QueueKeys:
    """Lapsed jobs of every kind: recovered, dead, a vanished row, plus a live
    one that stays.  Absolute deadlines, far in the past or the future, so two
    runs hold equal data."""
    keys = put_active(r, "ev", "fresh", attempts=1, deadline=1000, stalled=0)
    put_active(r, "ev", "poison", attempts=2, deadline=2000, stalled=2)
    put_active(r, "ev", "requeued", attempts=1, deadline=3000)
    r.zadd(keys.active, {"orphan": 4000})  # its row is gone: HINCRBY re-creates it
    put_active(r, "ev", "live", attempts=1, deadline=2**52)
    return keys


def queue_state(r: redis.Redis, keys: QueueKeys) -> dict[str, Any]:
    """Every key of the queue: sets with scores, lists as their members with score 0, hashes with fields."""
    state: dict[str, Any] = {}
    for key in sorted(r.keys(keys.base + "*")):
        kind = r.type(key)
        if kind == b"zset":
            state[key.decode()] = r.zrange(key, 0, -1, withscores=True)
        elif kind == b"list":  # the v3 <pending>: its head as the seed's score-0 members, in id order
            state[key.decode()] = sorted((m, 0.0) for m in r.lrange(key, 0, -1))
        else:
            state[key.decode()] = r.hgetall(key)
    return state


def test_sweep_fires_exactly_the_seed_lua_events(nr: redis.Redis) -> None:
    keys = seed_sweep_data(nr)
    lua = captured(nr, lambda: nr.eval(SWEEP_LUA, 3, keys.active, keys.pending, keys.dead, keys.base, 3, 100))
    lua_state = queue_state(nr, keys)
    nr.flushall()
    keys = seed_sweep_data(nr)
    start = now_ms(nr)
    native = captured(nr, lambda: nr.execute_command(*sweep_args(keys, 3, 100)))
    end = now_ms(nr)

    # The seed's, but for <pending>: one LPUSH (a list, created by it) after the jobs' writes,
    # in place of a ZADD per recovered job.
    into_pending = [("zadd", keys.pending), ("new", keys.pending)]
    assert native == [e for e in lua if e not in into_pending] + [
        ("new", keys.pending),
        ("lpush", keys.pending),
    ]
    # Every kind of event is in there, so the comparison means something.
    assert {e for e, _ in native} == {"zrem", "hincrby", "hset", "zadd", "new", "lpush"}
    assert ("hset", keys.job("orphan")) in native
    assert lua.count(("zadd", keys.pending)) == 3  # fresh, requeued, orphan
    assert nr.lrange(keys.pending, 0, -1) == [b"fresh", b"requeued", b"orphan"]  # deadline order
    # The data is the Lua's but for the two documented differences: the dead
    # set is scored with the time of death (the seed's is 0), and the dead row
    # records it in finished_at.
    native_state = queue_state(nr, keys)
    [(member, died)] = native_state[keys.dead]
    assert member == b"poison" and start <= died <= end
    assert native_state[keys.job("poison")].pop(b"finished_at") == str(int(died)).encode()
    native_state[keys.dead] = [(b"poison", 0.0)]
    assert native_state == lua_state


def test_sweep_that_empties_active_fires_del_like_zrem(nr: redis.Redis) -> None:
    now = now_ms(nr)
    for job in ("a", "b"):
        keys = put_active(nr, "gone", job, attempts=1, deadline=now - 1000)
    native = captured(nr, lambda: nr.execute_command(*sweep_args(keys, 1, 10)))
    assert nr.exists(keys.active) == 0
    assert native[-7:] == [
        ("zrem", keys.active),
        ("del", keys.active),
        ("hincrby", keys.job("b")),
        ("hset", keys.job("b")),
        ("hset", keys.job("b")),
        ("zadd", keys.dead),
        ("hincrby", keys.metrics_failed),
    ]
    nr.flushall()
    for job in ("a", "b"):
        keys = put_active(nr, "gone", job, attempts=1, deadline=now - 1000)
    lua = captured(nr, lambda: nr.eval(SWEEP_LUA, 3, keys.active, keys.pending, keys.dead, keys.base, 1, 10))
    assert native == lua


def test_extend_fires_zadd_on_active_like_the_lua(nr: redis.Redis) -> None:
    keys = put_active(nr, "ext", "j", attempts=4, deadline=now_ms(nr) + 1000)
    lua = captured(nr, lambda: nr.eval(EXTEND_LUA, 2, keys.active, keys.job("j"), "j", "4", 60_000))
    native = captured(nr, lambda: nr.execute_command(*extend_args(keys, "j", 4, 120_000)))
    assert lua == native == [("zadd", keys.active)]


def test_refused_commands_fire_nothing(nr: redis.Redis) -> None:
    now = now_ms(nr)
    keys = put_active(nr, "no", "j", attempts=4, deadline=now - 1000, stalled="x")
    nr.zadd(queue_keys("no").active, {"k": now + 60_000})

    replies: list[object] = []

    def refused() -> None:
        for args in (
            extend_args(keys, "j", 3, 1000),  # stale token
            extend_args(keys, "missing", 4, 1000),  # row gone (:-1)
            sweep_args(keys, 1, 10),  # corrupt 'stalled' on a lapsed row
        ):
            try:
                replies.append(nr.execute_command(*args))
            except redis.ResponseError as exc:
                replies.append(str(exc))

    assert captured(nr, refused) == []
    assert replies[0] == "EMQSTALE extend token mismatch"
    assert replies[1] == -1
    assert "'stalled' field that is not an integer" in str(replies[2])
    assert nr.zscore(keys.active, "j") == now - 1000


def test_commands_that_write_nothing_leave_other_clients_watch_intact(
    nr: redis.Redis, notifying: EmbeddedServer
) -> None:
    """v2: a verb that changes nothing -- an error, a stale or gone holder, a sweep
    or claim with nothing to take, a retry -- signals no key as modified, so a
    WATCH on the queue survives it.  A real write still aborts the transaction."""
    now = now_ms(nr)
    keys = put_active(nr, "w", "j", attempts=2, deadline=now + 600_000)
    nr.hset(keys.job("d"), mapping={"state": "done", "token": "1", "closed_by": "complete", "attempts": 1})
    meta = keys.base + "meta"
    watched = [keys.active, keys.pending, keys.dead, keys.job("j"), keys.job("d"), meta, keys.metrics_failed]
    no_ops: list[list[object]] = [
        extend_args(keys, "j", 1, 60_000),  # stale token
        extend_args(keys, "gone", 1, 60_000),  # :-1
        ["EMQ.CHECKPOINT", keys.active, keys.job("j"), "j", "2", 0],  # bad lease
        sweep_args(keys, 1, 10),  # nothing lapsed
        ["EMQ.CLAIM", keys.pending, keys.active, keys.base, 1000],  # nothing waiting: null
        ["EMQ.COMPLETE", keys.active, keys.job("d"), "d", "1"],  # a retried complete: :1
        ["EMQ.COMPLETE", keys.active, keys.job("j"), "j", "1"],  # stale
        ["EMQ.FAIL", keys.active, keys.pending, keys.dead, keys.base, "j", "2", 0, "e"],  # bad max-attempts
        ["EMQ.ENQUEUE", keys.pending, keys.base, "j", "p"],  # EMQEXISTS
        ["EMQ.CANCEL", keys.pending, keys.base, "d", "r"],  # +finished
    ]
    watcher = notifying.client()
    try:
        pipe = watcher.pipeline(transaction=True)
        pipe.watch(*watched)
        for args in no_ops:
            with contextlib.suppress(redis.ResponseError):
                nr.execute_command(*args)
        pipe.multi()
        pipe.hset(keys.base + "marker", "x", 1)
        assert pipe.execute() == [1], "a command that wrote nothing aborted the WATCH"

        pipe = watcher.pipeline(transaction=True)
        pipe.watch(*watched)
        assert nr.execute_command(*extend_args(keys, "j", 2, 90_000)) == 1  # a real write
        pipe.multi()
        pipe.hset(keys.base + "marker", "x", 2)
        with pytest.raises(redis.WatchError):
            pipe.execute()
    finally:
        watcher.close()
