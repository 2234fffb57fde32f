"""Tasks: call a function by name in a worker, keep its result, keep its failure's traceback.

``echomq.App`` (``echomq.asyncio.App``) makes functions tasks; a task's
``enqueue(...)`` (typed by the function's signature) returns a handle whose
``result()`` waits, without polling, for the value (typed by its return).
One worker runs every task of its queues (``app.worker()``,
``echomq worker myapp.tasks:app``).  Arguments and results are JSON by
default (``serializers``).  The pieces, one idea each:

- ``core``: what both apps and both kinds of task share (a task's
  enqueue options too); ``app``/``aio``: the apps, their tasks and their
  workers; ``handle``: what enqueue returns;
- ``envelope``: a task job's payload and a stored result, as bytes;
- ``dispatch``: the handler a worker runs for an app;
- ``results``: the rules of a wait for a job's end, ``wait``: its drivers
  (a client waits too: they live in ``echomq._results`` and
  ``echomq._result_wait``, re-exported).
"""

from __future__ import annotations

from .app import App, AppCore, TaskWorker
from .canvas import Chain, Chord, Group, Signature, chain, chord, group
from .dispatch import BadArguments, NotATask, UnknownTask, UnknownTaskRetried, context
from .envelope import BadTaskPayload, decode_result
from .flows import AsyncWorkflowHandle, WorkflowHandle
from .handle import AsyncTaskHandle, TaskHandle
from .parents import parent_results
from .serializers import (
    JSON,
    MSGPACK,
    PICKLE,
    JsonSerializer,
    MsgpackSerializer,
    PickleSerializer,
    SerializationError,
    Serializer,
)
from .task import AsyncTask, EnqueueOptions, Task

__all__ = [
    "JSON",
    "MSGPACK",
    "PICKLE",
    "App",
    "AppCore",
    "AsyncTask",
    "AsyncTaskHandle",
    "AsyncWorkflowHandle",
    "BadArguments",
    "BadTaskPayload",
    "Chain",
    "Chord",
    "EnqueueOptions",
    "Group",
    "JsonSerializer",
    "MsgpackSerializer",
    "NotATask",
    "PickleSerializer",
    "SerializationError",
    "Serializer",
    "Signature",
    "Task",
    "TaskHandle",
    "TaskWorker",
    "UnknownTask",
    "UnknownTaskRetried",
    "WorkflowHandle",
    "chain",
    "chord",
    "context",
    "decode_result",
    "group",
    "parent_results",
]
