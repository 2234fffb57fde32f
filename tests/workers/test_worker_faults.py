"""The thread worker under faults (issue 23): lost replies, outages, BaseExceptions, stop() at any moment.

Each test reproduces one of the scripts in ``shared/repro/worker-faults/``
with real servers, real timeouts and real restarts, and asserts that no job
is lost, orphaned, dead-lettered without having run, or completed past its
lease, and that no thread is left behind.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import echomq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..calibration import budget
from ..conftest import ServerFactory
from ..faults import AOF, Proxy, frozen, no_echomq_threads, restart, stall, wait_until
from ..helpers import entries

ATTEMPT_TIMEOUT_S = 2.0  # echomq._runtime.ATTEMPT_TIMEOUT_S (not imported: the test runs on older code too)
Q = "faults"
K = queue_keys(Q)


def row(r: redis.Redis, job_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(K.job(job_id)).items()}


def without_retries(server: EmbeddedServer, port: int | None = None, **kwargs: object) -> redis.Redis:
    """A client redis-py does not retry for: whatever happens after a lost reply is the worker's doing."""
    return redis.Redis(port=port or server.port, retry=Retry(NoBackoff(), 0), **kwargs)  # type: ignore[arg-type]


# -- lost replies: claim, enqueue, complete -----------------------------------------


@pytest.mark.parametrize("redis_retries", [True, False], ids=["redis-py-retries", "no-redis-py-retries"])
def test_a_claim_whose_reply_was_lost_runs_its_job_once_and_never_dead_letters_it(
    server_factory: ServerFactory, redis_retries: bool
) -> None:
    # claim_retry_worker.py: a server stall longer than the socket timeout and
    # than the lease.  The job the first CLAIM took must be the one run, once,
    # and must not be swept as stalled (the reaper's default max_stalled=1 would
    # dead-letter it without it ever running).
    server = server_factory()
    admin = server.client()
    for job_id in ("A", "B", "C"):
        echomq.Client(admin).enqueue(Q, b"x", job_id=job_id)
    conn = server.client(socket_timeout=0.3) if redis_retries else without_retries(server, socket_timeout=0.3)
    client = echomq.Client(conn)
    conn.ping()
    seen: list[str] = []
    worker = echomq.Worker(
        client, Q, lambda job, cancel: seen.append(job.id), lease_ms=1000, poll_interval=0.05
    )
    with echomq.Reaper(echomq.Client(admin), Q, interval=0.2):  # max_stalled=1 by default
        stalled = stall(server, 1.5)
        time.sleep(0.1)
        worker.start()
        assert wait_until(lambda: worker.stats.completed == 3, timeout=15), worker.stats
        worker.stop()
        stalled.join()
    assert sorted(seen) == ["A", "B", "C"]  # each ran exactly once
    for job_id in ("A", "B", "C"):
        assert row(admin, job_id)["state"] == "done", row(admin, job_id)
        assert "stalled" not in row(admin, job_id)
    assert not admin.exists(K.dead)
    assert worker.stats.connection_errors >= 1  # the fault fired: a claim's try got no answer


def test_enqueue_retried_after_a_lost_reply_makes_one_job(server_factory: ServerFactory) -> None:
    # enqueue_retry.py: the client sends ENQUEUE again after the timeout (itself,
    # within its window: issue 28); the REQ's record answers the resend.
    server = server_factory()
    client = echomq.Client.from_url(server.url, socket_timeout=0.3)
    assert client.backend == "module"  # asked now, not during the stall
    warm = client.enqueue(Q, b"w")  # the connection the first try goes out on, made now
    stalled = stall(server, 1.0)
    time.sleep(0.1)
    job_id = client.enqueue(Q, b"x")
    stalled.join()
    admin = server.client()
    assert entries(admin, K) == [warm.encode(), job_id.encode()]
    assert int(admin.info("commandstats")["cmdstat_emq.enqueue"]["calls"]) >= 3  # it was sent again


def test_complete_retried_after_a_lost_reply_succeeds(server_factory: ServerFactory) -> None:
    # complete_retry.py: the retried COMPLETE answers like the first one.
    server = server_factory()
    client = echomq.Client.from_url(server.url, socket_timeout=0.3)
    client.enqueue(Q, b"x", job_id="J")
    job = client.claim(Q, 5000)
    assert job is not None
    stalled = stall(server, 1.0)
    time.sleep(0.1)
    client.complete(Q, job.id, job.token)  # no StaleToken
    stalled.join()
    assert row(server.client(), "J")["state"] == "done"
    # The fault fired: the first COMPLETE's reply was lost, and it was sent again.
    assert int(server.client().info("commandstats")["cmdstat_emq.complete"]["calls"]) >= 2


@pytest.mark.parametrize("outcome", ["complete", "fail"])
def test_a_worker_sends_the_end_of_a_job_again_until_it_lands(
    server_factory: ServerFactory, outcome: str
) -> None:
    # A lost COMPLETE (or FAIL) reply, with no redis-py retry below: the worker
    # itself sends it again, and the job is done (or failed) once.
    server = server_factory()
    admin = server.client()
    echomq.Client(admin).enqueue(Q, b"x", job_id="J")
    client = echomq.Client(without_retries(server, socket_timeout=0.3))

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        # Longer than one attempt waits for a reply (ATTEMPT_TIMEOUT_S): the
        # first COMPLETE (FAIL) goes unanswered, its connection is dropped.
        stall(server, ATTEMPT_TIMEOUT_S + 0.5)
        time.sleep(0.1)  # the end of the job is sent into the stall
        if outcome == "fail":
            raise RuntimeError("boom")

    worker = echomq.Worker(client, Q, handler, lease_ms=8000, max_attempts=3)
    assert worker.work_one()
    r = row(admin, "J")
    if outcome == "complete":
        assert r["state"] == "done" and worker.stats.completed == 1
    else:
        assert (
            r["state"] == "pending" and r["last_error"] == "RuntimeError: boom" and worker.stats.failed == 1
        )
        assert r["tries"] == "1"  # failed once, not twice
    assert worker.stats.connection_errors >= 1 and worker.stats.leases_lost == 0


# -- outages: a real restart --------------------------------------------------------


@pytest.mark.parametrize("outcome", ["complete", "fail"])
def test_a_server_restart_as_a_handler_returns_loses_nothing(
    server_factory: ServerFactory, tmp_path: Path, outcome: str
) -> None:
    # complete_outage.py, with a real restart: AOF on, SIGTERM, the same port
    # and directory.  The handler succeeded (or failed) just as the server went
    # down: its COMPLETE (FAIL) lands when the server is back, and the worker,
    # reconnected, goes on with the next job.
    server = server_factory(AOF, dir=tmp_path)
    client = echomq.Client.from_url(server.url)
    client.enqueue(Q, b"", job_id="J")
    down, restarted = threading.Event(), threading.Event()

    def bring_down_and_up() -> None:
        restart(server, down_for=0.5, on_down=down.set)
        restarted.set()

    restarter = threading.Thread(target=bring_down_and_up)

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        if job.id == "J" and job.attempt == 1:
            restarter.start()
            assert down.wait(10)  # the handler returns while the server is down
            if outcome == "fail":
                raise RuntimeError("boom")

    worker = echomq.Worker(client, Q, handler, lease_ms=4000, poll_interval=0.05).start()
    try:
        assert restarted.wait(15)
        admin = server.client()
        assert wait_until(lambda: admin.hget(K.job("J"), "state") == b"done", timeout=10), worker.stats
        echomq.Client(admin).enqueue(Q, b"", job_id="after")
        assert wait_until(lambda: admin.hget(K.job("after"), "state") == b"done", timeout=10)
    finally:
        worker.stop()
        if restarter.is_alive():  # a server it starts after the session's clean-up would outlive the tests
            restarter.join(30)
    r = row(admin, "J")
    assert r["state"] == "done"
    if outcome == "fail":  # the FAIL landed once; the retry of the job completed it
        assert r["last_error"] == "RuntimeError: boom" and r["tries"] == "2" and worker.stats.failed == 1
    else:
        assert r["tries"] == "1"
    assert "stalled" not in r and worker.stats.leases_lost == 0
    assert worker.stats.connection_errors >= 1  # the fault fired: the end met the server down
    assert no_echomq_threads() == []


# -- every exit path ------------------------------------------------------------------


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_a_handler_raising_a_base_exception_fails_its_job_and_stops_the_worker(
    server_factory: ServerFactory, exc_type: type[BaseException]
) -> None:
    # base_exc_sync.py: SystemExit used to kill the worker thread silently,
    # leaving its job active and the worker half alive.
    server = server_factory()
    admin = server.client()
    client = echomq.Client(server.client())
    client.enqueue(Q, b"", job_id="boom")
    client.enqueue(Q, b"", job_id="next")

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        if job.id == "boom":
            raise exc_type()

    worker = echomq.Worker(client, Q, handler, lease_ms=1000, poll_interval=0.05).start()
    assert wait_until(lambda: not any(t.is_alive() for t in worker._threads), timeout=5)
    boom = row(admin, "boom")
    # Issue 29: a try used (it was given back without one, and crash-looped its workers)
    assert boom["state"] == "pending" and boom["tries"] == "1"
    assert boom["last_error"].startswith(exc_type.__name__) and exc_type.__name__ in boom["traceback"]
    assert row(admin, "next")["state"] == "pending"  # the worker stopped claiming
    assert not admin.exists(K.active)
    assert worker.stats.released == 0
    worker.stop()
    assert no_echomq_threads() == []


def test_run_raises_a_handlers_system_exit_after_failing_its_job(server_factory: ServerFactory) -> None:
    server = server_factory()
    admin = server.client()
    client = echomq.Client(server.client())
    client.enqueue(Q, b"", job_id="boom")

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        raise SystemExit(3)

    for _ in (1, 2):  # each run fails it once (a try used) and stops, as sys.exit asked
        with pytest.raises(SystemExit) as info:
            echomq.Worker(client, Q, handler, lease_ms=1000, max_attempts=2, poll_interval=0.05).run()
        assert info.value.code == 3
    boom = row(admin, "boom")
    assert boom["state"] == "dead" and boom["last_error"] == "SystemExit: 3" and not admin.exists(K.active)
    assert no_echomq_threads() == []


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here, however the suite was started.

    Python installs that handler only when SIGINT was not ignored at its start, and a shell
    starts a background job with SIGINT ignored: a CI run launched with `&` inherited it.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _run_with_safety(worker: echomq.Worker, **kwargs: object) -> tuple[BaseException | None, float]:
    """worker.run() in this (main) thread; a stuck run() is stopped after 8 s so the test fails, not hangs."""
    safety = threading.Timer(8.0, worker.stop)
    safety.daemon = True
    safety.start()
    started = time.monotonic()
    try:
        worker.run(**kwargs)  # type: ignore[arg-type]
        raised: BaseException | None = None
    except BaseException as exc:  # what run() raises is the result
        raised = exc
    finally:
        safety.cancel()
    return raised, time.monotonic() - started


def test_ctrl_c_during_run_stops_gracefully_and_finishes_the_running_jobs(
    server_factory: ServerFactory, python_sigint: None
) -> None:
    # kbint_run.py: Ctrl-C during run() with concurrency 2 left run() blocking
    # for ever and one job active.
    server = server_factory()
    admin = server.client()
    client = echomq.Client(server.client())
    for i in range(2):
        client.enqueue(Q, b"", job_id=f"j{i}")
    both = threading.Barrier(3)

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        both.wait(5)
        time.sleep(0.3)

    worker = echomq.Worker(client, Q, handler, lease_ms=3000, concurrency=2, poll_interval=0.05, grace=5)
    threading.Thread(target=lambda: (both.wait(5), os.kill(os.getpid(), signal.SIGINT))).start()
    raised, took = _run_with_safety(worker)
    assert raised is None and took < budget(3.0)  # a graceful stop: run() returns
    assert [row(admin, f"j{i}")["state"] for i in range(2)] == ["done", "done"]
    assert worker.stats.completed == 2 and not admin.exists(K.active)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    assert no_echomq_threads() == []


def test_keyboard_interrupt_in_run_without_signal_handling_is_graceful_then_raised(
    server_factory: ServerFactory, python_sigint: None
) -> None:
    server = server_factory()
    admin = server.client()
    client = echomq.Client(server.client())
    for i in range(2):
        client.enqueue(Q, b"", job_id=f"j{i}")
    both = threading.Barrier(3)

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        both.wait(5)
        time.sleep(0.3)

    worker = echomq.Worker(client, Q, handler, lease_ms=3000, concurrency=2, poll_interval=0.05)
    threading.Thread(target=lambda: (both.wait(5), os.kill(os.getpid(), signal.SIGINT))).start()
    raised, took = _run_with_safety(worker, handle_signals=False)
    assert isinstance(raised, KeyboardInterrupt) and took < budget(3.0)
    assert [row(admin, f"j{i}")["state"] for i in range(2)] == ["done", "done"]
    assert no_echomq_threads() == []


def test_a_second_ctrl_c_stops_at_once_and_gives_the_jobs_back(server_factory: ServerFactory) -> None:
    server = server_factory()
    admin = server.client()
    client = echomq.Client(server.client())
    for i in range(2):
        client.enqueue(Q, b"", job_id=f"j{i}")
    both = threading.Barrier(3)

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        both.wait(5)
        cancel.sleep(30)  # a long job; it would stop at "shutdown", but the grace is long
        cancel.raise_if_cancelled()

    worker = echomq.Worker(client, Q, handler, lease_ms=3000, concurrency=2, poll_interval=0.05, grace=30)

    def twice() -> None:
        both.wait(5)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=twice).start()
    raised, took = _run_with_safety(worker)
    assert isinstance(raised, KeyboardInterrupt) and took < budget(2.0)
    for i in range(2):
        r = row(admin, f"j{i}")
        assert r["state"] == "pending" and r["tries"] == "0", r
    assert worker.stats.released == 2 and not admin.exists(K.active)
    assert no_echomq_threads() == []


def test_stop_before_run_means_run_returns_at_once(server: EmbeddedServer) -> None:
    # stop_before_run.py: the stop was wiped out by run() starting.
    client = echomq.Client(server.client())
    for _ in range(20):
        worker = echomq.Worker(client, Q, lambda job, cancel: None, poll_interval=0.05)
        thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
        worker.stop()
        thread.start()
        thread.join(1.0)
        alive = thread.is_alive()
        if alive:
            worker.stop()
            thread.join()
        assert not alive
    assert no_echomq_threads() == []


def test_stop_from_inside_a_handler_completes_that_job_and_stops(
    server: EmbeddedServer, r: redis.Redis
) -> None:
    # stop_from_handler.py: stop() from a handler used to fail its job
    # ("cannot join current thread").
    client = echomq.Client(server.client())
    client.enqueue(Q, b"", job_id="J")
    client.enqueue(Q, b"", job_id="K")
    worker = echomq.Worker(client, Q, lambda job, cancel: worker.stop(), poll_interval=0.05)
    worker.start()
    assert wait_until(lambda: not any(t.is_alive() for t in worker._threads), timeout=5)
    assert row(r, "J")["state"] == "done" and worker.stats.completed == 1
    assert row(r, "K")["state"] == "pending"  # no new claim after stop()
    worker.stop()  # and again, from outside: nothing to wait for
    assert no_echomq_threads() == []


# -- the lease keeper's deadline ------------------------------------------------------


def test_stop_does_not_wait_on_a_half_open_connection(server: EmbeddedServer, r: redis.Redis) -> None:
    # halfopen.py: the keeper's connection goes half-open (no FIN, no RST);
    # stop() waited on its checkpoint until the socket timeout (for ever
    # without one).  Now a checkpoint that gets no answer within an interval is
    # given up with its connection, and the next one goes out on a fresh one.
    proxy = Proxy(server.port)
    try:
        client = echomq.Client(redis.Redis(port=proxy.port, socket_timeout=None))
        client.enqueue(Q, b"", job_id="J")
        cancelled = threading.Event()

        def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
            cancel.sleep(30)
            cancelled.set()
            cancel.raise_if_cancelled()

        worker = echomq.Worker(client, Q, handler, lease_ms=1000, extend_interval=0.3, poll_interval=0.05)
        worker.start()
        assert wait_until(lambda: r.zscore(K.active, "J") is not None)
        time.sleep(0.2)
        proxy.blackhole()  # every connection open so far is now half-open
        time.sleep(1.5)  # longer than the lease: the keeper must have kept it on fresh connections
        assert not cancelled.is_set(), "the lease was lost although the server was fine"
        started = time.monotonic()
        stopper = threading.Thread(target=worker.stop, kwargs={"grace": 0})
        stopper.start()
        stopper.join(3.0)
        assert not stopper.is_alive(), "stop() is stuck on a half-open connection"
        assert time.monotonic() - started < budget(1.5)
        assert r.hget(K.job("J"), "state") == b"pending"  # given back at the stop
        assert worker.stats.released == 1 and worker.stats.leases_lost == 0
        assert proxy.dropped >= 1, "nothing met the half-open connections: the fault did not fire"
        assert worker.stats.connection_errors >= 1  # a checkpoint gave a half-open connection up
        assert no_echomq_threads() == []
    finally:
        proxy.close()


@pytest.mark.parametrize("length", ["long", "short"])
def test_a_deadline_passing_while_the_server_is_frozen(
    server: EmbeddedServer, r: redis.Redis, length: str
) -> None:
    # freeze.py: the server is frozen (SIGSTOP) mid-job.  A handler running
    # past the deadline is cancelled and its job is not completed; one that
    # returns before the deadline has its COMPLETE sent before the deadline and
    # work_one() does not wait for the server to wake up (it used to wait the
    # whole freeze).  tests/workers/test_asyncio_faults.py runs the same with asyncio
    # and expects the same.  (A new connection to a frozen server is accepted
    # by its kernel and then waits for the handshake: the client's own socket
    # timeout bounds that wait, here 0.5 s.)
    client = echomq.Client(server.client(socket_timeout=0.5))
    client.enqueue(Q, b"", job_id="J")
    seen: list[str | None] = []

    def handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
        if length == "long":
            c = None
            while c is None:
                c = cancel.sleep(0.05)
            seen.append(c.reason)
        else:
            time.sleep(0.9)

    worker = echomq.Worker(client, Q, handler, lease_ms=1000, extend_interval=0.3)
    thread = threading.Thread(target=worker.work_one)
    thread.start()
    time.sleep(0.5)
    with frozen(server):
        thread.join(2.5)
        returned_while_frozen = not thread.is_alive()
    thread.join()
    assert returned_while_frozen, "work_one() waited for the frozen server"
    if length == "long":
        assert seen == [echomq.lease.LOST_DEADLINE]
        assert worker.stats.completed == 0 and worker.stats.leases_lost == 1
        assert r.hget(K.job("J"), "state") == b"active"  # not completed: the reaper will recover it
    else:
        # COMPLETE went out before the deadline; it could not be confirmed before
        # it (the server was frozen), so the worker counts the lease as lost.
        assert worker.stats.completed == 0 and worker.stats.leases_lost == 1
    assert no_echomq_threads() == []


def test_a_fake_clock_cannot_switch_deadline_checking_off(server_factory: ServerFactory) -> None:
    # fake_clock.py: with clock=..., the deadline timer slept in real time and,
    # the injected clock saying "not yet", never looked again.
    server = server_factory()
    client = echomq.Client(server.client(socket_timeout=0.2, socket_connect_timeout=0.2))
    client.enqueue(Q, b"", job_id="J")
    job = client.claim(Q, 60_000)
    assert job is not None
    server.stop()  # every checkpoint now fails: only the deadline can decide
    now = [0.0]
    token = echomq.CancelToken()
    keeper = echomq.LeaseKeeper(client, job, 300, token, interval=0.05, claimed_at=0.0, clock=lambda: now[0])
    keeper.start()
    try:
        time.sleep(0.4)
        assert token.check() is None  # the fake clock says: not yet
        now[0] = 100.0  # far past the deadline
        assert wait_until(lambda: token.check() is not None, timeout=1.0)
    finally:
        keeper.stop()
    assert keeper.lost == echomq.lease.LOST_DEADLINE
    assert no_echomq_threads() == []


# -- errors that will not heal ---------------------------------------------------------


def test_a_checkpoint_refused_by_the_acl_is_logged_once_and_counted(
    server: EmbeddedServer, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # keeper_swallow.py: NOPERM on every checkpoint was logged at DEBUG only.
    r.acl_setuser(
        "w",
        enabled=True,
        passwords=["+pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-emq.checkpoint"],
    )
    try:
        client = echomq.Client(redis.Redis(port=server.port, username="w", password="pw"))
        client.enqueue(Q, b"", job_id="J")
        worker = echomq.Worker(client, Q, lambda job, cancel: cancel.sleep(2.0), lease_ms=900)
        with caplog.at_level(logging.DEBUG, logger="echomq"):
            worker.work_one()
        errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
        assert len(errors) == 1, [rec.getMessage() for rec in errors]
        assert (
            "checkpoint refused" in errors[0].getMessage() and "NoPermissionError" in errors[0].getMessage()
        )
        assert worker.stats.permanent_errors >= 2  # every refusal counted, one line logged
        assert "NoPermissionError" in (worker.stats.last_permanent_error or "")
        assert worker.stats.leases_lost == 1 and worker.stats.completed == 0  # no lease it could show
    finally:
        r.acl_deluser("w")


@pytest.mark.parametrize("why", ["module-missing", "read-only-replica"])
def test_a_claim_refused_for_good_is_logged_once_and_counted(
    server_factory: ServerFactory, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    if why == "module-missing":
        target = server_factory(load_module=False)
        expected = "ModuleNotLoaded"
    else:
        master = server_factory()
        target = server_factory(["--replicaof", "127.0.0.1", str(master.port)])
        expected = "ReadOnlyError"
    client = echomq.Client(target.client(), backend="module")  # auto would run the scripts there
    worker = echomq.Worker(client, Q, lambda job, cancel: None, poll_interval=0.02)
    with caplog.at_level(logging.WARNING, logger="echomq"):
        worker.start()
        assert wait_until(lambda: worker.stats.permanent_errors >= 5, timeout=10)
        worker.stop()
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(errors) == 1 and expected in errors[0] and "claim refused" in errors[0]
    assert expected in (worker.stats.last_permanent_error or "")
    assert no_echomq_threads() == []


# -- a cancel subscription redis-py made again by itself ---------------------------------


class HeldJobs:
    """What a ``CancelListener`` drives: the pushes it hears, and how often every held job was asked."""

    def __init__(self) -> None:
        self.pushes: list[str] = []
        self.asked = 0

    def pushed(self, job_id: str) -> None:
        self.pushes.append(job_id)

    def checkpoint_all(self) -> None:
        self.asked += 1


def subscriber_id(r: redis.Redis, name: str) -> str | None:
    """The server's id of the named client that holds a subscription (None: it holds none)."""
    ids = [c["id"] for c in r.client_list() if c.get("name") == name and str(c.get("sub")) != "0"]
    return ids[0] if ids else None


def test_a_cancel_subscription_redis_py_made_again_by_itself_checkpoints_every_held_job(
    server: EmbeddedServer, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where the listener's connection is redis-py's own (a cluster client's: no bounded attempts),
    # redis-py reconnects a dropped connection and subscribes again without a word: a cancel
    # published meanwhile waited for the keeper's next checkpoint (a third of the lease).  Its
    # second confirmation says so: every held job asks at once (issue 39, item 4's class).
    from echomq._sync._pushes import CancelListener

    proxy = Proxy(server.port)
    client = echomq.Client(redis.Redis(port=proxy.port, client_name="test-listener"))
    monkeypatch.setattr(client, "_bounded", lambda: False)  # the path a cluster client takes
    held = HeldJobs()
    listener = CancelListener(client, Q, held, lambda: True)  # type: ignore[arg-type]
    try:
        listener.ensure()
        assert wait_until(lambda: subscriber_id(r, "test-listener") is not None, 10)
        first = subscriber_id(r, "test-listener")
        proxy.drop()
        assert wait_until(lambda: held.asked >= 1, 20), "a cancel published meanwhile waits for a checkpoint"
        assert listener.resubscribed >= 1
        assert wait_until(lambda: subscriber_id(r, "test-listener") not in (None, first), 10)  # dropped
    finally:
        listener.close()
        proxy.close()
        client.close()
