"""A worker process for the outage chaos test.

``python outage_worker.py URL QUEUE LEASE_MS sync|asyncio HISTORY [SLOTS [PREFETCH [MAX_STALLED]]]``:

Every handler run appends lines to HISTORY (JSON): ``start`` with the
job, its token and attempt, and the step it resumed from and the token that
stored it (issue 16); ``confirmed`` for each step whose checkpoint the
server confirmed; and ``end`` with how the handler ended and whether its
lease was known lost by then.  Every claim answered to the worker (a CLAIM,
a COMPLETECLAIM, alone or in a pipeline) appends ``claim`` with the job and
its token (issue 27): a job still held with a token of a worker that has
exited is held by nobody.  SLOTS is the worker's concurrency (default: 2
threads, or 4 tasks).  A job runs ``STEPS`` steps from where its last
checkpoint left off, storing each (``ctx.checkpoint_step``).  Poison jobs
(payload ``poison``) raise every time.  The worker runs until SIGTERM (a graceful stop; a second
one forces it), then prints its stats as one JSON line; after a forced stop it exits with
128 + the signal, as ``run()`` raises.
"""

from __future__ import annotations

import asyncio
import dataclasses
import faulthandler
import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any

import echomq
import echomq.asyncio as emq
from echomq import _protocol as proto

LOST = "lease lost"
STEPS = 6


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


def record_claims(calls: list[proto.Call[Any]], replies: list[Any]) -> None:
    """The jobs the answers to ``calls`` handed this worker (error replies hand none)."""
    for call, reply in zip(calls, replies, strict=True):
        name = str(call.args[0]).upper()
        if name not in ("EMQ.CLAIM", "EMQ.COMPLETECLAIM") or isinstance(reply, BaseException):
            continue
        try:
            value = call.read(reply)
        except Exception:
            continue
        for job in value if name == "EMQ.CLAIM" else value.jobs:
            HISTORY.write(event="claim", job=job.id, token=job.token)


def record_answer(call: proto.Call[Any], value: Any) -> None:
    """The jobs a single CLAIM's or COMPLETECLAIM's answer (already read) handed this worker."""
    name = str(call.args[0]).upper()
    jobs = value if name == "EMQ.CLAIM" else value.jobs if name == "EMQ.COMPLETECLAIM" else []
    for job in jobs:
        HISTORY.write(event="claim", job=job.id, token=job.token)


class RecordingClient(echomq.Client):
    def _attempt(self, call: proto.Call[Any], timeout: float, cutter: Any = None) -> Any:
        reply = super()._attempt(call, timeout, cutter)
        record_answer(call, reply)
        return reply

    def _attempt_many(self, calls: list[proto.Call[Any]], timeout: float, cutter: Any = None) -> list[Any]:
        replies = super()._attempt_many(calls, timeout, cutter)
        record_claims(calls, replies)
        return replies


class AsyncRecordingClient(emq.Client):
    async def _attempt(self, call: proto.Call[Any], timeout: float) -> Any:
        reply = await super()._attempt(call, timeout)
        record_answer(call, reply)
        return reply

    async def _attempt_many(
        self, calls: list[proto.Call[Any]], timeout: float, progress: Any = None, *, lane: bool = False
    ) -> list[Any]:
        replies = await super()._attempt_many(calls, timeout, progress, lane=lane)
        record_claims(calls, replies)
        return replies


def ended(history: History, ctx: echomq.JobContext | emq.JobContext, outcome: str) -> None:
    c = ctx.check()
    lost = c is not None and (c.reason or "").startswith(LOST)
    history.write(event="end", job=ctx.id, token=ctx.token, outcome=outcome, lost=lost, reason=c and c.reason)


def started(history: History, ctx: echomq.JobContext | emq.JobContext) -> int:
    done = ctx.resume_point
    writer = done.data.get("token")
    history.write(
        event="start", job=ctx.id, token=ctx.token, attempt=ctx.attempt, step=done.step, writer=writer
    )
    return done.step


def sync_handler(history: History) -> Any:
    def handler(ctx: echomq.JobContext) -> None:
        first = started(history, ctx)
        try:
            if ctx.payload == b"poison":
                raise RuntimeError("poison")
            for step in range(first + 1, STEPS + 1):
                time.sleep(random.uniform(0.02, 0.06))
                if ctx.checkpoint_step(step, {"token": ctx.token}):  # raises Cancelled when cancelled
                    history.write(event="confirmed", job=ctx.id, token=ctx.token, step=step)
                ctx.raise_if_cancelled()
        except BaseException as exc:
            ended(history, ctx, type(exc).__name__)
            raise
        ended(history, ctx, "returned")

    return handler


def async_handler(history: History) -> Any:
    async def handler(ctx: emq.JobContext) -> None:
        first = started(history, ctx)
        try:
            if ctx.payload == b"poison":
                raise RuntimeError("poison")
            for step in range(first + 1, STEPS + 1):
                await asyncio.sleep(random.uniform(0.02, 0.06))
                if await ctx.checkpoint_step(step, {"token": ctx.token}):
                    history.write(event="confirmed", job=ctx.id, token=ctx.token, step=step)
                ctx.raise_if_cancelled()
        except BaseException as exc:
            ended(history, ctx, type(exc).__name__)
            raise
        ended(history, ctx, "returned")

    return handler


def announce_ready(history: History) -> None:
    """Write ``ready`` once the worker handles SIGTERM (the test's deploys wait for it).

    A SIGTERM before ``run()`` installs its handler kills the process
    outright (a slow start on a busy machine): no test of a graceful stop.
    """

    def watch() -> None:
        while signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None, late_signal):
            time.sleep(0.01)
        history.write(event="ready")

    threading.Thread(target=watch, name="test-ready", daemon=True).start()


def count_signals(path: str) -> None:
    """Every SIGTERM a handler of the worker's runs for adds a byte to ``path`` (the test's forced
    deploys send their second signal only once the first was handled: two signals that come before
    Python runs the handler are one).  ``os.write``: a signal handler takes no lock."""
    global SIGNALS_FD
    fd = SIGNALS_FD = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    install = signal.signal

    def counting(signum: int, handler: Any) -> Any:
        if signum != signal.SIGTERM or not callable(handler) or handler is late_signal:
            return install(signum, handler)

        def counted(number: int, frame: Any) -> Any:
            os.write(fd, b"1")
            return handler(number, frame)

        return install(signum, counted)

    signal.signal = counting  # type: ignore[assignment]


SIGNALS_FD: int | None = None  # count_signals's file


def late_signal(signum: int, frame: object) -> None:
    """SIGTERM outside ``run()``: ignored.  ``run()`` puts this back as it returns, so a forced
    deploy's second signal that comes as the stop ends does not kill the process mid-exit.  It adds
    an ``L`` to the signals' file: the worker had stopped by itself (exit 0, not forced)."""
    if SIGNALS_FD is not None:
        os.write(SIGNALS_FD, b"L")


LOOP: asyncio.AbstractEventLoop | None = None  # the asyncio worker's, for dump_tasks
WORKER: Any = None  # the asyncio worker, for dump_tasks


def dump_tasks(signum: int, frame: object) -> None:
    """SIGUSR1: every thread's stack and every asyncio task's, to stderr (the test sends it to a
    worker that did not exit in time, before it kills it: where it hung)."""
    faulthandler.dump_traceback(all_threads=True)
    loop = LOOP
    if loop is not None:
        worker = WORKER
        flight = getattr(getattr(worker, "_coalescer", None), "_in_flight", None)
        timer = getattr(flight, "timer", None)
        if timer is not None:
            print(f"the batch in flight: {timer!r}, loop time {loop.time():.3f}", file=sys.stderr)
            for line in getattr(timer, "landed", []):
                print(f"  its timeout landed at {line}", file=sys.stderr)
        for task in asyncio.all_tasks(loop):
            cancelling = getattr(task, "cancelling", lambda: "?")()  # Python 3.11+
            print(f"task {task.get_name()} (cancels asked {cancelling}; {task!r}):", file=sys.stderr)
            for line in awaiting(task.get_coro()):
                print(f"  {line}", file=sys.stderr)
    sys.stderr.flush()


def awaiting(coro: Any) -> list[str]:
    """Where a suspended coroutine waits, outermost first: each frame of its ``await`` chain (a
    task's own stack shows only its top frame), down to the future or generator it waits on."""
    lines: list[str] = []
    while coro is not None and len(lines) < 40:
        frame = _first(coro, "cr_frame", "gi_frame", "ag_frame")
        if frame is not None:
            lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        else:
            lines.append(repr(coro))
        coro = _first(coro, "cr_await", "gi_yieldfrom", "ag_await")
    return lines


def _first(obj: Any, *names: str) -> Any:
    """The first of ``obj``'s attributes ``names`` that is set (a coroutine's, a generator's...)."""
    return next((getattr(obj, n) for n in names if getattr(obj, n, None) is not None), None)


def note_where_timeouts_land() -> None:
    """Each ``asyncio.timeout`` (Python 3.11+) keeps where its task waited when it fired
    (``landed``: dump_tasks prints the in-flight batch's): a try that outlives its timeout shows
    the step that lost the cancel (it was redis-py's send through ``asyncio.wait_for``)."""
    if sys.version_info < (3, 11):
        return
    timeout_class: Any = asyncio.Timeout
    original = timeout_class._on_timeout

    def on_timeout(self: Any) -> None:
        self.landed = awaiting(self._task.get_coro())
        original(self)

    timeout_class._on_timeout = on_timeout


def main() -> None:
    global HISTORY
    url, queue, lease_ms, mode, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    slots = int(sys.argv[6]) if len(sys.argv) > 6 else (2 if mode == "sync" else 4)
    echomq.configure_logging(os.environ.get("ECHOMQ_OUTAGE_LOG", "warning"))
    history = HISTORY = History(path)
    signal.signal(signal.SIGTERM, late_signal)
    signal.signal(signal.SIGUSR1, dump_tasks)
    note_where_timeouts_land()
    count_signals(path + ".signals")
    announce_ready(history)
    prefetch = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    max_stalled = int(sys.argv[8]) if len(sys.argv) > 8 else 3
    settings: dict[str, Any] = {
        "lease_ms": lease_ms, "max_attempts": 3, "poll_interval": 0.02, "grace": 2.0, "prefetch": prefetch,
        "max_stalled": max_stalled,
    }  # fmt: skip
    forced: SystemExit | None = None  # run() raises it after a second signal
    if mode == "sync":
        client = RecordingClient.from_url(url)
        worker = echomq.Worker(client, queue, sync_handler(history), concurrency=slots, **settings)
        try:
            worker.run()
        except SystemExit as exc:
            forced = exc
        stats = worker.stats
    else:
        workers: list[emq.Worker] = []

        async def run() -> None:
            global LOOP, WORKER
            LOOP = asyncio.get_running_loop()
            aclient = AsyncRecordingClient.from_url(url)
            WORKER = emq.Worker(aclient, queue, async_handler(history), concurrency=slots, **settings)
            workers.append(WORKER)
            try:
                await workers[0].run()
            finally:
                await aclient.aclose()

        try:
            asyncio.run(run())
        except SystemExit as exc:
            forced = exc
        stats = workers[0].stats
    print(json.dumps({"pid": os.getpid(), "mode": mode, **dataclasses.asdict(stats)}), flush=True)
    if forced is not None:
        raise forced


if __name__ == "__main__":
    main()
