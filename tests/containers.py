"""The Docker image as a test server, through testcontainers.

Selected by ``ECHOMQ_TESTCONTAINERS=1``: the suite's shared ``server``
fixture (and so ``r`` and ``client``) then runs in a container of the image
instead of a local redis-server.  Servers that tests start with options of
their own (replicas, AOF restarts: ``server_factory``) stay local.

The image is ``$ECHOMQ_IMAGE`` (``make test`` and ``make image`` build it on a
stand-in base: tests/docker_engine.py), else the top-level Dockerfile built
now on its default base.  Where no Docker engine answers, or the image cannot
be had (its base cannot be pulled, say), everything here is skipped with the
reason, never passed and never an error: ``tests/house/test_container.py`` and, when
selected, every test that uses ``server``.

Every port is published on 127.0.0.1 only, and the client connects there:
testcontainers would otherwise publish on every interface where it believes it
runs inside a container (a ``/.dockerenv``), and reach for a gateway address.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

# Before testcontainers reads its configuration (at import): no Ryuk (its image comes
# from Docker Hub), and the engine's host is this machine's loopback.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
os.environ.setdefault("TESTCONTAINERS_CONNECTION_MODE", "docker_host")
os.environ.setdefault("TC_HOST", "127.0.0.1")

ROOT = Path(__file__).resolve().parent.parent
SELECT_ENV = "ECHOMQ_TESTCONTAINERS"
IMAGE_ENV = "ECHOMQ_IMAGE"
VALKEY_IMAGE_ENV = "ECHOMQ_VALKEY_IMAGE"
UNAVAILABLE = "_UNAVAILABLE"  # ECHOMQ_IMAGE_UNAVAILABLE: why tests/docker_engine.py has no image
ENGINE_UNAVAILABLE_ENV = "ECHOMQ_DOCKER_UNAVAILABLE"
IMAGE_TAG = "echomq-redis:test"
VALKEY_IMAGE_TAG = "echomq-valkey:test"
VALKEY_BASE = "valkey/valkey:8.1"  # where a registry answers: the official Valkey image
MODULE_IN_IMAGE = "/usr/local/lib/redis/modules/emq.so"
REDIS_PORT = 6379
LOOPBACK = "127.0.0.1"


def selected() -> bool:
    return os.environ.get(SELECT_ENV, "") not in ("", "0")


def _docker() -> Any:
    import docker

    return docker.from_env(timeout=30)


@functools.lru_cache(maxsize=1)
def docker_unavailable() -> str | None:
    """None when a Docker engine answers a ping, else why not (a skip reason)."""
    try:
        import docker  # noqa: F401
        import testcontainers.core.container  # noqa: F401
    except ImportError as exc:
        return f"testcontainers is not installed ({exc}); pip install -e '.[test]'"
    told = os.environ.get(ENGINE_UNAVAILABLE_ENV)  # make test's own attempt, and why it failed
    try:
        client = _docker()
    except Exception as exc:
        return told or f"Docker engine not available ({type(exc).__name__}: {exc})"
    try:
        client.ping()
    except Exception as exc:
        return told or f"Docker engine not available ({type(exc).__name__}: {exc})"
    finally:
        client.close()
    return None


def skip_without_docker(why: str = "") -> None:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(why + reason)


def _default_base() -> str:
    match = re.search(r"^ARG REDIS_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert match is not None, "the Dockerfile declares ARG REDIS_IMAGE=<default base>"
    return match.group(1)


def _base_or_skip(base: str, why: str) -> None:
    """The base image is here, or pulled now; else the calling test or fixture is skipped."""
    client = _docker()
    try:
        try:
            client.images.get(base)
            return
        except Exception:
            pass
        try:
            client.images.pull(base)
        except Exception as exc:
            pytest.skip(f"{why}the base image {base} cannot be pulled ({type(exc).__name__}: {exc})")
    finally:
        client.close()


@functools.cache
def _built(tag: str, base: str) -> str:
    from testcontainers.core.image import DockerImage

    # Kept after the run (clean_up=False) so that the next run's build is a cache hit.
    image = DockerImage(path=str(ROOT), tag=tag, clean_up=False, buildargs={"REDIS_IMAGE": base})
    image.build()
    return str(image)


def image_tag(env: str = IMAGE_ENV, base: str | None = None, why: str = "") -> str:
    """The image to run: ``$<env>`` if set, else the Dockerfile built now on ``base`` (its default).

    Skips the caller where tests/docker_engine.py said why it has no image
    (``$<env>_UNAVAILABLE``), or where the base cannot be pulled.
    """
    prebuilt = os.environ.get(env)
    if prebuilt:
        return prebuilt
    told = os.environ.get(env + UNAVAILABLE)
    if told:
        pytest.skip(why + told)
    base = base or _default_base()
    _base_or_skip(base, why)
    return _built(IMAGE_TAG if env == IMAGE_ENV else VALKEY_IMAGE_TAG, base)


def image_config(tag: str) -> dict[str, Any]:
    """The image's configuration (Cmd, Env, User, Labels...)."""
    client = _docker()
    try:
        return dict(client.images.get(tag).attrs["Config"])
    finally:
        client.close()


def run_in_image(tag: str, *argv: str) -> str:
    """``argv``'s output in a throwaway container of ``tag`` (no port published).

    Run by exec in an idle container, not as the container's command: the output of
    a command that exits at once is read from its log, which can still be empty then.
    """
    client = _docker()
    try:
        idle = client.containers.run(tag, ["sleep", "600"], detach=True)
        try:
            code, out = idle.exec_run(list(argv))
        finally:
            idle.remove(force=True)
    finally:
        client.close()
    text = bytes(out).decode(errors="replace")
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} in {tag} exited {code}: {text}")
    return text


def server_version(tag: str) -> tuple[str, tuple[int, ...]]:
    """("redis" or "valkey", its version) of the server binary in the image."""
    out = run_in_image(tag, "redis-server", "--version")
    match = re.search(r"(Redis|Valkey) server v=(\d+)\.(\d+)\.(\d+)", out)
    if match is None:
        raise RuntimeError(f"cannot tell the version of the server in {tag}: {out!r}")
    return match.group(1).lower(), tuple(int(x) for x in match.groups()[1:])


@functools.cache
def suite_engine_version() -> tuple[str, tuple[int, ...]] | None:
    """The selected image's server version (tests/conftest.py's engine_version), or None without one."""
    if docker_unavailable() is not None:
        return None
    try:
        tag = image_tag()
    except pytest.skip.Exception:  # no image to be had: the fixture says why when a test asks
        return None
    return server_version(tag)


class ContainerServer:
    """The image in a container, with the surface the tests use on EmbeddedServer.

    ``logfile`` is the container's log (``docker logs``), copied to a file
    when read; ``pause()``/``unpause()`` freeze it and let it go on (the
    engine's freezer: to its clients, what SIGSTOP/SIGCONT are to a process).
    """

    def __init__(
        self, image: str, command: Sequence[str] | None = None, startup_timeout: float = 60.0
    ) -> None:
        from testcontainers.core.container import DockerContainer

        self.image = image
        self.container = DockerContainer(image)
        # Published on loopback only (an address given, so the engine's own default does not matter).
        self.container.ports[f"{REDIS_PORT}/tcp"] = (LOOPBACK,)  # type: ignore[assignment]
        if command is not None:
            self.container = self.container.with_command(list(command))
        self.startup_timeout = startup_timeout
        self.host = LOOPBACK
        self.port = 0
        self._log_dir = Path(tempfile.mkdtemp(prefix="echomq-container-log-"))

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def logfile(self) -> Path:
        path = self._log_dir / "server.log"
        out, err = self.container.get_logs()
        path.write_bytes(out + err)
        return path

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, **kwargs)

    def _attrs(self) -> dict[str, Any]:
        wrapped = self.container.get_wrapped_container()
        wrapped.reload()
        return dict(wrapped.attrs)

    def published(self) -> list[tuple[str, str, str]]:
        """Every (container port, host address, host port) the engine publishes for this container."""
        ports = self._attrs()["NetworkSettings"]["Ports"] or {}
        return [
            (inner, binding["HostIp"], binding["HostPort"])
            for inner, bindings in sorted(ports.items())
            for binding in bindings or ()
        ]

    def start(self) -> ContainerServer:
        self.container.start()
        bindings = [(ip, port) for inner, ip, port in self.published() if inner == f"{REDIS_PORT}/tcp"]
        assert len(bindings) == 1 and bindings[0][0] == LOOPBACK, bindings
        self.port = int(bindings[0][1])
        deadline = time.monotonic() + self.startup_timeout
        probe = self.client(socket_timeout=1)
        try:
            while True:
                try:
                    if probe.ping():
                        return self
                except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    logs = self.log_tail()
                    self.stop()
                    raise RuntimeError(f"the container did not answer PING:\n{logs}")
                time.sleep(0.1)
        finally:
            probe.close()

    def exec(self, *argv: str) -> tuple[int, str]:
        result = self.container.exec(list(argv))
        return result.exit_code, result.output.decode(errors="replace")

    def health(self) -> str:
        """Docker's view of the image's HEALTHCHECK: starting, healthy or unhealthy."""
        return str(self._attrs()["State"].get("Health", {}).get("Status", "none"))

    def pause(self) -> None:
        self.container.get_wrapped_container().pause()

    def unpause(self) -> None:
        self.container.get_wrapped_container().unpause()

    def log_tail(self, lines: int = 30) -> str:
        try:
            out, err = self.container.get_logs()
        except Exception as exc:  # the container may be gone already
            return f"(no logs: {exc})"
        text = (out + err).decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        self.container.stop()
        for entry in self._log_dir.glob("*"):
            entry.unlink()
        self._log_dir.rmdir()


@contextmanager
def running(
    command: Sequence[str] | None = None, why: str = "", env: str = IMAGE_ENV, base: str | None = None
) -> Iterator[ContainerServer]:
    """A started container of the image (skips the calling test or fixture without one)."""
    skip_without_docker(why)
    tag = image_tag(env, base, why)
    srv = ContainerServer(tag, command).start()
    try:
        yield srv
    finally:
        srv.stop()


@contextmanager
def suite_server() -> Iterator[ContainerServer]:
    """The container behind the suite's ``server`` fixture: the image's own command plus DEBUG (digests)."""
    why = f"{SELECT_ENV}=1 runs the suite in the Docker image, but: "
    skip_without_docker(why)
    command = [*image_config(image_tag(why=why))["Cmd"], "--enable-debug-command", "yes"]
    with running(command, why=why) as srv:
        yield srv
