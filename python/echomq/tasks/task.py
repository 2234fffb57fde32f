"""A task: a function, its name and queue, its settings, and how a call of it is enqueued.

``Task`` (an ``echomq.App``'s) and ``AsyncTask`` (an ``echomq.asyncio.App``'s)
differ only in whether ``enqueue`` is awaited.  Enqueue options never mix
with the function's own keyword arguments: they go through ``options()``::

    send_mail.enqueue("ada@example.com", subject="hi")                  # the function's arguments only
    send_mail.options(delay_ms=60_000, job_id="welcome-ada").enqueue("ada@example.com")
"""

from __future__ import annotations

import datetime
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar

from .. import _protocol as proto
from .._protocol import JobId
from .._runtime import JobSettings, check_int
from .envelope import encode_call
from .handle import AsyncTaskHandle, TaskHandle
from .hooks import TaskHook
from .serializers import Serializer

if TYPE_CHECKING:
    from .._sync.client import Client
    from ..asyncio.client import Client as AsyncClient

__all__ = ["AsyncTask", "EnqueueOptions", "Task", "TaskCore"]


# What a task needs of its app, named here, not imported: the apps (core.py, app.py, aio.py) make
# tasks, so they import this module, never the other way round.
class AppCore(Protocol):
    """What a task needs of any app (``core.AppCore`` has it): its serializer and hooks."""

    @property
    def serializer(self) -> Serializer: ...

    @property
    def hooks(self) -> Sequence[TaskHook]: ...


class App(AppCore, Protocol):
    """What a ``Task`` needs of an ``echomq.App``: its client too."""

    @property
    def client(self) -> Client: ...


class AsyncApp(AppCore, Protocol):
    """What an ``AsyncTask`` needs of an ``echomq.asyncio.App``: its asyncio client too."""

    @property
    def client(self) -> AsyncClient: ...

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """How one call is enqueued: its id, when it runs, its priority, its unique key (None: the task's)."""

    job_id: JobId | None = None
    delay_ms: int | None = None
    at: datetime.datetime | float | None = None
    priority: int | None = None
    unique_key: str | bytes | None = None  # None: the task's own key of the call (``unique=``), if any
    unique_for_ms: int | None = None
    replace: bool = False

    def run_at_ms(self) -> int | None:
        """``at`` as unix ms (a datetime without a timezone is refused: whose midnight would it be?)."""
        if self.at is None:
            return None
        if isinstance(self.at, datetime.datetime):
            if self.at.tzinfo is None:
                raise ValueError("at must be an aware datetime (with a tzinfo), or unix seconds")
            return int(self.at.timestamp() * 1000)
        if isinstance(self.at, bool) or not isinstance(self.at, int | float):
            raise TypeError(f"at must be a datetime or unix seconds, not {type(self.at).__name__}")
        return int(self.at * 1000)


class TaskCore:
    """What both kinds of task share: the function, its name and queue, its settings."""

    def __init__(
        self,
        app: AppCore,
        fn: Callable[..., Any],
        name: str,
        queue: str,
        settings: JobSettings,
        priority: int | None,
    ) -> None:
        self.app, self.name, self.queue = app, name, queue
        self.settings, self.priority = settings, priority
        self.is_async = inspect.iscoroutinefunction(fn)
        self._fn = fn
        self.unique: Callable[..., str | bytes | None] | str | None = None
        self.unique_for_ms: int | None = None
        # isolation="process": its jobs run in a child process even in a worker of threads (isolated.py).
        self.isolation: str | None = None
        self.max_jobs_per_child: int | None = None
        try:
            self._signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without one: the call itself will tell
            self._signature = None

    @property
    def serializer(self) -> Serializer:
        return self.app.serializer

    def payload(self, args: Sequence[Any], kwargs: Mapping[str, Any], queue: str | None = None) -> bytes:
        """The job's payload for this call (``SerializationError`` before anything is sent).

        The app's hooks (``app.add_hook``) give the headers it carries.
        """
        headers: dict[str, str] = {}
        for hook in self.app.hooks:
            headers.update(hook.enqueue_headers(self.name, queue or self.queue) or {})
        return encode_call(self.name, self.serializer, args, kwargs, headers)

    def binding_problem(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """Why ``args`` and ``kwargs`` do not bind the function's signature (None: they do, or unknown)."""
        if self._signature is None:
            return None
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            return str(exc)
        return None

    def set_unique(self, unique: Callable[..., str | bytes | None] | str | None, for_ms: int | None) -> None:
        """The task's own unique key of a call: a template of its arguments' names, or a function of them."""
        if unique is not None and not isinstance(unique, str) and not callable(unique):
            raise TypeError(f"unique must be a key template (str) or a function, not {type(unique).__name__}")
        if for_ms is not None and unique is None:
            raise ValueError("unique_for_ms needs unique= (the key of a call)")
        proto.unique_args("k" if for_ms is not None else None, for_ms, False)  # checked as the server would
        self.unique, self.unique_for_ms = unique, for_ms

    def set_isolation(self, isolation: str | None, max_jobs_per_child: int | None) -> None:
        """Where the task runs: ``"process"``, a child process that its timeout kills; None, the worker's."""
        if isolation not in (None, "process"):
            raise ValueError(
                f"isolation must be 'process' (a child process its timeout kills) or None (where the "
                f"worker runs its handlers), got {isolation!r}"
            )
        if max_jobs_per_child is not None:
            check_int("max_jobs_per_child", max_jobs_per_child)
            if isolation != "process":
                raise ValueError("max_jobs_per_child needs isolation='process' (threads are not recycled)")
        self.isolation, self.max_jobs_per_child = isolation, max_jobs_per_child

    def unique_key_of(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | bytes | None:
        """The task's unique key for this call (None: the task has none, or its function said none)."""
        if self.unique is None:
            return None
        if callable(self.unique):
            return self.unique(*args, **kwargs)
        if self._signature is None:
            raise TypeError(f"task {self.name!r}: a unique key template needs a function with a signature")
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        try:
            return f"{self.name}:" + self.unique.format(**bound.arguments)
        except (KeyError, IndexError) as exc:
            raise ValueError(f"task {self.name!r}: unique={self.unique!r} names no argument {exc}") from None

    def enqueue_args(
        self,
        options: EnqueueOptions,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        queue: str | None = None,
    ) -> dict[str, Any]:
        """The keyword arguments of ``client.enqueue`` for one call (on ``queue``, default the task's).

        ``TypeError`` when the arguments do not bind the task's function (a
        job that could never run is not enqueued).
        """
        problem = self.binding_problem(args, kwargs)
        if problem is not None:
            raise TypeError(f"task {self.name!r}: {problem}")
        priority = options.priority if options.priority is not None else self.priority
        queue = self.queue if queue is None else queue
        call: dict[str, Any] = {
            "queue": queue,
            "payload": self.payload(args, kwargs, queue),
            "job_id": options.job_id,
            "delay_ms": options.delay_ms,
            "run_at_ms": options.run_at_ms(),
            "priority": priority,
        }
        key = options.unique_key if options.unique_key is not None else self.unique_key_of(args, kwargs)
        if key is not None:
            for_ms = options.unique_for_ms if options.unique_for_ms is not None else self.unique_for_ms
            proto.unique_args(key, for_ms, options.replace)  # a bad key is refused before anything is sent
            call.update(unique_key=key, unique_for_ms=for_ms, replace=options.replace)
        elif options.unique_for_ms is not None or options.replace:
            raise ValueError(
                "unique_for_ms and replace need a unique key (unique_key=, or the task's unique=)"
            )
        return call

    def __repr__(self) -> str:
        return f"<task {self.name!r} on queue {self.queue!r}>"


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
    ) -> _Bound[P, R]:
        """Enqueue options for the next ``.enqueue(...)``: the job's id, a delay or a time, a priority.

        ``unique_key`` (and ``unique_for_ms``, ``replace``) make the call a
        unique job (``client.enqueue``'s, docs/concepts/unique.md), over the
        task's own ``unique=`` key; the handle's ``created`` and ``replaced``
        say what the call did.
        """
        return _Bound(
            self, EnqueueOptions(job_id, delay_ms, at, priority, unique_key, unique_for_ms, replace)
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
    ) -> _AsyncBound[P, R]:
        """Enqueue options for the next ``.enqueue(...)`` (see ``Task.options``)."""
        return _AsyncBound(
            self, EnqueueOptions(job_id, delay_ms, at, priority, unique_key, unique_for_ms, replace)
        )


class _AsyncBound(Generic[P, R]):
    __slots__ = ("_options", "_task")

    def __init__(self, task: AsyncTask[P, R], options: EnqueueOptions) -> None:
        self._task, self._options = task, options

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> AsyncTaskHandle[R]:
        task = self._task
        job_id = await task.app.client.enqueue(**task.enqueue_args(self._options, args, kwargs))
        return AsyncTaskHandle(task.app.client, task.queue, job_id, task.serializer)
