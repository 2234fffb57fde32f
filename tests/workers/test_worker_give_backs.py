"""A job a claim answered is run or given back (issue 39, 5): the paths the outage chaos test found.

Each test failed on the code before it:

- a forced stop gave its stuck handlers' jobs back one RELEASE after
  another within the force's budget: with a slow network the budget ended
  after the first few, and the rest stayed active, held by nobody until
  their leases lapsed and a sweep counted each a stall (the outage test's
  ``jobs a SIGTERMed worker was handed and neither ran nor gave back``);
- a claim answered late whose lease could not be confirmed within a lease
  (no answer) was dropped without a RELEASE: held by nobody until a sweep,
  which counted a stall, a try charged for a job that never ran (three
  such and a job that is not poison ended dead);
- a job's end still being sent when a stop was forced was cut by the
  force's budget: its job, its handler done, held by nobody until a sweep.

And the asyncio worker's (the outage test's asyncio layouts, ``+forced``):
the same three, a claim answered after the stop given back from a runner the
force cancelled, a second signal while the claims settle that reached the
handler from before ``run()`` (exit 0, not 143), a batch's timer stretched as
it expired (RuntimeError), the keeper's checkpoints waiting behind a dry pool
(every lease lost at once), a metrics wait read that hung the handler's
start; and the recording clients of the outage and failover workers, which
refused the give-back's ``lane`` (every forced give-back failed).

The faults are real (``faults.Proxy``), and each test asserts that its fault
fired.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq._runtime import Action, HeldJob
from echomq.asyncio._attempt import Progress
from echomq.cancel import CancelToken
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..conftest import ServerFactory
from ..faults import Proxy, wait_until
from .test_worker_refusals import Running, sync_or_async

Q = "givebacks"
K = queue_keys(Q)


def row(r: redis.Redis, job_id: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in r.hgetall(K.job(job_id)).items()}


def lost_until(
    healed_at: Callable[[], float], real: Any, seen: list[float], only: bytes | None = None
) -> Callable[..., Awaitable[Any]]:
    """An asyncio client's ``_attempt_many`` whose tries get no answer (each waits its whole timeout,
    then times out) until ``healed_at()``; ``only``: just the pipelines with that command in them.
    A lost reply, not a reset: the tries' spacing then does not hang on the retries' jitter."""

    async def attempt(calls: Any, timeout: float, progress: Any = None, *, lane: bool = False) -> Any:
        hit = only is None or any(only.decode() == str(call.args[0]) for call in calls)
        if hit and time.monotonic() < healed_at():
            seen.append(time.monotonic())
            await asyncio.sleep(timeout)
            raise redis.TimeoutError(f"no reply within {timeout:.3f} s (the test's)")
        return await real(calls, timeout, progress, lane=lane)

    return attempt


def test_a_forced_stop_gives_back_every_stuck_job_in_one_round_trip(server_factory: ServerFactory) -> None:
    # 30 handlers that ignore "shutdown"; each round trip carrying a RELEASE
    # is held 0.3 s (a slow network): one RELEASE per job ran the 0.4 s budget
    # out after the first two, and 28 jobs stayed active.
    own = server_factory()
    admin = own.client()
    proxy = Proxy(own.port)
    n = 30
    running = threading.Semaphore(0)
    let_go = threading.Event()

    def handler(ctx: echomq.JobContext) -> None:
        running.release()
        let_go.wait(30)  # deaf to "shutdown": the stop is forced

    echomq.Client(admin).enqueue_many(Q, [(f"S{i:02}", b"") for i in range(n)])
    client = echomq.Client.from_url(f"redis://127.0.0.1:{proxy.port}/0")
    worker = echomq.Worker(client, Q, handler, concurrency=n, lease_ms=30_000, grace=0.1, reap=False)
    try:
        worker.start()
        for _ in range(n):
            assert running.acquire(timeout=20)
        proxy.hold_request = lambda data: 0.3 if b"EMQ.RELEASE" in data else 0.0
        worker.stop()
    finally:
        let_go.set()
        proxy.close()
    assert proxy.held_requests >= 1  # the fault fired: the give-backs met the slow network
    active = admin.zrange(K.active, 0, -1)
    assert active == [], f"{len(active)} jobs held by nobody after the forced stop"
    assert all(row(admin, f"S{i:02}")["state"] == "pending" for i in range(n))
    assert worker.stats.released == n and worker.stats.leases_lost == 0


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_late_claim_that_cannot_be_confirmed_is_given_back_not_dropped(
    server_factory: ServerFactory, mode: str
) -> None:
    # A 3 s lease; a claim try waits 1.5 s.  The claim's first reply is held
    # 2 s (lost: the worker asks again by its REQ), the second 0.9 s: answered
    # 2.5 s after the first send, the claim must be confirmed before it runs.
    # Every confirming checkpoint meets a reset, for a whole lease.  The job
    # was dropped, held by nobody: with no sweep it stayed active for good (a
    # sweep would have counted a stall, a try charged).  Now it is given back
    # (RELEASE, fenced by its token), no try used, and runs again.
    server = server_factory()
    r = server.client()
    proxy = Proxy(server.port)
    ran: list[int] = []
    fired: dict[str, int] = {"held": 0, "reset before it ran": 0, "released": 0}

    def hold(data: bytes) -> float:
        if b"JOBU1" in data and fired["held"] < 2:
            fired["held"] += 1
            return 2.0 if fired["held"] == 1 else 0.9
        return 0.0

    def reset(data: bytes) -> bool:
        if b"JOBU1" not in data or fired["released"]:
            return False
        if b"EMQ.RELEASE" in data:
            fired["released"] += 1
        elif b"EMQ.CHECKPOINT" in data or b"EMQ.EXTEND" in data:
            fired["reset before it ran"] += not ran  # a confirmation: the handler has not started
            return True
        return False

    proxy.hold_reply, proxy.reset_request = hold, reset
    try:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        handler = sync_or_async(mode, lambda ctx: ran.append(ctx.attempt))
        worker = Running(mode, url, handler, Q, lease_ms=3000, grace=0.5, reap=False)
        try:
            time.sleep(0.3)
            echomq.Client(r).enqueue(Q, b"", job_id="JOBU1")
            done = wait_until(lambda: r.hget(K.job("JOBU1"), "state") == b"done", 20)
            assert done, (row(r, "JOBU1"), fired)
        finally:
            worker.stop()
    finally:
        proxy.close()
    # The faults fired: the claim was answered late, its confirmation reset, and it was given back.
    assert fired["held"] == 2 and fired["reset before it ran"] >= 1 and fired["released"] == 1, fired
    assert proxy.resets >= 1 and proxy.held_replies == 2
    job = row(r, "JOBU1")
    assert "stalled" not in job and job["tries"] == "1" and job["attempts"] == "2", job  # no try used
    assert ran == [1] and worker.stats.released == 1


def test_an_end_in_flight_at_a_forced_stop_gets_one_real_try_past_the_budget(
    r: redis.Redis, server: EmbeddedServer
) -> None:
    # A handler returned; its COMPLETE meets connection resets until just past
    # a forced stop's 0.4 s budget.  The budget cut it: the job stayed active,
    # held by nobody, until a sweep counted a stall for a job whose handler
    # had succeeded.  Now an end gets one real try (SETTLE_TRY_S) past it.
    client = echomq.Client(server.client())
    client.enqueue(Q, b"", job_id="E")
    job = client.claim(Q, 30_000)
    assert job is not None
    worker = echomq.Worker(client, Q, lambda ctx: None, lease_ms=30_000, reap=False)
    held = HeldJob.claimed(job, CancelToken(), 30_000, claimed_at=time.monotonic())
    finish = worker._decide(held, None)
    assert finish.action is Action.COMPLETE
    with worker._lock:
        worker._force(time.monotonic())  # a second signal: the budget runs from now
    healed_at = worker._force_until + 0.05  # the server is reachable again only past the budget
    real = client._attempt
    resets: list[float] = []

    def flaky(call: Any, timeout: float, cutter: Any = None) -> Any:
        if time.monotonic() < healed_at:
            resets.append(time.monotonic())
            raise redis.ConnectionError("connection reset by peer (the test's)")
        return real(call, timeout, cutter)

    client._attempt = flaky  # type: ignore[method-assign]
    worker._finish(finish)
    assert resets and resets[-1] >= worker._force_until - 0.4  # the fault fired, into the budget
    assert row(r, "E")["state"] == "done", row(r, "E")
    assert worker.stats.completed == 1 and worker.stats.leases_lost == 0


def test_a_stops_give_back_whose_lease_lapsed_still_gets_one_real_try(server_factory: ServerFactory) -> None:
    # A handler raised after "shutdown" while the server was away (frozen for
    # its lease, say): its RELEASE was bounded by the lease, which had ended, so
    # its one try had a millisecond; through a network that takes 50 ms it got
    # no answer, and the job was held by nobody until a sweep counted a stall.
    # Not swept yet, the job is still ours: the RELEASE gets one real try.
    own = server_factory()
    admin = own.client()
    proxy = Proxy(own.port)
    proxy.hold_request = lambda data: 0.05 if b"EMQ.RELEASE" in data else 0.0
    client = echomq.Client.from_url(f"redis://127.0.0.1:{proxy.port}/0")
    try:
        client.enqueue(Q, b"", job_id="L")
        job = client.claim(Q, 30_000)
        assert job is not None
        worker = echomq.Worker(client, Q, lambda ctx: None, lease_ms=30_000, reap=False)
        held = HeldJob.claimed(job, CancelToken(), 30_000, claimed_at=time.monotonic() - 31.0)  # lapsed
        with worker._lock:
            worker._request_stop(time.monotonic(), 0.0)
        held.cancel.cancel("shutdown")
        finish = worker._decide(held, echomq.Cancelled("shutdown"))
        assert finish.action is Action.RELEASE
        worker._finish(finish)
    finally:
        proxy.close()
    assert proxy.held_requests >= 1  # the fault fired: the RELEASE met the slow network
    assert row(admin, "L")["state"] == "pending" and row(admin, "L")["tries"] == "0", row(admin, "L")
    assert worker.stats.released == 1 and worker.stats.leases_lost == 0


def test_stretching_a_try_whose_timeout_is_expiring_does_not_raise() -> None:
    # A forced stop stretches the coalescer's batch on the wire so it may hear
    # its answers (Worker._force_stop).  When that batch's timeout had fired
    # and its task was not yet woken to see it, asyncio refused to move the
    # timer (RuntimeError: Cannot change state of expiring Timeout): the forced
    # stop crashed before it gave any job back.
    async def main() -> tuple[bool, bool]:
        progress = Progress()

        async def attempt() -> None:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.01) as progress.timer:
                    await asyncio.sleep(5)

        task = asyncio.create_task(attempt())
        await asyncio.sleep(0)  # the try is in its block
        time.sleep(0.05)  # its timeout is due; the loop runs it next turn, then wakes the task a turn later
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        expiring = progress.timer is not None and progress.timer.expired() and not task.done()
        progress.stretch(time.monotonic() + 5)  # raised RuntimeError
        await task
        progress.stretch(time.monotonic() + 5)  # the try left its block: nothing to stretch
        return expiring, task.done()

    expiring, ended = asyncio.run(main())
    assert expiring and ended  # the fault: the timer had fired and its task had not seen it yet


def test_an_asyncio_forced_stops_give_back_gets_one_real_try_past_the_budget(
    server_factory: ServerFactory,
) -> None:
    # Five handlers deaf to "shutdown"; the stop is forced.  Every RELEASE
    # gets no answer (its try times out) until just past the force's 0.4 s budget.  The
    # asyncio worker's batch give-back was cut by the budget: the five jobs
    # stayed active, held by nobody until a sweep counted each a stall (the
    # outage test's forced asyncio deploys).  The thread worker's gets one real
    # try past it (SETTLE_TRY_S); so does the asyncio one's now.
    own = server_factory()
    admin = own.client()
    proxy = Proxy(own.port)
    n = 5
    started: list[str] = []

    async def handler(ctx: emq.JobContext) -> None:
        started.append(ctx.id)
        await asyncio.sleep(30)  # deaf to "shutdown": the stop is forced, the task cancelled

    echomq.Client(admin).enqueue_many(Q, [(f"F{i}", b"") for i in range(n)])
    url = f"redis://127.0.0.1:{proxy.port}/0"
    worker = Running("asyncio", url, handler, Q, concurrency=n, lease_ms=30_000, grace=0.1, reap=False)
    fired: list[float] = []
    try:
        assert wait_until(lambda: len(started) == n, 20)
        client = worker.client
        client._attempt_many = lost_until(  # type: ignore[method-assign]
            lambda: worker.aworker._force_until + 0.1, client._attempt_many, fired, only=b"EMQ.RELEASE"
        )
        worker.stop()
    finally:
        proxy.close()
    assert fired  # the fault fired: the give-backs' replies were lost into the budget
    active = admin.zrange(K.active, 0, -1)
    assert active == [], f"{len(active)} jobs held by nobody after the forced stop"
    assert all(row(admin, f"F{i}")["state"] == "pending" for i in range(n))
    assert worker.stats.released == n and worker.stats.leases_lost == 0


def test_a_second_signal_while_an_asyncio_worker_settles_forces_the_stop(
    server_factory: ServerFactory,
) -> None:
    # An idle asyncio worker gets a SIGTERM: its waiting claim is cut and
    # asked again by its REQ as it settles (held 1 s here: a slow network).  A
    # second SIGTERM then went to the handler installed before run(), which
    # had been put back before the settling: run() returned, the process
    # exited 0 instead of 143 (the outage test's forced asyncio deploys).  The
    # thread worker forces the stop then; so does the asyncio one now.
    own = server_factory()
    proxy = Proxy(own.port)
    before: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: before.append(signum))
    signals: threading.Thread | None = None
    try:

        async def handler(ctx: emq.JobContext) -> None:
            pass

        async def main() -> BaseException | None:
            client = emq.Client.from_url(f"redis://127.0.0.1:{proxy.port}/0")
            worker = emq.Worker(client, Q, handler, lease_ms=30_000, reap=False)
            try:
                await worker.run()
            except BaseException as exc:  # what run() raised is the result
                return exc
            finally:
                await client.aclose()
            return None

        def send() -> None:
            time.sleep(0.5)  # the worker waits on the server for a job
            proxy.hold_request = lambda data: 1.0 if b"EMQ.CLAIM" in data else 0.0
            os.kill(os.getpid(), signal.SIGTERM)
            wait_until(lambda: proxy.held_requests >= 1, 5)  # the claim asked again, settling
            time.sleep(0.1)
            os.kill(os.getpid(), signal.SIGTERM)

        signals = threading.Thread(target=send, name="test-signals")
        signals.start()
        raised = asyncio.run(main())
    finally:
        if signals is not None:
            signals.join(10)
        signal.signal(signal.SIGTERM, previous)
        proxy.close()
    assert proxy.held_requests >= 1  # the fault fired: the second signal came as the claim settled
    assert before == []  # neither signal reached the handler installed before run()
    assert isinstance(raised, SystemExit) and raised.code == 128 + signal.SIGTERM, repr(raised)


def test_the_asyncio_keepers_checkpoints_do_not_wait_behind_a_dry_pool(server: EmbeddedServer) -> None:
    # A loaded asyncio worker's connections were all taken (500 handlers'
    # own checkpoints hung on half-open connections): the one keeper's batch
    # of EXTENDs waited behind them for a free one, got none within its
    # timeout (NotSent: no free connection) and every held job lost its
    # lease at once (the outage test at 500 slots).  The keeper's batch now
    # goes on the worker's own lane (STOP_LANE), as its stop's give-backs do.
    async def main() -> tuple[int, int, list[object]]:
        client = emq.Client.from_url(server.url)
        seen: list[object] = []
        started = asyncio.Event()

        async def handler(ctx: emq.JobContext) -> None:
            started.set()
            await asyncio.sleep(2.6)  # past the lease: only the keeper's checkpoints keep it
            seen.append(ctx.check())  # None: never cancelled (a lost lease cancels it)

        worker = emq.Worker(client, Q, handler, concurrency=2, lease_ms=1200, grace=1.0, reap=False)
        try:
            await client.enqueue(Q, b"", job_id="K")
            async with worker:
                await asyncio.wait_for(started.wait(), 10)
                connections = client._connections()
                let_go = asyncio.Event()

                async def hold() -> None:
                    async with connections.connection(Progress()):
                        await let_go.wait()

                holders = [asyncio.create_task(hold()) for _ in range(connections.limit)]
                await asyncio.sleep(0.3)
                taken = connections._busy - connections._lane_busy  # what every try but a lane one may take
                others = connections.limit - connections.lane
                await asyncio.sleep(1.7)  # the pool dry for them, longer than the lease
                let_go.set()
                await asyncio.wait(holders, timeout=5)
                for _ in range(100):
                    if seen:
                        break
                    await asyncio.sleep(0.05)
            return taken, others, seen
        finally:
            await client.aclose()

    taken, others, seen = asyncio.run(main())
    assert taken >= others  # the fault fired: no connection free for any try but the lane's
    assert seen == [None], seen  # the handler kept its lease throughout


def test_an_asyncio_claim_answered_after_the_stop_is_given_back_past_a_forced_stops_budget(
    server: EmbeddedServer,
) -> None:
    # A job whose claim was answered after the stop (a COMPLETECLAIM in
    # flight, say) never runs: its runner gave it back through the batches
    # sent together, within the force's budget, and a forced stop cancelled
    # that runner.  Every RELEASE meeting a reset until just past the budget,
    # the job stayed active, held by nobody (the outage test's "one job claimed
    # after the SIGTERM was never started or given back").  Now it goes back in
    # a batch of its own that the force does not cancel, with one real try past
    # the budget.
    async def handler(ctx: emq.JobContext) -> None:
        raise AssertionError("a job claimed after the stop never runs")

    async def main() -> list[float]:
        client = emq.Client.from_url(server.url)
        try:
            await client.enqueue(Q, b"", job_id="A")
            job = await client.claim(Q, 30_000)
            assert job is not None
            worker = emq.Worker(client, Q, handler, lease_ms=30_000, reap=False)
            worker._request_stop(time.monotonic(), 0.0)
            worker._force(time.monotonic())  # a second signal: the budget runs from now
            healed_at = worker._force_until + 0.1  # reachable again only past the budget
            real = client._attempt_many
            resets: list[float] = []

            client._attempt_many = lost_until(lambda: healed_at, real, resets)  # type: ignore[method-assign]
            runner = asyncio.create_task(worker._process(job, time.monotonic(), landed=False))
            await asyncio.sleep(0.25)
            runner.cancel()  # as the forced stop cancels the runners still going
            await asyncio.wait([runner])
            while worker._settling:
                await asyncio.wait(list(worker._settling))
            assert worker.stats.released == 1, worker.stats
            return resets
        finally:
            await client.aclose()

    resets = asyncio.run(main())
    assert resets  # the fault fired: the give-back met resets into the budget
    r = server.client()
    assert r.zrange(K.active, 0, -1) == [] and row(r, "A")["state"] == "pending", row(r, "A")


def test_an_asyncio_workers_sampled_wait_read_that_hangs_does_not_keep_its_handler_from_starting(
    r: redis.Redis, server: EmbeddedServer
) -> None:
    # With metrics, a first claim's enqueue-to-claim wait is read with
    # ``client.job`` through redis-py's own pool, which has no socket timeout:
    # on a half-open connection it waited for ever, and the claimed job's
    # handler never started until a forced stop gave it back.  Now the read
    # is bounded (a third of the lease here) and the claim counted without it.
    from prometheus_client import CollectorRegistry

    from echomq.metrics import Metrics

    async def main() -> tuple[list[str], int]:
        client = emq.Client.from_url(server.url)
        hung: list[str] = []
        ran: list[str] = []

        async def job_read(queue: str, job_id: str) -> Any:
            hung.append(job_id)
            await asyncio.Event().wait()  # a half-open connection: no answer, ever

        client.job = job_read  # type: ignore[method-assign]

        async def handler(ctx: emq.JobContext) -> None:
            ran.append(ctx.id)

        metrics = Metrics(CollectorRegistry(), share=False, wait_sample=1.0)
        worker = emq.Worker(client, Q, handler, lease_ms=1500, metrics=metrics, reap=False)
        try:
            await client.enqueue(Q, b"", job_id="W")
            async with worker:
                for _ in range(100):
                    if ran:
                        break
                    await asyncio.sleep(0.05)
        finally:
            await client.aclose()
        return hung, len(ran)

    hung, ran = asyncio.run(main())
    assert hung == ["W"]  # the fault fired: the wait's read never answered
    assert ran == 1 and row(r, "W")["state"] == "done", row(r, "W")


def test_an_asyncio_end_in_flight_at_a_forced_stop_gets_one_real_try_past_the_budget(
    server: EmbeddedServer,
) -> None:
    # The asyncio twin of the thread worker's test above: a handler returned,
    # its COMPLETE meets connection resets until just past a forced stop's
    # budget.  The budget cut it (and the force cancelled its runner): the job
    # stayed active, held by nobody, until a sweep counted a stall for a job
    # whose handler had succeeded.
    async def handler(ctx: emq.JobContext) -> None:
        pass

    async def main() -> list[float]:
        client = emq.Client.from_url(server.url)
        try:
            await client.enqueue(Q, b"", job_id="E")
            job = await client.claim(Q, 30_000)
            assert job is not None
            worker = emq.Worker(client, Q, handler, lease_ms=30_000, reap=False)
            held = HeldJob.claimed(job, CancelToken(), 30_000, claimed_at=time.monotonic())
            finish = worker._decide(held, None)
            assert finish.action is Action.COMPLETE
            worker._force(time.monotonic())  # a second signal: the budget runs from now
            healed_at = worker._force_until + 0.05  # reachable again only past the budget
            real = client._attempt_many
            resets: list[float] = []

            client._attempt_many = lost_until(lambda: healed_at, real, resets)  # type: ignore[method-assign]
            await worker._finish(finish)
            assert worker.stats.completed == 1 and worker.stats.leases_lost == 0, worker.stats
            return resets
        finally:
            await client.aclose()

    resets = asyncio.run(main())
    assert resets  # the fault fired: the COMPLETE met resets into the budget
    assert row(server.client(), "E")["state"] == "done", row(server.client(), "E")


def test_the_test_workers_recording_clients_take_every_argument_of_the_attempts_they_wrap() -> None:
    # The outage test's asyncio workers record through a client whose
    # _attempt_many did not take the lane the forced stop's give-back passes
    # (a TypeError, counted permanent): every forced asyncio stop of that test
    # gave nothing back, and the test blamed the worker.
    import inspect

    from .. import failover_worker, outage_worker

    for name, real in (("_attempt_many", emq.Client._attempt_many), ("_attempt", emq.Client._attempt)):
        want = list(inspect.signature(real).parameters)
        for module in (outage_worker, failover_worker):
            wrapped = getattr(module.AsyncRecordingClient, name)
            assert list(inspect.signature(wrapped).parameters) == want, (module.__name__, name)


def test_the_asyncio_keepers_close_ends_a_task_whose_cancel_was_swallowed(server: EmbeddedServer) -> None:
    # A forced asyncio stop of the outage test never exited: its one keeper
    # task had had the close's cancel swallowed on the way (in a try whose
    # timeout fired as it came) and went back to sleep, and Keepers.close()
    # waited for it for ever.  Its loop now looks at the close too.
    from echomq.asyncio.lease import Keepers

    swallowed: list[bool] = []
    real_send = Keepers._send

    async def send(batch: list[Any]) -> None:
        try:
            await asyncio.sleep(5)  # a try in flight as the worker ends
        except asyncio.CancelledError:
            swallowed.append(True)  # the fault: the cancel goes no further
            return
        await real_send(batch)

    async def main() -> bool:
        client = emq.Client.from_url(server.url)
        try:
            await client.enqueue(Q, b"", job_id="C")
            job = await client.claim(Q, 30_000)
            assert job is not None
            keepers = Keepers()
            keeper = emq.LeaseKeeper(client, job, 30_000, CancelToken(), interval=0.05)
            keeper._shared = keepers
            keepers._send = send  # type: ignore[method-assign, assignment]
            keeper.start()
            await asyncio.sleep(0.3)  # the keeper's round is in its try
            try:
                await asyncio.wait_for(keepers.close(), 5)
            except asyncio.TimeoutError:
                return False
            finally:
                await keeper.stop()
            return True
        finally:
            await client.aclose()

    closed = asyncio.run(main())
    assert swallowed  # the fault fired: the close's cancel was swallowed
    assert closed, "Keepers.close() waited for ever"
