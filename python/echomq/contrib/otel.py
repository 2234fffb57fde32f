"""OpenTelemetry for an app's tasks: a trace from the enqueue through every attempt (``echomq[otel]``).

    import echomq.contrib.otel

    app = echomq.App(client)
    echomq.contrib.otel.instrument(app)      # before its workers are made

It needs only ``opentelemetry-api`` (the ``otel`` extra); the application
configures the SDK and its exporter as for anything else it traces.  With
no SDK configured every span is a no-op and nothing is added to a job.
``echomq`` never imports this module: without ``instrument`` nothing
happens.

- **Enqueue**: each enqueue of a task starts a PRODUCER span ``create
  <queue>`` (a child of the current span: a web request's, say) and carries
  its W3C trace context (``traceparent``, ``tracestate``) in the job's
  payload header (``echomq.tasks.envelope``), so every retry and recovery
  of the job carries it too.
- **Each attempt**: the worker runs the task inside a CONSUMER span
  ``process <queue>``, linked to the enqueue's span (and its child, so the
  trace shows the whole life of the job; ``parent=False`` makes each
  attempt the root of a trace of its own, still linked).  Attributes, by
  the messaging semantic conventions: ``messaging.system`` = ``echomq``,
  ``messaging.operation.type`` = ``process``, ``messaging.destination.name``
  = the queue, ``messaging.message.id`` = the job id; and
  ``messaging.echomq.task``, ``messaging.echomq.attempt`` (1 on a first
  run), ``messaging.echomq.outcome``.  A checkpoint adds the event
  ``echomq.checkpoint`` (``echomq.checkpoint.step`` for ``checkpoint_step``),
  ``progress(...)`` the event ``echomq.progress``.
- **Its end**: the span ends when the task's function does, with the
  outcome the worker acts on: ``done`` (completed), ``failed`` (a try used;
  retried or dead by the job's tries), ``dead`` (``NonRetryable``),
  ``timeout``, ``cancelled`` (a cancel asked for), ``released`` (given back
  by a shutdown, or ``rate_limited``), ``lease_lost`` (the lease lapsed:
  the worker drops the job, a sweep recovers it for the next attempt).
  An exception is recorded on the span (``record_exception``, ``error.type``);
  ``failed``, ``dead``, ``timeout`` and ``lease_lost`` set its status to ERROR.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .._runtime.lease import TIMEOUT
from .._runtime.shutdown import SHUTDOWN
from .._sync.context import JobContext
from .._version import __version__
from ..asyncio.context import JobContext as AsyncJobContext
from ..errors import Cancelled, NonRetryable, RateLimited
from ..tasks.app import AppCore
from ..tasks.envelope import MAX_HEADER_CHARS, TaskCall

__all__ = ["SYSTEM", "TaskTracing", "instrument", "outcome_of", "uninstrument"]

SYSTEM = "echomq"  # messaging.system
_W3C = TraceContextTextMapPropagator()  # always W3C Trace Context, whatever the global propagator
_SCOPE = "echomq.contrib.otel"
ERRORS = frozenset({"failed", "dead", "timeout", "lease_lost"})


def outcome_of(ctx: Any, error: BaseException | None) -> str:
    """What the worker does with an attempt whose function ended with ``error`` (None: it returned).

    The same rules as the worker's own decision (``echomq/_runtime/finish.py``):
    a lost lease first (nothing is sent: the job is someone else's), then a
    return, then a shutdown's give-back, a 429, a timeout, a cancel, a
    ``NonRetryable``; anything else is a failure that uses a try.
    """
    cancellation = ctx.cancel.check()
    reason = None if cancellation is None else cancellation.reason
    if reason is not None and reason.startswith("lease lost"):
        return "lease_lost"
    if error is None:
        return "done"
    if reason == SHUTDOWN:
        return "released"
    if isinstance(error, RateLimited):
        return "rate_limited"
    if reason == TIMEOUT:
        return "timeout"
    if cancellation is not None and isinstance(error, Cancelled):
        return "cancelled"
    if isinstance(error, NonRetryable):
        return "dead"
    return "failed"


class _TracedContext(JobContext):
    """The ``JobContext`` a traced task sees: its checkpoints and progress are span events."""

    __slots__ = ("_span",)
    _span: trace.Span

    def checkpoint(self, state: bytes | None = None) -> bool:
        self._span.add_event("echomq.checkpoint", _state(state))
        return super().checkpoint(state)

    def checkpoint_step(self, step: int, data: dict[str, Any] | None = None) -> bool:
        self._span.add_event("echomq.checkpoint", {"echomq.checkpoint.step": step})
        return JobContext.checkpoint(self, _step_state(step, data))

    def progress(self, value: Any) -> None:
        self._span.add_event("echomq.progress")
        super().progress(value)


class _AsyncTracedContext(AsyncJobContext):
    """``_TracedContext`` for the asyncio worker."""

    __slots__ = ("_span",)
    _span: trace.Span

    async def checkpoint(self, state: bytes | None = None) -> bool:
        self._span.add_event("echomq.checkpoint", _state(state))
        return await super().checkpoint(state)

    async def checkpoint_step(self, step: int, data: dict[str, Any] | None = None) -> bool:
        self._span.add_event("echomq.checkpoint", {"echomq.checkpoint.step": step})
        return await AsyncJobContext.checkpoint(self, _step_state(step, data))

    async def progress(self, value: Any) -> None:
        self._span.add_event("echomq.progress")
        await super().progress(value)


def _state(state: bytes | None) -> dict[str, int]:
    return {} if state is None else {"echomq.checkpoint.state_bytes": len(state)}


def _step_state(step: int, data: dict[str, Any] | None) -> bytes:
    from .._runtime import Progress

    return Progress(step, {} if data is None else data).encode()


def _traced(ctx: Any, span: trace.Span) -> Any:
    """``ctx`` as a context whose checkpoints are events of ``span`` (the same job, token, keeper)."""
    kind: type[_TracedContext] | type[_AsyncTracedContext]
    if isinstance(ctx, JobContext):
        kind = _TracedContext
    elif isinstance(ctx, AsyncJobContext):
        kind = _AsyncTracedContext
    else:
        return ctx
    traced = kind(ctx.job, ctx.cancel, ctx._keeper)
    traced._span = span
    return traced


class TaskTracing:
    """The hook ``instrument(app)`` adds (``echomq.tasks.hooks.TaskHook``): see the module docstring."""

    def __init__(self, tracer_provider: TracerProvider | None = None, *, parent: bool = True) -> None:
        self.tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider)
        self.parent = parent

    def enqueue_headers(self, task: str, queue: str) -> Mapping[str, str] | None:
        """A PRODUCER span ``create <queue>``; its W3C context, to ride in the job's header."""
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "create",
            "messaging.operation.name": "create",
            "messaging.destination.name": queue,
            "messaging.echomq.task": task,
        }
        with self.tracer.start_as_current_span(
            f"create {queue}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            carrier: dict[str, str] = {}
            _W3C.inject(carrier)
        # A tracestate past the header's ceiling is dropped (W3C lets a carrier cut it), never the job.
        return {k: v for k, v in carrier.items() if len(quote(v, safe="")) <= MAX_HEADER_CHARS}

    @contextmanager
    def run(self, ctx: Any, call: TaskCall) -> Iterator[Any]:
        """One attempt's CONSUMER span ``process <queue>``, linked to the enqueue's span."""
        job = ctx.job
        created = _W3C.extract(dict(call.headers))
        origin = trace.get_current_span(created).get_span_context()
        links = [Link(origin)] if origin.is_valid else []
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": job.id,
            "messaging.echomq.task": call.name,
            "messaging.echomq.attempt": job.attempt,
        }
        with self.tracer.start_as_current_span(
            f"process {job.queue}",
            context=created if self.parent and origin.is_valid else None,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
            record_exception=False,  # recorded below, with the outcome
            set_status_on_exception=False,
        ) as span:
            try:
                yield _traced(ctx, span)
            except BaseException as exc:
                outcome = outcome_of(ctx, exc)
                span.record_exception(exc)
                span.set_attribute("error.type", type(exc).__qualname__)
                _end(span, outcome, f"{type(exc).__name__}: {exc}")
                raise
            outcome = outcome_of(ctx, None)
            _end(span, outcome, ctx.cancel.check().reason if outcome == "lease_lost" else None)


def _end(span: trace.Span, outcome: str, description: str | None) -> None:
    span.set_attribute("messaging.echomq.outcome", outcome)
    if outcome in ERRORS:
        span.set_status(Status(StatusCode.ERROR, description))


def instrument(
    app: AppCore, tracer_provider: TracerProvider | None = None, *, parent: bool = True
) -> TaskTracing:
    """Trace ``app``'s tasks (``echomq.App`` or ``echomq.asyncio.App``); returns the hook added.

    Call it before the app's workers are made (``app.worker()``, ``echomq
    worker module:app`` imports the module that calls it).  ``tracer_provider``
    defaults to the global one; ``parent=False`` makes each attempt's span a
    root (linked to the enqueue's) instead of its child.  Instrumenting an
    app twice changes nothing.
    """
    for hook in app.hooks:
        if isinstance(hook, TaskTracing):
            return hook
    hook = TaskTracing(tracer_provider, parent=parent)
    app.add_hook(hook)
    return hook


def uninstrument(app: AppCore) -> None:
    """Stop tracing ``app``'s enqueues and the workers made from now on."""
    app.hooks[:] = [hook for hook in app.hooks if not isinstance(hook, TaskTracing)]
