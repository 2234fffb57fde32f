"""The operator's verbs keep the guarantees every EMQ.* verb keeps (issue 13).

- keyspace events: exactly those of the core commands each verb stands for
  (the same commands run on the same data are the reference);
- replica and AOF: mixed traffic with every new verb, plainly, in MULTI/EXEC
  and from Lua, leaves the replica and a server replaying the AOF with the
  master's DEBUG DIGEST; the queues' invariants hold at the end;
- ACL: rows and settings derived from <base> are refused before they are
  read (the same NOPERM whether or not the row exists);
- memory: RETRY, RETRYDEAD and RETENTION are deny-oom; PAUSE, RESUME, PURGE,
  OBLITERATE and FORGET work past maxmemory;
- a no-op or a refusal breaks no WATCH;
- the declared keys are what COMMAND GETKEYS (and so cluster routing) sees.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer, queue_problems

from ..conftest import ServerFactory, wait_for_replica
from ..helpers import digest, now_ms

pytestmark = pytest.mark.memcheck  # make -C module check runs it under valgrind

Q = queue_keys("q")
MARKER = "echomq-operator-marker"
Event = tuple[str, str]


# -- keyspace events -------------------------------------------------------------


@pytest.fixture(scope="module")
def notifying(server_factory: ServerFactory) -> EmbeddedServer:
    return server_factory(["--notify-keyspace-events", "KEA"])


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
        for _ in range(2):
            assert sub.get_message(timeout=5) is not None
        action()
        r.publish(MARKER, "end")
        events: list[Event] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            msg = sub.get_message(timeout=1)
            if msg is None:
                continue
            if msg["type"] == "message" and msg["channel"] == MARKER.encode():
                return events
            if msg["type"] == "pmessage":
                events.append((msg["channel"].decode().split(":", 1)[1], msg["data"].decode()))
        raise TimeoutError("the marker never came back")
    finally:
        sub.close()


def seed(r: redis.Redis) -> None:
    """Absolute data (no clock), so two runs hold equal data."""
    for i, state in enumerate(("dead", "dead", "cancelled", "pending", "done")):
        fields = {
            "state": state,
            "attempts": 2,
            "tries": 2,
            "token": "2-ab",
            "payload": "p",
            "finished_at": 5,
        }
        if state == "dead":
            fields |= {"closed_by": "fail:dead", "last_error": "boom", "stalled": 1}
        if state == "cancelled":
            fields["cancel_requested"] = "why"
        r.hset(Q.job(f"j{i}"), mapping=fields)  # type: ignore[arg-type]
    r.zadd(Q.dead, {"j0": 100, "j1": 200, "orphan": 300})
    r.pexpireat(Q.job("j2"), 2**45)
    r.rpush(Q.pending, "j3")
    r.pexpireat(Q.job("j4"), 2**45)
    r.hset(Q.meta, "done_ttl_ms", 1000)
    r.hset(Q.metrics_failed, "count", 2)


def same_events(
    r: redis.Redis, verb: list[object], reference: Callable[[int], list[list[object]]]
) -> list[Event]:
    """Run `verb` on the seed, then the core commands it stands for on a fresh seed;
    the events and the data must be the same.  `reference` gets the verb's
    server time (for the scores it writes)."""
    seed(r)
    at = now_ms(r)
    native = captured(r, lambda: r.execute_command(*verb))
    after = digest(r)
    r.flushall()
    seed(r)

    def run_core() -> None:
        pipe = r.pipeline(transaction=True)
        for command in reference(at):
            pipe.execute_command(*command)
        pipe.execute()

    core = captured(r, run_core)
    assert native == core, (verb, native, core)
    assert after == digest(r)  # RETRY puts the job at its lane's tail: no server time in the data
    return native


def retry_commands(job: str, now: int, retries: int = 1, fields: tuple[str, ...] = ()) -> list[list[object]]:
    """A retry's row; the job enters its lane's tail after them (one RPUSH for a whole batch)."""
    return [
        ["ZREM", Q.dead, job],
        ["HSET", Q.job(job), "state", "pending", "tries", 0, "stalled", 0],
        ["HINCRBY", Q.job(job), "retries", retries],
        *(["HDEL", Q.job(job), f] for f in fields),
        ["PERSIST", Q.job(job)],
    ]


def test_events_of_retry(nr: redis.Redis) -> None:
    events = same_events(
        nr,
        ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "j0"],
        lambda now: [
            *retry_commands("j0", now, fields=("closed_by", "finished_at")),
            ["RPUSH", Q.pending, "j0"],
        ],
    )
    assert {e for e, _ in events} == {"zrem", "hset", "hincrby", "hdel", "rpush"}
    nr.flushall()
    same_events(
        nr,
        ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "j2"],
        lambda now: [
            *retry_commands("j2", now, fields=("cancel_requested", "finished_at")),
            ["RPUSH", Q.pending, "j2"],
        ],
    )


def test_events_of_the_bulk_verbs(nr: redis.Redis) -> None:
    def retrydead(now: int) -> list[list[object]]:
        return [
            *retry_commands("j0", now, fields=("closed_by", "finished_at")),
            *retry_commands("j1", now, fields=("closed_by", "finished_at")),
            ["ZREM", Q.dead, "orphan"],
            ["RPUSH", Q.pending, "j0", "j1"],
        ]

    nr.execute_command("CONFIG", "SET", "notify-keyspace-events", "KEA")
    seed(nr)
    native = captured(nr, lambda: nr.execute_command("EMQ.RETRYDEAD", Q.dead, Q.pending, Q.base, 10))
    nr.flushall()
    seed(nr)

    def core() -> None:
        pipe = nr.pipeline(transaction=True)
        for command in retrydead(0):
            pipe.execute_command(*command)
        pipe.execute()

    assert native == captured(nr, core)
    assert ("del", Q.dead) in native  # the last ZREM emptied it
    nr.flushall()

    same_events(
        nr,
        ["EMQ.PURGE", Q.dead, Q.base, 10],
        lambda now: [
            ["ZREM", Q.dead, "j0"], ["DEL", Q.job("j0")],
            ["ZREM", Q.dead, "j1"], ["DEL", Q.job("j1")],
            ["ZREM", Q.dead, "orphan"],
        ],
    )  # fmt: skip
    nr.flushall()
    same_events(
        nr,
        ["EMQ.FORGET", Q.pending, Q.base, "j2", "j3", "j4"],
        lambda now: [["DEL", Q.job("j2")], ["DEL", Q.job("j4")]],
    )
    nr.flushall()
    same_events(
        nr,
        ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 2],
        lambda now: [
            ["LPOP", Q.pending, 1], ["DEL", Q.job("j3")],
            ["ZREM", Q.dead, "j0"], ["DEL", Q.job("j0")],
            ["HSET", Q.meta, "paused", 1],
        ],
    )  # fmt: skip
    nr.flushall()
    same_events(
        nr,
        ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 10],
        lambda now: [
            ["LPOP", Q.pending, 1], ["DEL", Q.job("j3")],
            ["ZREM", Q.dead, "j0"], ["DEL", Q.job("j0")],
            ["ZREM", Q.dead, "j1"], ["DEL", Q.job("j1")],
            ["ZREM", Q.dead, "orphan"],
            ["DEL", Q.meta], ["DEL", Q.metrics_failed],
        ],
    )  # fmt: skip


def test_events_of_the_settings(nr: redis.Redis) -> None:
    same_events(nr, ["EMQ.PAUSE", Q.pending, Q.base], lambda now: [["HSET", Q.meta, "paused", 1]])
    nr.flushall()
    seed(nr)
    nr.hset(Q.meta, "paused", 1)
    nr.delete(Q.meta)
    nr.hset(Q.meta, "paused", 1)
    assert captured(nr, lambda: nr.execute_command("EMQ.RESUME", Q.pending, Q.base)) == [
        ("hdel", Q.meta),
        ("del", Q.meta),  # paused was its only field, as HDEL would say
    ]
    nr.flushall()
    same_events(
        nr,
        ["EMQ.RETENTION", Q.pending, Q.base, "DONE", 1000, "DEAD", 0, "CANCELLED", 5],
        lambda now: [["HSET", Q.meta, "dead_ttl_ms", 0, "cancelled_ttl_ms", 5]],  # DONE is already 1000
    )
    nr.flushall()
    seed(nr)
    nr.hset(Q.meta, "paused", 1)

    def no_ops() -> None:
        for args in (
            ["EMQ.PAUSE", Q.pending, Q.base],  # already paused
            ["EMQ.RETENTION", Q.pending, Q.base, "DONE", 1000],  # unchanged
            ["EMQ.RETENTION", Q.pending, Q.base],
            ["EMQ.FORGET", Q.pending, Q.base, "j0", "j3", "nope"],
            ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "nope"],
        ):
            nr.execute_command(*args)
        for args in (
            ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "j3"],  # pending: EMQSTATE
            ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 0],
        ):
            with pytest.raises(redis.ResponseError):
                nr.execute_command(*args)

    assert captured(nr, no_ops) == []


@pytest.mark.parametrize(
    "case",
    ["pause-again", "resume-running", "retention-same", "forget-nothing", "retry-gone", "retry-refused"],
)
def test_a_no_op_or_a_refusal_breaks_no_watch(r: redis.Redis, server: EmbeddedServer, case: str) -> None:
    seed(r)
    if case == "pause-again":
        r.hset(Q.meta, "paused", 1)
    args = {
        "pause-again": ["EMQ.PAUSE", Q.pending, Q.base],
        "resume-running": ["EMQ.RESUME", Q.pending, Q.base],
        "retention-same": ["EMQ.RETENTION", Q.pending, Q.base, "DONE", 1000],
        "forget-nothing": ["EMQ.FORGET", Q.pending, Q.base, "j0"],
        "retry-gone": ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "nope"],
        "retry-refused": ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "j3"],
    }[case]
    watcher = server.client()
    pipe = watcher.pipeline(transaction=True)
    pipe.watch(Q.meta, Q.dead, Q.pending, Q.job("j0"), Q.job("j3"))
    with contextlib.suppress(redis.ResponseError):
        r.execute_command(*args)
    pipe.multi()
    pipe.set("witness", 1)
    assert pipe.execute() == [True]
    watcher.close()


# -- replica and AOF ---------------------------------------------------------------

RETRY_FROM_LUA = "return redis.call('EMQ.RETRY', KEYS[1], KEYS[2], ARGV[1], ARGV[2])"
RETRYDEAD_FROM_LUA = "return redis.call('EMQ.RETRYDEAD', KEYS[1], KEYS[2], ARGV[1], ARGV[2])"
PAUSE_FROM_LUA = "return redis.call(ARGV[2], KEYS[1], ARGV[1])"


def operator_traffic(r: redis.Redis, rng: random.Random, queues: list[str], ops: int) -> Counter[str]:
    """Workers and an operator on the same queues: every outcome of every verb."""
    client = echomq.Client(r)
    seen: Counter[str] = Counter()
    for q in queues:
        client.retention(q, done_ms=rng.choice([0, 600_000, -1]), cancelled_ms=600_000)
    serial = 0
    for _ in range(ops):
        q = rng.choice(queues)
        k = queue_keys(q)
        ids = [f"j{i}" for i in range(serial)] or ["j0"]
        pick = rng.choice(ids)
        dead = r.zrange(k.dead, 0, 4)
        if dead and rng.random() < 0.6:
            pick = rng.choice(dead).decode()
        kind = rng.random()
        try:
            if kind < 0.2:
                client.enqueue(q, b"x" * rng.randint(0, 20), job_id=f"j{serial}")
                serial += 1
                seen["enqueue"] += 1
            elif kind < 0.4:
                for job in client.claim_many(q, lease_ms=rng.choice([1, 600_000]), count=rng.randint(1, 3)):
                    roll = rng.random()
                    if roll < 0.4:
                        client.complete(q, job.id, job.token)
                        seen["complete"] += 1
                    elif roll < 0.8:
                        seen[
                            "fail-" + client.fail(q, job.id, job.token, "err", max_attempts=rng.randint(1, 2))
                        ] += 1
                    elif roll < 0.9:
                        client.cancel(q, job.id, "stop")
                seen["claimed"] += 1
            elif kind < 0.47:
                time.sleep(0.002)
                seen["swept"] += len(client.sweep(q, max_stalled=rng.randint(1, 2), limit=5))
            elif kind < 0.55:
                client.retry(q, pick)
                seen["retry"] += 1
            elif kind < 0.6:
                reply = r.eval(RETRY_FROM_LUA, 2, k.dead, k.pending, k.base, pick)
                seen["lua-retry" if reply == b"pending" else "gone"] += 1
            elif kind < 0.65:
                seen["retrydead"] += r.eval(
                    RETRYDEAD_FROM_LUA, 2, k.dead, k.pending, k.base, rng.randint(1, 3)
                )[0]
            elif kind < 0.7:
                seen["purge"] += client.purge_dead(q, limit=rng.randint(1, 3))
            elif kind < 0.78:
                verb = rng.choice(["EMQ.PAUSE", "EMQ.RESUME"])
                if rng.random() < 0.5:
                    seen[verb] += r.eval(PAUSE_FROM_LUA, 1, k.pending, k.base, verb)
                else:
                    seen[verb] += r.execute_command(verb, k.pending, k.base)
            elif kind < 0.83:
                pipe = r.pipeline(transaction=True)
                pipe.execute_command("EMQ.RETENTION", k.pending, k.base, "DEAD", rng.choice([0, 600_000, -1]))
                pipe.execute_command("EMQ.RETRY", k.dead, k.pending, k.base, pick)
                pipe.execute_command("EMQ.PURGE", k.dead, k.base, 1)
                pipe.execute_command("EMQ.FORGET", k.pending, k.base, *rng.sample(ids, min(3, len(ids))))
                replies = pipe.execute(raise_on_error=False)
                seen["multi"] += 1
                seen["multi-retried"] += replies[1] == b"pending"
            elif kind < 0.88:
                seen["forget"] += r.execute_command(
                    "EMQ.FORGET", k.pending, k.base, *rng.sample(ids, min(4, len(ids)))
                )
            elif kind < 0.9:
                seen["obliterate-step"] += client._run(echomq._protocol.obliterate(q, 2, rng.random() < 0.5))[
                    0
                ]
            else:
                info = client.job(q, pick)
                seen["job-" + (info.state if info else "none")] += 1
        except echomq.NotRetryable:
            seen["not-retryable"] += 1
        except echomq.JobGone:
            seen["gone"] += 1
        except echomq.QueueBusy:
            seen["busy"] += 1
        except redis.ResponseError as exc:
            assert str(exc).startswith("EMQSTATE"), exc
            seen["lua-not-retryable"] += 1
    return seen


FAST_SYNC = ["--repl-diskless-sync-delay", "0"]


@pytest.mark.slow
def test_replica_and_aof_have_the_masters_digest_with_the_operator_verbs(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    master_dir, replay_dir = tmp_path / "master", tmp_path / "replay"
    master_dir.mkdir()
    master = server_factory([*FAST_SYNC, "--appendonly", "yes", "--appendfsync", "always"], dir=master_dir)
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    wait_for_replica(m, s)
    queues = ["red", "green"]
    seen = operator_traffic(m, random.Random(13), queues, ops=600)
    for outcome in ("retry", "lua-retry", "retrydead", "purge", "EMQ.PAUSE", "EMQ.RESUME", "multi-retried",
                    "forget", "obliterate-step", "fail-dead", "complete", "not-retryable"):  # fmt: skip
        assert seen[outcome] > 0, (outcome, seen)
    # Claim records expire with their lease (1 ms for some claims here): a
    # replay that starts after that rightly drops them, so they go first.
    for key in list(m.scan_iter(match="emq:*:req:*")):
        m.delete(key)
    assert m.execute_command("WAIT", 1, 5000) == 1
    wait_for_replica(m, s)
    assert m.dbsize() > 0
    expected = digest(m)
    assert digest(s) == expected
    for q in queues:
        assert queue_problems(m, q) == [], q
    s.close()
    m.close()
    master.stop()
    aof_files = list((master_dir / "appendonlydir").glob("*.aof"))
    for f in aof_files:  # effects only
        assert b"EMQ." not in f.read_bytes().upper(), f
    shutil.copytree(master_dir, replay_dir)
    replay = server_factory(["--appendonly", "yes"], dir=replay_dir)
    assert digest(replay.client()) == expected


# -- ACL -----------------------------------------------------------------------------

SETS_ONLY = ["~emq:{q}:active", "~emq:{q}:pending", "~emq:{q}:dead", "~emq:{q}:priority", "~emq:{q}:delayed"]
NOPERM = "this user has no permissions to access the job rows or metrics derived from <base>"


@pytest.fixture(scope="module")
def acl_server(server_factory: ServerFactory) -> EmbeddedServer:
    srv = server_factory()
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "sets", "reset", "on", ">pw", "+@all", *SETS_ONLY)
    # Rows readable and writable, the settings and metric not at all.
    admin.execute_command(
        "ACL", "SETUSER", "rows", "reset", "on", ">pw", "+@all", *SETS_ONLY, "~emq:{q}:job:*"
    )
    admin.close()
    return srv


@pytest.mark.parametrize("row", ["none", "dead", "pending", "not-a-hash"])
@pytest.mark.parametrize(
    "verb", ["retry", "retrydead", "purge", "forget", "retention", "pause", "resume", "obliterate"]
)
def test_derived_keys_are_refused_before_they_are_read(
    acl_server: EmbeddedServer, verb: str, row: str
) -> None:
    admin, user = acl_server.client(), acl_server.client(username="sets", password="pw")
    admin.flushall()
    if row == "dead":
        admin.hset(Q.job("j"), mapping={"state": "dead", "attempts": 1})
        admin.zadd(Q.dead, {"j": 1})
    elif row == "pending":
        admin.hset(Q.job("j"), mapping={"state": "pending", "attempts": 0})
        admin.rpush(Q.pending, "j")
    elif row == "not-a-hash":
        admin.set(Q.job("j"), "x")
        admin.zadd(Q.dead, {"j": 1})
    args = {
        "retry": ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "j"],
        "retrydead": ["EMQ.RETRYDEAD", Q.dead, Q.pending, Q.base, 10],
        "purge": ["EMQ.PURGE", Q.dead, Q.base, 10],
        "forget": ["EMQ.FORGET", Q.pending, Q.base, "j"],
        "retention": ["EMQ.RETENTION", Q.pending, Q.base],
        "pause": ["EMQ.PAUSE", Q.pending, Q.base],
        "resume": ["EMQ.RESUME", Q.pending, Q.base],
        "obliterate": ["EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 10],
    }[verb]
    before = digest(admin)
    if verb in ("retrydead", "purge") and row in ("none", "pending"):
        user.execute_command(*args)  # no dead member: no row to touch, nothing refused
    elif verb == "obliterate" and row == "none":
        with pytest.raises(redis.exceptions.NoPermissionError):  # the metric, deleted by the last step
            user.execute_command(*args)
    else:
        with pytest.raises(redis.exceptions.NoPermissionError) as refused:
            user.execute_command(*args)
        assert str(refused.value) == NOPERM
    assert digest(admin) == before
    # A user who may touch the rows but not the settings: refused before the meta is read.
    rows_user = acl_server.client(username="rows", password="pw")
    if verb in ("retention", "pause", "resume", "obliterate"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            rows_user.execute_command(*args)
        assert digest(admin) == before
    admin.close()
    user.close()
    rows_user.close()


# -- memory ----------------------------------------------------------------------------


@pytest.fixture
def full(server_factory: ServerFactory) -> Iterator[redis.Redis]:
    srv = server_factory(["--maxmemory-policy", "noeviction"])
    conn = srv.client()
    client = echomq.Client(conn)
    for i in range(4):
        client.enqueue("q", b"x", job_id=f"j{i}")
        job = client.claim("q", lease_ms=600_000)
        assert job is not None
        client.fail("q", job.id, job.token, "e", max_attempts=1)
    client.enqueue("q", b"x", job_id="done")
    job = client.claim("q", lease_ms=600_000)
    assert job is not None
    client.complete("q", "done", job.token)
    conn.config_set("maxmemory", 1)
    yield conn
    conn.config_set("maxmemory", 0)
    conn.close()


def test_verbs_that_grow_memory_are_refused_past_maxmemory(full: redis.Redis) -> None:
    before = digest(full)
    for args in (
        ["EMQ.RETRY", Q.dead, Q.pending, Q.base, "j0"],
        ["EMQ.RETRYDEAD", Q.dead, Q.pending, Q.base, 10],
        ["EMQ.RETENTION", Q.pending, Q.base, "DONE", 5],
    ):
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            full.execute_command(*args)
        pipe = full.pipeline(transaction=True)
        pipe.execute_command(*args)
        with pytest.raises(redis.exceptions.ResponseError):  # EXECABORT
            pipe.execute()
    assert digest(full) == before


def test_verbs_that_stop_or_free_work_past_maxmemory(full: redis.Redis) -> None:
    client = echomq.Client(full)
    assert client.pause("q") is True
    assert client.resume("q") is True
    assert full.execute_command("EMQ.PURGE", Q.dead, Q.base, 2) == 2
    assert full.execute_command("EMQ.FORGET", Q.pending, Q.base, "done") == 1
    assert client.obliterate("q").removed == 2
    assert full.exists(Q.dead, Q.job("j3")) == 0


# -- routing ---------------------------------------------------------------------------


def test_command_getkeys_names_the_declared_keys(r: redis.Redis) -> None:
    def keys(*args: object) -> list[str]:
        return [k.decode() if isinstance(k, bytes) else k for k in r.command_getkeys(*args)]

    assert keys("EMQ.RETRY", Q.dead, Q.pending, Q.base, "j") == [Q.dead, Q.pending]
    assert keys("EMQ.RETRYDEAD", Q.dead, Q.pending, Q.base, 5) == [Q.dead, Q.pending]
    assert keys("EMQ.PURGE", Q.dead, Q.base, 5) == [Q.dead]
    assert keys("EMQ.RETENTION", Q.pending, Q.base) == [Q.pending]
    assert keys("EMQ.PAUSE", Q.pending, Q.base) == [Q.pending]
    assert keys("EMQ.RESUME", Q.pending, Q.base) == [Q.pending]
    assert keys("EMQ.OBLITERATE", Q.active, Q.pending, Q.dead, Q.base, 5) == [Q.active, Q.pending, Q.dead]
    assert keys("EMQ.FORGET", Q.pending, Q.base, "a", "b") == [Q.pending]
    table = r.command()
    flags = {
        name: set(table[name]["flags"]) for name in ("emq.retry", "emq.pause", "emq.purge", "emq.retrydead")
    }
    assert {"write", "denyoom", "fast"} <= flags["emq.retry"]
    assert "denyoom" in flags["emq.retrydead"] and "fast" not in flags["emq.retrydead"]
    assert "denyoom" not in flags["emq.pause"] and "fast" in flags["emq.pause"]
    assert "denyoom" not in flags["emq.purge"] and "fast" not in flags["emq.purge"]
