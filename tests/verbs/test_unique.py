"""Unique jobs (issue 31; docs/concepts/unique.md): ENQUEUE ... UNIQUE <key> [FOR <ms> | UNTIL done]
[REPLACE], on both backends.

The key ``<base>unique:<key>`` names the job holding it.  UNTIL done (the default): held while
the job is pending or active, released in the same step as the job ends, whichever way it
ends -- never left behind (the Sidekiq #6890 bug).  FOR: a throttle window with an expiry,
whatever the job does.  REPLACE: a pending holder gets the newest payload.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis

import echomq
import echomq.asyncio as aemq
from echomq import _protocol as proto
from echomq.cli import main
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer, queue_problems

from ..conftest import needs
from ..helpers import digest

pytestmark = [pytest.mark.backends, pytest.mark.memcheck]


def ukey(queue: str, key: str) -> str:
    return queue_keys(queue).base + "unique:" + key


def send(client: echomq.Client, *args: object) -> object:
    keys = queue_keys("q")
    return client._send(("EMQ.ENQUEUE", keys.pending, keys.base, *args))


def test_a_second_enqueue_with_the_key_answers_the_holder_and_adds_nothing(
    r: redis.Redis, client: echomq.Client
) -> None:
    first = client.enqueue("q", b"one", "a", unique_key="k")
    assert (first, first.created, first.replaced) == ("a", True, False)
    assert isinstance(first, str) and first.id == "a" and type(first.id) is str
    before = digest(r)
    second = client.enqueue("q", b"two", "b", unique_key="k")
    assert (second, second.created, second.replaced) == ("a", False, False)
    assert digest(r) == before  # nothing written
    assert r.get(ukey("q", "k")) == b"a"
    assert r.ttl(ukey("q", "k")) == -1  # UNTIL done: no expiry
    assert r.hget(queue_keys("q").job("a"), "unique") == b"k"
    assert not r.exists(queue_keys("q").job("b"))
    assert client.counts("q").pending == 1
    other = client.enqueue("q", b"", "c", unique_key="other")
    assert other.created and client.counts("q").pending == 2
    plain = client.enqueue("q", b"", "d")
    assert plain.created and not plain.replaced
    assert queue_problems(r, "q") == []


def test_the_reply_says_created_held_or_replaced_and_plain_enqueue_keeps_its_reply(
    r: redis.Redis, client: echomq.Client
) -> None:
    assert send(client, "p", b"x") == 1
    assert send(client, "a", b"x", "UNIQUE", "k") == [1, b"a"]
    assert send(client, "b", b"y", "unique", "k") == [0, b"a"]
    assert send(client, "b", b"y", "UNIQUE", "k", "REPLACE") == [2, b"a"]
    assert send(client, "b", b"y", "UNTIL", "DONE", "UNIQUE", "k") == [0, b"a"]
    assert send(client, "b", b"y", "REPLACE", "until", "done", "UNIQUE", "k") == [2, b"a"]
    assert r.hget(queue_keys("q").job("a"), "payload") == b"y"
    # a retry of the creating call (its REQ record exists) answers as the first call did
    assert send(client, "r", b"x", "UNIQUE", "k2", "REQ", "req-1") == [1, b"r"]
    assert send(client, "r", b"x", "UNIQUE", "k2", "REQ", "req-1") == [1, b"r"]
    # the id is checked after the key: an id that exists, with a free key, is refused
    with pytest.raises(redis.ResponseError, match="EMQEXISTS"):
        send(client, "p", b"x", "UNIQUE", "k3")
    assert not r.exists(ukey("q", "k3"))


@pytest.mark.parametrize("size", [10, 64, 65, 700, 2000])
def test_replace_gives_a_pending_holder_the_newest_payload(
    r: redis.Redis, client: echomq.Client, size: int
) -> None:
    client.enqueue("q", b"a" * 900, "a", unique_key="k")
    got = client.enqueue("q", b"b" * size, unique_key="k", replace=True)
    assert (got, got.created, got.replaced) == ("a", False, True)
    assert client.job("q", "a", payload=True).payload == b"b" * size  # type: ignore[union-attr]
    assert client.claim("q", 60_000).payload == b"b" * size  # type: ignore[union-attr]
    assert queue_problems(r, "q") == []


def test_replace_leaves_an_active_holder_alone(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"old", "a", unique_key="k")
    job = client.claim("q", 60_000)
    assert job is not None
    before = digest(r)
    got = client.enqueue("q", b"new", "b", unique_key="k", replace=True)
    assert (got, got.created, got.replaced) == ("a", False, False)
    assert digest(r) == before
    client.complete("q", job.id, job.token)
    assert not r.exists(ukey("q", "k"))
    again = client.enqueue("q", b"new", "b", unique_key="k", replace=True)
    assert again == "b" and again.created


def _ends(client: echomq.Client, r: redis.Redis, how: str) -> None:
    """End (or delete) job "a", which holds the key, the way named."""
    q = "q"
    if how == "cancel-pending":
        assert client.cancel(q, "a") == "cancelled"
        return
    if how in ("forget-pending", "obliterate"):
        if how == "obliterate":
            assert client.obliterate(q).removed == 1
        else:  # FORGET deletes only ended rows: cancel first, then forget
            client.cancel(q, "a")
            client._run(proto.forget(q, ["a"]))
        return
    job = client.claim(q, 60_000)
    assert job is not None and job.id == "a"
    if how == "complete":
        client.complete(q, "a", job.token)
    elif how == "complete-claim":
        client._run(proto.complete_claim(q, "a", job.token, 60_000))
    elif how == "fail-dead":
        client.fail(q, "a", job.token, "E: x", max_attempts=1)
    elif how == "fail-dead-flag":
        client.fail(q, "a", job.token, "E: x", dead=True)
    elif how == "cancel-active-fail":
        client.cancel(q, "a")
        client.fail(q, "a", job.token, "E: x", max_attempts=5)
    elif how == "cancel-active-release":
        client.cancel(q, "a")
        assert client.release(q, "a", job.token) == "cancelled"
    elif how == "sweep-cancelled":
        client.cancel(q, "a")
        r.zadd(queue_keys(q).active, {"a": 0}, xx=True)  # the lease lapses, its cancel requested
        assert client.sweep(q, max_stalled=5).cancelled == ["a"]
    elif how == "sweep-dead":
        r.zadd(queue_keys(q).active, {"a": 0}, xx=True)  # the lease lapses
        assert client.sweep(q, max_stalled=1).dead == ["a"]
    elif how == "purge":
        client.fail(q, "a", job.token, "E: x", dead=True)
        assert client.purge_dead(q) == 1
    elif how == "done-retention":
        client.retention(q, done_ms=0)
        client.complete(q, "a", job.token)
    else:
        raise AssertionError(how)


ENDS = [
    "complete",
    "complete-claim",
    "fail-dead",
    "fail-dead-flag",
    "cancel-pending",
    "cancel-active-fail",
    "cancel-active-release",
    "sweep-cancelled",
    "sweep-dead",
    "forget-pending",
    "purge",
    "obliterate",
    "done-retention",
]


@pytest.mark.parametrize("how", ENDS)
def test_the_key_is_released_however_its_job_ends(r: redis.Redis, client: echomq.Client, how: str) -> None:
    client.enqueue("q", b"", "a", unique_key="k")
    assert r.get(ukey("q", "k")) == b"a"
    _ends(client, r, how)
    assert not r.exists(ukey("q", "k")), how
    assert [k for k in r.scan_iter(match=ukey("q", "*"))] == []
    if how != "obliterate":
        assert queue_problems(r, "q") == []
    again = client.enqueue("q", b"", "b", unique_key="k")
    assert again == "b" and again.created


def test_the_key_stays_while_the_job_comes_back_to_waiting(r: redis.Redis, client: echomq.Client) -> None:
    """A retry (FAIL below its budget), a RELEASE and a SWEEP recovery do not end the job."""
    client.enqueue("q", b"", "a", unique_key="k")
    job = client.claim("q", 60_000)
    assert job is not None
    client.fail("q", "a", job.token, "E: x", max_attempts=5)
    assert r.get(ukey("q", "k")) == b"a"
    job = client.claim("q", 60_000)
    assert job is not None
    client.release("q", "a", job.token)
    assert r.get(ukey("q", "k")) == b"a"
    job = client.claim("q", 60_000)
    assert job is not None
    r.zadd(queue_keys("q").active, {"a": 0}, xx=True)
    client.sweep("q", max_stalled=5)
    assert r.get(ukey("q", "k")) == b"a"
    assert client.enqueue("q", b"", "b", unique_key="k").created is False


def test_for_is_a_window_whatever_the_job_does(r: redis.Redis, client: echomq.Client) -> None:
    first = client.enqueue("q", b"", "a", unique_key="k", unique_for_ms=60_000)
    assert first.created
    assert 0 < r.pttl(ukey("q", "k")) <= 60_000
    job = client.claim("q", 60_000)
    assert job is not None
    client.complete("q", "a", job.token)
    assert r.get(ukey("q", "k")) == b"a"  # the window outlives the job's end
    held = client.enqueue("q", b"", "b", unique_key="k")
    assert (held, held.created) == ("a", False)
    client._run(proto.forget("q", ["a"]))  # deleting the row takes the window with it
    assert not r.exists(ukey("q", "k"))
    assert client.enqueue("q", b"", "b", unique_key="k", unique_for_ms=1).created


@pytest.mark.parametrize("end", ["done", "cancelled"])
def test_a_for_window_outlives_a_row_its_retention_of_0_deletes(
    r: redis.Redis, client: echomq.Client, end: str
) -> None:
    """A done or cancelled retention of 0 deletes the row in the step that ends the job, but that
    is the job ending, not a verb deleting a row: the FOR window runs to its expiry
    (docs/reference/commands/enqueue.md and docs/reference/keyspace.md say so in the same words).
    The dead retention is SWEEP's, which deletes the row and takes the window with it."""
    client.retention("q", done_ms=0, dead_ms=0, cancelled_ms=0)
    client.enqueue("q", b"", "a", unique_key="k", unique_for_ms=60_000)
    job = client.claim("q", 60_000)
    assert job is not None
    if end == "done":
        client.complete("q", "a", job.token)
    else:
        client.cancel("q", "a")
        assert client.fail("q", "a", job.token, "E: stopped") == "cancelled"
    assert not r.exists(queue_keys("q").job("a"))  # the row went with the end
    assert r.get(ukey("q", "k")) == b"a" and 0 < r.pttl(ukey("q", "k")) <= 60_000
    held = client.enqueue("q", b"", "b", unique_key="k")
    assert (held, held.created) == ("a", False)  # held by a job that has no row, until the expiry
    assert queue_problems(r, "q") == []  # a window with an expiry is no orphan


def test_the_dead_retention_of_0_takes_a_for_window_at_the_next_sweep(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.retention("q", dead_ms=0)
    client.enqueue("q", b"", "a", unique_key="k", unique_for_ms=60_000)
    job = client.claim("q", 60_000)
    assert job is not None
    assert client.fail("q", "a", job.token, "E: boom", max_attempts=1) == "dead"
    assert r.get(ukey("q", "k")) == b"a"  # dead, its row kept until a sweep applies the retention
    client.sweep("q", max_stalled=5)
    assert not r.exists(queue_keys("q").job("a")) and not r.exists(ukey("q", "k"))
    assert client.enqueue("q", b"", "b", unique_key="k").created


def test_a_for_window_ends_at_its_expiry(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue("q", b"", "a", unique_key="k", unique_for_ms=60_000)
    r.pexpire(ukey("q", "k"), 1)  # the window's end, without a wait
    while r.exists(ukey("q", "k")):
        pass
    got = client.enqueue("q", b"", "b", unique_key="k")
    assert got == "b" and got.created  # the first job still waits: a throttle, not a lock


def test_an_orphan_key_is_reported_and_taken_over(r: redis.Redis, client: echomq.Client) -> None:
    r.set(ukey("q", "k"), "ghost")  # names no job: left by hand or by a lost write
    client.enqueue("q", b"", "done-one", unique_key="k2")
    job = client.claim("q", 60_000)
    assert job is not None
    client.complete("q", job.id, job.token)
    r.set(ukey("q", "k2"), "done-one")  # names a job that ended
    problems = queue_problems(r, "q")
    assert any("unique" in p and "ghost" in p for p in problems), problems
    assert any("unique" in p and "done-one" in p for p in problems), problems
    assert client.enqueue("q", b"", "a", unique_key="k").created
    assert client.enqueue("q", b"", "b", unique_key="k2").created
    assert r.get(ukey("q", "k")) == b"a"
    assert queue_problems(r, "q") == []


def test_twenty_concurrent_enqueuers_of_one_key_make_one_job(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer
) -> None:
    url = server.url
    results: list[echomq.Enqueued] = []
    lock = threading.Lock()
    start = threading.Barrier(20)

    def enqueue(i: int) -> None:
        own = echomq.Client.from_url(url)
        start.wait()
        got = own.enqueue("q", f"{i}".encode(), f"job-{i}", unique_key="one")
        own.close()
        with lock:
            results.append(got)

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    created = [x for x in results if x.created]
    assert len(results) == 20 and len(created) == 1
    assert {str(x) for x in results} == {str(created[0])}
    assert client.counts("q").pending == 1
    assert r.get(ukey("q", "one")) == created[0].encode()


BAD = [
    (("UNIQUE", ""), "the UNIQUE key must be 1 to 512 bytes long"),
    (("UNIQUE", "x" * 513), "the UNIQUE key must be 1 to 512 bytes long"),
    (("UNIQUE", "k", "FOR", "0"), "FOR must be an integer from 1 to 2592000000"),
    (("UNIQUE", "k", "FOR", "-5"), "FOR must be an integer from 1 to 2592000000"),
    (("UNIQUE", "k", "FOR", "2592000001"), "FOR must be an integer from 1 to 2592000000"),
    (("UNIQUE", "k", "FOR", "1.5"), "FOR must be an integer from 1 to 2592000000"),
    (("UNIQUE", "k", "UNTIL", "later"), "UNTIL takes only 'done'"),
    (("UNIQUE", "k", "UNTIL", "done", "FOR", "5"), "FOR and UNTIL cannot be used together"),
    (("FOR", "5", "UNIQUE", "k", "UNTIL", "done"), "FOR and UNTIL cannot be used together"),
    (("UNIQUE", "k", "UNIQUE", "j"), "syntax error"),
    (("UNIQUE", "k", "REPLACE", "REPLACE"), "syntax error"),
    (("UNIQUE", "k", "FOR", "5", "FOR", "5"), "syntax error"),
    (("UNIQUE",), "syntax error"),
    (("UNIQUE", "k", "FOR"), "syntax error"),
    (("REPLACE",), "FOR, UNTIL and REPLACE need UNIQUE <key>"),
    (("FOR", "10"), "FOR, UNTIL and REPLACE need UNIQUE <key>"),
    (("UNTIL", "done"), "FOR, UNTIL and REPLACE need UNIQUE <key>"),
]


@pytest.mark.parametrize(("options", "error"), BAD)
def test_bad_unique_options_are_refused_and_change_nothing(
    r: redis.Redis, client: echomq.Client, options: tuple[str, ...], error: str
) -> None:
    client.enqueue("q", b"", "a", unique_key="k")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match=error.replace("(", r"\(")):
        send(client, "b", b"x", *options)
    assert digest(r) == before


def test_enqueuemany_does_not_take_unique(r: redis.Redis, client: echomq.Client) -> None:
    keys = queue_keys("q")
    before = digest(r)
    refused = r"UNIQUE is for one job: EMQ\.ENQUEUEMANY does not take it"
    with pytest.raises(redis.ResponseError, match=refused):
        client._send(("EMQ.ENQUEUEMANY", keys.pending, keys.base, 1, "a", "x", "UNIQUE", "k"))
    with pytest.raises(redis.ResponseError, match="syntax error"):
        client._send(("EMQ.ENQUEUEMANY", keys.pending, keys.base, 1, "a", "x", "REPLACE"))
    assert digest(r) == before


def test_the_python_arguments_are_checked_before_anything_is_sent(client: echomq.Client) -> None:
    for kwargs, exc in (
        ({"unique_key": ""}, ValueError),
        ({"unique_key": "x" * 513}, ValueError),
        ({"unique_key": 5}, TypeError),
        ({"unique_key": "k", "unique_for_ms": 0}, ValueError),
        ({"unique_key": "k", "unique_for_ms": 2_592_000_001}, ValueError),
        ({"unique_key": "k", "unique_for_ms": True}, TypeError),
        ({"unique_for_ms": 5}, ValueError),
        ({"replace": True}, ValueError),
    ):
        with pytest.raises(exc):
            client.enqueue("q", b"", **kwargs)  # type: ignore[arg-type]
    assert client.counts("q").pending == 0


def test_a_wrong_type_at_the_key_is_refused(r: redis.Redis, client: echomq.Client) -> None:
    r.hset(ukey("q", "k"), "f", "v")
    before = digest(r)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        client.enqueue("q", b"", "a", unique_key="k")
    assert digest(r) == before


def test_asyncio_enqueue_says_the_same(r: redis.Redis, server: EmbeddedServer) -> None:
    async def main() -> None:
        aclient = aemq.Client.from_url(server.url)
        try:
            first = await aclient.enqueue("aq", b"1", "a", unique_key="k")
            second = await aclient.enqueue("aq", b"2", "b", unique_key="k", replace=True)
            assert (first, first.created) == ("a", True)
            assert (second, second.created, second.replaced) == ("a", False, True)
        finally:
            await aclient.aclose()

    asyncio.run(main())
    assert r.hget(queue_keys("aq").job("a"), "payload") == b"2"


def cli(server: EmbeddedServer, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["--url", server.url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_enqueues_unique_jobs_and_check_finds_an_orphan(
    r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(server, capsys, "enqueue", "q", "one", "--id", "a", "--unique-key", "k")
    assert (code, out.strip(), err) == (0, "a", "")
    code, out, err = cli(server, capsys, "enqueue", "q", "two", "--id", "b", "--unique-key", "k")
    assert (code, out.strip()) == (0, "a") and "nothing enqueued" in err
    code, out, err = cli(server, capsys, "enqueue", "q", "three", "--unique-key", "k", "--replace")
    assert (code, out.strip()) == (0, "a") and "payload replaced" in err
    assert r.hget(queue_keys("q").job("a"), "payload") == b"three"
    code, out, _ = cli(
        server, capsys, "enqueue", "q", "t", "--id", "c", "--unique-key", "w", "--unique-for", "5m"
    )
    assert (code, out.strip()) == (0, "c") and 299_000 < r.pttl(ukey("q", "w")) <= 300_000
    code, _, err = cli(server, capsys, "enqueue", "q", "t", "--replace")
    assert code == 1 and "need --unique-key" in err
    code, out, _ = cli(server, capsys, "check", "q")
    assert code == 0 and "no problems" in out
    r.set(ukey("q", "lost"), "ghost")
    code, out, _ = cli(server, capsys, "check", "q")
    assert code == 1 and "orphan unique key" in out and "ghost" in out


@needs("acl_keys", "ACL selectors and the module's ACL API: Redis 7.0+")
def test_the_acl_guards_the_unique_key_at_enqueue_and_at_the_end(
    server: EmbeddedServer, r: redis.Redis, backend: str
) -> None:
    """A user allowed every key of the queue but its unique keys: an enqueue with UNIQUE and the
    end of a job holding a key are refused (NOPERM, nothing written); plain enqueues run."""
    keys = queue_keys("q")
    names = ("pending", "active", "dead", "priority", "delayed", "meta", "limit", "queue")
    allowed = [f"~{keys.base}{name}" for name in names]
    rules = ["+@all", *allowed, f"~{keys.base}job:*", f"~{keys.base}req:*", f"~{keys.base}metrics:*", "&*"]
    r.execute_command("ACL", "SETUSER", "nounique", "reset", "on", ">pw", *rules)
    try:
        admin = echomq.Client(r, backend=backend)  # type: ignore[arg-type]
        admin.enqueue("q", b"x", "held", unique_key="k")
        user = echomq.Client(server.client(username="nounique", password="pw"), backend=backend)  # type: ignore[arg-type]
        before = digest(r)
        for args in (("n", b"x", "UNIQUE", "k"), ("n", b"x", "UNIQUE", "fresh")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                user._send(("EMQ.ENQUEUE", keys.pending, keys.base, *args))
        assert digest(r) == before
        assert user.enqueue("q", b"x", "plain").created
        job = user.claim("q", 60_000)
        assert job is not None and job.id == "held"
        before = digest(r)
        with pytest.raises(redis.exceptions.NoPermissionError):
            user.complete("q", job.id, job.token)
        assert digest(r) == before and r.get(ukey("q", "k")) == b"held"
        admin.complete("q", job.id, job.token)
        assert not r.exists(ukey("q", "k"))
        user.redis.close()
    finally:
        r.execute_command("ACL", "DELUSER", "nounique")
