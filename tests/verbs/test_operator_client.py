"""The operator's Python surface (issue 13): job(), counts(), dead(), the
bulk loops, both clients, and the CLI commands."""

from __future__ import annotations

import asyncio
import io
import time

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq.cli import main
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer, queue_problems

from ..helpers import now_ms

Q = queue_keys("q")


def make_dead(client: echomq.Client, job_id: str, error: str = "boom") -> None:
    client.enqueue("q", b"p", job_id=job_id)
    job = client.claim("q", lease_ms=60_000)
    assert job is not None and job.id == job_id
    assert client.fail("q", job.id, job.token, error, max_attempts=1) == "dead"


def test_job_reads_every_state(client: echomq.Client, r: redis.Redis) -> None:
    assert client.job("q", "nope") is None
    client.enqueue("q", b"hello", job_id="j")
    info = client.job("q", "j")
    assert info is not None
    assert (info.state, info.attempts, info.tries, info.retries, info.stalled) == ("pending", 0, 0, 0, 0)
    assert info.payload_size == 5 and info.payload is None
    assert info.enqueued_at is not None and abs(info.enqueued_at - info.server_time) < 5_000
    assert info.lease_deadline is None and info.due_at is None and info.dead_at is None
    assert info.expires_at is None and info.checkpoint_size is None and not info.cancel_requested
    with_payload = client.job("q", "j", payload=True)
    assert with_payload is not None and with_payload.payload == b"hello"

    job = client.claim("q", lease_ms=30_000)
    assert job is not None
    client.cancel("q", "j", reason="stop")
    info = client.job("q", "j")
    assert info is not None and info.state == "active" and info.attempts == 1 and info.tries == 1
    assert info.lease_deadline is not None and info.lease_left_ms is not None
    assert 20_000 < info.lease_left_ms <= 30_000
    assert info.claimed_at is not None and info.cancel_requested and info.cancel_reason == "stop"

    r.hset(Q.job("j"), mapping={"checkpoint": b"state!", "checkpoint_at": 123, "checkpoint_attempt": 1})
    info = client.job("q", "j")
    assert info is not None and (info.checkpoint_size, info.checkpoint_at, info.checkpoint_attempt) == (
        6,
        123,
        1,
    )

    assert client.fail("q", "j", job.token, "it broke", max_attempts=3) == "cancelled"
    info = client.job("q", "j")
    assert info is not None and info.state == "cancelled" and info.last_error == "it broke"
    assert info.finished_at is not None and info.expires_at is not None
    assert 0 < info.expires_at - info.server_time <= 86_400_000

    make_dead(client, "d", "kaput")
    info = client.job("q", "d")
    assert (
        info is not None and info.state == "dead" and info.dead_at is not None and info.last_error == "kaput"
    )

    r.zadd(Q.delayed, {"later": now_ms(r) + 60_000})  # a delayed job
    r.hset(Q.job("later"), mapping={"state": "pending", "attempts": "x"})  # tolerant of odd fields
    info = client.job("q", "later")
    assert (
        info is not None and info.due_at is not None and info.due_at > info.server_time and info.attempts == 0
    )


def test_counts(client: echomq.Client, r: redis.Redis) -> None:
    empty = client.counts("q")
    assert empty == echomq.QueueCounts(0, 0, 0, 0, 0, False, 0, empty.server_time, {}, 0)
    make_dead(client, "d")
    for i in range(3):
        client.enqueue("q", b"x", job_id=f"w{i}")
    held = client.claim("q", lease_ms=60_000)
    assert held is not None
    r.zadd(Q.delayed, {"later": now_ms(r) + 60_000})
    r.hset(Q.job("later"), "state", "pending")
    r.zadd(Q.active, {"lapsed": 1})
    r.hset(Q.job("lapsed"), "state", "active")
    client.pause("q")
    counts = client.counts("q")
    assert (counts.pending, counts.delayed, counts.active, counts.lapsed, counts.dead) == (2, 1, 2, 1, 1)
    assert counts.paused and counts.failed == 1
    assert counts.by_priority == {0: 2} and counts.stale == 0


def test_dead_pages_oldest_first_with_errors(client: echomq.Client, r: redis.Redis) -> None:
    for i in range(5):
        make_dead(client, f"d{i}", f"error {i}")
        time.sleep(0.002)
    page = client.dead("q", count=2)
    assert [(j.id, j.last_error, j.attempts, j.tries, j.retries) for j in page] == [
        ("d0", "error 0", 1, 1, 0),
        ("d1", "error 1", 1, 1, 0),
    ]
    assert page[0].died_at < page[1].died_at <= now_ms(r)
    assert [j.id for j in client.dead("q", offset=2, count=10)] == ["d2", "d3", "d4"]
    assert client.dead("q", offset=5) == []
    with pytest.raises(ValueError, match="offset"):
        client.dead("q", offset=-1)
    with pytest.raises(ValueError, match="count"):
        client.dead("q", count=0)


def test_the_asyncio_client_has_the_same_operator_surface(server: EmbeddedServer, r: redis.Redis) -> None:
    async def scenario() -> None:
        client = emq.Client.from_url(server.url)
        try:
            assert await client.retention("q", done_ms=1000) == echomq.Retention(1000, 86_400_000, -1)
            for i in range(3):
                await client.enqueue("q", b"x", job_id=f"j{i}")
                job = await client.claim("q", lease_ms=60_000)
                assert job is not None
                await client.fail("q", job.id, job.token, "no", max_attempts=1)
            assert [j.id for j in await client.dead("q")] == ["j0", "j1", "j2"]
            info = await client.job("q", "j0")
            assert info is not None and info.state == "dead"
            await client.retry("q", "j0")
            with pytest.raises(echomq.NotRetryable):
                await client.retry("q", "j0")
            assert await client.retry_dead("q", limit=1) == echomq.RetryDeadResult(2, 0)
            assert await client.pause("q") and not await client.pause("q")
            assert await client.claim("q", lease_ms=1000) is None
            assert (await client.counts("q")).paused
            assert await client.resume("q")
            job = await client.claim("q", lease_ms=60_000)
            assert job is not None
            await client.fail("q", job.id, job.token, "no", max_attempts=1)
            assert await client.purge_dead("q", limit=1) == 1
            assert await client.claim("q", lease_ms=60_000) is not None
            with pytest.raises(echomq.QueueBusy):
                await client.obliterate("q")
            result = await client.obliterate("q", force=True)
            assert result.removed == 2
        finally:
            await client.aclose()

    asyncio.run(scenario())
    assert not r.exists(Q.pending, Q.active, Q.dead, Q.meta)


# -- the CLI -------------------------------------------------------------------


def run(server: EmbeddedServer, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["--url", server.url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_job_dead_retry_purge(
    client: echomq.Client, r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    make_dead(client, "a", "first error")
    make_dead(client, "b", "second error")
    make_dead(client, "c", "third error")
    code, out, _ = run(server, capsys, "job", "q", "a", "--payload")
    assert code == 0 and "state            dead" in out and "first error" in out and "died" in out
    assert out.rstrip().endswith("p")  # the payload
    code, _, err = run(server, capsys, "job", "q", "nope")
    assert code == 1 and "no job 'nope'" in err

    code, out, _ = run(server, capsys, "dead", "q", "--limit", "2")
    assert code == 0 and "dead 3 in queue q" in out and "first error" in out and "third error" not in out

    code, out, err = run(server, capsys, "retry", "q", "a", "nope")
    assert code == 1 and "a: pending" in out and "nope: no such job" in err
    code, _, err = run(server, capsys, "retry", "q", "a")
    assert code == 1 and "not retried" in err and "pending" in err
    code, _, err = run(server, capsys, "retry", "q")
    assert code == 2 or "--all" in err
    code, out, _ = run(server, capsys, "retry", "q", "--all", "--limit", "1")
    assert code == 0 and "retried 2 dead jobs" in out

    for _ in range(3):
        job = client.claim("q", lease_ms=60_000)
        assert job is not None
        client.fail("q", job.id, job.token, "x", max_attempts=1)
    code, _, err = run(server, capsys, "purge", "q")
    assert code == 1 and "--dead" in err
    code, out, _ = run(server, capsys, "purge", "q", "--dead")
    assert code == 0 and "purged 3 dead jobs" in out
    assert queue_problems(r, "q") == []


def test_cli_pause_resume_retention_and_inspect(
    client: echomq.Client, r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client.enqueue("q", b"x", job_id="w")
    client.enqueue("q", b"x", job_id="later", delay_ms=60_000)
    code, out, _ = run(server, capsys, "pause", "q")
    assert code == 0 and out.startswith("paused")
    code, out, _ = run(server, capsys, "pause", "q")
    assert "already paused" in out
    code, out, _ = run(server, capsys, "inspect", "q")
    assert code == 0 and "PAUSED" in out and "delayed 1" in out and "paused yes" in out
    assert "pending 1   active 0   dead 0   dead-lettered ever 0" in out
    code, out, _ = run(server, capsys, "resume", "q")
    assert code == 0 and out.startswith("resumed")
    code, out, _ = run(server, capsys, "inspect", "q")
    assert "PAUSED" not in out and "paused no" in out

    code, out, _ = run(server, capsys, "retention", "q")
    assert out.strip() == "done 3600000 ms   cancelled 86400000 ms   dead forever"
    code, out, _ = run(server, capsys, "retention", "q", "--done", "0", "--dead", "5000")
    assert out.strip() == "done not kept   cancelled 86400000 ms   dead 5000 ms"
    code, _, err = run(server, capsys, "retention", "q", "--done", "-5")
    assert code == 1 and "done_ms" in err


def test_cli_obliterate_asks_first(
    client: echomq.Client,
    r: redis.Redis,
    server: EmbeddedServer,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client.enqueue("q", b"x", job_id="w")
    held = client.claim("q", lease_ms=60_000)
    assert held is not None
    client.enqueue("q", b"x", job_id="w2")
    monkeypatch.setattr("sys.stdin", io.StringIO("no\n"))
    code, out, err = run(server, capsys, "obliterate", "q")
    assert code == 1 and "type the queue name" in out and "nothing deleted" in err
    assert r.exists(Q.job("w2"))
    monkeypatch.setattr("sys.stdin", io.StringIO("q\n"))
    code, _, err = run(server, capsys, "obliterate", "q")
    assert code == 1 and "active jobs" in err and "--force" in err
    assert r.exists(Q.job("w2")) and not r.exists(Q.meta)  # refused: nothing written
    code, out, _ = run(server, capsys, "obliterate", "q", "--force", "--yes")
    assert code == 0 and "obliterated q: 2 jobs" in out
    assert not r.exists(Q.job("w"), Q.job("w2"), Q.pending, Q.active)
