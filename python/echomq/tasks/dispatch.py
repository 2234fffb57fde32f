"""The handler a worker runs for an app's tasks: one job in, the task's function called, its result out.

One dispatcher serves every task of the queues its worker claims from.  It
reads the job's header (``envelope.parse_call``), finds the task by name,
decodes the arguments with the serializers the app accepts, calls the
function and returns its value encoded as a ``StoredResult``: the worker
stores it with the job's completion (COMPLETE ... RESULT, one atomic
step).  ``job_settings`` gives the worker each job's own lease, timeout
and tries (the task's).

A job whose task this worker does not know, or whose arguments do not
bind its function's signature, cannot succeed on a retry by the same
worker: it ends dead at once (``UnknownTask``, ``BadArguments``, both
``NonRetryable``), its error naming the task and the tasks known, never
dropped.  During a rolling deploy, when older workers may claim a new
task's jobs, the app's ``retry_unknown_tasks=True`` makes an unknown task
an ordinary failure instead (``UnknownTaskRetried``: retried, then dead).
A payload that is not a task call ends dead at once too (``NonRetryable``).

A dispatcher crosses to a child process by its app's import path
(``__reduce__``, ``isolated.py``; ``child_dispatcher``, at the end of this
module, makes it again there): a worker with ``isolation="process"``
runs it in its children, and a task that asks for a process
(``@app.task(isolation="process")``) has its jobs run in the dispatcher's
own children even when the worker runs threads or asyncio.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .._protocol import Job
from .._runtime import JobSettings, StoredResult
from ..errors import NonRetryable
from . import parents as _parents
from .core import PARENTS_HEADER, AppCore, TaskCore
from .current import CURRENT, current
from .envelope import BadTaskPayload, TaskCall, encode_result, parse_call
from .isolated import TaskProcesses, check_import_path, import_path_of
from .serializers import JSON, Serializer

if TYPE_CHECKING:
    from .._sync.context import JobContext
    from ..asyncio.context import JobContext as AsyncJobContext
    from .hooks import TaskHook

__all__ = [
    "AsyncDispatcher", "BadArguments", "Dispatcher", "NotATask", "UnknownTask", "UnknownTaskRetried",
    "async_context", "child_dispatcher", "context", "load_app",
]  # fmt: skip

D = TypeVar("D", bound="DispatchCore")


def context() -> JobContext:
    """The ``JobContext`` of the task this thread runs (``echomq.task_context()``).

    ``echomq.task_context().progress({"done": 3})``.  ``RuntimeError``
    outside a task; ``TypeError`` in a task run by an asyncio worker (use
    ``echomq.asyncio.task_context()`` there).
    """
    from .._sync.context import JobContext

    ctx = current()
    if not isinstance(ctx, JobContext):
        raise TypeError("this task runs in an asyncio worker: use echomq.asyncio.task_context()")
    return ctx


def async_context() -> AsyncJobContext:
    """The asyncio ``JobContext`` of the task this asyncio task runs (``echomq.asyncio.task_context()``).

    ``await echomq.asyncio.task_context().progress(...)``.  A plain function
    run by an asyncio worker runs in a thread: its context's calls are
    coroutines of the worker's loop, so report progress from ``async def``
    tasks.
    """
    from ..asyncio.context import JobContext as AsyncContext

    ctx = current()
    if not isinstance(ctx, AsyncContext):
        raise TypeError("this task runs in a thread worker: use echomq.task_context()")
    return ctx


class UnknownTask(NonRetryable):
    """A job names a task this worker does not know: it ends dead at once (no retry can help)."""


class UnknownTaskRetried(Exception):
    """``UnknownTask`` of an app made with ``retry_unknown_tasks=True``: a failure, dead after its tries."""


class BadArguments(NonRetryable):
    """A job's arguments do not bind its task's signature: it ends dead at once."""


class NotATask(NonRetryable):
    """A job whose payload is not a task call this worker can read (a raw ``enqueue``?): dead at once.

    ``echomq call TASK ...`` (or ``app.enqueue("TASK", ...)``) enqueues a
    task call; ``echomq enqueue QUEUE PAYLOAD`` puts a raw payload, for a
    handler worker.
    """


class DispatchCore:
    """The rules both dispatchers share (no I/O), and how they cross to a child process.

    ``Dispatcher.of(app)``; it pickles as its app's import path (see the
    module docstring), and ``processes`` are the children of its tasks that
    ask for one (``prestart``/``close`` them with the workers).
    """

    kind = "threads"  # what the child runs it as (isolated.child_dispatcher)

    def __init__(
        self,
        tasks: Mapping[str, TaskCore],
        serializers: Mapping[str, Serializer],
        hooks: Sequence[TaskHook] = (),
        *,
        retry_unknown: bool = False,
        app: AppCore | None = None,
        in_child: bool = False,
    ) -> None:
        self.tasks, self.serializers, self.hooks = tasks, serializers, hooks
        self.retry_unknown = retry_unknown
        self.app = app
        self.in_child = in_child  # in a child process: every task runs here, none asks for another
        self.processes = TaskProcesses(self)
        # The last payload read and its header: a job's settings (its lease, then its timeout)
        # and its dispatch read the same payload object, three parses a job otherwise.  Kept by
        # identity (a payload is immutable bytes, held here while cached), so never stale.
        self._last: tuple[bytes, TaskCall] | None = None

    def _call_of(self, payload: bytes) -> TaskCall:
        """``parse_call(payload)``, read once for the three asks of one job."""
        last = self._last
        if last is not None and last[0] is payload:
            return last[1]
        call = parse_call(payload)
        self._last = (payload, call)
        return call

    def _name_of(self, payload: bytes) -> str | None:
        """``task_name(payload)``, through the same cache."""
        try:
            return self._call_of(payload).name
        except BadTaskPayload:
            return None

    @classmethod
    def of(cls: type[D], app: AppCore, *, in_child: bool = False) -> D:
        """The dispatcher of ``app``'s tasks (the hooks it has now)."""
        return cls(
            app.tasks, app.serializers, tuple(app.hooks), retry_unknown=app.retry_unknown_tasks, app=app,
            in_child=in_child,
        )  # fmt: skip

    def __reduce__(self) -> tuple[Any, ...]:
        if self.app is None:
            raise TypeError("a dispatcher crosses to a child process by its app: make it Dispatcher.of(app)")
        path = import_path_of(self.app)
        crossing = [t for t in self.tasks.values() if t._fn.__module__ != "__main__"]
        modules = dict.fromkeys(t._fn.__module__ for t in crossing)
        modules.pop(path.partition(":")[0], None)
        return (child_dispatcher, (path, tuple(modules), tuple(t.name for t in crossing), self.kind))

    def __repr__(self) -> str:
        return f"<echomq.tasks.{type(self).__name__} of tasks {', '.join(sorted(self.tasks)) or 'none'}>"

    def in_process(self, call: TaskCall) -> TaskCore | None:
        """The task of ``call`` when it asks for a process of its own and this is not one (None: run here)."""
        task = self.tasks.get(call.name)
        if task is not None and task.isolation == "process" and not self.in_child:
            return task
        return None

    def child_limit(self, job: Job) -> tuple[str, int] | None:
        """``job``'s task and its own ``max_jobs_per_child``, for a worker whose children run every task.

        That worker's pool replaces a child once it has run that many jobs of
        the task (``ProcessPool(limit_of=...)``), as the task's own children
        are in a worker of threads.
        """
        name = self._name_of(job.payload)
        task = self.tasks.get(name) if name is not None else None
        if name is None or task is None or task.max_jobs_per_child is None:
            return None
        return name, task.max_jobs_per_child

    def job_settings(self, job: Job) -> JobSettings | None:
        """The task's lease, timeout and tries for ``job`` (None: not a task this worker knows)."""
        name = self._name_of(job.payload)
        task = self.tasks.get(name) if name is not None else None
        return task.settings if task is not None else None

    def parse(self, job: Job) -> TaskCall:
        try:
            return self._call_of(job.payload)
        except BadTaskPayload as exc:
            raise NotATask(
                f"{exc} (a task call is enqueued by `echomq call TASK ARGS_JSON` or app.enqueue)"
            ) from None

    @contextmanager
    def hooked(self, ctx: Any, call: TaskCall) -> Iterator[Any]:
        """The app's hooks around one attempt (``hooks.TaskHook.run``); yields the context the task sees."""
        with ExitStack() as stack:
            for hook in self.hooks:
                ctx = stack.enter_context(hook.run(ctx, call))
            yield ctx

    def resolve(
        self, call: TaskCall, fed: tuple[Any, ...] = ()
    ) -> tuple[TaskCore, list[Any], dict[str, Any]]:
        task = self.tasks.get(call.name)
        if task is None:
            known = ", ".join(sorted(self.tasks)) or "none"
            kind = UnknownTaskRetried if self.retry_unknown else UnknownTask
            raise kind(
                f"this worker has no task {call.name!r} (it knows: {known}); is the worker running "
                "the code that defines it?"
            )
        try:
            args, kwargs = call.arguments(self.serializers)
        except BadTaskPayload as exc:
            raise NotATask(str(exc)) from None
        if fed:  # a workflow's step: its parents' result(s) first (parents.py)
            args = [*fed, *args]
        problem = task.binding_problem(args, kwargs)
        if problem is not None:
            raise BadArguments(f"the arguments do not fit task {call.name!r}: {problem}")
        return task, args, kwargs

    @property
    def result_serializer(self) -> Serializer:
        """What the parents' results are read with: the app's serializer (JSON without an app)."""
        return self.app.serializer if self.app is not None else JSON

    def read_parents(self, ctx: JobContext, mode: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A threads worker's read of the job's parents' results (``parents.py``): (its feed, values)."""
        if not hasattr(ctx._keeper, "client"):  # in a child process: no connection of its own
            raise NonRetryable(
                "a task job enqueued with after= (or a workflow's step) does not run in a child process "
                "yet (isolation='process'): run it in a worker of threads or asyncio"
            )
        job = ctx.job
        redis = ctx._keeper.client.redis
        parents = ctx.parents()
        done, commands = _parents.reads(job.queue, parents)
        rows: list[Any] = []
        if commands:
            pipe = redis.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            rows = pipe.execute()
        values = _parents.settle(job.queue, done, rows, self.result_serializer)
        return _parents.feed_argument(mode, parents, values), values

    async def aread_parents(self, ctx: AsyncJobContext, mode: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``read_parents`` for an asyncio worker."""
        job = ctx.job
        redis = ctx._keeper.client.redis
        parents = await ctx.parents()
        done, commands = _parents.reads(job.queue, parents)
        rows: list[Any] = []
        if commands:
            pipe = redis.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            rows = await pipe.execute()
        values = _parents.settle(job.queue, done, rows, self.result_serializer)
        return _parents.feed_argument(mode, parents, values), values

    @staticmethod
    def stored(task: TaskCore, value: Any) -> StoredResult:
        return StoredResult(encode_result(task.serializer, value, task.name))


class Dispatcher(DispatchCore):
    """The threads worker's handler (``echomq.Worker``): an ``async def`` task runs in ``asyncio.run``."""

    def __call__(self, ctx: JobContext) -> StoredResult:
        call = self.parse(ctx.job)
        isolated = self.in_process(call)
        if isolated is not None:  # the whole dispatch, the app's hooks included, happens in the child
            return cast("StoredResult", self.processes.run(ctx, isolated))
        # No hooks (the usual app): no generator context and ExitStack a job.
        with self.hooked(ctx, call) if self.hooks else nullcontext(ctx) as seen:
            mode = call.headers.get(PARENTS_HEADER) if call.headers else None
            fed: tuple[Any, ...] = ()
            if mode is not None:
                fed, values = self.read_parents(ctx, mode)
            task, args, kwargs = self.resolve(call, fed)
            token = CURRENT.set(seen)
            held = _parents.PARENT_RESULTS.set(values) if mode is not None else None
            try:
                value = task._fn(*args, **kwargs)
                if task.is_async:
                    value = asyncio.run(value)
            finally:
                CURRENT.reset(token)
                if held is not None:
                    _parents.PARENT_RESULTS.reset(held)
            return self.stored(task, value)


class AsyncDispatcher(DispatchCore):
    """The asyncio worker's handler: an ``async def`` task is awaited, a plain one runs in a thread."""

    kind = "asyncio"

    async def __call__(self, ctx: AsyncJobContext) -> StoredResult:
        call = self.parse(ctx.job)
        isolated = self.in_process(call)
        if isolated is not None:  # as the threads dispatcher's; the wait on the child in a thread
            return cast("StoredResult", await self.processes.run_async(ctx, isolated))
        # No hooks (the usual app): no generator context and ExitStack a job.
        with self.hooked(ctx, call) if self.hooks else nullcontext(ctx) as seen:
            mode = call.headers.get(PARENTS_HEADER) if call.headers else None
            fed: tuple[Any, ...] = ()
            if mode is not None:
                fed, values = await self.aread_parents(ctx, mode)
            task, args, kwargs = self.resolve(call, fed)
            token = CURRENT.set(seen)
            held = _parents.PARENT_RESULTS.set(values) if mode is not None else None
            try:
                if task.is_async:
                    value = await task._fn(*args, **kwargs)
                else:  # a blocking function must not hold the event loop
                    value = await asyncio.to_thread(task._fn, *args, **kwargs)
            finally:
                CURRENT.reset(token)
                if held is not None:
                    _parents.PARENT_RESULTS.reset(held)
            return self.stored(task, value)


# -- in a child process: the dispatcher that crossed by its app's import path (__reduce__) ----------


def load_app(path: str) -> AppCore:
    """The app at ``path`` (``module:attr``), imported here; TypeError if it is no ``echomq.App``."""
    module, _, attr = check_import_path(path).partition(":")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    if not isinstance(target, AppCore):
        raise TypeError(f"{path} is not an echomq.App (it is a {type(target).__name__})")
    return target


def child_dispatcher(
    path: str, modules: tuple[str, ...], names: tuple[str, ...], kind: str = "threads"
) -> Dispatcher | AsyncDispatcher:
    """In a child (``Dispatcher.__reduce__``): the app imported, its tasks' modules too, its dispatcher.

    A task the worker knows but the child does not find is said here, at the
    child's start (the worker refuses to run), not as a job's UnknownTask.
    ``kind="asyncio"``: an asyncio app's dispatcher, which the child runs in
    a loop of its own (``echomq.asyncio._isolation.InChild``, which crossed
    with it).
    """
    app = load_app(path)
    for module in modules:  # tasks defined beside the app, in modules that import it
        importlib.import_module(module)
    missing = [name for name in names if name not in app.tasks]
    if missing:
        raise LookupError(
            f"{path} has no task {', '.join(map(repr, missing))} in the child process (importing "
            f"{', '.join((path.partition(':')[0], *modules))} did not define it)"
        )
    if kind == "asyncio":
        return AsyncDispatcher.of(app, in_child=True)
    return Dispatcher.of(app, in_child=True)
