"""``echomq.App``: tasks by name over a client, and the worker that runs them.

    app = echomq.App(client)

    @app.task(queue="mail", max_attempts=5)
    def send_mail(to: str, subject: str) -> bool:
        ...

    handle = send_mail.enqueue("ada@example.com", subject="hi")   # typed by send_mail's signature
    sent: bool = handle.result(timeout=30)
    app.enqueue("send_mail", "bob@example.com", subject="hi")     # by name, without the function
    app.worker().run()                                            # every queue of the app's tasks

``AppCore`` and ``TaskCore`` (``core.py``) hold what both apps and both
kinds of task share (the tasks by name, the serializers, the checks);
``App`` and its ``Task`` here, ``echomq.asyncio.App`` and its ``AsyncTask``
(``aio.py``), add the client's calls.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from .. import _protocol as proto
from .._protocol import JobId
from .._protocol.deps import OnParentFailure
from .._runtime import JobSettings, check_seconds
from .._sync._reach import wait_for_server
from ..retry import RetryPolicy
from .canvas import Chain, Chord, Group, Signature, plan
from .core import AppCore, EnqueueOptions, TaskCore, _after, _nothing
from .dispatch import Dispatcher
from .flows import WorkflowHandle
from .handle import TaskHandle
from .isolated import check_import_path, defined_in
from .serializers import JSON, Serializer

if TYPE_CHECKING:
    from .._sync.client import Client
    from .._sync.worker import Worker
    from ..schedules import ScheduleInfo

__all__ = ["App", "AppCore", "Task", "TaskWorker"]

P = ParamSpec("P")
R = TypeVar("R")


class TaskWorker:
    """``app.worker()``: one ``echomq.Worker`` per queue, run together, stopped together."""

    def __init__(
        self,
        workers: list[Worker],
        on_start: Callable[[], object] | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        if not workers:
            raise ValueError("a TaskWorker needs at least one worker: no queue was given")
        self.workers = workers
        self._on_start = on_start  # the app's schedules, stored before the first claim
        self._dispatcher = dispatcher  # its tasks' own children (isolation="process"): with the workers

    def _starting(self) -> None:
        if self._on_start is not None:
            self._on_start()
        if self._dispatcher is not None:
            try:
                self._dispatcher.processes.prestart(self.workers)
            except BaseException:  # a child that cannot start (its app's import failed): none left behind
                self._dispatcher.processes.close()
                raise

    def _stopped(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.processes.close()

    def run(self, *, handle_signals: bool = True) -> None:
        """Work until ``stop()``, SIGINT or SIGTERM (see ``echomq.Worker.run``).

        The first worker runs in this thread and takes the signals; when any
        of them stops (a task's ``sys.exit``, say), they all stop, and what
        stopped it is raised here.
        """
        self._starting()
        first, *others = self.workers
        for w in others:
            w.start()
        watchers = [threading.Thread(target=_stop_with, args=(w, first), daemon=True) for w in others]
        for t in watchers:
            t.start()
        try:
            first.run(handle_signals=handle_signals)
        finally:
            for w in others:
                w.stop()
            self._stopped()
        for w in others:
            if w._interrupt is not None:
                raise w._interrupt

    def start(self) -> TaskWorker:
        self._starting()
        for w in self.workers:
            w.start()
        return self

    def stop(self, grace: float | None = None) -> None:
        for w in self.workers:
            w.stop(grace)
        self._stopped()

    def __enter__(self) -> TaskWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_with(worker: Worker, first: Worker) -> None:
    """When ``worker`` stops by itself, the group's first worker (and so the group) stops too."""
    worker._done.wait()
    first.stop()


class _Decorator:
    def __init__(self, app: App, kwargs: dict[str, Any]) -> None:
        self._app, self._kwargs = app, kwargs

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...
    def __call__(self, fn: Callable[..., Any], /) -> Task[Any, Any]:
        return self._app._register(fn, **self._kwargs)


class App(AppCore):
    """Tasks by name over an ``echomq.Client`` (``echomq.asyncio.App`` for asyncio).

    ``App(client, *, queue="default", serializer=echomq.tasks.JSON, accept=(), import_path=None)``:
    ``queue`` is where a task without its own goes (and ``enqueue`` by a name
    this process does not know); ``serializer`` encodes arguments and
    results (JSON by default; ``echomq.tasks.PICKLE`` is unsafe: see
    ``echomq.tasks.serializers``); ``accept``, more serializers this app's
    workers decode; ``retry_unknown_tasks=True``, a job naming a task this
    app's workers do not know is retried (a rolling deploy's older workers)
    instead of ending dead at once; ``import_path``, ``"module:attr"``, where
    a child process imports this app from (``isolation="process"``: by
    default the global of the module that made it, or the ``echomq worker``
    target).
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
        from .._sync.client import Client as SyncClient

        if not isinstance(client, SyncClient):
            raise TypeError(
                f"client must be an echomq.Client (asyncio: echomq.asyncio.App), not {type(client).__name__}"
            )
        super().__init__(queue=queue, serializer=serializer, accept=accept)
        self.client = client
        self.retry_unknown_tasks = bool(retry_unknown_tasks)
        self.import_path = None if import_path is None else check_import_path(import_path)
        self._defined_in = defined_in(self)

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...
    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...
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
        isolation: str | None = None,
        max_jobs_per_child: int | None = None,
        cron: str | None = None,
        every_ms: int | None = None,
        tz: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        missed: str = "skip",
    ) -> _Decorator: ...
    def task(self, fn: Callable[..., Any] | None = None, /, **kwargs: Any) -> Any:
        """Make a function a task: ``@app.task`` or ``@app.task(queue=..., max_attempts=..., ...)``.

        ``name`` (default: the function's ``__name__``) is what a job carries
        and ``app.enqueue`` takes; ``queue`` (default: the app's);
        ``max_attempts`` or ``retry`` (an ``echomq.RetryPolicy``), ``lease_ms``
        and ``timeout_ms`` apply to this task's jobs in any worker of the app
        (default: the worker's); ``priority`` is its jobs' default level;
        ``unique`` makes its calls unique jobs: a key template of the
        function's argument names (``"{user_id}"``: the key is the task's
        name, a colon, then the template filled) or a function of the
        call's arguments returning the key (None: not unique), held for
        ``unique_for_ms`` or until the job ends (docs/concepts/unique.md);
        ``isolation="process"`` runs its jobs in a child process even when
        the worker runs threads (or asyncio), so that its timeout kills it (the app must
        be importable: ``import_path``), each child replaced after
        ``max_jobs_per_child`` jobs.
        """
        if fn is None:
            return _Decorator(self, kwargs)
        return self._register(fn, **kwargs)

    def _register(
        self,
        fn: Callable[..., Any],
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
        isolation: str | None = None,
        max_jobs_per_child: int | None = None,
        **timing: Any,  # cron=, every_ms=, tz=, args=, kwargs=, missed=: a periodic task
    ) -> Task[Any, Any]:
        name, queue, settings, priority = self._settings(
            fn, name, queue, max_attempts, retry, lease_ms, timeout_ms, priority
        )
        task: Task[Any, Any] = Task(self, fn, name, queue, settings, priority)
        task.set_unique(unique, unique_for_ms)
        task.set_isolation(isolation, max_jobs_per_child)
        self._adopt(task, timing)
        return task

    def register_schedules(self, client: Client | None = None) -> list[ScheduleInfo]:
        """Store this app's schedules on the server (idempotent); what ``app.worker()`` does as it starts."""
        client = self.client if client is None else client
        return [client.schedule(**p.schedule_args()) for p in self.periodic.values()]

    def enqueue(self, name: str, /, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        """Enqueue a call of the task ``name`` (no import of its function needed); a handle on its job."""
        return self.options().enqueue(name, *args, **kwargs)

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
    ) -> _ByName:
        """Enqueue options for ``.enqueue(name, ...)``; ``queue`` defaults to the task's, else the app's."""
        return _ByName(
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
    def enqueue_flow(self, flow: Group[R], /, *, queue: str | None = None) -> WorkflowHandle[list[R]]: ...
    @overload
    def enqueue_flow(
        self, flow: Chain[R] | Chord[R], /, *, queue: str | None = None
    ) -> WorkflowHandle[R]: ...
    def enqueue_flow(
        self, flow: Chain[Any] | Group[Any] | Chord[Any], /, *, queue: str | None = None
    ) -> WorkflowHandle[Any]:
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
            self.client.enqueue(**call)
        return WorkflowHandle(
            self.client, made.queue, made.workflow_id, made.job_ids, made.final, self.serializer
        )

    def handle(self, queue: str, job_id: str) -> TaskHandle[Any]:
        """A handle on a job enqueued earlier (its id kept somewhere): ``.result()``, ``.info()``."""
        proto.keys_of(queue)
        return TaskHandle(self.client, queue, job_id, self.serializer)

    def worker(self, queues: Iterable[str] | None = None, **settings: Any) -> TaskWorker:
        """A worker (threads) for every task of ``queues`` (default: every queue of the app's tasks).

        ``settings`` are ``echomq.Worker``'s (``concurrency``, ``lease_ms``,
        ...): each task's own ``lease_ms``, ``timeout_ms`` and tries win over
        them for its jobs.  ``isolation="process"`` runs every task in child
        processes, which a timeout kills (the children import the app by its
        ``import_path``); a task of its own ``isolation="process"`` runs in
        one even when the worker runs threads.  ``run()`` it, or
        ``start()`` ... ``stop()``.  ``wait_for_server=S``: as it starts,
        wait up to S seconds for the server to answer (default 0:
        ``ServerUnreachable`` at once); the app's schedules are stored then.
        """
        from .._sync.worker import Worker

        chosen = self._worker_queues(queues)
        dispatcher = Dispatcher.of(self)
        self._check_isolation(settings.get("isolation", "thread"), chosen)
        wait_s = check_seconds("wait_for_server", settings.pop("wait_for_server", 0.0), zero_ok=True)
        workers = [Worker(self.client, q, dispatcher, **settings) for q in chosen]

        def on_start() -> None:
            wait_for_server(self.client.redis, wait_s)
            if self.periodic:
                self.register_schedules()

        return TaskWorker(workers, on_start if wait_s or self.periodic else None, dispatcher)


class _ByName:
    __slots__ = ("_app", "_options", "_queue")

    def __init__(self, app: App, queue: str | None, options: EnqueueOptions) -> None:
        self._app, self._queue, self._options = app, queue, options

    def enqueue(self, name: str, /, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        app = self._app
        task, queue = app._by_name(name, self._queue)
        if task is None:  # a task of another process: its name, the app's serializer
            task = TaskCore(app, _nothing, name, queue, JobSettings(), None)
        call = task.enqueue_args(self._options, args, kwargs, queue)
        job_id = app.client.enqueue(**call)
        return TaskHandle(app.client, queue, job_id, app.serializer)


class Task(TaskCore, Generic[P, R]):
    """A function of an ``echomq.App``: ``enqueue(...)`` runs it in a worker; calling it runs it here."""

    app: App

    def __init__(self, app: App, fn: Callable[P, Any], name: str, queue: str, settings: JobSettings,
                 priority: int | None) -> None:  # fmt: skip
        super().__init__(app, fn, name, queue, settings, priority)
        self.fn: Callable[P, Any] = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Run the function here and now (no queue): what it returns (a coroutine for an ``async def``)."""
        return self.fn(*args, **kwargs)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Enqueue a call with these arguments; a handle on its job (``.id``, ``.result()``)."""
        return _Bound(self, EnqueueOptions()).enqueue(*args, **kwargs)

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
    ) -> _Bound[P, R]:
        """Enqueue options for the next ``.enqueue(...)``: the job's id, a delay or a time, a priority.

        ``unique_key`` (and ``unique_for_ms``, ``replace``) make the call a
        unique job (``client.enqueue``'s, docs/concepts/unique.md), over the
        task's own ``unique=`` key; the handle's ``created`` and ``replaced``
        say what the call did.

        ``after`` (handles of earlier enqueues of this queue, or their ids):
        the job waits until each has ended (``client.enqueue``'s ``after``);
        ``on_parent_failure`` (``"fail"``, the default: it ends dead;
        ``"ignore"``, ``"continue"``: it runs) says what a parent that did
        not end done does.  Its function reads the parents' results with
        ``echomq.tasks.parent_results()`` (docs/concepts/workflows.md).
        """
        return _Bound(
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


class _Bound(Generic[P, R]):
    """A task with enqueue options: ``.enqueue(*args, **kwargs)``, ``.options(...)`` again."""

    __slots__ = ("_options", "_task")

    def __init__(self, task: Task[P, R], options: EnqueueOptions) -> None:
        self._task, self._options = task, options

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Enqueue a call with these arguments and the options; a handle on its job."""
        task = self._task
        job_id = task.app.client.enqueue(**task.enqueue_args(self._options, args, kwargs))
        return TaskHandle(task.app.client, task.queue, job_id, task.serializer)

    def options(self, **changes: Any) -> _Bound[P, R]:
        return _Bound(self._task, replace(self._options, **changes))
