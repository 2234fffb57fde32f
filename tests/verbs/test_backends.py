"""The scripts backend where the module's guarantees are tested: one table of errors, fresh
tokens without math.random, ACL refusals before any write, memory pressure, replicas and
the AOF, MULTI/EXEC, read-only replicas, Redis Cluster (routing and slots on the move).

tests/verbs/test_backends_differential.py compares the scripts with the module reply by reply,
key by key and event by event over random traces; this file covers what those traces do
not reach (they run as the default user, outside a cluster, with memory to spare).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import echomq
from echomq import _scripts
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory, needs, wait_for_replica
from ..helpers import TOKEN_RE, digest, now_ms, put_active, queued

pytestmark = needs("script_flags", "script flags (#!lua shebangs) are Redis 7.0+")

ROOT = Path(__file__).resolve().parents[2]
Q = "bk"
K = queue_keys(Q)


def error_table() -> dict[str, str]:
    """module/emq_core.c's error texts, by enum name without EMQ_ERR_."""
    source = (ROOT / "module" / "emq_core.c").read_text()
    table = source[source.index("error_texts[EMQ_ERR_COUNT_]") : source.index("};")]
    entries = re.findall(r'\[EMQ_ERR_(\w+)\]\s*=\s*((?:\s*"(?:[^"\\]|\\.)*")+)', table)
    return {name: "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', texts)) for name, texts in entries}


def prelude_table() -> dict[str, str]:
    """_prelude.lua's error texts (its E table), by name."""
    source = _scripts._file("_prelude.lua")
    table = source[source.index("local E = {") : source.index("\n}\n")]
    out = {}
    for name, _quote, text in re.findall(r"^\s*(\w+) = (['\"])(.*)\2,$", table, re.MULTILINE):
        out[name] = text
    return out


def test_the_scripts_answer_the_modules_error_texts() -> None:
    module, scripts = error_table(), prelude_table()
    assert len(module) > 40
    assert scripts == module


def test_every_verb_has_its_script_with_the_modules_memory_flag(server: EmbeddedServer) -> None:
    """allow-oom exactly where the module command is not deny-oom (COMMAND INFO says which)."""
    r = server.client()
    for verb, script in _scripts.scripts().items():
        info = r.execute_command("COMMAND INFO", verb.lower())[0]
        flags = {f.decode() if isinstance(f, bytes) else f for f in info[2]}
        assert ("denyoom" in flags) == ("allow-oom" not in script.flags), verb
        assert script.source.startswith(b"#!lua")


def test_scripts_cannot_draw_random_tokens_so_the_client_sends_a_nonce(server_factory: ServerFactory) -> None:
    """math.random in a script is one fixed sequence, the same from every server's start: a
    token drawn from it would be predictable, and a promoted replica would hand out the
    random parts the old master already gave.  The client's nonce makes every claim's fresh."""
    draws = []
    for _ in range(2):
        fresh = server_factory(load_module=False)
        r = fresh.client()
        draws.append([r.eval("return tostring(math.random())", 0) for _ in range(3)])
        fresh.stop()
    assert draws[0] == draws[1] and len(set(draws[0])) == 3
    fresh = server_factory(load_module=False)
    client = echomq.Client(fresh.client())
    randoms = set()
    client.enqueue(Q, job_id="j")
    for attempt in range(1, 21):
        job = client.claim(Q, lease_ms=60_000)
        assert job is not None and TOKEN_RE.fullmatch(job.token)
        assert job.token.startswith(f"{attempt}-")
        randoms.add(job.token.split("-")[1])
        client.release(Q, job.id, job.token)
    assert len(randoms) == 20


# -- ACL: refused before anything is written -------------------------------------------------

USERS = {
    # Queue a only.
    "alice": ["~emq:{a}:*"],
    # Queue b's sets, settings and claim records, not its rows or metric.
    "bob": ["~emq:{b}:active", "~emq:{b}:pending", "~emq:{b}:dead", "~emq:{b}:meta", "~emq:{b}:req:*"],
    # Queue b's sets, settings, metric and claim records; its rows read-only.
    "dave": [
        "~emq:{b}:active",
        "~emq:{b}:pending",
        "~emq:{b}:dead",
        "~emq:{b}:meta",
        "~emq:{b}:metrics:*",
        "~emq:{b}:req:*",
        "%R~emq:{b}:job:*",
    ],
    # Queue b's sets and rows, not its settings.
    "carol": ["~emq:{b}:active", "~emq:{b}:pending", "~emq:{b}:dead", "~emq:{b}:job:*"],
}
DERIVED = "derived from <base>"


@pytest.fixture(scope="module")
def bare_acl(server_factory: ServerFactory) -> EmbeddedServer:
    srv = server_factory(load_module=False)
    admin = srv.client()
    for name, keys in USERS.items():
        admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", "+@all", *keys)
    admin.close()
    return srv


@pytest.fixture
def admin(bare_acl: EmbeddedServer) -> Iterator[redis.Redis]:
    conn = bare_acl.client()
    conn.flushall()
    yield conn
    conn.close()


def as_user(srv: EmbeddedServer, user: str) -> echomq.Client:
    return echomq.Client(srv.client(username=user, password="pw"), backend="scripts")


def test_a_run_time_row_the_user_may_only_read_refuses_the_sweep_before_any_write(
    bare_acl: EmbeddedServer, admin: redis.Redis
) -> None:
    """dave may read rows, not write them: a sweep of lapsed jobs must not leave them half swept.

    The rows are found at run time (not in KEYS): the script probes each for a write
    before its first write and answers the module's words."""
    b = queue_keys("b")
    now = now_ms(admin)
    for i in range(3):
        put_active(admin, "b", f"j{i}", attempts=1, deadline=now - 1000 - i)
    before = digest(admin)
    with pytest.raises(redis.exceptions.NoPermissionError, match=DERIVED):
        as_user(bare_acl, "dave").sweep("b", max_stalled=1, limit=10)
    assert digest(admin) == before
    assert admin.zcard(b.active) == 3


def test_a_claim_of_rows_the_user_may_not_touch_writes_nothing(
    bare_acl: EmbeddedServer, admin: redis.Redis
) -> None:
    echomq.Client(admin, backend="scripts").enqueue("b", b"p", job_id="j")
    before = digest(admin)
    for user in ("bob", "dave"):
        with pytest.raises(redis.exceptions.NoPermissionError, match=DERIVED):
            as_user(bare_acl, user).claim("b", lease_ms=1000)
    assert digest(admin) == before


def test_rows_of_named_ids_are_declared_and_refused_by_the_server(
    bare_acl: EmbeddedServer, admin: redis.Redis
) -> None:
    """ENQUEUE, FAIL, CANCEL, RELEASE, RETRY name their row: it is in KEYS, so the server
    refuses the call before the script runs (its own NOPERM words, not the module's)."""
    before = digest(admin)
    bob = as_user(bare_acl, "bob")
    for call in (
        lambda: bob.enqueue("b", b"p", job_id="new"),
        lambda: bob.cancel("b", "no-such-job"),
        lambda: bob.fail("b", "j", "1-0000000000000000", "e"),
        lambda: bob.release("b", "j", "1-0000000000000000"),
        lambda: bob.retry("b", "j"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            call()
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_user(bare_acl, "alice").sweep("b")
    assert digest(admin) == before


def test_settings_the_user_may_not_read_refuse_complete_but_not_a_held_cancel(
    bare_acl: EmbeddedServer, admin: redis.Redis
) -> None:
    """As the module: COMPLETE reads the retention in <base>meta, a cancel request of a
    held job does not."""
    owner = echomq.Client(admin, backend="scripts")
    owner.enqueue("b", b"p", job_id="j")
    job = owner.claim("b", lease_ms=60_000)
    assert job is not None
    carol = as_user(bare_acl, "carol")
    before = digest(admin)
    with pytest.raises(redis.exceptions.NoPermissionError, match=DERIVED):
        carol.complete("b", job.id, job.token)
    assert digest(admin) == before
    assert carol.cancel("b", "j", "stop") == "requested"
    assert digest(admin) != before


# -- memory pressure ---------------------------------------------------------------------------


@pytest.fixture
def full(server_factory: ServerFactory) -> Iterator[tuple[redis.Redis, echomq.Client, echomq.Job]]:
    srv = server_factory(["--maxmemory-policy", "noeviction"], load_module=False)
    conn = srv.client()
    client = echomq.Client(conn)
    assert client.backend == "scripts"
    client.enqueue(Q, b"p", job_id="j")
    client.enqueue(Q, b"p", job_id="k")
    job = client.claim(Q, lease_ms=60_000)
    assert job is not None
    conn.config_set("maxmemory", 1)
    yield conn, client, job
    conn.config_set("maxmemory", 0)


def test_past_maxmemory_as_the_module_growing_verbs_refused_finishing_ones_work(
    full: tuple[redis.Redis, echomq.Client, echomq.Job],
) -> None:
    conn, client, job = full
    before = digest(conn)
    for call in (
        lambda: client.enqueue(Q, b"more"),
        lambda: client.claim(Q, lease_ms=1000),
        lambda: client.cancel(Q, "k", "why"),
        lambda: client.sweep(Q),
        lambda: client.fail(Q, job.id, job.token, "e"),
        lambda: client.checkpoint(Q, job.id, job.token, 60_000, state=b"s"),
    ):
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            call()
    assert digest(conn) == before
    # A live handler keeps its lease and finishes its job; an operator can pause.
    assert client.checkpoint(Q, job.id, job.token, 60_000) is None
    client.extend(Q, job.id, job.token, 60_000)
    assert client.pause(Q) is True
    client.complete(Q, job.id, job.token)
    assert conn.hget(K.job("j"), "state") == b"done"
    client.complete(Q, job.id, job.token)  # and its retry


# -- replicas, the AOF, transactions -----------------------------------------------------------


def scripts_workload(client: echomq.Client) -> None:
    """Every verb, through the scripts, with the effects a replica must apply exactly."""
    q = "rep"
    client.retention(q, done_ms=60_000, dead_ms=0)
    for i in range(6):
        client.enqueue(q, f"p{i}".encode(), job_id=f"j{i}")
    jobs = client.claim_many(q, lease_ms=60_000, count=4)
    a, b, c, d = jobs
    client.checkpoint(q, a.id, a.token, 60_000, state=b"half")
    client.complete(q, a.id, a.token)
    assert client.fail(q, b.id, b.token, "boom", max_attempts=1) == "dead"
    client.release(q, c.id, c.token)
    client.cancel(q, d.id, "stop")
    assert client.fail(q, d.id, d.token, "stopped") == "cancelled"
    client.cancel(q, "j5", "not needed")
    e = client.claim(q, lease_ms=60_000)
    assert e is not None
    client.redis.zadd(queue_keys(q).active, {e.id: 0})  # its holder died long ago
    assert client.sweep(q, max_stalled=1).dead == [e.id]
    assert client.sweep(q).expired == 1  # the dead retention of 0
    client.retry(q, "j5")
    client.pause(q)
    client.resume(q)
    client.retry_dead(q)
    client.obliterate("rep-gone", force=True)


def test_replica_and_aof_hold_exactly_what_the_scripts_wrote(server_factory: ServerFactory) -> None:
    master = server_factory(["--appendonly", "yes", "--appendfsync", "always"], load_module=False)
    replica = server_factory(
        ["--replicaof", master.host, str(master.port), "--repl-diskless-sync-delay", "0"], load_module=False
    )
    m, s = master.client(), replica.client()
    wait_for_replica(m, s)
    client = echomq.Client(m)
    assert client.backend == "scripts"
    scripts_workload(client)
    pipe = m.pipeline(transaction=True)  # FCALL inside MULTI/EXEC
    limits = _scripts.ScriptLimits()
    for command in (
        _scripts.render(("EMQ.ENQUEUE", K.pending, K.base, "m1", "x"), limits, mode="functions"),
        _scripts.render(("EMQ.CLAIM", K.pending, K.active, K.base, 60_000), limits, mode="functions"),
    ):
        pipe.execute_command(*command)
    enqueued, claimed = pipe.execute()
    assert enqueued == 1 and claimed[0][0] == b"m1"
    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    assert digest(s) == digest(m)
    assert s.hget(K.job("m1"), "token") == claimed[0][1]  # the token as written, not drawn again
    assert 0 < s.pttl(queue_keys("rep").job("j0")) <= 60_000  # the retention, absolute
    # The replica refuses the scripts as it refuses any write.
    with pytest.raises(redis.exceptions.ReadOnlyError):
        echomq.Client(s, backend="scripts").enqueue(Q, b"x")
    before = digest(m)
    m.execute_command("DEBUG", "LOADAOF")
    assert digest(m) == before


def libraries(r: redis.Redis) -> list[str]:
    """FUNCTION LIST's library names (RESP2: each library a flat list of names and values)."""
    names = []
    for lib in r.function_list():
        fields = dict(zip(lib[::2], lib[1::2], strict=True)) if isinstance(lib, list) else lib
        names.append(fields[b"library_name"].decode())
    return names


def test_the_library_is_loaded_where_missing_and_kept_by_replicas(server_factory: ServerFactory) -> None:
    """FCALL of a function the node lacks: FUNCTION LOAD there, the call again (nothing ran)."""
    master = server_factory(load_module=False)
    replica = server_factory(
        ["--replicaof", master.host, str(master.port), "--repl-diskless-sync-delay", "0"], load_module=False
    )
    m, s = master.client(), replica.client()
    wait_for_replica(m, s)
    library = _scripts.library()
    assert libraries(m) == []
    client = echomq.Client(m)
    client.enqueue(Q, b"x", job_id="a")
    assert libraries(m) == [library.name]
    wait_for_replica(m, s)
    assert libraries(s) == [library.name]  # a failover keeps it
    m.function_flush()
    assert client.extend_many(Q, [("a", "1-0000000000000000"), ("b", "x")], 1000) == [
        echomq.ExtendOutcome.GONE, echomq.ExtendOutcome.GONE,
    ]  # fmt: skip
    m.function_flush()
    client.enqueue(Q, b"y", job_id="b")
    assert queued(m, K) == 2 and libraries(m) == [library.name]


def test_where_the_library_may_not_be_loaded_the_client_runs_one_script_per_verb(
    server_factory: ServerFactory,
) -> None:
    """FUNCTION LOAD refused (an ACL, a managed service): EVALSHA, and EVAL on NOSCRIPT."""
    srv = server_factory(load_module=False)
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "worker", "on", ">pw", "~*", "&*", "+@all", "-function")
    client = echomq.Client(srv.client(username="worker", password="pw"))
    assert client.backend == "scripts"
    client.enqueue(Q, b"x", job_id="a")
    assert libraries(admin) == []
    sha = _scripts.scripts()["EMQ.ENQUEUE"].sha
    assert admin.script_exists(sha) == [True]
    admin.script_flush()
    client.enqueue(Q, b"y", job_id="b")
    assert admin.script_exists(sha) == [True]
    job = client.claim(Q, lease_ms=1000)
    assert job is not None
    client.complete(Q, job.id, job.token)
