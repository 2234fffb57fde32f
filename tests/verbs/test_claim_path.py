"""Delays and batch enqueue (issues 14 and 18): ENQUEUE DELAY/AT, FAIL DELAY, EMQ.ENQUEUEMANY.

Every reply and every error of the new options and verb, DEBUG DIGEST
unchanged after each error; the keyspace events, the replication stream
(one HSET per row and one ZADD), ACL on the derived rows, OOM, MULTI and Lua;
the Python surface (enqueue(delay_ms=, run_at_ms=), enqueue_many,
fail(delay_ms=), RetryPolicy); and the pure parsers through cffi.
The blocking claim has its own file: test_blocking_claim.py.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import redis

import echomq
import echomq.asyncio as aemq
from echomq import _protocol as proto
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory, wait_for_replica
from ..helpers import digest, entries, now_ms, queued
from .test_core_cffi import Core
from .test_notifications import captured

pytestmark = pytest.mark.memcheck  # make -C module check runs it under valgrind

Q = queue_keys("q")
MAX_EXACT = 2**53

DELAY_ERR = "ERR DELAY must be an integer >= 0"
DELAY_BIG = "ERR DELAY is too large: the due time would not be an exact score"
AT_ERR = "ERR AT must be an integer >= 0 (unix time in milliseconds)"
AT_BIG = "ERR AT is too large: the due time would not be an exact score"
BOTH = "ERR DELAY and AT cannot be used together"
SYNTAX = "ERR syntax error"
COUNT_ERR = "ERR count must be an integer >= 1"
COUNT_BIG = "ERR count exceeds the server's emq.max-limit"
DUPLICATE = "ERR the same id appears twice in one EMQ.ENQUEUEMANY"
EXISTS = "EMQEXISTS a job with this id already exists"
WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
NOPERM = "NOPERM this user has no permissions to access the job rows or metrics derived from <base>"


def enqueue(r: redis.Redis, job_id: str, *opts: object, payload: str = "p") -> Any:
    return r.execute_command("EMQ.ENQUEUE", Q.pending, Q.base, job_id, payload, *opts)


def many(
    r: redis.Redis, *jobs: tuple[str, str], opts: tuple[object, ...] = (), count: int | None = None
) -> Any:
    flat = [x for job in jobs for x in job]
    return r.execute_command(
        "EMQ.ENQUEUEMANY", Q.pending, Q.base, len(jobs) if count is None else count, *flat, *opts
    )


def claim(r: redis.Redis, *opts: object) -> Any:
    return r.execute_command("EMQ.CLAIM", Q.pending, Q.active, Q.base, 60_000, *opts)


def fail(r: redis.Redis, job_id: str, token: object, max_attempts: int = 3, *opts: object) -> Any:
    return r.execute_command(
        "EMQ.FAIL", Q.active, Q.pending, Q.dead, Q.base, job_id, token, max_attempts, "boom", *opts
    )


def refused(r: redis.Redis, message: str, *command: object) -> None:
    """The command answers exactly `message` and changes nothing."""
    before = digest(r)
    with pytest.raises(redis.ResponseError) as info:
        r.execute_command(*command)
    assert str(info.value) == message.removeprefix("ERR "), command  # redis-py drops "ERR "
    assert digest(r) == before, command


# -- ENQUEUE ... DELAY | AT ------------------------------------------------------


def test_a_delayed_job_waits_in_delayed_scored_with_its_due_time(r: redis.Redis) -> None:
    before = now_ms(r)
    assert enqueue(r, "later", "DELAY", 60_000) == 1
    after = now_ms(r)
    score = r.zscore(Q.delayed, "later")
    assert score is not None and before + 60_000 <= score <= after + 60_000
    row = r.hgetall(Q.job("later"))
    assert row[b"state"] == b"pending" and b"attempts" not in row and b"tries" not in row
    assert before <= int(row[b"enqueued_at"]) <= after  # enqueued now, due later
    assert not r.exists(Q.pending)  # not in its lane before its due time
    assert claim(r) is None  # not claimable before its due time
    # The operator's count of delayed jobs: the members of <base>delayed scored in the future.
    assert r.zcount(Q.delayed, f"({now_ms(r)}", "+inf") == 1


def test_due_order_and_a_short_delay_becomes_claimable(r: redis.Redis) -> None:
    assert enqueue(r, "soon", "DELAY", 150) == 1
    assert enqueue(r, "now") == 1
    assert enqueue(r, "zero", "delay", 0) == 1  # option names are case-insensitive; 0 is now
    first = claim(r, "COUNT", 5)
    assert [job[0] for job in first] == [b"now", b"zero"]
    time.sleep(0.2)
    assert [job[0] for job in claim(r)] == [b"soon"]


def test_at_is_an_absolute_due_time_and_a_past_one_is_claimable_at_once(r: redis.Redis) -> None:
    now = now_ms(r)
    assert enqueue(r, "future", "AT", now + 3_600_000) == 1
    assert r.zscore(Q.delayed, "future") == now + 3_600_000
    assert enqueue(r, "past", "AT", 5) == 1
    # Kept with its own time (issue 43): the claim that moves it orders it among the due jobs.
    assert entries(r, Q) == [] and r.zscore(Q.delayed, "past") == 5
    assert enqueue(r, "edge", "AT", MAX_EXACT) == 1  # the latest exact score is accepted
    assert r.zscore(Q.delayed, "edge") == MAX_EXACT
    assert [job[0] for job in claim(r)] == [b"past"]


def test_enqueue_option_errors_write_nothing(r: redis.Redis) -> None:
    enqueue(r, "existing")
    base = ("EMQ.ENQUEUE", Q.pending, Q.base, "j", "p")
    for opts, message in [
        (("DELAY", "x"), DELAY_ERR),
        (("DELAY", "-1"), DELAY_ERR),
        (("DELAY", "1.5"), DELAY_ERR),
        (("DELAY", ""), DELAY_ERR),
        (("DELAY", str(MAX_EXACT)), DELAY_BIG),
        (("DELAY", "9223372036854775807"), DELAY_BIG),
        (("AT", "x"), AT_ERR),
        (("AT", "-5"), AT_ERR),
        (("AT", str(MAX_EXACT + 1)), AT_BIG),
        (("DELAY", "5", "AT", "5"), BOTH),
        (("AT", "5", "DELAY", "5"), BOTH),
        (("DELAY", "5", "DELAY", "5"), SYNTAX),
        (("AT", "5", "REQ", "r", "AT", "6"), SYNTAX),
        (("DELAY",), SYNTAX),
        (("WHEN", "5"), SYNTAX),
        (("REQ", "", "DELAY", "5"), "ERR the REQ request id must not be empty"),
    ]:
        refused(r, message, *base, *opts)
    refused(r, EXISTS, "EMQ.ENQUEUE", Q.pending, Q.base, "existing", "p", "DELAY", 10)


def test_a_retried_delayed_enqueue_answers_again_and_writes_nothing(r: redis.Redis) -> None:
    assert enqueue(r, "j", "DELAY", 60_000, "REQ", "r1") == 1
    before = digest(r)
    assert enqueue(r, "j", "DELAY", 60_000, "REQ", "r1") == 1
    assert enqueue(r, "j", "REQ", "r1") == 1  # the request decides, not the options
    assert digest(r) == before
    with pytest.raises(redis.ResponseError, match="EMQEXISTS"):
        enqueue(r, "j", "DELAY", 60_000, "REQ", "r2")


# -- FAIL ... DELAY ---------------------------------------------------------------


def test_fail_with_delay_sends_the_job_back_due_later(r: redis.Redis) -> None:
    enqueue(r, "j")
    (job,) = claim(r)
    before = now_ms(r)
    assert fail(r, "j", job[1], 3, "DELAY", 60_000) == b"pending"
    score = r.zscore(Q.delayed, "j")
    assert score is not None and before + 60_000 <= score <= now_ms(r) + 60_000
    assert r.hget(Q.job("j"), "state") == b"pending" and not r.exists(Q.active)
    assert claim(r) is None
    retried = digest(r)
    assert fail(r, "j", job[1], 3, "DELAY", 5) == b"pending"  # a retry: the first answer, nothing written
    assert digest(r) == retried


def test_fail_with_a_short_delay_is_claimable_after_it(r: redis.Redis) -> None:
    enqueue(r, "j")
    (job,) = claim(r)
    assert fail(r, "j", job[1], 3, "DELAY", 120) == b"pending"
    assert claim(r) is None
    time.sleep(0.15)
    (again,) = claim(r)
    assert again[0] == b"j" and again[3] == 2


def test_fail_delay_is_ignored_when_the_job_dies(r: redis.Redis) -> None:
    enqueue(r, "j")
    (job,) = claim(r)
    assert fail(r, "j", job[1], 1, "DELAY", 60_000) == b"dead"
    assert r.zscore(Q.dead, "j") is not None and not r.exists(Q.pending)


def test_fail_option_errors_write_nothing(r: redis.Redis) -> None:
    enqueue(r, "j")
    (job,) = claim(r)
    base = ("EMQ.FAIL", Q.active, Q.pending, Q.dead, Q.base, "j", job[1], 3, "boom")
    for opts, message in [
        (("DELAY", "x"), DELAY_ERR),
        (("DELAY", "-1"), DELAY_ERR),
        (("DELAY", str(MAX_EXACT)), DELAY_BIG),
        (("DELAY",), SYNTAX),
        (("AT", "5"), SYNTAX),
        (("DELAY", "5", "DELAY", "5"), SYNTAX),
        (("FOO", "5"), SYNTAX),
    ]:
        refused(r, message, *base, *opts)
    # The max-attempts check comes first, as before.
    refused(r, "ERR max-attempts must be an integer >= 1", *base[:7], 0, "boom", "DELAY", "x")


# -- EMQ.ENQUEUEMANY ---------------------------------------------------------------


def test_enqueuemany_writes_every_row_and_one_pending_entry_each(r: redis.Redis) -> None:
    before = now_ms(r)
    assert many(r, ("a", "pa"), ("b", "pb"), ("c", "")) == 3
    after = now_ms(r)
    for job_id, payload in (("a", b"pa"), ("b", b"pb"), ("c", b"")):
        row = r.hgetall(Q.job(job_id))
        assert row.pop(b"payload") == payload
        at = int(row.pop(b"enqueued_at"))
        assert before <= at <= after
        assert row == {b"state": b"pending"}
    assert entries(r, Q) == [b"a", b"b", b"c"]  # in argument order, at the tail of their lane
    assert [job[0] for job in claim(r, "COUNT", 10)] == [b"a", b"b", b"c"]


def test_enqueuemany_with_delay_at_and_req(r: redis.Redis) -> None:
    now = now_ms(r)
    assert many(r, ("a", "1"), ("b", "2"), opts=("AT", now + 3_600_000, "REQ", "batch-1")) == 2
    assert r.zrange(Q.delayed, 0, -1, withscores=True) == [(b"a", now + 3_600_000), (b"b", now + 3_600_000)]
    assert not r.hexists(Q.job("a"), "request") and r.get(Q.base + "req:batch-1") == b"2"
    assert claim(r) is None
    assert many(r, ("c", "3"), opts=("DELAY", 60_000)) == 1
    assert r.zscore(Q.delayed, "c") >= now + 60_000  # type: ignore[operator]


def test_enqueuemany_is_all_or_nothing(r: redis.Redis) -> None:
    enqueue(r, "b")
    refused(r, EXISTS, "EMQ.ENQUEUEMANY", Q.pending, Q.base, 3, "a", "1", "b", "2", "c", "3")
    assert not r.exists(Q.job("a"), Q.job("c"))
    # A row of another type is a taken id too, as for ENQUEUE.
    r.set(Q.job("s"), "x")
    refused(r, EXISTS, "EMQ.ENQUEUEMANY", Q.pending, Q.base, 2, "x", "1", "s", "2")


def test_a_retried_enqueuemany_answers_as_the_first(r: redis.Redis) -> None:
    assert many(r, ("a", "1"), ("b", "2"), opts=("REQ", "r1")) == 2
    before = digest(r)
    assert many(r, ("a", "1"), ("b", "2"), opts=("REQ", "r1")) == 2
    assert digest(r) == before
    # Another request is refused: the ids are taken.
    refused(r, EXISTS, "EMQ.ENQUEUEMANY", Q.pending, Q.base, 2, "a", "1", "b", "2", "REQ", "r2")
    # The retry of r1 is answered by its record, whatever became of the jobs: a row gone
    # since (done at a retention of 0, forgotten) is not made again.
    r.delete(Q.job("b"))
    before = digest(r)
    assert many(r, ("a", "1"), ("b", "2"), opts=("REQ", "r1")) == 2
    assert digest(r) == before and not r.exists(Q.job("b"))


def test_enqueuemany_errors_write_nothing(r: redis.Redis) -> None:
    enqueue(r, "existing")
    name = ("EMQ.ENQUEUEMANY", Q.pending, Q.base)
    for args, message in [
        ((0, "a", "1"), COUNT_ERR),
        ((-1, "a", "1"), COUNT_ERR),
        (("x", "a", "1"), COUNT_ERR),
        (("01", "a", "1"), COUNT_ERR),
        ((10_001, "a", "1"), COUNT_BIG),
        ((2, "a", "1", "a", "2"), DUPLICATE),
        ((3, "a", "1", "b", "2", "a", "3"), DUPLICATE),
        ((1, "a", "1", "b", "2"), SYNTAX),
        ((1, "a", "1", "DELAY", "x"), DELAY_ERR),
        ((1, "a", "1", "DELAY", "1", "AT", "1"), BOTH),
        ((1, "a", "1", "REQ", ""), "ERR the REQ request id must not be empty"),
        ((2, "a", "1", "b"), "ERR wrong number of arguments for 'emq.enqueuemany' command"),
        ((3, "a", "1", "b", "2"), "ERR wrong number of arguments for 'emq.enqueuemany' command"),
    ]:
        refused(r, message, *name, *args)
    refused(r, "ERR wrong number of arguments for 'emq.enqueuemany' command", *name, 1, "a")
    refused(r, "ERR <pending> must be <base>pending", "EMQ.ENQUEUEMANY", Q.active, Q.base, 1, "a", "1")
    r.set(Q.pending, "not a set")
    refused(r, WRONGTYPE, *name, 1, "a", "1")


def test_enqueuemany_takes_10000_jobs_in_one_call(r: redis.Redis) -> None:
    flat = [x for i in range(10_000) for x in (f"j{i}", "p")]
    assert r.execute_command("EMQ.ENQUEUEMANY", Q.pending, Q.base, 10_000, *flat) == 10_000
    assert queued(r, Q) == 10_000 and r.exists(Q.job("j9999"))


def test_enqueuemany_in_multi_and_from_lua(r: redis.Redis) -> None:
    pipe = r.pipeline(transaction=True)
    pipe.execute_command("EMQ.ENQUEUEMANY", Q.pending, Q.base, 2, "a", "1", "b", "2")
    pipe.execute_command("EMQ.ENQUEUEMANY", Q.pending, Q.base, 1, "a", "1")
    assert pipe.execute(raise_on_error=False)[0] == 2
    script = "return redis.call('EMQ.ENQUEUEMANY', KEYS[1], ARGV[1], 2, 'c', '3', 'd', '4', 'DELAY', 10)"
    assert r.eval(script, 1, Q.pending, Q.base) == 2
    assert queued(r, Q) == 4


# -- keyspace events, replication, ACL, OOM ---------------------------------------------


@pytest.fixture(scope="module")
def notifying(server_factory: ServerFactory) -> EmbeddedServer:
    return server_factory(["--notify-keyspace-events", "KEA"])


def test_enqueuemany_fires_an_hset_per_row_and_one_zadd(notifying: EmbeddedServer) -> None:
    nr = notifying.client()
    nr.flushall()
    events = captured(nr, lambda: many(nr, ("a", "1"), ("b", "2"), ("c", "3"), opts=("DELAY", 10)))
    marker = ("set", Q.base + "queue")  # the queue's first enqueue registers it
    assert events == [
        ("hset", Q.job("a")),
        ("hset", Q.job("b")),
        ("hset", Q.job("c")),
        ("zadd", Q.delayed),
        marker,
    ]
    events = captured(nr, lambda: many(nr, ("e", "1"), ("f", "2")))  # due now: one RPUSH
    assert events == [("hset", Q.job("e")), ("hset", Q.job("f")), ("rpush", Q.pending)]
    events = captured(nr, lambda: enqueue(nr, "d", "AT", 5))  # past: delayed, scored with it
    assert events == [("hset", Q.job("d")), ("zadd", Q.delayed)]

    # An error fires nothing.
    def refused_batch() -> None:
        with pytest.raises(redis.ResponseError):
            many(nr, ("a", "1"))

    assert captured(nr, refused_batch) == []
    nr.close()


def test_fail_with_delay_fires_what_fail_fires(notifying: EmbeddedServer) -> None:
    nr = notifying.client()
    nr.flushall()
    enqueue(nr, "j")
    (job,) = claim(nr)
    events = captured(nr, lambda: fail(nr, "j", job[1], 3, "DELAY", 100))
    assert events == [("zrem", Q.active), ("del", Q.active), ("hset", Q.job("j")), ("zadd", Q.delayed)]
    nr.close()


FAST_SYNC = ["--repl-diskless-sync-delay", "0"]


def test_replicas_get_one_hset_per_row_one_zadd_and_absolute_due_times(server_factory: ServerFactory) -> None:
    master = server_factory(FAST_SYNC)
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    wait_for_replica(m, s)
    s.config_resetstat()
    flat = [x for i in range(50) for x in (f"j{i}", f"payload-{i}")]
    assert m.execute_command("EMQ.ENQUEUEMANY", Q.pending, Q.base, 50, *flat, "DELAY", 60_000) == 50
    enqueue(m, "one", "DELAY", 0)  # due now: its lane
    enqueue(m, "two", "DELAY", 60_000)
    (job,) = claim(m)
    fail(m, job[0].decode(), job[1], 3, "DELAY", 30_000)
    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    assert digest(s) == digest(m)
    assert s.zrange(Q.delayed, 0, -1, withscores=True) == m.zrange(Q.delayed, 0, -1, withscores=True)
    stats = s.info("commandstats")
    assert stats["cmdstat_hset"]["calls"] == 50 + 2 + 2  # a row each, the claim's row, the fail's row
    # ONE for the batch, one for "two", the claim's lease, the fail's due time
    assert stats["cmdstat_zadd"]["calls"] == 1 + 1 + 1 + 1
    assert stats["cmdstat_rpush"]["calls"] == 1 and stats["cmdstat_lpop"]["calls"] == 1
    assert not any(name.startswith("cmdstat_emq") for name in stats)
    m.close()
    s.close()
    replica.stop()
    master.stop()


ACL_USERS = {
    # Queue q's lanes and rows a* only.
    "amy": ["~emq:{q}:pending", "~emq:{q}:delayed", "~emq:{q}:job:a*", "~emq:{q}:queue"],
    # Queue q's lanes, no rows.
    "ben": ["~emq:{q}:pending", "~emq:{q}:delayed"],
}


@pytest.fixture(scope="module")
def acl_server(server_factory: ServerFactory) -> EmbeddedServer:
    srv = server_factory()
    admin = srv.client()
    for name, keys in ACL_USERS.items():
        admin.execute_command("ACL", "SETUSER", name, "reset", "on", ">pw", "+@all", *keys)
    admin.close()
    return srv


def test_enqueuemany_checks_every_row_against_the_acl_before_reading(acl_server: EmbeddedServer) -> None:
    admin = acl_server.client()
    admin.flushall()
    admin.hset(Q.job("b1"), "state", "pending")  # exists: a user who may not touch it must not learn so
    amy = acl_server.client(username="amy", password="pw")
    ben = acl_server.client(username="ben", password="pw")
    for user, args in [
        (amy, (2, "a1", "x", "b1", "y")),
        (amy, (2, "a1", "x", "b2", "y")),
        (ben, (1, "a1", "x")),
    ]:
        before = digest(admin)
        with pytest.raises(redis.exceptions.NoPermissionError) as info:
            user.execute_command("EMQ.ENQUEUEMANY", Q.pending, Q.base, *args)
        assert str(info.value) == NOPERM.removeprefix("NOPERM "), args  # redis-py drops the code
        assert digest(admin) == before
    assert amy.execute_command("EMQ.ENQUEUEMANY", Q.pending, Q.base, 2, "a1", "x", "a2", "y", "DELAY", 5) == 2
    for conn in (admin, amy, ben):
        conn.close()


def test_enqueuemany_is_refused_past_maxmemory(server_factory: ServerFactory) -> None:
    srv = server_factory(["--maxmemory-policy", "noeviction"])
    conn = srv.client()
    enqueue(conn, "j")
    conn.config_set("maxmemory", 1)
    try:
        before = digest(conn)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            many(conn, ("a", "1"))
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            enqueue(conn, "k", "DELAY", 5)
        assert digest(conn) == before
        # FAIL is deny-oom as before (its error text grows the row); its DELAY changes nothing there.
    finally:
        conn.config_set("maxmemory", 0)
        conn.close()
        srv.stop()


# -- Python -----------------------------------------------------------------------------


def test_client_enqueue_with_delay_and_run_at(client: echomq.Client, r: redis.Redis) -> None:
    now = now_ms(r)
    client.enqueue("q", b"x", job_id="d", delay_ms=60_000)
    client.enqueue("q", b"y", job_id="t", run_at_ms=now + 120_000)
    client.enqueue("q", "z", job_id="n")
    assert r.zscore(Q.delayed, "d") >= now + 60_000  # type: ignore[operator]
    assert r.zscore(Q.delayed, "t") == now + 120_000
    job = client.claim("q", 60_000)
    assert job is not None and job.id == "n" and client.claim("q", 60_000) is None
    with pytest.raises(ValueError, match="not both"):
        client.enqueue("q", b"", delay_ms=1, run_at_ms=1)
    with pytest.raises(ValueError, match="delay_ms"):
        client.enqueue("q", b"", delay_ms=-1)
    with pytest.raises(TypeError, match="run_at_ms"):
        client.enqueue("q", b"", run_at_ms=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delay_ms"):
        client.enqueue("q", b"", delay_ms=2**53 + 1)


def test_client_enqueue_many_payloads_and_pairs(client: echomq.Client, r: redis.Redis) -> None:
    ids = client.enqueue_many("q", [b"a", "b", ("mine", b"c"), (b"\xffbin", "d")])
    assert len(ids) == 4 and ids[2] == "mine" and ids[3] == b"\xffbin".decode("utf-8", "surrogateescape")
    assert ids[0] < ids[1]  # new ids are time-ordered
    # The batch enters its lane in the order given.
    assert [j.payload for j in client.claim_many("q", 60_000, 10)] == [b"a", b"b", b"c", b"d"]
    assert r.hget(Q.job("mine"), "payload") == b"c"
    assert client.enqueue_many("q", []) == []
    with pytest.raises(ValueError, match="twice"):
        client.enqueue_many("q", [("x", b"1"), ("x", b"2")])
    with pytest.raises(TypeError, match="payload"):
        client.enqueue_many("q", [1])  # type: ignore[list-item]
    with pytest.raises(echomq.JobExists):
        client.enqueue_many("q", [("fresh", b""), ("mine", b"again")])
    assert not r.exists(Q.job("fresh"))
    later = client.enqueue_many("q", [b"l1", b"l2"], delay_ms=60_000)
    assert all(r.zscore(Q.delayed, i) > now_ms(r) + 50_000 for i in later)  # type: ignore[operator]


def test_client_enqueue_many_sends_chunks_of_10000(client: echomq.Client, r: redis.Redis) -> None:
    # No read timeout: under the memory checker a 10,000-job call outlasts redis-py's 5 s, and
    # the client's resend (answered from its REQ record, nothing enqueued twice) is a third call.
    kwargs = r.connection_pool.connection_kwargs
    client = echomq.Client(redis.Redis(host=kwargs["host"], port=kwargs["port"], socket_timeout=None))
    r.config_resetstat()
    ids = client.enqueue_many("q", [b""] * 10_001)
    assert len(set(ids)) == 10_001 and queued(r, Q) == 10_001
    assert r.info("commandstats")["cmdstat_emq.enqueuemany"]["calls"] == 2


def test_client_fail_with_delay(client: echomq.Client, r: redis.Redis) -> None:
    client.enqueue("q", b"x", job_id="j")
    job = client.claim("q", 60_000)
    assert job is not None
    assert client.fail("q", "j", job.token, "boom", max_attempts=3, delay_ms=60_000) == "pending"
    assert r.zscore(Q.delayed, "j") > now_ms(r) + 50_000  # type: ignore[operator]
    with pytest.raises(ValueError, match="delay_ms"):
        client.fail("q", "j", job.token, "boom", delay_ms=-5)


def test_asyncio_client_has_the_same_options(server: EmbeddedServer) -> None:
    import asyncio

    async def main() -> None:
        c = aemq.Client(_aio(server))
        await c.redis.flushall()
        ids = await c.enqueue_many("q", [b"a", ("b", b"b")], delay_ms=0)
        assert ids[1] == "b"
        await c.enqueue("q", b"d", job_id="d", delay_ms=60_000)
        jobs = await c.claim_many("q", 60_000, 5)
        assert [j.id for j in jobs] == ids
        assert await c.fail("q", "b", jobs[1].token, "x", delay_ms=60_000) == "pending"
        assert await c.claim("q", 60_000) is None
        await c.aclose()

    asyncio.run(main())


def _aio(server: EmbeddedServer) -> Any:
    import redis.asyncio as aioredis

    return aioredis.Redis(host=server.host, port=server.port)


# -- RetryPolicy -------------------------------------------------------------------------


def test_retry_policy_fixed_and_exponential() -> None:
    fixed = echomq.RetryPolicy.fixed(2_000, max_attempts=4)
    assert [fixed.delay_ms(a) for a in (1, 2, 3)] == [2_000, 2_000, 2_000]
    assert [fixed.retries(a) for a in (1, 3, 4, 5)] == [True, True, False, False]
    exp = echomq.RetryPolicy.exponential(100, factor=3, max_ms=5_000, jitter=0)
    assert [exp.delay_ms(a) for a in range(1, 7)] == [100, 300, 900, 2_700, 5_000, 5_000]
    assert exp.delay_ms(10_000) == 5_000  # no overflow
    assert echomq.RetryPolicy().max_attempts == 3


def test_retry_policy_jitter_stays_in_its_band() -> None:
    policy = echomq.RetryPolicy.exponential(1_000, max_ms=60_000, jitter=0.5)
    rng = random.Random(3)
    seen = [policy.delay_ms(3, rng.random) for _ in range(500)]
    assert all(2_000 <= d <= 4_000 for d in seen) and len(set(seen)) > 100
    assert policy.delay_ms(3, lambda: 0.0) == 4_000 and policy.delay_ms(3, lambda: 0.999999) == 2_000
    again = random.Random(3)
    assert seen[:5] == [policy.delay_ms(3, again.random) for _ in range(5)]  # pure given its generator


def test_retry_policy_validates() -> None:
    for kwargs, error in [
        ({"max_attempts": 0}, ValueError),
        ({"max_attempts": 1.5}, TypeError),
        ({"base_ms": -1}, ValueError),
        ({"jitter": 1.5}, ValueError),
        ({"factor": 0.5}, ValueError),
        ({"factor": float("inf")}, ValueError),
        ({"backoff": "linear"}, ValueError),
    ]:
        with pytest.raises(error):
            echomq.RetryPolicy(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        echomq.RetryPolicy().delay_ms(0)
    assert hash(echomq.RetryPolicy.fixed(5)) == hash(echomq.RetryPolicy.fixed(5))  # a value


# -- the pure parsers (emq_core.c, through cffi) -----------------------------------------


@pytest.fixture(scope="module")
def core(module_so: Any) -> Core:
    return Core(module_so)


def _err(core: Core, code: int) -> str | None:
    return core._err(code)


def test_core_due_times(core: Core) -> None:
    out = core.ffi.new("long long *", -7)

    def due(fn: Any, now: int, text: bytes) -> tuple[str | None, int]:
        out[0] = -7
        err = _err(core, fn(now, core._buf(text, b"9"), len(text), out))
        return err, int(out[0])

    lib = core.lib
    assert due(lib.emq_due_after_delay, 1000, b"0") == (None, 1000)
    assert due(lib.emq_due_after_delay, 1000, b"250") == (None, 1250)
    assert due(lib.emq_due_after_delay, 1000, b"-1") == (DELAY_ERR, -7)
    assert due(lib.emq_due_after_delay, 1000, b"1x") == (DELAY_ERR, -7)
    assert due(lib.emq_due_after_delay, 0, str(MAX_EXACT).encode()) == (None, MAX_EXACT)
    assert due(lib.emq_due_after_delay, 1, str(MAX_EXACT).encode()) == (DELAY_BIG, -7)
    assert due(lib.emq_due_after_delay, -1, b"0") == (DELAY_BIG, -7)
    assert due(lib.emq_due_at, 1000, b"5") == (None, 5)  # a past time is kept (issue 43)
    assert due(lib.emq_due_at, 1000, b"5000") == (None, 5000)
    assert due(lib.emq_due_at, 1000, str(MAX_EXACT).encode()) == (None, MAX_EXACT)
    assert due(lib.emq_due_at, 1000, str(MAX_EXACT + 1).encode()) == (AT_BIG, -7)
    assert due(lib.emq_due_at, 1000, b"-0") == (AT_ERR, -7)
    assert due(lib.emq_parse_block, 1000, b"0") == (None, 0)
    assert due(lib.emq_parse_block, 1000, b"5000") == (None, 5000)
    assert due(lib.emq_parse_block, 1000, b"-1") == (
        "ERR BLOCK must be an integer >= 0 (0 waits forever)",
        -7,
    )
    big = "ERR BLOCK is too large: the wait would not end at an exact time"
    assert due(lib.emq_parse_block, 1000, str(MAX_EXACT).encode()) == (big, -7)


def test_core_many_count(core: Core) -> None:
    out = core.ffi.new("long long *", -7)
    cases = [(b"1", (None, 1)), (b"10000", (None, 10_000)), (b"10001", (COUNT_BIG, -7))]
    cases += [(b"0", (COUNT_ERR, -7)), (b"x", (COUNT_ERR, -7)), (b"", (COUNT_ERR, -7))]
    for text, expected in cases:
        out[0] = -7
        err = _err(core, core.lib.emq_parse_many_count(core._buf(text, b"0"), len(text), 10_000, out))
        assert (err, int(out[0])) == expected, text


def test_core_first_duplicate(core: Core) -> None:
    rng = random.Random(11)

    def first_duplicate(items: list[bytes]) -> int:
        keep = [core._buf(i, b"z") for i in items]
        ptrs = core.ffi.new("const char *[]", keep) if items else core.ffi.NULL
        lens = core.ffi.new("size_t[]", [len(i) for i in items]) if items else core.ffi.NULL
        order = core.ffi.new("long[]", max(1, len(items)))
        return int(core.lib.emq_first_duplicate(ptrs, lens, len(items), order))

    assert first_duplicate([]) == -1
    assert first_duplicate([b"a"]) == -1
    assert first_duplicate([b"a", b"ab", b"", b"b", b"\x00"]) == -1
    assert first_duplicate([b"a", b"a\x00"]) == -1  # lengths count, not C strings
    for _ in range(300):
        items = list({bytes(rng.choices(b"ab\x00", k=rng.randint(0, 4))) for _ in range(rng.randint(0, 30))})
        assert first_duplicate(items) == -1
        if items:
            twin = rng.randrange(len(items))
            items.insert(rng.randint(0, len(items)), items[twin])
            found = first_duplicate(items)
            assert found >= 0 and items.count(items[found]) == 2


def test_every_new_error_is_documented() -> None:
    from .test_core_cffi import REFERENCE

    for text in (DELAY_ERR, DELAY_BIG, AT_ERR, AT_BIG, BOTH, COUNT_ERR, COUNT_BIG, DUPLICATE,
                 "ERR BLOCK must be an integer >= 0 (0 waits forever)",
                 "ERR BLOCK is too large: the wait would not end at an exact time"):  # fmt: skip
        assert f"-{text}" in REFERENCE, text


# -- the blocking plan (sans I/O) -------------------------------------------------------------


def test_blocking_plan_without_a_socket_timeout_is_one_wait() -> None:
    plan = proto.BlockingClaim(30_000, None, now=100.0)
    assert plan.next_wait(100.0) == 30_000
    assert plan.ended(30_000, 100.0, 130.0) is False
    assert plan.next_wait(130.001) is None
    forever = proto.BlockingClaim(0, None, now=0.0)
    assert forever.next_wait(0.0) == 0 and forever.ended(0, 0.0, 99.0) is True


def test_blocking_plan_cuts_waits_below_the_socket_timeout() -> None:
    plan = proto.BlockingClaim(10_000, 5.0, now=0.0)
    assert plan.limit_ms == 4_000
    assert plan.next_wait(0.0) == 4_000
    assert not plan.ended(4_000, 0.0, 4.001)
    assert plan.next_wait(4.001) == 4_000
    assert plan.next_wait(8.002) == 1_998
    assert plan.next_wait(9.9996) == 1  # never ends early: what is left is rounded up
    assert plan.next_wait(10.0) is None
    # A null long before the wait was up: the server ended it (CLIENT UNBLOCK).
    assert plan.ended(4_000, 0.0, 0.5)
    forever = proto.BlockingClaim(0, 1.0, now=0.0)
    assert forever.limit_ms == 750 and forever.next_wait(50.0) == 750  # at least 250 ms early
    assert proto.BlockingClaim(1, 5.0, now=0.0).next_wait(1.0) == 1  # the first wait is always sent
    with pytest.raises(ValueError, match="socket_timeout"):
        proto.BlockingClaim(1_000, 0.25, now=0.0)
    with pytest.raises(ValueError, match="block_ms"):
        proto.BlockingClaim(-1, None, now=0.0)


def test_socket_timeout_of_each_client_kind(server: EmbeddedServer) -> None:
    import redis.asyncio as aioredis

    assert proto.socket_timeout_of(redis.Redis(port=server.port, socket_timeout=None)) is None
    assert proto.socket_timeout_of(redis.Redis(port=server.port, socket_timeout=2.5)) == 2.5
    assert proto.socket_timeout_of(aioredis.Redis(port=server.port, socket_timeout=3)) == 3.0
    # A cluster client keeps only the arguments it was given: without one, redis-py's default.
    from redis.cluster import RedisCluster

    assert proto._default_socket_timeout(RedisCluster) == proto._default_socket_timeout(redis.Redis)


def test_enqueue_many_halves_its_calls_below_the_servers_max_limit(server_factory: ServerFactory) -> None:
    srv = server_factory()
    r = srv.client()
    try:
        r.config_set("emq.max-limit", 3)
    except redis.ResponseError:
        pytest.skip("this server has no module configs (emq.max-limit is fixed at load)")
    with pytest.raises(redis.ResponseError, match=r"count exceeds the server's emq\.max-limit"):
        many(r, ("a", "1"), ("b", "2"), ("c", "3"), ("d", "4"))
    client = echomq.Client(r)
    r.config_resetstat()
    ids = client.enqueue_many("q", [(f"j{i}", b"") for i in range(10)], delay_ms=0)
    assert ids == [f"j{i}" for i in range(10)] and queued(r, Q) == 10
    # 10 refused -> 5 refused -> 2 + 3, then 5 refused -> 2 + 3: seven calls, three refused
    assert r.info("commandstats")["cmdstat_emq.enqueuemany"]["calls"] == 7
    import asyncio

    async def main() -> None:
        c = aemq.Client(_aio(srv))
        assert len(await c.enqueue_many("q2", [b""] * 7)) == 7
        await c.aclose()

    asyncio.run(main())
    assert r.llen(queue_keys("q2").pending) == 7
    r.close()
    srv.stop()
