"""The lifecycle and remote-cancel verbs keep EXTEND/SWEEP's guarantees.

ACL (derived rows checked by the module), memory pressure (deny-oom where
memory grows), keyspace notifications equal to the core commands each verb
stands for, and replication from MULTI/EXEC and Lua with equal digests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis

from echomq import Client
from echomq.keyspace import QueueKeys, queue_keys
from echomq.testing import EmbeddedServer

from .conftest import ServerFactory, wait_for_replica
from .helpers import digest
from .test_notifications import captured

A, B = queue_keys("a"), queue_keys("b")


def verbs(k: QueueKeys, job: str = "j", token: object = 1) -> dict[str, list[object]]:
    return {
        "enqueue": ["EMQ.ENQUEUE", k.pending, k.base, "new", "p"],
        "claim": ["EMQ.CLAIM", k.pending, k.active, k.base, 1000],
        "complete": ["EMQ.COMPLETE", k.active, k.job(job), job, token],
        "fail": ["EMQ.FAIL", k.active, k.pending, k.dead, k.base, job, token, 1, "e"],
        "cancel": ["EMQ.CANCEL", k.pending, k.base, job, "r"],
        "checkpoint": ["EMQ.CHECKPOINT", k.active, k.job(job), job, token, 1000],
    }


# -- ACL ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_server(server_factory: ServerFactory) -> EmbeddedServer:
    srv = server_factory()
    admin = srv.client()
    # alice: queue a only.  bob: queue b's sets, none of its rows or metric.
    admin.execute_command("ACL", "SETUSER", "alice", "reset", "on", ">pw", "+@all", "~emq:{a}:*")
    admin.execute_command(
        "ACL", "SETUSER", "bob", "reset", "on", ">pw", "+@all",
        "~emq:{b}:active", "~emq:{b}:pending", "~emq:{b}:dead",
    )  # fmt: skip
    return srv


def held_job(r: redis.Redis, queue: str) -> None:
    client = Client(r)
    client.enqueue(queue, job_id="j")
    client.enqueue(queue, job_id="waiting")
    job = client.claim(queue, lease_ms=60_000)
    assert job is not None and job.token == 1


@pytest.mark.parametrize("verb", ["enqueue", "claim", "complete", "fail", "cancel", "checkpoint"])
def test_acl_refuses_other_queues_and_derived_rows(acl_server: EmbeddedServer, verb: str) -> None:
    admin = acl_server.client()
    admin.flushall()
    held_job(admin, "a")
    held_job(admin, "b")
    before = digest(admin)
    alice, bob = (
        acl_server.client(username="alice", password="pw"),
        acl_server.client(username="bob", password="pw"),
    )
    with pytest.raises(redis.exceptions.NoPermissionError):
        alice.execute_command(*verbs(B)[verb])
    if verb in ("enqueue", "claim", "fail", "cancel"):  # their rows are derived from <base>
        with pytest.raises(redis.exceptions.NoPermissionError, match="derived from <base>"):
            bob.execute_command(*verbs(B, job="waiting" if verb == "cancel" else "j")[verb])
    assert digest(admin) == before
    alice.execute_command(*verbs(A)[verb])  # her own queue works
    assert digest(admin) != before


# -- memory pressure ------------------------------------------------------------------


@pytest.fixture
def full(server_factory: ServerFactory) -> Iterator[redis.Redis]:
    srv = server_factory(["--maxmemory-policy", "noeviction"])
    conn = srv.client()
    held_job(conn, "a")
    conn.config_set("maxmemory", 1)
    yield conn
    conn.config_set("maxmemory", 0)


def test_past_maxmemory_growing_verbs_are_refused_finishing_ones_work(full: redis.Redis) -> None:
    before = digest(full)
    for verb in ("enqueue", "claim", "fail", "cancel"):
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            full.execute_command(*verbs(A)[verb])
    assert digest(full) == before
    # A live handler keeps checkpointing and can finish its job under pressure.
    assert full.execute_command(*verbs(A)["checkpoint"]) == [1, None]
    assert full.execute_command(*verbs(A)["complete"]) == 1
    assert full.hget(A.job("j"), "state") == b"done"


# -- keyspace notifications -------------------------------------------------------------


@pytest.fixture
def nr(server_factory: ServerFactory) -> Iterator[redis.Redis]:
    srv = server_factory(["--notify-keyspace-events", "KEAn"])
    conn = srv.client()
    yield conn
    conn.close()


def same_events(nr: redis.Redis, setup: Callable[[QueueKeys], None], native: list[object],
                core: Callable[[QueueKeys], list[list[object]]]) -> None:  # fmt: skip
    """The verb on queue n fires what its core commands fire on twin queue c."""
    n, c = queue_keys("n"), queue_keys("c")
    setup(n)
    setup(c)
    native_events = captured(nr, lambda: nr.execute_command(*native))

    def run_core() -> None:
        pipe = nr.pipeline(transaction=True)
        for cmd in core(c):
            pipe.execute_command(*cmd)
        pipe.execute()

    core_events = captured(nr, run_core)
    assert native_events, "the verb fired nothing"
    assert [(e, k.replace("{n}", "{x}")) for e, k in native_events] == [
        (e, k.replace("{c}", "{x}")) for e, k in core_events if e not in ("multi", "exec")
    ]


def test_notifications_enqueue(nr: redis.Redis) -> None:
    n = queue_keys("n")
    now = 1234
    same_events(
        nr, lambda k: None, ["EMQ.ENQUEUE", n.pending, n.base, "j", "p"],
        lambda k: [["HSET", k.job("j"), "state", "pending", "attempts", 0, "payload", "p",
                    "enqueued_at", now], ["ZADD", k.pending, now, "j"]],
    )  # fmt: skip


def test_notifications_claim_empties_pending(nr: redis.Redis) -> None:
    def setup(k: QueueKeys) -> None:
        nr.hset(k.job("j"), mapping={"attempts": 1, "state": "pending"})
        nr.zadd(k.pending, {"j": 5})

    n = queue_keys("n")
    same_events(
        nr, setup, ["EMQ.CLAIM", n.pending, n.active, n.base, 1000],
        lambda k: [["ZREM", k.pending, "j"], ["HINCRBY", k.job("j"), "attempts", 1],
                   ["HSET", k.job("j"), "state", "active"], ["ZADD", k.active, 99, "j"]],
    )  # fmt: skip


def held(k: QueueKeys, nr: redis.Redis, cancel: bool = False) -> None:
    nr.hset(k.job("j"), mapping={"attempts": 1, "state": "active"})
    if cancel:
        nr.hset(k.job("j"), "cancel_requested", "why")
    nr.zadd(k.active, {"j": 10**12, "other": 10**12})


def test_notifications_complete(nr: redis.Redis) -> None:
    n = queue_keys("n")
    same_events(
        nr, lambda k: held(k, nr), ["EMQ.COMPLETE", n.active, n.job("j"), "j", 1],
        lambda k: [["ZREM", k.active, "j"], ["HSET", k.job("j"), "state", "done"]],
    )  # fmt: skip


def test_notifications_fail_to_dead(nr: redis.Redis) -> None:
    n = queue_keys("n")
    same_events(
        nr, lambda k: held(k, nr), ["EMQ.FAIL", n.active, n.pending, n.dead, n.base, "j", 1, 1, "e"],
        lambda k: [["ZREM", k.active, "j"], ["HSET", k.job("j"), "state", "dead", "last_error", "e"],
                   ["ZADD", k.dead, 0, "j"], ["HINCRBY", k.metrics_failed, "count", 1]],
    )  # fmt: skip


def test_notifications_cancel_pending_and_checkpoint(nr: redis.Redis) -> None:
    def setup(k: QueueKeys) -> None:
        nr.hset(k.job("j"), mapping={"attempts": 0, "state": "pending"})
        nr.zadd(k.pending, {"j": 5})

    n = queue_keys("n")
    same_events(
        nr, setup, ["EMQ.CANCEL", n.pending, n.base, "j", "r"],
        lambda k: [["ZREM", k.pending, "j"],
                   ["HSET", k.job("j"), "state", "cancelled", "cancel_requested", "r"]],
    )  # fmt: skip
    nr.flushall()
    same_events(
        nr, lambda k: held(k, nr), ["EMQ.CHECKPOINT", n.active, n.job("j"), "j", 1, 1000],
        lambda k: [["ZADD", k.active, "XX", 5, "j"]],
    )  # fmt: skip


# -- replication from MULTI and Lua ------------------------------------------------------


def test_lifecycle_from_multi_and_lua_replicates_exactly(server_factory: ServerFactory) -> None:
    master = server_factory()
    replica = server_factory(
        ["--replicaof", master.host, str(master.port), "--repl-diskless-sync-delay", "0"]
    )
    m, s = master.client(), replica.client()
    k = queue_keys("ml")
    pipe = m.pipeline(transaction=True)
    for i in range(5):
        pipe.execute_command("EMQ.ENQUEUE", k.pending, k.base, f"j{i}", f"p{i}")
    pipe.execute_command("EMQ.CLAIM", k.pending, k.active, k.base, 60_000)
    pipe.execute_command("EMQ.CLAIM", k.pending, k.active, k.base, 60_000)
    pipe.execute()
    lua = """
    local c = redis.call('EMQ.CLAIM', KEYS[1], KEYS[2], ARGV[1], ARGV[2])
    redis.call('EMQ.CHECKPOINT', KEYS[2], ARGV[1] .. 'job:' .. c[1], c[1], c[2], ARGV[2])
    redis.call('EMQ.CANCEL', KEYS[1], ARGV[1], 'j4', 'not needed')
    return redis.call('EMQ.FAIL', KEYS[2], KEYS[1], KEYS[3], ARGV[1], c[1], c[2], 1, 'from lua')
    """
    assert m.eval(lua, 3, k.pending, k.active, k.dead, k.base, 60_000) == b"dead"
    pipe = m.pipeline(transaction=True)
    pipe.execute_command("EMQ.COMPLETE", k.active, k.job("j0"), "j0", 1)
    pipe.execute_command("EMQ.FAIL", k.active, k.pending, k.dead, k.base, "j1", 1, 3, "retry me")
    pipe.execute()
    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    assert digest(s) == digest(m)
    assert [m.hget(k.job(f"j{i}"), "state") for i in range(5)] == [
        b"done", b"pending", b"dead", b"pending", b"cancelled",
    ]  # fmt: skip
