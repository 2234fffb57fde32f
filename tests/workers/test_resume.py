"""A recovered job resumes where its last holder left off (issue 16): the handler's side.

``ctx.checkpoint(state=...)`` / ``ctx.checkpoint_step(step, data)`` store a state
with the lease, fenced by the claim's token; the next claim hands it back as
``ctx.resume_state`` / ``ctx.resume_point``.  Each test runs on the module and on
the scripts backend (the same replies, so the same behaviour).
"""

from __future__ import annotations

import asyncio
import json

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..helpers import digest

pytestmark = pytest.mark.backends

Q = "resume"
K = queue_keys(Q)


def lapse_and_recover(r: redis.Redis, client: echomq.Client, job_id: str) -> None:
    """The holder "died": its lease lapses now and the reaper's sweep recovers the job."""
    r.zadd(K.active, {job_id: 0}, xx=True)
    assert client.sweep(Q, max_stalled=5).recovered == [job_id]


def test_the_next_attempt_resumes_from_the_last_stored_step(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, b"export", job_id="J")
    first: dict[str, object] = {}

    def dies_after_step_3(ctx: echomq.JobContext) -> None:
        first["state"], first["point"] = ctx.resume_state, ctx.resume_point
        for step in range(3):
            assert ctx.checkpoint_step(step + 1, {"rows": 10 * (step + 1)}) is True
        lapse_and_recover(r, client, "J")  # this holder is now stale: its lease lapsed, the job was swept
        try:
            ctx.checkpoint_step(4, {"rows": 40})  # refused: never stored, never handed out
        except echomq.Cancelled as exc:
            first["cancelled"] = exc.reason
            raise

    assert echomq.Worker(client, Q, dies_after_step_3, lease_ms=60_000).work_one()
    assert first == {
        "state": None,
        "point": echomq.Progress(0, {}),
        "cancelled": echomq.lease.LOST_STALE,
    }
    stored = r.hmget(K.job("J"), "checkpoint", "checkpoint_attempt", "state")
    assert stored == [b'{"step":3,"data":{"rows":30}}', b"1", b"pending"]

    second: dict[str, object] = {}

    def resumes(ctx: echomq.JobContext) -> None:
        second["attempt"], second["point"] = ctx.attempt, ctx.resume_point
        second["state"] = ctx.resume_state
        for step in range(ctx.resume_point.step, 5):
            ctx.checkpoint_step(step + 1, {"rows": 10 * (step + 1)})

    assert echomq.Worker(client, Q, resumes, lease_ms=60_000).work_one()
    assert second == {
        "attempt": 2,
        "point": echomq.Progress(3, {"rows": 30}),
        "state": b'{"step":3,"data":{"rows":30}}',
    }
    assert r.hmget(K.job("J"), "state", "checkpoint", "checkpoint_attempt") == [
        b"done",
        b'{"step":5,"data":{"rows":50}}',
        b"2",
    ]


def test_bytes_state_round_trips_and_is_not_a_step_state(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, b"", job_id="B")
    blob = bytes(range(256))

    def stores(ctx: echomq.JobContext) -> None:
        assert ctx.checkpoint(state=blob) is True
        assert ctx.checkpoint() is True  # a checkpoint without state keeps the stored one
        assert ctx.resume_state is None  # this claim's, not changed by its own checkpoints
        lapse_and_recover(r, client, "B")

    assert echomq.Worker(client, Q, stores, lease_ms=60_000).work_one()
    assert r.hget(K.job("B"), "checkpoint") == blob
    seen: list[object] = []

    def reads(ctx: echomq.JobContext) -> None:
        seen.append(ctx.resume_state)
        with pytest.raises(ValueError, match="not a checkpoint_step"):
            ctx.resume_point  # noqa: B018 (the property raises)

    assert echomq.Worker(client, Q, reads).work_one()
    assert seen == [blob]


def test_a_state_past_the_ceiling_raises_in_the_handler_and_writes_nothing(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue(Q, b"", job_id="L")
    outcome: list[object] = []

    def too_big(ctx: echomq.JobContext) -> None:
        before = digest(r)
        with pytest.raises(echomq.BadArgument, match=r"emq\.max-state-bytes"):
            ctx.checkpoint(state=b"x" * 65_537)
        outcome.append(digest(r) == before)
        with pytest.raises(TypeError, match="state must be bytes"):
            ctx.checkpoint(state="text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="step must be an int"):
            ctx.checkpoint_step(True)
        with pytest.raises(ValueError, match="step must be between"):
            ctx.checkpoint_step(-1)
        with pytest.raises(TypeError, match="not JSON serializable"):
            ctx.checkpoint_step(1, {"when": object()})
        outcome.append(ctx.checkpoint_step(1, {"ok": True}))

    assert echomq.Worker(client, Q, too_big).work_one()
    assert outcome == [True, True]
    assert json.loads(r.hget(K.job("L"), "checkpoint") or b"") == {"step": 1, "data": {"ok": True}}


def test_past_maxmemory_the_state_is_not_stored_but_the_lease_extends(
    server_factory: ServerFactory, backend: str
) -> None:
    srv = server_factory(load_module=backend == "module")
    r = srv.client()
    client = echomq.Client(r)
    assert client.backend == backend
    client.enqueue(Q, b"", job_id="M")
    seen: list[object] = []

    def under_pressure(ctx: echomq.JobContext) -> None:
        assert ctx.checkpoint_step(1) is True
        deadline = int(r.zscore(K.active, "M") or 0) - 30_000
        r.zadd(K.active, {"M": deadline}, xx=True)  # half the lease gone: a real extension moves it
        r.config_set("maxmemory", 1)  # everything is past it now
        try:
            seen.append(ctx.checkpoint_step(2))  # refused for the state: False, no raise
            seen.append(int(r.zscore(K.active, "M") or 0) > deadline)  # the lease moved all the same
            seen.append(ctx.cancelled)
        finally:
            r.config_set("maxmemory", 0)

    worker = echomq.Worker(client, Q, under_pressure, lease_ms=60_000)
    assert worker.work_one()
    assert seen == [False, True, False]
    assert r.hget(K.job("M"), "checkpoint") == b'{"step":1,"data":{}}'
    assert r.hget(K.job("M"), "state") == b"done"
    r.close()


def test_asyncio_handlers_store_and_resume_the_same_way(r: redis.Redis, server: EmbeddedServer) -> None:
    seen: list[object] = []

    async def first(ctx: emq.JobContext) -> None:
        seen.append((ctx.resume_state, ctx.resume_point))
        assert await ctx.checkpoint_step(7, {"cursor": "abc"}) is True
        assert await ctx.checkpoint() is True
        await asyncio.to_thread(lapse_and_recover, r, echomq.Client(r), "A")
        try:
            await ctx.checkpoint(state=b"stale")
        except echomq.Cancelled as exc:
            seen.append(exc.reason)
            raise

    async def second(ctx: emq.JobContext) -> None:
        seen.append((ctx.attempt, ctx.resume_point))
        with pytest.raises(echomq.BadArgument):
            await ctx.checkpoint(state=b"x" * 65_537)

    async def main() -> None:
        client = emq.Client.from_url(server.url)
        try:
            await client.enqueue(Q, b"", job_id="A")
            assert await emq.Worker(client, Q, first, lease_ms=60_000).work_one()
            assert await emq.Worker(client, Q, second, lease_ms=60_000).work_one()
        finally:
            await client.aclose()

    asyncio.run(main())
    assert seen == [
        (None, echomq.Progress(0, {})),
        echomq.lease.LOST_STALE,
        (2, echomq.Progress(7, {"cursor": "abc"})),
    ]
    assert r.hget(K.job("A"), "state") == b"done"
    assert r.hget(K.job("A"), "checkpoint") == b'{"step":7,"data":{"cursor":"abc"}}'


def test_a_keeper_without_cancel_delivery_still_stores_state(r: redis.Redis, client: echomq.Client) -> None:
    client.enqueue(Q, b"", job_id="K")
    job = client.claim(Q, lease_ms=60_000)
    assert job is not None
    with echomq.LeaseKeeper(client, job, 60_000, echomq.CancelToken(), deliver_cancel=False) as keeper:
        assert keeper.checkpoint(state=b"s1") is None  # EXTEND takes no state: CHECKPOINT carries it
    assert r.hget(K.job("K"), "checkpoint") == b"s1"


def test_progress_encodes_to_compact_json_and_refuses_what_is_not_one() -> None:
    p = echomq.Progress(3, {"name": "é", "n": [1, 2]})
    assert p.encode() == '{"step":3,"data":{"name":"é","n":[1,2]}}'.encode()
    assert echomq.Progress.decode(p.encode()) == p
    assert echomq.Progress.decode(b'{"step": 2}') == echomq.Progress(2, {})
    bad_states = (b"", b"\xff", b"[]", b'{"step": "3"}', b'{"step": -1}', b'{"step": true}')
    bad_states += (b'{"step":1,"data":[]}',)
    for bad in bad_states:
        with pytest.raises(ValueError, match="not a checkpoint_step"):
            echomq.Progress.decode(bad)
    with pytest.raises(TypeError, match="data must be a dict"):
        echomq.Progress(1, [1]).encode()  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        echomq.Progress(1, {"x": float("nan")}).encode()


def test_a_failed_attempt_s_state_goes_to_its_retry_and_an_operator_retry_keeps_it(
    r: redis.Redis, client: echomq.Client
) -> None:
    client.enqueue(Q, b"", job_id="F")
    points: list[echomq.Progress] = []

    def fails_after_a_step(ctx: echomq.JobContext) -> None:
        points.append(ctx.resume_point)
        ctx.checkpoint_step(ctx.resume_point.step + 1)
        raise RuntimeError("flaky")

    worker = echomq.Worker(client, Q, fails_after_a_step, max_attempts=2)
    assert worker.work_one() and worker.work_one()  # the second attempt, then dead
    assert r.hget(K.job("F"), "state") == b"dead"
    client.retry(Q, "F")
    assert worker.work_one()
    assert [p.step for p in points] == [0, 1, 2]
