"""The operator CLI, in-process against a real server (and `echomq server` as a process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import redis

import echomq
from echomq.cli import main
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..helpers import queued

# Engine-independent (once): the CLI over the client; its verbs are tests/verbs/'s, on every engine.
pytestmark = pytest.mark.once

Q = "ops"
K = queue_keys(Q)


def run(server: EmbeddedServer, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["--url", server.url, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_shows_counts_and_leases(
    r: redis.Redis, client: echomq.Client, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(3):
        client.enqueue(Q, job_id=f"j{i}")
    job = client.claim(Q, lease_ms=60_000)
    assert job is not None
    r.hset(K.metrics_failed, "count", 4)
    client.cancel(Q, job.id, "stop please")
    code, out, _ = run(server, capsys, "inspect", Q)
    assert code == 0
    assert "pending 2   active 1   dead 0   dead-lettered ever 4" in out
    assert "backend module (the emq module's EMQ.* commands)" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("j0"))
    assert " ms" in line and "stop please" in line
    assert line.split()[1] == "-"  # its task: a raw job
    left = int(line.split()[3])
    assert 50_000 < left <= 60_000


def test_inspect_token_column_is_the_holders_token(
    client: echomq.Client, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client.enqueue(Q, job_id="j0")
    job = client.claim(Q, lease_ms=60_000)
    assert job is not None
    code, out, _ = run(server, capsys, "inspect", Q)
    assert code == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("j0"))
    assert line.split()[2] == job.token  # after the job and its task


def test_inspect_shows_lapsed_leases(
    r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    r.zadd(K.active, {"old": 1000})
    r.hset(K.job("old"), mapping={"attempts": 2, "stalled": 1})
    code, out, _ = run(server, capsys, "inspect", Q)
    assert code == 0 and "lapsed" in out and "old" in out


def test_sweep_command(r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]) -> None:
    r.zadd(K.active, {"a": 1, "b": 2})
    r.hset(K.job("b"), "stalled", 2)
    code, out, _ = run(server, capsys, "sweep", Q, "--max-stalled", "3")
    assert code == 0
    assert "recovered 1 (a)" in out and "dead 1 (b)" in out
    assert r.zrange(K.dead, 0, -1) == [b"b"]


def test_reap_command_runs_for_a_duration(
    r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    r.zadd(K.active, {f"j{i}": i for i in range(5)})
    code, out, _ = run(
        server, capsys, "reap", Q, "--interval", "0.05", "--duration", "0.3", "--max-stalled", "5"
    )
    assert code == 0 and "total recovered 5 (j0 j1 j2 j3 j4)  dead 0  cancelled 0  expired 0  errors 0" in out
    assert queued(r, K) == 5


def test_cancel_command(
    client: echomq.Client, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client.enqueue(Q, job_id="waiting")
    code, out, _ = run(server, capsys, "cancel", Q, "waiting", "--reason", "no longer needed")
    assert code == 0 and out.startswith("cancelled")
    code, _, err = run(server, capsys, "cancel", Q, "ghost")
    assert code == 1 and "no job 'ghost'" in err


def test_enqueue_command(r: redis.Redis, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(server, capsys, "enqueue", Q, '{"n": 1}', "--id", "x1")
    assert code == 0 and out.strip() == "x1"
    assert r.hget(K.job("x1"), "payload") == b'{"n": 1}'
    code, _, err = run(server, capsys, "enqueue", Q, "again", "--id", "x1")
    assert code == 1 and "already exists" in err


def test_enqueue_with_a_priority_and_inspect_by_level(
    client: echomq.Client, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    for job_id, level in (("u", "-5"), ("v", "-5"), ("w", "0"), ("x", "12")):
        code, out, _ = run(server, capsys, "enqueue", Q, "p", "--id", job_id, "--priority", level)
        assert code == 0 and out.strip() == job_id
    assert [p.priority for p in client.pending(Q)] == [-5, -5, 0, 12]
    with pytest.raises(SystemExit):  # argparse refuses it, with the range in the message
        run(server, capsys, "enqueue", Q, "p", "--priority", "1001")
    assert "expected an integer from -1000 to 1000" in capsys.readouterr().err
    client.enqueue(Q, job_id="gone")
    client.cancel(Q, "gone")
    code, out, _ = run(server, capsys, "inspect", Q)
    assert code == 0 and "pending 4" in out
    assert "pending by priority   -5: 2   0: 1   +12: 1" in out
    assert "tombstones 1" in out


def test_job_shows_the_level_progress_result_and_traceback(
    client: echomq.Client, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client.enqueue(Q, "x" * 200, job_id="j", priority=4)
    job = client.claim(Q, 60_000)
    assert job is not None
    client.checkpoint(Q, "j", job.token, 60_000, progress="3/4")
    client.fail(Q, "j", job.token, "ValueError: no", traceback="Traceback (most recent call last):\n  boom\n")
    job = client.claim(Q, 60_000)
    assert job is not None
    client.complete(Q, "j", job.token, result="r" * 70 + "\n")
    code, out, _ = run(server, capsys, "job", Q, "j", "--payload")
    assert code == 0
    lines = out.splitlines()
    assert "  priority         4" in lines and "  progress         3/4" in lines
    assert f"  result           71 bytes: {'r' * 60}..." in lines
    assert "    Traceback (most recent call last):" in lines and "      boom" in lines
    assert "  payload          200 bytes" in lines and "x" * 200 in lines


def test_url_from_environment(
    server: EmbeddedServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ECHOMQ_URL", server.url)
    assert main(["sweep", Q]) == 0
    assert "recovered 0" in capsys.readouterr().out


def test_clear_errors_and_exit_codes(capsys: pytest.CaptureFixture[str], server_factory: object) -> None:
    assert main(["--url", "redis://127.0.0.1:1/0", "inspect", Q]) == 1
    assert "cannot connect" in capsys.readouterr().err
    assert main(["--url", "redis://127.0.0.1:1/0", "sweep", "bad{name"]) == 1
    assert "must not contain" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["sweep", Q, "--limit", "0"])
    assert info.value.code == 2


def test_module_not_loaded_is_explained(server_factory: object, capsys: pytest.CaptureFixture[str]) -> None:
    bare = server_factory(load_module=False)  # type: ignore[operator]
    assert main(["--url", bare.url, "--backend", "module", "sweep", Q]) == 1
    assert "--loadmodule" in capsys.readouterr().err


def test_without_the_module_the_cli_runs_the_scripts_and_says_so(
    server_factory: object, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = server_factory(load_module=False)  # type: ignore[operator]
    assert main(["--url", bare.url, "enqueue", Q, "x", "--id", "j"]) == 0
    assert main(["--url", bare.url, "inspect", Q]) == 0
    out = capsys.readouterr().out
    assert "backend scripts" in out and "pending 1" in out


def test_module_path_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["module-path"]) == 0
    path = capsys.readouterr().out.strip()
    assert path.endswith("emq.so") and os.path.isfile(path)


def test_server_command_starts_and_stops_a_server() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq", "server"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "--loadmodule" in first and first.split()[-1].endswith("emq.so")
        url = first.split()[1]
        conn = redis.Redis.from_url(url)
        assert echomq.Client(conn).sweep(Q) == echomq.SweepResult()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                conn.ping()
            except redis.ConnectionError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the server outlived `echomq server`")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
