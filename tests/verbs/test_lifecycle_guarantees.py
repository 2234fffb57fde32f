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

from ..conftest import ServerFactory, wait_for_replica
from ..helpers import assert_token, digest
from .test_notifications import captured

A, B = queue_keys("a"), queue_keys("b")


def verbs(k: QueueKeys, job: str = "j", token: object = "1") -> dict[str, list[object]]:
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
    # alice: queue a only.  bob: queue b's sets, none of its rows, settings or metric.
    # carol: queue b's sets and rows and its registry marker, not its settings (<base>meta) nor
    # its metric.
    admin.execute_command("ACL", "SETUSER", "alice", "reset", "on", ">pw", "+@all", "~emq:{a}:*")
    admin.execute_command(
        "ACL", "SETUSER", "bob", "reset", "on", ">pw", "+@all",
        "~emq:{b}:active", "~emq:{b}:pending", "~emq:{b}:dead",
    )  # fmt: skip
    admin.execute_command(
        "ACL", "SETUSER", "carol", "reset", "on", ">pw", "+@all",
        "~emq:{b}:active", "~emq:{b}:pending", "~emq:{b}:dead", "~emq:{b}:job:*", "~emq:{b}:queue",
    )  # fmt: skip
    return srv


def held_job(r: redis.Redis, queue: str) -> str:
    """Job "j" held (its token returned), job "waiting" pending."""
    client = Client(r)
    client.enqueue(queue, job_id="j")
    client.enqueue(queue, job_id="waiting")
    job = client.claim(queue, lease_ms=60_000)
    assert job is not None and job.id == "j"
    return assert_token(job.token, attempts=1)


# Where the derived-key check refuses a user without the rows: the rows of
# ENQUEUE, CLAIM, FAIL and CANCEL are derived from <base> (and CLAIM reads
# <base>meta); COMPLETE's and CHECKPOINT's row is a declared key, which the
# server itself refuses.
DERIVED_ROWS = ("enqueue", "claim", "fail", "cancel")


@pytest.mark.parametrize("verb", ["enqueue", "claim", "complete", "fail", "cancel", "checkpoint"])
def test_acl_refuses_other_queues_and_derived_rows(acl_server: EmbeddedServer, verb: str) -> None:
    admin = acl_server.client()
    admin.flushall()
    token_a = held_job(admin, "a")
    token_b = held_job(admin, "b")
    before = digest(admin)
    alice, bob = (
        acl_server.client(username="alice", password="pw"),
        acl_server.client(username="bob", password="pw"),
    )
    with pytest.raises(redis.exceptions.NoPermissionError):
        alice.execute_command(*verbs(B, token=token_b)[verb])
    job = "waiting" if verb == "cancel" else "j"
    with pytest.raises(redis.exceptions.NoPermissionError) as refused:
        bob.execute_command(*verbs(B, job=job, token=token_b)[verb])
    # The module's words for a derived key; the server's own (which differ between engines) else.
    assert ("derived from <base>" in str(refused.value)) == (verb in DERIVED_ROWS), refused.value
    if verb in ("enqueue", "fail", "cancel"):
        # The row's ACL is checked before the row is read: an id that does not
        # exist is refused the same way (no :-1 telling bob it is absent).
        with pytest.raises(redis.exceptions.NoPermissionError, match="derived from <base>"):
            bob.execute_command(*verbs(B, job="no-such-job", token=token_b)[verb])
    assert digest(admin) == before
    alice.execute_command(*verbs(A, token=token_a)[verb])  # her own queue works
    assert digest(admin) != before


@pytest.mark.parametrize(
    "verb, allowed",
    [("enqueue", True), ("claim", False), ("complete", False), ("fail", False), ("cancel", False),
     ("cancel-held", True), ("checkpoint", True)],
)  # fmt: skip
def test_acl_the_queue_settings_are_a_derived_key(
    acl_server: EmbeddedServer, verb: str, allowed: bool
) -> None:
    """CLAIM, COMPLETE, FAIL and CANCEL of a pending job read <base>meta (pause,
    retention): a user who may not read it is refused before anything is written.
    ENQUEUE, a cancel request for a held job and CHECKPOINT do not read it."""
    admin = acl_server.client()
    admin.flushall()
    token = held_job(admin, "b")
    before = digest(admin)
    carol = acl_server.client(username="carol", password="pw")
    args = verbs(B, job="waiting" if verb == "cancel" else "j", token=token)[verb.split("-")[0]]
    if allowed:
        carol.execute_command(*args)
        assert digest(admin) != before
    else:
        with pytest.raises(redis.exceptions.NoPermissionError, match="derived from <base>"):
            carol.execute_command(*args)
        assert digest(admin) == before


# -- memory pressure ------------------------------------------------------------------


@pytest.fixture
def full(server_factory: ServerFactory) -> Iterator[tuple[redis.Redis, str]]:
    srv = server_factory(["--maxmemory-policy", "noeviction"])
    conn = srv.client()
    token = held_job(conn, "a")
    conn.config_set("maxmemory", 1)
    yield conn, token
    conn.config_set("maxmemory", 0)


def test_past_maxmemory_growing_verbs_are_refused_finishing_ones_work(full: tuple[redis.Redis, str]) -> None:
    conn, token = full
    before = digest(conn)
    for verb in ("enqueue", "claim", "fail", "cancel"):
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            conn.execute_command(*verbs(A, token=token)[verb])
    assert digest(conn) == before
    # A live handler keeps checkpointing and can finish its job under pressure.
    assert conn.execute_command(*verbs(A, token=token)["checkpoint"]) == [1, None]
    assert conn.execute_command(*verbs(A, token=token)["complete"]) == 1
    assert conn.hget(A.job("j"), "state") == b"done"
    assert conn.execute_command(*verbs(A, token=token)["complete"]) == 1  # and its retry too


# -- keyspace notifications -------------------------------------------------------------


@pytest.fixture
def nr(server_factory: ServerFactory) -> Iterator[redis.Redis]:
    srv = server_factory(["--notify-keyspace-events", "KEAn"])
    conn = srv.client()
    yield conn
    conn.close()


def same_events(nr: redis.Redis, setup: Callable[[QueueKeys], None], native: list[object],
                core: Callable[[QueueKeys], list[list[object]]], expected: list[str]) -> None:  # fmt: skip
    """The verb on queue n fires what its core commands fire on twin queue c,
    and that is exactly `expected`: the (event, key suffix) pairs, in order."""
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
    assert [(e, k.replace("{n}", "{x}")) for e, k in native_events] == [
        (e, k.replace("{c}", "{x}")) for e, k in core_events if e not in ("multi", "exec")
    ]
    assert [f"{e} {k.removeprefix(n.base)}" for e, k in native_events] == expected


LATER = 10**13  # a PEXPIREAT in the future: the core command fires `expire`


def enqueued(req: list[str]) -> Callable[[QueueKeys], list[list[object]]]:
    """ENQUEUE's core commands: one HSET of the whole row, then the RPUSH, the queue's first: its
    registry marker; with REQ, the record."""
    row = ["state", "pending", "payload", "p", "enqueued_at", 1234]
    record = lambda k: [["SET", k.base + "req:" + req[1], 1], ["PEXPIREAT", k.base + "req:" + req[1], LATER]]  # noqa: E731
    marker = lambda k: [["SET", k.base + "queue", 1]]  # noqa: E731
    return lambda k: [
        ["HSET", k.job("j"), *row],
        ["RPUSH", k.pending, "j"],
        *marker(k),
        *(record(k) if req else []),
    ]


@pytest.mark.parametrize("req", [[], ["REQ", "r1"]])
def test_notifications_enqueue(nr: redis.Redis, req: list[str]) -> None:
    n = queue_keys("n")
    record = ["new req:r1", "set req:r1", "expire req:r1"] if req else []
    same_events(
        nr, lambda k: None, ["EMQ.ENQUEUE", n.pending, n.base, "j", "p", *req], enqueued(req),
        ["new job:j", "hset job:j", "new pending", "rpush pending", "new queue", "set queue", *record],
    )  # fmt: skip


def pending_job(nr: redis.Redis, k: QueueKeys, closed_by: bool = False, more: bool = False) -> None:
    nr.hset(k.job("j"), mapping={"attempts": 1, "tries": 1, "token": "1", "state": "pending"})
    if closed_by:
        nr.hset(k.job("j"), "closed_by", "fail:pending")
    nr.rpush(k.pending, "j")
    if more:
        nr.hset(k.job("k"), "state", "pending")
        nr.rpush(k.pending, "k")


def popped(k: QueueKeys, n: int) -> list[list[object]]:
    """A claim's lane first: the entries it took, one LPOP."""
    return [["LPOP", k.pending, n]]


def claimed(k: QueueKeys, job: str, attempts: int) -> list[list[object]]:
    """The core commands of one job's claim, without the HDEL of closed_by."""
    return [["HINCRBY", k.job(job), "attempts", 1],
            ["HSET", k.job(job), "tries", attempts, "token", f"{attempts}-0000000000000000",
             "state", "active", "claimed_at", 1], ["ZADD", k.active, 99, job]]  # fmt: skip


def test_notifications_claim_empties_pending(nr: redis.Redis) -> None:
    n = queue_keys("n")
    same_events(
        nr, lambda k: pending_job(nr, k), ["EMQ.CLAIM", n.pending, n.active, n.base, 1000],
        lambda k: [*popped(k, 1), *claimed(k, "j", 2)],
        ["lpop pending", "del pending", "hincrby job:j", "hset job:j", "new active", "zadd active"],
    )  # fmt: skip


def test_notifications_claim_clears_closed_by(nr: redis.Redis) -> None:
    n = queue_keys("n")
    same_events(
        nr, lambda k: pending_job(nr, k, closed_by=True, more=True),
        ["EMQ.CLAIM", n.pending, n.active, n.base, 1000],
        lambda k: [*popped(k, 1), *claimed(k, "j", 2)[:2], ["HDEL", k.job("j"), "closed_by"],
                   claimed(k, "j", 2)[2]],
        ["lpop pending", "hincrby job:j", "hset job:j", "hdel job:j", "new active", "zadd active"],
    )  # fmt: skip


def test_notifications_claim_count_and_req(nr: redis.Redis) -> None:
    n = queue_keys("n")
    same_events(
        nr, lambda k: pending_job(nr, k, more=True),
        ["EMQ.CLAIM", n.pending, n.active, n.base, 1000, "COUNT", 5, "REQ", "r"],
        lambda k: [*popped(k, 2), *claimed(k, "j", 2), *claimed(k, "k", 1),
                   ["SET", k.base + "req:r", "record"], ["PEXPIREAT", k.base + "req:r", LATER]],
        ["lpop pending", "del pending", "hincrby job:j", "hset job:j", "new active", "zadd active",
         "hincrby job:k", "hset job:k", "zadd active",
         "new req:r", "set req:r", "expire req:r"],
    )  # fmt: skip


def held(k: QueueKeys, nr: redis.Redis, cancel: bool = False) -> None:
    nr.hset(k.job("j"), mapping={"attempts": 1, "tries": 1, "token": "1", "state": "active"})
    if cancel:
        nr.hset(k.job("j"), "cancel_requested", "why")
    nr.zadd(k.active, {"j": 10**12, "other": 10**12})


def test_notifications_complete(nr: redis.Redis) -> None:
    n = queue_keys("n")
    same_events(
        nr, lambda k: held(k, nr), ["EMQ.COMPLETE", n.active, n.job("j"), "j", "1"],
        lambda k: [["ZREM", k.active, "j"],
                   ["HSET", k.job("j"), "state", "done", "finished_at", 1, "closed_by", "complete"],
                   ["PEXPIREAT", k.job("j"), LATER]],
        ["zrem active", "hset job:j", "expire job:j"],
    )  # fmt: skip


@pytest.mark.parametrize("ttl, last", [("0", ["DEL"]), ("-1", [])])
def test_notifications_complete_with_a_retention_of_zero_or_forever(
    nr: redis.Redis, ttl: str, last: list[str]
) -> None:
    def setup(k: QueueKeys) -> None:
        held(k, nr)
        nr.hset(k.base + "meta", "done_ttl_ms", ttl)

    n = queue_keys("n")
    same_events(
        nr, setup, ["EMQ.COMPLETE", n.active, n.job("j"), "j", "1"],
        lambda k: [["ZREM", k.active, "j"],
                   ["HSET", k.job("j"), "state", "done", "finished_at", 1, "closed_by", "complete"],
                   *([[cmd, k.job("j")] for cmd in last])],
        ["zrem active", "hset job:j", *(["del job:j"] if last else [])],
    )  # fmt: skip


def test_notifications_fail_to_dead(nr: redis.Redis) -> None:
    n = queue_keys("n")
    same_events(
        nr, lambda k: held(k, nr), ["EMQ.FAIL", n.active, n.pending, n.dead, n.base, "j", "1", 1, "e"],
        lambda k: [["ZREM", k.active, "j"],
                   ["HSET", k.job("j"), "state", "dead", "last_error", "e", "finished_at", 1,
                    "closed_by", "fail:dead"],
                   ["ZADD", k.dead, 1, "j"], ["HINCRBY", k.metrics_failed, "count", 1]],
        ["zrem active", "hset job:j", "new dead", "zadd dead",
         "new metrics:failed", "hincrby metrics:failed"],
    )  # fmt: skip


def test_notifications_fail_to_pending_and_to_cancelled(nr: redis.Redis) -> None:
    n = queue_keys("n")
    same_events(
        nr, lambda k: held(k, nr), ["EMQ.FAIL", n.active, n.pending, n.dead, n.base, "j", "1", 5, "e"],
        lambda k: [["ZREM", k.active, "j"],
                   ["HSET", k.job("j"), "state", "pending", "last_error", "e", "closed_by", "fail:pending"],
                   ["RPUSH", k.pending, "j"]],
        ["zrem active", "hset job:j", "new pending", "rpush pending"],
    )  # fmt: skip
    nr.flushall()
    same_events(
        nr, lambda k: held(k, nr, cancel=True),
        ["EMQ.FAIL", n.active, n.pending, n.dead, n.base, "j", "1", 5, "e"],
        lambda k: [["ZREM", k.active, "j"],
                   ["HSET", k.job("j"), "state", "cancelled", "last_error", "e", "finished_at", 1,
                    "closed_by", "fail:cancelled"],
                   ["PEXPIREAT", k.job("j"), LATER]],
        ["zrem active", "hset job:j", "expire job:j"],
    )  # fmt: skip


def test_notifications_cancel_pending_and_checkpoint(nr: redis.Redis) -> None:
    def setup(k: QueueKeys) -> None:
        nr.hset(k.job("j"), mapping={"attempts": 0, "state": "pending"})
        nr.rpush(k.pending, "j")

    n = queue_keys("n")
    same_events(  # its entry stays, a tombstone counted in meta's `stale`
        nr, setup, ["EMQ.CANCEL", n.pending, n.base, "j", "r"],
        lambda k: [["HSET", k.meta, "stale", 1],
                   ["HSET", k.job("j"), "state", "cancelled", "finished_at", 1, "cancel_requested", "r"],
                   ["PEXPIREAT", k.job("j"), LATER]],
        ["new meta", "hset meta", "hset job:j", "expire job:j"],
    )  # fmt: skip
    nr.flushall()
    same_events(
        nr, lambda k: held(k, nr), ["EMQ.CANCEL", n.pending, n.base, "j", "r"],
        lambda k: [["HSET", k.job("j"), "cancel_requested", "r"]],
        ["hset job:j"],
    )  # fmt: skip
    nr.flushall()
    same_events(
        nr, lambda k: held(k, nr), ["EMQ.CHECKPOINT", n.active, n.job("j"), "j", "1", 1000],
        lambda k: [["ZADD", k.active, "XX", 5, "j"]],
        ["zadd active"],
    )  # fmt: skip


def test_notifications_sweep_cancelled_and_expired(nr: redis.Redis) -> None:
    """SWEEP's two paths the seed's Lua does not have (test_notifications.py compares the rest with it)."""

    def lapsed_with_cancel(k: QueueKeys) -> None:
        held(k, nr, cancel=True)
        nr.zadd(k.active, {"j": 0, "other": 2**52})

    n = queue_keys("n")
    same_events(
        nr, lapsed_with_cancel, ["EMQ.SWEEP", n.active, n.pending, n.dead, n.base, 1, 10],
        lambda k: [["ZREM", k.active, "j"], ["HSET", k.job("j"), "state", "cancelled", "finished_at", 1],
                   ["PEXPIREAT", k.job("j"), LATER]],
        ["zrem active", "hset job:j", "expire job:j"],
    )  # fmt: skip
    nr.flushall()

    def old_dead(k: QueueKeys) -> None:
        nr.hset(k.base + "meta", "dead_ttl_ms", 1000)
        nr.hset(k.job("d"), mapping={"state": "dead"})
        nr.zadd(k.dead, {"d": 5, "young": 2**52})

    same_events(
        nr, old_dead, ["EMQ.SWEEP", n.active, n.pending, n.dead, n.base, 1, 10],
        lambda k: [["ZREM", k.dead, "d"], ["DEL", k.job("d")]],
        ["zrem dead", "del job:d"],
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
    pipe.execute_command("EMQ.CLAIM", k.pending, k.active, k.base, 60_000, "REQ", "multi")
    *_, first, second = pipe.execute()
    (j0, token0, *_), (j1, token1, *_) = first[0], second[0]
    assert (j0, j1) == (b"j0", b"j1")
    # The random part of a token is drawn on the master; the replica gets the token written out.
    lua = """
    local c = redis.call('EMQ.CLAIM', KEYS[1], KEYS[2], ARGV[1], ARGV[2], 'COUNT', 1)[1]
    redis.call('EMQ.CHECKPOINT', KEYS[2], ARGV[1] .. 'job:' .. c[1], c[1], c[2], ARGV[2])
    redis.call('EMQ.CANCEL', KEYS[1], ARGV[1], 'j4', 'not needed')
    return redis.call('EMQ.FAIL', KEYS[2], KEYS[1], KEYS[3], ARGV[1], c[1], c[2], 1, 'from lua')
    """
    assert m.eval(lua, 3, k.pending, k.active, k.dead, k.base, 60_000) == b"dead"
    pipe = m.pipeline(transaction=True)
    pipe.execute_command("EMQ.COMPLETE", k.active, k.job("j0"), "j0", token0)
    pipe.execute_command("EMQ.FAIL", k.active, k.pending, k.dead, k.base, "j1", token1, 3, "retry me")
    pipe.execute_command("EMQ.COMPLETE", k.active, k.job("j0"), "j0", token0)  # a retry: writes nothing
    assert pipe.execute() == [1, b"pending", 1]
    m.hset(k.base + "meta", "dead_ttl_ms", 0)
    assert m.eval(
        "return redis.call('EMQ.SWEEP', KEYS[1], KEYS[2], KEYS[3], ARGV[1], 1, 10)",
        3, k.active, k.pending, k.dead, k.base,
    ) == [[], [], [], 1]  # fmt: skip
    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    assert digest(s) == digest(m)
    assert [m.hget(k.job(f"j{i}"), "state") for i in range(5)] == [
        b"done", b"pending", None, b"pending", b"cancelled",
    ]  # fmt: skip
    assert s.hget(k.job("j0"), "token") == token0 and s.get(k.base + "req:multi") is not None
    assert 0 < s.pttl(k.job("j0")) <= 3_600_000  # the replica expires the done row too
