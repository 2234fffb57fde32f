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

from .calibration import budget
from .faults import pythonpath, wait_until

ROOT = Path(__file__).resolve().parent.parent
Q = "deploy"
K = queue_keys(Q)


def start_worker(server: EmbeddedServer, handler: str, *options: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=pythonpath(ROOT / "python", ROOT), ECHOMQ_LOG_LEVEL="info")
    return subprocess.Popen(
        [sys.executable, "-m", "echomq", "worker", f"tests.shutdown_handlers:{handler}", "--queue", Q,
         "--url", server.url, "--lease-ms", "5000", "--poll-interval", "0.05", *options],
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
