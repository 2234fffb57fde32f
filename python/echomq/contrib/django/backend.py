"""``EchoMQBackend``: a ``django.tasks`` backend whose tasks are echomq task jobs.

A Django task's call is enqueued through the task layer (``echomq.App``,
so its hooks, e.g. ``echomq.contrib.otel``, apply): the job's header names
the task by its module path (``task myapp.tasks.send_mail json``), its
arguments are JSON.  A worker (``manage.py echomq_worker``) imports the
task by that path and runs it; its return value and its failure's
traceback are stored with the job, which ``get_result`` reads back into a
``TaskResult``.

A result's id is its job's id, ``<new id>@<queue>``: ``get_result`` reads
the one queue the id names, so a backend that lists no ``QUEUES`` (any name
is valid, Django's rule) finds every job it enqueued.  Django's signals are
sent where its own backends send them: ``task_enqueued`` by the producer
once the job exists (at the commit with ``ENQUEUE_ON_COMMIT``),
``task_started`` and ``task_finished`` by the worker around each attempt.
What a job names is imported, by the worker and by ``get_result`` alike,
only when it is a ``django.tasks`` task of this backend from a module
already imported or in an installed app (``_task``).
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterable, Iterator, Mapping
from traceback import format_exception
from typing import TYPE_CHECKING, Any, cast

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.db import close_old_connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from ... import _protocol as proto
from ..._runtime import JobSettings
from ..._sync.client import Client
from ...tasks.app import App, TaskWorker
from ...tasks.dispatch import Dispatcher, context
from ...tasks.envelope import BadTaskPayload, decode_result, parse_call
from ...tasks.task import TaskCore

if TYPE_CHECKING:  # the backport's hints (Django's own module has none): the same API
    from django_tasks import TaskContext, TaskResult, TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json
else:
    try:  # Django 6.0 and later
        from django.tasks import TaskContext, TaskResult, TaskResultStatus
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskError
        from django.tasks.exceptions import TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json
    except ImportError:  # older Django: the django-tasks backport
        from django_tasks import TaskContext, TaskResult, TaskResultStatus
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

if TYPE_CHECKING:
    from ..._sync.worker import Worker

__all__ = ["EchoMQBackend", "TaskExited"]

# The OPTIONS this backend reads; any other key is refused (a typo would connect elsewhere unsaid).
KNOWN_OPTIONS = ("DATABASE", "ENQUEUE_ON_COMMIT", "URL")

# The statuses by name (Django's TextChoices values are tuples to a type checker without django-stubs).
READY, RUNNING, FAILED, SUCCESSFUL = (
    cast("TaskResultStatus", getattr(TaskResultStatus, name))
    for name in ("READY", "RUNNING", "FAILED", "SUCCESSFUL")
)

# echomq's job states, as a TaskResult's status (a cancelled job is FAILED: django.tasks has no cancel).
STATUS: dict[str, TaskResultStatus] = {
    "pending": READY,
    "delayed": READY,
    "active": RUNNING,
    "done": SUCCESSFUL,
    "dead": FAILED,
    "cancelled": FAILED,
}


def _when(ms: int | None) -> datetime.datetime | None:
    return None if ms is None else datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)


class TaskExited(Exception):
    """A task raised SystemExit or KeyboardInterrupt: its attempt fails with that class; the worker goes on.

    A plain ``echomq.Worker`` stops when a handler raises either (the
    handler asked for the process to end).  A Django task's ``sys.exit()``
    is its failure, as in Django's own backends: one task must not stop
    the worker that runs everyone's.  Its message is the original's class
    path and message, which ``get_result`` reports as the error's class.
    """


_CAUSED = "\nThe above exception was the direct cause of the following exception:\n"
_EXITED = f"{TaskExited.__module__}.{TaskExited.__qualname__}"


def _error(traceback: str | None, last_error: str | None) -> TaskError:
    """The ``TaskError`` of a failure as the worker stored it: its class as ``module.Qualname``."""
    lines = [line for line in (traceback or "").splitlines() if line and not line.startswith(" ")]
    last = lines[-1] if lines else (last_error or "Exception")
    name, _, message = last.partition(":")
    name = name.strip() or "Exception"
    text = traceback or last_error or ""
    if name == _EXITED:  # the task's own SystemExit or KeyboardInterrupt: report it, not the wrapper
        name = message.strip().partition(":")[0]
        text = text.partition(_CAUSED)[0]
    return TaskError(exception_class_path=name if "." in name else f"builtins.{name}", traceback=text)


def _class_path(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def _in_an_app(module: str) -> bool:
    """Whether ``module`` is in the package of one of ``INSTALLED_APPS``."""
    return any(module == app.name or module.startswith(app.name + ".") for app in apps.get_app_configs())


def _queue_of(result_id: str) -> str | None:
    """The queue a result id names (it is its job's id, ``<new id>@<queue>``), or None (an older id)."""
    _, at, queue = result_id.partition("@")
    return queue if at and queue else None


class _DjangoTasks(Mapping[str, TaskCore]):
    """The tasks a worker runs, by module path: imported when a job first names one (``EchoMQBackend._task``).

    Any other name is unknown (the job fails, as for ``echomq.App``: ``UnknownTask``).
    """

    def __init__(self, backend: EchoMQBackend) -> None:
        self._backend = backend
        self._known: dict[str, TaskCore] = {}

    def __getitem__(self, name: str) -> TaskCore:
        core = self._known.get(name)
        if core is not None:
            return core
        task = self._backend._task(name)
        core = TaskCore(self._backend.app, _runner(task, self._backend), name, task.queue_name,
                        JobSettings(), None)  # fmt: skip
        self._known[name] = core
        return core

    def __iter__(self) -> Iterator[str]:
        return iter(self._known)

    def __len__(self) -> int:
        return len(self._known)


def _set(result: TaskResult[Any], **fields: Any) -> None:
    """Change a (frozen) ``TaskResult``'s fields, as Django's own backends do."""
    for name, value in fields.items():
        object.__setattr__(result, name, value)


def _runner(task: Task[Any, Any], backend: EchoMQBackend) -> Any:
    """What the worker calls for ``task``: one attempt, as Django's backends run it.

    ``task_started`` with the ``TaskResult`` as it stands (RUNNING, the
    row's times), the function (an ``async def`` one too: ``task.call``;
    its ``TaskContext`` first when it takes one), its value normalized to
    JSON (``TypeError`` for what JSON cannot carry, Django's error), then
    ``task_finished`` SUCCESSFUL or FAILED, sent inside the ``except`` so
    that receivers see the exception.  Django's stale connections are
    closed around it, as a request would.
    """

    def run(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            result = backend._running(task, context(), list(args), dict(kwargs))
            task_started.send(sender=type(backend), task_result=result)
            try:
                if task.takes_context:
                    value = task.call(TaskContext(task_result=result), *args, **kwargs)
                else:
                    value = task.call(*args, **kwargs)
                value = normalize_json(value)
            except Exception as exc:
                backend._failed(result, exc)
                raise
            except BaseException as exc:  # SystemExit, KeyboardInterrupt: the attempt's failure (TaskExited)
                backend._failed(result, exc)
                raise TaskExited(f"{_class_path(exc)}: {exc}") from exc
            _set(result, status=SUCCESSFUL, finished_at=timezone.now(), _return_value=value)
            task_finished.send(sender=type(backend), task_result=result)
            return value
        finally:
            close_old_connections()

    return run


class EchoMQBackend(BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "echomq.contrib.django.EchoMQBackend", ...}}``.

    ``QUEUES``: the queue names tasks may use (Django's; default
    ``["default"]``; ``[]``: any name), each an echomq queue of that name.
    ``OPTIONS`` (any other key is refused):

    - ``URL``: the server (default ``redis://127.0.0.1:6379/0``);
    - ``ENQUEUE_ON_COMMIT``: ``True`` to enqueue a call made inside a
      transaction only when it commits (none when it rolls back); the
      ``TaskResult`` (its id) is returned at once;
    - ``DATABASE``: the connection whose transaction that is (default ``"default"``).

    ``priority`` maps to echomq's (Django's 100, the most urgent, is
    echomq's -100: smaller runs first there); ``run_after`` to the job's
    due time.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = self.options
        unknown = sorted(str(key) for key in options if key not in KNOWN_OPTIONS)
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']: unknown option {', '.join(map(repr, unknown))}; "
                f"an EchoMQBackend's options are {', '.join(KNOWN_OPTIONS)} (upper case)"
            )
        self.url: str = options.get("URL", "redis://127.0.0.1:6379/0")
        self.on_commit: bool = bool(options.get("ENQUEUE_ON_COMMIT", False))
        self.database: str = options.get("DATABASE", "default")
        self.worker_id = proto.new_id().decode()
        self._app: App | None = None

    @property
    def app(self) -> App:
        """The ``echomq.App`` this backend enqueues through (``echomq.contrib.otel.instrument`` it)."""
        if self._app is None:
            self._app = App(Client.from_url(self.url))
        return self._app

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        """Enqueue a call of ``task`` (at commit with ``ENQUEUE_ON_COMMIT``); its ``TaskResult``.

        Its ``enqueued_at`` is the row's (the server's clock, in ms), as
        ``get_result`` reads it: None until the commit sends it.
        """
        self.validate_task(task)
        # Known before the job exists (an on-commit enqueue returns it); the queue in it: get_result's.
        job_id = f"{proto.new_id().decode()}@{task.queue_name}"
        result: TaskResult[Any] = TaskResult(
            task=task, id=job_id, status=READY, enqueued_at=None, started_at=None,
            finished_at=None, last_attempted_at=None, args=list(args), kwargs=dict(kwargs),
            backend=self.alias, errors=[], worker_ids=[],
        )  # fmt: skip
        # What the task layer sends is the normalized JSON the TaskResult holds (Django's own rule).
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):  # USE_TZ = False: the local time
            run_after = timezone.make_aware(run_after)
        options = self.app.options(
            queue=task.queue_name, job_id=job_id, at=run_after, priority=-task.priority or None
        )

        def send() -> None:
            options.enqueue(task.module_path, *result.args, **result.kwargs)
            info = self.app.client.job(task.queue_name, job_id)
            _set(result, enqueued_at=_when(info.enqueued_at) if info is not None else None)
            task_enqueued.send(sender=type(self), task_result=result)

        if self.on_commit:
            transaction.on_commit(send, using=self.database)  # at once outside a transaction
        else:
            send()
        return result

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The ``TaskResult`` of job ``result_id``, read from its row in the queue its id names.

        ``SuspiciousOperation`` for a job that does not name a task this
        backend's worker would run: nothing else is imported.
        """
        info = self._row(result_id)
        try:
            call = parse_call(info.payload or b"")
        except BadTaskPayload:
            raise SuspiciousOperation(f"job {result_id!r} is not a task job") from None
        try:
            task = self._task(call.name)
        except KeyError:
            raise SuspiciousOperation(
                f"job {result_id!r} names {call.name!r}, which is not a django.tasks task of backend "
                f"{self.alias!r} in an installed app (nothing else is imported)"
            ) from None
        try:
            args, kwargs = call.arguments(self.app.serializers)
        except BadTaskPayload as exc:
            raise SuspiciousOperation(str(exc)) from None
        status = STATUS.get(info.state, READY)
        result: TaskResult[Any] = TaskResult(
            task=self._as_enqueued(task, info), id=info.id, status=status,
            enqueued_at=_when(info.enqueued_at), started_at=_when(info.claimed_at),
            finished_at=_when(info.finished_at), last_attempted_at=_when(info.claimed_at), args=args,
            kwargs=kwargs, backend=self.alias,
            errors=[_error(info.traceback, info.last_error)] if status == FAILED else [],
            worker_ids=[self.worker_id] * info.attempts,
        )  # fmt: skip
        if status == SUCCESSFUL:
            _set(result, _return_value=decode_result(info.result))
        return result

    def worker(
        self, queues: Iterable[str] | None = None, *, registered: bool = False, **settings: Any
    ) -> TaskWorker:
        """An echomq worker (threads) for ``queues`` (default: the backend's ``QUEUES``).

        A backend that lists no ``QUEUES`` takes any queue name: its worker
        must be told which to work (``ValueError`` otherwise), or, with
        ``registered``, works every queue the queue registry lists now
        (``client.queues()``, no SCAN of the keyspace; docs/concepts/registry.md),
        those of the listed ``QUEUES`` only when there are some. A queue that
        is not one of the listed ``QUEUES`` is refused (no task goes there).
        """
        from ..._sync.worker import Worker

        if registered:
            if queues is not None:
                raise ValueError("registered=True works the registry's queues: name none")
            found = self.app.client.queues(limit=10_000)
            chosen = [q for q in found if not self.queues or q in self.queues]
            if not chosen:
                raise ValueError(f"TASKS[{self.alias!r}]: no queue of it in the queue registry yet")
        elif queues is None:
            if not self.queues:
                raise ValueError(
                    f"TASKS[{self.alias!r}] takes any queue name (QUEUES: []): name the queues its worker "
                    "works (manage.py echomq_worker --queue Q ... or --registered, or "
                    "backend.worker(queues=[...]))"
                )
            chosen = sorted(self.queues)
        else:
            chosen = list(dict.fromkeys(queues))
            if not chosen:
                raise ValueError("no queue to work: give at least one")
            others = [q for q in chosen if self.queues and q not in self.queues]
            if others:
                raise ValueError(
                    f"{', '.join(map(repr, others))}: not in TASKS[{self.alias!r}]['QUEUES'] "
                    f"({', '.join(sorted(self.queues))}): no task of this backend goes there"
                )
        app = self.app
        dispatcher = Dispatcher(_DjangoTasks(self), app.serializers, tuple(app.hooks))
        workers: list[Worker] = [Worker(app.client, q, dispatcher, **settings) for q in chosen]
        return TaskWorker(workers)

    # -- what the worker and get_result share --------------------------------------------------

    def _task(self, name: str) -> Task[Any, Any]:
        """The ``django.tasks`` Task a job names; ``KeyError`` for any other name.

        Only a Task whose backend is this one is taken, from a module imported
        already or in an installed app's package: a job never makes this
        process import a module outside the project's apps.
        """
        module = name.rpartition(".")[0]
        if module not in sys.modules and not _in_an_app(module):
            raise KeyError(name)
        try:
            task = import_string(name)
        except ImportError:
            raise KeyError(name) from None
        if not isinstance(task, Task) or task.backend != self.alias:
            raise KeyError(name)
        return task

    def _row(self, result_id: str) -> Any:
        """The job's row (``JobInfo``, with its payload): from the queue the id names, else each of QUEUES."""
        queue = _queue_of(result_id)
        if queue is not None:
            listed = not self.queues or queue in self.queues
            try:
                info = self.app.client.job(queue, result_id, payload=True) if listed else None
            except (TypeError, ValueError):  # not a queue name (a brace in it)
                info = None
        else:  # an id of another form (a job enqueued by echomq.App): the listed queues, in turn
            info = None
            for q in sorted(self.queues):
                info = self.app.client.job(q, result_id, payload=True)
                if info is not None:
                    break
        if info is None:
            raise TaskResultDoesNotExist(result_id)
        return info

    def _as_enqueued(self, task: Task[Any, Any], info: Any) -> Task[Any, Any]:
        """``task`` as its job was enqueued (``using``): its queue, priority, due time while it waits."""
        changes: dict[str, Any] = {}
        if info.queue != task.queue_name:
            changes["queue_name"] = info.queue
        priority = -info.priority if info.priority else 0
        if priority != task.priority and -100 <= priority <= 100:
            changes["priority"] = priority
        if info.due_at is not None:
            changes["run_after"] = _when(info.due_at)
        return task.using(**changes) if changes else task

    def _running(
        self, task: Task[Any, Any], ctx: Any, args: list[Any], kwargs: dict[str, Any]
    ) -> TaskResult[Any]:
        """The ``TaskResult`` of the attempt ``ctx`` (a ``JobContext``) starts: RUNNING, the row's times."""
        info = self.app.client.job(ctx.job.queue, ctx.job.id)
        started = _when(info.claimed_at) if info is not None else None
        return TaskResult(
            task=task, id=ctx.job.id, status=RUNNING,
            enqueued_at=_when(info.enqueued_at) if info is not None else None,
            started_at=started or timezone.now(), finished_at=None,
            last_attempted_at=started or timezone.now(), args=args, kwargs=kwargs,
            backend=self.alias, errors=[], worker_ids=[self.worker_id] * ctx.attempt,
        )  # fmt: skip

    def _failed(self, result: TaskResult[Any], exc: BaseException) -> None:
        """The attempt failed: ``result`` FAILED with ``exc``; ``task_finished`` (inside the ``except``)."""
        result.errors.append(
            TaskError(exception_class_path=_class_path(exc), traceback="".join(format_exception(exc)))
        )
        _set(result, status=FAILED, finished_at=timezone.now())
        task_finished.send(sender=type(self), task_result=result)
