"""What an integration adds to an app's tasks: headers at enqueue, a context around each run.

``app.add_hook(hook)`` (``echomq.App`` and ``echomq.asyncio.App``): every
enqueue of the app's tasks asks each hook for headers to carry in the job's
payload (``envelope``: they ride with its retries and recoveries), and the
app's workers run each call of a task inside each hook's ``run(ctx, call)``
context manager, which yields the ``JobContext`` the function sees
(``echomq.task_context()``: the same one, or one that observes its
checkpoints).  It sees the function's exception, if any, and re-raises it.
``echomq.contrib.otel`` is one: a span per attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from .envelope import TaskCall

__all__ = ["TaskHook"]


class TaskHook(Protocol):
    """An app's hook (``app.add_hook``): see the module docstring."""

    def enqueue_headers(self, task: str, queue: str) -> Mapping[str, str] | None:
        """Headers to carry in the job of a call of ``task`` enqueued now on ``queue`` (None: none)."""
        ...

    def run(self, ctx: Any, call: TaskCall) -> AbstractContextManager[Any]:
        """A context around one attempt's call of the task; it yields the ``JobContext`` the task sees.

        Entered before the task is looked up (an unknown task's failure is
        the attempt's too), in the thread or task that runs the function.
        """
        ...
