"""The lease keeper, the reaper and the worker, against a real server."""

from __future__ import annotations

import threading
import time

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..helpers import entries, now_ms, queued

pytestmark = pytest.mark.backends  # every test once with the module, once with the scripts

Q = "jobs"
K = queue_keys(Q)


def wait_until(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


# -- LeaseKeeper -----------------------------------------------------------------


def test_keeper_checkpoints_a_live_job(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="j")
    job = client.claim(Q, lease_ms=300)
    assert job is not None
    cancel = echomq.CancelToken()
    with echomq.LeaseKeeper(client, job, 300, cancel, interval=0.05) as keeper:
        time.sleep(0.6)  # twice the lease: without checkpoints it would have lapsed
        assert client.sweep(Q) == echomq.SweepResult()
        score = r.zscore(K.active, "j")
        assert score is not None and score > now_ms(r)
    assert keeper.extends >= 3 and keeper.lost is None and cancel.check() is None


def test_keeper_cancels_when_the_sweep_took_the_job(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="j")
    job = client.claim(Q, lease_ms=60_000)
    assert job is not None
    cancel = echomq.CancelToken()
    with echomq.LeaseKeeper(client, job, 60_000, cancel, interval=0.05) as keeper:
        for _ in range(50):  # the keeper may re-score the job between the two: lapse it again
            r.zadd(K.active, {"j": 0})
            if client.sweep(Q, max_stalled=5).recovered == ["j"]:
                break
        else:
            raise AssertionError("the keeper re-scored the job before every sweep")
        assert wait_until(lambda: cancel.check() is not None)
    c = cancel.check()
    assert c is not None and c.reason is not None and "stale" in c.reason
    assert keeper.lost == c.reason
    assert entries(r, K) == [b"j"] and not r.exists(K.active)  # the keeper did not resurrect it


def test_keeper_cancels_when_the_row_is_gone(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="j")
    job = client.claim(Q, lease_ms=60_000)
    assert job is not None
    cancel = echomq.CancelToken()
    with echomq.LeaseKeeper(client, job, 60_000, cancel, interval=0.05):
        r.delete(K.job("j"))
        assert wait_until(lambda: cancel.check() is not None)
    c = cancel.check()
    assert c is not None and "gone" in str(c.reason)


def test_keeper_cancels_at_the_deadline_when_the_server_is_unreachable(
    server_factory: ServerFactory, backend: str
) -> None:
    server = server_factory(load_module=backend == "module")
    client = echomq.Client(server.client(socket_timeout=0.2, socket_connect_timeout=0.2))
    client.enqueue(Q, job_id="j")
    claimed_at = time.monotonic()
    job = client.claim(Q, lease_ms=400)
    assert job is not None
    cancel = echomq.CancelToken()
    with echomq.LeaseKeeper(client, job, 400, cancel, interval=0.1, claimed_at=claimed_at):
        server.stop()
        assert wait_until(lambda: cancel.check() is not None, timeout=5)
        lost_at = time.monotonic()
    c = cancel.check()
    assert c is not None and "deadline" in str(c.reason)
    assert lost_at >= claimed_at + 0.4  # not before the lease could have lapsed


# -- Reaper ----------------------------------------------------------------------


def test_reaper_recovers_in_the_background_and_drains(r: redis.Redis, client: echomq.Client) -> None:
    for i in range(25):
        r.zadd(K.active, {f"j{i}": i})
        r.hset(K.job(f"j{i}"), mapping={"attempts": 1, "state": "active"})
    seen: list[echomq.SweepResult] = []
    with echomq.Reaper(client, Q, interval=0.05, max_stalled=2, limit=10, on_sweep=seen.append) as reaper:
        assert wait_until(lambda: reaper.recovered == 25)
    assert queued(r, K) == 25 and not r.exists(K.active)
    assert seen and sum(len(s) for s in seen) == 25
    assert reaper.errors == 0


def test_two_reapers_never_double_count(r: redis.Redis, server: EmbeddedServer) -> None:
    for i in range(200):
        r.zadd(K.active, {f"j{i}": i})
    a = echomq.Reaper(echomq.Client(server.client()), Q, interval=0.01, max_stalled=9, limit=7)
    b = echomq.Reaper(echomq.Client(server.client()), Q, interval=0.01, max_stalled=9, limit=7)
    with a, b:
        assert wait_until(lambda: a.recovered + b.recovered == 200)
    assert {r.hget(K.job(f"j{i}"), "stalled") for i in range(200)} == {b"1"}


# -- Worker ----------------------------------------------------------------------


def test_worker_completes_jobs(r: redis.Redis, client: echomq.Client) -> None:
    ids = [client.enqueue(Q, f"n={i}") for i in range(20)]
    seen: list[bytes] = []
    lock = threading.Lock()

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        with lock:
            seen.append(job.payload)

    worker = echomq.Worker(client, Q, handler, lease_ms=5000, concurrency=3, poll_interval=0.01).start()
    assert wait_until(lambda: worker.stats.completed == 20)
    worker.stop()
    assert sorted(seen) == sorted(f"n={i}".encode() for i in range(20))
    assert {r.hget(K.job(i), "state") for i in ids} == {b"done"}
    assert not r.exists(K.active) and not r.exists(K.pending)


def test_worker_fails_then_dead_letters(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="bad")

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        raise ValueError(f"cannot handle attempt {job.attempt}")

    worker = echomq.Worker(client, Q, handler, lease_ms=5000, max_attempts=2, poll_interval=0.01).start()
    assert wait_until(lambda: worker.stats.failed == 2)
    worker.stop()
    row = r.hgetall(K.job("bad"))
    assert row[b"state"] == b"dead" and row[b"attempts"] == b"2" and row[b"tries"] == b"2"
    assert row[b"closed_by"] == b"fail:dead"
    assert row[b"last_error"] == b"ValueError: cannot handle attempt 2"
    assert r.hget(K.metrics_failed, "count") == b"1"


def test_worker_stop_cancels_running_handlers(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="long")
    started = threading.Event()
    reasons: list[str | None] = []

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        started.set()
        c = cancel.sleep(30)
        reasons.append(c.reason if c else None)
        cancel.raise_if_cancelled()

    worker = echomq.Worker(client, Q, handler, lease_ms=5000, max_attempts=3, poll_interval=0.01).start()
    assert started.wait(10)
    worker.stop(grace=0)
    assert reasons == ["shutdown"]
    # Stopped by a shutdown, the job is given back without using an attempt (RELEASE).
    row = r.hgetall(K.job("long"))
    assert row[b"state"] == b"pending" and row[b"tries"] == b"0" and row[b"closed_by"] == b"release:pending"
    assert b"last_error" not in row
    assert worker.stats.released == 1 and worker.stats.failed == 0


def test_worker_never_completes_a_job_whose_lease_it_lost(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, job_id="j")
    running = threading.Event()
    release = threading.Event()

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        running.set()
        release.wait(10)  # does not check its token: the worker must still not complete

    worker = echomq.Worker(client, Q, handler, lease_ms=60_000, extend_interval=0.05, poll_interval=0.01)
    t = threading.Thread(target=worker.work_one)
    t.start()
    assert running.wait(10)
    r.zadd(K.active, {"j": 0})
    assert client.sweep(Q, max_stalled=5).recovered == ["j"]
    time.sleep(0.2)  # let the keeper notice
    release.set()
    t.join(10)
    assert worker.stats.leases_lost == 1 and worker.stats.completed == 0
    assert r.hget(K.job("j"), "state") == b"pending" and entries(r, K) == [b"j"]


@pytest.mark.parametrize("concurrency", [0, -1])
def test_worker_validates(client: echomq.Client, concurrency: int) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        echomq.Worker(client, Q, lambda job, cancel: None, concurrency=concurrency)
