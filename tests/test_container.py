"""The Docker image itself, run through testcontainers.

Needs a Docker engine (and the network to pull redis:7.2.x-bookworm):
where none answers, every test here is skipped with the reason.  To run
the whole suite against the image as well, set ECHOMQ_TESTCONTAINERS=1
(see tests/containers.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import echomq

from . import containers
from .containers import MODULE_IN_IMAGE, ContainerServer

pytestmark = pytest.mark.skipif(
    containers.docker_unavailable() is not None, reason=str(containers.docker_unavailable())
)


@pytest.fixture(scope="module")
def image_server() -> Iterator[ContainerServer]:
    """The image started with its own command, exactly as a user runs it."""
    with containers.running() as srv:
        yield srv


def test_image_loads_the_module_at_start(image_server: ContainerServer) -> None:
    r = image_server.client()
    modules = r.execute_command("MODULE", "LIST")
    assert [(m[b"name"], m[b"path"]) for m in modules] == [(b"emq", MODULE_IN_IMAGE.encode())]
    assert r.info("server")["redis_version"].startswith("7.2.")


def test_image_round_trip(image_server: ContainerServer) -> None:
    r = image_server.client()
    r.flushall()
    client = echomq.Client(r)
    keys = echomq.keyspace.queue_keys("box")
    r.hset(keys.job("1"), mapping={"attempts": 3, "token": "3", "state": "active"})
    r.zadd(keys.active, {"1": 0})
    client.extend("box", "1", token="3", lease_ms=600_000)
    assert len(client.sweep("box", max_stalled=1)) == 0
    with pytest.raises(echomq.StaleToken):
        client.extend("box", "1", token="2", lease_ms=1000)
    r.zadd(keys.active, {"1": 0})
    assert client.sweep("box", max_stalled=1) == echomq.SweepResult(recovered=[], dead=["1"])
    assert r.hget(keys.job("1"), "state") == b"dead"


def test_image_runs_as_non_root_without_compilers(image_server: ContainerServer) -> None:
    code, uid = image_server.exec("id", "-u")
    assert code == 0 and uid.strip() == "999"
    code, found = image_server.exec("sh", "-c", "command -v gcc cc make")
    assert code != 0 and found.strip() == ""


def test_image_becomes_healthy(image_server: ContainerServer) -> None:
    deadline = time.monotonic() + 90  # the first check runs one interval (10 s) after start
    status = image_server.health()
    while status != "healthy" and time.monotonic() < deadline:
        time.sleep(1)
        status = image_server.health()
    assert status == "healthy"
