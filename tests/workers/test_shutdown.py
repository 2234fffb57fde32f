"""Graceful shutdown with real signals on real worker processes (issue 15).

Each test starts ``echomq worker tests.shutdown_handlers:NAME`` (threads, or
asyncio for the ``a`` handlers) as a subprocess, waits until its handlers
hold their jobs, sends SIGINT or SIGTERM and measures the time to exit:

- the first signal stops claiming at once; running handlers get ``--grace``
  seconds, then "shutdown" on their tokens; jobs still held are RELEASEd
  (back to pending, no attempt used); the process exits 0 within grace + 1 s;
- a second signal exits at once (128 + the signal), the jobs given back.

Run with ``-s`` to see the measured figures.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

import echomq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..calibration import budget
from ..faults import Proxy, pythonpath, wait_until

pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parents[2]
Q = "deploy"
K = queue_keys(Q)


def start_worker(
    server: EmbeddedServer, handler: str, *options: str, url: str | None = None, **env: str
) -> subprocess.Popen[str]:
    """``echomq worker`` for ``handler`` (lease 5 s unless ``options`` say otherwise), on ``url`` if given."""
    env = dict(
        os.environ, PYTHONPATH=pythonpath(ROOT / "python", ROOT), **{"ECHOMQ_LOG_LEVEL": "info", **env}
    )
    return subprocess.Popen(
        [sys.executable, "-m", "echomq", "worker", f"tests.shutdown_handlers:{handler}", "--queue", Q,
         "--url", url or server.url, "--lease-ms", "5000", "--poll-interval", "0.05", *options],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def held(r: redis.Redis) -> int:
    return int(r.zcard(K.active))


def given_back(r: redis.Redis, ids: list[str]) -> int:
    """Jobs a worker held and RELEASEd (the row's closed_by says so)."""
    return sum((r.hget(K.job(i), "closed_by") or b"").startswith(b"release") for i in ids)


def rows(r: redis.Redis, ids: list[str]) -> list[str]:
    """Each job's "state/tries" (a row never claimed has no tries: 0)."""
    return [(r.hget(K.job(i), "state") or b"").decode() + "/" + (r.hget(K.job(i), "tries") or b"0").decode()
            for i in ids]  # fmt: skip


def signal_and_time(proc: subprocess.Popen[str], *signals: tuple[float, int]) -> tuple[int, float, str]:
    """Send each (delay, signal) in turn; returns (exit status, seconds from first signal to exit, stderr)."""
    first = None
    for delay, signum in signals:
        time.sleep(delay)
        if first is None:
            first = time.monotonic()
        proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=budget(40))
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the worker did not exit:\n{err}")
    assert first is not None
    return proc.returncode, time.monotonic() - first, err


def report(what: str, took: float, code: int, released: int) -> None:
    print(f"\nshutdown[{what}]: signal to exit {took:.2f} s, exit status {code}, jobs released {released}")


@pytest.mark.parametrize("handler", ["cooperative", "acooperative"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_claiming_gives_the_grace_then_releases_the_jobs(
    server_factory: object, handler: str, signum: int
) -> None:
    server: EmbeddedServer = server_factory()  # type: ignore[operator]
    r = server.client()
    client = echomq.Client(r)
    ids = [client.enqueue(Q, b"", job_id=f"j{i}") for i in range(5)]
    grace = 1.0
    proc = start_worker(server, handler, "--concurrency", "2", "--grace", str(grace))
    try:
        assert wait_until(lambda: held(r) == 2, timeout=20), proc.stderr
        code, took, err = signal_and_time(proc, (0.2, signum))
    finally:
        if proc.poll() is None:
            proc.kill()
    states = rows(r, ids)
    report(f"{signal.Signals(signum).name} {handler} grace {grace}", took, code, given_back(r, ids))
    assert code == 0, err
    # the handlers had their grace, and no more than a second after it (on an idle machine)
    assert grace <= took <= grace + budget(1.0), err
    assert states == ["pending/0"] * 5  # two given back unused, three never claimed
    assert given_back(r, ids) == 2
    assert held(r) == 0
    assert "stopping" in err and "Traceback" not in err


@pytest.mark.parametrize("handler", ["quick", "aquick"])
def test_handlers_that_finish_within_the_grace_complete_their_jobs(
    server_factory: object, handler: str
) -> None:
    server: EmbeddedServer = server_factory()  # type: ignore[operator]
    r = server.client()
    client = echomq.Client(r)
    ids = [client.enqueue(Q, b"", job_id=f"j{i}") for i in range(4)]
    proc = start_worker(server, handler, "--concurrency", "2", "--grace", "5")
    try:
        assert wait_until(lambda: held(r) == 2, timeout=20)
        code, took, err = signal_and_time(proc, (0.0, signal.SIGTERM))
    finally:
        if proc.poll() is None:
            proc.kill()
    report(f"SIGTERM {handler} grace 5", took, code, 0)
    assert code == 0 and took < budget(2.0, under=5), err  # the grace is a maximum, not a wait
    states = rows(r, ids)
    assert sorted(states) == ["done/1", "done/1", "pending/0", "pending/0"]
    assert held(r) == 0


@pytest.mark.parametrize("handler", ["cooperative", "acooperative"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_exits_at_once(server_factory: object, handler: str, signum: int) -> None:
    server: EmbeddedServer = server_factory()  # type: ignore[operator]
    r = server.client()
    client = echomq.Client(r)
    ids = [client.enqueue(Q, b"", job_id=f"j{i}") for i in range(2)]
    proc = start_worker(server, handler, "--concurrency", "2", "--grace", "30")
    try:
        assert wait_until(lambda: held(r) == 2, timeout=20)
        started = time.monotonic()
        code, took, err = signal_and_time(proc, (0.0, signum), (0.3, signum))
    finally:
        if proc.poll() is None:
            proc.kill()
    after_second = took - 0.3
    report(f"2x {signal.Signals(signum).name} {handler} grace 30", took, code, given_back(r, ids))
    assert code == 128 + signum, err
    assert after_second < budget(1.0, under=30), (after_second, err)
    assert rows(r, ids) == ["pending/0", "pending/0"] and given_back(r, ids) == 2
    assert held(r) == 0 and time.monotonic() - started < budget(5, under=30)


@pytest.mark.parametrize("handler", ["stubborn", "astubborn"])
def test_a_handler_that_ignores_the_shutdown_does_not_hold_the_process(
    server_factory: object, handler: str
) -> None:
    server: EmbeddedServer = server_factory()  # type: ignore[operator]
    r = server.client()
    client = echomq.Client(r)
    client.enqueue(Q, b"", job_id="j0")
    grace = 1.0
    proc = start_worker(server, handler, "--grace", str(grace))
    try:
        assert wait_until(lambda: held(r) == 1, timeout=20)
        code, took, err = signal_and_time(proc, (0.0, signal.SIGTERM))
    finally:
        if proc.poll() is None:
            proc.kill()
    report(f"SIGTERM {handler} grace {grace}", took, code, given_back(r, ["j0"]))
    assert code == 0, err
    # The grace, the force's half second and the process's exit: far from the handler's 30 s
    # (a loaded machine took 2.03 s for grace 1; the bound is not a speed measurement).
    assert took <= grace + budget(5.0, under=29), err
    assert rows(r, ["j0"]) == ["pending/0"]  # given back by the worker itself
    assert "did not stop in time" in err or "giving" in err


# -- issue 39: the asyncio worker's give-backs and ends, on a busy machine and half-open connections --

BURN = "import time\nend = time.monotonic() + 90\nwhile time.monotonic() < end:\n    pass\n"


def exited(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Wait for the worker's exit: its status and its stderr."""
    try:
        _, err = proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the worker did not exit:\n{err}")
    return proc.returncode, err


def burners(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` CPU-bound processes beside the worker (each ends by itself after 90 s; the caller kills them)."""
    return [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(n)]


@pytest.mark.backends
@pytest.mark.parametrize(
    "signals",
    [((0.0, signal.SIGTERM),), ((0.0, signal.SIGINT), (0.5, signal.SIGINT))],
    ids=["SIGTERM", "2xSIGINT"],
)
def test_a_forced_stop_of_100_busy_asyncio_runners_on_a_loaded_machine_gives_every_job_back(
    server: EmbeddedServer, r: redis.Redis, signals: tuple[tuple[float, int], ...]
) -> None:
    # Issue 39, 1: 100 handlers outlasting the grace, two CPU-bound processes beside the
    # worker: its forced stop sent one RELEASE per job at once, each waiting for a connection
    # of its own within the 0.4 s budget, and 99 of 100 jobs stayed active, held by nobody.
    # Now one pipeline, on the connections the stop keeps, gives them all back.
    client = echomq.Client(r)
    ids = [f"j{i}" for i in range(200)]
    client.enqueue_many(Q, [(i, b"") for i in ids])
    load = burners(2)
    proc = None
    try:
        proc = start_worker(server, "astubborn_seen", "--concurrency", "100", "--grace", "1", "--no-reap")
        # Every runner in its handler (each said so), not only 100 jobs claimed: claimed jobs no
        # runner had started were given back gracefully, and the forced stop never came.
        started = lambda: sum(r.hexists(K.job(i), "progress") for i in ids)  # noqa: E731
        assert wait_until(lambda: held(r) == 100 and started() == 100, timeout=60), proc.stderr
        code, took, err = signal_and_time(proc, *signals)
        assert all(p.poll() is None for p in load)  # the machine was busy throughout
    finally:
        for p in load:
            p.kill()
            p.wait()
        if proc is not None and proc.poll() is None:
            proc.kill()
    names = "+".join(signal.Signals(s).name for _, s in signals)
    report(f"{names} astubborn_seen x100 grace 1, 2 CPU burners", took, code, given_back(r, ids))
    # 2xSIGINT: 130, or killed by the second SIGINT itself when the loaded process only read
    # both at once and was leaving when it came (the worker had restored the default handler)
    assert code in ((0,) if len(signals) == 1 else (128 + signal.SIGINT, -signal.SIGINT)), err
    assert "100 handlers did not stop in time" in err  # the forced stop came, every runner busy
    # No handler started after the force holds the process (each would sleep 30 s): runners
    # that got a job ready as the force came (a metric read) used to start it all the same.
    assert took < 25, err
    assert held(r) == 0, err  # nothing active after the process: no job held by nobody
    assert rows(r, ids) == ["pending/0"] * 200  # 100 given back unused, 100 never claimed
    assert given_back(r, ids) == 100


@pytest.mark.backends
def test_ends_sent_on_half_open_connections_land_on_a_fresh_one_within_a_short_lease(
    server: EmbeddedServer, r: redis.Redis, tmp_path: Path
) -> None:
    # Issue 39, 2: lease 1.5 s, a graceful SIGTERM while every connection the worker had went
    # half-open: a COMPLETE's first try waited min(2 s, the lease left), the whole lease, so
    # no second try went out on a fresh connection, and the process exited 0 with jobs that
    # ran still active.  A try now waits a third of what is left at most.
    client = echomq.Client(r)
    ids = [f"j{i}" for i in range(40)]
    client.enqueue_many(Q, [(i, b"") for i in ids])
    proxy = Proxy(server.port)
    flag, started = tmp_path / "finish", tmp_path / "started"
    started.mkdir()
    proc = start_worker(
        server, "aflagged", "--concurrency", "20", "--grace", "2", "--lease-ms", "1500", "--no-reap",
        "--no-metrics", url=f"redis://127.0.0.1:{proxy.port}", FLAG=str(flag), STARTED=str(started),
    )  # fmt: skip
    try:
        # every handler runs (then nothing but the worker's own commands meets the fault)
        assert wait_until(lambda: held(r) == 20 and len(os.listdir(started)) == 20, timeout=30), proc.stderr
        proxy.blackhole()  # every connection the worker has now swallows what it is sent
        proc.send_signal(signal.SIGTERM)
        flag.touch()  # the handlers finish within the grace: their COMPLETEs meet the half-open connections
        code, err = exited(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        proxy.close()
    assert proxy.dropped > 0 and re.search(r"complete failed, retrying: TimeoutError", err), (
        err
    )  # the fault hit
    assert code == 0, err
    assert held(r) == 0, err  # every job that ran landed its COMPLETE
    assert sorted(rows(r, ids)) == ["done/1"] * 20 + ["pending/0"] * 20, err


@pytest.mark.backends
def test_prefetched_jobs_are_given_back_through_half_open_connections_at_a_stop(
    server: EmbeddedServer, r: redis.Redis, tmp_path: Path
) -> None:
    # Issue 39, 3: the same with prefetch: the jobs claimed ahead, waiting for a runner, were
    # given back one RELEASE each whose first try waited the whole window on a half-open
    # connection; neither run nor released, they stayed active.  Now one batch, tries of a
    # third of what is left, the next on a fresh connection.
    client = echomq.Client(r)
    ids = [f"j{i}" for i in range(40)]
    client.enqueue_many(Q, [(i, b"") for i in ids])
    proxy = Proxy(server.port)
    flag, started = tmp_path / "finish", tmp_path / "started"
    started.mkdir()
    proc = start_worker(
        server, "aflagged", "--concurrency", "10", "--prefetch", "10", "--grace", "3", "--lease-ms", "1500",
        "--no-reap", "--no-metrics", url=f"redis://127.0.0.1:{proxy.port}",
        FLAG=str(flag), STARTED=str(started),
    )  # fmt: skip
    try:
        # 10 running, 10 claimed ahead and waiting for a runner
        assert wait_until(lambda: held(r) == 20 and len(os.listdir(started)) == 10, timeout=30), proc.stderr
        proxy.blackhole()
        proc.send_signal(signal.SIGTERM)  # the waiting ones go back now, through the half-open connections
        time.sleep(1.3)  # past a try that waits the whole window: the runners then finish on fresh ones
        flag.touch()
        code, err = exited(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        proxy.close()
    fault = re.search(r"release( of \d+ jobs)? failed, retrying: TimeoutError", err)
    assert proxy.dropped > 0 and fault, err  # the give-back met the half-open connections
    assert code == 0, err
    assert held(r) == 0, err  # nothing held by nobody: the prefetched jobs were given back
    assert sorted(rows(r, ids)) == ["done/1"] * 10 + ["pending/0"] * 30, err
    assert "lease lost" not in err, err  # a keeper hearing its own job's RELEASE is no lost lease
