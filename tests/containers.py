"""The Docker image as a test server, through testcontainers.

Selected by ``ECHOMQ_TESTCONTAINERS=1``: the suite's shared ``server``
fixture (and so ``r`` and ``client``) then runs in a container of the image
built from the top-level Dockerfile (or of ``$ECHOMQ_IMAGE`` if set, built
beforehand) instead of a local redis-server.  Servers that tests start with
options of their own (replicas, AOF restarts: ``server_factory``) stay local.

Where no Docker engine answers, everything here is skipped with the reason,
never passed: ``tests/test_container.py`` and, when selected, every test that
uses ``server``.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
SELECT_ENV = "ECHOMQ_TESTCONTAINERS"
IMAGE_ENV = "ECHOMQ_IMAGE"
IMAGE_TAG = "echomq-redis:test"
MODULE_IN_IMAGE = "/usr/local/lib/redis/modules/emq.so"
REDIS_PORT = 6379


def selected() -> bool:
    return os.environ.get(SELECT_ENV, "") not in ("", "0")


@functools.lru_cache(maxsize=1)
def docker_unavailable() -> str | None:
    """None when a Docker engine answers a ping, else why not (a skip reason)."""
    try:
        import docker
        import testcontainers.core.container  # noqa: F401
    except ImportError as exc:
        return f"testcontainers is not installed ({exc}); pip install -e '.[test]'"
    try:
        client = docker.from_env(timeout=5)
    except Exception as exc:
        return f"Docker engine not available ({type(exc).__name__}: {exc})"
    try:
        client.ping()
    except Exception as exc:
        return f"Docker engine not available ({type(exc).__name__}: {exc})"
    finally:
        client.close()
    return None


def skip_without_docker(why: str = "") -> None:
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(why + reason)


@contextmanager
def image() -> Iterator[str]:
    """The image to run: ``$ECHOMQ_IMAGE``, else the Dockerfile built now (cached layers if unchanged)."""
    prebuilt = os.environ.get(IMAGE_ENV)
    if prebuilt:
        yield prebuilt
        return
    from testcontainers.core.image import DockerImage

    # Kept after the run (clean_up=False) so the next run's build is a cache hit.
    with DockerImage(path=str(ROOT), tag=IMAGE_TAG, clean_up=False) as built:
        yield str(built)


class ContainerServer:
    """The image in a container, with the surface the tests use on EmbeddedServer."""

    def __init__(
        self, image: str, command: Sequence[str] | None = None, startup_timeout: float = 60.0
    ) -> None:
        from testcontainers.core.container import DockerContainer

        self.container = DockerContainer(image).with_exposed_ports(REDIS_PORT)
        if command is not None:
            self.container = self.container.with_command(list(command))
        self.startup_timeout = startup_timeout
        self.host = "127.0.0.1"
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, **kwargs)

    def start(self) -> ContainerServer:
        self.container.start()
        self.host = self.container.get_container_host_ip()
        self.port = int(self.container.get_exposed_port(REDIS_PORT))
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
        wrapped = self.container.get_wrapped_container()
        wrapped.reload()
        return str(wrapped.attrs["State"].get("Health", {}).get("Status", "none"))

    def log_tail(self, lines: int = 30) -> str:
        try:
            out, err = self.container.get_logs()
        except Exception as exc:  # the container may be gone already
            return f"(no logs: {exc})"
        text = (out + err).decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        self.container.stop()


@contextmanager
def running(command: Sequence[str] | None = None, why: str = "") -> Iterator[ContainerServer]:
    """A started container of the image (skips the calling test or fixture without Docker)."""
    skip_without_docker(why)
    with image() as tag:
        srv = ContainerServer(tag, command).start()
        try:
            yield srv
        finally:
            srv.stop()


def suite_server() -> Any:
    """The container behind the suite's ``server`` fixture: the image's command plus DEBUG (for digests)."""
    command = ["redis-server", "--loadmodule", MODULE_IN_IMAGE, "--enable-debug-command", "yes"]
    return running(command, why=f"{SELECT_ENV}=1 runs the suite in the Docker image, but: ")
