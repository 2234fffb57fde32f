"""The Docker image itself, run through testcontainers.

``make test`` starts a Docker engine where none answers, builds the image on
a stand-in base (tests/docker_engine.py: no registry is reachable here) and
runs this file with ``ECHOMQ_IMAGE`` set, then the smoke subset with the
container as the shared server.  Run by hand without ``ECHOMQ_IMAGE``, the
Dockerfile is built on its default base.  Where no engine answers or the
image cannot be had (its base cannot be pulled, say), every test here is
skipped with the reason.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import pytest
import redis

import echomq

from .. import containers
from ..containers import LOOPBACK, MODULE_IN_IMAGE, ContainerServer

pytestmark = [
    pytest.mark.skipif(
        containers.docker_unavailable() is not None, reason=str(containers.docker_unavailable())
    ),
    pytest.mark.once,
    pytest.mark.image,
]


@pytest.fixture(scope="module")
def image_server() -> Iterator[ContainerServer]:
    """The image started with its own command, exactly as a user runs it."""
    with containers.running() as srv:
        yield srv


@pytest.fixture(scope="module")
def valkey_server() -> Iterator[ContainerServer]:
    """The image built on a Valkey base (the Dockerfile's REDIS_IMAGE), with its own command."""
    why = "the Valkey variant: "
    with containers.running(why=why, env=containers.VALKEY_IMAGE_ENV, base=containers.VALKEY_BASE) as srv:
        yield srv


def expected_version(tag: str) -> str:
    """The server version the image says it ships: the official images' ENV, else Debian's package."""
    env = dict(item.split("=", 1) for item in containers.image_config(tag).get("Env") or [])
    for name in ("REDIS_VERSION", "VALKEY_VERSION"):
        if name in env:
            return env[name]
    package = containers.run_in_image(tag, "dpkg-query", "-W", "-f", "${Version}", "redis-server")
    match = re.fullmatch(r"(?:\d+:)?(\d+\.\d+\.\d+)[-+~].*", package.strip())  # 5:7.0.15-1~deb12u7
    assert match is not None, package
    return match.group(1)


def running_version(r: redis.Redis) -> str:
    info = r.info("server")
    return str(info.get("valkey_version") or info["redis_version"])


def test_image_loads_the_module_at_start(image_server: ContainerServer) -> None:
    r = image_server.client()
    modules = r.execute_command("MODULE", "LIST")
    assert [(m[b"name"], m[b"path"]) for m in modules] == [(b"emq", MODULE_IN_IMAGE.encode())]
    assert running_version(r) == expected_version(image_server.image)


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


def _found(server: ContainerServer, tool: str) -> bool:
    # One name per lookup: POSIX `command -v a b c` looks up only the first (Debian's dash does).
    code, out = server.exec("sh", "-c", 'command -v "$1"', "sh", tool)
    return code == 0 and out.strip() != ""


def test_image_runs_as_non_root_without_compilers(image_server: ContainerServer) -> None:
    code, uid = image_server.exec("id", "-u")
    assert code == 0 and uid.strip() == "999"
    for tool in ("gcc", "cc", "make"):
        assert not _found(image_server, tool), f"{tool} ships in the image"
    assert _found(image_server, "redis-server")  # the control: the same lookup finds what is there


def test_image_has_what_the_official_one_has(image_server: ContainerServer) -> None:
    # The account uid 999 has a name, /data is its own and the server's directory, protected mode
    # is off (clients come through the published port), whatever the base.
    code, name = image_server.exec("id", "-un")
    assert code == 0 and name.strip() in ("redis", "valkey")
    code, owner = image_server.exec("stat", "-c", "%u:%g", "/data")
    assert code == 0 and owner.strip() == "999:999"
    r = image_server.client()
    assert r.config_get("dir") == {"dir": "/data"}
    assert r.config_get("protected-mode") == {"protected-mode": "no"}


def test_every_port_is_published_on_loopback_only(image_server: ContainerServer) -> None:
    assert image_server.published() == [(f"{containers.REDIS_PORT}/tcp", LOOPBACK, str(image_server.port))]
    # Every container of the suite's images running now (the shared servers of every test process
    # too), in one listing: another process may remove its container meanwhile.
    client = containers._docker()
    try:
        ours = [c for c in client.api.containers() if c["Image"] in _suite_images()]
    finally:
        client.close()
    assert image_server.container.get_wrapped_container().id in [c["Id"] for c in ours]
    published = [(c["Image"], p) for c in ours for p in c["Ports"] if p.get("PublicPort")]
    assert published and all(p["IP"] == LOOPBACK for _, p in published), published


def _suite_images() -> set[str]:
    names = {containers.IMAGE_TAG, containers.VALKEY_IMAGE_TAG}
    given = (os.environ.get(e) for e in (containers.IMAGE_ENV, containers.VALKEY_IMAGE_ENV))
    return names | {tag for tag in given if tag}


def test_image_becomes_healthy(image_server: ContainerServer) -> None:
    deadline = time.monotonic() + 90  # the first check runs one interval (10 s) after start
    status = image_server.health()
    while status != "healthy" and time.monotonic() < deadline:
        time.sleep(1)
        status = image_server.health()
    assert status == "healthy"


def test_the_container_server_has_a_log_and_freezes(image_server: ContainerServer) -> None:
    # What the suite's tests use on a server when the container is the shared one.
    log = image_server.logfile.read_text(errors="replace")
    assert f"Module 'emq' loaded from {MODULE_IN_IMAGE}" in log
    r = image_server.client(socket_timeout=0.5)
    image_server.pause()
    try:
        with pytest.raises(redis.exceptions.TimeoutError):  # connected, and nothing answers
            r.ping()
    finally:
        image_server.unpause()
    assert image_server.client(socket_timeout=10).ping()


def test_the_suite_server_is_the_container_when_selected(request: pytest.FixtureRequest) -> None:
    if not containers.selected():
        pytest.skip(f"the shared server is local ({containers.SELECT_ENV} is not set)")
    server = request.getfixturevalue("server")
    assert isinstance(server, ContainerServer)
    assert server.published() == [(f"{containers.REDIS_PORT}/tcp", LOOPBACK, str(server.port))]
    assert b"emq" in [m[b"name"] for m in server.client().module_list()]


def test_valkey_variant_loads_the_module_and_serves(valkey_server: ContainerServer) -> None:
    r = valkey_server.client()
    info = r.info("server")
    assert info.get("server_name") == "valkey" or "valkey_version" in info, info
    assert running_version(r) == expected_version(valkey_server.image)
    assert [m[b"name"] for m in r.module_list()] == [b"emq"]
    code, name = valkey_server.exec("id", "-un")
    assert code == 0 and name.strip() == "valkey"
    client = echomq.Client(r)
    client.enqueue("vk", b"hello", job_id="j1")
    job = client.claim("vk", lease_ms=30_000)
    assert job is not None and job.id == "j1" and job.payload == b"hello"
    client.complete("vk", job.id, job.token)
    info_job = client.job("vk", "j1")
    assert info_job is not None and info_job.state == "done"
