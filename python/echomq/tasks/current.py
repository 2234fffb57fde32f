"""The running task's context, as a context variable: set by the dispatcher, read by what a task calls.

Its own module so that ``dispatch`` (which sets it) and what reads it
(``parents``) import it without importing each other.
"""

from __future__ import annotations

import contextvars
from typing import Any

CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("echomq_task_context")


def current() -> Any:
    """The running task's context; ``RuntimeError`` outside a task."""
    try:
        return CURRENT.get()
    except LookupError:
        raise RuntimeError(
            "no task runs here: a task's context is for its function while a worker runs it"
        ) from None
