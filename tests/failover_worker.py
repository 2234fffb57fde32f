"""A worker process for the failover chaos test, following the master through the Sentinels.

``python failover_worker.py SENTINEL_PORTS SERVICE QUEUE LEASE_MS sync|asyncio BACKEND HISTORY [REPLICAS]``
(``SENTINEL_PORTS``: comma-separated ports on 127.0.0.1; ``REPLICAS``: the
workers' ``replicas=``, 0 by default: a handler starts only once that many
replicas have its claim, waiting at most 500 ms).

The redis client is ``Sentinel(...).master_for(SERVICE)`` (redis-py's, sync or
asyncio): after a failover, a new connection asks the Sentinels for the
master again.  Its connection class notes which server answered each reply
(its port), and the echomq client is a subclass that writes one ``finish``
line per COMPLETE/FAIL/RELEASE answer it got -- accepted, refused as
stale or gone, or unanswered -- with the token and the port of the server that answered.
So the test knows which server accepted each completion without touching the
worker runtime: the runtime sends every command through ``client._attempt`` or ``_attempt_many``.

Every handler run appends ``start`` (job, token, attempt) and ``end`` (how
it ended, whether its lease was known lost, the cancel's reason) to HISTORY,
with ``time.time()`` (one clock for every process of the test).  A job's
payload says how long its handler runs (``{"ms": ...}``), checking its cancel
token every 10 ms; ``{"poison": true}`` raises at once.  The handlers never
checkpoint themselves: only the lease keeper does, every third of the lease,
which is what the overlap bound is about.  SIGTERM stops the worker
gracefully; it then prints its stats as one JSON line.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import json
import os
import sys
import threading
import time
from typing import Any, TypeVar

import redis.asyncio.sentinel as async_sentinel
import redis.sentinel

import echomq
import echomq.asyncio as emq
from echomq import _protocol as proto
from echomq._sync._attempt import Cutter

T = TypeVar("T")
STEP_S = 0.01
FINISHES = {"EMQ.COMPLETE": "complete", "EMQ.FAIL": "fail", "EMQ.RELEASE": "release",
            "EMQ.COMPLETECLAIM": "complete"}  # fmt: skip

# The port of the server whose reply this thread (sync) or task (asyncio) read last.
_SEEN_SYNC = threading.local()
_SEEN_ASYNC: contextvars.ContextVar[int] = contextvars.ContextVar("seen", default=0)


class History:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life)
        self._lock = threading.Lock()

    def write(self, **event: Any) -> None:
        event["pid"] = os.getpid()
        event["t"] = time.time()
        with self._lock:
            self._file.write(json.dumps(event) + "\n")


HISTORY: History


class SeenConnection(redis.sentinel.SentinelManagedConnection):
    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)
        finally:  # an error reply (EMQSTALE) comes from this server too
            _SEEN_SYNC.port = int(self.port)


class AsyncSeenConnection(async_sentinel.SentinelManagedConnection):
    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        finally:
            _SEEN_ASYNC.set(int(self.port))


def token_of(call: proto.Call[Any]) -> str:
    """The token argument of a COMPLETE, FAIL or RELEASE command line."""
    verb = str(call.args[0]).upper()
    position = {"EMQ.COMPLETE": 4, "EMQ.FAIL": 6, "EMQ.RELEASE": 5, "EMQ.COMPLETECLAIM": 5}[verb]
    return proto.text(call.args[position])


def record(call: proto.Call[Any], outcome: str, port: int, sent: float, reply: Any = None) -> None:
    """One line per job a claim handed out, one per finish answered; ``sent``: when the command went out."""
    name = str(call.args[0]).upper()
    if name == "EMQ.CLAIM" and outcome == "accepted":  # which server handed out which token
        for job in reply or ():
            HISTORY.write(event="claim", job=job.id, token=job.token, port=port, sent=sent)
        return
    if name == "EMQ.COMPLETECLAIM" and outcome == "accepted":  # a finish, then a claim (issue 18)
        for job in reply.jobs:
            HISTORY.write(event="claim", job=job.id, token=job.token, port=port, sent=sent)
        if reply.gone:
            outcome = "gone"
    verb = FINISHES.get(name)
    if verb is not None:
        HISTORY.write(
            event="finish",
            verb=verb,
            job=call.job_id,
            token=token_of(call),
            outcome=outcome,
            port=port,
            sent=sent,
        )


def record_pipeline(calls: list[proto.Call[Any]], replies: list[Any] | None, port: int, sent: float) -> None:
    """The calls a worker sent in one pipeline (its jobs' ends together, a finish and a claim)."""
    for n, call in enumerate(calls):
        if replies is None:
            record(call, "unanswered", port, sent)
            continue
        try:
            value = proto.read_reply(call, replies[n])
        except echomq.LeaseLost as exc:
            record(call, "gone" if isinstance(exc, echomq.JobGone) else "stale", port, sent)
        except Exception:  # an error that is no verdict: nothing applied
            record(call, "unanswered", port, sent)
        else:
            record(call, "accepted", port, sent, value)


class RecordingClient(echomq.Client):
    def _attempt_many(self, calls: list[proto.Call[Any]], timeout: float) -> list[Any]:
        _SEEN_SYNC.port = 0
        sent = time.time()
        try:
            replies = super()._attempt_many(calls, timeout)
        except Exception:
            record_pipeline(calls, None, _SEEN_SYNC.port, sent)
            raise
        record_pipeline(calls, replies, _SEEN_SYNC.port, sent)
        return replies

    def _attempt(self, call: proto.Call[T], timeout: float, cutter: Cutter | None = None) -> T:
        _SEEN_SYNC.port = 0
        sent = time.time()
        try:
            reply = super()._attempt(call, timeout, cutter)
        except echomq.LeaseLost as exc:
            record(call, "gone" if isinstance(exc, echomq.JobGone) else "stale", _SEEN_SYNC.port, sent)
            raise
        except Exception:  # no answer (a dead master, a timeout): the server may have applied it
            record(call, "unanswered", _SEEN_SYNC.port, sent)
            raise
        record(call, "accepted", _SEEN_SYNC.port, sent, reply)
        return reply


class AsyncRecordingClient(emq.Client):
    async def _attempt_many(
        self, calls: list[proto.Call[Any]], timeout: float, progress: Any = None, *, lane: bool = False
    ) -> list[Any]:
        _SEEN_ASYNC.set(0)
        sent = time.time()
        try:
            replies = await super()._attempt_many(calls, timeout, progress, lane=lane)
        except BaseException:
            record_pipeline(calls, None, _SEEN_ASYNC.get(), sent)
            raise
        record_pipeline(calls, replies, _SEEN_ASYNC.get(), sent)
        return replies

    async def _attempt(self, call: proto.Call[T], timeout: float) -> T:
        _SEEN_ASYNC.set(0)
        sent = time.time()
        try:
            reply = await super()._attempt(call, timeout)
        except echomq.LeaseLost as exc:
            record(call, "gone" if isinstance(exc, echomq.JobGone) else "stale", _SEEN_ASYNC.get(), sent)
            raise
        except Exception:  # no answer (a dead master, a timeout): the server may have applied it
            record(call, "unanswered", _SEEN_ASYNC.get(), sent)
            raise
        record(call, "accepted", _SEEN_ASYNC.get(), sent, reply)
        return reply


def ended(ctx: echomq.JobContext | emq.JobContext, outcome: str) -> None:
    c = ctx.check()
    lost = c is not None and (c.reason or "").startswith("lease lost")
    HISTORY.write(event="end", job=ctx.id, token=ctx.token, outcome=outcome, lost=lost, reason=c and c.reason)


def sync_handler(ctx: echomq.JobContext) -> None:
    HISTORY.write(event="start", job=ctx.id, token=ctx.token, attempt=ctx.attempt)
    spec = json.loads(ctx.payload)
    try:
        if spec.get("poison"):
            raise RuntimeError("poison")
        until = time.monotonic() + spec["ms"] / 1000
        while time.monotonic() < until:
            ctx.raise_if_cancelled()
            time.sleep(STEP_S)
        ctx.raise_if_cancelled()
    except BaseException as exc:
        ended(ctx, type(exc).__name__)
        raise
    ended(ctx, "returned")


async def async_handler(ctx: emq.JobContext) -> None:
    HISTORY.write(event="start", job=ctx.id, token=ctx.token, attempt=ctx.attempt)
    spec = json.loads(ctx.payload)
    try:
        if spec.get("poison"):
            raise RuntimeError("poison")
        until = time.monotonic() + spec["ms"] / 1000
        while time.monotonic() < until:
            ctx.raise_if_cancelled()
            await asyncio.sleep(STEP_S)
        ctx.raise_if_cancelled()
    except BaseException as exc:
        ended(ctx, type(exc).__name__)
        raise
    ended(ctx, "returned")


def main() -> None:
    global HISTORY
    ports, service, queue = sys.argv[1], sys.argv[2], sys.argv[3]
    lease_ms, mode, backend, path = int(sys.argv[4]), sys.argv[5], sys.argv[6], sys.argv[7]
    replicas = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    assert backend in ("module", "scripts")
    sentinels = [("127.0.0.1", int(p)) for p in ports.split(",")]
    echomq.configure_logging("warning")
    HISTORY = History(path)
    settings: dict[str, Any] = {"lease_ms": lease_ms, "max_attempts": 3, "poll_interval": 0.05, "grace": 2.0}
    if replicas:
        settings.update(replicas=replicas, replicas_timeout_ms=500)
    options: dict[str, Any] = {"socket_timeout": 2.0, "socket_connect_timeout": 1.0}
    if mode == "sync":
        r = redis.sentinel.Sentinel(sentinels, socket_timeout=0.5).master_for(
            service, connection_class=SeenConnection, **options
        )
        client = RecordingClient(r, backend)
        worker = echomq.Worker(client, queue, sync_handler, concurrency=2, **settings)
        worker.run()
        stats = worker.stats
    else:

        async def run() -> echomq.WorkerStats:
            ar = async_sentinel.Sentinel(sentinels, socket_timeout=0.5).master_for(
                service, connection_class=AsyncSeenConnection, **options
            )
            aclient = AsyncRecordingClient(ar, backend)
            aworker = emq.Worker(aclient, queue, async_handler, concurrency=4, **settings)
            try:
                await aworker.run()
            finally:
                await aclient.aclose()
            return aworker.stats

        stats = asyncio.run(run())
    print(json.dumps({"pid": os.getpid(), "mode": mode, **dataclasses.asdict(stats)}), flush=True)


if __name__ == "__main__":
    main()
