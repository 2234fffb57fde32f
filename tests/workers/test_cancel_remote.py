"""Remote cancel: EMQ.CANCEL stores the request; EMQ.CHECKPOINT delivers it."""

from __future__ import annotations

import threading
import time

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys

from ..conftest import ServerFactory, wait_for_replica
from ..helpers import digest, entries, forged_token, now_ms

pytestmark = [pytest.mark.smoke, pytest.mark.memcheck]

Q = "remote"
K = queue_keys(Q)
CANCELLED_TTL_MS = 86_400_000  # the default cancelled retention: a day


def cancel(r: redis.Redis, job: str, reason: str = "stop") -> object:
    return r.execute_command("EMQ.CANCEL", K.pending, K.base, job, reason)


def checkpoint(r: redis.Redis, job: str, token: object, lease: object = 10_000) -> object:
    return r.execute_command("EMQ.CHECKPOINT", K.active, K.job(job), job, token, lease)


def test_cancel_pending_job_is_never_claimed(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="j")
    before = now_ms(r)
    assert cancel(r, "j", "not needed") == b"cancelled"
    after = now_ms(r)
    row = r.hgetall(K.job("j"))
    assert row[b"state"] == b"cancelled" and row[b"cancel_requested"] == b"not needed"
    assert before <= int(row[b"finished_at"]) <= after
    assert 0 < r.pttl(K.job("j")) <= CANCELLED_TTL_MS
    # Its entry stays, a tombstone counted in <base>meta's `stale`; the next claim drops it.
    assert entries(r, K) == [b"j"] and r.hget(K.meta, "stale") == b"1"
    assert client.claim(Q, lease_ms=1000) is None
    assert not r.exists(K.pending) and r.hget(K.meta, "stale") == b"0"
    assert cancel(r, "j", "again") == b"finished"  # idempotent
    assert r.hget(K.job("j"), "cancel_requested") == b"not needed"


def test_cancel_active_job_is_requested_first_reason_kept(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="j")
    job = client.claim(Q, lease_ms=10_000)
    assert job is not None
    sub = r.pubsub()
    sub.subscribe(K.base + "cancel")
    assert sub.get_message(timeout=5) is not None  # the subscribe confirmation
    assert cancel(r, "j", "first") == b"requested"
    after_first = digest(r)
    assert cancel(r, "j", "second") == b"requested"
    assert digest(r) == after_first  # asking again writes nothing
    assert r.hget(K.job("j"), "cancel_requested") == b"first"
    assert r.zscore(K.active, "j") is not None  # the holder keeps its lease
    assert b"finished_at" not in r.hgetall(K.job("j")) and r.pttl(K.job("j")) == -1
    # The first request is published on <base>cancel (the holder's workers listen); the second is not.
    message = sub.get_message(timeout=5)
    assert message is not None
    assert (message["channel"], message["data"]) == (K.base.encode() + b"cancel", b"j")
    assert sub.get_message(timeout=0.2) is None
    sub.close()


def test_cancel_unknown_and_finished(r: redis.Redis, client: echomq.Client) -> None:
    assert cancel(r, "ghost") == -1
    assert r.keys() == []
    client.enqueue(Q, job_id="j")
    job = client.claim(Q, lease_ms=10_000)
    assert job is not None
    client.complete(Q, "j", job.token)
    before = digest(r)
    assert cancel(r, "j") == b"finished"
    assert digest(r) == before


def test_checkpoint_is_extend_plus_the_request(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="j")
    job = client.claim(Q, lease_ms=1000)
    assert job is not None
    before = now_ms(r)
    assert checkpoint(r, "j", job.token, 30_000) == [1, None]
    score = r.zscore(K.active, "j")
    assert score is not None and score >= before + 30_000
    cancel(r, "j", "operator")
    assert checkpoint(r, "j", job.token) == [1, b"operator"]
    assert checkpoint(r, "missing", "1") == -1
    for stale in (forged_token(job.token), job.token.split("-")[0]):
        with pytest.raises(redis.ResponseError, match=r"^EMQSTALE extend token mismatch$"):
            checkpoint(r, "j", stale)
    with pytest.raises(redis.ResponseError, match="lease-ms"):
        checkpoint(r, "j", job.token, 0)
    with pytest.raises(redis.ResponseError, match=r"^<job> must be <base>job:<id>"):
        r.execute_command("EMQ.CHECKPOINT", K.active, K.job("other"), "j", job.token, 1000)


def test_extend_contract_unchanged_by_a_request(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="j")
    job = client.claim(Q, lease_ms=1000)
    assert job is not None
    cancel(r, "j")
    assert r.execute_command("EMQ.EXTEND", K.active, K.job("j"), "j", job.token, 1000) == 1


def test_fail_after_cancel_ends_cancelled_not_retried(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="j")
    job = client.claim(Q, lease_ms=10_000)
    assert job is not None
    client.cancel(Q, "j", "user asked")
    assert client.fail(Q, "j", job.token, "Cancelled: user asked", max_attempts=5) == "cancelled"
    assert r.hget(K.job("j"), "state") == b"cancelled"
    assert 0 < r.pttl(K.job("j")) <= CANCELLED_TTL_MS
    assert not r.exists(K.pending) and not r.exists(K.active) and not r.exists(K.metrics_failed)


def test_swept_job_with_a_request_ends_cancelled_by_the_sweep(r: redis.Redis, client: echomq.Client) -> None:
    """v2: SWEEP ends a lapsed job whose cancel was requested itself (the third
    list of its reply); it never goes back to pending, so CLAIM skips nothing."""
    client.enqueue(Q, job_id="doomed")
    client.enqueue(Q, job_id="next")
    job = client.claim(Q, lease_ms=10_000)
    assert job is not None and job.id == "doomed"
    client.cancel(Q, "doomed")
    r.zadd(K.active, {"doomed": 0})  # the holder died before its next checkpoint
    before = now_ms(r)
    assert client.sweep(Q, max_stalled=5) == echomq.SweepResult([], [], ["doomed"], 0)
    after = now_ms(r)
    row = r.hgetall(K.job("doomed"))
    assert row[b"state"] == b"cancelled" and before <= int(row[b"finished_at"]) <= after
    assert b"stalled" not in row  # not counted as a stall
    assert 0 < r.pttl(K.job("doomed")) <= CANCELLED_TTL_MS
    assert entries(r, K) == [b"next"] and not r.exists(K.active, K.dead)
    nxt = client.claim(Q, lease_ms=10_000)
    assert nxt is not None and nxt.id == "next"
    assert client.claim(Q, lease_ms=10_000) is None
    # The late holder cannot finish it.
    with pytest.raises(echomq.StaleToken):
        client.complete(Q, "doomed", job.token)


def test_client_cancel_and_checkpoint(client: echomq.Client) -> None:
    client.enqueue(Q, job_id="a")
    job = client.claim(Q, lease_ms=10_000)
    assert job is not None
    assert client.checkpoint(Q, "a", job.token, 10_000) is None
    assert client.cancel(Q, "a", None) == "requested"
    c = client.checkpoint(Q, "a", job.token, 10_000)
    assert c is not None and c.reason is None and bool(c)
    with pytest.raises(echomq.JobGone):
        client.cancel(Q, "nope")


def test_remote_cancel_reaches_a_running_handler(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="long")
    started = threading.Event()
    seen: list[str | None] = []

    def handler(job: echomq.Job, token: echomq.CancelToken) -> None:
        started.set()
        c = token.sleep(30)
        seen.append(c.reason if c else None)
        token.raise_if_cancelled()

    worker = echomq.Worker(client, Q, handler, lease_ms=600, poll_interval=0.01).start()
    assert started.wait(10)
    other_process = echomq.Client(redis.Redis(port=r.connection_pool.connection_kwargs["port"]))
    assert other_process.cancel(Q, "long", "customer withdrew") == "requested"
    deadline = time.monotonic() + 10
    while worker.stats.cancelled == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    assert seen == ["customer withdrew"]
    assert worker.stats.cancelled == 1 and worker.stats.failed == 0
    assert r.hget(K.job("long"), "state") == b"cancelled"


def test_cancel_replicates(server_factory: ServerFactory) -> None:
    master = server_factory()
    replica = server_factory(["--replicaof", master.host, str(master.port)])
    m, s = master.client(), replica.client()
    client = echomq.Client(m)
    for i in range(10):
        client.enqueue(Q, job_id=f"j{i}")
    held = [client.claim(Q, lease_ms=60_000) for _ in range(5)]
    for i in range(0, 10, 2):
        client.cancel(Q, f"j{i}", f"r{i}")
    for job in held:
        assert job is not None
        client.checkpoint(Q, job.id, job.token, 30_000)
    m.execute_command("WAIT", 1, 5000)
    wait_for_replica(m, s)
    assert digest(s) == digest(m)
