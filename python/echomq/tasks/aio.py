"""``echomq.asyncio.App`` and its ``AsyncTask``: ``echomq.App`` over an asyncio client, awaited.

The asyncio driver's modules are imported where they are used, not at the
top: ``echomq.asyncio``'s face imports this module, and so does
``echomq.tasks`` (for ``AsyncTask``), before that face may have run.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from .. import _protocol as proto
from .._protocol import JobId
from .._protocol.deps import OnParentFailure
from .._runtime import JobSettings, check_seconds
from ..retry import RetryPolicy
from .canvas import Chain, Chord, Group, Signature, plan
from .core import AppCore, EnqueueOptions, TaskCore, _after, _nothing
from .dispatch import AsyncDispatcher
from .flows import AsyncWorkflowHandle
from .handle import AsyncTaskHandle
from .isolated import check_import_path, defined_in
from .serializers import JSON, Serializer

if TYPE_CHECKING:
    from ..asyncio.client import Client
    from ..asyncio.worker import Worker
    from ..schedules import ScheduleInfo

__all__ = ["AsyncApp", "AsyncTask", "AsyncTaskWorker"]

P = ParamSpec("P")
R = TypeVar("R")


class AsyncTaskWorker:
    """``app.worker()``: one ``echomq.asyncio.Worker`` per queue, run together, stopped together."""

    def __init__(
        self,
        workers: list[Worker],
        on_start: Callable[[], Awaitable[object]] | None = None,
        dispatcher: AsyncDispatcher | None = None,
    ) -> None:
        self.workers = workers
        self._on_start = on_start  # the app's schedules, stored before the first claim
        self._dispatcher = dispatcher  # its tasks' own children (isolation="process"): with the workers

    async def run(self, *, handle_signals: bool = True) -> None:
        """Work until ``stop()``, SIGINT or SIGTERM: the first worker takes the signals, the rest follow."""
        if self._on_start is not None:
            await self._on_start()
        processes = None if self._dispatcher is None else self._dispatcher.processes
        if processes is not None:  # the children start (and import) in a thread: the loop goes on
            try:
                await asyncio.to_thread(processes.prestart, self.workers)
            except BaseException:
                await asyncio.to_thread(processes.close)
                raise
        first, *others = self.workers
        runs = [asyncio.ensure_future(first.run(handle_signals=handle_signals))]
        runs += [asyncio.ensure_future(w.run(handle_signals=False)) for w in others]
        try:
            await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.stop()
            outcomes = await asyncio.gather(*runs, return_exceptions=True)
            if processes is not None:
                await asyncio.to_thread(processes.close)
        for outcome in outcomes:  # what stopped the first to stop, raised here
            if isinstance(outcome, BaseException):
                raise outcome

    def stop(self, grace: float | None = None) -> None:
        for w in self.workers:
            w.stop(grace)


class _AsyncDecorator:
    def __init__(self, app: AsyncApp, kwargs: dict[str, Any]) -> None:
        self._app, self._kwargs = app, kwargs

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> AsyncTask[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> AsyncTask[P, R]: ...
    def __call__(self, fn: Callable[..., Any], /) -> AsyncTask[Any, Any]:
        return self._app._register(fn, **self._kwargs)


class AsyncApp(AppCore):
    """``echomq.App`` for asyncio: the same tasks, ``await task.enqueue(...)``, ``await handle.result()``.

    The asyncio worker stops a task by cancelling it at its next
    ``await``; in a worker of ``isolation="process"`` (``app.worker(isolation=
    "process")``), or for a task of its own ``isolation="process"``, it runs
    in a child process, killed at its timeout's abandon (see
    ``echomq.App.task``).
    """

    def __init__(
        self,
        client: Client,
        *,
        queue: str = "default",
        serializer: Serializer = JSON,
        accept: Iterable[Serializer] = (),
        retry_unknown_tasks: bool = False,
        import_path: str | None = None,
    ) -> None:
        from ..asyncio.client import Client as AsyncClient

        if not isinstance(client, AsyncClient):
            raise TypeError(
                f"client must be an echomq.asyncio.Client (threads: echomq.App), not {type(client).__name__}"
            )
        super().__init__(queue=queue, serializer=serializer, accept=accept)
        self.client = client
        self.retry_unknown_tasks = bool(retry_unknown_tasks)
        self.import_path = None if import_path is None else check_import_path(import_path)
        self._defined_in = defined_in(self)

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> AsyncTask[P, R]: ...
    @overload
    def task(self, fn: Callable[P, R], /) -> AsyncTask[P, R]: ...
    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        lease_ms: int | None = None,
        timeout_ms: int | None = None,
        priority: int | None = None,
        unique: Callable[..., str | bytes | None] | str | None = None,
        unique_for_ms: int | None = None,
        cron: str | None = None,
        every_ms: int | None = None,
        tz: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        missed: str = "skip",
    ) -> _AsyncDecorator: ...
    def task(self, fn: Callable[..., Any] | None = None, /, **kwargs: Any) -> Any:
        """Make a function a task (see ``echomq.App.task``)."""
        if fn is None:
            return _AsyncDecorator(self, kwargs)
        return self._register(fn, **kwargs)

    def _register(self, fn: Callable[..., Any], **kwargs: Any) -> AsyncTask[Any, Any]:
        keys = ("name", "queue", "max_attempts", "retry", "lease_ms", "timeout_ms", "priority")
        periodic: tuple[str, ...] = ("cron", "every_ms", "tz", "args", "kwargs", "missed")
        timing = {k: kwargs.pop(k) for k in periodic if k in kwargs}
        unknown = set(kwargs) - {*keys, "unique", "unique_for_ms", "isolation", "max_jobs_per_child"}
        if unknown:
            raise TypeError(f"unknown task settings: {', '.join(sorted(unknown))}")
        name, queue, settings, priority = self._settings(fn, *(kwargs.get(k) for k in keys))
        task: AsyncTask[Any, Any] = AsyncTask(self, fn, name, queue, settings, priority)
        task.set_unique(kwargs.get("unique"), kwargs.get("unique_for_ms"))
        task.set_isolation(kwargs.get("isolation"), kwargs.get("max_jobs_per_child"))
        self._adopt(task, timing)
        return task

    async def register_schedules(self, client: Client | None = None) -> list[ScheduleInfo]:
        """Store this app's schedules on the server (idempotent); what ``app.worker()`` does as it runs."""
        client = self.client if client is None else client
        return [await client.schedule(**p.schedule_args()) for p in self.periodic.values()]

    async def enqueue(self, name: str, /, *args: Any, **kwargs: Any) -> AsyncTaskHandle[Any]:
        """Enqueue a call of the task ``name``; a handle on its job (see ``echomq.App.enqueue``)."""
        return await self.options().enqueue(name, *args, **kwargs)

    def options(
        self,
        *,
        queue: str | None = None,
        job_id: JobId | None = None,
        delay_ms: int | None = None,
        at: datetime.datetime | float | None = None,
        priority: int | None = None,
        unique_key: str | bytes | None = None,
        unique_for_ms: int | None = None,
        replace: bool = False,
        after: Iterable[Any] | None = None,
        on_parent_failure: OnParentFailure | None = None,
    ) -> _AsyncByName:
        """Enqueue options for ``.enqueue(name, ...)`` (see ``echomq.App.options``)."""
        return _AsyncByName(
            self,
            queue,
            EnqueueOptions(
                job_id,
                delay_ms,
                at,
                priority,
                unique_key,
                unique_for_ms,
                replace,
                _after(after),
                on_parent_failure,
            ),
        )

    @overload
    async def enqueue_flow(
        self, flow: Group[R], /, *, queue: str | None = None
    ) -> AsyncWorkflowHandle[list[R]]: ...
    @overload
    async def enqueue_flow(
        self, flow: Chain[R] | Chord[R], /, *, queue: str | None = None
    ) -> AsyncWorkflowHandle[R]: ...
    async def enqueue_flow(
        self, flow: Chain[Any] | Group[Any] | Chord[Any], /, *, queue: str | None = None
    ) -> AsyncWorkflowHandle[Any]:
        """Enqueue every job of a ``chain``, ``group`` or ``chord`` at once; a handle on the workflow.

        Each job waits (in no lane) for what it follows, so nothing more is
        sent between steps; all are on one queue, the first task's or
        ``queue`` (docs/concepts/workflows.md, "Chains, groups and chords").
        Every call's arguments are checked before anything is sent.
        """
        made = plan(flow, queue)
        for task, _, _, _ in made.jobs:
            if task.app is not self:
                raise ValueError(f"task {task.name!r} is not one of this app's")
        calls = made.calls()
        for call in calls:
            await self.client.enqueue(**call)
        return AsyncWorkflowHandle(
            self.client, made.queue, made.workflow_id, made.job_ids, made.final, self.serializer
        )

    def handle(self, queue: str, job_id: str) -> AsyncTaskHandle[Any]:
        """A handle on a job enqueued earlier."""
        proto.keys_of(queue)
        return AsyncTaskHandle(self.client, queue, job_id, self.serializer)

    def worker(self, queues: Iterable[str] | None = None, **settings: Any) -> AsyncTaskWorker:
        """An asyncio worker for every task of ``queues`` (see ``echomq.App.worker``); ``await ....run()``."""
        from ..asyncio._reach import wait_for_server
        from ..asyncio.worker import Worker

        chosen = self._worker_queues(queues)
        dispatcher = AsyncDispatcher.of(self)
        self._check_isolation(settings.get("isolation", "thread"), chosen)
        wait_s = check_seconds("wait_for_server", settings.pop("wait_for_server", 0.0), zero_ok=True)
        workers = [Worker(self.client, q, dispatcher, **settings) for q in chosen]

        async def on_start() -> None:
            await wait_for_server(self.client.redis, wait_s)
            if self.periodic:
                await self.register_schedules()

        return AsyncTaskWorker(workers, on_start if wait_s or self.periodic else None, dispatcher)


class _AsyncByName:
    __slots__ = ("_app", "_options", "_queue")

    def __init__(self, app: AsyncApp, queue: str | None, options: EnqueueOptions) -> None:
        self._app, self._queue, self._options = app, queue, options

    async def enqueue(self, name: str, /, *args: Any, **kwargs: Any) -> AsyncTaskHandle[Any]:
        app = self._app
        task, queue = app._by_name(name, self._queue)
        if task is None:
            task = TaskCore(app, _nothing, name, queue, JobSettings(), None)
        call = task.enqueue_args(self._options, args, kwargs, queue)
        job_id = await app.client.enqueue(**call)
        return AsyncTaskHandle(app.client, queue, job_id, app.serializer)


class AsyncTask(TaskCore, Generic[P, R]):
    """A function of an ``echomq.asyncio.App``: ``await task.enqueue(...)``."""

    app: AsyncApp

    def __init__(self, app: AsyncApp, fn: Callable[P, Any], name: str, queue: str, settings: JobSettings,
                 priority: int | None) -> None:  # fmt: skip
        super().__init__(app, fn, name, queue, settings, priority)
        self.fn: Callable[P, Any] = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Run the function here and now (no queue)."""
        return self.fn(*args, **kwargs)

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> AsyncTaskHandle[R]:
        """Enqueue a call with these arguments; a handle on its job."""
        return await _AsyncBound(self, EnqueueOptions()).enqueue(*args, **kwargs)

    def s(self, *args: Any, **kwargs: Any) -> Signature[R]:
        """A signature of this call, for ``chain``, ``group`` and ``chord`` (``echomq.tasks.canvas``).

        In a chain (after its first step) or as a chord's callback, the
        function is given the previous result(s) first, before ``args``.
        """
        return Signature(self, tuple(args), dict(kwargs))

    def options(
        self,
        *,
        job_id: JobId | None = None,
        delay_ms: int | None = None,
        at: datetime.datetime | float | None = None,
        priority: int | None = None,
        unique_key: str | bytes | None = None,
        unique_for_ms: int | None = None,
        replace: bool = False,
        after: Iterable[Any] | None = None,
        on_parent_failure: OnParentFailure | None = None,
    ) -> _AsyncBound[P, R]:
        """Enqueue options for the next ``.enqueue(...)`` (see ``Task.options``)."""
        return _AsyncBound(
            self,
            EnqueueOptions(
                job_id,
                delay_ms,
                at,
                priority,
                unique_key,
                unique_for_ms,
                replace,
                _after(after),
                on_parent_failure,
            ),
        )


class _AsyncBound(Generic[P, R]):
    __slots__ = ("_options", "_task")

    def __init__(self, task: AsyncTask[P, R], options: EnqueueOptions) -> None:
        self._task, self._options = task, options

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> AsyncTaskHandle[R]:
        task = self._task
        job_id = await task.app.client.enqueue(**task.enqueue_args(self._options, args, kwargs))
        return AsyncTaskHandle(task.app.client, task.queue, job_id, task.serializer)
