"""A task's parents' results: what a job enqueued with ``after=`` reads as it starts (sans I/O).

A job the task layer enqueues with ``after=`` (``task.options(after=[...])``,
or a step of a chain, group or chord: ``canvas.py``) carries the header
``parents=read|first|list``.  The worker then reads, before the function
runs, how each parent ended (``ctx.parents()``: one HGETALL) and the stored
result of each that ended done (one HMGET each, pipelined): the function
reads them with ``parent_results()`` (``"read"``), or gets them as its
first argument (``"first"``: the one parent's result, a chain's step;
``"list"``: every parent's, in the order of the workflow, a chord's
callback).  A parent that did not end done (a job that runs anyway, under
``on_parent_failure="ignore"`` or ``"continue"``), or whose row is past
its retention, has no result: it is left out of ``parent_results()`` and
is None in a step's argument.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Mapping
from typing import Any

from .._protocol.deps import Parents
from .._results import ResultWait
from ..errors import JobCancelled, JobFailed, JobGone
from .current import current
from .serializers import Serializer

__all__ = ["PARENT_RESULTS", "feed_argument", "order_key", "parent_results", "reads", "settle"]

PARENT_RESULTS: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("echomq_parent_results")


def parent_results() -> dict[str, Any]:
    """The results of the running task's parents that ended done: a dict of id -> value.

    For a job enqueued with ``task.options(after=[...])`` (or a step of a
    chain, group or chord), read by the worker before the function ran (so
    this call does no I/O, in a thread worker or an asyncio one); in the
    order of the workflow for its steps.  Empty for a job without parents;
    ``RuntimeError`` outside a task.  A parent that ended dead or cancelled
    (a job run under ``on_parent_failure="ignore"`` or ``"continue"``), or
    whose result is past its retention, is not in it: ``ctx.parents()``
    says how each ended.
    """
    try:
        return dict(PARENT_RESULTS.get())
    except LookupError:
        current()  # RuntimeError outside a task
        return {}


def order_key(job_id: str) -> tuple[float, str]:
    """A workflow's jobs in their order: its ids end ``.<index>`` (``canvas.py``); others after, by id."""
    _, dot, index = job_id.rpartition(".")
    return (float(int(index)) if dot and index.isdigit() else math.inf, job_id)


def reads(queue: str, parents: Parents) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Of ``ctx.parents()``: the ids that ended done (in order), the HMGETs of their results."""
    done = sorted((i for i, how in parents.items() if how == "done"), key=order_key)
    return done, [ResultWait(queue, i, 0, 0.0).read() for i in done]


def settle(queue: str, done: list[str], rows: list[Any], serializer: Serializer) -> dict[str, Any]:
    """The HMGETs' answers: id -> value (a row gone, or not done after all, is left out)."""
    values: dict[str, Any] = {}
    for job_id, row in zip(done, rows, strict=True):
        try:
            settled = ResultWait(queue, job_id, 0, 0.0, serializer).settle(row)
        except (JobGone, JobFailed, JobCancelled):
            continue
        if settled is not None:
            values[job_id] = settled.value
    return values


def feed_argument(mode: str | None, parents: Parents, values: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a step is given before its own arguments: ``()``; ``(result,)``; ``([results...],)``."""
    if mode == "first":
        ids = sorted(parents, key=order_key)
        return (values.get(ids[-1]) if ids else None,)
    if mode == "list":
        return ([values.get(i) for i in sorted(parents, key=order_key)],)
    return ()
