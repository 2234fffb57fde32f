"""What ``enqueue`` returns: a handle on one job, whose ``result()`` waits for its end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from .._result_wait import await_result, wait_result
from .serializers import JSON, Serializer

if TYPE_CHECKING:
    from .._protocol import CancelOutcome, JobInfo
    from .._sync.client import Client
    from ..asyncio.client import Client as AsyncClient

__all__ = ["AsyncTaskHandle", "TaskHandle"]

R = TypeVar("R")


class _Outcome:
    """What the enqueue did, read off its reply (an ``Enqueued``): the handles' created, replaced."""

    __slots__ = ()
    id: str

    @property
    def created(self) -> bool:
        """Whether the enqueue made this job (False: a holder of its unique key was there: its id)."""
        return bool(getattr(self.id, "created", True))

    @property
    def replaced(self) -> bool:
        """Whether the enqueue gave the pending holder of its unique key its payload (``replace=True``)."""
        return bool(getattr(self.id, "replaced", False))


class TaskHandle(_Outcome, Generic[R]):
    """One enqueued job (``queue``, ``id``); ``result()`` is typed by the task's return type."""

    __slots__ = ("_client", "_serializer", "id", "queue")

    def __init__(self, client: Client, queue: str, job_id: str, serializer: Serializer = JSON) -> None:
        self._client, self.queue, self.id, self._serializer = client, queue, job_id, serializer

    def result(self, timeout: float | None = None) -> R:
        """Wait for the job's end (its ``done`` announcement; a lost one is made good) and return its value.

        Raises ``echomq.JobFailed`` (type, message, traceback) when the job is
        dead, ``echomq.JobCancelled`` when it was cancelled, ``echomq.JobGone``
        when it has no row (an unknown id, or past its retention) and
        ``echomq.ResultTimeout`` (a ``TimeoutError``) when ``timeout`` seconds
        pass first.  The result is kept for the queue's done retention (an
        hour by default).
        """
        return cast("R", wait_result(self._client, self.queue, self.id, timeout, self._serializer))

    def info(self) -> JobInfo | None:
        """The job's status now (``client.job``)."""
        return self._client.job(self.queue, self.id)

    def cancel(self, reason: str | None = None) -> CancelOutcome:
        """Cancel the job (``client.cancel``)."""
        return self._client.cancel(self.queue, self.id, reason)

    def __repr__(self) -> str:
        return f"TaskHandle(queue={self.queue!r}, id={str(self.id)!r})"


class AsyncTaskHandle(_Outcome, Generic[R]):
    """``TaskHandle`` for asyncio: ``await handle.result(timeout=...)``."""

    __slots__ = ("_client", "_serializer", "id", "queue")

    def __init__(self, client: AsyncClient, queue: str, job_id: str, serializer: Serializer = JSON) -> None:
        self._client, self.queue, self.id, self._serializer = client, queue, job_id, serializer

    async def result(self, timeout: float | None = None) -> R:
        """Wait for the job's end and return the task's value (see ``TaskHandle.result``)."""
        value: Any = await await_result(self._client, self.queue, self.id, timeout, self._serializer)
        return cast("R", value)

    async def info(self) -> JobInfo | None:
        """The job's status now (``client.job``)."""
        return await self._client.job(self.queue, self.id)

    async def cancel(self, reason: str | None = None) -> CancelOutcome:
        """Cancel the job (``client.cancel``)."""
        return await self._client.cancel(self.queue, self.id, reason)

    def __repr__(self) -> str:
        return f"AsyncTaskHandle(queue={self.queue!r}, id={str(self.id)!r})"
