"""A task: a function, its name and queue, its settings, and how a call of it is enqueued.

``Task`` (an ``echomq.App``'s) and ``AsyncTask`` (an ``echomq.asyncio.App``'s)
differ only in whether ``enqueue`` is awaited.  Enqueue options never mix
with the function's own keyword arguments: they go through ``options()``::

    send_mail.enqueue("ada@example.com", subject="hi")                  # the function's arguments only
    send_mail.options(delay_ms=60_000, job_id="welcome-ada").enqueue("ada@example.com")

``TaskCore`` and ``EnqueueOptions`` are in ``core.py`` (what both kinds
share); ``Task`` is beside ``echomq.App`` (``app.py``), ``AsyncTask``
beside ``echomq.asyncio.App`` (``aio.py``): each refers to the other.
Every name is re-exported here, where it was.
"""

from __future__ import annotations

from .aio import AsyncTask
from .app import Task
from .core import EnqueueOptions, TaskCore

__all__ = ["AsyncTask", "EnqueueOptions", "Task", "TaskCore"]
