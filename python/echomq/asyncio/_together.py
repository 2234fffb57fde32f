"""Calls a worker's tasks send at about the same time go out together: one pipeline, one round trip.

A worker's tasks finish jobs at about the same time; while one batch is on
the wire the next one gathers, so a busy worker sends its COMPLETEs (and
COMPLETECLAIMs, FAILs, RELEASEs) in a few round trips instead of one each.
Each call keeps its own answer and its own error; each caller keeps its own
retries (the verbs sent this way are safe to send again).

An answer is never read by nobody.  A caller waits for its call's answer
(or its batch's error), not for a timer of its own: the batch's try is
bounded by the longest of its calls' timeouts, and a call that times out
did so with its batch, its reply unread.  A caller that is cancelled while
it waits (a forced stop, ``run()`` cancelled) leaves its answer to the
``orphan`` callback it gave: the jobs a claim took are someone's to run or
give back, and an end that landed is counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import ResponseError

from .. import _protocol as proto
from ._attempt import Progress
from .client import Client

__all__ = ["Coalescer", "Orphan"]

T = TypeVar("T")

Orphan = Callable[[Any], None]
"""What to do with an answer whose caller is gone: called with the value (or the exception) it got."""


class _Entry:
    __slots__ = ("abandoned", "call", "future", "orphan", "timeout")

    def __init__(
        self, call: proto.Call[Any], future: asyncio.Future[Any], timeout: float, orphan: Orphan | None
    ):
        self.call, self.future, self.timeout, self.orphan = call, future, timeout, orphan
        self.abandoned = False


def _retrieved(future: asyncio.Future[Any]) -> None:
    """An answer nobody awaits any more is read here, so asyncio does not warn of it."""
    if not future.cancelled():
        future.exception()


class Coalescer:
    """Gathers calls into pipelines sent by one task at a time (see the module docstring)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._waiting: list[_Entry] = []
        self._flushing = False
        self._task: asyncio.Task[None] | None = None
        self._in_flight: Progress | None = None

    async def attempt(self, call: proto.Call[T], timeout: float, orphan: Orphan | None = None) -> T:
        """One try of ``call`` in the next batch: its answer, or its error (a timeout: its batch's)."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        entry = _Entry(call, future, timeout, orphan)
        self._waiting.append(entry)
        if not self._flushing:  # the task starts next turn: calls made this turn join the batch
            self._flushing = True
            self._task = asyncio.create_task(self._flush(), name="echomq-send-together")
        # Awaited as it is, not through asyncio.shield (a second future and four callbacks a
        # call): a cancel of this task cancels the future, and _settle hands the answer that
        # comes later to the orphan; an answer set before the cancel reached us is handed here.
        try:
            return await future
        except asyncio.CancelledError:
            entry.abandoned = True
            if future.done() and not future.cancelled():  # answered just as we were cancelled
                self._orphan(entry, future.exception() or future.result())
            raise

    def stretch(self, until: float) -> None:
        """Let the batch on the wire wait for its answers until ``until`` (a forced stop: see ``Worker``)."""
        if self._in_flight is not None:
            self._in_flight.stretch(until)

    async def drain(self) -> None:
        """Wait until every batch sent so far has its answers (bounded by their tries)."""
        task = self._task
        if task is not None and not task.done():
            await asyncio.wait([task])

    @staticmethod
    def _orphan(entry: _Entry, outcome: Any) -> None:
        if entry.orphan is not None:
            entry.orphan(outcome)

    async def _flush(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                calls = [entry.call for entry in batch]
                self._in_flight = progress = Progress()
                try:
                    replies = await self.client._attempt_many(calls, max(e.timeout for e in batch), progress)
                except Exception as exc:
                    for entry in batch:
                        self._settle(entry, exc)
                    continue
                for entry, reply in zip(batch, replies, strict=True):
                    try:
                        if isinstance(reply, BaseException):
                            if isinstance(reply, ResponseError):
                                proto.raise_mapped(reply, entry.call)
                            raise reply
                        outcome: Any = entry.call.read(reply)
                    except Exception as exc:
                        outcome = exc
                    self._settle(entry, outcome)
        finally:
            self._flushing = False
            self._in_flight = None

    def _settle(self, entry: _Entry, outcome: Any) -> None:
        future = entry.future
        if entry.abandoned or future.cancelled():  # its caller was cancelled: the answer is the orphan's
            self._orphan(entry, outcome)
            return
        if future.done():
            return
        if isinstance(outcome, BaseException):
            future.add_done_callback(_retrieved)  # read even if its caller is gone before it wakes
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
