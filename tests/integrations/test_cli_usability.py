"""The CLI as a new user meets it (issue 30's smaller stumbles): `echomq server` says how to point
the CLI at it, a refused connection is reported at once, a reader that leaves early ends it
cleanly, `enqueue` delays and reads big payloads, `dead` and `inspect` say what they count,
`inspect` names how the scripts run, times are local times and ages, no option is a prefix,
and the exporter binds with --host as the dashboard does."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis

import echomq
from echomq.cli import build_parser, main
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..calibration import budget
from ..conftest import ServerFactory
from ..examples import LOCAL_TIME
from .test_cli_surface import echomq_cli

pytestmark = pytest.mark.once

Q = "usable"
K = queue_keys(Q)
EPOCH_MS = re.compile(r"\b1[0-9]{12}\b")


def closed_port() -> int:
    with socket.socket() as sock:  # bound, never listening: a connection to it is refused
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_server_says_how_to_point_the_cli_at_it(tmp_path: Path) -> None:
    # It printed its URL, and `echomq enqueue` in another shell went to localhost:6379.
    env = {k: v for k, v in os.environ.items() if k != "ECHOMQ_URL"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq", "server"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        url = lines[0].split()[1]
        (export,) = [line.split(":  ", 1)[1].strip() for line in lines if "export ECHOMQ_URL=" in line]
        assert export == f"export ECHOMQ_URL={url}"
        # What the user then types in another shell:
        done = subprocess.run(
            ["bash", "-c", f"{export}; {sys.executable} -m echomq enqueue {Q} hello --id pointed"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout.strip() == "pointed", done.stderr
        assert echomq.Client(redis.Redis.from_url(url)).counts(Q).pending == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def test_a_refused_connection_is_reported_at_once() -> None:
    started = time.monotonic()
    done = echomq_cli("inspect", Q, "--url", f"redis://127.0.0.1:{closed_port()}/0")
    took = time.monotonic() - started
    assert done.returncode == 1 and "cannot connect" in done.stderr and "refused" in done.stderr
    assert took < budget(5.0, under=7.1)  # 7.1 s at e64777a (ten retries), the interpreter's start-up now


def test_a_reader_that_leaves_early_ends_the_command_cleanly(
    client: echomq.Client, server: EmbeddedServer
) -> None:
    # `echomq job ... --payload | head` ended in a BrokenPipeError traceback, exit status 1.
    client.enqueue(Q, "".join(f"line {i}\n" for i in range(40_000)), job_id="long")  # ~400 KB
    env = dict(os.environ, ECHOMQ_URL=server.url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq", "job", Q, "long", "--payload"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(100).startswith(b"job long of queue")  # `head -c 100`
    proc.stdout.close()
    assert proc.wait(timeout=60) == 0
    assert proc.stderr.read() == b""
    # And through a real shell pipe, as typed:
    done = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"{sys.executable} -m echomq job {Q} long --payload | head -n 3"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and done.stderr == "" and done.stdout.startswith(f"job long of queue {Q}")


def test_enqueue_reads_a_big_payload_from_stdin_or_a_file(
    r: redis.Redis, server: EmbeddedServer, tmp_path: Path
) -> None:
    # 200 KB as an argument failed with "Argument list too long".
    text = ("x" * 99 + "\n") * 2048  # 200 KB
    env = {"ECHOMQ_URL": server.url}
    done = subprocess.run(
        [sys.executable, "-m", "echomq", "enqueue", Q, "-", "--id", "stdin"],
        input=text, capture_output=True, text=True, env=dict(os.environ, **env), timeout=60,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "stdin", done.stderr
    assert r.hget(K.job("stdin"), "payload") == text.encode()
    binary = bytes(range(256)) * 800  # not UTF-8: bytes as they are
    (tmp_path / "payload.bin").write_bytes(binary)
    done = echomq_cli("enqueue", Q, f"@{tmp_path / 'payload.bin'}", "--id", "file", env=env)
    assert done.returncode == 0 and done.stdout.strip() == "file", done.stderr
    assert r.hget(K.job("file"), "payload") == binary
    missing = echomq_cli("enqueue", Q, f"@{tmp_path / 'nothing.bin'}", env=env)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    assert "cannot read the payload from" in missing.stderr and "No such file" in missing.stderr
    assert echomq.Client(r).counts(Q).pending == 2  # nothing enqueued by the failure


def test_enqueue_delays_a_job(
    client: echomq.Client, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", server.url, "enqueue", Q, "x", "--id", "later", "--delay", "5m"]) == 0
    info = client.job(Q, "later")
    assert info is not None and info.due_at is not None
    assert 299_000 <= info.due_at - info.server_time <= 300_000
    at = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=2)
    assert main(["--url", server.url, "enqueue", Q, "x", "--id", "at", "--at", at.isoformat()]) == 0
    info = client.job(Q, "at")
    assert info is not None and info.due_at == int(at.timestamp() * 1000)
    naive_local = at.astimezone().replace(tzinfo=None).isoformat()  # no offset: local time
    assert main(["--url", server.url, "enqueue", Q, "x", "--id", "local", "--at", naive_local]) == 0
    info = client.job(Q, "local")
    assert info is not None and info.due_at == int(at.timestamp() * 1000)
    assert main(["--url", server.url, "enqueue", Q, "x", "--id", "ms", "--delay", "1500ms"]) == 0
    info = client.job(Q, "ms")
    assert info is not None and info.due_at is not None and 0 < info.due_at - info.server_time <= 1500
    assert client.counts(Q).delayed == 4
    capsys.readouterr()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--delay", "soon"], "argument --delay: expected a delay such as 30, 250ms"),
        (["--delay", "-5"], "argument --delay: expected a delay"),
        (["--at", "next tuesday"], "argument --at: expected a time such as 2026-12-01T09:30"),
        (["--delay", "5", "--at", "1796025080288"], "argument --at: not allowed with argument --delay"),
    ],
)
def test_enqueue_refuses_a_bad_time(argv: list[str], words: str) -> None:
    done = echomq_cli("enqueue", Q, "x", *argv)
    assert done.returncode == 2 and words in done.stderr, done.stderr


def test_dead_says_how_many_and_which_are_shown(
    client: echomq.Client, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--url", server.url, "dead", Q]) == 0
    assert capsys.readouterr().out == f"no dead jobs in queue {Q}\n"
    for i in range(3):
        client.enqueue(Q, b"", job_id=f"d{i}")
        job = client.claim(Q, lease_ms=10_000)
        assert job is not None
        client.fail(Q, job.id, job.token, "boom", max_attempts=1)
    assert main(["--url", server.url, "dead", Q]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"dead 3 in queue {Q} (oldest first)"  # it said "showing 3 from 0"
    assert [line.split()[0] for line in out[3:]] == ["d0", "d1", "d2"]
    assert main(["--url", server.url, "dead", Q, "--offset", "1", "--limit", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"dead 3 in queue {Q} (oldest first; 1 shown from #2: --offset, --limit)"
    assert out[3].split()[0] == "d1"
    assert main(["--url", server.url, "dead", Q, "--offset", "5"]) == 0
    assert (
        capsys.readouterr().out == f"dead 3 in queue {Q} (oldest first; none after the first 5: --offset)\n"
    )


def test_inspect_tells_the_dead_now_from_every_death(
    client: echomq.Client, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    client.enqueue(Q, b"", job_id="twice")
    for _ in range(2):
        job = client.claim(Q, lease_ms=10_000)
        assert job is not None
        client.fail(Q, job.id, job.token, "boom", max_attempts=1)
        client.retry(Q, "twice")
    assert main(["--url", server.url, "inspect", Q]) == 0
    out = capsys.readouterr().out
    assert "   dead 0   dead-lettered ever 2\n" in out  # it said "dead 0   failed 2"


def test_inspect_names_how_the_scripts_run(
    server: EmbeddedServer, server_factory: ServerFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "Lua scripts (EVALSHA)" while the client ran them as a library, by FCALL.
    assert main(["--url", server.url, "inspect", Q]) == 0
    assert "  backend module (the emq module's EMQ.* commands)\n" in capsys.readouterr().out
    bare = server_factory(load_module=False)
    assert main(["--url", bare.url, "inspect", Q]) == 0
    out = capsys.readouterr().out
    assert re.search(r"backend scripts \(Lua: the Functions library echomq_\w+ run by FCALL", out), out
    assert "EVALSHA" not in out
    # A user who may not FUNCTION LOAD gets one script per verb: EVALSHA.
    other = server_factory(load_module=False)
    other.client().execute_command(
        "ACL", "SETUSER", "noload", "on", ">noload-secret", "~*", "&*", "+@all", "-function|load"
    )
    url = f"redis://noload:noload-secret@127.0.0.1:{other.port}/0"
    assert main(["--url", url, "enqueue", Q, "x", "--id", "j"]) == 0
    assert main(["--url", url, "inspect", Q]) == 0
    out = capsys.readouterr().out
    assert "backend scripts (Lua scripts run by EVALSHA" in out and "pending 1" in out


def test_times_are_local_times_and_ages(
    client: echomq.Client, server: EmbeddedServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # `inspect` and `job` printed raw epoch ms (server time 1796025080288 ms).
    client.enqueue(Q, b"", job_id="t")
    job = client.claim(Q, lease_ms=60_000)
    assert job is not None
    client.checkpoint(Q, job.id, job.token, 60_000, state=b"state")
    assert main(["--url", server.url, "inspect", Q]) == 0
    out = capsys.readouterr().out
    assert re.match(rf"queue {Q}  \(server time {LOCAL_TIME}\)\n", out), out
    assert main(["--url", server.url, "job", Q, "t"]) == 0
    out = capsys.readouterr().out
    rows = dict(re.findall(r"^  (\w+(?: \w+)?) +(.*)$", out, re.M))
    for name in ("enqueued", "claimed"):
        assert re.fullmatch(rf"{LOCAL_TIME}  \([0-9.]+ (ms|s) ago\)", rows[name]), rows[name]
    assert re.search(rf"5 bytes, attempt 1, at {LOCAL_TIME}  \(", rows["checkpoint"]), rows["checkpoint"]
    assert not EPOCH_MS.search(out)
    shown = datetime.strptime(rows["enqueued"][:25], "%Y-%m-%d %H:%M:%S %z")
    assert abs(shown.timestamp() - time.time()) < 60  # this machine's local time, its offset stated


def test_ages_read_as_people_read_them() -> None:
    from echomq.cli._common import ago

    now = 10**12
    assert [ago(now, now - ms) for ms in (250, 3_200, 303_000, 7_500_000, 273_600_000)] == [
        "250 ms ago", "3.2 s ago", "5m 03s ago", "2h 05m ago", "3d 4h ago",
    ]  # fmt: skip
    assert ago(now, now + 90_000) == "in 1m 30s"


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "tests.shutdown_handlers:quick", "--queu", Q],  # started a worker
        ["--ur", "redis://127.0.0.1:1/0", "inspect", Q],
        ["inspect", Q, "--lim", "5"],
        ["worker", "tests.shutdown_handlers:quick", "-q", Q, "--concur", "2"],
    ],
)
def test_no_option_is_a_prefix(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(argv)
    assert stop.value.code == 2  # each parsed at e64777a: a prefix stood for the option
    err = capsys.readouterr().err
    assert any(words in err for words in ("unrecognized arguments", "are required", "invalid choice")), err


def test_the_exporter_binds_with_host_as_the_dashboard_does(server: EmbeddedServer) -> None:
    for option in ("--host", "--addr"):
        done = echomq_cli(
            "exporter", Q, "--url", server.url, option, "127.0.0.1", "--port", "0", "--duration", "0.2"
        )
        assert done.returncode == 0, done.stderr
        assert re.match(r"metrics of usable at http://127\.0\.0\.1:\d+/metrics$", done.stdout.strip())
        deprecated = "--addr is deprecated and will go: use --host" in done.stderr
        assert deprecated == (option == "--addr"), done.stderr
