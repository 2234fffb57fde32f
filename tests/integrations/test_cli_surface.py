"""The CLI without rough edges (issue 15): options anywhere, --version, --log-level, one-line errors,
readable type errors, one result format, `inspect` refusing a server without the module, `worker` errors."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

import echomq
from echomq.cli import main
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..faults import pythonpath

pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parents[2]
Q = "surface"
K = queue_keys(Q)


def echomq_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: a process, its exit status and its two streams."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_LOG")}
    full_env.update(PYTHONPATH=pythonpath(ROOT / "python", ROOT), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "echomq", *argv],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_global_options_go_before_or_after_the_command(
    r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    echomq.Client(r).enqueue(Q, b"", job_id="j")
    assert main(["inspect", Q, "--url", server.url]) == 0
    after = capsys.readouterr().out
    assert main(["--url", server.url, "inspect", Q]) == 0
    before = capsys.readouterr().out
    assert "pending 1" in after and after.split("\n", 1)[1] == before.split("\n", 1)[1]
    # After the command, the value given there wins; not given, the main one stands.
    assert main(["--url", "redis://127.0.0.1:1/0", "sweep", Q, "--url", server.url]) == 0


def test_version() -> None:
    done = echomq_cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"echomq {echomq.__version__}"


def test_errors_are_one_line_with_status_1_and_a_traceback_only_at_debug(
    server_factory: ServerFactory,
) -> None:
    bare = server_factory(load_module=False)
    done = echomq_cli("sweep", Q, "--url", bare.url, "--backend", "module")
    assert done.returncode == 1
    assert (
        done.stderr.count("\n") == 1 and done.stderr.startswith("echomq: ") and "--loadmodule" in done.stderr
    )
    debug = echomq_cli("sweep", Q, "--url", bare.url, "--backend", "module", "--log-level", "debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "--loadmodule" in debug.stderr
    unreachable = echomq_cli("sweep", Q, "--url", "redis://127.0.0.1:1/0")
    assert unreachable.returncode == 1 and unreachable.stderr.count("\n") == 1
    assert "cannot connect" in unreachable.stderr


def test_inspect_refuses_a_server_without_the_module(server_factory: ServerFactory) -> None:
    # It used to print zeros and exit 0: an empty queue, on a server that has none.
    bare = server_factory(load_module=False)
    done = echomq_cli("inspect", Q, "--url", bare.url, "--backend", "module")
    assert done.returncode == 1 and "--loadmodule" in done.stderr and done.stdout == ""


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["sweep", Q, "--limit", "abc"], "argument --limit: expected a whole number >= 1, got 'abc'"),
        (["sweep", Q, "--max-stalled", "0"], "argument --max-stalled: expected a whole number >= 1, got '0'"),
        (["reap", Q, "--interval", "soon"], "argument --interval: expected a number of seconds, got 'soon'"),
        (["server", "--port", "99999"], "argument --port: expected a port (1-65535), got '99999'"),
        (["--log-level", "loud", "sweep", Q], "argument --log-level: invalid choice: 'loud'"),
        (["worker", "nosuchmodule:send"], "error: cannot import 'nosuchmodule': ModuleNotFoundError"),
        (["worker", "echomq:nosuch"], "error: 'echomq' has no 'nosuch'"),
        (["worker", "json:dumps"], "error: --queue is required: json:dumps is a handler, not an echomq.App"),
    ],
)
def test_usage_errors_are_readable_and_exit_2(argv: list[str], words: str) -> None:
    done = echomq_cli(*argv)
    assert done.returncode == 2 and words in done.stderr, done.stderr
    assert "_positive" not in done.stderr and "Traceback" not in done.stderr


def test_enqueue_of_an_existing_id_names_it(
    r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", server.url, "enqueue", Q, "x", "--id", "dup"]) == 0
    capsys.readouterr()
    assert main(["--url", server.url, "enqueue", Q, "x", "--id", "dup"]) == 1
    assert capsys.readouterr().err == f"echomq: job 'dup' already exists in queue '{Q}'\n"


def test_sweep_and_reap_print_one_format(
    r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    r.zadd(K.active, {"a": 1, "b": 2})
    r.hset(K.job("b"), "stalled", 2)
    assert main(["--url", server.url, "sweep", Q, "--max-stalled", "3"]) == 0
    swept = capsys.readouterr().out.strip()
    assert swept == "recovered 1 (a)  dead 1 (b)  cancelled 0  expired 0"
    r.flushall()
    r.zadd(K.active, {"c": 1})
    assert (
        main(
            ["--url", server.url, "reap", Q, "--interval", "0.05", "--duration", "0.3", "--max-stalled", "5"]
        )
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    tick = next(line for line in lines if "recovered 1" in line and not line.startswith("total"))
    assert tick.split(" ", 1)[1] == "recovered 1 (c)  dead 0  cancelled 0  expired 0"  # after the time
    assert lines[-1] == "total recovered 1 (c)  dead 0  cancelled 0  expired 0  errors 0"


def test_reap_against_a_failing_server_logs_one_line_per_outage(server_factory: ServerFactory) -> None:
    # It printed a ~35-line traceback every tick.
    bare = server_factory(load_module=False)
    done = echomq_cli(
        "reap", Q, "--url", bare.url, "--backend", "module", "--interval", "0.05", "--duration", "0.5"
    )
    assert done.returncode == 1
    assert "--loadmodule" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("\n") <= 2, done.stderr


def test_log_level_and_json_format_with_the_job_on_every_line(
    server: EmbeddedServer, r: redis.Redis, tmp_path: Path
) -> None:
    # One logging setup for the CLI and the workers: a handler's own line and
    # the worker's lines about a job carry its queue, id and attempt.
    echomq.Client(r).enqueue(Q, b"", job_id="logged")
    (tmp_path / "loghandlers.py").write_text(
        "import logging, os, signal\n"
        "def handle(ctx):\n"
        "    logging.getLogger('app').warning('working on it')\n"
        "    if ctx.attempt == 1:\n"
        "        raise RuntimeError('boom')\n"
        "    os.kill(os.getpid(), signal.SIGTERM)  # done: stop the worker\n"
    )
    env = dict(os.environ, PYTHONPATH=pythonpath(ROOT / "python", tmp_path), ECHOMQ_LOG_FORMAT="json")
    done = subprocess.run(
        [sys.executable, "-m", "echomq", "worker", "loghandlers:handle", "-q", Q, "--url", server.url,
         "--log-level", "info", "--grace", "0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    about_job = [rec for rec in records if rec.get("job") == "logged"]
    assert {rec["logger"] for rec in about_job} >= {"app", "echomq.worker"}
    assert all(rec["queue"] == Q for rec in about_job)
    assert [rec["attempt"] for rec in about_job if rec["logger"] == "app"] == [1, 2]
    assert any(rec["message"].startswith("job logged failed (RuntimeError: boom)") for rec in about_job)


def test_text_log_lines_show_the_job(caplog: pytest.LogCaptureFixture) -> None:
    from echomq._log import CURRENT_JOB, TEXT_FORMAT, JobFilter

    record = logging.LogRecord("app", logging.INFO, __file__, 1, "hello", None, None)
    token = CURRENT_JOB.set(echomq.Job("mail", "42", "2-00000000000000aa", b"", attempt=2))
    try:
        JobFilter().filter(record)
    finally:
        CURRENT_JOB.reset(token)
    line = logging.Formatter(TEXT_FORMAT).format(record)
    assert line.endswith("INFO app [queue=mail job=42 attempt=2]: hello")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("nosuchmodule_xyz:handle", "cannot import 'nosuchmodule_xyz': ModuleNotFoundError"),
        ("tests.shutdown_handlers:nothing", "'tests.shutdown_handlers' has no 'nothing'"),
        ("tests.shutdown_handlers", "handler must be MODULE:FUNCTION"),
    ],
)
def test_worker_command_errors_are_one_line(server: EmbeddedServer, spec: str, words: str) -> None:
    done = echomq_cli("worker", spec, "--queue", Q, "--url", server.url)
    assert done.returncode == 1 and words in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_worker_command_refuses_a_server_without_the_module(server_factory: ServerFactory) -> None:
    bare = server_factory(load_module=False)
    for handler in ("quick", "aquick"):  # threads and asyncio
        done = echomq_cli(
            "worker", f"tests.shutdown_handlers:{handler}", "-q", Q, "--url", bare.url, "--backend", "module"
        )
        assert done.returncode == 1 and "--loadmodule" in done.stderr and "Traceback" not in done.stderr


def test_job_dead_and_inspect_name_a_task_jobs_call(
    client: echomq.Client, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # Issue 42: the CLI never showed a job's task; raw jobs show "-".
    app = echomq.App(client, queue=Q)

    @app.task
    def add(a: int, b: int, *, note: str = "") -> int:
        return a + b

    waiting = add.enqueue(2, 3, note="x" * 100)  # a payload over 64 bytes: stored in pieces
    client.enqueue(Q, b"raw", job_id="raw")
    assert main(["--url", server.url, "job", Q, str(waiting.id)]) == 0
    shown = capsys.readouterr().out
    assert '  task             add(2, 3, note="xxxxxxxxxxxxxxxxxxxx...")' in shown
    assert main(["--url", server.url, "inspect", Q]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = lines.index("next to run")
    assert lines[head + 3].split()[:2] == [str(waiting.id), "add(2,"]
    assert lines[head + 4].split()[:2] == ["raw", "-"]
    job = client.claim(Q, 60_000)
    assert job is not None
    client.fail(Q, job.id, job.token, "E: no", max_attempts=1)
    assert main(["--url", server.url, "dead", Q]) == 0
    row = capsys.readouterr().out.splitlines()[3]
    assert row.split()[:2] == [str(waiting.id), "add(2,"]
