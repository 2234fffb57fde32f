"""``EchoMQBackend``: a ``django.tasks`` backend whose tasks are echomq task jobs.

A Django task's call is enqueued through the task layer (``echomq.App``,
so its hooks, e.g. ``echomq.contrib.otel``, apply): the job's header names
the task by its module path (``task myapp.tasks.send_mail json``), its
arguments are JSON.  A worker (``manage.py echomq_worker``) imports the
task by that path and runs it; its return value and its failure's
traceback are stored with the job, which ``get_result`` reads back into a
``TaskResult``.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from django.apps import apps
from django.db import close_old_connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from ... import _protocol as proto
from ..._runtime import JobSettings
from ...client import Client
from ...tasks.app import App, TaskWorker
from ...tasks.dispatch import Dispatcher, context
from ...tasks.envelope import decode_result, parse_call
from ...tasks.task import TaskCore

if TYPE_CHECKING:  # the backport's hints (Django's own module has none): the same API
    from django_tasks import TaskContext, TaskResult, TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import TaskResultDoesNotExist
else:
    try:  # Django 6.0 and later
        from django.tasks import TaskContext, TaskResult, TaskResultStatus
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskError
        from django.tasks.exceptions import TaskResultDoesNotExist
    except ImportError:  # older Django: the django-tasks backport
        from django_tasks import TaskContext, TaskResult, TaskResultStatus
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import TaskResultDoesNotExist

if TYPE_CHECKING:
    from ...worker import Worker

__all__ = ["EchoMQBackend"]

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


def _exception_path(traceback: str | None, last_error: str | None) -> str:
    """The failure's class as ``module.Qualname``: the traceback's last line names it so."""
    lines = [line for line in (traceback or "").splitlines() if line and not line.startswith(" ")]
    last = lines[-1] if lines else (last_error or "Exception")
    name = last.partition(":")[0].strip() or "Exception"
    return name if "." in name else f"builtins.{name}"


def _in_an_app(module: str) -> bool:
    """Whether ``module`` is in the package of one of ``INSTALLED_APPS``."""
    return any(module == app.name or module.startswith(app.name + ".") for app in apps.get_app_configs())


class _DjangoTasks(Mapping[str, TaskCore]):
    """The tasks a worker runs, by module path: imported when a job first names one.

    Only a ``django.tasks`` Task whose backend is this one is run, from a
    module imported already or in an installed app's package; any other
    name is unknown (the job fails, as for ``echomq.App``: ``UnknownTask``).
    """

    def __init__(self, backend: EchoMQBackend) -> None:
        self._backend = backend
        self._known: dict[str, TaskCore] = {}

    def __getitem__(self, name: str) -> TaskCore:
        core = self._known.get(name)
        if core is not None:
            return core
        module = name.rpartition(".")[0]
        if module not in sys.modules and not _in_an_app(module):
            raise KeyError(name)  # a job never makes the worker import a module outside the project's apps
        try:
            task = import_string(name)
        except ImportError:
            raise KeyError(name) from None
        if not isinstance(task, Task) or task.backend != self._backend.alias:
            raise KeyError(name)
        core = TaskCore(self._backend.app, _runner(task, self._backend), name, task.queue_name,
                        JobSettings(), None)  # fmt: skip
        self._known[name] = core
        return core

    def __iter__(self) -> Iterator[str]:
        return iter(self._known)

    def __len__(self) -> int:
        return len(self._known)


def _runner(task: Task[Any, Any], backend: EchoMQBackend) -> Any:
    """What the worker calls for ``task``: its function (an ``async def`` one too: ``task.call``),
    with its ``TaskContext`` first when it takes one, Django's stale connections closed around it."""

    def run(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            if task.takes_context:
                ctx = context()
                started = timezone.now()
                result: TaskResult[Any] = TaskResult(
                    task=task, id=ctx.id, status=RUNNING, enqueued_at=None,
                    started_at=started, finished_at=None, last_attempted_at=started, args=list(args),
                    kwargs=dict(kwargs), backend=backend.alias, errors=[],
                    worker_ids=[backend.worker_id] * ctx.attempt,
                )  # fmt: skip
                return task.call(TaskContext(task_result=result), *args, **kwargs)
            return task.call(*args, **kwargs)
        finally:
            close_old_connections()

    return run


class EchoMQBackend(BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "echomq.contrib.django.EchoMQBackend", ...}}``.

    ``QUEUES``: the queue names tasks may use (Django's; default
    ``["default"]``), each an echomq queue of that name. ``OPTIONS``:

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
        """Enqueue a call of ``task`` (at commit with ``ENQUEUE_ON_COMMIT``); its ``TaskResult``."""
        self.validate_task(task)
        job_id = proto.new_id().decode()  # known before the job exists: an on-commit enqueue returns it
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

        if self.on_commit:
            transaction.on_commit(send, using=self.database)  # at once outside a transaction
        else:
            send()
            object.__setattr__(result, "enqueued_at", timezone.now())
        return result

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The ``TaskResult`` of job ``result_id`` in one of this backend's queues, read from its row."""
        client = self.app.client
        for queue in sorted(self.queues):
            info = client.job(queue, result_id, payload=True)
            if info is not None:
                break
        else:
            raise TaskResultDoesNotExist(result_id)
        call = parse_call(info.payload or b"")
        args, kwargs = call.arguments(self.app.serializers)
        task = import_string(call.name)
        status = STATUS.get(info.state, READY)
        errors = []
        if status == FAILED:
            text = info.traceback or info.last_error or ""
            errors.append(TaskError(exception_class_path=_exception_path(info.traceback, info.last_error),
                                    traceback=text))  # fmt: skip
        result: TaskResult[Any] = TaskResult(
            task=task, id=info.id, status=status, enqueued_at=_when(info.enqueued_at),
            started_at=_when(info.claimed_at), finished_at=_when(info.finished_at),
            last_attempted_at=_when(info.claimed_at), args=args, kwargs=kwargs, backend=self.alias,
            errors=errors, worker_ids=[self.worker_id] * info.attempts,
        )  # fmt: skip
        if status == SUCCESSFUL:
            object.__setattr__(result, "_return_value", decode_result(info.result))
        return result

    def worker(self, queues: Iterable[str] | None = None, **settings: Any) -> TaskWorker:
        """An echomq worker (threads) for this backend's queues (``manage.py echomq_worker`` runs it)."""
        from ...worker import Worker

        app = self.app
        dispatcher = Dispatcher(_DjangoTasks(self), app.serializers, tuple(app.hooks))
        chosen = sorted(self.queues) if queues is None else list(queues)
        workers: list[Worker] = [Worker(app.client, q, dispatcher, **settings) for q in chosen]
        return TaskWorker(workers)
