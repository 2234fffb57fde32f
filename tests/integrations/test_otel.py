"""echomq.contrib.otel: a trace from a task's enqueue through each attempt (OpenTelemetry SDK, in memory).

Real servers and workers; spans read from the SDK's InMemorySpanExporter.
The main test crosses enqueue -> claim -> a lost lease (the asyncio
worker's loop is blocked past the lease, a sweep recovers the job) ->
recovery -> done, and finds one span per attempt, each linked to the
enqueue's span.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import echomq
import echomq.asyncio as emq
from echomq.keyspace import queue_keys
from echomq.testing import EmbeddedServer

from ..faults import pythonpath

pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is a test extra (pip install -e .[test])")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import echomq.contrib.otel as otel
from echomq.tasks.envelope import parse_call

pytestmark = pytest.mark.once

Q = "traced"
K = queue_keys(Q)


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def by_name(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


def test_a_lost_lease_and_its_recovery_show_one_span_per_attempt_all_linked_to_the_enqueue(
    server: EmbeddedServer, r: redis.Redis, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    seen: list[tuple[int, str | None]] = []
    payloads: list[bytes] = []

    async def main() -> str:
        client = emq.Client.from_url(server.url)
        app = emq.App(client, queue=Q)
        otel.instrument(app, tracer_provider=provider)

        @app.task(lease_ms=600)
        async def export(rows: int) -> int:
            ctx = echomq.asyncio.task_context()
            if not seen:
                # never awaits: the loop is blocked, no extend goes out, the lease lapses
                while not ctx.cancelled:
                    time.sleep(0.05)
                seen.append((ctx.attempt, ctx.check().reason))  # type: ignore[union-attr]
                return -1  # not completed: the worker gives the job back, the lease lost
            await ctx.checkpoint_step(1, {"rows": rows})
            seen.append((ctx.attempt, None))
            return rows

        try:
            with tracer.start_as_current_span("POST /exports"):
                handle = await export.enqueue(7)
            first = app.worker(lease_ms=600, poll_interval=0.05).workers[0]
            assert await first.work_one()
            assert first.stats.leases_lost == 1 and first.stats.completed == 0
            # Its lease lost to its deadline, the worker gave the job back (no sweep, no stall).
            recovered = await client.job(Q, handle.id, payload=True)
            assert recovered is not None and recovered.state == "pending" and recovered.payload
            payloads.append(recovered.payload)
            second = app.worker(poll_interval=0.05).workers[0]
            assert await second.work_one()
            assert await handle.result(timeout=10) == 7
            return handle.id
        finally:
            await client.aclose()

    job_id = asyncio.run(main())
    assert [a for a, _ in seen] == [1, 1]  # given back, not swept: no try used
    assert seen[0][1] is not None and seen[0][1].startswith("lease lost")

    request = by_name(exporter, "POST /exports")[0]
    (created,) = by_name(exporter, "create ")
    attempts = sorted(by_name(exporter, "process "), key=lambda s: s.start_time or 0)
    assert created.kind is SpanKind.PRODUCER and created.name == f"create {Q}"
    assert created.parent is not None and created.parent.span_id == request.context.span_id
    assert len(attempts) == 2
    for span in attempts:
        attrs = span.attributes
        assert span.kind is SpanKind.CONSUMER and span.name == f"process {Q}"
        assert attrs["messaging.system"] == "echomq" and attrs["messaging.destination.name"] == Q
        assert attrs["messaging.message.id"] == job_id and attrs["messaging.echomq.attempt"] == 1
        assert attrs["messaging.operation.type"] == "process" and attrs["messaging.echomq.task"] == "export"
        assert [link.context.span_id for link in span.links] == [created.context.span_id]
        assert span.context.trace_id == created.context.trace_id  # one trace: enqueue to done
        assert span.parent is not None and span.parent.span_id == created.context.span_id
    lost, done = attempts
    assert lost.attributes["messaging.echomq.outcome"] == "lease_lost"
    assert lost.status.status_code is StatusCode.ERROR and "lease lost" in (lost.status.description or "")
    assert done.attributes["messaging.echomq.outcome"] == "done"
    assert done.status.status_code is StatusCode.UNSET
    assert [(e.name, dict(e.attributes or {})) for e in done.events] == [
        ("echomq.checkpoint", {"echomq.checkpoint.step": 1})
    ]
    # the trace context rode in the payload's header, through the recovery
    call = parse_call(payloads[0])
    assert call.headers["traceparent"].split("-")[2] == format(created.context.span_id, "016x")


def test_a_failure_then_a_retry_record_the_exception_and_each_attempts_outcome(
    server: EmbeddedServer, r: redis.Redis, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    client = echomq.Client(server.client())
    app = echomq.App(client, queue=Q)
    otel.instrument(app, tracer_provider=provider)
    assert otel.instrument(app, tracer_provider=provider) is app.hooks[0] and len(app.hooks) == 1

    @app.task(max_attempts=3)
    def flaky(n: int) -> int:
        ctx = echomq.task_context()
        ctx.progress({"at": ctx.attempt})
        ctx.checkpoint(b"half")
        if ctx.attempt == 1:
            raise ConnectionError("the mail server hung up")
        return n * 2

    @app.task(max_attempts=3)
    def hopeless() -> None:
        raise echomq.NonRetryable("no such account")

    handle = flaky.enqueue(21)
    dead = hopeless.enqueue()
    with app.worker(poll_interval=0.05):
        assert handle.result(timeout=10) == 42
        with pytest.raises(echomq.JobFailed):
            dead.result(timeout=10)

    (created,) = [s for s in by_name(exporter, "create ") if s.attributes["messaging.echomq.task"] == "flaky"]
    runs = [s for s in by_name(exporter, "process ") if s.attributes["messaging.echomq.task"] == "flaky"]
    runs.sort(key=lambda s: s.attributes["messaging.echomq.attempt"])
    assert [s.attributes["messaging.echomq.outcome"] for s in runs] == ["failed", "done"]
    assert all([link.context.span_id for link in s.links] == [created.context.span_id] for s in runs)
    failed = runs[0]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "ConnectionError"
    (exception,) = [e for e in failed.events if e.name == "exception"]
    assert exception.attributes["exception.message"] == "the mail server hung up"
    assert [e.name for e in runs[1].events] == ["echomq.progress", "echomq.checkpoint"]
    assert dict(runs[1].events[1].attributes or {}) == {"echomq.checkpoint.state_bytes": 4}
    (nope,) = [
        s for s in by_name(exporter, "process ") if s.attributes["messaging.echomq.task"] == "hopeless"
    ]
    assert nope.attributes["messaging.echomq.outcome"] == "dead"
    assert nope.attributes["error.type"] == "NonRetryable"


def test_a_remote_cancel_ends_the_attempts_span_as_cancelled(
    server: EmbeddedServer, r: redis.Redis, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    client = echomq.Client(server.client())
    app = echomq.App(client, queue=Q)
    otel.instrument(app, tracer_provider=provider)
    started = threading.Event()

    @app.task
    def long_export() -> None:
        ctx = echomq.task_context()
        started.set()
        while True:
            ctx.checkpoint()
            time.sleep(0.05)

    handle = long_export.enqueue()
    with app.worker(poll_interval=0.05):
        assert started.wait(10)
        handle.cancel("the user gave up")
        with pytest.raises(echomq.JobCancelled):
            handle.result(timeout=10)
    (span,) = by_name(exporter, "process ")
    assert span.attributes["messaging.echomq.outcome"] == "cancelled"
    assert span.status.status_code is StatusCode.UNSET  # asked for: not an error


def test_without_instrument_or_an_sdk_a_job_carries_no_header(server: EmbeddedServer, r: redis.Redis) -> None:
    # No SDK configured (the API's global provider is a no-op): instrumenting adds nothing to a job,
    # and an instrumented worker runs jobs enqueued without a header (no link, no parent).
    client = echomq.Client(server.client())
    plain = echomq.App(client, queue=Q)
    traced = echomq.App(client, queue=Q)
    otel.instrument(traced)

    @plain.task(name="add")
    def add_plain(a: int, b: int) -> int:
        return a + b

    @traced.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    one, two = add_plain.enqueue(1, 2), add.enqueue(3, 4)
    for handle in (one, two):
        info = client.job(Q, handle.id, payload=True)
        assert info is not None and info.payload is not None
        assert parse_call(info.payload).headers == {}
    with traced.worker(poll_interval=0.05):
        assert (one.result(timeout=10), two.result(timeout=10)) == (3, 7)


def test_importing_echomq_imports_no_opentelemetry() -> None:
    # redis-py itself imports opentelemetry when it is installed (its own instrumentation): echomq adds
    # nothing to what `import redis` loaded, and never loads echomq.contrib.
    code = (
        "import sys, redis\n"
        "before = {m for m in sys.modules if m.startswith('opentelemetry')}\n"
        "import echomq, echomq.asyncio, echomq.tasks, echomq.cli\n"
        "added = sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'echomq.contrib')))\n"
        "added = [m for m in added if m not in before]\n"
        "assert not added, added\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_shutdown_gives_the_job_back_and_ends_the_span_as_released(
    server: EmbeddedServer, r: redis.Redis, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    client = echomq.Client(server.client())
    app = echomq.App(client, queue=Q)
    otel.instrument(app, tracer_provider=provider)
    started = threading.Event()

    @app.task
    def long_export() -> None:
        ctx = echomq.task_context()
        started.set()
        while True:
            ctx.raise_if_cancelled()  # "shutdown" once the grace is over
            time.sleep(0.02)

    handle = long_export.enqueue()
    worker = app.worker(poll_interval=0.05, grace=0.1).start()
    assert started.wait(10)
    worker.stop()  # waits until the worker has stopped
    (span,) = by_name(exporter, "process ")
    assert span.attributes["messaging.echomq.outcome"] == "released"
    assert span.status.status_code is StatusCode.UNSET
    info = client.job(Q, handle.id)
    assert info is not None and info.state == "pending" and info.tries == 0  # given back, no try used


TRACED_APP = """
import os

import echomq
import echomq.asyncio
import echomq.contrib.otel
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    def export(self, spans):
        with open(os.environ["SPANS_FILE"], "a") as out:
            for s in spans:
                links = ",".join(format(link.context.span_id, "016x") for link in s.links)
                out.write(f"{s.name}|{s.attributes['messaging.echomq.outcome']}|{links}\\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
if os.environ["APP_KIND"] == "asyncio":
    app = echomq.asyncio.App(echomq.asyncio.Client.from_url(os.environ["ECHOMQ_URL"]), queue="traced")
else:
    app = echomq.App(echomq.Client.from_url(os.environ["ECHOMQ_URL"]), queue="traced")
echomq.contrib.otel.instrument(app, tracer_provider=provider)


@app.task
def double(n: int) -> int:
    return n * 2
"""


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_echomq_worker_runs_an_instrumented_apps_spans(
    server: EmbeddedServer, r: redis.Redis, spans: tuple[TracerProvider, InMemorySpanExporter],
    tmp_path: Path, kind: str,
) -> None:  # fmt: skip
    # `echomq worker module:app` builds its dispatcher from the app: the app's hooks come with it.
    provider, exporter = spans
    (tmp_path / "tracedapp.py").write_text(TRACED_APP)
    spans_file = tmp_path / "spans.txt"
    app = echomq.App(echomq.Client(server.client()), queue=Q)
    otel.instrument(app, tracer_provider=provider)
    handle = app.enqueue("double", 21)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHOMQ_")}
    env.update(
        PYTHONPATH=pythonpath(tmp_path), ECHOMQ_URL=server.url, SPANS_FILE=str(spans_file), APP_KIND=kind
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "echomq", "worker", "tracedapp:app", "--grace", "0"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert handle.result(timeout=20) == 42
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    (created,) = by_name(exporter, "create ")
    assert spans_file.read_text().splitlines() == [
        f"process {Q}|done|{format(created.context.span_id, '016x')}"
    ]
