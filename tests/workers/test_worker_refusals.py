"""Answers a worker must not lose (issue 27: 6, 7, 8, 10): a late claim, a refused FAIL, a claim answered
on a connection gone half-open, a pushed cancel on a subscription gone half-open.

Each test would fail on the code before issue 27:

- a claim answered late whose one confirming checkpoint met a reset was
  dropped unrun ("deadline passed"), and dead-lettered by the next sweep;
- past maxmemory a FAIL was refused until the lease ended: the job died
  "stalled", its error and a try lost;
- the asyncio worker's batched COMPLETECLAIM answered a caller that had
  given up already: the job it claimed was dropped (under half-open
  connections, held by nobody);
- a half-open cancel subscription was never noticed: pushed cancels stopped
  for the worker's life.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq import _protocol as proto
from echomq.asyncio._together import Coalescer
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..calibration import budget
from ..conftest import ServerFactory
from ..faults import Proxy, stall, wait_until

pytestmark = pytest.mark.backends

Q = "refusals"
K = queue_keys(Q)
MODES = ["sync", "asyncio"]


def a_server(server_factory: ServerFactory, backend: str) -> EmbeddedServer:
    return server_factory(load_module=backend == "module")


def row(r: redis.Redis, job_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(K.job(job_id)).items()}


class Running:
    """A worker of either driver running in the background (an asyncio one on a loop in a thread)."""

    def __init__(self, mode: str, url: str, handler: object, queue: str = Q, **settings: object) -> None:
        self.mode = mode
        if mode == "sync":
            self.sync = echomq.Worker(echomq.Client.from_url(url), queue, handler, **settings).start()  # type: ignore[arg-type]
            return
        ready = threading.Event()

        def main() -> None:
            async def run() -> None:
                self.client = emq.Client.from_url(url)
                self.aworker = emq.Worker(self.client, queue, handler, **settings)  # type: ignore[arg-type]
                self.loop = asyncio.get_running_loop()
                task = asyncio.create_task(self.aworker.run(handle_signals=False))
                ready.set()
                await task
                await self.client.aclose()

            asyncio.run(run())

        self.thread = threading.Thread(target=main, name="test-asyncio-worker")
        self.thread.start()
        assert ready.wait(10)

    @property
    def stats(self) -> echomq.WorkerStats:
        return self.sync.stats if self.mode == "sync" else self.aworker.stats

    def stop(self, grace: float | None = None) -> None:
        if self.mode == "sync":
            self.sync.stop(grace)
            return
        self.aworker.stop(grace)
        self.thread.join(30)
        assert not self.thread.is_alive()


def sync_or_async(mode: str, body: object) -> object:
    """``body`` as the handler of the driver ``mode`` (``body(ctx)`` may return a float to sleep)."""
    if mode == "sync":

        def handler(ctx: echomq.JobContext) -> None:
            pause = body(ctx)  # type: ignore[operator]
            if pause:
                time.sleep(pause)

        return handler

    async def ahandler(ctx: emq.JobContext) -> None:
        pause = body(ctx)  # type: ignore[operator]
        if pause:
            await asyncio.sleep(pause)

    return ahandler


# -- a claim answered late ----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_late_claim_whose_confirmation_meets_a_reset_still_runs(
    server_factory: ServerFactory, backend: str, mode: str
) -> None:
    # late_claim_confirm.py: the claim's reply is held 1.1 s of a 1.5 s
    # lease (it must be confirmed before it runs); the first checkpoint sent
    # for it meets a reset.  It was dropped unrun, then dead-lettered.
    server = a_server(server_factory, backend)
    r = server.client()
    proxy = Proxy(server.port)
    fired: dict[str, bool] = {}

    def hold(data: bytes) -> float:
        if b"JOBX1" in data and "held" not in fired:
            fired["held"] = True
            return 1.1
        return 0.0

    def reset(data: bytes) -> bool:
        if b"JOBX1" in data and "held" in fired and "reset" not in fired:
            fired["reset"] = True
            return True
        return False

    ran: list[str] = []
    proxy.hold_reply, proxy.reset_request = hold, reset
    try:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        worker = Running(mode, url, sync_or_async(mode, lambda ctx: ran.append(ctx.id)), lease_ms=1500,
                         grace=0.5, poll_interval=1.0)  # fmt: skip
        try:
            time.sleep(0.3)
            echomq.Client(r).enqueue(Q, b"", job_id="JOBX1")
            assert wait_until(lambda: r.hget(K.job("JOBX1"), "state") == b"done", 6), (row(r, "JOBX1"), fired)
        finally:
            worker.stop()
    finally:
        proxy.close()
    assert fired == {"held": True, "reset": True}
    assert ran == ["JOBX1"] and worker.stats.leases_lost == 0
    assert "stalled" not in row(r, "JOBX1")


# -- a FAIL refused past maxmemory ---------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_fail_refused_past_maxmemory_keeps_its_lease_and_lands_later(
    server_factory: ServerFactory, backend: str, mode: str
) -> None:
    # oom.py: FAIL is deny-oom; the worker retried it until the lease ended and
    # let the job lapse: dead "stalled", the handler's error lost.  Now it
    # keeps the lease with EXTEND (not deny-oom) and FAILs once memory is freed.
    server = a_server(server_factory, backend)
    r = server.client()
    echomq.Client(r).enqueue(Q, b"", job_id="X")
    pressed = threading.Event()

    def body(ctx: echomq.JobContext) -> None:
        if ctx.attempt == 1:
            r.config_set("maxmemory", "1")
            pressed.set()
            raise ValueError("boom")

    worker = Running(mode, server.url, sync_or_async(mode, body), lease_ms=1500, grace=0.5)
    try:
        assert pressed.wait(10)
        time.sleep(2.5)  # longer than the lease
        assert r.hget(K.job("X"), "state") == b"active"  # held, its lease kept alive
        assert (r.zscore(K.active, "X") or 0) > int(r.time()[0]) * 1000
        r.config_set("maxmemory", "0")
        assert wait_until(lambda: r.hget(K.job("X"), "state") == b"done", 10), row(r, "X")
    finally:
        r.config_set("maxmemory", "0")
        worker.stop()
    x = row(r, "X")
    assert x["last_error"] == "ValueError: boom" and x["tries"] == "2" and "stalled" not in x, x
    assert worker.stats.failed == 1 and worker.stats.leases_lost == 0


def test_a_stop_gives_back_a_job_whose_fail_is_refused(
    server: EmbeddedServer, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # A worker that stops does not wait for memory to be freed: RELEASE (not
    # deny-oom) gives the job back, no try used, its error logged here.
    echomq.Client(r).enqueue(Q, b"", job_id="X")
    pressed = threading.Event()

    def handler(ctx: echomq.JobContext) -> None:
        r.config_set("maxmemory", "1")
        pressed.set()
        raise ValueError("boom")

    worker = echomq.Worker(echomq.Client(server.client()), Q, handler, lease_ms=1500, grace=0.5)
    try:
        with caplog.at_level(logging.WARNING, logger="echomq"):
            worker.start()
            assert pressed.wait(10)
            time.sleep(0.5)
            worker.stop()
        assert r.hget(K.job("X"), "state") == b"pending" and r.hget(K.job("X"), "tries") == b"0"
    finally:
        r.config_set("maxmemory", "0")
    assert worker.stats.released == 1 and worker.stats.leases_lost == 0
    assert any("ValueError: boom" in rec.getMessage() for rec in caplog.records)


# -- half-open connections ----------------------------------------------------------------


def test_a_claims_answer_goes_to_its_caller_whoever_waits_longest(
    server_factory: ServerFactory, backend: str
) -> None:
    # The asyncio worker sends its runners' COMPLETECLAIMs together; a caller
    # used to wait only its own timeout while the batch waited the longest of
    # its calls': an answer that claimed a job came 3 ms after its caller gave
    # up and was dropped (under half-open connections, the REQ retry then came
    # after the record expired: the job was held by nobody).  Now a caller
    # waits for its batch's answer, and one cancelled meanwhile leaves it to
    # its orphan callback.
    server = a_server(server_factory, backend)
    r = server.client()
    echomq.Client(r).enqueue(Q, b"", job_id="C")
    echomq.Client(r).enqueue(Q, b"", job_id="D")

    async def main() -> None:
        client = emq.Client.from_url(server.url)
        await client.detect_backend()
        together = Coalescer(client)
        stall(server, 0.6)
        await asyncio.sleep(0.05)  # DEBUG SLEEP has reached the server
        short = asyncio.create_task(together.attempt(proto.claim(Q, 5000), 0.3))
        long = asyncio.create_task(together.attempt(proto.claim("elsewhere", 5000), 2.0))
        jobs = await short  # the batch's answer came at 0.6 s: past this call's own 0.3 s
        assert [j.id for j in jobs] == ["C"] and await long == []
        orphaned: list[object] = []
        stall(server, 0.4)
        await asyncio.sleep(0.05)
        caller = asyncio.create_task(together.attempt(proto.claim(Q, 5000), 2.0, orphaned.append))
        await asyncio.sleep(0.1)
        caller.cancel()  # a runner cancelled (a forced stop, run() cancelled) with its claim on the wire
        await together.drain()
        assert [[j.id for j in jobs] for jobs in orphaned] == [["D"]]  # type: ignore[attr-defined]
        await client.aclose()

    asyncio.run(main())
    assert r.zrange(K.active, 0, -1) == [b"C", b"D"]  # held by the callers above, not lost in the pipe


@pytest.mark.parametrize("mode", MODES)
def test_a_half_open_cancel_subscription_is_noticed(server_factory: ServerFactory, mode: str) -> None:
    # cancel_push.py "halfopen": the subscription's connection went half-open
    # and nothing noticed; the cancel waited for the keeper's checkpoint, an
    # interval of a 30 s lease away (and that one hung on a half-open
    # connection too).  Now the subscription is pinged while jobs are held,
    # made again, and every held job is checkpointed at once.
    server = server_factory()
    r = server.client()
    proxy = Proxy(server.port)
    echomq.Client(r).enqueue(Q, b"", job_id="J")
    started = threading.Event()
    seen: dict[str, float] = {}

    def body(ctx: echomq.JobContext) -> float:
        started.set()
        return 0.0

    def sync_handler(ctx: echomq.JobContext) -> None:
        started.set()
        c = ctx.cancel.sleep(14)
        if c is not None:
            seen[str(c.reason)] = time.monotonic()

    async def async_handler(ctx: emq.JobContext) -> None:
        started.set()
        try:
            c = await asyncio.wait_for(ctx.cancel.wait(), 14)
            seen[str(c.reason)] = time.monotonic()
        except asyncio.TimeoutError:
            pass

    handler = sync_handler if mode == "sync" else async_handler
    try:
        worker = Running(mode, f"redis://127.0.0.1:{proxy.port}/0", handler, lease_ms=30_000, grace=0.5)
        try:
            assert started.wait(10)
            proxy.blackhole()  # the subscription (and every other connection open now) goes half-open
            time.sleep(1.0)
            asked = time.monotonic()
            echomq.Client(r).cancel(Q, "J", "stop it")
            assert wait_until(lambda: "stop it" in seen, 8), seen
        finally:
            worker.stop(grace=0.5)
    finally:
        proxy.close()
    assert seen["stop it"] - asked < budget(4.0), f"the cancel took {seen['stop it'] - asked:.2f} s"
