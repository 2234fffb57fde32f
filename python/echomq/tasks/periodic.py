"""Periodic tasks: ``@app.task(cron=...)`` and ``app.schedule(task, name, ...)`` over the queue's schedules.

A task schedule is an ordinary schedule of the task's queue
(``client.schedule``, docs/concepts/schedules.md) whose payload is the
task's encoded call: each tick enqueues one job of the task, with the
arguments given here, once whatever the number of workers.  The app keeps
the definitions (checked when they are made: the timing by
``echomq.schedules.define``, the arguments against the task's signature and
the serializer); its workers store them on the server as they start, which
is idempotent: a schedule stored again with the same timing keeps its
cursor, so many workers starting make one schedule and no extra tick.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..schedules import define


class TaskCore(Protocol):
    """What a schedule needs of a task (``task.TaskCore`` has it): named here, not imported, no cycle."""

    name: str
    queue: str

    def binding_problem(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None: ...

    def payload(self, args: Sequence[Any], kwargs: Mapping[str, Any], queue: str | None = None) -> bytes: ...


__all__ = ["TaskSchedule"]


@dataclass(frozen=True)
class TaskSchedule:
    """One periodic call of a task: what ``client.schedule`` is given for it."""

    task: str
    queue: str
    name: str
    cron: str | None
    every_ms: int | None
    payload: bytes
    tz: str
    start_at: int | datetime.datetime | None
    end_at: int | datetime.datetime | None
    missed: str

    @classmethod
    def of(
        cls,
        task: TaskCore,
        name: str | None,
        *,
        cron: str | None,
        every_ms: int | None,
        tz: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
        missed: str,
        start_at: int | datetime.datetime | None,
        end_at: int | datetime.datetime | None,
    ) -> TaskSchedule:
        """Checked: ``BadSchedule`` for the timing, ``TypeError`` for arguments the task cannot take."""
        if isinstance(args, str | bytes) or not isinstance(args, Sequence):
            raise TypeError(
                f"args must be a list or tuple of the task's arguments, not {type(args).__name__}"
            )
        kwargs = dict(kwargs or {})
        problem = task.binding_problem(args, kwargs)
        if problem is not None:
            raise TypeError(f"task {task.name!r}: {problem}")
        name = task.name if name is None else name
        payload = task.payload(list(args), kwargs, task.queue)
        define(
            name, cron=cron, every_ms=every_ms, payload=payload, tz=tz, start_at=start_at, end_at=end_at,
            missed=missed,
        )  # fmt: skip
        return cls(task.name, task.queue, name, cron, every_ms, payload, tz, start_at, end_at, missed)

    def schedule_args(self) -> dict[str, Any]:
        """The keyword arguments of ``client.schedule`` that store it."""
        return {
            "queue": self.queue,
            "name": self.name,
            "cron": self.cron,
            "every_ms": self.every_ms,
            "payload": self.payload,
            "tz": self.tz,
            "start_at": self.start_at,
            "end_at": self.end_at,
            "missed": self.missed,
        }
