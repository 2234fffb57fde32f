"""Bad settings are refused when a Worker, Reaper or LeaseKeeper is made, naming the argument (issue 15).

They used to be accepted and then fail on every poll, forever, with a
traceback each time (``lease_ms=-1``, ``"a{b}"``, ``max_stalled=0``) or with
``TypeError: '<' not supported`` (``concurrency="4"``).  Sync and asyncio alike.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

import echomq
import echomq.asyncio as emq

JOB = echomq.Job("q", "j", "1-00000000000000aa", b"")


def sync_handler(job: echomq.Job, cancel: echomq.CancelToken) -> None:
    return None


async def async_handler(ctx: emq.JobContext) -> None:
    return None


CLIENTS = {"sync": lambda: echomq.Client(redis.Redis()), "asyncio": lambda: emq.Client(aioredis.Redis())}
MODULES: dict[str, Any] = {"sync": echomq, "asyncio": emq}
HANDLERS: dict[str, Any] = {"sync": sync_handler, "asyncio": async_handler}

WORKER_CASES = [
    ({"lease_ms": -1}, ValueError, "lease_ms"),
    ({"lease_ms": 2**60}, ValueError, "lease_ms"),
    ({"lease_ms": "30s"}, TypeError, "lease_ms"),
    ({"concurrency": "4"}, TypeError, "concurrency"),
    ({"concurrency": 0}, ValueError, "concurrency"),
    ({"max_attempts": 0}, ValueError, "max_attempts"),
    ({"poll_interval": 0}, ValueError, "poll_interval"),
    ({"poll_interval": "fast"}, TypeError, "poll_interval"),
    ({"extend_interval": 0}, ValueError, "extend_interval"),
    ({"lease_ms": 1000, "extend_interval": 2.0}, ValueError, "extend_interval"),
    ({"grace": -1}, ValueError, "grace"),
    ({"grace": float("inf")}, ValueError, "grace"),
]


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
@pytest.mark.parametrize(("settings", "exc", "name"), WORKER_CASES, ids=[str(c[0]) for c in WORKER_CASES])
def test_worker_settings(kind: str, settings: dict[str, Any], exc: type[Exception], name: str) -> None:
    with pytest.raises(exc, match=name):
        MODULES[kind].Worker(CLIENTS[kind](), "q", HANDLERS[kind], **settings)


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_worker_queue_handler_and_client(kind: str) -> None:
    module, client, handler = MODULES[kind], CLIENTS[kind](), HANDLERS[kind]
    with pytest.raises(ValueError, match="must not contain"):
        module.Worker(client, "a{b}", handler)
    with pytest.raises(TypeError, match="queue"):
        module.Worker(client, 5, handler)
    with pytest.raises(TypeError, match="handler"):
        module.Worker(client, "q", "handler")
    other = "asyncio" if kind == "sync" else "sync"
    with pytest.raises(TypeError, match="client"):  # a client of the other package
        module.Worker(CLIENTS[other](), "q", handler)
    with pytest.raises(TypeError, match="coroutine" if kind == "sync" else "async def"):
        module.Worker(client, "q", HANDLERS[other])  # a handler of the other kind


REAPER_CASES = [
    ({"max_stalled": 0}, ValueError, "max_stalled"),
    ({"limit": 0}, ValueError, "limit"),
    ({"limit": 1.5}, TypeError, "limit"),
    ({"interval": -1}, ValueError, "interval"),
    ({"on_sweep": "print"}, TypeError, "on_sweep"),
]


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
@pytest.mark.parametrize(("settings", "exc", "name"), REAPER_CASES, ids=[str(c[0]) for c in REAPER_CASES])
def test_reaper_settings(kind: str, settings: dict[str, Any], exc: type[Exception], name: str) -> None:
    with pytest.raises(exc, match=name):
        MODULES[kind].Reaper(CLIENTS[kind](), "q", **settings)
    with pytest.raises(ValueError, match="must not contain"):
        MODULES[kind].Reaper(CLIENTS[kind](), "a{b}")


KEEPER_CASES = [
    ((JOB, -1), {}, ValueError, "lease_ms"),
    ((JOB, 1000), {"interval": 0}, ValueError, "interval"),
    ((JOB, 1000), {"clock": 5}, TypeError, "clock"),
    ((JOB, 1000), {"claimed_at": "now"}, TypeError, "claimed_at"),
    ((JOB, 1000), {"deliver_cancel": "yes"}, TypeError, "deliver_cancel"),
    (("not a job", 1000), {}, TypeError, "job"),
    ((echomq.Job("q", "j", 1, b""), 1000), {}, TypeError, "token"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
@pytest.mark.parametrize(("args", "settings", "exc", "name"), KEEPER_CASES, ids=[c[3] for c in KEEPER_CASES])
def test_lease_keeper_settings(
    kind: str, args: tuple[Any, int], settings: dict[str, Any], exc: type[Exception], name: str
) -> None:
    job, lease_ms = args
    with pytest.raises(exc, match=name):
        MODULES[kind].LeaseKeeper(CLIENTS[kind](), job, lease_ms, echomq.CancelToken(), **settings)
    with pytest.raises(TypeError, match="cancel"):
        MODULES[kind].LeaseKeeper(CLIENTS[kind](), JOB, 1000, "token")
