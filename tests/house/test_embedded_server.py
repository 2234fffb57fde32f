"""EmbeddedServer never reports success for a server it did not start (issue 15)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..faults import pythonpath

pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parents[2]


def test_a_port_held_by_another_server_is_reported_taken_with_the_servers_own_words(
    server_factory: ServerFactory,
) -> None:
    # It used to report success and then talk to the other server (without
    # the module there).
    other = server_factory(load_module=False)
    with pytest.raises(RuntimeError) as info:
        EmbeddedServer(port=other.port).start()
    message = str(info.value)
    assert f"port {other.port} is taken" in message
    assert "Address already in use" in message  # the server's own log line
    assert str(other.process.pid) in message  # type: ignore[union-attr]  # who holds it


def test_a_port_held_by_something_that_is_not_a_server_is_reported_taken() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"port {port} is taken: .*Address already in use"):
            EmbeddedServer(port=port).start()


def test_a_server_that_fails_at_start_says_why() -> None:
    with pytest.raises(RuntimeError) as info:
        EmbeddedServer(["--no-such-option", "1"]).start()
    first = str(info.value).splitlines()[0]
    assert "exited at start: " in first and ("Bad directive" in first or "no-such-option" in first)


def test_the_server_answering_is_the_one_started(server_factory: ServerFactory) -> None:
    server = server_factory()  # an EmbeddedServer of its own: the shared one may be a container
    conn = server.client()
    assert int(conn.info("server")["process_id"]) == server.process.pid  # type: ignore[union-attr]


def test_echomq_server_on_a_taken_port_fails_cleanly(server: EmbeddedServer) -> None:
    env = dict(os.environ, PYTHONPATH=pythonpath(ROOT / "python"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq", "server", "--port", str(server.port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
    assert proc.returncode == 1
    assert out == ""  # no URL, no "Ctrl-C stops it" for a server that is not ours
    assert err.count("\n") == 1 and "is taken" in err and "Address already in use" in err
