"""Workflows on the task layer (issue 46 stage 2): ``task.options(after=[...])`` and
``echomq.tasks.parent_results()``, with real workers, sync and asyncio, on both backends.
"""

from __future__ import annotations

import asyncio
import threading
import time
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

    @app.task(isolation="process")
    def isolated() -> None: ...

    with pytest.raises(ValueError, match="child process"):
        isolated.options(after=["x"]).enqueue()
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


# -- chains, groups, chords (canvas.py, flows.py) -----------------------------------------------


def flows_app(client: echomq.Client) -> tuple[echomq.App, Any]:
    app = echomq.App(client, queue="canvas")

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    @app.task
    def double(x: int) -> int:
        return 2 * x

    @app.task(max_attempts=1)
    def boom(x: int) -> int:
        raise ValueError(f"boom at {x}")

    @app.task
    def total(values: list[int | None], extra: int = 0) -> int:
        return sum(v or 0 for v in values) + extra

    return app, (add, double, boom, total)


def test_a_chain_enqueues_every_step_at_once_and_passes_each_result_on(client: echomq.Client) -> None:
    from echomq.tasks import chain

    app, (add, double, _, _) = flows_app(client)
    flow = app.enqueue_flow(chain(add.s(1, 2), double.s(), add.s(10)))
    assert len(flow.job_ids) == 3 and all(i.startswith(flow.id + ".") for i in flow.job_ids)
    states = [info.state for info in flow.jobs() if info is not None]
    assert states == ["pending", "waiting", "waiting"]  # all enqueued now; the rest wait in no lane
    assert flow.state() == "pending"
    with quick(app):
        assert flow.result(timeout=20) == 16  # add(double(add(1, 2)), 10)
    assert flow.state() == "done"
    assert [client.result("canvas", i, timeout=1) for i in flow.job_ids] == [3, 6, 16]


def test_a_failed_step_ends_the_rest_dead_and_the_result_is_its_failure(client: echomq.Client) -> None:
    from echomq.tasks import chain

    app, (add, double, boom, _) = flows_app(client)
    flow = app.enqueue_flow(chain(add.s(1, 2), boom.s(), double.s(), double.s()))
    with quick(app), pytest.raises(echomq.JobFailed) as failed:
        flow.result(timeout=20)
    assert failed.value.type == "ValueError" and "boom at 3" in failed.value.message
    infos = flow.jobs()
    assert [i.state for i in infos if i is not None] == ["done", "dead", "dead", "dead"]
    assert infos[2] is not None and infos[2].last_error == f"dependency {flow.job_ids[1]} dead"
    assert infos[3] is not None and infos[3].last_error == f"dependency {flow.job_ids[2]} dead"
    assert flow.state() == "failed"


def test_cancelling_a_workflow_cancels_every_job(client: echomq.Client) -> None:
    from echomq.tasks import chain

    app, (add, double, _, _) = flows_app(client)
    flow = app.enqueue_flow(chain(add.s(1, 2), double.s(), double.s()))
    outcomes = flow.cancel("not needed")
    assert outcomes == {i: "cancelled" for i in flow.job_ids}
    assert flow.state() == "cancelled"
    with quick(app), pytest.raises(echomq.JobCancelled):
        flow.result(timeout=20)
    assert [i.state for i in flow.jobs() if i is not None] == ["cancelled"] * 3  # none ran, none dead


def test_results_cross_a_worker_restart(client: echomq.Client) -> None:
    from echomq.tasks import chain

    app, (add, double, _, _) = flows_app(client)
    flow = app.enqueue_flow(chain(add.s(1, 2), double.s(), double.s()))
    first = quick(app)
    assert first.workers[0].work_one()  # the first step only, then this worker is gone
    first.stop()
    assert [i.state for i in flow.jobs() if i is not None] == ["done", "pending", "waiting"]
    with quick(app):  # another worker: the next step reads the stored result
        assert flow.result(timeout=20) == 12


def test_a_group_and_a_chord(client: echomq.Client) -> None:
    from echomq.tasks import chord, group

    app, (add, double, boom, total) = flows_app(client)
    members = group(double.s(1), double.s(2), double.s(3))
    together = app.enqueue_flow(members)
    fan_in = app.enqueue_flow(chord(group(double.s(5), add.s(1, 1), double.s(7)), total.s(extra=100)))
    infos = fan_in.jobs()
    assert infos[-1] is not None and infos[-1].state == "waiting"
    broken = app.enqueue_flow(chord(group(double.s(1), boom.s(2)), total.s()))
    tolerant = app.enqueue_flow(chord(group(double.s(1), boom.s(2)), total.s(), on_member_failure="continue"))
    with quick(app):
        assert together.result(timeout=20) == [2, 4, 6]
        assert fan_in.result(timeout=20) == 10 + 2 + 14 + 100  # the list in the group's order
        with pytest.raises(echomq.JobFailed, match="boom at 2"):
            broken.result(timeout=20)
        assert tolerant.result(timeout=20) == 2  # [2, None]
    last = broken.jobs()[-1]
    assert last is not None and last.state == "dead"
    assert last.last_error == f"dependency {broken.job_ids[1]} dead"


def test_a_bad_workflow_is_refused_before_anything_is_sent(client: echomq.Client) -> None:
    from echomq.tasks import chain, chord, group

    app, (add, double, _, total) = flows_app(client)
    keys = sorted(client.redis.keys("*"))
    with pytest.raises(TypeError, match="task 'double'"):
        app.enqueue_flow(chain(add.s(1, 2), double.s(), double.s(1)))  # the third gets one too many
    with pytest.raises(TypeError, match="signatures"):
        chain(add.s(1, 2), double)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="on_member_failure"):
        chord(group(double.s(1)), total.s(), on_member_failure="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        group()
    other = echomq.App(client)

    @other.task
    def stranger(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="of one app"):
        app.enqueue_flow(chain(add.s(1, 2), stranger.s()))
    assert sorted(client.redis.keys("*")) == keys


def test_asyncio_chain_and_chord(server: EmbeddedServer, backend: str) -> None:
    from echomq.tasks import chain, chord, group

    async def main() -> None:
        client = emq.Client(redis.asyncio.Redis(port=server.port), backend=backend)
        app = emq.App(client, queue="acanvas")

        @app.task
        async def inc(x: int) -> int:
            return x + 1

        @app.task
        def square(x: int) -> int:  # a plain function: in a thread of the asyncio worker
            return x * x

        @app.task
        async def total(values: list[int]) -> int:
            return sum(values)

        flow = await app.enqueue_flow(chain(inc.s(1), square.s(), inc.s()))
        fan_in = await app.enqueue_flow(chord(group(inc.s(1), square.s(3)), total.s()))
        cancelled = await app.enqueue_flow(chain(inc.s(1), inc.s()))
        assert set((await cancelled.cancel()).values()) == {"cancelled"}
        worker = app.worker(poll_interval=0.02, grace=0.5)
        running = asyncio.ensure_future(worker.run(handle_signals=False))
        try:
            assert await flow.result(timeout=20) == 5
            assert await fan_in.result(timeout=20) == 11
            assert await flow.state() == "done" and await cancelled.state() == "cancelled"
        finally:
            worker.stop()
            await running
            await client.aclose()

    asyncio.run(main())


def test_cancelling_a_running_workflow(client: echomq.Client) -> None:
    from echomq.tasks import chain

    app, (_, double, _, _) = flows_app(client)
    started = threading.Event()

    @app.task
    def slow(x: int) -> int:
        started.set()
        for _ in range(400):  # bounded: 20 s at most, unless cancelled
            echomq.task_context().raise_if_cancelled()
            time.sleep(0.05)
        return x

    flow = app.enqueue_flow(chain(slow.s(1), double.s(), double.s()))
    with quick(app):
        assert started.wait(20)
        assert flow.state() == "running"
        outcomes = flow.cancel("stop")
        assert outcomes[flow.job_ids[0]] == "requested"  # held: its handler hears it
        assert [outcomes[i] for i in flow.job_ids[1:]] == ["cancelled", "cancelled"]
        with pytest.raises(echomq.JobCancelled):
            flow.result(timeout=20)
        with pytest.raises(echomq.JobCancelled):  # the running step too, once its handler heard it
            client.result("canvas", flow.job_ids[0], timeout=20)
    assert flow.state() == "cancelled"
    assert [i.state for i in flow.jobs() if i is not None] == ["cancelled"] * 3
