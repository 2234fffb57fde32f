"""`echomq worker` is configured as the Python Worker is (issue 30): every Worker setting has a flag
and an $ECHOMQ_* variable (flag > variable > default), and the CLI worker records metrics by default,
so its counters reach the dashboard and the exporter.  The table below checks every setting on a real
Worker; the processes below check that the settings take effect in a worker started as a user starts
it."""

from __future__ import annotations

import argparse
import inspect
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

import echomq
from echomq.cli import build_parser, main
from echomq.cli.worker import WORKER_SETTINGS, worker_settings
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..faults import pythonpath, wait_until

# Engine-independent (once): the CLI's worker over the client; its verbs are tests/verbs/'s, on every engine.
pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parents[2]
Q = "cliworker"
K = queue_keys(Q)

Getter = Callable[[Any, argparse.Namespace], object]

# flag -> (a value on the command line, what it becomes; one in the variable, what it becomes;
# what the setting is when neither is given; where to read it: from the Worker or the arguments;
# other arguments it needs).  Every setting of WORKER_SETTINGS has a row: add one with the setting.
SAMPLES: dict[str, tuple[str, object, str, object, object, Getter, list[str]]] = {
    "--concurrency": ("4", 4, "2", 2, 1, lambda w, a: w.concurrency, []),
    "--wait-for-server": ("30", 30.0, "5", 5.0, 0.0, lambda w, a: a.wait_for_server, []),
    "--prefetch": ("8", 8, "2", 2, 0, lambda w, a: w.prefetch, []),
    "--lease-ms": ("5000", 5000, "7000", 7000, 30_000, lambda w, a: w.lease_ms, []),
    "--extend-interval": ("1.5", 1.5, "2", 2.0, None, lambda w, a: w.extend_interval, []),
    "--max-attempts": ("5", 5, "7", 7, 3, lambda w, a: w.max_attempts, []),
    "--retry-backoff": ("fixed", "fixed", "exponential", "exponential", None,
                        lambda w, a: w.retry and w.retry.backoff, []),
    "--retry-delay": ("250", 250, "400", 400, None, lambda w, a: w.retry and w.retry.base_ms, []),
    "--retry-factor": ("3", 3.0, "1.5", 1.5, None, lambda w, a: w.retry and w.retry.factor, []),
    "--retry-max-delay": ("9000", 9000, "8000", 8000, None, lambda w, a: w.retry and w.retry.max_ms, []),
    "--retry-jitter": ("0.5", 0.5, "0.25", 0.25, None, lambda w, a: w.retry and w.retry.jitter, []),
    "--grace": ("2.5", 2.5, "0", 0.0, 10.0, lambda w, a: w.grace, []),
    "--poll-interval": ("0.5", 0.5, "0.1", 0.1, 0.2, lambda w, a: w.poll_interval, []),
    "--timeout-ms": ("1500", 1500, "2500", 2500, None, lambda w, a: w.timeout_ms, []),
    "--timeout-grace": ("0.5", 0.5, "0", 0.0, 5.0, lambda w, a: w.timeout_grace, []),
    "--isolation": ("process", "process", "process", "process", "thread", lambda w, a: w.isolation, []),
    "--max-jobs-per-child": ("50", 50, "7", 7, None, lambda w, a: w.max_jobs_per_child,
                             ["--isolation", "process"]),
    "--reap": ("", True, "0", False, True, lambda w, a: w.reap, []),
    "--reap-interval": ("2", 2.0, "30", 30.0, 10.0, lambda w, a: w.reap_interval, []),
    "--max-stalled": ("5", 5, "1", 1, 3, lambda w, a: w.max_stalled, []),
    "--replicas": ("2", 2, "1", 1, None, lambda w, a: w.replica_wait and w.replica_wait.replicas, []),
    "--replicas-timeout-ms": ("2000", 2000, "3000", 3000, 1000,
                              lambda w, a: w.replica_wait.timeout_ms, ["--replicas", "1"]),
    "--replicas-aof": ("", True, "yes", True, False, lambda w, a: w.replica_wait.aof, ["--replicas", "1"]),
    "--metrics": ("", True, "0", False, True, lambda w, a: a.metrics, []),
    "--metrics-port": ("9641", 9641, "9642", 9642, None, lambda w, a: a.metrics_port, []),
    "--metrics-host": ("127.0.0.2", "127.0.0.2", "::1", "::1", "127.0.0.1", lambda w, a: a.metrics_host, []),
}  # fmt: skip


def handler(ctx: echomq.JobContext) -> None: ...


def built(argv: list[str], client: echomq.Client) -> tuple[echomq.Worker, argparse.Namespace]:
    """The Worker `echomq worker` would run for ``argv`` (parsed, settled from the environment)."""
    args = build_parser().parse_args(["worker", "tests.shutdown_handlers:quick", "-q", Q, *argv])
    args.settle(args)
    return echomq.Worker(client, Q, handler, **worker_settings(args)), args


def test_every_worker_setting_has_a_flag_and_every_flag_a_test() -> None:
    # The Worker's keywords (echomq.Worker and echomq.asyncio.Worker share them) and its
    # RetryPolicy's fields: each is a row of WORKER_SETTINGS; each row is a row of SAMPLES.
    keywords = set(inspect.signature(echomq.Worker.__init__).parameters) - {
        "self",
        "client",
        "queue",
        "handler",
    }
    keywords -= {"retry", "metrics"}  # their parts are settings of their own
    retry_fields = {f.name for f in fields(echomq.RetryPolicy)} - {"max_attempts"}
    targets = {s.to for s in WORKER_SETTINGS if s.to}
    assert keywords <= targets, f"Worker settings without a flag: {keywords - targets}"
    assert {f"retry.{name}" for name in retry_fields} <= targets
    assert {s.flag for s in WORKER_SETTINGS} == set(SAMPLES)
    assert {s.env for s in WORKER_SETTINGS} == {"ECHOMQ_" + f[2:].upper().replace("-", "_") for f in SAMPLES}


@pytest.mark.parametrize("flag", list(SAMPLES))
def test_a_setting_comes_from_its_flag_then_its_variable_then_its_default(
    flag: str, client: echomq.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    (setting,) = [s for s in WORKER_SETTINGS if s.flag == flag]
    given, from_flag, in_env, from_env, default, get, extra = SAMPLES[flag]
    for s in WORKER_SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    worker, args = built(extra, client)
    assert get(worker, args) == default
    on_line = [flag, given] if given else [flag]
    worker, args = built([*extra, *on_line], client)
    assert get(worker, args) == from_flag
    monkeypatch.setenv(setting.env, in_env)
    worker, args = built(extra, client)
    assert get(worker, args) == from_env
    if given:  # a flag wins over the variable
        worker, args = built([*extra, *on_line], client)
        assert get(worker, args) == from_flag
    else:  # a switch: --no-<flag> wins over a variable that says yes
        monkeypatch.setenv(setting.env, "1")
        worker, args = built([*extra, f"--no-{flag[2:]}"], client)
        assert get(worker, args) is False


def test_any_retry_option_makes_a_retry_policy_with_the_max_attempts(client: echomq.Client) -> None:
    worker, _ = built(["--retry-delay", "250", "--max-attempts", "4"], client)
    assert worker.retry == echomq.RetryPolicy(max_attempts=4, base_ms=250)  # exponential, as RetryPolicy()
    assert worker.max_attempts == 4
    worker, _ = built([], client)
    assert worker.retry is None  # the Worker's default: retried at once


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"ECHOMQ_LEASE_MS": "soon"}, "$ECHOMQ_LEASE_MS: expected a whole number >= 1, got 'soon'"),
        ({"ECHOMQ_RETRY_BACKOFF": "linear"}, "$ECHOMQ_RETRY_BACKOFF: expected one of exponential, fixed"),
        ({"ECHOMQ_METRICS": "maybe"}, "$ECHOMQ_METRICS: expected one of 1/true/yes/on or 0/false/no/off"),
    ],
)
def test_a_variable_that_does_not_parse_is_a_usage_error(env: dict[str, str], words: str) -> None:
    from .test_cli_surface import echomq_cli

    done = echomq_cli("worker", "tests.shutdown_handlers:quick", "-q", Q, env=env)
    assert done.returncode == 2 and words in done.stderr, done.stderr


# -- a worker started as a user starts it ----------------------------------------------------

HANDLERS = """
import os, time

def failing(ctx):
    with open(os.environ["ATTEMPTS_LOG"], "a") as log:
        log.write(f"{time.monotonic()}\\n")
    raise RuntimeError("always")

async def afailing(ctx):
    failing(ctx)

def blocked(ctx):
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["GO_FILE"]) and time.monotonic() < deadline:
        time.sleep(0.02)
"""


class CliWorker:
    """`python -m echomq worker ...` as a process; its stderr lines collected as they come."""

    def __init__(self, server: EmbeddedServer, tmp_path: Path, argv: list[str], env: dict[str, str]) -> None:
        (tmp_path / "clihandlers.py").write_text(HANDLERS)
        full = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
        full.update(PYTHONPATH=pythonpath(ROOT / "python", tmp_path), ECHOMQ_URL=server.url, **env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "echomq", "worker", *argv, "-q", Q, "--grace", "0"],
            cwd=tmp_path, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self._reader.join(timeout=5)
        return code

    def line(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        """The first line that matches ``pattern``, once it has come."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((m for line in list(self.lines) if (m := re.search(pattern, line))), None)
            if found is not None:
                return found
            time.sleep(0.02)
        raise AssertionError(f"no line matches {pattern!r}:\n{''.join(self.lines)}")


@pytest.fixture
def started(server: EmbeddedServer, tmp_path: Path) -> Iterator[Callable[..., CliWorker]]:
    workers: list[CliWorker] = []

    def start(argv: list[str], env: dict[str, str] | None = None) -> CliWorker:
        workers.append(CliWorker(server, tmp_path, argv, env or {}))
        return workers[-1]

    yield start
    for worker in workers:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait()


@pytest.mark.parametrize("handler_name", ["failing", "afailing"])  # threads, asyncio
def test_a_retry_backoff_from_the_environment_spaces_the_tries_and_the_counters_reach_the_server(
    handler_name: str, client: echomq.Client, tmp_path: Path, started: Callable[..., CliWorker]
) -> None:
    # At e64777a the CLI had no retry setting: three tries burned in 2 ms; and no metrics,
    # so 120 jobs left the dashboard's chart flat.
    attempts = tmp_path / "attempts.log"
    client.enqueue(Q, b"", job_id="doomed")
    worker = started(
        [f"clihandlers:{handler_name}", "--max-attempts", "3"],
        {"ECHOMQ_RETRY_BACKOFF": "fixed", "ECHOMQ_RETRY_DELAY": "400", "ATTEMPTS_LOG": str(attempts)},
    )
    wait_until(lambda: (i := client.job(Q, "doomed")) is not None and i.state == "dead", 30)
    assert worker.stop() == 0, "".join(worker.lines)
    times = [float(t) for t in attempts.read_text().split()]
    assert len(times) == 3
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.35, gaps  # the server holds each retry back 400 ms
    counters = client.counters(Q)  # added by the worker's Metrics, on by default
    assert (counters.claimed, counters.failed, counters.dead_lettered) == (3, 3, 1), "".join(worker.lines)


def test_concurrency_lease_and_metrics_port_take_effect(
    client: echomq.Client, tmp_path: Path, started: Callable[..., CliWorker]
) -> None:
    go = tmp_path / "go"
    client.enqueue_many(Q, [(f"j{i}", b"") for i in range(5)])
    worker = started(
        ["clihandlers:blocked", "-c", "3", "--lease-ms", "5000", "--metrics-port", "0"],
        {"ECHOMQ_CONCURRENCY": "1", "ECHOMQ_LEASE_MS": "60000", "GO_FILE": str(go)},  # the flags win
    )
    wait_until(lambda: client.counts(Q).active == 3, 20)
    for _ in range(5):  # never more than 3 at a time
        time.sleep(0.05)
        assert client.counts(Q).active == 3
    assert all(0 < job.lease_left_ms <= 5000 for job in client.active(Q))
    url = worker.line(r"metrics at (http://127\.0\.0\.1:\d+/metrics)").group(1)
    go.touch()
    wait_until(lambda: (c := client.counts(Q)).pending == 0 and c.active == 0, 20)
    wait_until(lambda: client.counters(Q).completed == 5, 10)  # shared once a second
    with urllib.request.urlopen(url, timeout=10) as page:
        body = page.read().decode()
    assert f'echomq_jobs_completed_total{{queue="{Q}"}} 5.0' in body
    assert worker.stop() == 0, "".join(worker.lines)


def test_no_metrics_means_none(
    client: echomq.Client, tmp_path: Path, started: Callable[..., CliWorker]
) -> None:
    go = tmp_path / "go"
    go.touch()
    client.enqueue(Q, b"", job_id="quiet")
    worker = started(["clihandlers:blocked", "--no-metrics"], {"GO_FILE": str(go)})
    wait_until(lambda: (i := client.job(Q, "quiet")) is not None and i.state == "done", 20)
    assert worker.stop() == 0
    assert client.counters(Q).completed == 0


def test_metrics_port_without_metrics_is_refused(
    server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["worker", "tests.shutdown_handlers:quick", "-q", Q, "--no-metrics", "--metrics-port", "0"]
    assert main(["--url", server.url, *argv]) == 1
    assert "--metrics-port serves the metrics: it needs --metrics" in capsys.readouterr().err


def test_a_worker_waits_for_a_server_that_starts_late(server_factory: ServerFactory) -> None:
    # Issue 42: a worker started before its server exited 1; --wait-for-server S waits for it.
    probe = server_factory()
    port = probe.port
    probe.stop()  # a port nothing listens on now; the server comes up there later
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    env["PYTHONPATH"] = pythonpath(ROOT / "python", ROOT)
    url = f"redis://127.0.0.1:{port}/0"
    at_once = subprocess.run(
        [sys.executable, "-m", "echomq", "worker", "tests.shutdown_handlers:quick", "--queue", "late",
         "--url", url, "--no-metrics"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert at_once.returncode == 1 and "cannot reach the server" in at_once.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq", "worker", "tests.shutdown_handlers:quick", "--queue", "late",
         "--url", url, "--no-metrics", "--wait-for-server", "60", "--grace", "0"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        seen = ""
        while "waiting up to 60 s" not in seen:
            line = proc.stderr.readline()
            assert line, seen
            seen += line
        late = server_factory(port=port)
        client = echomq.Client.from_url(late.url)
        client.enqueue("late", b"x", job_id="j")
        ran = wait_until(lambda: (i := client.job("late", "j")) is not None and i.state == "done", 60)
        assert ran, client.job("late", "j")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
