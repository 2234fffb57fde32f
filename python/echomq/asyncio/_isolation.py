"""Process isolation for asyncio: the children of ``echomq.isolation``, waited for from a loop.

The pool (``echomq.isolation.ProcessPool``) is the same for both workers:
a child per slot, one job at a time, killed at a timeout's abandon,
recycled after ``max_jobs_per_child``.  What asyncio adds is two ends:

- the worker's: ``run_in_child`` waits on the child in a thread of its own
  (the pool's calls block) while the loop goes on; the job's keeper, whose
  checkpoints and progress are coroutines of the loop, is called there
  (``LoopKeeper``).  A cancelled wait (the worker abandoned the job, or a
  forced stop gave it back) does not stop that thread: the thread sees it
  by ``kill_when`` and kills the child;
- the child's: ``InChild`` is the plain handler the child calls, which runs
  the asyncio handler in ``asyncio.run`` (a loop per job) with an
  ``echomq.asyncio.JobContext`` whose awaited checkpoints and progress ask
  the worker over the pipe.

Both the asyncio worker (``Worker(..., isolation="process")``) and the
task layer (a task's own ``isolation="process"``, ``echomq.tasks.isolated``)
use them.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .._protocol import Job
from ..cancel import CancelToken
from ..isolation import ProcessPool

__all__ = ["InChild", "LoopKeeper", "run_in_child"]

T = TypeVar("T")


class LoopKeeper:
    """A job's keeper for the thread that waits on its child: each call run on the worker's loop."""

    def __init__(self, keeper: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._keeper, self._loop = keeper, loop

    def _store(self, state: bytes | None) -> bool:
        return bool(asyncio.run_coroutine_threadsafe(self._keeper._store(state), self._loop).result())

    def _progress(self, data: bytes) -> None:
        asyncio.run_coroutine_threadsafe(self._keeper._progress(data), self._loop).result()


async def run_in_child(
    pool: ProcessPool,
    job: Job,
    cancel: CancelToken,
    keeper: Any,
    context_style: bool,
    kill_when: Callable[[], bool],
    taken: Callable[[], object] | None = None,
) -> object:
    """The handler of ``job`` run in one of ``pool``'s children: its value, or what it raised, here.

    ``taken`` is called on the loop once a child is ready for the job (a
    child's start is not the handler's time: its timeout runs from then).
    """
    loop = asyncio.get_running_loop()
    bridge = LoopKeeper(keeper, loop)

    def work() -> object:
        child = pool.take()
        if taken is not None:
            loop.call_soon_threadsafe(taken)
        return pool.run(child, job, cancel, bridge, context_style, kill_when)

    return await _in_own_thread(loop, work)


async def _in_own_thread(loop: asyncio.AbstractEventLoop, work: Callable[[], T]) -> T:
    """``work()`` in a new thread, awaited.

    Not ``asyncio.to_thread``: the loop's default executor has a few
    threads (cores + 4), which a worker's slots waiting on their children
    and its tasks' plain functions would share: a slot would wait for a
    thread, its timeout running.
    """
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():  # the wait was cancelled (an abandon, a forced stop): nobody reads it
            return
        if isinstance(error, StopIteration):  # a future refuses one (TypeError): it would never end
            error = RuntimeError(f"the handler raised {error!r}")
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def run() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = work()
        except BaseException as exc:  # the handler's, crossed back: the awaiting task's to raise
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(settle, value, error)

    context = contextvars.copy_context()  # the job's log fields go with it
    threading.Thread(target=context.run, args=(run,), name="echomq-child-wait", daemon=True).start()
    return await future


class InChild:
    """In a child: an asyncio handler behind the plain one the child calls, run in ``asyncio.run``.

    It crosses to the child with its handler (which must pickle: an
    importable ``async def``, or an app's dispatcher, which crosses by its
    app's import path).  The handler sees an ``echomq.asyncio.JobContext``
    (or ``(job, token)``) as in an asyncio worker.
    """

    def __init__(self, handler: Callable[..., Any]) -> None:
        self.handler = handler

    def __repr__(self) -> str:
        return f"{self.handler!r} (asyncio, in a child process)"

    def __call__(self, *args: Any) -> object:
        from .context import JobContext

        if len(args) == 2:  # (job, token)
            return asyncio.run(self.handler(*args))
        (ctx,) = args
        keeper: Any = _ChildKeeper(ctx._keeper)
        return asyncio.run(self.handler(JobContext(ctx.job, ctx.cancel, keeper)))


class _ChildKeeper:
    """In a child: the pipe's keeper (``echomq.isolation``) awaited, as an asyncio context awaits its own."""

    def __init__(self, keeper: Any) -> None:
        self._keeper = keeper

    async def _store(self, state: bytes | None) -> bool:
        return bool(self._keeper._store(state))  # a round trip on the pipe: brief, the child's loop waits

    async def _progress(self, data: bytes) -> None:
        self._keeper._progress(data)
