"""FastAPI with echomq in its lifespan (docs/guides/fastapi.md), through httpx and a real uvicorn.

The app (tests/fastapi_app.py) runs an asyncio worker started by its
lifespan and stopped by the server's shutdown: a route enqueues, another
awaits the result.  The lifespan really runs: asgi-lifespan drives it for
httpx's in-process transport, and uvicorn on 127.0.0.1 for the shutdown tests.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
import redis

from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

fastapi = pytest.importorskip("fastapi", reason="fastapi is a test extra (pip install -e .[test])")
httpx = pytest.importorskip("httpx", reason="httpx is a test extra")
asgi_lifespan = pytest.importorskip("asgi_lifespan", reason="asgi-lifespan is a test extra")
uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is a test extra")

from ..fastapi_app import QUEUE, create_api  # noqa: E402 (after the skips: it imports fastapi)

pytestmark = pytest.mark.once

K = queue_keys(QUEUE)


def state(r: redis.Redis, job_id: str) -> str | None:
    value = r.hget(K.job(job_id), "state")
    return None if value is None else value.decode()


def test_routes_enqueue_and_await_results_through_the_lifespans_worker(
    server: EmbeddedServer, r: redis.Redis
) -> None:
    async def main() -> list[str]:
        api, ended = create_api(server.url)
        async with asgi_lifespan.LifespanManager(api) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
                posted = await http.post("/sums", params={"a": 2, "b": 40})
                assert posted.status_code == 202
                job_id = posted.json()["id"]
                got = await http.get(f"/sums/{job_id}")
                assert (got.status_code, got.json()) == (200, {"sum": 42})
                missing = await http.get("/sums/nope", params={"wait": 1})
                assert missing.status_code == 404
                assert ended == []  # the lifespan has not ended while the app serves
        return ended

    assert asyncio.run(main()) == ["lifespan"]


async def _serve(api: object) -> tuple[object, asyncio.Task[None], str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(api, lifespan="on", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    assert server.started, "uvicorn did not start"
    return server, task, f"http://127.0.0.1:{port}"


async def _until(check: object, what: str) -> None:
    for _ in range(1000):
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def test_uvicorns_shutdown_lets_the_running_task_finish_within_the_grace(
    server: EmbeddedServer, r: redis.Redis
) -> None:
    async def main() -> tuple[str, list[str]]:
        api, ended = create_api(server.url, grace=30)
        web, serving, base = await _serve(api)
        async with httpx.AsyncClient(base_url=base) as http:
            job_id = (await http.post("/slow", params={"seconds": 0.5})).json()["id"]
        await _until(lambda: state(r, job_id) == "active", "the slow task started")
        web.should_exit = True  # type: ignore[attr-defined]  # what uvicorn's SIGTERM handler does
        await serving
        return job_id, ended

    job_id, ended = asyncio.run(main())
    assert ended == ["slow", "lifespan"]  # the task ended before the lifespan (and the server)
    assert state(r, job_id) == "done"


def test_a_task_longer_than_the_grace_is_given_back_when_the_server_stops(
    server: EmbeddedServer, r: redis.Redis
) -> None:
    async def main() -> tuple[str, list[str]]:
        api, ended = create_api(server.url, grace=0.2)
        web, serving, base = await _serve(api)
        async with httpx.AsyncClient(base_url=base) as http:
            job_id = (await http.post("/slow", params={"seconds": 60})).json()["id"]
            # a request that awaits a result while the task runs: the app still answers
            got = await http.get(f"/sums/{job_id}", params={"wait": 0.2})
            assert got.status_code == 202
        await _until(lambda: state(r, job_id) == "active", "the slow task started")
        web.should_exit = True  # type: ignore[attr-defined]
        await serving
        return job_id, ended

    job_id, ended = asyncio.run(main())
    assert ended == ["lifespan"]  # the task was stopped, not finished
    assert state(r, job_id) == "pending"  # given back for another worker, no try used
    assert r.hget(K.job(job_id), "tries") == b"0"  # RELEASE gave its try back
