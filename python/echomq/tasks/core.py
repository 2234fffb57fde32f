"""``AppCore``: what both apps share, without I/O: the tasks by name, the serializers, the checks.

``echomq.App`` (``app.py``) and ``echomq.asyncio.App`` (``aio.py``) add a
client's calls and a worker over it; the dispatcher (``dispatch.py``) reads
an app's tasks, serializers and hooks from here, and so does a child process
that imports the app by its path (``dispatch.load_app``).  Below them both:
neither the apps nor the dispatcher are imported here.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .. import _protocol as proto
from .._protocol import MAX_MS
from .._runtime import JobSettings, check_int
from ..retry import RetryPolicy, merge_attempts
from .envelope import check_name
from .hooks import TaskHook
from .isolated import import_path_of, importable_tasks
from .periodic import TaskSchedule
from .serializers import JSON, Serializer
from .task import TaskCore

__all__ = ["AppCore"]


class AppCore:
    """The tasks of an app by name, its serializer, its default queue (no I/O)."""

    def __init__(self, *, queue: str, serializer: Serializer, accept: Iterable[Serializer]) -> None:
        proto.keys_of(queue)
        for s in (serializer, *accept):
            if not all(hasattr(s, a) for a in ("name", "dumps", "loads")):
                raise TypeError(f"a serializer needs name, dumps and loads, not {type(s).__name__}")
        self.queue, self.serializer = queue, serializer
        # What workers decode: JSON always, the app's own, and what it was told to accept.
        self.serializers: dict[str, Serializer] = {s.name: s for s in (JSON, *accept, serializer)}
        self.tasks: dict[str, TaskCore] = {}
        self.hooks: list[TaskHook] = []
        self.retry_unknown_tasks = False
        self.periodic: dict[tuple[str, str], TaskSchedule] = {}  # (queue, name): stored as workers start
        # Where a child process imports the app from ("module:attr"; isolated.py): given, set by the
        # CLI that loaded it, else looked up in the module that made it (_defined_in).
        self.import_path: str | None = None
        self._defined_in: str | None = None

    def add_hook(self, hook: TaskHook) -> None:
        """Add an integration's hook (``echomq.tasks.hooks``): headers at enqueue, a context per run.

        It applies to the enqueues from now on and to the workers made from
        now on (``echomq.contrib.otel.instrument(app)`` calls this).
        """
        for name in ("enqueue_headers", "run"):
            if not callable(getattr(hook, name, None)):
                raise TypeError(f"a task hook needs enqueue_headers() and run(), not {type(hook).__name__}")
        self.hooks.append(hook)

    def _settings(
        self,
        fn: Callable[..., Any],
        name: str | None,
        queue: str | None,
        max_attempts: int | None,
        retry: RetryPolicy | None,
        lease_ms: int | None,
        timeout_ms: int | None,
        priority: int | None,
    ) -> tuple[str, str, JobSettings, int | None]:
        """A task's checked settings: (name, queue, JobSettings, priority)."""
        if not callable(fn):
            raise TypeError(f"a task must be a function, not {type(fn).__name__}")
        name = check_name(name if name is not None else getattr(fn, "__name__", None))
        if name in self.tasks:
            raise ValueError(f"this app already has a task named {name!r}: give one of them name=...")
        queue = self.queue if queue is None else queue
        proto.keys_of(queue)
        if max_attempts is not None:
            check_int("max_attempts", max_attempts)
        if retry is not None:
            if not isinstance(retry, RetryPolicy):
                raise TypeError(f"retry must be an echomq.RetryPolicy, not {type(retry).__name__}")
            retry = merge_attempts(max_attempts, retry)
            max_attempts = None if max_attempts is None else retry.max_attempts
        if lease_ms is not None:
            check_int("lease_ms", lease_ms, 1, MAX_MS)
        if timeout_ms is not None:
            check_int("timeout_ms", timeout_ms, 1, MAX_MS)
        proto.priority_args(priority)
        return name, queue, JobSettings(lease_ms, timeout_ms, max_attempts, retry), priority

    def _adopt(self, task: TaskCore, timing: dict[str, Any]) -> None:
        """A new task joins the app, with its schedule when ``@app.task`` gave one (or neither does)."""
        self.tasks[task.name] = task
        if timing:
            try:
                self._periodic(task, None, **periodic_timing(timing))
            except BaseException:
                del self.tasks[task.name]  # a task whose schedule is refused is not half made
                raise

    def schedule(
        self,
        task: TaskCore | str,
        name: str | None = None,
        *,
        cron: str | None = None,
        every_ms: int | None = None,
        tz: str = "UTC",
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        missed: str = "skip",
        start_at: int | datetime.datetime | None = None,
        end_at: int | datetime.datetime | None = None,
    ) -> TaskSchedule:
        """Call ``task`` (a task of this app, or its name) with ``args`` and ``kwargs`` on every tick.

        ``name`` (default: the task's) names the schedule in its queue;
        ``cron``/``every_ms``, ``tz``, ``missed``, ``start_at`` and ``end_at``
        are ``client.schedule``'s.  Checked now (``BadSchedule``,
        ``TypeError`` for arguments the task cannot take); stored on the
        server when a worker of this app starts (or ``register_schedules()``):
        many workers, one schedule, each tick once.
        """
        return self._periodic(
            task, name, cron=cron, every_ms=every_ms, tz=tz, args=args, kwargs=kwargs, missed=missed,
            start_at=start_at, end_at=end_at,
        )  # fmt: skip

    def _periodic(self, task: TaskCore | str, name: str | None, **timing: Any) -> TaskSchedule:
        """A task schedule of this app, checked and kept (its workers store it as they start)."""
        if isinstance(task, str):
            found = self.tasks.get(task)
            if found is None:
                raise ValueError(f"this app has no task {task!r} (it has: {', '.join(sorted(self.tasks))})")
            task = found
        if self.tasks.get(task.name) is not task:
            raise ValueError(f"task {task.name!r} is not one of this app's")
        periodic = TaskSchedule.of(task, name, **timing)
        key = (periodic.queue, periodic.name)
        if key in self.periodic:
            raise ValueError(f"this app already has a schedule {periodic.name!r} on queue {periodic.queue!r}")
        self.periodic[key] = periodic
        return periodic

    def queues(self) -> list[str]:
        """Every queue the app's tasks use, in the order they were first used."""
        return list(dict.fromkeys(task.queue for task in self.tasks.values()))

    def _by_name(self, name: str, queue: str | None) -> tuple[TaskCore | None, str]:
        task = self.tasks.get(name)
        check_name(name)
        if queue is not None:
            proto.keys_of(queue)
            return task, queue
        return task, task.queue if task is not None else self.queue

    def _check_isolation(self, isolation: str, queues: Iterable[str]) -> None:
        """A worker of ``queues`` whose tasks (or itself) ask for a process: TypeError if it cannot.

        The children import the app and its tasks by name: said now, before
        anything starts, rather than as a child that cannot start.
        """
        chosen = set(queues)
        if isolation == "process":
            wanting = [t for t in self.tasks.values() if t.queue in chosen]
        else:
            wanting = [t for t in self.tasks.values() if t.isolation == "process" and t.queue in chosen]
        if wanting:
            import_path_of(self)
            importable_tasks(wanting)

    def _worker_queues(self, queues: Iterable[str] | None) -> list[str]:
        chosen = self.queues() if queues is None else list(queues)
        if not chosen:
            raise ValueError(
                "this app has no tasks yet (import the module that defines them), and no queue was given"
            )
        return chosen


def periodic_timing(given: dict[str, Any]) -> dict[str, Any]:
    """``@app.task``'s schedule settings as ``TaskSchedule.of`` takes them (a cron or every_ms needed)."""
    known = {"cron", "every_ms", "tz", "args", "kwargs", "missed"}
    unknown = set(given) - known
    if unknown:
        raise TypeError(f"unknown task settings: {', '.join(sorted(unknown))}")
    if given.get("cron") is None and given.get("every_ms") is None:
        raise ValueError(f"{', '.join(sorted(given))} need cron= or every_ms= (a periodic task)")
    timing = {"tz": "UTC", "args": (), "kwargs": None, "missed": "skip", "cron": None, "every_ms": None}
    return {**timing, **given, "start_at": None, "end_at": None}


def _nothing(*args: Any, **kwargs: Any) -> None:
    """The function of a task known here only by name (never called)."""
