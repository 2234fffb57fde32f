"""Fixtures: real redis-server processes with the freshly built emq.so loaded.

Nothing here is faked: every test talks to a server this file starts on a
free loopback port.  The module is rebuilt (make is incremental) once per
session so a test never runs against a stale .so.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

import echomq
from echomq import EmbeddedServer

from . import containers

ROOT = Path(__file__).resolve().parent.parent
MODULE_DIR = ROOT / "module"


@pytest.fixture(scope="session")
def module_so() -> Path:
    if "ECHOMQ_MODULE" in os.environ:
        return Path(os.environ["ECHOMQ_MODULE"])
    subprocess.run(["make", "-s", "-C", str(MODULE_DIR)], check=True)
    return MODULE_DIR / "emq.so"


ServerFactory = Callable[..., EmbeddedServer]


@pytest.fixture(scope="session")
def server_factory(module_so: Path) -> Iterator[ServerFactory]:
    """Start extra servers; every one is stopped at the end, even on failure."""
    started: list[EmbeddedServer] = []

    def start(args: list[str] | None = None, **kwargs: object) -> EmbeddedServer:
        srv = EmbeddedServer(
            ["--enable-debug-command", "yes", *(args or [])],
            module=module_so,
            **kwargs,  # type: ignore[arg-type]
        )
        started.append(srv)
        return srv.start()

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def server(server_factory: ServerFactory) -> Iterator[EmbeddedServer]:
    """The shared server: a local redis-server, or the Docker image when ECHOMQ_TESTCONTAINERS=1."""
    if containers.selected():  # see tests/containers.py; skips every user of `server` without Docker
        with containers.suite_server() as srv:
            yield srv
        return
    yield server_factory()


@pytest.fixture
def r(server: EmbeddedServer) -> Iterator[redis.Redis]:
    conn = server.client()
    conn.flushall()
    yield conn
    conn.close()


@pytest.fixture
def client(r: redis.Redis) -> echomq.Client:
    return echomq.Client(r)


def server_now_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_for_replica(master: redis.Redis, replica: redis.Redis, timeout: float = 10.0) -> None:
    """Block until the replica has processed everything the master sent."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = master.info("replication")
        s = replica.info("replication")
        if (
            s.get("master_link_status") == "up"
            and m.get("connected_slaves", 0) >= 1
            and s.get("slave_repl_offset") == m.get("master_repl_offset")
        ):
            return
        time.sleep(0.02)
    raise TimeoutError("replica did not catch up")
