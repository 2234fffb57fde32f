"""Workflows on the task layer (issue 46 stage 2): ``task.options(after=[...])`` and
``echomq.tasks.parent_results()``, with real workers, sync and asyncio, on both backends.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq.tasks import parent_results
from echomq.testing import EmbeddedServer

pytestmark = [pytest.mark.backends]


def quick(app: echomq.App, **settings: Any) -> echomq.tasks.TaskWorker:
    return app.worker(poll_interval=0.02, grace=0.5, **settings)


def test_after_a_handle_or_an_id_and_the_parents_results(client: echomq.Client) -> None:
    app = echomq.App(client, queue="wf")

    @app.task
    def make(n: int) -> int:
        return n * 10

    @app.task
    def total() -> dict[str, Any]:
        return parent_results()

    a = make.enqueue(1)
    make.options(job_id="b").enqueue(2)
    last = total.options(after=[a, "b"]).enqueue()
    assert client.job("wf", last.id) is not None
    assert client.job("wf", last.id).state == "waiting"  # type: ignore[union-attr]
    with quick(app):
        assert last.result(timeout=20) == {a.id: 10, "b": 20}
        alone = total.enqueue()
        assert alone.result(timeout=20) == {}  # no parents: nothing to read


def test_a_failed_parent_fails_the_child_or_not_by_the_policy(client: echomq.Client) -> None:
    app = echomq.App(client, queue="wf")

    @app.task(max_attempts=1)
    def broken() -> int:
        raise echomq.NonRetryable("no")

    @app.task
    def seen() -> dict[str, Any]:
        return {"results": parent_results(), "failed": echomq.task_context().parents().failed}

    parent = broken.enqueue()
    failing = seen.options(after=[parent]).enqueue()
    running = seen.options(after=[parent], on_parent_failure="continue").enqueue()
    with quick(app):
        with pytest.raises(echomq.JobFailed, match="dependency"):
            failing.result(timeout=20)
        assert running.result(timeout=20) == {"results": {}, "failed": [parent.id]}


def test_bad_after_is_refused_before_anything_is_sent(client: echomq.Client) -> None:
    app = echomq.App(client, queue="wf")

    @app.task
    def step() -> None: ...

    @app.task(queue="elsewhere")
    def other() -> None: ...

    h = other.enqueue()
    keys = sorted(client.redis.keys("*"))
    with pytest.raises(ValueError, match="its own queue"):
        step.options(after=[h]).enqueue()
    with pytest.raises(TypeError, match="list of handles"):
        step.options(after=h)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="handles or job ids"):
        step.options(after=[3]).enqueue()
    with pytest.raises(ValueError, match="needs after="):
        step.options(on_parent_failure="ignore").enqueue()
    assert sorted(client.redis.keys("*")) == keys  # nothing written
    with pytest.raises(RuntimeError, match="no task runs here"):
        parent_results()


def test_asyncio_after_and_parent_results(server: EmbeddedServer, backend: str) -> None:
    async def main() -> None:
        client = emq.Client(redis.asyncio.Redis(port=server.port), backend=backend)
        app = emq.App(client, queue="awf")

        @app.task
        async def make(n: int) -> int:
            return n + 1

        @app.task
        def plain_total() -> int:  # run in a thread by the asyncio worker: still no I/O to read them
            return sum(parent_results().values())

        @app.task
        async def total() -> int:
            return sum(parent_results().values())

        a, b = await make.enqueue(1), await make.enqueue(2)
        last = await total.options(after=[a, b]).enqueue()
        last2 = await plain_total.options(after=[a, b.id]).enqueue()
        worker = app.worker(poll_interval=0.02, grace=0.5)
        running = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            assert await last.result(timeout=20) == 5
            assert await last2.result(timeout=20) == 5
        finally:
            worker.stop()
            await running
            await client.aclose()

    asyncio.run(main())
