"""An app's tasks in child processes: the app crosses by its import path, a job by its task's name.

A thread cannot be stopped: a timed-out task's job is failed, but its thread
runs on, and the retried job may run beside it.  A child process can be
killed.  Process isolation (``echomq.isolation``) runs a handler in a child
that imports it by name; an app's handler, its ``Dispatcher``, holds
functions, locks and a client, none of which pickle.  What crosses instead
is where the app lives, ``"module:attr"`` (``App(..., import_path=...)``,
the CLI's ``echomq worker module:attr``, else found in the globals of the
module that made the app): the child imports it (and the modules of its
tasks) and dispatches each job by its task's name, as the worker would.
This module is the worker's side (the paths, the children's pools); the
child's side, the app imported and its dispatcher made, is
``dispatch.child_dispatcher``, beside the ``__reduce__`` it undoes.

Two ways in:

- ``app.worker(isolation="process")`` (``echomq worker mod:app --isolation
  process``): the worker's pool runs every job of the app in its children;
- ``@app.task(isolation="process", max_jobs_per_child=N)`` in a worker of
  threads (or an asyncio worker): the dispatcher runs that task's jobs in
  children of its own (``TaskProcesses``), killed when the worker abandons
  the job (its timeout and grace) or gives it back (a forced stop),
  recycled after N jobs.

An asyncio app's task runs in its child as in an asyncio worker (an
``echomq.asyncio.JobContext``, ``async def`` awaited in the child's own
loop); its checkpoints and progress are sent to the worker's loop, where
the lease is (``echomq.asyncio._isolation``, which the asyncio worker's
own isolation uses too).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol, cast

from ..isolation import ProcessPool

if TYPE_CHECKING:
    from .._sync.context import JobContext
    from ..asyncio.context import JobContext as AsyncJobContext

__all__ = ["TaskProcesses", "check_import_path", "defined_in", "import_path_of"]


# What this module needs of an app, its tasks and its dispatcher, named here, not imported: they
# all use it (core.py, dispatch.py).
class AppCore(Protocol):
    """Where an app says it lives (``core.AppCore`` has it)."""

    @property
    def import_path(self) -> str | None: ...

    @property
    def _defined_in(self) -> str | None: ...


class TaskCore(Protocol):
    """A task, as a child process finds it (``core.TaskCore``): its name, queue, process and function."""

    @property
    def name(self) -> str: ...

    @property
    def queue(self) -> str: ...

    @property
    def isolation(self) -> str | None: ...

    @property
    def max_jobs_per_child(self) -> int | None: ...

    @property
    def _fn(self) -> Callable[..., Any]: ...


class DispatchCore(Protocol):
    """A dispatcher (``dispatch.DispatchCore``): the tasks it knows; itself, the handler its children run."""

    @property
    def tasks(self) -> Mapping[str, TaskCore]: ...


HOW = 'give the app its import path: echomq.App(client, ..., import_path="myapp.tasks:app")'


def check_import_path(path: object) -> str:
    """``"package.module:attr"`` (``attr`` may be dotted), as ``echomq worker`` takes it; else ValueError."""
    if not isinstance(path, str):
        raise TypeError(f"import_path must be a str like 'myapp.tasks:app', not {type(path).__name__}")
    module, _, attr = path.partition(":")
    if not module or not attr or not all(p.isidentifier() for p in (*module.split("."), *attr.split("."))):
        raise ValueError(f"import_path must be MODULE:ATTR, e.g. 'myapp.tasks:app', not {path!r}")
    return path


def defined_in(app: object) -> str | None:
    """The module whose code made ``app`` (its ``__init__``'s caller, past subclasses' ``__init__``)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is app:
        frame = frame.f_back
    return None if frame is None else frame.f_globals.get("__name__")


def import_path_of(app: AppCore) -> str:
    """Where a child imports ``app`` from: its own ``import_path``, else its name in its module.

    TypeError saying what to do when there is none: an app made in
    ``__main__`` (a child does not run your script) or not held by a
    module-level name (made in a function).
    """
    if app.import_path is not None:
        return app.import_path
    module = app._defined_in
    if module is None or module == "__main__":
        raise TypeError(
            "isolation='process' needs an app the child processes can import: this one is made in "
            f"__main__ (they do not run your script); define it in a module, or {HOW}"
        )
    names = [name for name, value in vars(sys.modules.get(module, object())).items() if value is app]
    if not names:
        raise TypeError(
            f"isolation='process' needs an app the child processes can import: no global of {module!r} "
            f"holds this one (made in a function?); {HOW}"
        )
    return f"{module}:{names[0]}"


def importable_tasks(tasks: Iterable[TaskCore]) -> list[TaskCore]:
    """The tasks a child can import; TypeError naming one whose function is in ``__main__``."""
    found = list(tasks)
    for task in found:
        if task._fn.__module__ == "__main__":
            raise TypeError(
                f"isolation='process': task {task.name!r} is defined in __main__, which the child "
                "processes do not run; put it in a module of its own"
            )
    return found


def _kill_when(ctx: JobContext | AsyncJobContext) -> Callable[[], bool]:
    """When the job's child is to be killed: the worker failed the job without it, or gave it back.

    The worker that does so knows nothing of the task's children.
    """
    held = getattr(ctx._keeper, "_held", None)
    return lambda: held is not None and (held.abandoned or held.given_back)


class _Slots(Protocol):
    queue: str
    concurrency: int
    isolation: str


class TaskProcesses:
    """A dispatcher's children for its tasks that ask for a process (in a worker of threads or asyncio).

    One pool per ``max_jobs_per_child`` (a child counts every job it ran);
    made on a first job, or ``prestart``ed as the workers start (a child's
    start, an interpreter's imports, is not a job's time).
    """

    def __init__(self, dispatcher: DispatchCore) -> None:
        self._dispatcher = dispatcher
        self._pools: dict[int | None, ProcessPool] = {}
        self._lock = threading.Lock()

    def pool(self, max_jobs_per_child: int | None) -> ProcessPool:
        with self._lock:
            pool = self._pools.get(max_jobs_per_child)
            if pool is None:
                handler = cast("Callable[..., object]", self._dispatcher)
                if getattr(self._dispatcher, "kind", "threads") == "asyncio":  # its child runs a loop per job
                    from ..asyncio._isolation import InChild  # here: echomq.asyncio's face imports tasks

                    handler = InChild(handler)
                pool = ProcessPool(handler, max_jobs_per_child=max_jobs_per_child)
                self._pools[max_jobs_per_child] = pool
            return pool

    def run(self, ctx: JobContext, task: TaskCore) -> object:
        """The job of ``ctx`` dispatched in a child: the task's value, or what it raised, as here."""
        pool = self.pool(task.max_jobs_per_child)
        return pool.run(pool.take(), ctx.job, ctx.cancel, ctx._keeper, True, _kill_when(ctx))

    async def run_async(self, ctx: AsyncJobContext, task: TaskCore) -> object:
        """``run`` for an asyncio worker: the wait on the child in a thread, the keeper's calls on the loop.

        The worker's abandon cancels this coroutine, not the thread: the
        thread sees the job abandoned and kills the child (``kill_when``).
        """
        from ..asyncio._isolation import run_in_child

        pool = self.pool(task.max_jobs_per_child)
        return await run_in_child(pool, ctx.job, ctx.cancel, ctx._keeper, True, _kill_when(ctx))

    def prestart(self, workers: Iterable[_Slots]) -> None:
        """Start, and wait for, a child per slot that may run a process task: each worker's concurrency."""
        wanted: dict[int | None, int] = {}
        for worker in workers:
            if worker.isolation == "process":  # its own pool runs every task: none of ours
                continue
            limits = {
                t.max_jobs_per_child
                for t in self._dispatcher.tasks.values()
                if t.isolation == "process" and t.queue == worker.queue
            }
            for limit in limits:
                wanted[limit] = wanted.get(limit, 0) + worker.concurrency
        for limit, n in wanted.items():
            self.pool(limit).prestart(n)

    def close(self) -> None:
        """Stop every child (one still running a handler is killed); a later job starts new ones."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()
