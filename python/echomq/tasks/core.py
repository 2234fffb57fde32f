"""What both apps and both kinds of task share, without I/O: ``AppCore``, ``TaskCore``, ``EnqueueOptions``.

An app holds its tasks by name, its serializers and hooks, and checks what
they are given (``AppCore``); a task holds its function, name, queue and
settings, and turns a call into ``client.enqueue``'s arguments
(``TaskCore``, with ``EnqueueOptions``).  ``echomq.App`` and its ``Task``
(``app.py``), ``echomq.asyncio.App`` and its ``AsyncTask`` (``aio.py``) add
a client's calls; the dispatcher (``dispatch.py``) reads an app from here,
as does a child process that imports the app by its path
(``dispatch.load_app``).  Below them all: none of them is imported here.
"""

from __future__ import annotations

import datetime
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _protocol as proto
from .._protocol import MAX_MS, JobId
from .._protocol.deps import OnParentFailure
from .._runtime import JobSettings, check_int
from ..retry import RetryPolicy, merge_attempts
from .envelope import check_name, encode_call
from .hooks import TaskHook
from .isolated import import_path_of, importable_tasks
from .periodic import TaskSchedule
from .serializers import JSON, Serializer

__all__ = ["PARENTS_HEADER", "AppCore", "EnqueueOptions", "TaskCore", "after_ids"]

PARENTS_HEADER = "parents"
"""The header of a task job enqueued with ``after=``: how its worker reads the parents' results."""

MAX_SHAPES = 64
"""Call shapes (positional count, keyword names) a task remembers as binding its signature."""


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
    # The jobs this call waits for (``after=``: handles or ids), and what a failed one does to it.
    after: tuple[Any, ...] = ()
    on_parent_failure: OnParentFailure | None = None
    # How the function receives its parents' results (a workflow's step, ``canvas.py``): None, only
    # ``parent_results()``; "first", the one parent's result as the first argument; "list", the list
    # of every parent's result (in the order of the workflow) as the first argument.
    feed: str | None = None

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


def after_ids(after: Iterable[Any] | None, queue: str) -> tuple[str, ...]:
    """``after=``'s handles (a ``TaskHandle``/``AsyncTaskHandle``: its ``.id``) and ids, as ids.

    A handle of another queue is refused (``ValueError``): a job waits only
    for jobs of its own queue.
    """
    if after is None:
        return ()
    if isinstance(after, str | bytes) or hasattr(after, "queue"):
        raise TypeError("after must be a list of handles or ids (one job: after=[handle])")
    ids: list[str] = []
    for item in after:
        if isinstance(item, str):
            ids.append(str(item))
            continue
        item_queue, item_id = getattr(item, "queue", None), getattr(item, "id", None)
        if not isinstance(item_id, str):
            raise TypeError(f"after takes task handles or job ids (str), not {type(item).__name__}")
        if item_queue is not None and item_queue != queue:
            raise ValueError(
                f"job {str(item_id)!r} is on queue {item_queue!r}: a job of queue {queue!r} waits only "
                "for jobs of its own queue"
            )
        ids.append(str(item_id))
    return tuple(ids)


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
        self._binds: set[int | tuple[Any, ...]] = set()  # the call shapes that bind (binding_problem)
        try:
            self._signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin without one: the call itself will tell
            self._signature = None

    @property
    def serializer(self) -> Serializer:
        return self.app.serializer

    def payload(
        self,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        queue: str | None = None,
        parents: str | None = None,
    ) -> bytes:
        """The job's payload for this call (``SerializationError`` before anything is sent).

        The app's hooks (``app.add_hook``) give the headers it carries;
        ``parents`` (``"read"``, ``"first"``, ``"list"``) is the header that
        makes the worker read the job's parents' results (``dispatch.py``).
        """
        headers: dict[str, str] = {} if parents is None else {PARENTS_HEADER: parents}
        for hook in self.app.hooks:
            headers.update(hook.enqueue_headers(self.name, queue or self.queue) or {})
        return encode_call(self.name, self.serializer, args, kwargs, headers)

    def binding_problem(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
        """Why ``args`` and ``kwargs`` do not bind the function's signature (None: they do, or unknown)."""
        if self._signature is None:
            return None
        # Whether a call binds depends on how many positional arguments it has and which names its
        # keywords are, never on their values: the answer is kept per shape (a task is called the
        # same few ways), where Signature.bind was a dozen calls a job.
        shape = (len(args), *kwargs) if kwargs else len(args)
        if shape in self._binds:
            return None
        try:
            self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            return str(exc)
        if len(self._binds) < MAX_SHAPES:
            self._binds.add(shape)
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
        feed = options.feed
        if feed not in (None, "first", "list"):
            raise ValueError(f"feed must be None, 'first' or 'list', got {feed!r}")
        if feed is not None and not options.after:
            raise ValueError("a step fed its parents' results needs after= (the jobs it waits for)")
        # A workflow's step gets its parents' result(s) as its first argument at run time.
        problem = self.binding_problem((None, *args) if feed is not None else args, kwargs)
        if problem is not None:
            raise TypeError(f"task {self.name!r}: {problem}")
        priority = options.priority if options.priority is not None else self.priority
        queue = self.queue if queue is None else queue
        parents = feed if feed is not None else ("read" if options.after else None)
        call: dict[str, Any] = {
            "queue": queue,
            "payload": self.payload(args, kwargs, queue, parents),
            "job_id": options.job_id,
            "delay_ms": options.delay_ms,
            "run_at_ms": options.run_at_ms(),
            "priority": priority,
        }
        if options.after:
            if self.isolation == "process":
                raise ValueError(
                    f"task {self.name!r} runs in a child process (isolation='process'), which does not "
                    "read its parents' results yet: after= is for tasks run by threads or asyncio"
                )
            after = after_ids(options.after, queue)
            call.update(after=list(after), on_parent_failure=options.on_parent_failure)
        elif options.on_parent_failure is not None:
            raise ValueError("on_parent_failure needs after= (the jobs whose failure it is about)")
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


def _after(after: Iterable[Any] | None) -> tuple[Any, ...]:
    """``options(after=...)``'s handles and ids, kept as given (checked against the queue at enqueue)."""
    if after is None:
        return ()
    if isinstance(after, str | bytes) or hasattr(after, "queue"):
        raise TypeError("after must be a list of handles or ids (one job: after=[handle])")
    return tuple(after)


def _nothing(*args: Any, **kwargs: Any) -> None:
    """The function of a task known here only by name (never called)."""
